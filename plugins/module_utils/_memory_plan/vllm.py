# -*- coding: utf-8 -*-
# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
# PRIVATE to llmops.serving: it can change at any time; do not import it from other collections.
"""The memory planner's vLLM engine, and its reader of an HF model directory.

The model is vllm_model_summary(model_dir) (HF config.json + safetensors sizes); the rules are vLLM's
profiling: weights + activation peak + KV blocks under gpu_memory_utilization, on one node or on a Ray
cluster.

The planner engines.VLLM names (plan.PLANNERS). Plain Python 3.6, standard library only, importable without
Ansible.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import os

from ansible_collections.llmops.serving.plugins.module_utils import engines
from ansible_collections.llmops.serving.plugins.module_utils._files.local_read import LocalReadError
from ansible_collections.llmops.serving.plugins.module_utils._memory_plan.checks import (
    MAX_CTX,
    InputError,
    check_model_numbers,
    check_vllm_settings,
    number,
)
from ansible_collections.llmops.serving.plugins.module_utils._memory_plan.common import (
    MIB,
    PlanError,
    chosen_gpus,
    gpu_budget_mib,
    instance_gpu_indexes,
    int_setting,
    mib_text,
    not_planned,
    plan_options,
)
from ansible_collections.llmops.serving.plugins.module_utils._model_format import safetensors
from ansible_collections.llmops.serving.plugins.module_utils._model_format.gguf import DEFAULT_LIMITS

ENGINE = engines.VLLM.name
# The instance's settings in range (plan.settings_check).
check_settings = check_vllm_settings

# vLLM: CUDA context + PyTorch/NCCL per rank outside its KV pool (seed 003: ~1,700 MiB per card with TP 2).
DEFAULT_VLLM_OVERHEAD_MIB = 1700
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "half": 2, "float": 4}
# vLLM's default --gpu-memory-utilization: the planner's budget and the flag table's free-memory check
# (plugin_utils/vllm_preflight.py) when the setting is unset.
DEFAULT_GPU_MEMORY_UTILIZATION = 0.9
VLLM_DEFAULT_MAX_NUM_SEQS = 256
VLLM_DEFAULT_BATCHED_TOKENS = 8192
ATTENTION_LAYER_TYPES = ("full_attention", "attention", "sliding_attention")
# Online quantization of a 16-bit checkpoint (quantization: fp8 / int8 ... with no quantization_config in
# the checkpoint): the linear weights go to one byte per parameter, norms and embeddings stay 16-bit.
ONLINE_8BIT = ("fp8", "int8", "fbgemm_fp8", "experts_int8", "ptpc_fp8")
# The counts of config.json the summary reads or sizes a list by, and the most each may be: per-layer
# structures are bounded like a GGUF's blocks (gguf's max_block_count, 4096; llama.cpp loads at most 512),
# the others far above any real model (hidden 16,384 and 53,248 intermediate for Llama 3.1 405B, 262,144
# tokens of vocabulary for Gemma 3, 512 experts for Qwen3-Next, 10M positions for Llama 4 Scout).
MAX_LAYERS = DEFAULT_LIMITS["max_block_count"]
CONFIG_RANGES = {
    "num_hidden_layers": MAX_LAYERS, "mtp_num_hidden_layers": MAX_LAYERS,
    "num_nextn_predict_layers": MAX_LAYERS, "full_attention_interval": MAX_LAYERS,
    "num_attention_heads": 1 << 16, "num_key_value_heads": 1 << 16, "head_dim": 1 << 16,
    "hidden_size": 1 << 20, "intermediate_size": 1 << 22, "moe_intermediate_size": 1 << 22,
    "vocab_size": 1 << 24, "max_position_embeddings": MAX_CTX,
    "num_experts": 1 << 14, "num_local_experts": 1 << 14, "n_routed_experts": 1 << 14,
    "num_experts_per_tok": 1 << 14, "n_shared_experts": 1 << 14,
}


def vllm_model_summary(model_dir):
    """What the vLLM planner needs from an HF model directory: config.json (the text_config of a
    multimodal Qwen3.5/3.6 config wins) and the bytes of the *.safetensors files vLLM loads (those the shard
    index names when there is one: safetensors.select_weights). Both files are read with local_read's
    bounds: a FIFO, a link or a device there is refused, not waited on."""
    path = os.path.join(model_dir, "config.json")
    try:
        config, files, note = safetensors.local_model(model_dir)
        weights = sum(os.stat(os.path.join(model_dir, name)).st_size for name in files)
    except safetensors.SafetensorsError as exc:
        raise PlanError(str(exc)) from None
    except LocalReadError as exc:
        raise PlanError(str(exc)) from None
    except OSError as exc:
        raise PlanError("cannot read %s: %s" % (model_dir, exc)) from None
    return vllm_summary(config, weights, model_dir, path, note)


def _config_number(cfg, key, where):
    """A count of config.json, whole and within CONFIG_RANGES (0 when absent)."""
    value = cfg.get(key)
    if value is None or value == "" or value is False:
        return 0
    try:
        return number(value, "%s: %s" % (where, key), 0, CONFIG_RANGES[key], True)
    except InputError as exc:
        raise PlanError("%s (not a real model's config: fix or re-download config.json)" % exc) from None


def vllm_summary(config, weights, model_dir, where="config.json", weights_note=None):
    """vllm_model_summary() from what it reads: the parsed config.json and the bytes of the *.safetensors
    files (safetensors_info gives them from the hub's listing and headers before anything is downloaded).
    Every count is checked against CONFIG_RANGES before anything is sized by it (issue 34: 30,000,000
    layers built a 540 MB list). ``weights_note``: which files were counted (safetensors.select_weights)."""
    if not isinstance(config, dict):
        raise PlanError("%s is not a JSON object" % where)
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}
    cfg = dict(config)
    cfg.update(text)
    n = dict((key, _config_number(cfg, key, where)) for key in CONFIG_RANGES)
    layers = n["num_hidden_layers"]
    heads = n["num_attention_heads"]
    hidden = n["hidden_size"]
    kinds = cfg.get("layer_types")
    if not isinstance(kinds, list) or len(kinds) != layers or not all(isinstance(k, str) for k in kinds):
        interval = n["full_attention_interval"]
        if interval:
            kinds = ["full_attention" if (i + 1) % interval == 0 else "linear_attention"
                     for i in range(layers)]
        else:
            kinds = ["full_attention"] * layers
    summary = {
        "model_dir": model_dir,
        "architectures": cfg.get("architectures") or config.get("architectures"),
        "model_type": cfg.get("model_type"),
        "num_hidden_layers": layers, "hidden_size": hidden,
        "intermediate_size": n["intermediate_size"],
        "num_attention_heads": heads,
        "num_key_value_heads": n["num_key_value_heads"] or heads,
        "head_dim": n["head_dim"] or (hidden // heads if heads else 0),
        "layer_types": kinds,
        "full_attention_layers": sum(1 for k in kinds if k in ATTENTION_LAYER_TYPES),
        "linear_attention_layers": sum(1 for k in kinds if k == "linear_attention"),
        "linear": dict((k[len("linear_"):], cfg[k]) for k in cfg if k.startswith("linear_")),
        "mtp_layers": n["mtp_num_hidden_layers"] or n["num_nextn_predict_layers"],
        "vocab_size": n["vocab_size"],
        "max_position_embeddings": n["max_position_embeddings"],
        "dtype": str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16"),
        "quantization_config": config.get("quantization_config") or cfg.get("quantization_config"),
        "weights_bytes": weights,
    }
    summary.update(weights_note or {})
    return summary


def _spec_tokens(settings):
    spec = settings.get("speculative_config")
    if isinstance(spec, str):
        try:
            spec = json.loads(spec)
        except ValueError:
            spec = None
    if isinstance(spec, dict):
        return str(spec.get("method") or ""), int(spec.get("num_speculative_tokens") or 0)
    return "", 0


def vllm_kv_bytes_per_token(model, settings, tp):
    """Per TP rank: K and V of every full-attention layer (and the MTP layers when the speculative method
    is mtp), the KV heads split across the ranks (replicated when fewer than the ranks)."""
    dtype = str(settings.get("kv_cache_dtype") or "auto").lower()
    size = 1 if dtype.startswith("fp8") else DTYPE_BYTES.get(model.get("dtype"), 2)
    layers = int(model.get("full_attention_layers") or 0)
    method, _n = _spec_tokens(settings)
    if "mtp" in method:
        layers += int(model.get("mtp_layers") or 0)
    heads_per_rank = max(1, int(model.get("num_key_value_heads") or 0) // tp)
    return layers * heads_per_rank * int(model.get("head_dim") or 0) * 2 * size


def _vllm_weights(model, settings):
    weights = int(model.get("weights_bytes") or 0)
    quant = str(settings.get("quantization") or "").lower()
    if quant in ONLINE_8BIT and not model.get("quantization_config") \
            and DTYPE_BYTES.get(model.get("dtype"), 2) == 2:
        embed = int(model.get("vocab_size") or 0) * int(model.get("hidden_size") or 0) * 2 * 2
        weights = embed + (weights - embed) // 2
    return weights


def _vllm_activation(model, settings, tp):
    """vLLM's profiling peak beside the weights (the dummy forward at max_num_batched_tokens and the sampler
    over max_num_seqs rows): hidden states and the MLP's gate/up halves per token in 16-bit, kept twice, and
    F32 logits. Calibrated on seed 001 (27B, one L20): KV pool within 0.5 % of the logged 20.78 GiB."""
    tokens = int_setting(settings, "max_num_batched_tokens", VLLM_DEFAULT_BATCHED_TOKENS)
    seqs = int_setting(settings, "max_num_seqs", VLLM_DEFAULT_MAX_NUM_SEQS)
    hidden = int(model.get("hidden_size") or 0)
    ffn = int(model.get("intermediate_size") or 0) // tp
    return tokens * (2 * hidden + 2 * ffn) * 2 * 2 + int(model.get("vocab_size") or 0) * min(seqs, tokens) * 4


def _vllm_row(gpu, weights, activation, util, overhead_mib, basis, host=None):
    """One GPU of a vLLM plan: the budget gpu_memory_utilization gives it and the KV pool that leaves."""
    total_mib = int(gpu.get("memory_total_mib") or 0)
    budget = int(total_mib * util * MIB)
    row = {"index": gpu.get("index"), "name": gpu.get("name"), "memory_total_mib": total_mib,
           "memory_free_mib": gpu.get("memory_free_mib"), "weights": weights, "activation": activation,
           "kv": max(budget - weights - activation, 0), "overhead": int(overhead_mib) * MIB, "total": budget,
           "headroom_mib": gpu_budget_mib(gpu, basis) - int((budget + MIB - 1) // MIB)}
    if host is not None:
        row = dict([("host", host)] + list(row.items()))
    return row


def _vllm_gpu_label(row):
    if row.get("host") is None:
        return "GPU %s" % row["index"]
    return "host %s GPU %s" % (row["host"], row["index"])


def _vllm_problems(rows, weights, activation, util, min_headroom_mib):
    """What vLLM refuses at start, per GPU (each named, with its host on a Ray cluster)."""
    problems = []
    for r in rows:
        if weights + activation + r["overhead"] > r["total"]:
            problems.append("%s: weights per rank %s + activations %s + CUDA/PyTorch %s exceed "
                            "gpu_memory_utilization %.2f x %s" % (
                                _vllm_gpu_label(r), mib_text(weights), mib_text(activation),
                                mib_text(r["overhead"]), util, "{:,} MiB".format(r["memory_total_mib"])))
        elif r["headroom_mib"] < int(min_headroom_mib):
            problems.append("%s has %s free, gpu_memory_utilization %.2f needs %s: short by %s" % (
                _vllm_gpu_label(r), "{:,} MiB".format(r["headroom_mib"] + int((r["total"] + MIB - 1) // MIB)),
                util, mib_text(r["total"]), "{:,} MiB".format(int(min_headroom_mib) - r["headroom_mib"])))
    return problems


def _vllm_pool_verdict(problems, suggestions, settings, kv_tokens, max_len, per_token):
    """The KV pool must hold one max_model_len sequence (vLLM's own check); fills fits/refusal."""
    if not problems and max_len and kv_tokens < max_len:
        problems.append("the KV pool holds %d tokens, less than max_model_len %d: short by %s"
                        % (kv_tokens, max_len, mib_text((max_len - kv_tokens) * per_token)))
        if kv_tokens:
            suggestions.append({"settings": {"max_model_len": kv_tokens // 256 * 256},
                                "text": "max_model_len %d" % (kv_tokens // 256 * 256)})
        if not str(settings.get("kv_cache_dtype") or "auto").startswith("fp8"):
            suggestions.append({"settings": {"kv_cache_dtype": "fp8"}, "text": "kv_cache_dtype fp8"})


def _vllm_finish(plan, name, problems, suggestions, otherwise=""):
    """fits, suggestions and the refusal (`otherwise`: what to say when nothing is suggested)."""
    plan["fits"] = not problems
    plan["suggestions"] = suggestions
    plan["refusal"] = None if not problems else "instance %s does not fit: %s%s" % (
        name, "; ".join(problems),
        (". Would fit: " + "; or ".join(x["text"] for x in suggestions)) if suggestions else otherwise)
    return plan


def plan_vllm(model, gpus, settings, name="instance", overhead_mib=DEFAULT_VLLM_OVERHEAD_MIB,
              min_headroom_mib=0, other_gpus=None, basis="free"):
    """Plan a vLLM instance: weights per TP rank, the KV pool gpu_memory_utilization leaves, the tokens it
    holds and the concurrency at max_model_len. vLLM refuses to start when a GPU has less free memory than
    gpu_memory_utilization x total, and when the pool cannot hold one max_model_len sequence."""
    settings = dict(settings or {})
    tp = int_setting(settings, "tensor_parallel_size", 1) * int_setting(settings, "pipeline_parallel_size", 1)
    if len(gpus) < tp:
        raise PlanError("instance %s: tensor_parallel_size %d needs %d GPUs, the instance has %d"
                        % (name, tp, tp, len(gpus)))
    gpus = gpus[:tp]
    util, max_len = _vllm_utilization_and_length(model, settings)
    weights = _vllm_weights(model, settings) // tp
    activation = _vllm_activation(model, settings, tp)
    per_token = vllm_kv_bytes_per_token(model, settings, tp)
    rows = [_vllm_row(gpu, weights, activation, util, overhead_mib, basis) for gpu in gpus]
    plan = _vllm_pool_plan(name, rows, util, weights, per_token, max_len, tensor_parallel_size=tp)
    kv_tokens = plan["kv_tokens"]
    suggestions = []
    problems = _vllm_problems(rows, weights, activation, util, min_headroom_mib)
    _vllm_pool_verdict(problems, suggestions, settings, kv_tokens, max_len, per_token)
    if problems and not any("max_model_len" in p for p in problems) and len(other_gpus or []) >= tp:
        suggestions.append({"settings": {"tensor_parallel_size": tp * 2},
                            "text": "tensor_parallel_size %d (on %d more GPUs)" % (tp * 2, tp)})
    _vllm_finish(plan, name, problems, suggestions)
    plan["message"] = "%s: TP %d, weights %s per rank, KV pool %s = %d tokens (%s x max_model_len %d)" % (
        name, tp, mib_text(weights), mib_text(min(r["kv"] for r in rows)), kv_tokens, plan["max_concurrency"],
        max_len)
    return plan


def _vllm_utilization_and_length(model, settings):
    """gpu_memory_utilization (vLLM's default when unset) and max_model_len (the model's own when unset)."""
    util = float(settings.get("gpu_memory_utilization") or DEFAULT_GPU_MEMORY_UTILIZATION)
    return util, int_setting(settings, "max_model_len", int(model.get("max_position_embeddings") or 0))


def _vllm_pool_plan(name, rows, util, weights, per_token, max_len, **layout):
    """The fields every vLLM plan has, from its per-GPU rows: the KV pool is the smallest GPU's (every rank
    holds the same share of each sequence), in tokens and in max_model_len sequences. `layout`: the
    parallel sizes (and the Ray cluster and its nodes)."""
    kv_tokens = min(r["kv"] for r in rows) // per_token if per_token else 0
    plan = {"name": name, "engine": ENGINE}
    plan.update(layout)
    plan.update({
        "gpu_memory_utilization": util, "weights_per_rank": weights, "kv_bytes_per_token": per_token,
        "kv_tokens": kv_tokens, "max_model_len": max_len,
        "max_concurrency": round(float(kv_tokens) / max_len, 2) if max_len else None,
        "gpus": rows, "total_bytes": sum(r["total"] for r in rows),
        # the largest max_model_len the pool holds one sequence of (vLLM's own check)
        "max_ctx_size": kv_tokens, "max_parallel": kv_tokens // max_len if max_len else None,
    })
    return plan


def _node_gpus(node, name):
    """The GPUs Ray uses on one node: its `gpus` entries, the first `num_gpus` of them when given."""
    gpus = list(node.get("gpus") or [])
    num = node.get("num_gpus")
    if num is not None and num != "":
        num = int(num)
        if num > len(gpus):
            raise PlanError("instance %s: node %s declares %d GPU(s) to Ray but its gpus list has %d"
                            % (name, node.get("host"), num, len(gpus)))
        gpus = gpus[:num]
    return gpus


def plan_vllm_cluster(model, nodes, settings, name="instance", overhead_mib=DEFAULT_VLLM_OVERHEAD_MIB,
                      min_headroom_mib=0, basis="free", ray_cluster=None):
    """Plan a vLLM instance on a Ray cluster: `nodes` are [{host, gpus: llmops_gpus entries Ray uses there,
    num_gpus (optional: what the node declares to Ray, the first that many of gpus)}], the head first. Every
    GPU of every node runs one rank of TP x PP.

    Approximation: vLLM gives each pipeline stage a contiguous share of the layers (layers / PP, the
    remainder spread over the first stages) and splits each layer's weights across the stage's TP ranks, so a
    rank holds about weights / (TP x PP); the embedding and the output head sit on the first and last stage
    only, which this even split does not show (small next to the layers of a model that needs a cluster).
    A rank's KV cache holds its stage's attention layers (/ PP) with the KV heads split across TP; the
    activation peak is that of one TP rank (a stage's forward holds one layer at a time)."""
    settings = dict(settings or {})
    tp = int_setting(settings, "tensor_parallel_size", 1)
    pp = int_setting(settings, "pipeline_parallel_size", 1)
    ranks = tp * pp
    per_node = [(node.get("host"), _node_gpus(node, name)) for node in nodes or []]
    count = sum(len(g) for _h, g in per_node)
    if not per_node or count != ranks:
        raise PlanError("instance %s: tensor_parallel_size %d x pipeline_parallel_size %d = %d ranks, but "
                        "the nodes of ray_cluster %s give %d GPU(s) (%s): they must be equal (one rank per "
                        "GPU)"
                        % (name, tp, pp, ranks, ray_cluster, count,
                           ", ".join("%s %d" % (h, len(g)) for h, g in per_node) or "no nodes"))
    util, max_len = _vllm_utilization_and_length(model, settings)
    weights = _vllm_weights(model, settings) // ranks
    activation = _vllm_activation(model, settings, tp)
    per_token = (vllm_kv_bytes_per_token(model, settings, tp) + pp - 1) // pp
    rows = [_vllm_row(gpu, weights, activation, util, overhead_mib, basis, host=str(host))
            for host, gpus in per_node for gpu in gpus]
    plan = _vllm_pool_plan(name, rows, util, weights, per_token, max_len, ray_cluster=ray_cluster,
                           nodes=[str(h) for h, _g in per_node], tensor_parallel_size=tp,
                           pipeline_parallel_size=pp)
    kv_tokens = plan["kv_tokens"]
    suggestions = []
    problems = _vllm_problems(rows, weights, activation, util, min_headroom_mib)
    _vllm_pool_verdict(problems, suggestions, settings, kv_tokens, max_len, per_token)
    if any("exceed" in p for p in problems):
        otherwise = (". Nothing smaller fits on these nodes: add nodes to ray_cluster %s (one more pipeline "
                     "stage each) or use larger GPUs" % ray_cluster)
    else:
        otherwise = ". Free the GPU(s) named (another process holds them) or lower gpu_memory_utilization"
    _vllm_finish(plan, name, problems, suggestions, otherwise=otherwise)
    plan["message"] = ("%s: Ray cluster %s, TP %d x PP %d on %d node(s) (%s), weights %s per rank, KV pool "
                       "%s = %d tokens (%s x max_model_len %d)" % (
                           name, ray_cluster, tp, pp, len(per_node), ", ".join(plan["nodes"]),
                           mib_text(weights), mib_text(min(r["kv"] for r in rows)), kv_tokens,
                           plan["max_concurrency"], max_len))
    return plan


# ---------------------------------------------------------------------------------------------------------
# The engine's part of memory_plan.plan_instances


def plan(model, gpus, settings, name="instance", **options):
    """memory_plan.plan_instance's entry: plan_vllm."""
    return plan_vllm(model, gpus, settings, name=name, **options)


def model_not_on_node(inst):
    """Why the instance's model directory cannot be read on this node (None when it can or is given as
    metadata)."""
    if isinstance(inst.get("model"), dict):
        return None
    path = inst.get("model_dir")
    if not path and isinstance(inst.get("model"), str):
        path = inst["model"]
    if not path:
        return None
    check = os.path.join(path, "config.json")
    if not os.path.exists(check):
        return "%s is not on the node yet" % check
    return None


def _vllm_model(name, model, inst, summarize_vllm):
    """(the vLLM model summary, None) or (None, why it cannot be planned)."""
    if isinstance(model, dict):
        return model, None
    model_dir = inst.get("model_dir") or model
    if not model_dir:
        raise PlanError("instance %s (vllm) has no model_dir" % name)
    model = summarize_vllm(model_dir)
    if not model.get("num_hidden_layers") or not model.get("weights_bytes"):
        return None, "%s has no layer count in config.json or no *.safetensors weights" % model_dir
    return model, None


def _plan_cluster_instance(inst, name, model, settings, node):
    """A vLLM instance on a Ray cluster (`nodes`, `ray_cluster`): not planned while a node's GPUs are unknown
    (llmops_gpus not gathered there), else plan_vllm_cluster over every node's GPUs."""
    nodes = inst.get("nodes")
    if not isinstance(nodes, list) or not nodes:
        raise PlanError("instance %s: nodes must be a list of {host, gpus, num_gpus} (the Ray cluster's "
                        "nodes)" % name)
    unknown = [str(n.get("host")) for n in nodes if not isinstance(n, dict) or n.get("gpus") is None]
    if unknown:
        return not_planned(name, ENGINE, "the GPUs of %s in ray_cluster %s are unknown (llmops_gpus not "
                                         "gathered there: run gpu_facts on every node of the cluster)"
                           % (", ".join(unknown), inst.get("ray_cluster")))
    model, why = _vllm_model(name, model, inst, node["summarize_vllm"])
    if why:
        return not_planned(name, ENGINE, why)
    return plan_vllm_cluster(model, nodes, settings, name=name,
                             **plan_options(node, basis=node["basis"], ray_cluster=inst.get("ray_cluster")))


def plan_entry(inst, name, node):
    """One instance of memory_plan.plan_instances (`node`: what it knows of the host). An instance with
    `nodes` (and `ray_cluster`) runs on a Ray cluster: it is planned on every GPU of every node
    (plan_vllm_cluster), not on the host's GPUs."""
    model = inst.get("model")
    settings = inst.get("settings") or {}
    if inst.get("nodes") is not None:
        return _plan_cluster_instance(inst, name, model, settings, node)
    chosen, others = chosen_gpus(name, instance_gpu_indexes(inst, node["gpus"]), node["gpus"])
    model, why = _vllm_model(name, model, inst, node["summarize_vllm"])
    if why:
        return not_planned(name, ENGINE, why)
    if not isinstance(model, dict):
        raise PlanError("instance %s: model must be gguf_info's result (a dict)" % name)
    check_model_numbers(model, name)
    return plan_vllm(model, chosen, settings, name=name,
                     **plan_options(node, other_gpus=others, basis=node["basis"]))
