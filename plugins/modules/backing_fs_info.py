#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: (c) 2026, llmops.serving contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: backing_fs_info
short_description: Check that the file system of Docker's data-root has d_type, which overlay2 needs
author:
  - llmops.serving developers (@llmops)
version_added: "1.0.0"
description:
  - Finds the file system that holds O(path) (or, while it does not exist yet, the nearest existing directory
    above it, which will hold it) in C(/proc/self/mountinfo), and for XFS reads C(xfs_info <mount>)'s
    C(ftype).
  - Fails on XFS made with C(ftype=0) (no d_type; CentOS/RHEL 7.0-7.2 installers made them so), on which
    Docker's overlay2 storage driver refuses to run, with the fix - a data-root on a file system with d_type
    (O(variable) names the setting), or the XFS made again with C(mkfs.xfs -n ftype=1).
  - Warns when C(xfs_info) cannot tell. Other file systems (ext4, btrfs, ...) report d_type.
  - The rule is in C(plugins/module_utils/_files/backing_fs.py). Read-only.
options:
  path:
    description:
      - The directory to check, for example Docker's data-root V(/var/lib/docker). Need not exist yet.
    type: path
    required: true
  what:
    description:
      - What O(path) is, in the messages.
    type: str
    default: Docker's data-root
  variable:
    description:
      - The inventory variable that moves O(path), named in the failure message.
    type: str
    default: ""
  fail_without_d_type:
    description:
      - Fail when the file system has no d_type; V(false) only warns.
    type: bool
    default: true
  mountinfo:
    description:
      - The mount table read. Only a test harness points it elsewhere.
    type: path
    default: /proc/self/mountinfo
extends_documentation_fragment:
  - llmops.serving.attributes
  - llmops.serving.attributes.info_module
"""

EXAMPLES = r"""
- name: Refuse a Docker data-root on XFS without d_type
  llmops.serving.backing_fs_info:
    path: /home/docker
    variable: nvidia_container_toolkit_docker_data_root
"""

RETURN = r"""
anchor:
  description: The existing directory read (O(path), or the nearest existing directory above it).
  returned: always
  type: str
  sample: /home
mount:
  description: Mount point of the file system.
  returned: always
  type: str
  sample: /home
fstype:
  description: Its type.
  returned: always
  type: str
  sample: xfs
source:
  description: Its source device.
  returned: always
  type: str
  sample: /dev/mapper/centos-home
ftype:
  description: XFS only - C(ftype) of C(xfs_info) (0 or 1); null otherwise or when unknown.
  returned: always
  type: int
  sample: 1
d_type:
  description: Whether the file system reports d_type; null when it cannot be told.
  returned: always
  type: bool
  sample: true
message:
  description: Why it is refused or cannot be told; empty when d_type is there.
  returned: always
  type: str
"""

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.llmops.serving.plugins.module_utils._files.backing_fs import (  # noqa: E402
    d_type_check,
    read_mountinfo,
)
from ansible_collections.llmops.serving.plugins.module_utils.module_guard import run_module  # noqa: E402

ARGUMENT_SPEC = dict(
    path=dict(type="path", required=True),
    what=dict(type="str", default="Docker's data-root"),
    variable=dict(type="str", default=""),
    fail_without_d_type=dict(type="bool", default=True),
    mountinfo=dict(type="path", default="/proc/self/mountinfo"),
)


def main():
    run_module(AnsibleModule, "backing_fs_info", _run, argument_spec=ARGUMENT_SPEC, expected=(ValueError,))


def _run(module):
    p = module.params
    for name in ("path", "mountinfo"):
        if "\x00" in p[name]:
            raise ValueError("%s must be a path without NUL bytes" % name)
    if not p["path"].startswith("/"):
        raise ValueError("path must be absolute, got %r" % p["path"])
    xfs_info_bin = module.get_bin_path("xfs_info", opt_dirs=["/usr/sbin", "/sbin"])

    def xfs_info(mount):
        return module.run_command([xfs_info_bin, mount]) if xfs_info_bin else None

    result = d_type_check(p["path"], read_mountinfo(p["mountinfo"]), xfs_info, p["what"], p["variable"])
    if result["d_type"] is False and p["fail_without_d_type"]:
        rest = dict((k, v) for k, v in result.items() if k != "message")
        module.fail_json(msg=result["message"], changed=False, **rest)
    if result["message"]:
        module.warn(result["message"])
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
