#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: systemd_info
short_description: Read systemd on the node - the services that run now, its version, what PID 1 may grant
author:
  - llmops.serving developers (@llmops)
version_added: "0.7.0"
description:
  - Runs C(systemctl list-units --type=service --state=running) once and returns the names of the running
    services, as the keys of C(ansible_facts.services) whose state is C(running) would be, and
    which of the services named in O(units) are enabled at boot (C(systemctl show) of those units); with them
    the output of C(systemctl --version), the text of C(/proc/1/status) and C(/proc/1/limits), and the RAM.
  - One module call for what role serving's planner reads each run (three tasks before), and used instead
    of M(ansible.builtin.service_facts) where only the running services are needed (the driver's reboot
    policy C(auto), the memory planner) - service_facts also lists every unit file and runs
    C(service --status-all), which calls every SysV script's status and took over a minute on a loaded node.
  - Decisions from these are made on the controller (C(plugins/plugin_utils/systemd.py)); the reading is in
    C(plugins/module_utils/_serving/systemd_units.py). Read-only.
options:
  systemctl:
    description:
      - The systemctl to run; by default the one on the node's PATH.
    type: path
  units:
    description:
      - Services whose unit-file state to read (RV(enabled_units)), e.g. the units of role serving's
        instances. Empty reads none (no call).
      - Each must be a systemd unit name (letters, digits, C(:-_.\), an C(@) before an instance, a type
        suffix such as C(.service)); they are passed after C(--), never as options.
    type: list
    elements: str
    default: []
  timeout:
    description:
      - Seconds each systemctl call may take before the module fails saying so.
    type: int
    default: 30
  proc_root:
    description:
      - Where the node's proc filesystem is mounted (PID 1's status and limits are read there).
    type: path
    default: /proc
extends_documentation_fragment:
  - llmops.serving.attributes
  - llmops.serving.attributes.info_module
"""

EXAMPLES = r"""
- name: Read which units run now, systemd's version and what PID 1 may grant
  llmops.serving.systemd_info:
  register: running

- name: Say whether the instance runs
  ansible.builtin.debug:
    msg: "{{ 'llama-server-qwen.service' in running.running_units }}"
"""

RETURN = r"""
running_units:
  description: The running services' unit names, sorted.
  returned: success
  type: list
  elements: str
  sample: ["dbus.service", "llama-server-qwen.service", "sshd.service"]
enabled_units:
  description: Those of O(units) whose unit files are enabled to start at boot, sorted. With
    RV(running_units), what a no-op run needs to leave a service alone that is running and enabled already.
  returned: success
  type: list
  elements: str
  sample: ["llama-server-qwen.service", "sshd.service"]
version_text:
  description: The output of C(systemctl --version).
  returned: success
  type: str
  sample: "systemd 252 (252.36-1~deb12u1)"
pid1_status_limits:
  description: The text of C(/proc/1/status) followed by C(/proc/1/limits).
  returned: success
  type: str
memtotal_mib:
  description: The node's RAM in MiB (C(MemTotal) of C(/proc/meminfo), as the C(memtotal_mb) fact), or null
    where it cannot be read - what the memory planner sets against an instance planned in host memory, read
    here so that a run needs no hardware facts.
  returned: success
  type: int
  sample: 515703
"""

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.llmops.serving.plugins.module_utils._serving import systemd_units  # noqa: E402
from ansible_collections.llmops.serving.plugins.module_utils.module_guard import run_module  # noqa: E402

ARGUMENT_SPEC = dict(
    systemctl=dict(type="path"),
    units=dict(type="list", elements="str", default=[]),
    timeout=dict(type="int", default=30),
    proc_root=dict(type="path", default="/proc"),
)


def main():
    run_module(AnsibleModule, "systemd_info", _run, argument_spec=ARGUMENT_SPEC)


def _run(module):
    timeout = module.params["timeout"]
    if timeout < 1 or timeout > 3600:
        module.fail_json(msg="timeout must be between 1 and 3600 seconds, not %s" % timeout)
    systemctl = module.params["systemctl"] or module.get_bin_path("systemctl")
    if not systemctl:
        module.fail_json(msg="systemctl is not on the node's PATH: the collection serves under systemd "
                             "(set systemctl to its path if it lives elsewhere)")
    units, error = systemd_units.read_running_units(systemctl, timeout)
    if not error:
        enabled, error = systemd_units.read_enabled_units(systemctl, module.params["units"], timeout)
    if not error:
        version_text, error = systemd_units.read_version(systemctl, timeout)
    if not error:
        pid1, error = systemd_units.read_pid1(module.params["proc_root"])
    if error:
        module.fail_json(msg=error)
    module.exit_json(changed=False, running_units=units, enabled_units=enabled, version_text=version_text,
                     pid1_status_limits=pid1,
                     memtotal_mib=systemd_units.read_memtotal_mib(module.params["proc_root"]))


if __name__ == "__main__":
    main()
