# -*- coding: utf-8 -*-
# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
# PRIVATE to llmops.serving: it can change at any time; do not import it from other collections.
"""The memory planner's llama.cpp engine: what a llama-server instance allocates, per GPU and in host memory.

The rules are the pinned llama.cpp's own (src/llama-hparams.cpp, llama-kv-cache.cpp,
llama-memory-recurrent.cpp, llama-context.cpp, llama-model.cpp, common/speculative.cpp); each function
names what it mirrors. The model is gguf_info's summary (plugins/module_utils/_model_format/gguf.py
summarize()). The
draft context's cache types are the command line's (llama_cpp_spec.py, shared with the flag table).

The planner engines.LLAMA_CPP names (plan.PLANNERS; plan.py lists what a planner module provides).
Plain Python 3.6, standard library only, importable without Ansible.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import math
import os

from ansible_collections.llmops.serving.plugins.module_utils import engines
from ansible_collections.llmops.serving.plugins.module_utils._memory_plan.checks import (
    MAX_PARALLEL,
    check_llama_settings,
    check_model_numbers,
)
from ansible_collections.llmops.serving.plugins.module_utils._memory_plan.common import (
    MIB,
    PlanError,
    bool_setting,
    chosen_gpus,
    gpu_budget_mib,
    instance_gpu_indexes,
    int_setting,
    mib_text,
    plan_options,
)
from ansible_collections.llmops.serving.plugins.module_utils._memory_plan.llama_cpp_spec import (
    DEFAULT_CACHE_TYPE,
    draft_cache_types,
    spec_types,
)

ENGINE = engines.LLAMA_CPP.name
# The instance's settings in range (plan.settings_check).
check_settings = check_llama_settings

# CUDA context + cuBLAS workspace + the CUDA runtime's own allocations per GPU, which no llama.cpp log line
# counts (nvidia-smi shows them). Measured on Ada/Hopper with CUDA 12: 300-600 MiB per process and GPU.
DEFAULT_OVERHEAD_MIB = 512
# What must stay free on each GPU after the plan (fragmentation, a graph re-reserve, other small users).
DEFAULT_MIN_HEADROOM_MIB = 1024

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


def _per_layer(value, il, default=None):
    """A gguf_info field that is a scalar or a per-layer list."""
    if isinstance(value, list):
        return value[il] if il < len(value) and value[il] is not None else default
    return default if value is None else value


def llama_settings(model, settings):
    """The instance settings resolved the way llama_context resolves them (llama-context.cpp constructor)."""
    settings = dict(settings or {})
    parallel = int_setting(settings, "parallel", -1)
    unified = settings.get("kv_unified")
    if parallel < 1:
        parallel = AUTO_PARALLEL
        unified = True if unified is None else unified
    unified = bool_setting(unified) if unified is not None else False
    ctx = int_setting(settings, "ctx_size", 0) or int(model.get("context_length") or 0)
    if ctx < 1:
        raise PlanError("ctx_size is not set and the model has no context_length")
    ctx = _pad(ctx, CTX_PAD)
    if unified:
        ctx_seq = ctx
    else:
        ctx_seq = _pad(ctx // parallel, CTX_PAD)
        ctx = ctx_seq * parallel
    batch = min(ctx, int_setting(settings, "batch_size", DEFAULT_BATCH))
    ubatch = min(batch, int_setting(settings, "ubatch_size", DEFAULT_UBATCH) or batch)
    types = spec_types(settings)
    n_draft = int_setting(settings, "spec_draft_n_max", DEFAULT_DRAFT_N_MAX) if types else 0
    type_k = str(settings.get("cache_type_k") or DEFAULT_CACHE_TYPE).lower()
    type_v = str(settings.get("cache_type_v") or DEFAULT_CACHE_TYPE).lower()
    # the draft context's cache types as the serving role renders them (-ctkd/-ctvd)
    draft_k, draft_v = draft_cache_types(settings)
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
        "draft_type_k": draft_k, "draft_type_v": draft_v,
        # auto resolves to enabled on every backend the planner targets (CPU, CUDA)
        "flash_attn": flash != "off",
        "spec_types": types, "n_draft": n_draft,
        "mtp": any(t in DRAFT_CONTEXT_SPEC_TYPES for t in types),
        # llama_context n_rs_seq: recurrent states kept per sequence for partial rollback of drafts
        "n_rs_seq": n_draft if any(t in RS_ROLLBACK_SPEC_TYPES for t in types) else 0,
        # server_output_limits: n_parallel x (1 + draft) outputs per batch, at most n_batch
        "n_outputs_max": max(1, min(batch, parallel * (1 + n_draft))),
        # common.h: sampling.backend_sampling (-bs, default off); speculative draft.backend_sampling (on)
        "backend_sampling": bool_setting(settings.get("backend_sampling") or False),
        "draft_backend_sampling": bool_setting(settings.get("spec_draft_backend_sampling", True)),
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


def _placement_positions(model, s, settings, gpus, fractions):
    n_layer_all = len(_layer_kinds(model))
    ngl = settings.get("n_gpu_layers")
    # -ngl auto / all offload everything (auto lets llama.cpp's fit step lower it; the plan shows whether
    # that is needed)
    n_gpu_layers = -1 if str(ngl).lower() in ("auto", "all") else int_setting(settings, "n_gpu_layers", -1)
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
            and not bool_setting(settings.get("no_kv_offload") or False)
            and not settings.get("override_tensor") and not bool_setting(settings.get("cpu_moe") or False)
            and not settings.get("n_cpu_moe"))


def _pipeline_copies_bytes(model, s, settings, layers_on, pos):
    """With pipeline parallelism ggml_backend_sched_new gets n_copies = GGML_SCHED_MAX_COPIES (4 unless the
    build sets it; setting sched_max_copies) and ggml_backend_sched_split_graph (ggml/src/ggml-backend.cpp)
    makes that many copies of every graph input and every split input on the device that reads it, flagged
    input and output so ggml-alloc never frees or reuses them. The compute buffer is not copied whole: per GPU
    it holds copies x the KQ mask (instead of one that the layers reuse) and copies x the activations entering
    from the previous GPU (n_embd x n_ubatch F32)."""
    copies = int_setting(settings, "sched_max_copies", DEFAULT_SCHED_COPIES)
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
        budget = gpu_budget_mib(gpu, basis)
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
        budget = (gpu_budget_mib(gpu, basis) - int(overhead_mib) - int(min_headroom_mib)) * MIB - fixed
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
        "name": name, "engine": ENGINE, "fits": fits,
        "ctx_size": s["ctx_size"], "parallel": s["parallel"], "kv_unified": s["kv_unified"],
        "tensor_split": fractions if len(gpus) > 1 else None, "tensor_split_derived": derived,
        "host": host, "gpus": rows,
        "pipeline_parallel": any(r.get("pipeline_copies") for r in rows),
        "total_bytes": sum(r["total"] for r in rows),
        "max_ctx_size": max_ctx, "max_parallel": max_parallel,
        "warnings": context_warnings(model, s, name),
    }
    plan["message"] = "%s: %s; host %s" % (name, ", ".join(
        "GPU %s %s used, %s headroom" % (r["index"], mib_text(r["total"]),
                                         "{:,} MiB".format(r["headroom_mib"]))
        for r in rows), mib_text(host["total"]))
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
        "name": name, "engine": ENGINE, "fits": fits, "device": "host",
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
        name, mib_text(host["total"]),
        "" if headroom is None else ", {:,} MiB headroom of {:,} MiB".format(headroom, int(host_memory_mib)))
    plan["refusal"] = None
    if fits is False:
        if plan["max_ctx_size"]:
            plan["suggestions"].append({"settings": {"ctx_size": plan["max_ctx_size"]},
                                        "text": "ctx_size %d" % plan["max_ctx_size"]})
        short = "{:,} MiB".format(int(min_headroom_mib) - headroom)
        plan["refusal"] = "instance %s does not fit in host memory: needs %s plus %s headroom, the node " \
            "has %s: short by %s" % (name, mib_text(host["total"]), "{:,} MiB".format(int(min_headroom_mib)),
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
        r["index"], r.get("name") or "?", mib_text(r["total"]), "{:,} MiB".format(int(min_headroom_mib)),
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
# The engine's part of memory_plan.plan_instances


def plan(model, gpus, settings, name="instance", **options):
    """memory_plan.plan_instance's entry: plan_llama_cpp."""
    return plan_llama_cpp(model, gpus, settings, name=name, **options)


def model_not_on_node(inst):
    """Why the instance's GGUF cannot be read on this node (None when it can or is given as metadata)."""
    if isinstance(inst.get("model"), dict):
        return None
    path = inst.get("model_path")
    if path and not os.path.exists(path):
        return "%s is not on the node yet" % path
    return None


def plan_entry(inst, name, node):
    """One instance of memory_plan.plan_instances (`node`: what it knows of the host). With no GPUs (none
    given and none on the host) or n_gpu_layers 0 the instance runs on the CPU: planned in host memory."""
    model = inst.get("model")
    if not isinstance(model, dict) and inst.get("model_path"):
        if node.get("read_gguf") is None:
            raise PlanError("instance %s: model_path given but no GGUF reader" % name)
        model = node["read_gguf"](inst["model_path"])
    settings = inst.get("settings") or {}
    indexes = instance_gpu_indexes(inst, node["gpus"])
    if not indexes or int_setting(settings, "n_gpu_layers", -1) == 0:
        if not isinstance(model, dict):
            raise PlanError("instance %s: model must be gguf_info's result (a dict) or model_path" % name)
        check_model_numbers(model, name)
        headroom = node.get("min_headroom_mib")
        options = {} if headroom is None else {"min_headroom_mib": headroom}
        return plan_llama_cpp_host(model, settings, name=name, host_memory_mib=node.get("host_memory_mib"),
                                   **options)
    chosen, others = chosen_gpus(name, indexes, node["gpus"])
    if not isinstance(model, dict):
        raise PlanError("instance %s: model must be gguf_info's result (a dict)" % name)
    check_model_numbers(model, name)
    return plan_llama_cpp(model, chosen, settings, name=name,
                          **plan_options(node, other_gpus=others, basis=node["basis"]))
