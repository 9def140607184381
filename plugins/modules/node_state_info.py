#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: node_state_info
short_description: Read paths, users and groups on the node in one call
author:
  - llmops.serving developers (@llmops)
extends_documentation_fragment:
  - llmops.serving.attributes
  - llmops.serving.attributes.info_module
version_added: "0.7.0"
description:
  - Returns, for each path, what M(ansible.builtin.stat) would (links not followed) - whether it exists, its
    type, mode, owner and group, whether it is an executable file, and a file's stat identity; for each user
    what C(getent passwd) says (uid, gid, primary group, home, shell); for each group its gid.
  - One module call for what a role would otherwise ask with one stat, group, user or file task each. Role
    serving reads its service account, key directory, models and engines this way and runs the tasks that
    change them only where something is not as they would leave it (a no-op run asks the node once).
  - The reading is in C(plugins/module_utils/_serving/node_state.py); whether an account or a path is in
    place is
    decided on the controller (C(plugins/plugin_utils/node_state.py)). Read-only.
options:
  paths:
    description:
      - Paths to read (not followed when they are links).
    type: list
    elements: path
    default: []
  checksums:
    description:
      - Paths whose content's SHA-1 to read as well (RV(paths) entries get C(checksum)), as
        M(ansible.builtin.copy) compares a file with the content it would write; regular files up to 16 MiB
        (links are not followed). For a secret's file, set C(no_log) on the task - its digest is in the
        result.
    type: list
    elements: path
    default: []
  users:
    description:
      - User names to look up.
    type: list
    elements: str
    default: []
  groups:
    description:
      - Group names to look up.
    type: list
    elements: str
    default: []
"""

EXAMPLES = r"""
- name: Read the service account and its directories
  llmops.serving.node_state_info:
    paths: [/var/lib/llama-server, /etc/llama-server]
    users: [llama]
    groups: [llama]
  register: node_state

- name: Say whether the service user exists
  ansible.builtin.debug:
    msg: "{{ node_state.users.llama is not none }}"
"""

RETURN = r"""
paths:
  description: Path -> C({exists}) or C({exists, type, mode, uid, gid, owner, group, executable}), with
    C(checksum) (SHA-1, or null for what is not a regular file) for those in O(checksums); type is one of
    V(file), V(directory), V(link), V(other); owner and group are null where no account has that id. A
    regular file also has C(identity) - C({size, mtime_ns, ctime_ns, inode}), what gguf_info records of the
    file it read (a header read last run is reused while the identity is the same); a link has
    C(target_exists) (whether what it points to exists).
  returned: success
  type: dict
  sample: {"/etc/llama-server": {"exists": true, "type": "directory", "mode": "0750", "uid": 0, "gid": 997,
           "owner": "root", "group": "llama", "executable": false}}
users:
  description: User name -> null (no such user) or C({uid, gid, group, home, shell}).
  returned: success
  type: dict
  sample: {"llama": {"uid": 998, "gid": 997, "group": "llama", "home": "/var/lib/llama-server",
           "shell": "/usr/sbin/nologin"}}
groups:
  description: Group name -> null (no such group) or C({gid}).
  returned: success
  type: dict
  sample: {"llama": {"gid": 997}}
"""

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.llmops.serving.plugins.module_utils._serving.node_state import (  # noqa: E402
    NodeStateError,
    read_state,
)
from ansible_collections.llmops.serving.plugins.module_utils.module_guard import run_module  # noqa: E402

ARGUMENT_SPEC = dict(
    paths=dict(type="list", elements="path", default=[]),
    users=dict(type="list", elements="str", default=[]),
    groups=dict(type="list", elements="str", default=[]),
    checksums=dict(type="list", elements="path", default=[]),
)


def main():
    run_module(AnsibleModule, "node_state_info", _run, argument_spec=ARGUMENT_SPEC, supports_check_mode=True)


def _run(module):
    p = module.params
    try:
        state = read_state(p["paths"], p["users"], p["groups"], p["checksums"])
    except NodeStateError as exc:
        module.fail_json(msg=str(exc))
    module.exit_json(changed=False, **state)


if __name__ == "__main__":
    main()
