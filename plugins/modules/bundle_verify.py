#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: bundle_verify
short_description: Check an offline bundle against its manifest and say what the roles take from it
author:
  - llmops.serving developers (@llmops)
version_added: "1.0.0"
description:
  - Reads C(manifest.json) of the offline bundle in O(path) (written by C(playbooks/bundle.yml)) and checks
    every file it lists - present, a regular file, its size, then its sha256 - and that no unlisted file is
    inside an entry's directory. Fails naming each entry and file that does not match, and what to do.
  - All sizes are checked before any byte is hashed; every file is then read once, in 1 MiB blocks.
  - Returns what the roles take from the bundle (O(models) with their sources replaced by the bundle's
    files, the tarball of llama.cpp at the pin, the images and package repositories), refusing a model the
    bundle lacks and a pin that differs from the bundle's.
  - The logic is in C(plugins/module_utils/_software/bundle.py). Read-only.
options:
  path:
    description: The bundle directory on the node (the one that holds C(manifest.json)).
    type: path
    required: true
  models:
    description:
      - The run's C(model_models); each must have a C(models/<name>) entry in the bundle.
    type: list
    elements: dict
    default: []
  git_ref:
    description:
      - The llama.cpp commit the run pins (C(llama_cpp_git_ref)); the bundle's C(git/llama.cpp) must be it.
    type: str
  web_ui:
    description:
      - Whether the run builds llama.cpp with its web UI (C(llama_cpp_web_ui)); a bundle cannot serve that
        yet.
    type: bool
    default: false
extends_documentation_fragment:
  - llmops.serving.attributes
  - llmops.serving.attributes.info_module
"""

EXAMPLES = r"""
- name: Verify the bundle before any change
  llmops.serving.bundle_verify:
    path: /srv/llmops-bundle
    models: "{{ model_models }}"
    git_ref: "{{ llama_cpp_git_ref }}"
  register: bundle
"""

RETURN = r"""
entries:
  description: The manifest's entries, each with C(abspath) (its directory on the node).
  returned: success
  type: list
  elements: dict
notes:
  description: Files outside every entry (ignored).
  returned: always
  type: list
  elements: str
sources:
  description:
    - C(model_models) (each model's C(url) a C(file://) URL into the bundle, with the manifest's C(sha256) and
      C(size)), C(llama_cpp) (the llama_cpp role's archive source, when the bundle has C(git/llama.cpp), the
      pinned tree as C(git archive) wrote it), C(images) (C(name), C(file),
      C(version), C(refs)), C(packages) (C(name), C(repo), C(path), C(format)), C(entries) (every entry's
      name; the source probe leaves out what they stage).
  returned: success
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.llmops.serving.plugins.module_utils._software import bundle  # noqa: E402
from ansible_collections.llmops.serving.plugins.module_utils.module_guard import run_module  # noqa: E402

ARGUMENT_SPEC = dict(
    path=dict(type="path", required=True),
    models=dict(type="list", elements="dict", default=[]),
    git_ref=dict(type="str"),
    web_ui=dict(type="bool", default=False),
)


def main():
    run_module(AnsibleModule, "bundle_verify", _run, argument_spec=ARGUMENT_SPEC,
               expected=(bundle.BundleError,))


def _run(module):
    p = module.params
    entries, notes = bundle.verify(p["path"])
    found = bundle.sources(entries, p["models"], p["git_ref"], p["web_ui"],
                           installed=_installed_checker(module))
    for note in notes:
        module.warn(note)
    module.exit_json(changed=False, entries=entries, notes=notes, sources=found)


def _installed_checker(module):
    """name -> whether the node has that package installed (dpkg, else rpm); None where neither is there."""
    dpkg = module.get_bin_path("dpkg-query")
    if dpkg:
        def installed(name):
            rc, out, err = module.run_command([dpkg, "-W", "-f", "${db:Status-Status}", name],
                                              environ_update={"LC_ALL": "C"})
            return rc == 0 and out.strip() == "installed"
        return installed
    rpm = module.get_bin_path("rpm")
    if rpm:
        return lambda name: module.run_command([rpm, "-q", name])[0] == 0
    return None


if __name__ == "__main__":
    main()
