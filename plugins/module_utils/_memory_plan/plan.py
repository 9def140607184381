# -*- coding: utf-8 -*-
# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
# PRIVATE to llmops.serving: it can change at any time; do not import it from other collections.
"""Memory planner for llmops.serving.memory_plan_info: what an instance will allocate, per GPU, before it
starts.

The same for every engine: one plan per instance of a host, by the engine the instance names (its
descriptor, module_utils/engines.py: the names an instance may give for it are its name and aliases). What
differs per engine is the module of :data:`PLANNERS` its descriptor's ``planner`` names, which provides

* ``ENGINE`` (the name its plans carry);
* ``check_settings(settings, name)``: the instance's settings in range (InputError);
* ``plan(model, gpus, settings, name=, **options)``: the plan on these GPUs (llmops_gpus entries);
* ``model_not_on_node(inst)``: why the instance's model cannot be read on this node yet, or None;
* ``plan_entry(inst, name, node)``: the instance's plan on this host; `node` is what plan_instances knows
  of it (gpus, basis, overhead_mib, min_headroom_mib, host_memory_mib, read_gguf, summarize_vllm).

The engines are memory_plan_llama_cpp.py (llama.cpp: the pinned build's own allocation rules, model =
gguf_info's summary) and memory_plan_vllm.py (vLLM's profiling, model = vllm_model_summary's result); what
they share is memory_plan_common.py. The public names of both stay importable from here.

Plain Python 3.6, standard library only, importable without Ansible.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible_collections.llmops.serving.plugins.module_utils import engines
from ansible_collections.llmops.serving.plugins.module_utils._memory_plan import (
    llama_cpp as memory_plan_llama_cpp,
)
from ansible_collections.llmops.serving.plugins.module_utils._memory_plan import vllm as memory_plan_vllm
from ansible_collections.llmops.serving.plugins.module_utils._memory_plan.checks import (
    InputError,
    check_gpu_entries,
    check_instance,
    check_options,
)
from ansible_collections.llmops.serving.plugins.module_utils._memory_plan.common import (  # noqa: F401  pylint: disable=unused-import
    GIB,
    MIB,
    PlanError,
    not_planned,
)
from ansible_collections.llmops.serving.plugins.module_utils._memory_plan.llama_cpp import (  # noqa: F401  pylint: disable=unused-import
    DEFAULT_MIN_HEADROOM_MIB,
    DEFAULT_OVERHEAD_MIB,
    assign_layers,
    kv_bytes_per_cell,
    llama_cpp_breakdown,
    llama_settings,
    pipeline_parallel,
    plan_llama_cpp,
    plan_llama_cpp_host,
    recurrent_bytes_per_row,
    row_bytes,
)
from ansible_collections.llmops.serving.plugins.module_utils._memory_plan.vllm import (  # noqa: F401  pylint: disable=unused-import
    DEFAULT_VLLM_OVERHEAD_MIB,
    plan_vllm,
    plan_vllm_cluster,
    vllm_kv_bytes_per_token,
    vllm_model_summary,
    vllm_summary,
)
from ansible_collections.llmops.serving.plugins.module_utils._model_format.gguf import GGUFError

# A descriptor's planner (the module's name) -> that planner.
PLANNERS = {module.__name__.rsplit(".", 1)[1]: module for module in (memory_plan_llama_cpp, memory_plan_vllm)}


def engine_planner(engine, name="instance"):
    """The planner module of `engine` (its descriptor's name or an alias, any case)."""
    engine = str(engine or engines.DEFAULT_ENGINE).lower()
    descriptor = engines.by_alias(engine)
    if descriptor is None:
        raise PlanError("instance %s: unknown engine %r (%s)" % (name, engine, " or ".join(engines.names())))
    return PLANNERS[descriptor.planner]


def settings_check(engine):
    """check_instance's check of an instance's settings: its engine's planner's check_settings (the default
    engine's for an unknown engine, which engine_planner refuses after)."""
    descriptor = engines.by_alias(str(engine or engines.DEFAULT_ENGINE)) or engines.or_default(None)
    return PLANNERS[descriptor.planner].check_settings


def plan_instance(engine, model, gpus, settings, name="instance", **options):
    """Dispatch on the engine's planner: llama.cpp's (model = gguf_info's result) or vLLM's (model =
    vllm_model_summary's result)."""
    return engine_planner(engine, name).plan(model, gpus, settings, name=name, **options)


def plan_instances(instances, gpus, overhead_mib=None, min_headroom_mib=None, basis="free",
                   summarize_vllm=vllm_model_summary, read_gguf=None, host_memory_mib=None):
    """The memory_plan_info module's work: one plan per instance. `instances`: dicts with name, engine, gpus
    (physical indexes), settings and model (gguf_info's result, or `model_path` read with read_gguf; for vLLM
    the model directory as `model_dir` or a string `model`, read with summarize_vllm). `gpus`: the
    llmops_gpus fact or its `gpus` list. A llama.cpp instance with no GPUs (none given and none on the host,
    or n_gpu_layers 0) is planned in host memory against host_memory_mib. A vLLM instance with `nodes` (and
    `ray_cluster`) runs on a Ray cluster: it is planned on every GPU of every node (plan_vllm_cluster), not on
    `gpus`. Returns (plans by name, messages, refusals)."""
    try:
        check_options(overhead_mib, min_headroom_mib, host_memory_mib)
        gpus = check_gpu_entries(gpus)  # the whole llmops_gpus fact or its list
        if instances is not None and not isinstance(instances, list):
            raise InputError("instances must be a list of instance mappings")
        names = [check_instance(inst, n, settings_check) for n, inst in enumerate(instances or [])]
    except InputError as exc:
        raise PlanError(str(exc)) from None
    node = {"gpus": gpus or [], "basis": basis, "overhead_mib": overhead_mib,
            "min_headroom_mib": min_headroom_mib, "host_memory_mib": host_memory_mib, "read_gguf": read_gguf,
            "summarize_vllm": summarize_vllm}
    plans, messages, refusals = {}, [], []
    for n, inst in enumerate(instances or []):
        name = names[n]
        engine = str(inst.get("engine") or engines.DEFAULT_ENGINE).lower()
        planner = engine_planner(engine, name)
        unknown = planner.model_not_on_node(inst)
        if unknown:
            # A check-mode first run, or a model the model role does not manage yet: nothing to plan from.
            plan = not_planned(name, engine, unknown)
        else:
            plan = _plan_entry(planner, inst, name, node)
            plan.setdefault("planned", True)
        plans[name] = plan
        messages.append(plan["message"])
        if plan.get("refusal"):
            refusals.append(plan["refusal"])
    return plans, messages, refusals


def needs_node(instances):
    """Whether planning these instances reads the node: an instance whose model is a path on the node
    (llama.cpp's model_path, vLLM's model directory) rather than its metadata (a dict). The action plugin
    memory_plan_info plans the others on the controller, with no module call."""
    return any(not isinstance(inst, dict) or not isinstance(inst.get("model"), dict)
               for inst in instances or [])


def plan_result(params, read_gguf=None):
    """The memory_plan_info task's result from its options (the module's on the node, the action plugin's on
    the controller): (result, warnings, error). `error` is the task's failure message, or None."""
    try:
        plans, messages, refusals = plan_instances(params["instances"], params["gpus"],
                                                   overhead_mib=params.get("overhead_mib"),
                                                   min_headroom_mib=params.get("min_headroom_mib"),
                                                   basis=params.get("memory_basis") or "free",
                                                   read_gguf=read_gguf,
                                                   host_memory_mib=params.get("host_memory_mib"))
    except (PlanError, GGUFError) as exc:
        return {"changed": False}, [], str(exc)
    warnings = [w for plan in plans.values() for w in plan.get("warnings") or ()]
    result = dict(changed=False, plans=plans, messages=messages, refusals=refusals)
    if refusals and params.get("fail_on_refusal", True):
        return result, warnings, " | ".join(refusals)
    return result, warnings, None


def _plan_entry(planner, inst, name, node):
    """planner.plan_entry, with an input of a shape nothing foresaw refused in one line naming the instance
    (never a traceback)."""
    try:
        return planner.plan_entry(inst, name, node)
    except PlanError:
        raise
    except InputError as exc:
        raise PlanError(str(exc)) from None
    except (TypeError, ValueError, KeyError, AttributeError, IndexError, ZeroDivisionError,
            OverflowError) as exc:
        raise PlanError("instance %s: cannot plan with the model and settings given (%s: %s); give "
                        "gguf_info's result as model (or model_path / model_dir) and the engine's settings"
                        % (name, type(exc).__name__, str(exc)[:200])) from None
