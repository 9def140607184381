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
author:
  - llmops.serving developers (@llmops)
version_added: "1.0.0"
description:
  - Reads the loaded nvidia kernel module (C(<sysfs_module_dir>/nvidia/version)), whether nouveau is loaded
    (C(<sysfs_module_dir>/nouveau)) and, before the NVIDIA runfile installer, the module installed on disk
    (C(modinfo -F version nvidia)), and compares them and what nvidia-smi reports (the C(llmops_gpus) fact of
    M(llmops.serving.gpu_facts)) with the wanted driver version.
  - Returns the driver plan of role C(llmops.serving.nvidia_driver) for one stage of that role, RV(action)
    with RV(reasons). The whole story is told in C(plugins/module_utils/_gpu/driver.py).
  - When the plan is a reboot, also whether the play may carry it out by O(reboot_policy) (RV(reboot),
    RV(reboot_blockers)); for V(auto) it reads the processes that hold NVIDIA device nodes open
    (C(<proc_root>/<pid>/fd)) and takes the running units from O(running_units).
  - In the V(detect) stage, when the plan is an install, also whether a driver installed with NVIDIA's C(.run)
    installer is on the node (C(/usr/bin/nvidia-uninstall), driver files that no package owns by C(rpm -qf) or
    C(dpkg -S), C(/var/log/nvidia-installer.log)) and what the role does about it by O(runfile_policy)
    (RV(runfile_action), RV(runfile_message)); the story is in C(plugins/module_utils/_gpu/runfile.py).
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
  reboot_policy:
    description:
      - C(nvidia_driver_allow_reboot) - V(true) reboots for a reboot plan, V(false) never, V(auto) only a node
        where no process uses the GPUs and no unit matching O(busy_units) runs. YAML booleans are accepted.
    type: raw
    default: "false"
  running_units:
    description:
      - The units running now (the names of C(ansible_facts.services) whose state is running).
    type: list
    elements: str
    default: []
  busy_units:
    description:
      - Shell patterns of the units that mean the node serves (V(llama-server-*.service)).
    type: list
    elements: str
    default: []
  ignore_processes:
    description:
      - Process names (C(/proc/<pid>/comm)) that hold NVIDIA device nodes open without serving anything,
        such as V(nvidia-persistenced).
    type: list
    elements: str
    default: []
  proc_root:
    description:
      - Where procfs is mounted (the running kernel is C(<proc_root>/sys/kernel/osrelease)). Only a test
        harness points it elsewhere.
    type: path
    default: /proc
  install_method:
    description:
      - C(nvidia_driver_install_method). Packages (V(repo), V(distro)) are never installed over a runfile
        driver; the runfile method replaces one itself.
    type: str
    choices: [repo, distro, runfile]
    default: repo
  runfile_policy:
    description:
      - C(nvidia_driver_runfile_policy) - what an install of packages does about a runfile driver on the node.
        V(refuse) stops with what to do; V(uninstall) runs C(nvidia-uninstall --silent) first.
    type: str
    choices: [refuse, uninstall]
    default: refuse
  root:
    description:
      - Where the node's root filesystem is, for the runfile files. Only a test harness points it elsewhere.
    type: path
    default: /
seealso:
  - module: llmops.serving.gpu_facts
extends_documentation_fragment:
  - llmops.serving.attributes
  - llmops.serving.attributes.info_module
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
reboot:
  description: The plan is a reboot and O(reboot_policy) lets the play carry it out.
  returned: always
  type: bool
  sample: true
reboot_policy:
  description: O(reboot_policy) as V(auto), V(true) or V(false).
  returned: always
  type: str
  sample: auto
reboot_blockers:
  description: Why the play may not reboot for a reboot plan, one sentence each.
  returned: always
  type: list
  elements: str
  sample: ["2 process(es) use the GPUs: llama-server (pid 4242, /dev/nvidia2), ..."]
gpu_processes:
  description: The processes holding NVIDIA device nodes open (read for a reboot plan under V(auto) only).
  returned: always
  type: list
  elements: dict
  sample: [{"pid": 4242, "name": "llama-server", "device": "/dev/nvidia2"}]
busy_units:
  description: The units of O(running_units) that match O(busy_units).
  returned: always
  type: list
  elements: str
runfile:
  description:
    - V(detect) stage with an install plan - what the node says about a runfile install (installed, version,
      dkms, uninstaller, unowned, module_kernels, evidence); empty otherwise.
  returned: always
  type: dict
  sample: {"installed": true, "version": "550.54.14", "dkms": false, "uninstaller": true,
           "unowned": ["/usr/lib64/libcuda.so.550.54.14"], "module_kernels": ["3.10.0-1160.el7.x86_64"],
           "evidence": ["/usr/bin/nvidia-uninstall is there (the runfile installs it; an uninstall removes
                         it)"]}
runfile_action:
  description: What the role does about a runfile driver before installing packages.
  returned: always
  type: str
  choices: [none, refuse, uninstall]
  sample: refuse
runfile_message:
  description: Why, and what to do (empty for V(none)).
  returned: always
  type: str
"""

import os  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.llmops.serving.plugins.module_utils._gpu.driver import (  # noqa: E402
    STAGES,
    driver_plan,
    normal_reboot_policy,
    read_gpu_processes,
    read_loaded_module,
    read_nouveau_loaded,
    reboot_decision,
)
from ansible_collections.llmops.serving.plugins.module_utils._gpu.runfile import (  # noqa: E402
    RUNFILE_POLICIES,
    package_owner,
    read_runfile_install,
    runfile_plan,
)
from ansible_collections.llmops.serving.plugins.module_utils.module_guard import run_module  # noqa: E402


def installed_module_version(module):
    modinfo = module.get_bin_path("modinfo", opt_dirs=["/sbin", "/usr/sbin"])
    if not modinfo:
        return ""
    rc, out, _err = module.run_command([modinfo, "-F", "version", "nvidia"])
    return out.strip() if rc == 0 else ""


def owner_lookup(module, root):
    """node path -> owning package ('' when none owns it), by dpkg -S where dpkg is, else rpm -qf; None when
    the node has neither (then no file counts as the runfile's)."""
    dpkg = module.get_bin_path("dpkg")
    rpm = None if dpkg else module.get_bin_path("rpm")
    if not (dpkg or rpm):
        return None

    def owner(path):
        argv = [dpkg, "-S", path] if dpkg else [rpm, "-qf", path]
        rc, out, _err = module.run_command(argv)
        return package_owner(rc, out)
    # A fake root (test harness) asks the fake tools about its own paths.
    return owner if root == "/" else (lambda path: owner(os.path.join(root, path.lstrip("/"))))


def running_kernel(proc_root):
    try:
        with open(os.path.join(proc_root, "sys", "kernel", "osrelease")) as handle:
            return handle.read().strip()
    except (IOError, OSError):
        return ""


ARGUMENT_SPEC = dict(
    wanted_version=dict(type="str", required=True),
    stage=dict(type="str", choices=list(STAGES), default="final"),
    gpus=dict(type="dict", default={}),
    sysfs_module_dir=dict(type="path", default="/sys/module"),
    reboot_policy=dict(type="raw", default="false"),
    running_units=dict(type="list", elements="str", default=[]),
    busy_units=dict(type="list", elements="str", default=[]),
    ignore_processes=dict(type="list", elements="str", default=[]),
    proc_root=dict(type="path", default="/proc"),
    install_method=dict(type="str", choices=["repo", "distro", "runfile"], default="repo"),
    runfile_policy=dict(type="str", choices=list(RUNFILE_POLICIES), default="refuse"),
    root=dict(type="path", default="/"),
)


def main():
    run_module(AnsibleModule, "nvidia_driver_info", _run, argument_spec=ARGUMENT_SPEC, expected=(ValueError,))


def _run(module):
    p = module.params
    for name in ("sysfs_module_dir", "proc_root", "root"):
        if "\x00" in p[name]:
            raise ValueError("%s must be a path without NUL bytes" % name)
    plan = driver_plan(
        p["wanted_version"],
        p["stage"],
        gpus=p["gpus"],
        loaded_module=read_loaded_module(p["sysfs_module_dir"]),
        nouveau_loaded=read_nouveau_loaded(p["sysfs_module_dir"]),
        installed_module=installed_module_version(module) if p["stage"] == "before_installer" else "",
    )
    policy = normal_reboot_policy(p["reboot_policy"])
    # The processes matter only when a reboot is pending and the policy asks.
    processes = (read_gpu_processes(p["proc_root"], p["ignore_processes"])
                 if plan["action"] == "reboot" and policy == "auto" else [])
    plan.update(reboot_decision(plan["action"], policy, processes, p["running_units"], p["busy_units"]),
                gpu_processes=processes)
    # Packages are never installed over a runfile driver: read the node only when the plan installs.
    runfile = {}
    if plan["stage"] == "detect" and plan["action"] == "install":
        runfile = read_runfile_install(p["root"], owner_lookup(module, p["root"]))
    plan.update(runfile_plan(runfile, p["install_method"], p["runfile_policy"], plan["wanted_version"],
                             p["gpus"], running_kernel(p["proc_root"]) if runfile.get("installed") else ""),
                runfile=runfile)
    module.exit_json(changed=False, **plan)


if __name__ == "__main__":
    main()
