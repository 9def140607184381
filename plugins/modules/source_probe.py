#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: source_probe
short_description: Probe from the node every source a run will fetch from, and refuse before any change
author:
  - llmops.serving developers (@llmops)
version_added: "1.0.0"
description:
  - Builds one list of sources from O(sources) (package repositories, registries, git remotes, model hubs,
    pip indexes, release archives), leaves out what the node already has (packages installed, an image by
    digest, a verified model, a llama.cpp tree at the pin), and probes the rest from the node, concurrently,
    under one deadline - a TCP connect, then one HTTP(S) request (a registry's C(/v2/), a yum repository's
    C(repodata/repomd.xml), an apt repository's C(Release), a git remote's C(info/refs), the hub's API).
  - Outside hosts are reached through the node's proxy variables (the module's environment, else
    C(/etc/environment)), as yum, docker and git on the node would; loopback never goes through a proxy.
  - Fails naming every unreachable source, its error, the role that needs it and the C(llmops_mirrors) key or
    offline bundle entry that replaces it. Read-only. The logic is in
    C(plugins/module_utils/_software/source_plan.py).
options:
  sources:
    description:
      - The roles' entries - C(name), C(kind) (V(yum), V(apt), V(image), V(git), V(hf), V(modelscope),
        V(pypi), V(url), V(binary)), C(url) (an image's reference), C(why), C(key) (the C(llmops_mirrors)
        key, V("") for none), optionally C(bundle), C(suite), C(repo), C(package) and C(have) (C(packages),
        C(image), C(git_tree) with C(root) and C(commit), C(model) with C(snapshot), C(file)).
    type: list
    elements: dict
    default: []
  timeout:
    description:
      - Seconds all probes together may take.
    type: float
    default: 10
  package_manager:
    description:
      - How installed packages are read.
    type: str
    choices: [rpm, dpkg]
    default: rpm
  environment_file:
    description:
      - Where the node's login environment sets proxy variables.
    type: path
    default: /etc/environment
  node:
    description:
      - The node's name in the failure message.
    type: str
    default: this node
  bundle:
    description:
      - The run's verified offline bundle, as M(llmops.serving.bundle_verify) returned it in C(sources) (its
        C(entries), C(images) and C(packages)); V({}) when the run has none. A source the bundle stages is not
        probed (its state is C(in the bundle) and the entry's name).
    type: dict
    default: {}
extends_documentation_fragment:
  - llmops.serving.attributes
  - llmops.serving.attributes.info_module
"""

EXAMPLES = r"""
- name: Refuse before any change when a source cannot be reached
  llmops.serving.source_probe:
    sources:
      - name: docker-ce
        kind: yum
        url: https://download.docker.com/linux/centos/7/$basearch/stable
        key: docker_ce
        why: nvidia_container_toolkit (GPU host stage)
        have: {packages: [docker-ce-26.1.4]}
"""

RETURN = r"""
sources:
  description: The plan - each source with C(kind), C(url), C(probe), C(key), C(bundle), C(why), C(state)
    (V(on the node), V(reachable), V(unreachable), or C(in the bundle) and the entry's name) and C(error).
  returned: always
  type: list
  elements: dict
report:
  description: One line per source.
  returned: always
  type: list
  elements: str
unreachable:
  description: The names of the sources that could not be reached.
  returned: always
  type: list
  elements: str
"""

import os  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.llmops.serving.plugins.module_utils._software import source_plan  # noqa: E402
from ansible_collections.llmops.serving.plugins.module_utils.module_guard import run_module  # noqa: E402

ARGUMENT_SPEC = dict(
    sources=dict(type="list", elements="dict", default=[]),
    timeout=dict(type="float", default=10),
    package_manager=dict(type="str", choices=["rpm", "dpkg"], default="rpm"),
    environment_file=dict(type="path", default="/etc/environment"),
    node=dict(type="str", default="this node"),
    bundle=dict(type="dict", default={}),
)


def main():
    run_module(AnsibleModule, "source_probe", _run, argument_spec=ARGUMENT_SPEC,
               supports_check_mode=True, expected=(source_plan.SourcePlanError,))


def _read(path):
    try:
        with open(path) as handle:
            return handle.read()
    except (IOError, OSError):
        return ""


def _run(module):
    p = module.params

    def runner(argv):
        return module.run_command(argv, environ_update={"LC_ALL": "C"})

    sources = source_plan.plan(p["sources"], os.environ)
    to_probe = []
    for source in sources:
        source["error"] = None
        staged = source_plan.in_bundle(source, p["bundle"])
        if staged:
            source["state"] = "in the bundle (%s)" % staged
        elif source_plan.have(source, runner, p["package_manager"]):
            source["state"] = "on the node"
        else:
            to_probe.append(source)
    proxies = source_plan.proxy_settings(os.environ, _read(p["environment_file"]))
    errors = source_plan.probe_all(to_probe, proxies, p["timeout"])
    for source in to_probe:
        source["error"] = errors[source["name"]]
        source["state"] = "unreachable" if source["error"] else "reachable"
    unreachable = [(s, s["error"]) for s in to_probe if s["error"]]
    out = dict(changed=False, sources=sources, report=source_plan.report(sources),
               unreachable=[pair[0]["name"] for pair in unreachable])
    if unreachable:
        module.fail_json(msg=source_plan.refusal(unreachable, p["node"]), **out)
    module.exit_json(**out)


if __name__ == "__main__":
    main()
