# -*- coding: utf-8 -*-
# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
# PRIVATE to llmops.serving: it can change at any time; do not import it from other collections.
"""memory_plan_info's inputs checked before any arithmetic (issue 23): every number the planner uses is finite
and in the range the engine itself accepts, every structure has the shape the planner walks, and a refusal
names the instance and the setting. Without these a NaN utilisation, `tensor_parallel_size: 0`, `gpus` given
as a string or `parallel: 1e9` ended in a traceback or in a plan that "fits" what the engine refuses.

The ranges are the engines' own: llama.cpp's server takes 1 to 256 slots (``--parallel``; -1 is auto),
``-b``/``-ub`` of at least 1, ``-ts`` shares that are finite and not negative; vLLM takes a
``gpu_memory_utilization`` in (0, 1] and parallel sizes of at least 1.

Plain Python 3.6, standard library only, importable without Ansible.
"""
from __future__ import absolute_import, division, print_function

import math

from ansible_collections.llmops.serving.plugins.module_utils import engines

__metaclass__ = type

MAX_PARALLEL = 256          # llama.cpp's server: at most 256 slots
MAX_CTX = 2 ** 32 - 1       # n_ctx is a uint32_t
MAX_BATCH = 2 ** 31 - 1
MAX_RANKS = 4096            # far beyond any cluster; keeps the plan's loops bounded
MAX_MIB = 2 ** 40           # a GPU or host with more MiB than this is a typo
MAX_DRAFT = 1024

# setting -> (low, high, integer, what -1/0 mean when allowed). None: no bound on that side.
LLAMA_RANGES = {
    "ctx_size": (0, MAX_CTX, True),                 # 0: the model's trained context
    "batch_size": (1, MAX_BATCH, True),
    "ubatch_size": (1, MAX_BATCH, True),
    "spec_draft_n_max": (0, MAX_DRAFT, True),
    "main_gpu": (0, 2 ** 20, True),
}
VLLM_RANGES = {
    "tensor_parallel_size": (1, MAX_RANKS, True),
    "pipeline_parallel_size": (1, MAX_RANKS, True),
    "max_model_len": (0, MAX_CTX, True),            # 0 / unset: the model's own
    "max_num_seqs": (1, MAX_BATCH, True),
    "max_num_batched_tokens": (1, MAX_BATCH, True),
}


class InputError(ValueError):
    """A memory_plan_info input out of range or of the wrong shape (memory_plan raises it as PlanError)."""


def _brief(value):
    text = repr(value)
    return text if len(text) <= 60 else text[:60] + "..."


def number(value, what, low=None, high=None, integer=False):
    """`value` as a finite number in [low, high] (an int when `integer`); InputError naming `what`."""
    if isinstance(value, bool) or value is None or isinstance(value, (list, dict, tuple)):
        raise InputError("%s must be a number, got %s" % (what, _brief(value)))
    try:
        if isinstance(value, str):
            value = value.strip()
            number_value = int(value) if integer and value.lstrip("+-").isdigit() and len(value) < 40 \
                else float(value)
        else:
            number_value = value if isinstance(value, int) else float(value)
    except (TypeError, ValueError, OverflowError):
        raise InputError("%s must be a number, got %s" % (what, _brief(value))) from None
    if isinstance(number_value, float) and not math.isfinite(number_value):
        raise InputError("%s must be a finite number, got %s" % (what, _brief(value)))
    if integer:
        if isinstance(number_value, float) and number_value != int(number_value):
            raise InputError("%s must be a whole number, got %s" % (what, _brief(value)))
        number_value = int(number_value)
    if (low is not None and number_value < low) or (high is not None and number_value > high):
        raise InputError("%s must be from %s to %s, got %s" % (
            what, "-inf" if low is None else low, "inf" if high is None else high, _brief(value)))
    return number_value


def _set(settings, key):
    value = settings.get(key)
    return value is not None and value != ""


def check_gpu_entries(gpus, what="gpus"):
    """The llmops_gpus fact (a dict with `gpus`) or its list -> the list, each entry checked."""
    if isinstance(gpus, dict):
        gpus = gpus.get("gpus")
        what += ".gpus"
        if gpus is None:
            return []
    if gpus is None or gpus == "":
        return []
    if not isinstance(gpus, list):
        raise InputError("%s must be gpu_facts' llmops_gpus (a mapping with a gpus list) or that list, got %s"
                         % (what, _brief(gpus)))
    for n, gpu in enumerate(gpus):
        if not isinstance(gpu, dict):
            raise InputError("%s[%d] must be a mapping (index, name, memory_total_mib, memory_free_mib), "
                             "got %s" % (what, n, _brief(gpu)))
        index = gpu.get("index")
        if isinstance(index, (dict, list, float)) or index is None or isinstance(index, bool):
            raise InputError("%s[%d].index must be the GPU's index (a whole number), got %s"
                             % (what, n, _brief(index)))
        for key in ("memory_total_mib", "memory_free_mib"):
            if gpu.get(key) is not None:
                number(gpu[key], "%s[%d].%s" % (what, n, key), 0, MAX_MIB)
    return gpus


def check_llama_settings(settings, name):
    """A llama.cpp instance's settings (the keys memory_plan_info plans with)."""
    for key, (low, high, integer) in LLAMA_RANGES.items():
        if _set(settings, key):
            number(settings[key], "instance %s: setting %s" % (name, key), low, high, integer)
    if _set(settings, "parallel"):
        parallel = number(settings["parallel"], "instance %s: setting parallel" % name, -1, MAX_PARALLEL,
                          True)
        if parallel == 0:
            raise InputError("instance %s: setting parallel must be -1 (auto) or 1 to %d (llama.cpp's "
                             "limit), got 0" % (name, MAX_PARALLEL))
    ngl = settings.get("n_gpu_layers")
    if _set(settings, "n_gpu_layers") and str(ngl).strip().lower() not in ("auto", "all"):
        number(ngl, "instance %s: setting n_gpu_layers" % name, -1, 2 ** 31 - 1, True)
    split = settings.get("tensor_split")
    if split is not None and split != "" and split != []:
        shares = split.split(",") if isinstance(split, str) else split
        if not isinstance(shares, (list, tuple)):
            raise InputError("instance %s: setting tensor_split must be a list of shares, got %s"
                             % (name, _brief(split)))
        for share in shares:
            if isinstance(share, str) and not share.strip():
                continue
            number(share, "instance %s: setting tensor_split" % name, 0, 1e12)
    for key in ("cache_type_k", "cache_type_v", "flash_attn", "split_mode", "spec_type"):
        value = settings.get(key)
        if isinstance(value, (dict,)) or (isinstance(value, list) and key != "spec_type"):
            raise InputError("instance %s: setting %s must be a word, got %s" % (name, key, _brief(value)))


def check_vllm_settings(settings, name):
    for key, (low, high, integer) in VLLM_RANGES.items():
        if _set(settings, key):
            number(settings[key], "instance %s: setting %s" % (name, key), low, high, integer)
    if _set(settings, "gpu_memory_utilization"):
        util = number(settings["gpu_memory_utilization"],
                      "instance %s: setting gpu_memory_utilization" % name, 0, 1)
        if util <= 0:
            raise InputError("instance %s: setting gpu_memory_utilization must be above 0 and at most 1 "
                             "(vLLM's range), got %s" % (name, _brief(settings["gpu_memory_utilization"])))
    tp = number(settings.get("tensor_parallel_size") or 1, "tensor_parallel_size", 1, MAX_RANKS, True)
    pp = number(settings.get("pipeline_parallel_size") or 1, "pipeline_parallel_size", 1, MAX_RANKS, True)
    if tp * pp > MAX_RANKS:
        raise InputError("instance %s: tensor_parallel_size x pipeline_parallel_size is %d, above %d"
                         % (name, tp * pp, MAX_RANKS))


def check_instance(inst, n, settings_check):
    """One entry of `instances`: its shape, and its settings for its engine (settings_check(engine) is the
    engine's check, plan.settings_check). Returns its name."""
    if not isinstance(inst, dict):
        raise InputError("instances[%d] must be a mapping (name, engine, gpus, settings, model...), got %s"
                         % (n, _brief(inst)))
    raw_name = inst.get("name")
    if raw_name is not None and not isinstance(raw_name, (str, int)):
        raise InputError("instances[%d].name must be a string, got %s" % (n, _brief(raw_name)))
    name = str(raw_name or "instance%d" % n)
    engine = inst.get("engine")
    if engine is not None and not isinstance(engine, str):
        raise InputError("instance %s: engine must be %s, got %s"
                         % (name, " or ".join(engines.names()), _brief(engine)))
    settings = inst.get("settings")
    if settings is not None and not isinstance(settings, dict):
        raise InputError("instance %s: settings must be a mapping of the engine's settings, got %s"
                         % (name, _brief(settings)))
    settings = settings or {}
    for key in ("model_path", "model_dir"):
        value = inst.get(key)
        if value is not None and (not isinstance(value, str) or "\x00" in value):
            raise InputError("instance %s: %s must be a path, got %s" % (name, key, _brief(value)))
    model = inst.get("model")
    if model is not None and not isinstance(model, (dict, str)):
        raise InputError("instance %s: model must be gguf_info's result (a mapping), got %s"
                         % (name, _brief(model)))
    if isinstance(model, str) and "\x00" in model:
        raise InputError("instance %s: model must be a path without NUL bytes" % name)
    gpus = inst.get("gpus")
    if gpus is not None and gpus != []:
        for index in gpus if isinstance(gpus, list) else [gpus]:
            if isinstance(index, (dict, list, float, bool)):
                raise InputError("instance %s: gpus must be a list of GPU indexes, got %s"
                                 % (name, _brief(gpus)))
    settings_check(engine)(settings, name)
    return name


def check_options(overhead_mib=None, min_headroom_mib=None, host_memory_mib=None):
    if overhead_mib is not None:
        number(overhead_mib, "overhead_mib", 0, MAX_MIB, True)
    if min_headroom_mib is not None:
        number(min_headroom_mib, "min_headroom_mib", 0, MAX_MIB, True)
    if host_memory_mib is not None:
        number(host_memory_mib, "host_memory_mib", 1, MAX_MIB, True)


def check_model_numbers(model, name):
    """The numbers of a model summary that size loops and allocations (gguf_info's or vllm_model_summary's
    result, possibly given by hand): whole and in range."""
    if not isinstance(model, dict):
        return
    for key in ("block_count", "context_length", "embedding_length", "feed_forward_length", "head_count",
                "head_count_kv", "vocab_size", "nextn_predict_layers", "num_hidden_layers", "hidden_size",
                "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim",
                "max_position_embeddings", "full_attention_layers", "mtp_layers"):
        value = model.get(key)
        if value is None or isinstance(value, list):
            continue
        number(value, "instance %s: the model's %s" % (name, key), 0, 2 ** 40, True)
    if model.get("block_count") is not None and not isinstance(model.get("block_count"), list) \
            and int(model["block_count"]) > 65536:
        raise InputError("instance %s: the model's block_count %s is above 65536 (not a real model)"
                         % (name, model["block_count"]))
