# -*- coding: utf-8 -*-
# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Memory planner for llmops.serving.serving_plan: what an instance will allocate, per GPU, before it starts.

Plain Python 3.6, standard library only, importable without Ansible.

llama.cpp: the rules are the pinned llama.cpp's own (src/llama-hparams.cpp, llama-kv-cache.cpp,
llama-memory-recurrent.cpp, llama-context.cpp, llama-model.cpp, common/speculative.cpp); each function
names what it mirrors. The model is gguf_info's summary (plugins/module_utils/gguf.py summarize()).
vLLM: the model is vllm_model_summary(model_dir) (HF config.json + safetensors sizes); the rules are
vLLM's profiling: weights + activation peak + KV blocks under gpu_memory_utilization.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import math
import os

from ansible_collections.llmops.serving.plugins.module_utils.memory_plan_checks import (
    MAX_PARALLEL,
    InputError,
    check_gpu_entries,
    check_instance,
    check_model_numbers,
    check_options,
)

MIB = 1024 * 1024
GIB = 1024 * MIB

# CUDA context + cuBLAS workspace + the CUDA runtime's own allocations per GPU, which no llama.cpp log line
# counts (nvidia-smi shows them). Measured on Ada/Hopper with CUDA 12: 300-600 MiB per process and GPU.
DEFAULT_OVERHEAD_MIB = 512
# What must stay free on each GPU after the plan (fragmentation, a graph re-reserve, other small users).
DEFAULT_MIN_HEADROOM_MIB = 1024
# vLLM: CUDA context + PyTorch/NCCL per rank outside its KV pool (seed 003: ~1,700 MiB per card with TP 2).
DEFAULT_VLLM_OVERHEAD_MIB = 1700

# ggml block sizes: (elements per block, bytes per block) (ggml/src/ggml.c type_traits).
GGML_TYPES = {
    "f32": (1, 4), "f16": (1, 2), "bf16": (1, 2),
    "q8_0": (32, 34), "q4_0": (32, 18), "q4_1": (32, 20), "q5_0": (32, 22), "q5_1": (32, 24),
    "iq4_nl": (32, 18),
}

# llama-server defaults of the pinned build (common/common.h, tools/server/server.cpp).
DEFAULT_BATCH = 2048
DEFAULT_UBATCH = 512
DEFAULT_DRAFT_N_MAX = 3
AUTO_PARALLEL = 4            # --parallel -1 (the default): 4 slots with a unified KV cache
# ggml/CMakeLists.txt GGML_SCHED_MAX_COPIES: graph-input copies per device under pipeline parallelism
DEFAULT_SCHED_COPIES = 4
CTX_PAD = 256                # llama_context pads n_ctx (and n_ctx_seq) to 256
# Speculative types whose draft needs partial rollback of the recurrent state (common.h need_n_rs_seq).
RS_ROLLBACK_SPEC_TYPES = ("draft-mtp", "draft-eagle3", "draft-dflash", "draft-dspark")
# Speculative types that create a second llama_context (a draft context with its own KV and compute).
DRAFT_CONTEXT_SPEC_TYPES = ("draft-mtp",)


class PlanError(Exception):
    """Input the planner cannot plan for; the message says what is wrong."""


def _pad(value, multiple):
    return (int(value) + multiple - 1) // multiple * multiple


def row_bytes(type_name, n_elements):
    """ggml_row_size: bytes of n_elements of a ggml type (quantized types in whole blocks)."""
    try:
        block, size = GGML_TYPES[str(type_name).lower()]
    except KeyError:
        raise PlanError("unknown KV cache type %r: choose one of %s"
                        % (type_name, ", ".join(sorted(GGML_TYPES)))) from None
    return (int(n_elements) + block - 1) // block * size


def _bool(value):
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes", "on")
    return bool(value)


def _int(settings, key, default):
    value = settings.get(key)
    if value is None or value == "":
        return default
    try:
        return int(value)
    except (TypeError, ValueError):
        raise PlanError("setting %s must be an integer, got %r" % (key, value)) from None


def _per_layer(value, il, default=None):
    """A gguf_info field that is a scalar or a per-layer list."""
    if isinstance(value, list):
        return value[il] if il < len(value) and value[il] is not None else default
    return default if value is None else value


def spec_types(settings):
    value = settings.get("spec_type")
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return [str(v).strip() for v in value if str(v).strip()]
    return [v.strip() for v in str(value).split(",") if v.strip()]


def llama_settings(model, settings):
    """The instance settings resolved the way llama_context resolves them (llama-context.cpp constructor)."""
    settings = dict(settings or {})
    parallel = _int(settings, "parallel", -1)
    unified = settings.get("kv_unified")
    if parallel < 1:
        parallel = AUTO_PARALLEL
        unified = True if unified is None else unified
    unified = _bool(unified) if unified is not None else False
    ctx = _int(settings, "ctx_size", 0) or int(model.get("context_length") or 0)
    if ctx < 1:
        raise PlanError("ctx_size is not set and the model has no context_length")
    ctx = _pad(ctx, CTX_PAD)
    if unified:
        ctx_seq = ctx
    else:
        ctx_seq = _pad(ctx // parallel, CTX_PAD)
        ctx = ctx_seq * parallel
    batch = min(ctx, _int(settings, "batch_size", DEFAULT_BATCH))
    ubatch = min(batch, _int(settings, "ubatch_size", DEFAULT_UBATCH) or batch)
    types = spec_types(settings)
    n_draft = _int(settings, "spec_draft_n_max", DEFAULT_DRAFT_N_MAX) if types else 0
    type_k = str(settings.get("cache_type_k") or "f16").lower()
    type_v = str(settings.get("cache_type_v") or "f16").lower()
    # The serving role gives the draft context the main cache types unless set (llama_server_flags.py);
    # the pinned llama-server alone would use f16.
    draft_k = settings.get("spec_draft_cache_type_k") or settings.get("cache_type_k_draft") or type_k
    draft_v = settings.get("spec_draft_cache_type_v") or settings.get("cache_type_v_draft") or type_v
    flash = str(settings.get("flash_attn", "auto")).lower()
    if flash in ("false", "0", "no"):
        flash = "off"
    quantized_v = GGML_TYPES.get(type_v, (1, 0))[0] > 1
    if flash == "off" and quantized_v:
        # llama_init_from_model: "quantized V cache requires flash_attn to be enabled"
        raise PlanError("cache_type_v %s needs flash attention: llama.cpp refuses flash_attn off with a "
                        "quantized V cache (set flash_attn auto/on or cache_type_v f16)" % type_v)
    for t in (type_k, type_v, draft_k, draft_v):
        row_bytes(t, 1)
    return {
        "ctx_size": ctx, "ctx_seq": ctx_seq, "parallel": parallel, "kv_unified": unified,
        "batch": batch, "ubatch": ubatch, "type_k": type_k, "type_v": type_v,
        "draft_type_k": str(draft_k).lower(), "draft_type_v": str(draft_v).lower(),
        # auto resolves to enabled on every backend the planner targets (CPU, CUDA)
        "flash_attn": flash != "off",
        "spec_types": types, "n_draft": n_draft,
        "mtp": any(t in DRAFT_CONTEXT_SPEC_TYPES for t in types),
        # llama_context n_rs_seq: recurrent states kept per sequence for partial rollback of drafts
        "n_rs_seq": n_draft if any(t in RS_ROLLBACK_SPEC_TYPES for t in types) else 0,
        # server_output_limits: n_parallel x (1 + draft) outputs per batch, at most n_batch
        "n_outputs_max": max(1, min(batch, parallel * (1 + n_draft))),
        # common.h: sampling.backend_sampling (-bs, default off); speculative draft.backend_sampling (on)
        "backend_sampling": _bool(settings.get("backend_sampling") or False),
        "draft_backend_sampling": _bool(settings.get("spec_draft_backend_sampling", True)),
    }


# ---------------------------------------------------------------------------------------------------------
# Model shape


def _layer_kinds(model):
    kinds = model.get("layer_types")
    if kinds:
        return list(kinds)
    return ["attention"] * int(model.get("block_count") or 0)


def _head_dims(model, il):
    n_embd = int(model.get("embedding_length") or 0)
    n_head = int(_per_layer(model.get("head_count"), il, 0) or 0)
    n_head_kv = _per_layer(model.get("head_count_kv"), il, n_head)
    n_head_kv = n_head if n_head_kv is None else int(n_head_kv)
    head_dim = n_embd // n_head if n_head else 0
    key_len = int(model.get("key_length") or head_dim)
    value_len = int(model.get("value_length") or head_dim)
    return n_head, n_head_kv, key_len, value_len


def kv_bytes_per_cell(model, layers, type_k, type_v):
    """llama_kv_cache: per layer a K tensor of n_embd_k_gqa x cells and a V tensor of n_embd_v_gqa x cells."""
    total = 0
    for il in layers:
        _n_head, n_head_kv, key_len, value_len = _head_dims(model, il)
        total += row_bytes(type_k, key_len * n_head_kv) + row_bytes(type_v, value_len * n_head_kv)
    return total


def recurrent_bytes_per_row(model):
    """llama_hparams n_embd_r() + n_embd_s() in F32 (the Mamba-2 / Gated DeltaNet path of the pinned build):
    conv state (d_conv - 1) x (d_inner + 2 n_group d_state), SSM state d_state x d_inner."""
    ssm = model.get("ssm") or {}
    d_conv = int(ssm.get("conv_kernel") or 0)
    d_inner = int(ssm.get("inner_size") or 0)
    d_state = int(ssm.get("state_size") or 0)
    n_group = int(ssm.get("group_count") or 0)
    n_embd_r = max(d_conv - 1, 0) * (d_inner + 2 * n_group * d_state)
    n_embd_s = d_state * d_inner
    return 4 * (n_embd_r + n_embd_s)


def _layers_of(model, kind):
    return [i for i, k in enumerate(_layer_kinds(model)) if k == kind]


def _work_floats_per_token(model, layers):
    """Floats per ubatch token of the largest intermediates of one layer of the graph (activations, Q/K/V,
    FFN gate/up, the recurrent layers' projections and conv input). ggml-alloc reuses the memory of tensors
    that are dead, so the peak is a few of these per token, not their sum over layers."""
    n_embd = int(model.get("embedding_length") or 0)
    kinds = _layer_kinds(model)
    ssm = model.get("ssm") or {}
    d_inner = int(ssm.get("inner_size") or 0)
    conv_dim = d_inner + 2 * int(ssm.get("group_count") or 0) * int(ssm.get("state_size") or 0)
    best = 0
    for il in layers:
        n_ff = int(_per_layer(model.get("feed_forward_length"), il, 0) or 0)
        n_head, n_head_kv, key_len, value_len = _head_dims(model, il)
        ffn = 2 * n_ff + n_embd
        if il < len(kinds) and kinds[il] == "recurrent":
            mix = 2 * conv_dim + 2 * d_inner + n_embd
        else:
            mix = 2 * n_head * key_len + n_head_kv * (key_len + value_len) + n_head * value_len
        best = max(best, ffn, mix)
    return 2 * n_embd + best


def _compute_bytes(model, s, attn_layers, all_layers, n_outputs_max):
    """The graph's compute buffer (sched_reserve: the worst of the prompt graph at n_ubatch tokens and the
    token graph). Its peak, measured on the pinned CPU build:
      - the KQ mask input, n_kv x n_ubatch (F16 with flash attention, F32 without), live through every
        attention layer (n_kv is the whole cache when unified, one sequence's share when not);
      - without flash attention the KQ scores n_kv x n_ubatch x n_head in F32 (softmax reuses them);
      - the largest layer intermediates x n_ubatch beside them;
      - the logits (n_vocab x min(n_ubatch, n_outputs_max) x 4) come after the last attention layer and
        reuse the mask's memory: they only count when they are larger than all of the above.
    Calibrated against the pinned CPU build's -lv 4 log on 17 runs of the tiny llama and qwen35 models (ctx
    1024-32768, ubatch 64-512, parallel 1-8, unified or not, flash attention on/off, q8_0/q4_0/f16 KV, MTP
    drafts of 2 and 3): every compute buffer within 0.5 MiB of the log (most within 0.1 MiB), every total
    within 1.6 % (test_memory_plan.py keeps some of the logged figures)."""
    mask, work, logits = _compute_parts(model, s, attn_layers, all_layers, n_outputs_max)
    return max(mask + work, logits)


def _kq_mask_bytes(s):
    """The KQ mask graph input: n_kv x n_ubatch, F16 with flash attention, F32 without."""
    n_kv = s["ctx_size"] if s["kv_unified"] else s["ctx_seq"]
    return n_kv * s["ubatch"] * (2 if s["flash_attn"] else 4)


def _compute_parts(model, s, attn_layers, all_layers, n_outputs_max):
    """(mask and KQ scores, layer intermediates, logits) in bytes: the pieces of _compute_bytes."""
    tokens = s["ubatch"]
    mask = kq = 0
    if attn_layers:
        mask = _kq_mask_bytes(s)
        if not s["flash_attn"]:
            n_kv = s["ctx_size"] if s["kv_unified"] else s["ctx_seq"]
            n_head = max(_head_dims(model, il)[0] for il in attn_layers)
            kq = n_kv * tokens * n_head * 4
    n_out = min(tokens, n_outputs_max)
    logits = (int(model.get("vocab_size") or 0) + 2 * int(model.get("embedding_length") or 0)) * n_out * 4
    work = tokens * 4 * _work_floats_per_token(model, all_layers)
    return mask + kq, work, logits


def _best_fit_growth(blocks, sizes):
    """ggml_dyn_tallocr_alloc (ggml/src/ggml-alloc.c): each tensor goes to the smallest free block that holds
    it; when none does, to the last block, which grows the buffer. `blocks`: free block sizes, the last one
    at the end of the buffer. Returns by how many bytes the buffer grows."""
    blocks = list(blocks)
    grow = 0
    for size in sizes:
        fitting = [i for i, b in enumerate(blocks) if b >= size]
        if fitting:
            best = min(fitting, key=lambda i: (blocks[i], -i))
            blocks[best] -= size
        else:
            grow += size - blocks[-1]
            blocks[-1] = 0
    return grow


def _sampling_compute_bytes(model, s, attn_layers, all_layers, n_outputs_max, type_k):
    """The compute buffer once backend samplers are attached (llama_context::set_sampler sets
    sched_need_reserve; sched_reserve then reserves the graph again with llm_graph_context::build_sampling):
    the logits stay (a graph output) and ggml_pad copies them into n_outputs + 1 rows of n_vocab F32, beside
    them (the per-sequence top-k views and results are small). Whether the two fit in the memory the layers
    freed is ggml-alloc's best fit: the mask's block and the tail after it, split by the residual stream
    (n_embd x n_ubatch F32) with an F16 cache; merged into one block with a quantized cache (whose rotation
    inputs change the order) or when the logits outgrow the layers. Calibrated on the CPU build's MTP draft
    contexts (10 settings, all within 1.2 % of the second reservation) and a main context with -bs."""
    mask, work, logits = _compute_parts(model, s, attn_layers, all_layers, n_outputs_max)
    first = max(mask + work, logits)
    n_vocab = int(model.get("vocab_size") or 0)
    if not n_vocab:
        return first
    n_out = min(s["ubatch"], n_outputs_max)
    residual = int(model.get("embedding_length") or 0) * s["ubatch"] * 4
    logits_rows = n_vocab * n_out * 4
    padded = n_vocab * (n_out + 1) * 4
    trunk = mask + work
    quantized = GGML_TYPES.get(type_k, (1, 0))[0] > 1
    if quantized or logits > trunk or not mask:
        blocks = [max(trunk - residual, 0)]
    else:
        blocks = [mask, max(trunk - mask - 2 * residual, 0)]
    return max(first, trunk + _best_fit_growth(blocks, (logits_rows, padded)))


def _draft_compute_bytes(model, s, nextn):
    """The MTP draft context's compute buffer: its first reservation, or the second one after
    common_speculative's draft-mtp init attaches a top-k backend sampler chain per sequence
    (common/speculative.cpp, llama_set_sampler(ctx_dft, seq, chain); on unless
    --no-spec-draft-backend-sampling), whichever is larger. One output per sequence."""
    if s["draft_backend_sampling"]:
        return _sampling_compute_bytes(model, s, nextn, nextn, s["parallel"], s["draft_type_k"])
    return _compute_bytes(model, s, nextn, nextn, s["parallel"])


def _main_compute_bytes(model, s, attn_layers, all_layers, n_outputs_max):
    """The target context's compute buffer; with --backend-sampling (setting backend_sampling, off by
    default) common_init_from_params gives the context a sampler chain per sequence at creation and the server
    sets one per slot, so its graph carries the sampling tensors (measured with the tiny llama model, -bs:
    +0.76 MiB at parallel 1, +2.70 MiB at parallel 4 on 128k-token vocabulary)."""
    if s["backend_sampling"] and n_outputs_max:
        return _sampling_compute_bytes(model, s, attn_layers, all_layers, n_outputs_max, s["type_k"])
    return _compute_bytes(model, s, attn_layers, all_layers, n_outputs_max)


def _output_buffer_bytes(model, s):
    """llama_context::output_reserve(n_seq_max) at creation: logits for n_seq_max outputs in F32."""
    return int(model.get("vocab_size") or 0) * 4 * s["parallel"]


def _weights_bytes(model, s):
    """Tensor bytes llama.cpp loads: the MTP (nextn) blocks only when a draft-mtp context uses them."""
    total = sum(model.get("layer_bytes") or []) + sum((model.get("non_layer_tensors") or {}).values())
    if not total:
        total = int(model.get("tensor_bytes") or 0)
    if not s["mtp"]:
        layer_bytes = model.get("layer_bytes") or []
        total -= sum(layer_bytes[i] for i in _layers_of(model, "nextn") if i < len(layer_bytes))
    return total


def llama_cpp_breakdown(model, settings):
    """Bytes llama.cpp allocates for this model and these settings with everything on ONE device (the CPU
    build's log lines: model buffer, KV buffer, RS buffer, output buffer, compute buffer; the MTP draft
    context's KV and compute buffers separately). Returns a dict of ints.

    The draft KV uses spec_draft_cache_type_k/v, else (as the serving role renders it) cache_type_k/v; to
    compare with a bare llama-server run without -ctkd/-ctvd, pass spec_draft_cache_type_k/v: f16."""
    s = llama_settings(model, settings)
    attn = _layers_of(model, "attention")
    recurrent = _layers_of(model, "recurrent")
    nextn = _layers_of(model, "nextn")
    trunk = attn + recurrent
    result = {
        "weights": _weights_bytes(model, s),
        "kv": kv_bytes_per_cell(model, attn, s["type_k"], s["type_v"]) * s["ctx_size"],
        # llama_memory_recurrent: max(1, n_seq_max) cells, each with 1 + n_rs_seq rollback rows
        "recurrent": len(recurrent) * recurrent_bytes_per_row(model) * s["parallel"] * (1 + s["n_rs_seq"]),
        "compute": _main_compute_bytes(model, s, attn, trunk, s["n_outputs_max"]),
        "output": _output_buffer_bytes(model, s),
        "draft_kv": 0,
        "draft_compute": 0,
    }
    if s["mtp"] and nextn:
        # common_speculative_init_result: the MTP context has the target's n_ctx and n_seq_max, KV for the
        # nextn blocks only, in the draft cache types, n_rs_seq 0, one output per sequence.
        draft_cell = kv_bytes_per_cell(model, nextn, s["draft_type_k"], s["draft_type_v"])
        result["draft_kv"] = draft_cell * s["ctx_size"]
        result["draft_compute"] = _draft_compute_bytes(model, s, nextn)
        result["output"] += _output_buffer_bytes(model, s)
    result["total"] = sum(result.values())
    return result


# ---------------------------------------------------------------------------------------------------------
# llama.cpp: placement on the instance's GPUs


def _fractions(value, count):
    if value is None or value == "" or value == []:
        return None
    if isinstance(value, str):
        value = [v for v in value.split(",") if v.strip()]
    try:
        fractions = [float(v) for v in value]
    except (TypeError, ValueError):
        raise PlanError("tensor_split must be numbers, got %r" % (value,)) from None
    if len(fractions) != count or any(not math.isfinite(f) or f < 0 for f in fractions) or not sum(fractions):
        raise PlanError("tensor_split %s does not match the instance's %d GPU(s): give one non-negative "
                        "share per GPU" % (",".join("%g" % f for f in fractions), count))
    return fractions


def assign_layers(n_layer_all, n_gpu_layers, fractions):
    """llama_model::load_tensors: device position (None = host) of each block and, last, of the output head.
    The input embedding always stays in host memory; the last n_gpu_layers of the n_layer_all + 1 'layers'
    (the blocks and the output head) are offloaded, split at the cumulative tensor_split points."""
    total = float(sum(fractions))
    points = []
    acc = 0.0
    for f in fractions:
        acc += f
        points.append(acc / total)
    start = max(n_layer_all + 1 - n_gpu_layers, 0)
    active = min(n_gpu_layers, n_layer_all + 1)
    placement = []
    for il in range(n_layer_all + 1):
        if il < start or il - start >= active:
            placement.append(None)
            continue
        x = float(il - start) / active
        placement.append(min(sum(1 for p in points if p <= x), len(points) - 1))  # std::upper_bound
    return placement


def _output_head_bytes(model):
    tensors = model.get("non_layer_tensors") or {}
    head = sum(v for k, v in tensors.items() if k.startswith("output"))
    if "output.weight" not in tensors:
        # tied embeddings: llama.cpp loads token_embd a second time as the output head on the output device
        head += tensors.get("token_embd.weight", 0)
    return head


def _empty_device():
    return dict((k, 0) for k in ("weights", "kv", "draft_kv", "recurrent", "compute", "draft_compute"))


def _place(model, s, positions, n_devices):
    """Bytes per device position (and host) of a llama.cpp instance: weights, KV, recurrent state and the
    compute buffers follow the blocks they belong to."""
    kinds = _layer_kinds(model)
    layer_bytes = model.get("layer_bytes") or [0] * len(kinds)
    devices = [_empty_device() for dummy in range(n_devices)]
    host = _empty_device()
    tensors = model.get("non_layer_tensors") or {}
    host["weights"] = sum(v for k, v in tensors.items() if not k.startswith("output"))
    host["output"] = _output_buffer_bytes(model, s) * (2 if s["mtp"] and "nextn" in kinds else 1)
    row = recurrent_bytes_per_row(model) * s["parallel"] * (1 + s["n_rs_seq"])
    layers_on = [[] for dummy in range(n_devices + 1)]
    for il, kind in enumerate(kinds):
        dev = positions[il] if il < len(positions) else None
        target = host if dev is None else devices[dev]
        layers_on[n_devices if dev is None else dev].append(il)
        if kind == "nextn" and not s["mtp"]:
            continue
        target["weights"] += layer_bytes[il] if il < len(layer_bytes) else 0
        if kind == "attention":
            target["kv"] += kv_bytes_per_cell(model, [il], s["type_k"], s["type_v"]) * s["ctx_size"]
        elif kind == "recurrent":
            target["recurrent"] += row
        elif kind == "nextn":
            draft_cell = kv_bytes_per_cell(model, [il], s["draft_type_k"], s["draft_type_v"])
            target["draft_kv"] += draft_cell * s["ctx_size"]
    out_dev = positions[len(kinds)]
    if out_dev is None:
        out = host
        host["weights"] += sum(v for k, v in tensors.items() if k.startswith("output"))
    else:
        out = devices[out_dev]
        out["weights"] += _output_head_bytes(model)
    for pos, target in enumerate(devices + [host]):
        layers = [il for il in layers_on[pos] if kinds[il] != "nextn"]
        is_out = target is out
        if layers or is_out:
            attn = [il for il in layers if kinds[il] == "attention"]
            target["compute"] = _main_compute_bytes(model, s, attn, layers,
                                                    s["n_outputs_max"] if is_out else 0)
        elif target is host:
            # the input embedding's get_rows output and the graph inputs, in host memory
            target["compute"] = int(model.get("embedding_length") or 0) * s["ubatch"] * 4
        nextn = [il for il in layers_on[pos] if kinds[il] == "nextn"]
        if s["mtp"] and nextn:
            target["draft_compute"] = _draft_compute_bytes(model, s, nextn)
    return devices, host, layers_on


def _gpu_budget_mib(gpu, basis):
    free = gpu.get("memory_free_mib")
    if basis == "total" or free is None:
        free = gpu.get("memory_total_mib")
    if free is None:
        raise PlanError("GPU %s has no memory_total_mib/memory_free_mib (give the llmops_gpus entries)"
                        % gpu.get("index"))
    return int(free)


def _placement_positions(model, s, settings, gpus, fractions):
    n_layer_all = len(_layer_kinds(model))
    ngl = settings.get("n_gpu_layers")
    # -ngl auto / all offload everything (auto lets llama.cpp's fit step lower it; the plan shows whether
    # that is needed)
    n_gpu_layers = -1 if str(ngl).lower() in ("auto", "all") else _int(settings, "n_gpu_layers", -1)
    if n_gpu_layers < 0:
        n_gpu_layers = n_layer_all + 1
    split_mode = str(settings.get("split_mode") or "layer").lower()
    if split_mode == "none":
        # one GPU holds everything offloaded: main_gpu (a physical index of the instance's GPUs)
        main = settings.get("main_gpu")
        indexes = [g.get("index") for g in gpus]
        main_pos = indexes.index(int(main)) if main is not None and int(main) in indexes else 0
        return [None if p is None else main_pos for p in assign_layers(n_layer_all, n_gpu_layers, [1.0])]
    # row and tensor split each matrix across the GPUs in the tensor_split shares; per GPU that is close to
    # the layer split's share of the same bytes, which is what is planned for them.
    return assign_layers(n_layer_all, n_gpu_layers, fractions)


def pipeline_parallel(settings, positions, n_devices):
    """llama_context's constructor (src/llama-context.cpp, "enabling pipeline parallelism in the scheduler
    increases memory usage, so it is only done when necessary"): several devices, every layer and the output
    offloaded (n_gpu_layers > n_layer_all), split mode layer, offload_kqv (no --no-kv-offload) and no tensor
    overrides (-ot, --cpu-moe); CUDA devices have the async compute and events it also needs."""
    split_mode = str(settings.get("split_mode") or "layer").lower()
    return (n_devices > 1 and split_mode == "layer" and all(p is not None for p in positions)
            and not _bool(settings.get("no_kv_offload") or False)
            and not settings.get("override_tensor") and not _bool(settings.get("cpu_moe") or False)
            and not settings.get("n_cpu_moe"))


def _pipeline_copies_bytes(model, s, settings, layers_on, pos):
    """With pipeline parallelism ggml_backend_sched_new gets n_copies = GGML_SCHED_MAX_COPIES (4 unless the
    build sets it; setting sched_max_copies) and ggml_backend_sched_split_graph (ggml/src/ggml-backend.cpp)
    makes that many copies of every graph input and every split input on the device that reads it, flagged
    input and output so ggml-alloc never frees or reuses them. The compute buffer is not copied whole: per GPU
    it holds copies x the KQ mask (instead of one that the layers reuse) and copies x the activations entering
    from the previous GPU (n_embd x n_ubatch F32)."""
    copies = _int(settings, "sched_max_copies", DEFAULT_SCHED_COPIES)
    kinds = _layer_kinds(model)
    layers = [il for il in layers_on[pos] if kinds[il] != "nextn"]
    extra = 0
    if any(kinds[il] == "attention" for il in layers):
        extra += copies * _kq_mask_bytes(s)
    if pos > 0:
        extra += copies * int(model.get("embedding_length") or 0) * s["ubatch"] * 4
    return extra


def _device_plan(model, s, settings, gpus, fractions, overhead_mib, basis):
    positions = _placement_positions(model, s, settings, gpus, fractions)
    devices, host, layers_on = _place(model, s, positions, len(gpus))
    pipeline = pipeline_parallel(settings, positions, len(gpus))
    rows = []
    for pos, gpu in enumerate(gpus):
        d = devices[pos]
        d["pipeline_copies"] = _pipeline_copies_bytes(model, s, settings, layers_on, pos) if pipeline else 0
        d["overhead"] = int(overhead_mib) * MIB
        d["total"] = sum(d.values())
        budget = _gpu_budget_mib(gpu, basis)
        layers = layers_on[pos]
        row = {
            "index": gpu.get("index"), "name": gpu.get("name"),
            "memory_total_mib": gpu.get("memory_total_mib"), "memory_free_mib": gpu.get("memory_free_mib"),
            "layers": [layers[0], layers[-1]] if layers else None,
            "output_head": positions[-1] == pos,
            "headroom_mib": budget - int((d["total"] + MIB - 1) // MIB),
        }
        row.update(d)
        rows.append(row)
    host["total"] = sum(host.values())
    return rows, host


def _derive_split(model, s, settings, gpus, overhead_mib, min_headroom_mib, basis):
    """A tensor split proportional to what fits on each GPU: its budget less the CUDA overhead, the headroom
    and what does not scale with its share of the layers (the output head and compute buffers), measured
    by planning with an even split first."""
    even = [1.0] * len(gpus)
    rows, _host = _device_plan(model, s, settings, gpus, even, overhead_mib, basis)
    per_layer_total = sum(r["weights"] + r["kv"] + r["recurrent"] + r["draft_kv"] for r in rows)
    room = []
    for pos, gpu in enumerate(gpus):
        r = rows[pos]
        fixed = r["compute"] + r["draft_compute"] + r["pipeline_copies"] \
            + (_output_head_bytes(model) if r["output_head"] else 0)
        budget = (_gpu_budget_mib(gpu, basis) - int(overhead_mib) - int(min_headroom_mib)) * MIB - fixed
        room.append(max(budget, 0))
    if not sum(room) or not per_layer_total:
        return even
    return [round(float(r) / sum(room), 3) for r in room]


def _llama_core(model, gpus, settings, overhead_mib, min_headroom_mib, basis):
    s = llama_settings(model, settings)
    fractions = _fractions(settings.get("tensor_split"), len(gpus))
    derived = False
    if fractions is None:
        if len(gpus) > 1 and str(settings.get("split_mode") or "layer").lower() != "none":
            fractions = _derive_split(model, s, settings, gpus, overhead_mib, min_headroom_mib, basis)
            derived = True
        else:
            fractions = [1.0] * len(gpus)
    rows, host = _device_plan(model, s, settings, gpus, fractions, overhead_mib, basis)
    fits = all(r["headroom_mib"] >= int(min_headroom_mib) for r in rows)
    return s, fractions, derived, rows, host, fits


def context_warnings(model, s, name):
    """llama.cpp's own warning when a sequence's context is above the model's trained context
    (llama_context: "n_ctx_seq (...) > n_ctx_train (...) -- possible training context overflow")."""
    trained = int(model.get("context_length") or 0)
    if trained and s["ctx_seq"] > trained:
        return ["instance %s: the context per sequence (%d) is above the model's trained context (%d): "
                "llama.cpp warns of a possible training context overflow (answers past %d tokens degrade "
                "unless the model is meant to be extended, e.g. with rope scaling)"
                % (name, s["ctx_seq"], trained, trained)]
    return []


def _largest(fits, low, high, step=1):
    """Largest value in [low, high] (multiples of step) for which fits(value) holds, or 0 (fits is
    monotonic: true up to a point)."""
    if high < low or not fits(low):
        return 0
    lo, hi = low // step, high // step
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid * step):
            lo = mid
        else:
            hi = mid - 1
    return lo * step


def _mib(value):
    return "{:,} MiB".format(int((value + MIB - 1) // MIB))


def plan_llama_cpp(model, gpus, settings, name="instance", overhead_mib=DEFAULT_OVERHEAD_MIB,
                   min_headroom_mib=DEFAULT_MIN_HEADROOM_MIB, other_gpus=None, basis="free"):
    """Plan a llama-server instance on `gpus` (its llmops_gpus entries, in the order of its gpus list).
    `other_gpus`: the host's other llmops_gpus entries, for the 'another GPU' suggestion. `basis`: plan
    against memory_free_mib ('free', the default) or memory_total_mib ('total': when the instance itself
    already holds the memory being re-planned)."""
    if not gpus:
        raise PlanError("instance %s has no GPUs to plan on" % name)
    settings = dict(settings or {})
    s, fractions, derived, rows, host, fits = _llama_core(model, gpus, settings, overhead_mib,
                                                          min_headroom_mib, basis)

    def fits_with(**changes):
        trial = dict(settings, **changes)
        if derived:
            trial["tensor_split"] = fractions
        try:
            return _llama_core(model, gpus, trial, overhead_mib, min_headroom_mib, basis)[5]
        except PlanError:
            return False

    ctx_limit = max(int(model.get("context_length") or 0), s["ctx_size"])
    max_ctx = _largest(lambda c: fits_with(ctx_size=c), CTX_PAD, ctx_limit, CTX_PAD)
    # llama.cpp's own limit, not a guess: 99 slots fit a 27B model on the L20 line
    max_parallel = _largest(lambda p: fits_with(parallel=p), 1, MAX_PARALLEL)
    plan = {
        "name": name, "engine": "llama.cpp", "fits": fits,
        "ctx_size": s["ctx_size"], "parallel": s["parallel"], "kv_unified": s["kv_unified"],
        "tensor_split": fractions if len(gpus) > 1 else None, "tensor_split_derived": derived,
        "host": host, "gpus": rows,
        "pipeline_parallel": any(r.get("pipeline_copies") for r in rows),
        "total_bytes": sum(r["total"] for r in rows),
        "max_ctx_size": max_ctx, "max_parallel": max_parallel,
        "warnings": context_warnings(model, s, name),
    }
    plan["message"] = "%s: %s; host %s" % (name, ", ".join(
        "GPU %s %s used, %s headroom" % (r["index"], _mib(r["total"]), "{:,} MiB".format(r["headroom_mib"]))
        for r in rows), _mib(host["total"]))
    plan["suggestions"] = [] if fits else _llama_suggestions(plan, s, settings, fits_with, rows, gpus,
                                                             other_gpus, min_headroom_mib)
    plan["refusal"] = None if fits else _refusal(plan, rows, min_headroom_mib)
    return plan


def plan_llama_cpp_host(model, settings, name="instance", host_memory_mib=None,
                        min_headroom_mib=DEFAULT_MIN_HEADROOM_MIB):
    """Plan a llama-server instance that runs on the CPU (no GPU, or n_gpu_layers 0): everything
    llama_cpp_breakdown counts is host memory. `host_memory_mib`: the node's RAM (ansible_memtotal_mb);
    None plans without a fits decision (fits None)."""
    settings = dict(settings or {})
    breakdown = llama_cpp_breakdown(model, settings)
    s = llama_settings(model, settings)
    host = dict(breakdown)
    total_mib = int((host["total"] + MIB - 1) // MIB)
    headroom = None if host_memory_mib is None else int(host_memory_mib) - total_mib
    fits = None if headroom is None else headroom >= int(min_headroom_mib)
    plan = {
        "name": name, "engine": "llama.cpp", "fits": fits, "device": "host",
        "ctx_size": s["ctx_size"], "parallel": s["parallel"], "kv_unified": s["kv_unified"],
        "tensor_split": None, "tensor_split_derived": False, "pipeline_parallel": False,
        "host": host, "host_memory_mib": host_memory_mib, "host_headroom_mib": headroom, "gpus": [],
        "total_bytes": host["total"], "max_ctx_size": None, "max_parallel": None, "suggestions": [],
        "warnings": context_warnings(model, s, name),
    }
    if fits is not None:
        def fits_host(**changes):
            try:
                used = llama_cpp_breakdown(model, dict(settings, **changes))["total"]
            except PlanError:
                return False
            return int(host_memory_mib) - int((used + MIB - 1) // MIB) >= int(min_headroom_mib)
        limit = max(int(model.get("context_length") or 0), s["ctx_size"])
        plan["max_ctx_size"] = _largest(lambda c: fits_host(ctx_size=c), CTX_PAD, limit, CTX_PAD)
        plan["max_parallel"] = _largest(lambda p: fits_host(parallel=p), 1, MAX_PARALLEL)
    plan["message"] = "%s: host memory %s used%s" % (
        name, _mib(host["total"]),
        "" if headroom is None else ", {:,} MiB headroom of {:,} MiB".format(headroom, int(host_memory_mib)))
    plan["refusal"] = None
    if fits is False:
        if plan["max_ctx_size"]:
            plan["suggestions"].append({"settings": {"ctx_size": plan["max_ctx_size"]},
                                        "text": "ctx_size %d" % plan["max_ctx_size"]})
        short = "{:,} MiB".format(int(min_headroom_mib) - headroom)
        plan["refusal"] = "instance %s does not fit in host memory: needs %s plus %s headroom, the node " \
            "has %s: short by %s" % (name, _mib(host["total"]), "{:,} MiB".format(int(min_headroom_mib)),
                                     "{:,} MiB".format(int(host_memory_mib)), short)
        if plan["suggestions"]:
            plan["refusal"] += ". Would fit: " + plan["suggestions"][0]["text"]
    return plan


def _llama_suggestions(plan, s, settings, fits_with, rows, gpus, other_gpus, min_headroom_mib):
    out = []
    if plan["max_ctx_size"]:
        out.append({"settings": {"ctx_size": plan["max_ctx_size"]},
                    "text": "ctx_size %d (the largest that fits at parallel %d)"
                            % (plan["max_ctx_size"], s["parallel"])})
    if (s["type_k"], s["type_v"]) != ("q8_0", "q8_0") and row_bytes(s["type_k"], 32) > 34 \
            and fits_with(cache_type_k="q8_0", cache_type_v="q8_0"):
        out.append({"settings": {"cache_type_k": "q8_0", "cache_type_v": "q8_0"},
                    "text": "cache_type_k/cache_type_v q8_0 (half the KV cache of f16)"})
    if plan["max_parallel"] and plan["max_parallel"] < s["parallel"]:
        out.append({"settings": {"parallel": plan["max_parallel"]},
                    "text": "parallel %d (fewer slots) at ctx_size %d"
                            % (plan["max_parallel"], s["ctx_size"])})
    used = set(g.get("index") for g in gpus)
    for row in rows:
        if row["headroom_mib"] >= int(min_headroom_mib):
            continue
        need = int((row["total"] + MIB - 1) // MIB) + int(min_headroom_mib)
        spare = [g for g in (other_gpus or []) if g.get("index") not in used
                 and (g.get("memory_free_mib") or 0) >= need]
        if spare:
            g = spare[0]
            text = "GPU %s (%s MiB free) instead of GPU %s" % (
                g.get("index"), "{:,}".format(g["memory_free_mib"]), row["index"])
            out.append({"gpus_replace": {row["index"]: g.get("index")}, "text": text})
    return out


def _refusal(plan, rows, min_headroom_mib):
    short = ["GPU %s (%s) needs %s plus %s headroom but has %s: short by %s" % (
        r["index"], r.get("name") or "?", _mib(r["total"]), "{:,} MiB".format(int(min_headroom_mib)),
        "{:,} MiB".format(r["headroom_mib"] + int((r["total"] + MIB - 1) // MIB)),
        "{:,} MiB".format(int(min_headroom_mib) - r["headroom_mib"]))
        for r in rows if r["headroom_mib"] < int(min_headroom_mib)]
    text = "instance %s does not fit: %s" % (plan["name"], "; ".join(short))
    if plan["suggestions"]:
        text += ". Would fit: " + "; or ".join(x["text"] for x in plan["suggestions"])
    else:
        text += ". Nothing smaller fits on these GPUs: use more or larger GPUs"
    return text


# ---------------------------------------------------------------------------------------------------------
# vLLM

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "half": 2, "float": 4}
VLLM_DEFAULT_UTILIZATION = 0.9
VLLM_DEFAULT_MAX_NUM_SEQS = 256
VLLM_DEFAULT_BATCHED_TOKENS = 8192
# Online quantization of a 16-bit checkpoint (quantization: fp8 / int8 ... with no quantization_config in
# the checkpoint): the linear weights go to one byte per parameter, norms and embeddings stay 16-bit.
ATTENTION_LAYER_TYPES = ("full_attention", "attention", "sliding_attention")
ONLINE_8BIT = ("fp8", "int8", "fbgemm_fp8", "experts_int8", "ptpc_fp8")


def vllm_model_summary(model_dir):
    """What the vLLM planner needs from an HF model directory: config.json (the text_config of a
    multimodal Qwen3.5/3.6 config wins) and the bytes of its top-level *.safetensors files."""
    path = os.path.join(model_dir, "config.json")
    try:
        with open(path) as f:
            config = json.load(f)
    except (IOError, OSError, ValueError) as exc:
        raise PlanError("cannot read %s: %s" % (path, exc)) from None
    weights = 0
    for name in sorted(os.listdir(model_dir)):
        if name.endswith(".safetensors"):
            weights += os.path.getsize(os.path.join(model_dir, name))
    return vllm_summary(config, weights, model_dir, path)


def vllm_summary(config, weights, model_dir, where="config.json"):
    """vllm_model_summary() from what it reads: the parsed config.json and the bytes of the *.safetensors
    files (safetensors_info gives them from the hub's listing and headers before anything is downloaded)."""
    if not isinstance(config, dict):
        raise PlanError("%s is not a JSON object" % where)
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}
    cfg = dict(config)
    cfg.update(text)
    layers = int(cfg.get("num_hidden_layers") or 0)
    heads = int(cfg.get("num_attention_heads") or 0)
    hidden = int(cfg.get("hidden_size") or 0)
    kinds = cfg.get("layer_types")
    if not isinstance(kinds, list) or len(kinds) != layers:
        interval = cfg.get("full_attention_interval")
        if interval:
            kinds = ["full_attention" if (i + 1) % int(interval) == 0 else "linear_attention"
                     for i in range(layers)]
        else:
            kinds = ["full_attention"] * layers
    return {
        "model_dir": model_dir,
        "architectures": cfg.get("architectures") or config.get("architectures"),
        "model_type": cfg.get("model_type"),
        "num_hidden_layers": layers, "hidden_size": hidden,
        "intermediate_size": int(cfg.get("intermediate_size") or 0),
        "num_attention_heads": heads,
        "num_key_value_heads": int(cfg.get("num_key_value_heads") or heads),
        "head_dim": int(cfg.get("head_dim") or (hidden // heads if heads else 0)),
        "layer_types": kinds,
        "full_attention_layers": sum(1 for k in kinds if k in ATTENTION_LAYER_TYPES),
        "linear_attention_layers": sum(1 for k in kinds if k == "linear_attention"),
        "linear": dict((k[len("linear_"):], cfg[k]) for k in cfg if k.startswith("linear_")),
        "mtp_layers": int(cfg.get("mtp_num_hidden_layers") or cfg.get("num_nextn_predict_layers") or 0),
        "vocab_size": int(cfg.get("vocab_size") or 0),
        "max_position_embeddings": int(cfg.get("max_position_embeddings") or 0),
        "dtype": str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16"),
        "quantization_config": config.get("quantization_config") or cfg.get("quantization_config"),
        "weights_bytes": weights,
    }


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
    tokens = _int(settings, "max_num_batched_tokens", VLLM_DEFAULT_BATCHED_TOKENS)
    seqs = _int(settings, "max_num_seqs", VLLM_DEFAULT_MAX_NUM_SEQS)
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
           "headroom_mib": _gpu_budget_mib(gpu, basis) - int((budget + MIB - 1) // MIB)}
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
                            "gpu_memory_utilization %.2f x %s" % (_vllm_gpu_label(r), _mib(weights),
                                                                  _mib(activation), _mib(r["overhead"]), util,
                                                                  "{:,} MiB".format(r["memory_total_mib"])))
        elif r["headroom_mib"] < int(min_headroom_mib):
            problems.append("%s has %s free, gpu_memory_utilization %.2f needs %s: short by %s" % (
                _vllm_gpu_label(r), "{:,} MiB".format(r["headroom_mib"] + int((r["total"] + MIB - 1) // MIB)),
                util, _mib(r["total"]), "{:,} MiB".format(int(min_headroom_mib) - r["headroom_mib"])))
    return problems


def _vllm_pool_verdict(problems, suggestions, settings, kv_tokens, max_len, per_token):
    """The KV pool must hold one max_model_len sequence (vLLM's own check); fills fits/refusal."""
    if not problems and max_len and kv_tokens < max_len:
        problems.append("the KV pool holds %d tokens, less than max_model_len %d: short by %s"
                        % (kv_tokens, max_len, _mib((max_len - kv_tokens) * per_token)))
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
    tp = _int(settings, "tensor_parallel_size", 1) * _int(settings, "pipeline_parallel_size", 1)
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
        name, tp, _mib(weights), _mib(min(r["kv"] for r in rows)), kv_tokens, plan["max_concurrency"],
        max_len)
    return plan


def _vllm_utilization_and_length(model, settings):
    """gpu_memory_utilization (vLLM's default when unset) and max_model_len (the model's own when unset)."""
    util = float(settings.get("gpu_memory_utilization") or VLLM_DEFAULT_UTILIZATION)
    return util, _int(settings, "max_model_len", int(model.get("max_position_embeddings") or 0))


def _vllm_pool_plan(name, rows, util, weights, per_token, max_len, **layout):
    """The fields every vLLM plan has, from its per-GPU rows: the KV pool is the smallest GPU's (every rank
    holds the same share of each sequence), in tokens and in max_model_len sequences. `layout`: the
    parallel sizes (and the Ray cluster and its nodes)."""
    kv_tokens = min(r["kv"] for r in rows) // per_token if per_token else 0
    plan = {"name": name, "engine": "vllm"}
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
    tp = _int(settings, "tensor_parallel_size", 1)
    pp = _int(settings, "pipeline_parallel_size", 1)
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
                           name, ray_cluster, tp, pp, len(per_node), ", ".join(plan["nodes"]), _mib(weights),
                           _mib(min(r["kv"] for r in rows)), kv_tokens, plan["max_concurrency"], max_len))
    return plan


def plan_instance(engine, model, gpus, settings, name="instance", **options):
    """Dispatch on the engine: 'llama.cpp' (model = gguf_info's result) or 'vllm' (model =
    vllm_model_summary's result)."""
    engine = str(engine or "llama.cpp").lower()
    if engine in ("llama.cpp", "llama_cpp", "llama-cpp", "llamacpp"):
        return plan_llama_cpp(model, gpus, settings, name=name, **options)
    if engine == "vllm":
        return plan_vllm(model, gpus, settings, name=name, **options)
    raise PlanError("instance %s: unknown engine %r (llama.cpp or vllm)" % (name, engine))


def _model_not_on_node(inst, engine):
    """Why an instance's model cannot be read on this node (None when it can or is given as metadata)."""
    if isinstance(inst.get("model"), dict):
        return None
    path = inst.get("model_dir") if engine == "vllm" else inst.get("model_path")
    if engine == "vllm" and not path and isinstance(inst.get("model"), str):
        path = inst["model"]
    if not path:
        return None
    check = os.path.join(path, "config.json") if engine == "vllm" else path
    if not os.path.exists(check):
        return "%s is not on the node yet" % check
    return None


def _not_planned(name, engine, why):
    return {"name": name, "engine": engine, "fits": None, "planned": False, "refusal": None,
            "message": "%s: not planned: %s" % (name, why)}


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


def _plan_cluster_instance(inst, name, model, settings, summarize_vllm, overhead_mib, min_headroom_mib,
                           basis):
    """A vLLM instance on a Ray cluster (`nodes`, `ray_cluster`): not planned while a node's GPUs are unknown
    (llmops_gpus not gathered there), else plan_vllm_cluster over every node's GPUs."""
    nodes = inst.get("nodes")
    if not isinstance(nodes, list) or not nodes:
        raise PlanError("instance %s: nodes must be a list of {host, gpus, num_gpus} (the Ray cluster's "
                        "nodes)" % name)
    unknown = [str(n.get("host")) for n in nodes if not isinstance(n, dict) or n.get("gpus") is None]
    if unknown:
        return _not_planned(name, "vllm", "the GPUs of %s in ray_cluster %s are unknown (llmops_gpus not "
                                          "gathered there: run gpu_facts on every node of the cluster)"
                            % (", ".join(unknown), inst.get("ray_cluster")))
    model, why = _vllm_model(name, model, inst, summarize_vllm)
    if why:
        return _not_planned(name, "vllm", why)
    options = {"basis": basis, "ray_cluster": inst.get("ray_cluster")}
    if overhead_mib is not None:
        options["overhead_mib"] = overhead_mib
    if min_headroom_mib is not None:
        options["min_headroom_mib"] = min_headroom_mib
    plan = plan_vllm_cluster(model, nodes, settings, name=name, **options)
    plan["planned"] = True
    return plan


def plan_instances(instances, gpus, overhead_mib=None, min_headroom_mib=None, basis="free",
                   summarize_vllm=vllm_model_summary, read_gguf=None, host_memory_mib=None):
    """The serving_plan module's work: one plan per instance. `instances`: dicts with name, engine, gpus
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
        names = [check_instance(inst, n) for n, inst in enumerate(instances or [])]
    except InputError as exc:
        raise PlanError(str(exc)) from None
    by_index = dict((str(g.get("index")), g) for g in (gpus or []))
    plans, messages, refusals = {}, [], []
    for n, inst in enumerate(instances or []):
        name = names[n]
        try:
            _plan_one(inst, name, gpus, by_index, plans, messages, refusals, overhead_mib, min_headroom_mib,
                      basis, summarize_vllm, read_gguf, host_memory_mib)
        except InputError as exc:
            raise PlanError(str(exc)) from None
        except (TypeError, ValueError, KeyError, AttributeError, IndexError, ZeroDivisionError,
                OverflowError) as exc:
            if isinstance(exc, PlanError):
                raise
            # a model summary or setting of a shape nothing above foresaw: one line naming the instance
            raise PlanError("instance %s: cannot plan with the model and settings given (%s: %s); give "
                            "gguf_info's result as model (or model_path / model_dir) and the engine's "
                            "settings"
                            % (name, type(exc).__name__, str(exc)[:200])) from None
    return plans, messages, refusals


def _plan_one(inst, name, gpus, by_index, plans, messages, refusals, overhead_mib, min_headroom_mib, basis,
              summarize_vllm, read_gguf, host_memory_mib):
    """plan_instances' work for one instance (its plan, message and refusal appended)."""
    engine = str(inst.get("engine") or "llama.cpp").lower()
    model = inst.get("model")
    unknown = _model_not_on_node(inst, engine)
    if unknown:
        # A check-mode first run, or a model the model role does not manage yet: nothing to plan from.
        plans[name] = {"name": name, "engine": engine, "fits": None, "planned": False, "refusal": None,
                       "message": "%s: not planned: %s" % (name, unknown)}
        messages.append(plans[name]["message"])
        return
    if engine != "vllm" and not isinstance(model, dict) and inst.get("model_path"):
        if read_gguf is None:
            raise PlanError("instance %s: model_path given but no GGUF reader" % name)
        model = read_gguf(inst["model_path"])
    settings = inst.get("settings") or {}
    if engine == "vllm" and inst.get("nodes") is not None:
        plan = _plan_cluster_instance(inst, name, model, settings, summarize_vllm, overhead_mib,
                                      min_headroom_mib, basis)
        plans[name] = plan
        messages.append(plan["message"])
        if plan.get("refusal"):
            refusals.append(plan["refusal"])
        return
    indexes = inst.get("gpus")
    if indexes is None or indexes == []:
        indexes = [g.get("index") for g in (gpus or [])]
    if engine != "vllm" and (not indexes or _int(settings, "n_gpu_layers", -1) == 0):
        if not isinstance(model, dict):
            raise PlanError("instance %s: model must be gguf_info's result (a dict) or model_path" % name)
        check_model_numbers(model, name)
        options = {} if min_headroom_mib is None else {"min_headroom_mib": min_headroom_mib}
        plan = plan_llama_cpp_host(model, settings, name=name, host_memory_mib=host_memory_mib, **options)
        plan["planned"] = True
        plans[name] = plan
        messages.append(plan["message"])
        if plan["refusal"]:
            refusals.append(plan["refusal"])
        return
    if not isinstance(indexes, list):
        indexes = [indexes]
    missing = [str(i) for i in indexes if str(i) not in by_index]
    if missing:
        raise PlanError("instance %s uses GPU(s) %s that llmops_gpus does not list (it has %s)"
                        % (name, ", ".join(missing), ", ".join(sorted(by_index)) or "none"))
    chosen = [by_index[str(i)] for i in indexes]
    others = [g for g in (gpus or []) if g not in chosen]
    if engine == "vllm":
        model, why = _vllm_model(name, model, inst, summarize_vllm)
        if why:
            plans[name] = _not_planned(name, engine, why)
            messages.append(plans[name]["message"])
            return
    if not isinstance(model, dict):
        raise PlanError("instance %s: model must be gguf_info's result (a dict)" % name)
    check_model_numbers(model, name)
    options = {"other_gpus": others, "basis": basis}
    if overhead_mib is not None:
        options["overhead_mib"] = overhead_mib
    if min_headroom_mib is not None:
        options["min_headroom_mib"] = min_headroom_mib
    plan = plan_instance(engine, model, chosen, settings, name=name, **options)
    plan["planned"] = True
    plans[name] = plan
    messages.append(plan["message"])
    if plan["refusal"]:
        refusals.append(plan["refusal"])

