# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Filters of the monitoring roles (plugins/plugin_utils/monitoring.py).

    {{ llmops_instances | llmops.serving.monitoring_agent_plan(host=inventory_hostname, options={...}) }}
                                                          -> {config, credentials, warnings} of a node's agent
    {{ llmops_instances | llmops.serving.monitoring_node_textfile(models_dir, models_mount) }}   -> text
    {{ [model_dir] | llmops.serving.monitoring_models_mountpoint(ansible_facts['mounts']) }}     -> '/home'
    {{ groups[group] | llmops.serving.monitoring_inventory_nodes(hostvars) }}  -> {host: {instance: {engine}}}
    {{ nodes | llmops.serving.monitoring_inventory_rules(min_decode_tps, max_ttft_s) }}         -> rule groups
    {{ options | llmops.serving.monitoring_server_config }}              -> prometheus.yml
    {{ options | llmops.serving.monitoring_alertmanager_config }}        -> alertmanager.yml
    {{ options | llmops.serving.monitoring_prometheus_args }}            -> Prometheus' flags (ARGS)
    {{ 'llmops-grafana' | llmops.serving.monitoring_username('monitoring_server_query_username') }}
"""
from __future__ import absolute_import, division, print_function

from ansible_collections.llmops.serving.plugins.plugin_utils import monitoring
from ansible_collections.llmops.serving.plugins.plugin_utils.serving_errors import filter_errors

__metaclass__ = type

_wrap = filter_errors("monitoring")


def monitoring_agent_plan(instances, host=None, options=None):
    return monitoring.agent_plan(host, instances, options)


class FilterModule(object):
    """The monitoring of the nodes (role monitoring) and of the monitoring host (role monitoring_server)."""

    def filters(self):
        return {
            "monitoring_agent_plan": _wrap(monitoring_agent_plan),
            "monitoring_node_textfile": _wrap(monitoring.node_textfile),
            "monitoring_models_mountpoint": _wrap(monitoring.models_mountpoint),
            "monitoring_inventory_nodes": _wrap(monitoring.inventory_nodes),
            "monitoring_inventory_rules": _wrap(monitoring.inventory_rules),
            "monitoring_server_config": _wrap(monitoring.server_config),
            "monitoring_alertmanager_config": _wrap(monitoring.alertmanager_config),
            "monitoring_prometheus_args": _wrap(monitoring.prometheus_args),
            "monitoring_username": _wrap(monitoring.check_username),
        }
