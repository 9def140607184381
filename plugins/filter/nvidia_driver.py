# -*- coding: utf-8 -*-
# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Decisions of role nvidia_driver that its vars need before any module runs, from
plugins/module_utils/_gpu/driver.py (where the driver plan is):

    {{ nvidia_driver_install_method | llmops.serving.nvidia_driver_headers_needed(ansible_os_family,
                                                                                 nvidia_driver_el7_flavor) }}
    {{ nvidia_driver_version | llmops.serving.nvidia_driver_preflight_summary(llmops_gpus, reboot_policy,
                                                                             managed) }}
    {{ nvidia_driver_version | llmops.serving.nvidia_driver_detect_plan(llmops_gpus) }}   ({}: ask the node)
"""
from __future__ import absolute_import, division, print_function

from ansible.errors import AnsibleFilterError
from ansible_collections.llmops.serving.plugins.module_utils._gpu.driver import (
    detect_plan_without_node,
    headers_needed,
    preflight_summary,
)

__metaclass__ = type


def nvidia_driver_preflight_summary(wanted_version, gpus, reboot_policy="auto", managed=True):
    try:
        return preflight_summary(wanted_version, gpus, reboot_policy, managed)
    except ValueError as exc:
        raise AnsibleFilterError(str(exc)) from None


def nvidia_driver_detect_plan(wanted_version, gpus):
    """driver_plan()'s detect plan, or {} when the node must be asked (a dict either way: a None would reach
    a role variable as a string)."""
    try:
        return detect_plan_without_node(wanted_version, gpus) or {}
    except ValueError as exc:
        raise AnsibleFilterError(str(exc)) from None


class FilterModule(object):
    """Whether the driver install needs the running kernel's headers; what preflight says the driver stage
    will do (driver_plan()'s detect decision)."""

    def filters(self):
        return {"nvidia_driver_headers_needed": headers_needed,
                "nvidia_driver_preflight_summary": nvidia_driver_preflight_summary,
                "nvidia_driver_detect_plan": nvidia_driver_detect_plan}
