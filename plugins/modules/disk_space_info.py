#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: disk_space_info
short_description: Check free space per filesystem against what a run will write
author:
  - llmops.serving developers (@llmops)
version_added: "1.0.0"
description:
  - Groups O(writes) by the filesystem each target path is (or will be, once created) on, and compares what
    they add up to with the free space there (C(statvfs), as C(df) shows it).
  - Fails when a filesystem cannot take its writes, naming the free space, each write with its size and
    path, and the variable that moves it - with the candidate filesystem of O(candidates) that has the most
    room ("/ has 12.3 GiB free, the run writes ~31.0 GiB there - ...; set llama_cpp_build_root to a path on
    /home (2.4 TiB free)").
  - The arithmetic is in C(plugins/module_utils/_files/disk_plan.py). Read-only (formerly C(disk_space), a
    name that redirects here until 1.0.0).
options:
  writes:
    description:
      - What the run will write - C(path) (absolute; need not exist yet), C(bytes) (or C(size) such as
        V(10G), V(3.5GiB)), C(what) (a few words), C(variable) (the inventory variable that moves it), and
        optionally C(unless_exists) (an absolute path; when it exists on the node the write is not counted,
        for example a build or a cache that is there already).
    type: list
    elements: dict
    default: []
  candidates:
    description:
      - Paths whose filesystems the failure message may suggest (the largest one that fits wins).
    type: list
    elements: path
    default: [/home, /srv, /data, /opt, /var]
  reserve:
    description:
      - Space that must stay free on every filesystem written to (bytes, or V(2GiB)).
    type: str
    default: 2GiB
  fail_on_shortage:
    description:
      - Fail when a filesystem is short; V(false) only reports it.
    type: bool
    default: true
extends_documentation_fragment:
  - llmops.serving.attributes
  - llmops.serving.attributes.info_module
"""

EXAMPLES = r"""
- name: Refuse to start a 19 GB download onto a 50 GB root filesystem
  llmops.serving.disk_space_info:
    writes:
      - {path: /home/models/qwen, bytes: 20401094656, what: model qwen3.6-27b, variable: model_dir}
      - path: /var/lib/docker
        size: 24GiB
        what: images
        variable: nvidia_container_toolkit_docker_data_root
"""

RETURN = r"""
already_there:
  description: The C(what) of the writes left out because their C(unless_exists) path exists.
  returned: always
  type: list
  elements: str
  sample: ["llama.cpp build"]
filesystems:
  description: Per filesystem written to - mount, free and total bytes, the bytes needed, the writes.
  returned: always
  type: list
  elements: dict
short:
  description: Mount points that cannot take their writes.
  returned: always
  type: list
  elements: str
  sample: ["/"]
report:
  description: One line per filesystem.
  returned: always
  type: list
  elements: str
  sample: ["/home: 2.4 TiB free, the run writes ~19.0 GiB (model)"]
"""

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.llmops.serving.plugins.module_utils._files import disk_plan  # noqa: E402
from ansible_collections.llmops.serving.plugins.module_utils.module_guard import run_module  # noqa: E402

ARGUMENT_SPEC = dict(
    writes=dict(type="list", elements="dict", default=[]),
    candidates=dict(type="list", elements="path", default=["/home", "/srv", "/data", "/opt", "/var"]),
    reserve=dict(type="str", default="2GiB"),
    fail_on_shortage=dict(type="bool", default=True),
)


def main():
    run_module(AnsibleModule, "disk_space_info", _run, argument_spec=ARGUMENT_SPEC,
               expected=(disk_plan.DiskError,))


def _run(module):
    p = module.params
    writes, already_there = disk_plan.split_present(disk_plan.normal_writes(p["writes"]))
    reserve = disk_plan.parse_size(p["reserve"])
    paths = set(w["path"] for w in writes) | set(p["candidates"])
    filesystems = dict((path, disk_plan.filesystem(path)) for path in paths)
    result = disk_plan.plan(writes, filesystems, reserve=reserve, candidates=p["candidates"])
    out = dict(changed=False, filesystems=result["filesystems"], short=[g["mount"] for g in result["short"]],
               report=disk_plan.report(result), already_there=already_there)
    if result["short"] and p["fail_on_shortage"]:
        module.fail_json(msg="Not enough disk space for this run: %s." % "; ".join(result["messages"]), **out)
    for message in result["messages"]:
        module.warn(message)
    module.exit_json(**out)


if __name__ == "__main__":
    main()
