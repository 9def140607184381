#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: (c) 2026, llmops.serving contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: nvidia_driver_info
short_description: Decide what the NVIDIA driver of a node needs - nothing, an install or a reboot
version_added: "1.0.0"
description:
  - Reads the loaded nvidia kernel module (C(<sysfs_module_dir>/nvidia/version)), whether nouveau is loaded
    (C(<sysfs_module_dir>/nouveau)) and, before the NVIDIA runfile installer, the module installed on disk
    (C(modinfo -F version nvidia)), and compares them and what nvidia-smi reports (the C(llmops_gpus) fact of
    M(llmops.serving.gpu_facts)) with the wanted driver version.
  - Returns the driver plan of role C(llmops.serving.nvidia_driver) for one stage of that role, RV(action)
    with RV(reasons). The whole story is told in C(plugins/module_utils/nvidia_driver.py).
  - Read-only; never changes the host.
options:
  wanted_version:
    description:
      - The driver version the node must run, for example V(550.54.14).
    type: str
    required: true
  stage:
    description:
      - V(detect) at the start of the role - V(none) when nvidia-smi reports O(wanted_version), else
        V(install).
      - V(before_installer) before the NVIDIA runfile installer - V(reboot) while nouveau is loaded, V(none)
        when the wanted module is already installed, else V(install).
      - V(final) after the install - V(reboot) while anything keeps the wanted driver from being used, else
        V(none).
    type: str
    choices: [detect, before_installer, final]
    default: final
  gpus:
    description:
      - What nvidia-smi reports, as the C(llmops_gpus) fact of M(llmops.serving.gpu_facts) (keys C(present),
        C(driver_version), C(error)). Empty means nvidia-smi was not read.
    type: dict
    default: {}
  sysfs_module_dir:
    description:
      - Where the kernel lists loaded modules. Only a test harness that emulates a driver stack points it
        elsewhere.
    type: path
    default: /sys/module
seealso:
  - module: llmops.serving.gpu_facts
author:
  - llmops.serving developers (@llmops)
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - llmops.serving.attributes.read_only
"""

EXAMPLES = r"""
- name: Read the GPUs
  llmops.serving.gpu_facts:
    required: false

- name: Decide whether driver 550.54.14 must be installed
  llmops.serving.nvidia_driver_info:
    wanted_version: "550.54.14"
    gpus: "{{ llmops_gpus }}"
    stage: detect
  register: driver_plan

- name: Say why
  ansible.builtin.debug:
    msg: "{{ driver_plan.action }}: {{ driver_plan.reasons | join('; ') }}"
"""

RETURN = r"""
action:
  description: What the node needs now.
  returned: always
  type: str
  choices: [none, install, reboot]
  sample: reboot
reasons:
  description: Why, one sentence each (empty for V(none) in the final stage).
  returned: always
  type: list
  elements: str
  sample: ["nvidia-smi reports driver 535.104.05"]
stage:
  description: The stage the plan is for (O(stage)).
  returned: always
  type: str
  sample: final
wanted_version:
  description: O(wanted_version).
  returned: always
  type: str
  sample: "550.54.14"
wanted_loaded:
  description: Whether nvidia-smi reports exactly O(wanted_version).
  returned: always
  type: bool
  sample: false
loaded_module:
  description: Version of the loaded nvidia kernel module, empty when none is loaded.
  returned: always
  type: str
  sample: "535.104.05"
nouveau_loaded:
  description: Whether the nouveau module is loaded.
  returned: always
  type: bool
  sample: false
installed_module:
  description: Version of the nvidia module on disk (C(modinfo)), read in the V(before_installer) stage only.
  returned: always
  type: str
  sample: ""
load_module:
  description: V(final) stage - no driver module and no nouveau are loaded, so C(modprobe nvidia) is enough.
  returned: always
  type: bool
  sample: true
"""

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.llmops.serving.plugins.module_utils.nvidia_driver import (  # noqa: E402
    STAGES,
    driver_plan,
    read_loaded_module,
    read_nouveau_loaded,
)


def installed_module_version(module):
    modinfo = module.get_bin_path("modinfo", opt_dirs=["/sbin", "/usr/sbin"])
    if not modinfo:
        return ""
    rc, out, _err = module.run_command([modinfo, "-F", "version", "nvidia"])
    return out.strip() if rc == 0 else ""


def main():
    module = AnsibleModule(
        argument_spec=dict(
            wanted_version=dict(type="str", required=True),
            stage=dict(type="str", choices=list(STAGES), default="final"),
            gpus=dict(type="dict", default={}),
            sysfs_module_dir=dict(type="path", default="/sys/module"),
        ),
        supports_check_mode=True,
    )
    p = module.params
    plan = driver_plan(
        p["wanted_version"],
        p["stage"],
        gpus=p["gpus"],
        loaded_module=read_loaded_module(p["sysfs_module_dir"]),
        nouveau_loaded=read_nouveau_loaded(p["sysfs_module_dir"]),
        installed_module=installed_module_version(module) if p["stage"] == "before_installer" else "",
    )
    module.exit_json(changed=False, **plan)


if __name__ == "__main__":
    main()
