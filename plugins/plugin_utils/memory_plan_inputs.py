# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""What the memory_plan_info module (the memory planner) is given for a host's instances.

serving_instances + serving_default_settings + what is known of each model + llmops_gpus -> the module's
`instances` and `gpus`. Used twice: in preflight, before anything is downloaded (a model's metadata is the
header gguf_info read from the hub, or a vLLM snapshot's config.json and safetensors headers that
safetensors_info read from it: llmops_model_headers), and in the serve stage, before anything restarts (the
downloaded file's metadata: llmops_models[name].gguf, or the snapshot directory llmops_models[name].dir).

A GPU held by an instance that runs now counts as free: the instance owns its GPUs exclusively (the instance
planner refuses sharing) and its restart frees what it holds, so the plan of a running node is the plan of
the node after the restart, not a refusal caused by the server it replaces.

A vLLM instance with `ray_cluster` (see instance_plan.ray_settings) spans the nodes of that inventory group:
its item carries `ray_cluster` and `nodes` ([{host, gpus: the llmops_gpus entries Ray uses there (null while
that node's llmops_gpus is unknown), num_gpus}], the head first), read from Ansible's `hostvars`/`groups`; the
module plans every GPU of every node, and reports a node whose GPUs are unknown as not planned.

Controller-only, unit-tested by tests/unit/plugins/plugin_utils/test_memory_plan_inputs.py; reached through
the filter llmops.serving.serving_memory_plan_inputs.
"""
from __future__ import absolute_import, division, print_function

import copy

from ansible_collections.llmops.serving.plugins.module_utils import engines
from ansible_collections.llmops.serving.plugins.plugin_utils import instance_plan
from ansible_collections.llmops.serving.plugins.plugin_utils.flag_table import without_none
from ansible_collections.llmops.serving.plugins.plugin_utils.gpu_assignment import gpu_entries, normalize_gpus
from ansible_collections.llmops.serving.plugins.plugin_utils.serving_errors import ServingError

__metaclass__ = type


def _model_input(raw, engine, models, headers):
    """The planner's view of the instance's model: a metadata dict, or a path the module reads on the node."""
    model = raw.get("model")
    entry = (models or {}).get(model) or {}
    if instance_plan.engine_descriptor(engine).model_kind == "snapshot":
        if entry.get("dir") or entry.get("path"):
            return {"model_dir": entry.get("dir") or entry.get("path")}
        # a model_models snapshot not downloaded yet: config.json and shard sizes read from the hub
        # (safetensors_info, roles/model/tasks/headers.yml; its result names the summary for vLLM's planner)
        remote = ((headers or {}).get(model) or {}).get("vllm")
        if remote:
            return {"model": remote}
        return {"model_dir": model} if str(model).startswith("/") else None
    gguf = entry.get("gguf") or (headers or {}).get(model) or {}
    if gguf.get("layer_bytes"):
        return {"model": gguf}
    if entry.get("path"):
        return {"model_path": entry["path"]}
    return {"model_path": model} if str(model).startswith("/") else None


def _ray_nodes(raw, name, gpu_list, hostvars, groups, inventory_hostname, is_running):
    """The module's `nodes` of a Ray instance (copies: a running instance's GPUs count free on every node),
    or None when the caller passed no hostvars/groups."""
    nodes = instance_plan.ray_cluster_nodes(raw["ray_cluster"], hostvars, groups, head=inventory_hostname,
                                            head_gpus=gpu_list, name=name)
    if nodes is None:
        return None
    out = []
    for node in nodes:
        entries = copy.deepcopy(node["gpus"])
        if is_running and entries:
            for entry in entries:
                entry["memory_free_mib"] = entry.get("memory_total_mib")
        out.append({"host": node["host"], "gpus": entries, "num_gpus": node["num_gpus"]})
    return out


def memory_plan_inputs(instances, defaults=None, default_engine=engines.DEFAULT_ENGINE, models=None,
                       headers=None, gpus=None, running_units=(), unit_prefix=None, hostvars=None,
                       groups=None, inventory_hostname=None):
    """-> {"instances": [...], "gpus": llmops_gpus with running instances' GPUs counted free,
    "skipped": ["<instance>: why it cannot be planned yet", ...]}. `hostvars`, `groups` and
    `inventory_hostname` (the head) are Ansible's, for instances with ray_cluster."""
    facts = copy.deepcopy(gpus) if gpus else {"present": False, "gpus": []}
    running = set(running_units or ())
    planned = []
    skipped = []
    for raw in instances or []:
        if not isinstance(raw, dict) or not raw.get("name"):
            raise ServingError("each instance needs a name: %r" % (raw,))
        name = str(raw["name"])
        engine = raw.get("engine") or default_engine
        instance_plan.engine_descriptor(engine)  # an unknown engine is refused here as in the serve stage
        settings = without_none(instance_plan.ray_settings(
            raw, instance_plan.instance_settings(raw, defaults, engine), engine, name))
        gpu_list = normalize_gpus(raw.get("gpus"), facts if facts.get("present") else None,
                                  "instance %s" % name)
        model = _model_input(raw, engine, models, headers)
        if gpu_list and not facts.get("present"):
            skipped.append("%s: GPUs %s are not visible yet (no working driver); planned again in the serve "
                           "stage" % (name, ", ".join(str(g) for g in gpu_list)))
            continue
        if model is None:
            skipped.append("%s: model %s is not known yet (no header read, not downloaded)"
                           % (name, raw.get("model")))
            continue
        entries = gpu_entries(gpu_list, facts)
        is_running = instance_plan.unit_name(name, engine, unit_prefix) in running
        cluster = {}
        if raw.get("ray_cluster"):
            nodes = _ray_nodes(raw, name, gpu_list, hostvars, groups, inventory_hostname, is_running)
            if nodes is None:
                skipped.append("%s: ray_cluster %s: the cluster's nodes are not known here (hostvars/groups "
                               "not given to serving_memory_plan_inputs)" % (name, raw["ray_cluster"]))
                continue
            cluster = {"ray_cluster": raw["ray_cluster"], "nodes": nodes}
        if is_running:
            for entry in entries:
                entry["memory_free_mib"] = entry.get("memory_total_mib")
        item = {"name": name, "engine": engine, "gpus": [e.get("index") for e in entries] or gpu_list,
                "settings": settings, "running": is_running}
        item.update(model)
        item.update(cluster)
        planned.append(item)
    return {"instances": planned, "gpus": facts, "skipped": skipped}
