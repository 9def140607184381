#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: gpu_pci_info
short_description: Read the NVIDIA GPUs from the PCI bus (no driver needed) and check them
author:
  - llmops.serving developers (@llmops)
version_added: "1.0.0"
description:
  - Lists the NVIDIA GPUs (vendor C(10de), PCI class C(0300) VGA or C(0302) 3D controller) under
    C(<sysfs_root>/bus/pci/devices), with their device id, product name and the driver bound to them (for
    example C(nouveau) on a bare node, C(nvidia) once the driver runs, empty when none is bound).
  - Works on a node without a working NVIDIA driver, where M(llmops.serving.gpu_facts) sees nothing.
  - Publishes the C(llmops_pci_gpus) fact. With O(expected), fails when the bus does not show the GPUs the
    inventory describes (how many, which product), naming each GPU found, or when the bus cannot be read.
    Without it, an unreadable bus (a container without sysfs) only shows in RV(report).
  - Read-only; never changes the host.
options:
  sysfs_root:
    description:
      - Where sysfs is mounted. Only a test harness points it at a fake tree.
    type: path
    default: /sys
  expected:
    description:
      - What the bus must show. C(count) - exactly that many NVIDIA GPUs; C(names) - products, as the PCI ID
        database or nvidia-smi names them (V(L20), V(NVIDIA L20)); C(device_ids) - PCI device ids
        (V(10de:26ba) or V(26ba)). Every GPU must match one name or id. Empty checks nothing.
    type: dict
    default: {}
extends_documentation_fragment:
  - llmops.serving.attributes
  - llmops.serving.attributes.info_module
  - llmops.serving.attributes.facts
"""

EXAMPLES = r"""
- name: Refuse a box that is not 4x L20 before installing a driver
  llmops.serving.gpu_pci_info:
    expected:
      count: 4
      names: [L20]

- name: Say whether nouveau holds the GPUs
  ansible.builtin.debug:
    msg: "{{ llmops_pci_gpus.nouveau | length }} GPU(s) held by nouveau"
"""

RETURN = r"""
ansible_facts:
  description: The host fact C(llmops_pci_gpus) (a failed run returns it at the top level instead).
  returned: always
  type: dict
  contains:
    llmops_pci_gpus:
      description: The NVIDIA GPUs on the PCI bus.
      returned: always
      type: dict
      contains:
        count:
          description: Number of NVIDIA GPUs.
          type: int
          returned: always
        gpus:
          description: Per GPU, by PCI address - address, vendor_id, device_id, class_id, name, driver.
          type: list
          elements: dict
          returned: always
          sample: [{"address": "0000:18:00.0", "vendor_id": "10de", "device_id": "26ba", "class_id": "0302",
                    "name": "L20", "driver": "nouveau"}]
        names:
          description: How many GPUs of each product.
          type: dict
          returned: always
          sample: {"L20": 4}
        nouveau:
          description: PCI addresses of the GPUs nouveau holds.
          type: list
          elements: str
          returned: always
        nvidia:
          description: PCI addresses of the GPUs the nvidia driver holds.
          type: list
          elements: str
          returned: always
        unbound:
          description: PCI addresses of the GPUs no driver holds.
          type: list
          elements: str
          returned: always
failures:
  description: Why the bus does not show what O(expected) asks, one sentence each.
  returned: always
  type: list
  elements: str
report:
  description: One line for a report, e.g. "PCI - 4x L20 (nouveau on 4).".
  returned: always
  type: str
"""

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.llmops.serving.plugins.module_utils._gpu import pci as gpu_pci  # noqa: E402
from ansible_collections.llmops.serving.plugins.module_utils.module_guard import run_module  # noqa: E402

ARGUMENT_SPEC = dict(
    sysfs_root=dict(type="path", default="/sys"),
    expected=dict(type="dict", default={}),
)


def main():
    run_module(AnsibleModule, "gpu_pci_info", _run, argument_spec=ARGUMENT_SPEC, expected=(gpu_pci.PciError,))


def _run(module):
    expected = gpu_pci.normal_expected(module.params["expected"])
    try:
        facts = gpu_pci.summary(gpu_pci.read_pci_gpus(module.params["sysfs_root"]))
        unreadable = ""
    except gpu_pci.PciError as exc:
        # Nothing to check against: only an expectation makes that fatal (a container without sysfs is fine).
        if expected:
            module.fail_json(msg="Cannot check llmops_gpu_expected: %s." % exc)
        facts, unreadable = gpu_pci.summary([]), str(exc)
    failures = gpu_pci.check_expected(facts["gpus"], expected)
    result = dict(changed=False, failures=failures,
                  report="PCI bus not readable: %s." % unreadable if unreadable else gpu_pci.report(facts))
    if failures:
        module.fail_json(msg="This is not the box the inventory describes: %s. Fix llmops_gpu_expected (or "
                             "the inventory host), or the hardware, before the driver is installed."
                             % "; ".join(failures), llmops_pci_gpus=facts, **result)
    module.exit_json(ansible_facts=dict(llmops_pci_gpus=facts), **result)


if __name__ == "__main__":
    main()
