# -*- coding: utf-8 -*-
# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Filters of the rolling update and rollback (plugins/plugin_utils/rollout.py) for roles serving and fleet.

    {{ _serving_item | llmops.serving.fleet_deployment_record(unit_checksum=, time=, health_timeout=) }}
    {{ _serving_item | llmops.serving.fleet_unrecorded_deployment(unit_checksum=) }}
    {{ inventory_hostname | llmops.serving.fleet_host_servers(hostvars, gateway_fact[, instances=records]) }}
    {{ records | llmops.serving.fleet_rollback_selection(instance=, host=, directory=) }}
    {{ ansible_play_hosts_all | llmops.serving.fleet_summary(hostvars) }}
    {{ ansible_play_name | llmops.serving.fleet_deployment_run }}     (once per run: keep it with set_fact)
    {{ refused_step.lock | llmops.serving.fleet_lock_owner_gone }}    (the run holding that lock was killed)
"""
from __future__ import absolute_import, division, print_function

from ansible_collections.llmops.serving.plugins.plugin_utils import rollout
from ansible_collections.llmops.serving.plugins.plugin_utils.serving_errors import filter_errors

__metaclass__ = type

_wrap = filter_errors("fleet")


def fleet_host_servers(host, hostvars, gateway_fact=None, instances=None):
    """The servers of `host` at the gateway (of `instances`, [{name, served_model_name}], when given)."""
    return rollout.host_servers(host, hostvars, gateway_fact=gateway_fact or None,
                                instances=None if instances is None else list(instances))


def fleet_summary(hosts, hostvars):
    """The rolling update's outcome per host."""
    return rollout.summary(list(hosts or ()), hostvars)


class FilterModule(object):
    """Rolling updates and rollbacks across the fleet."""

    def filters(self):
        return {
            "fleet_deployment_record": _wrap(rollout.deployment_record),
            "fleet_unrecorded_deployment": _wrap(rollout.unrecorded_deployment),
            "fleet_host_servers": _wrap(fleet_host_servers),
            "fleet_rollback_selection": _wrap(rollout.rollback_selection),
            "fleet_summary": _wrap(fleet_summary),
            "fleet_deployment_run": _wrap(rollout.deployment_run),
            "fleet_lock_owner_gone": _wrap(rollout.lock_owner_gone),
        }
