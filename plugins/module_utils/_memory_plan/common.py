# -*- coding: utf-8 -*-
# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
# PRIVATE to llmops.serving: it can change at any time; do not import it from other collections.
"""What the memory planner's engines share: units, the error, how a setting and a GPU's budget are read, and
the entry of an instance that is not planned.

Plain Python 3.6, standard library only, importable without Ansible. The planner is memory_plan.py (the
registry and the per-host dispatch); the engines are memory_plan_llama_cpp.py and memory_plan_vllm.py.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

MIB = 1024 * 1024
GIB = 1024 * MIB


class PlanError(Exception):
    """Input the planner cannot plan for; the message says what is wrong."""


def bool_setting(value):
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes", "on")
    return bool(value)


def int_setting(settings, key, default):
    value = settings.get(key)
    if value is None or value == "":
        return default
    try:
        return int(value)
    except (TypeError, ValueError):
        raise PlanError("setting %s must be an integer, got %r" % (key, value)) from None


def gpu_budget_mib(gpu, basis):
    """The MiB a plan may use on one llmops_gpus entry: its free memory, or its total with basis 'total'."""
    free = gpu.get("memory_free_mib")
    if basis == "total" or free is None:
        free = gpu.get("memory_total_mib")
    if free is None:
        raise PlanError("GPU %s has no memory_total_mib/memory_free_mib (give the llmops_gpus entries)"
                        % gpu.get("index"))
    return int(free)


def mib_text(value):
    """Bytes as '1,234 MiB' (rounded up)."""
    return "{:,} MiB".format(int((value + MIB - 1) // MIB))


def not_planned(name, engine, why):
    """The plan entry of an instance that cannot be planned yet (`why`: what is missing)."""
    return {"name": name, "engine": engine, "fits": None, "planned": False, "refusal": None,
            "message": "%s: not planned: %s" % (name, why)}


def plan_options(node, **extra):
    """The options of an engine's plan function: `extra` plus the overhead and headroom the caller set
    (None: the engine's own defaults)."""
    options = dict(extra)
    for key in ("overhead_mib", "min_headroom_mib"):
        if node.get(key) is not None:
            options[key] = node[key]
    return options


def instance_gpu_indexes(inst, gpus):
    """The instance's `gpus` (physical indexes), every GPU of the host when it names none."""
    indexes = inst.get("gpus")
    if indexes is None or indexes == []:
        indexes = [g.get("index") for g in (gpus or [])]
    return indexes


def chosen_gpus(name, indexes, gpus):
    """(the llmops_gpus entries of `indexes`, the host's other entries); refuses an index the host lacks."""
    by_index = dict((str(g.get("index")), g) for g in (gpus or []))
    if not isinstance(indexes, list):
        indexes = [indexes]
    missing = [str(i) for i in indexes if str(i) not in by_index]
    if missing:
        raise PlanError("instance %s uses GPU(s) %s that llmops_gpus does not list (it has %s)"
                        % (name, ", ".join(missing), ", ".join(sorted(by_index)) or "none"))
    chosen = [by_index[str(i)] for i in indexes]
    return chosen, [g for g in (gpus or []) if g not in chosen]
