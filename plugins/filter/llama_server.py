# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Filters that expose llama-server's flag table (plugins/module_utils/llama_server_args.py) to templates.

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
from ansible_collections.llmops.serving.plugins.module_utils import llama_server_args as lsa

__metaclass__ = type


def _wrap(func):
    def wrapper(*args, **kwargs):
        try:
            return func(*args, **kwargs)
        except lsa.LlamaServerArgsError as exc:
            raise AnsibleFilterError("llama_server: %s" % exc) from None
    wrapper.__name__ = func.__name__
    wrapper.__doc__ = func.__doc__
    return wrapper


def llama_server_plan(instances, **kwargs):
    """Resolve llama_server_instances into per-instance plans (argv, env, unit, url, key file)."""
    return [dict(p) for p in lsa.plan_instances(instances, **kwargs)]


def llama_server_argv(settings, **kwargs):
    return lsa.build_argv(settings, **kwargs)


def llama_server_exec_start(plan, user=None, docker="/usr/bin/docker", entrypoint=None):
    """The ExecStart= command line of one planned instance (systemd quoting)."""
    if plan["mode"] == "container":
        return lsa.systemd_command(lsa.docker_run_args(plan, user=user, docker=docker, entrypoint=entrypoint))
    return lsa.systemd_command([plan["binary"]] + list(plan["argv"]))


def llama_server_env_file(instances, name, mode="host", systemd_version=None):
    """The assignments of instance `name`'s env file: systemd EnvironmentFile= (host) or docker --env-file
    (container) syntax. Secret: only for the no_log task that writes the 0600 file."""
    return lsa.instance_env_file(instances, name, mode=mode, systemd_version=systemd_version)


def llama_server_hardening(systemd_version, read_paths=(), mode="host"):
    return [list(item) for item in lsa.hardening(systemd_version, read_paths=read_paths, mode=mode)]


def llama_server_restart_policy(systemd_version, **kwargs):
    policy = lsa.restart_policy(systemd_version, **kwargs)
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
    return lsa.parse_systemd_version(text)


def systemd_quote(arg):
    return lsa.systemd_quote(arg)


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
