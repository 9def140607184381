# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Filters that expose the serving layer (plugins/plugin_utils/) to the llama_server role's tasks and
templates.

A thin wrapper: the planner is plugins/plugin_utils/serving_plan.py, llama-server's flag table (where the
command line is built) plugins/plugin_utils/llama_server_flags.py, the unit's spellings
plugins/plugin_utils/systemd.py and container.py.

    {{ llama_server_instances | llmops.serving.llama_server_plan(defaults=..., llama_cpp=llmops_llama_cpp) }}
    {{ plan | llmops.serving.llama_server_exec_start(user='llama') }}          -> ExecStart= value
    {{ llama_server_instances | llmops.serving.llama_server_env_file('qwen', mode='host') }} -> env file lines
    {{ settings | llmops.serving.llama_server_argv(model='/m.gguf', port=8003) }}
    {{ systemd_version | llmops.serving.llama_server_hardening(read_paths=[...]) }}
    {{ systemd_version | llmops.serving.llama_server_restart_policy(restart_sec=10) }}
    {{ 'systemd 219 (219)' | llmops.serving.systemd_version }}
"""
from __future__ import absolute_import, division, print_function

from ansible.errors import AnsibleFilterError
from ansible_collections.llmops.serving.plugins.plugin_utils import llama_server_flags, serving_plan, systemd
from ansible_collections.llmops.serving.plugins.plugin_utils.serving_errors import ServingError

__metaclass__ = type


def _wrap(func):
    def wrapper(*args, **kwargs):
        try:
            return func(*args, **kwargs)
        except ServingError as exc:
            raise AnsibleFilterError("llama_server: %s" % exc) from None
    wrapper.__name__ = func.__name__
    wrapper.__doc__ = func.__doc__
    return wrapper


def llama_server_plan(instances, llama_cpp=None, **kwargs):
    """Resolve llama_server_instances into per-instance plans (argv, env, unit, url, key file)."""
    plans = serving_plan.plan_instances(instances, build=llama_cpp, engine="llama.cpp", **kwargs)
    return [dict(p) for p in plans]


def llama_server_argv(settings, **kwargs):
    return llama_server_flags.build_argv(settings, **kwargs)


def llama_server_exec_start(plan, user=None, docker="/usr/bin/docker", entrypoint=None):
    """The ExecStart= command line of one planned instance (systemd quoting)."""
    return systemd.exec_start(plan, user=user, docker=docker, entrypoint=entrypoint)


def llama_server_env_file(instances, name, mode="host", systemd_version=None):
    """The assignments of instance `name`'s env file: systemd EnvironmentFile= (host) or docker --env-file
    (container) syntax. Secret: only for the no_log task that writes the 0600 file."""
    return serving_plan.instance_env_file(instances, name, mode=mode, systemd_version=systemd_version,
                                          engine="llama.cpp")


def llama_server_hardening(systemd_version, read_paths=(), mode="host"):
    return [list(item) for item in systemd.hardening(systemd_version, read_paths=read_paths, mode=mode)]


def llama_server_restart_policy(systemd_version, **kwargs):
    policy = systemd.restart_policy(systemd_version, **kwargs)
    return {"unit": [list(i) for i in policy["unit"]], "service": [list(i) for i in policy["service"]]}


def llama_server_instance_fact(plan):
    """One entry of the llmops_instances fact (no secrets: the key is passed by file path)."""
    return {
        "url": plan["url"],
        "key_file": plan["key_file"],
        "engine": "llama-server",
        "unit": plan["unit"],
        "port": plan["port"],
        "host": plan["host"],
        "gpus": list(plan["gpus"]),
        "model": plan["model"],
        "model_path": plan["model_path"],
        "mode": plan["mode"],
    }


def systemd_version(text):
    return systemd.parse_systemd_version(text)


def systemd_quote(arg):
    return systemd.systemd_quote(arg)


class FilterModule(object):
    """llama-server command lines and systemd units."""

    def filters(self):
        return {
            "llama_server_plan": _wrap(llama_server_plan),
            "llama_server_argv": _wrap(llama_server_argv),
            "llama_server_exec_start": _wrap(llama_server_exec_start),
            "llama_server_env_file": _wrap(llama_server_env_file),
            "llama_server_hardening": _wrap(llama_server_hardening),
            "llama_server_restart_policy": _wrap(llama_server_restart_policy),
            "llama_server_instance_fact": _wrap(llama_server_instance_fact),
            "systemd_version": _wrap(systemd_version),
            "systemd_quote": _wrap(systemd_quote),
        }
