#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: bundle_manifest
short_description: Write the manifest of an offline bundle
author:
  - llmops.serving developers (@llmops)
version_added: "1.0.0"
description:
  - Lists the files of each entry of the offline bundle in O(path) (the directory C(<path>/<entry name>)),
    with their size and sha256 (read once, in 1 MiB blocks), and writes C(<path>/manifest.json) atomically.
    C(playbooks/bundle.yml) calls it once every entry's files are in place.
  - An entry directory with no file, a link or a device in it, or a name outside C(images/), C(git/),
    C(models/), C(packages/), C(binaries/) fails. Only changes the manifest when its content changes.
  - The logic is in C(plugins/module_utils/_software/bundle.py).
options:
  path:
    description: The bundle directory.
    type: path
    required: true
  entries:
    description:
      - One per entry - C(name) (C(<area>/<name>)), C(version) (the commit, tag or image id it holds),
        optional C(kind) (defaults to the area's) and C(meta) (a dict kept in the manifest, e.g. an image's
        C(refs)).
    type: list
    elements: dict
    required: true
extends_documentation_fragment:
  - llmops.serving.attributes
attributes:
  check_mode:
    support: full
  diff_mode:
    support: full
"""

EXAMPLES = r"""
- name: Write the manifest
  llmops.serving.bundle_manifest:
    path: /srv/llmops-bundle
    entries:
      - {name: git/llama.cpp, version: 0c1e57098bba43ac29e6e3b677cdceebdd22334f}
      - {name: models/qwen, version: 3f0c1d9e8b7a6c5d4e3f2a1b0c9d8e7f6a5b4c3d}
"""

RETURN = r"""
entries:
  description: The manifest's entries (name, kind, version, path, size, sha256, files, meta).
  returned: success
  type: list
  elements: dict
manifest:
  description: The path of the manifest.
  returned: success
  type: str
"""

import os  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.llmops.serving.plugins.module_utils._software import bundle  # noqa: E402
from ansible_collections.llmops.serving.plugins.module_utils.module_guard import run_module  # noqa: E402

ARGUMENT_SPEC = dict(
    path=dict(type="path", required=True),
    entries=dict(type="list", elements="dict", required=True),
)


def main():
    run_module(AnsibleModule, "bundle_manifest", _run, argument_spec=ARGUMENT_SPEC,
               expected=(bundle.BundleError,))


def _run(module):
    root = module.params["path"]
    entries = [bundle.describe(root, e) for e in module.params["entries"]]
    text = bundle.manifest_text(entries)
    path = os.path.join(root, bundle.MANIFEST)
    try:
        with open(path) as f:
            before = f.read(bundle.MANIFEST_MAX + 1)
    except (IOError, OSError):
        before = ""
    changed = before != text
    if changed and not module.check_mode:
        bundle.write_manifest(root, text)
    result = dict(changed=changed, entries=entries, manifest=path)
    if module._diff:
        result["diff"] = {"before": before, "after": text, "before_header": path, "after_header": path}
    module.exit_json(**result)


if __name__ == "__main__":
    main()
