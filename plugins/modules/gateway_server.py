#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: gateway_server
short_description: Drain, put in maintenance or ready one server of an HAProxy backend through its runtime API
author:
  - llmops.serving developers (@llmops)
version_added: "1.0.0"
description:
  - Sets the admin state of one server of an HAProxy backend with the runtime API on HAProxy's admin Unix
    socket (C(set server <backend>/<server> state ...)), then waits - for O(state=drain) and O(state=maint)
    until the server's current sessions end, for O(state=ready) until its health check is UP.
  - The rolling update drains an instance at the gateway before restarting it and readies it afterwards.
  - Setting the state the server already has is C(changed=false); the waits still apply.
  - A DOWN server with sessions left fails at once (they cannot finish by draining); a DOWN server with no
    sessions is drained at once.
  - The logic is in C(plugins/module_utils/_serving/haproxy_runtime.py).
options:
  socket:
    description:
      - HAProxy's admin stats socket (declared C(level admin)).
    type: path
    default: /run/haproxy/llmops-admin.sock
  backend:
    description:
      - The backend, as named in the gateway's C(llmops_gateway) fact (letters, digits, C(-), C(_), C(.),
        C(:)).
    type: str
    required: true
  server:
    description:
      - The server of O(backend), as named in the gateway's C(llmops_gateway) fact (the same characters).
    type: str
    required: true
  state:
    description:
      - V(ready) takes traffic, V(drain) takes no new sessions (current ones finish), V(maint) takes none.
    type: str
    choices: [ready, drain, maint]
    required: true
  drain_timeout:
    description:
      - Seconds to wait, after V(drain) or V(maint), for the server's current sessions to reach 0 (0 to
        604800).
    type: int
    default: 120
  wait_healthy:
    description:
      - For V(ready), wait until the server's health check is UP.
    type: bool
    default: true
  healthy_timeout:
    description:
      - Seconds to wait for the health check to be UP when O(wait_healthy) is set (0 to 604800).
    type: int
    default: 120
  poll_interval:
    description:
      - Seconds between two reads of C(show stat) while waiting (above 0, at most 60).
    type: float
    default: 0.5
extends_documentation_fragment:
  - llmops.serving.attributes
attributes:
  check_mode:
    support: full
    details: Reports the state it would set (C(changed)); sets nothing and waits for nothing.
  diff_mode:
    support: none
"""

EXAMPLES = r"""
- name: Drain the instance at the gateway before it restarts
  llmops.serving.gateway_server:
    backend: llm_qwen
    server: qwen-a
    state: drain
    drain_timeout: 300
  delegate_to: "{{ groups['gateway'][0] }}"
  become: true

- name: Put the instance back once it is healthy
  llmops.serving.gateway_server:
    backend: llm_qwen
    server: qwen-a
    state: ready
  delegate_to: "{{ groups['gateway'][0] }}"
  become: true
"""

RETURN = r"""
previous_state:
  description: The admin state before the task (V(ready), V(drain) or V(maint)), as HAProxy reports it.
  returned: success
  type: str
  sample: ready
state:
  description: The admin state set (in check mode, the one that would be set).
  returned: success
  type: str
  sample: drain
status:
  description: The server's C(status) in C(show stat) at the end (UP, DOWN, DRAIN, MAINT, no check, ...).
  returned: success
  type: str
  sample: DRAIN
sessions:
  description: The server's current sessions (C(scur)) at the end.
  returned: success
  type: int
  sample: 0
waited:
  description: Seconds spent waiting for sessions to end or for the health check.
  returned: success
  type: float
  sample: 4.5
"""

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.llmops.serving.plugins.module_utils._serving.haproxy_runtime import (  # noqa: E402
    RuntimeApi,
    RuntimeApiError,
    apply_state,
)
from ansible_collections.llmops.serving.plugins.module_utils.module_guard import run_module  # noqa: E402

ARGUMENT_SPEC = dict(
    socket=dict(type="path", default="/run/haproxy/llmops-admin.sock"),
    backend=dict(type="str", required=True),
    server=dict(type="str", required=True),
    state=dict(type="str", choices=["ready", "drain", "maint"], required=True),
    drain_timeout=dict(type="int", default=120),
    wait_healthy=dict(type="bool", default=True),
    healthy_timeout=dict(type="int", default=120),
    poll_interval=dict(type="float", default=0.5),
)


def main():
    run_module(AnsibleModule, "gateway_server", _run, argument_spec=ARGUMENT_SPEC)


def _run(module):
    p = module.params
    try:
        result = apply_state(RuntimeApi(p["socket"]), p["backend"], p["server"], p["state"],
                             drain_timeout=p["drain_timeout"], wait_healthy=p["wait_healthy"],
                             healthy_timeout=p["healthy_timeout"], poll_interval=p["poll_interval"],
                             check_mode=module.check_mode)
    except RuntimeApiError as exc:
        partial = dict(exc.result or {})
        partial["changed"] = bool(partial.get("changed"))
        module.fail_json(msg=str(exc), **partial)
    except Exception as exc:  # unexpected (an odd HAProxy answer): still one clear line, no traceback
        module.fail_json(msg="gateway_server failed on %s/%s: %s: %s" % (p["backend"], p["server"],
                                                                         type(exc).__name__, exc))
    module.exit_json(**result)


if __name__ == "__main__":
    main()
