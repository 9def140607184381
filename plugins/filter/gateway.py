# -*- coding: utf-8 -*-
# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Filters that expose the gateway's configuration structure (plugins/plugin_utils/gateway_config.py) to role
gateway's tasks and templates.

    {{ gateway_upstream_hosts | llmops.serving.gateway_config(hostvars, gateway_host=inventory_hostname,
                                                               api_keys=gateway_api_keys, rate_limit=60,
                                                               settings={'port': 8443, ...}) }}
        -> backends (with their backend key: a secret), servers, map file contents, the checked settings
    {{ config | llmops.serving.gateway_fact(url=..., admin_socket=...) }}  -> the llmops_gateway fact
    {{ 'HAProxy version 2.6.12-1+deb12u4' | llmops.serving.gateway_haproxy_version }} -> [2, 6, 12]
    {{ '10.0.0.5' | llmops.serving.gateway_server_address(8000) }}       -> 10.0.0.5:8000
    {{ '127.0.0.1' | llmops.serving.gateway_bind(9101, 'gateway_metrics_address') }}  -> 127.0.0.1:9101
"""
from __future__ import absolute_import, division, print_function

from ansible_collections.llmops.serving.plugins.plugin_utils import gateway_config
from ansible_collections.llmops.serving.plugins.plugin_utils.serving_errors import filter_errors

__metaclass__ = type

_wrap = filter_errors("gateway")


def gateway_config_filter(hosts, hostvars, gateway_host=None, api_keys=(), rate_limit=60, settings=None):
    """Backends (one per served model name), servers and map files of the gateway in front of `hosts`, and
    the role's settings checked (gateway_config.SETTINGS)."""
    if isinstance(hosts, str) or not isinstance(api_keys or (), (list, tuple)):
        raise gateway_config.GatewayError("gateway_upstream_hosts and gateway_api_keys must be lists")
    return gateway_config.build(list(hosts or ()), hostvars, gateway_host=gateway_host,
                                api_keys=list(api_keys or ()), rate_limit=rate_limit, settings=settings)


def gateway_fact(config, url, admin_socket):
    """The llmops_gateway fact (no secrets)."""
    return gateway_config.public_fact(config, url=url, admin_socket=admin_socket)


class FilterModule(object):
    """The gateway (HAProxy) in front of the serving instances of one or several hosts."""

    def filters(self):
        return {
            "gateway_config": _wrap(gateway_config_filter),
            "gateway_fact": _wrap(gateway_fact),
            "gateway_haproxy_version": _wrap(gateway_config.parse_version),
            "gateway_server_address": _wrap(gateway_config.haproxy_address),
            "gateway_bind": _wrap(gateway_config.bind_line),
        }
