#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: gpu_facts
short_description: Gather NVIDIA GPU facts with nvidia-smi and check them against requirements
author:
  - llmops.serving developers (@llmops)
version_added: "1.0.0"
description:
  - Runs C(nvidia-smi --query-gpu=... --format=csv,noheader,nounits) with a hard timeout and reads the CUDA
    version the driver supports (from C(nvidia-smi --version), the C(nvidia-smi) banner or C(nvidia-smi -q)).
  - Publishes the result as the C(llmops_gpus) fact, which other llmops.serving roles read.
  - A host without nvidia-smi gets C(present=false), or a failure when O(required=true). A broken driver
    (kernel module / library mismatch, no devices, a GPU fallen off the bus, a hanging nvidia-smi) is reported
    in C(llmops_gpus.error) with what to do about it.
  - Drivers older than R510 do not know the C(compute_cap) field; the module then asks for the PCI device id
    and looks the compute capability up in a built-in table (by PCI id, then by product name).
  - Optional checks (O(require_arch), O(min_driver_version), O(require_cuda), O(min_memory_mib),
    O(min_free_memory_mib)) apply to every GPU, or only to O(devices). A failed check names the GPU, what was
    found, what was wanted and how to fix it.
  - One GPU in a bad state (nvidia-smi prints C([GPU requires reset]), C(ERR!), C([Unknown Error]) or
    C([GPU is lost]) in its row, a required field such as its memory is C([N/A]), or a value cannot be read)
    is that GPU's fault, the other GPUs are still read. It is left out of C(llmops_gpus.gpus), described in
    RV(faulty_gpus) and in C(llmops_gpus.error) with how to reset it (C(nvidia-smi -r -i N) or a reboot).
    When it is one of the GPUs the checks apply to, the checks (and O(required)) fail naming it; when it is
    not in O(devices), the module only warns.
  - Lines nvidia-smi prints among the CSV rows that are not GPU rows (such as its warning that the infoROM
    of a GPU is corrupted) are skipped and returned as warnings; output that is not UTF-8 is decoded with
    replacement characters.
  - Read-only; never changes the host.
extends_documentation_fragment:
  - llmops.serving.attributes
  - llmops.serving.attributes.info_module
  - llmops.serving.attributes.facts
options:
  nvidia_smi_path:
    description:
      - Path of the nvidia-smi executable.
      - When unset, C(nvidia-smi) is looked up in E(PATH), then in C(/usr/bin) and C(/usr/local/bin).
    type: path
  timeout:
    description:
      - Seconds each nvidia-smi call may take before it is killed (with its whole process group).
    type: int
    default: 15
  required:
    description:
      - When V(false), a host without a working NVIDIA driver returns C(present=false) and the reason in
        C(llmops_gpus.error).
      - When V(true), that is a failure, and so is any GPU that has fallen off the bus, and any GPU in a bad
        state among O(devices) (all GPUs when O(devices) is empty).
    type: bool
    default: false
  require_arch:
    description:
      - Compute capabilities the GPUs must have. Each entry is exact (V(8.9), V(sm_89), V(89)) or a minimum
        (V(>=8.0)). A GPU passes when it satisfies at least one entry.
    type: list
    elements: str
    default: []
  min_driver_version:
    description:
      - Oldest acceptable NVIDIA driver version, for example V(550.54.14).
    type: str
  require_cuda:
    description:
      - CUDA release of the programs the driver must run, for example V(12.4).
      - Checked with CUDA's compatibility rules (minor-version compatibility), not against the driver that
        CUDA release ships with - a program built with any CUDA 11.x runs on a driver >= 450.80.02, 12.x on
        >= 525.60.13, 13.x on >= 580.65.06. So V(12.9) is met by driver 550.54.14 (which is CUDA 12.4).
      - For a major release outside these, the CUDA version nvidia-smi reports is compared by major release.
      - Forward compatibility (a newer major release on an older driver through a cuda-compat package) is not
        assumed here; the serving layer decides it per engine runtime.
    type: str
  min_memory_mib:
    description:
      - Minimum total memory per GPU, in MiB (a 48 GB L20 reports 46068).
    type: int
  min_free_memory_mib:
    description:
      - Minimum free memory per GPU, in MiB, at the time of the check.
    type: int
  devices:
    description:
      - GPU indices or UUIDs to check and return in RV(selected). Empty means all GPUs.
      - A device that is not present is an error. A GPU in a bad state outside these devices only gives a
        warning.
    type: list
    elements: str
    default: []
  defer_checks:
    description:
      - When V(true), the checks above run only when nvidia-smi shows every GPU with its compute capability;
        without a driver yet, or with one older than R510 (no C(compute_cap)), the facts are returned and
        RV(checks_deferred) says the checks wait for a later call.
      - What preflight uses to refuse what no driver can change (architecture, memory, devices) in the same
        call that reads the GPUs, before the driver stage had its chance.
    type: bool
    default: false
  later_checks:
    description:
      - With O(defer_checks), the checks a later call makes once the driver stage has had its chance (the GPU
        host stage's). They are evaluated on the GPUs and driver as they are now and never fail this call;
        RV(later_checks_pass) says whether that later call would pass. The GPU host stage skips its second
        read of the GPUs when it would and the driver stage changed nothing.
      - Their meaning is that of the options of the same names; O(require_arch), O(min_memory_mib) and
        O(devices) apply to both.
    type: dict
    default: {}
    suboptions:
      required:
        description: As O(required).
        type: bool
        default: false
      min_driver_version:
        description: As O(min_driver_version).
        type: str
      require_cuda:
        description: As O(require_cuda).
        type: str
      min_free_memory_mib:
        description: As O(min_free_memory_mib).
        type: int
notes:
  - Runs on the managed node with Python 3.6 or newer; needs no Python package beyond the standard library.
  - The CUDA rules come from NVIDIA's CUDA Compatibility guide (minor-version compatibility, Table 1) and the
    CUDA Toolkit release notes (the driver of each GA release, which gives the CUDA version reported for a
    driver); they live in plugins/module_utils/_gpu/cuda_compat.py.
"""

EXAMPLES = r"""
- name: Read the GPUs (a host without a driver gets present=false)
  llmops.serving.gpu_facts:

- name: Require Ada GPUs with at least 46000 MiB and a driver that runs CUDA 12.4 programs (any >= 525.60.13)
  llmops.serving.gpu_facts:
    required: true
    require_arch: ["8.9"]
    require_cuda: "12.4"
    min_memory_mib: 46000

- name: Check only the GPUs an instance will use, with 40 GiB free on each
  llmops.serving.gpu_facts:
    devices: [0, 1]
    min_free_memory_mib: 40960
    require_arch: [">=8.0"]
  register: gpu_check

- name: Show what was found
  ansible.builtin.debug:
    msg: "{{ ansible_facts.llmops_gpus.count }} x {{ ansible_facts.llmops_gpus.gpus[0].name }}"
  when: ansible_facts.llmops_gpus.present
"""

RETURN = r"""
ansible_facts:
  description: The host fact C(llmops_gpus), which the other roles read.
  returned: always
  type: dict
  contains:
    llmops_gpus:
      description: What nvidia-smi reported; other llmops.serving roles depend on these keys.
      returned: always
      type: dict
      contains:
        present:
          description: Whether at least one working NVIDIA GPU was found.
          type: bool
          returned: always
        count:
          description: Number of working GPUs.
          type: int
          returned: always
        driver_version:
          description: NVIDIA driver version, empty when unknown.
          type: str
          returned: always
          sample: "550.54.14"
        cuda_version:
          description: Newest CUDA version the driver supports, as nvidia-smi reports it; empty when unknown.
          type: str
          returned: always
          sample: "12.4"
        archs:
          description: CUDA architectures (compute capability without the dot), numerically sorted.
          type: list
          elements: str
          returned: always
          sample: ["89"]
        compute_caps:
          description: Compute capabilities of the GPUs, sorted numerically.
          type: list
          elements: str
          returned: always
          sample: ["8.9"]
        homogeneous:
          description: >-
            True when there is at least one GPU and all have the same name, compute capability and memory.
          type: bool
          returned: always
        error:
          description: >-
            Why GPUs are missing or unhealthy, with what to do about it (including a summary of the GPUs in a
            bad state, see RV(faulty_gpus)); null when all is well.
          type: str
          returned: always
        gpus:
          description: One entry per working GPU, by index; GPUs in a bad state are in RV(faulty_gpus).
          type: list
          elements: dict
          returned: always
          contains:
            index:
              description: nvidia-smi index.
              type: int
            uuid:
              description: GPU UUID.
              type: str
              sample: GPU-5b3f0c1e-8a4d-7e21-c9b6-2f0d41a7e3c8
            name:
              description: Product name.
              type: str
              sample: NVIDIA L20
            pci_bus_id:
              description: PCI bus id.
              type: str
              sample: "00000000:18:00.0"
            compute_cap:
              description: Compute capability; null when unknown.
              type: str
              sample: "8.9"
            cuda_arch:
              description: Compute capability without the dot; null when unknown.
              type: str
              sample: "89"
            memory_total_mib:
              description: Total memory in MiB.
              type: int
              sample: 46068
            memory_used_mib:
              description: Used memory in MiB.
              type: int
            memory_free_mib:
              description: Free memory in MiB.
              type: int
            driver_version:
              description: Driver version.
              type: str
            persistence_mode:
              description: Whether persistence mode is enabled.
              type: bool
            mig_mode:
              description: Current MIG mode (Enabled or Disabled); null on GPUs without MIG.
              type: str
            power_limit_w:
              description: Power limit in watts; null when not reported.
              type: float
            temperature_c:
              description: GPU temperature in degrees Celsius; null when not reported.
              type: int
            state:
              description: C(ok) for every GPU listed here (GPUs in another state are in RV(faulty_gpus)).
              type: str
              sample: ok
            error:
              description: Null for every GPU listed here.
              type: str
faulty_gpus:
  description: >-
    GPUs that nvidia-smi lists but reports in a bad state, by index. They are not in C(llmops_gpus.gpus) nor
    counted in C(llmops_gpus.count).
  returned: always
  type: list
  elements: dict
  contains:
    index:
      description: nvidia-smi index.
      type: int
    uuid:
      description: GPU UUID; null when not reported.
      type: str
    name:
      description: Product name; null when not reported.
      type: str
    pci_bus_id:
      description: PCI bus id; null when not reported.
      type: str
    state:
      description: >-
        C(reset_required) (C([GPU requires reset])), C(lost) (C([GPU is lost])) or C(error) (C(ERR!),
        C([Unknown Error]), a required field not reported, or a value that cannot be read).
      type: str
      sample: reset_required
    error:
      description: What nvidia-smi reported for this GPU and what to do (reset it or reboot the node).
      type: str
    bad_fields:
      description: The query fields that were in error, with what nvidia-smi printed.
      type: dict
      sample: {"memory.total": "[GPU requires reset]"}
selected:
  description: The GPUs the checks applied to (all GPUs, or those named in O(devices)); same shape as C(gpus).
  returned: always
  type: list
  elements: dict
failures:
  description: Failed checks, one message each.
  returned: always
  type: list
  elements: str
checks_deferred:
  description: With O(defer_checks), whether the checks were left for a later call (no GPU with a known
    compute capability to check yet); V(false) when they ran.
  returned: when O(defer_checks) is set
  type: bool
later_checks_pass:
  description: With O(defer_checks), whether the O(later_checks) (with O(require_arch), O(min_memory_mib) and
    O(devices)) pass on the GPUs and driver as they are now.
  returned: when O(defer_checks) is set
  type: bool
error_kind:
  description: >-
    Class of problem behind C(llmops_gpus.error): absent, mismatch, no_driver, no_devices, lost, timeout,
    failed, or faulty (only GPUs in a bad state, see RV(faulty_gpus)); null when there is none.
  returned: always
  type: str
"""

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.llmops.serving.plugins.module_utils._gpu import checks  # noqa: E402
from ansible_collections.llmops.serving.plugins.module_utils._gpu import smi as gpu  # noqa: E402
from ansible_collections.llmops.serving.plugins.module_utils.module_guard import run_module  # noqa: E402

ARGUMENT_SPEC = dict(
    nvidia_smi_path=dict(type="path"),
    timeout=dict(type="int", default=15),
    required=dict(type="bool", default=False),
    require_arch=dict(type="list", elements="str", default=[]),
    min_driver_version=dict(type="str"),
    require_cuda=dict(type="str"),
    min_memory_mib=dict(type="int"),
    min_free_memory_mib=dict(type="int"),
    devices=dict(type="list", elements="str", default=[]),
    defer_checks=dict(type="bool", default=False),
    later_checks=dict(type="dict", default={}, options=dict(
        required=dict(type="bool", default=False),
        min_driver_version=dict(type="str"),
        require_cuda=dict(type="str"),
        min_free_memory_mib=dict(type="int"),
    )),
)


def main():
    run_module(AnsibleModule, "gpu_facts", _run, argument_spec=ARGUMENT_SPEC)


def _run(module):
    p = module.params
    if p["timeout"] < 1:
        module.fail_json(msg="timeout must be at least 1 second, got %d" % p["timeout"])
    try:
        found = gpu.collect_all(nvidia_smi_path=p["nvidia_smi_path"], timeout=p["timeout"])
    except gpu.GpuError as exc:
        module.fail_json(msg=exc.message, error_kind=exc.kind)
    facts, kind, faulty = found["facts"], found["kind"], found["faulty"]

    for warning in found["warnings"]:
        module.warn(warning)
    for message in checks.faulty_warnings(faulty, p["devices"]):
        module.warn(message)
    for card in facts["gpus"]:
        if card["mig_mode"] == "Enabled":
            module.warn("GPU %d (%s) has MIG enabled: CUDA programs see its MIG instances, not the whole "
                        "GPU. Disable it with `nvidia-smi -i %d -mig 0` (and a GPU reset) to serve from the "
                        "full GPU." % (card["index"], card["name"], card["index"]))

    result = dict(changed=False, llmops_gpus=facts, error_kind=kind, selected=[], failures=[],
                  faulty_gpus=faulty)
    wanted_faulty = [f["error"] for f in faulty if checks.is_wanted(f, p["devices"])]
    missing = _no_usable_gpu(p["devices"], facts, found, faulty)
    if p["required"] and missing:
        module.fail_json(msg=missing, **result)
    if wanted_faulty and not p["required"]:
        for message in wanted_faulty:
            module.warn(message)

    deferred = p["defer_checks"] and (not facts["present"]
                                      or not all(g.get("compute_cap") for g in facts["gpus"]))
    if p["defer_checks"]:
        result.update(checks_deferred=bool(deferred),
                      later_checks_pass=_later_checks_pass(p, facts, found, faulty, p["later_checks"] or {}))
    selected, failures = ([], []) if deferred else checks.evaluate(
        facts,
        require_arch=p["require_arch"],
        min_driver_version=p["min_driver_version"],
        require_cuda=p["require_cuda"],
        min_memory_mib=p["min_memory_mib"],
        min_free_memory_mib=p["min_free_memory_mib"],
        devices=p["devices"],
        faulty=faulty,
        node_error=found["node_error"],
    )
    result.update(selected=selected, failures=failures)
    if failures:
        msg = "%d GPU check(s) failed:\n- %s" % (len(failures), "\n- ".join(failures))
        module.fail_json(msg=msg, **result)
    del result["llmops_gpus"]
    module.exit_json(ansible_facts=dict(llmops_gpus=facts), **result)


def _no_usable_gpu(devices, facts, found, faulty):
    """What O(required) fails with: no usable GPU (the node's error, a wanted GPU in a bad state, none
    present); None when there is one."""
    wanted_faulty = [f["error"] for f in faulty if checks.is_wanted(f, devices)]
    if found["node_error"] or wanted_faulty or not facts["present"]:
        return (" ".join([e for e in [found["node_error"]] + wanted_faulty if e])
                or facts["error"] or "no usable NVIDIA GPU")
    return None


def _later_checks_pass(p, facts, found, faulty, later):
    """Whether a later call with `later`'s options (and this call's architecture, memory and devices) would
    pass on these GPUs: the same rules as this module's required and checks.evaluate."""
    if later.get("required") and _no_usable_gpu(p["devices"], facts, found, faulty):
        return False
    _selected, failures = checks.evaluate(
        facts,
        require_arch=p["require_arch"],
        min_driver_version=later.get("min_driver_version"),
        require_cuda=later.get("require_cuda"),
        min_memory_mib=p["min_memory_mib"],
        min_free_memory_mib=later.get("min_free_memory_mib"),
        devices=p["devices"],
        faulty=faulty,
        node_error=found["node_error"],
    )
    return not failures


if __name__ == "__main__":
    main()
