# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""What llama-server says it allocated: parse its start-up log (`-lv 4`, the INFO lines) into bytes per
category and per device, the same categories the memory planner predicts.

    parse(text) -> {
        "devices": {"CPU": {category: bytes}, "CUDA0": {...}, ...},
        "totals": {category: bytes, ..., "total": bytes},
        "buffers": [(context, category, buffer name, bytes), ...],   # every line, in order
        "contexts": [{"role": "main"|"draft", "params": {...}, "kv": {...}, "recurrent": {...}}, ...],
    }

Categories: weights (load_tensors model buffers: CPU_Mapped, CPU_REPACK, CUDA0...), kv (llama_kv_cache KV
buffers), recurrent (llama_memory_recurrent RS buffers), compute (sched_reserve compute buffers), output
(llama_context output buffer), and draft_kv, draft_recurrent, draft_compute, draft_output for the context
created after `creating MTP draft context` (or any later context: a separate draft model's).

Buffer names map to devices: CUDA0/CUDA0_Split -> CUDA0; CPU, CPU_Mapped, CPU_REPACK and pinned host
buffers (CUDA_Host) -> CPU (host memory). Sizes are printed in MiB with two decimals, so each line is exact
to about 5 KiB. A context's compute buffer can be reserved again later (the server re-reserves the draft
context for backend sampling): the largest size per device counts, as the scheduler keeps the larger
buffer.
"""
import re

MIB = 1024 * 1024
CATEGORIES = ("weights", "kv", "recurrent", "compute", "output",
              "draft_kv", "draft_recurrent", "draft_compute", "draft_output")

_NUM = r"([0-9]+(?:\.[0-9]+)?)"
_BUFFER_LINES = (
    ("weights", re.compile(r"load_tensors:\s+(\S+) model buffer size =\s*" + _NUM + " MiB")),
    ("kv", re.compile(r"llama_kv_cache:\s+(\S+) KV buffer size =\s*" + _NUM + " MiB")),
    ("recurrent", re.compile(r"llama_memory_recurrent:\s+(\S+) RS buffer size =\s*" + _NUM + " MiB")),
    ("compute", re.compile(r"sched_reserve:\s+(\S+) compute buffer size =\s*" + _NUM + " MiB")),
    ("output", re.compile(r"llama_context:\s+(\S+)\s+output buffer size =\s*" + _NUM + " MiB")),
)
_NEW_CONTEXT = re.compile(r"llama_context: constructing llama_context")
_DRAFT_NEXT = re.compile(r"creating MTP draft context")
_CONTEXT_PARAM = re.compile(r"llama_context: (n_seq_max|n_ctx|n_ctx_seq|n_batch|n_ubatch|flash_attn|"
                            r"kv_unified|n_rs_seq|n_outputs_max)\s+= (\S+)")
_KV_SIZE = re.compile(r"llama_kv_cache: size =\s*" + _NUM + r" MiB \(\s*(\d+) cells,\s*(\d+) layers,"
                      r"\s*(\d+)/(\d+) seqs\), K \((\w+)\):\s*" + _NUM
                      + r" MiB, V \((\w+)\):\s*" + _NUM + " MiB")
_RS_SIZE = re.compile(r"llama_memory_recurrent: size =\s*" + _NUM + r" MiB \(\s*(\d+) cells,\s*(\d+) layers,"
                      r"\s*(\d+) seqs\s+(\d+) rs_seq\)")
_ALL_ON_CPU = re.compile(r"^(CPU|.*_Host)(_.*)?$")


def device_of(buffer_name):
    """The device whose memory a buffer lives in: 'CPU' for host memory, else the GPU's name (CUDA0)."""
    if _ALL_ON_CPU.match(buffer_name):
        return "CPU"
    return buffer_name.split("_")[0]


def _mib(text):
    return int(round(float(text) * MIB))


def parse(text):
    """Parse a llama-server log (str). Lines of other programs or levels are ignored."""
    buffers = []
    contexts = []
    draft_pending = False
    compute = {}  # (context index, device) -> largest compute buffer
    for line in text.splitlines():
        if _DRAFT_NEXT.search(line):
            draft_pending = True
            continue
        if _NEW_CONTEXT.search(line):
            role = "draft" if (draft_pending or contexts) else "main"
            contexts.append({"role": role, "params": {}, "kv": {}, "recurrent": {}})
            draft_pending = False
            continue
        ctx = contexts[-1] if contexts else None
        m = _CONTEXT_PARAM.search(line)
        if m and ctx is not None:
            value = m.group(2)
            ctx["params"][m.group(1)] = int(value) if value.isdigit() else value
            continue
        m = _KV_SIZE.search(line)
        if m and ctx is not None:
            ctx["kv"] = {"bytes": _mib(m.group(1)), "cells": int(m.group(2)), "layers": int(m.group(3)),
                         "seqs": int(m.group(4)), "streams": int(m.group(5)), "type_k": m.group(6),
                         "type_v": m.group(8)}
            continue
        m = _RS_SIZE.search(line)
        if m and ctx is not None:
            ctx["recurrent"] = {"bytes": _mib(m.group(1)), "cells": int(m.group(2)),
                                "layers": int(m.group(3)), "seqs": int(m.group(4)), "rs_seq": int(m.group(5))}
            continue
        for category, pattern in _BUFFER_LINES:
            m = pattern.search(line)
            if not m:
                continue
            name, size = m.group(1), _mib(m.group(2))
            if category == "weights":
                buffers.append((None, "weights", name, size))
                break
            if ctx is None:
                break
            index = len(contexts) - 1
            if category == "compute":
                key = (index, device_of(name))
                if key in compute:
                    previous = compute[key]
                    buffers[previous] = buffers[previous][:3] + (max(buffers[previous][3], size),)
                    break
                compute[key] = len(buffers)
            buffers.append((index, category, name, size))
            break
    return _sum(buffers, contexts)


def _sum(buffers, contexts):
    devices = {}
    totals = dict((c, 0) for c in CATEGORIES)
    out_buffers = []
    for index, category, name, size in buffers:
        if index is not None and contexts[index]["role"] == "draft":
            category = "draft_" + category
        device = devices.setdefault(device_of(name), dict((c, 0) for c in CATEGORIES))
        device[category] += size
        totals[category] += size
        out_buffers.append((index, category, name, size))
    for device in devices.values():
        device["total"] = sum(device[c] for c in CATEGORIES)
    totals["total"] = sum(totals[c] for c in CATEGORIES)
    return {"devices": devices, "totals": totals, "buffers": out_buffers, "contexts": contexts}


def allocated(text):
    """True once the log shows the server's buffers are all allocated (it is about to listen, or does)."""
    return "llama_server: model loaded" in text or "listening on http" in text
