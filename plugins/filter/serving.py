# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Filters that expose the serving layer (plugins/plugin_utils/) to the serving role's tasks and templates.

A thin wrapper: the planner is plugins/plugin_utils/instance_plan.py, the engines' descriptors
plugins/module_utils/engines.py (what differs per engine, by name), the engines' flag tables (where the
command lines are built) llama_server_flags.py and vllm_flags.py, the unit's spellings systemd.py and
container.py.

    {{ serving_instances | llmops.serving.serving_instance_plans(defaults=..., builds={...}) }}
    {{ serving_instances | llmops.serving.serving_memory_plan_inputs(defaults=..., gpus=llmops_gpus, ...,
                                                                  hostvars=hostvars, groups=groups) }}
    {{ plan | llmops.serving.serving_exec_start(user='llama') }}           -> ExecStart= value
    {{ serving_instances | llmops.serving.serving_env_file('qwen', mode='host', api_keys=...) }} -> env file
    {{ settings | llmops.serving.serving_argv(engine='llama.cpp', model='/m.gguf', port=8003) }}
    {{ systemd_version | llmops.serving.serving_hardening(read_paths=[...], gpus=[2, 3], write_paths=[...]) }}
    {{ systemd_version | llmops.serving.systemd_hardening('exporter', write_paths=[...]) }}  -> any unit's
    {{ plan | llmops.serving.serving_sandboxed_gpus(serving_hardening) }}  -> GPU indexes/env inside the unit
    {{ systemd_version | llmops.serving.serving_restart_policy(restart_sec=10, restart='always') }}
    {{ query('ansible.builtin.varnames', '^llama_server_') | llmops.serving.serving_renamed_variables }}
    {{ serving_instances | llmops.serving.serving_unit_names(serving_default_engine, serving_unit_prefix) }}
    {{ _serving_instance_plans | llmops.serving.serving_engine_paths('/usr/bin/docker') }}  -> engine paths
    {{ 'systemd 219 (219)' | llmops.serving.systemd_version }}
    {{ pid1_status_and_limits | llmops.serving.serving_memlock_limit(serving_memlock_limit) }}
    {{ ray_cluster_env | llmops.serving.systemd_environment('ray_cluster_env') }}  -> ['"NAME=value"', ...]
    {{ ray_cluster_user | llmops.serving.systemd_unit_value('ray_cluster_user') }}  -> one line, % doubled
    {{ '15s' | llmops.serving.systemd_timespan('monitoring_gpu_collector_interval') }}  -> '15s' or refused
    {{ 'ray.service' | llmops.serving.systemd_verify_command }}     -> a template task's validate: command
    {{ serving_instances | llmops.serving.serving_runtime_refusals(builds={...}, gpus=llmops_gpus) }}
    {{ serving_instances | llmops.serving.serving_without_refused(refused) }}
    {{ model_models | llmops.serving.serving_models_in_use(serving_instances, refused) }}
    {{ llmops_gpus | llmops.serving.serving_driver_after_gpu_stage(nvidia_driver_version, managed) }}
    {{ vllm_version | llmops.serving.vllm_planned_runtime(vllm_cuda_variant, wheel, source_dir, runtime) }}
    {{ item.engine | llmops.serving.engine_setting('model_kind') }}  -> a field of the engine's descriptor
    {{ serving_instances | llmops.serving.engine_build_roles(serving_default_engine) }}  -> [llama_cpp, ...]
"""
from __future__ import absolute_import, division, print_function

from ansible_collections.llmops.serving.plugins.module_utils import engines
from ansible_collections.llmops.serving.plugins.plugin_utils import (
    instance_plan,
    memory_plan_inputs,
    systemd,
    vllm_flags,
)
from ansible_collections.llmops.serving.plugins.plugin_utils.rollout import deployment_fingerprint
from ansible_collections.llmops.serving.plugins.plugin_utils.serving_errors import ServingError, filter_errors

__metaclass__ = type

# Variables of the former role llama_server whose value is now keyed by engine ({llama.cpp: old value}).
PER_ENGINE_VARIABLES = ("default_settings", "unit_prefix", "binary", "mode", "image", "container_entrypoint",
                        "timeout_start_sec", "health_timeout")


_wrap = filter_errors("serving")


def serving_instance_plans_filter(instances, builds=None, **kwargs):
    """Resolve serving_instances into per-instance plans (engine, argv, env, unit, url, key/env files)."""
    return [dict(p) for p in instance_plan.plan_instances(instances, builds=builds, **kwargs)]


def serving_argv(settings, engine=engines.DEFAULT_ENGINE, **kwargs):
    return instance_plan.engine_flags(engine).build_argv(settings, **kwargs)


def serving_exec_start(plan, user=None, docker="/usr/bin/docker", entrypoint=None, home=None, memlock=None):
    """The ExecStart= command line of one planned instance (systemd quoting)."""
    return systemd.exec_start(plan, user=user, docker=docker, entrypoint=entrypoint, home=home,
                              memlock=memlock)


def serving_env_file(instances, name, mode="host", systemd_version=None, api_keys=None,
                     default_engine=engines.DEFAULT_ENGINE):
    """The assignments of instance `name`'s env file: systemd EnvironmentFile= (host) or docker --env-file
    (container) syntax; a vLLM instance's VLLM_API_KEY from `api_keys`. Secret: only for the no_log task that
    writes the 0600 file."""
    return instance_plan.instance_env_file(instances, name, mode=mode, systemd_version=systemd_version,
                                           api_keys=api_keys, default_engine=default_engine)


def serving_hardening(systemd_version, read_paths=(), mode="host", gpus=None, write_paths=()):
    return [list(item) for item in systemd.hardening(systemd_version, read_paths=read_paths, mode=mode,
                                                     gpus=gpus, write_paths=write_paths)]


def systemd_hardening(systemd_version, profile, gpus=None, read_paths=(), write_paths=()):
    """Any unit's sandboxing directives for its profile (plugin_utils/systemd.py's table)."""
    return [list(item) for item in systemd.unit_hardening(systemd_version, profile, gpus=gpus,
                                                          read_paths=read_paths, write_paths=write_paths)]


def serving_restart_policy(systemd_version, **kwargs):
    policy = systemd.restart_policy(systemd_version, **kwargs)
    return {"unit": [list(i) for i in policy["unit"]], "service": [list(i) for i in policy["service"]]}


def serving_instance_fact(plan):
    """One entry of the llmops_instances fact (no secrets: the key is passed by file path or env file)."""
    return {
        "url": plan["url"],
        "engine": plan["engine"],
        "served_model_name": plan["served_model_name"],
        "key_file": plan["key_file"],
        "api_key_env": plan["api_key_env"],
        "env_file": plan["env_file"],
        "unit": plan["unit"],
        "port": plan["port"],
        "host": plan["host"],
        "gpus": list(plan["gpus"]),
        "model": plan["model"],
        "model_path": plan["model_path"],
        "model_sha256": plan["model_sha256"],
        "mode": plan["mode"],
        "build_id": plan["build_id"],
        # What the benchmark report records beside its figures (the API key is never a setting).
        "settings": plan["settings"],
        # The inventory group of the Ray cluster a vLLM instance spans (None: this node only).
        "ray_cluster": plan.get("ray_cluster"),
        # What the instance runs, as a hash: role validate measures again when it differs from the one
        # recorded beside its last measurement.
        "fingerprint": deployment_fingerprint(plan),
    }


def engine_setting(engine, field):
    """Field `field` of engine `engine`'s descriptor (module_utils/engines.py): what a task asks of an engine
    instead of comparing its name."""
    try:
        return engines.field(instance_plan.engine_descriptor(engine).name, field)
    except ValueError as exc:
        raise ServingError(str(exc)) from None


def engine_names(instances, default_engine=None):
    """The engines `instances` (serving_instances) use, in the order they first appear; an instance without
    `engine` has the default engine. No instances: none."""
    default_engine = default_engine or engines.DEFAULT_ENGINE
    names = []
    for raw in instances or ():
        name = str(raw.get("engine") or default_engine) if isinstance(raw, dict) else None
        if name is not None and name not in names:
            names.append(name)
    return names


def engine_build_roles(instances, default_engine=None, refused=None):
    """The roles that build the engines `instances` (serving_instances) use, in the registry's order: each
    engine's descriptor build_role; the default engine's for a build-only run (no instances); none when
    `refused` (llmops_refused_instances, from preflight) leaves every instance out. An unknown engine is left
    to the planner, which refuses it with the reason."""
    default_engine = default_engine or engines.DEFAULT_ENGINE
    kept = instance_plan.without_refused(instances, refused)
    if instances and not kept:
        return []
    wanted = set(str(raw.get("engine") or default_engine) for raw in kept if isinstance(raw, dict))
    wanted = wanted or {default_engine}
    return [engine.build_role for engine in engines.ENGINES.values() if engine.name in wanted]


def serving_renamed_variables(names):
    """Variables of the former role llama_server still set by the play -> 'old -> new' lines."""
    out = []
    for old in sorted(names or ()):
        suffix = old[len("llama_server_"):] if old.startswith("llama_server_") else old
        new = "serving_%s" % suffix
        if suffix in PER_ENGINE_VARIABLES:
            new += " (now keyed by engine: {llama.cpp: <old value>})"
        elif suffix == "instances":
            new += " (each instance may set engine: llama.cpp | vllm; default serving_default_engine)"
        out.append("%s -> %s" % (old, new))
    return out


def systemd_version(text):
    return systemd.parse_systemd_version(text)


def systemd_quote(arg):
    return systemd.systemd_quote(arg)


class FilterModule(object):
    """Serving units of both engines (llama-server, vLLM): plans, command lines and systemd spellings."""

    def filters(self):
        return {
            "serving_instance_plans": _wrap(serving_instance_plans_filter),
            "serving_memory_plan_inputs": _wrap(memory_plan_inputs.memory_plan_inputs),
            "serving_argv": _wrap(serving_argv),
            "serving_exec_start": _wrap(serving_exec_start),
            "serving_env_file": _wrap(serving_env_file),
            "serving_hardening": _wrap(serving_hardening),
            "serving_restart_policy": _wrap(serving_restart_policy),
            "systemd_hardening": _wrap(systemd_hardening),
            "serving_sandboxed_gpus": _wrap(systemd.sandboxed_gpus),
            "serving_instance_fact": _wrap(serving_instance_fact),
            "serving_health_wait_args": _wrap(instance_plan.health_wait_args),
            "serving_unit_names": _wrap(instance_plan.unit_names),
            "serving_engine_paths": _wrap(instance_plan.engine_paths),
            "serving_exposed_ports": _wrap(instance_plan.exposed_ports),
            "serving_exposed_listeners": _wrap(instance_plan.exposed_listeners),
            "serving_renamed_variables": _wrap(serving_renamed_variables),
            "systemd_version": _wrap(systemd_version),
            "systemd_quote": _wrap(systemd_quote),
            "serving_memlock_limit": _wrap(systemd.memlock_limit),
            "systemd_environment": _wrap(systemd.environment),
            "systemd_unit_value": _wrap(systemd.unit_value),
            "systemd_timespan": _wrap(systemd.timespan),
            "systemd_verify_command": _wrap(systemd.verify_command),
            "serving_runtime_refusals": _wrap(instance_plan.runtime_refusals),
            "serving_without_refused": _wrap(instance_plan.without_refused),
            "serving_models_in_use": _wrap(instance_plan.models_in_use),
            "serving_refusal_report": _wrap(instance_plan.refusal_report),
            "serving_driver_after_gpu_stage": _wrap(instance_plan.driver_after_gpu_stage),
            "vllm_planned_runtime": _wrap(vllm_flags.planned_runtime),
            "engine_setting": _wrap(engine_setting),
            "engine_build_roles": _wrap(engine_build_roles),
            "engine_names": _wrap(engine_names),
        }
