# -*- coding: utf-8 -*-
# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
# PRIVATE to llmops.serving: it can change at any time; do not import it from other collections.
"""The header of a safetensors file, checked as the safetensors library checks it, and the vLLM model summary
of a model directory (config.json + its shards) that the memory planner reads.

The format: an unsigned 64-bit little-endian length N, N bytes of JSON (an object: tensor name ->
``{"dtype", "shape", "data_offsets": [begin, end]}``, plus an optional ``"__metadata__"`` of strings), then
the tensor data. The checks (safetensors' ``Metadata::validate``): N within ``max_header_bytes`` and the file,
every dtype known, every shape a list of non-negative integers, each tensor's byte count equal to its
shape's product times its dtype's size, the tensors back to back from offset 0 without gap or overlap, and
the last one ending exactly at the end of the file (a truncated download is caught without hashing). Only the
8-byte length and the header are read, never the tensor data.

Plain Python 3.6, standard library only; importable without Ansible.
"""
from __future__ import absolute_import, division, print_function

import json
import os
import stat
import struct

from ansible_collections.llmops.serving.plugins.module_utils._files import local_read

__metaclass__ = type

MIB = 1 << 20
# safetensors itself refuses headers over 100,000,000 bytes; a real model's are a few hundred KB to a few MB.
MAX_HEADER_BYTES = 16 * MIB
# config.json is a few KB; model.safetensors.index.json lists every tensor (DeepSeek-V3's: 91k tensors, 9 MB).
CONFIG_MAX_BYTES = 4 * MIB
INDEX_MAX_BYTES = 64 * MIB
INDEX_NAME = "model.safetensors.index.json"
MAX_DIMS = 8
# dtype -> bits per element (safetensors' Dtype, sub-byte float types included)
DTYPE_BITS = {
    "BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8, "F4": 4, "F6_E2M3": 6,
    "F6_E3M2": 6, "I16": 16, "U16": 16, "F16": 16, "BF16": 16, "I32": 32, "U32": 32, "F32": 32, "C64": 64,
    "F64": 64, "I64": 64, "U64": 64,
}


class SafetensorsError(Exception):
    """A header that is not a valid safetensors header; the message names the file and what is wrong."""


def header_length(first8, file_size, name, max_header_bytes=MAX_HEADER_BYTES):
    """N from the first 8 bytes, checked against the limit and the file size."""
    if len(first8) < 8:
        raise SafetensorsError("%s: %d bytes, too short for a safetensors file (8-byte header length)"
                               % (name, len(first8)))
    n = struct.unpack("<Q", first8[:8])[0]
    if n > max_header_bytes:
        raise SafetensorsError("%s: header length %d is over the limit of %d bytes (not a safetensors file, "
                               "or crafted)" % (name, n, max_header_bytes))
    if file_size is not None and 8 + n > file_size:
        raise SafetensorsError("%s: header length %d runs past the end of the %d-byte file (truncated?)"
                               % (name, n, file_size))
    return n


def _elements(shape, name, tensor):
    if not isinstance(shape, list) or len(shape) > MAX_DIMS:
        raise SafetensorsError("%s: tensor %s: shape %r is not a list of at most %d dimensions"
                               % (name, tensor, shape, MAX_DIMS))
    count = 1
    for d in shape:
        if not isinstance(d, int) or isinstance(d, bool) or d < 0:
            raise SafetensorsError("%s: tensor %s: dimension %r is not a non-negative integer"
                                   % (name, tensor, d))
        count *= d
    return count


def parse_header(raw, file_size, name):
    """The summary of a header (the N bytes after the length): header_bytes, tensor_count, tensor_bytes,
    dtypes ({dtype: bytes}), metadata. Raises SafetensorsError, naming the file and the tensor."""
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError, UnicodeDecodeError):
        raise SafetensorsError("%s: the header is not JSON text" % name) from None
    if not isinstance(doc, dict):
        raise SafetensorsError("%s: the header is not a JSON object" % name)
    meta = doc.pop("__metadata__", {})
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise SafetensorsError("%s: __metadata__ is not an object of strings" % name)
    spans = []
    dtypes = {}
    for tensor, info in doc.items():
        if not isinstance(info, dict):
            raise SafetensorsError("%s: tensor %s: not an object" % (name, tensor))
        dtype = info.get("dtype")
        if dtype not in DTYPE_BITS:
            raise SafetensorsError("%s: tensor %s: unknown dtype %r" % (name, tensor, dtype))
        offsets = info.get("data_offsets")
        if not (isinstance(offsets, list) and len(offsets) == 2
                and all(isinstance(x, int) and not isinstance(x, bool) for x in offsets)
                and 0 <= offsets[0] <= offsets[1]):
            raise SafetensorsError("%s: tensor %s: data_offsets %r are not [begin, end]"
                                   % (name, tensor, offsets))
        bits = _elements(info.get("shape"), name, tensor) * DTYPE_BITS[dtype]
        if bits % 8 or bits // 8 != offsets[1] - offsets[0]:
            raise SafetensorsError("%s: tensor %s: %s %s takes %s bytes, data_offsets say %d"
                                   % (name, tensor, dtype, info.get("shape"),
                                      "%d bits, not whole" % bits if bits % 8 else bits // 8,
                                      offsets[1] - offsets[0]))
        spans.append((offsets[0], offsets[1], tensor))
        dtypes[dtype] = dtypes.get(dtype, 0) + offsets[1] - offsets[0]
    spans.sort()
    end = 0
    for begin, stop, tensor in spans:
        if begin != end:
            raise SafetensorsError("%s: tensor %s starts at %d, the previous one ends at %d (a gap or an "
                                   "overlap)" % (name, tensor, begin, end))
        end = stop
    data = None if file_size is None else file_size - 8 - len(raw)
    if data is not None and end != data:
        raise SafetensorsError("%s: the tensors end at byte %d of the data, the file holds %d data bytes "
                               "(truncated or padded download?)" % (name, end, data))
    return {"header_bytes": len(raw), "tensor_count": len(spans), "tensor_bytes": end, "dtypes": dtypes,
            "metadata": meta}


def read_local(path, max_header_bytes=MAX_HEADER_BYTES):
    """parse_header() of a local file (opened without following a link, never a FIFO), plus its size."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise SafetensorsError("%s is not a regular file" % path)
        n = header_length(os.pread(fd, 8, 0), st.st_size, path, max_header_bytes)
        raw = os.pread(fd, n, 8)
        if len(raw) != n:
            raise SafetensorsError("%s: header cut short (%d of %d bytes)" % (path, len(raw), n))
    finally:
        os.close(fd)
    out = parse_header(raw, st.st_size, path)
    out["size"] = st.st_size
    return out


def is_weights(name):
    """What vLLM and the planner count as weights: the model directory's top-level *.safetensors."""
    return "/" not in name and name.endswith(".safetensors")


def index_shards(doc, where):
    """The shard names of a parsed ``model.safetensors.index.json`` (the values of its ``weight_map``),
    sorted; SafetensorsError when it is not an index of top-level *.safetensors shards."""
    weight_map = doc.get("weight_map") if isinstance(doc, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise SafetensorsError("%s has no weight_map (tensor name -> shard file): not a safetensors index"
                               % where)
    shards = set()
    for tensor, shard in weight_map.items():
        if not isinstance(shard, str) or not is_weights(shard):
            raise SafetensorsError("%s: tensor %s is in %r, not a *.safetensors file of the model directory"
                                   % (where, str(tensor)[:200], shard if not isinstance(shard, str)
                                      else shard[:200]))
        shards.add(shard)
    return sorted(shards)


def select_weights(names, index_doc, where):
    """(the weight files vLLM loads, what the summary says of them) among the directory's top-level
    ``names``. vLLM (weight_utils.filter_duplicate_safetensors_files) loads only the shards
    ``model.safetensors.index.json`` names when there is one: a consolidated copy beside the shards (Mistral's
    ``consolidated.safetensors``) is not loaded, so it is not counted; every shard the index names must be
    there. Without an index every top-level *.safetensors is loaded and counted."""
    weights = sorted(n for n in names if is_weights(n))
    if index_doc is None:
        return weights, {"weights_index": None, "weights_files": weights, "weights_ignored": []}
    named = index_shards(index_doc, where)
    present = set(names)
    missing = [n for n in named if n not in present]
    if missing:
        raise SafetensorsError("%s names %d shard(s) the model does not have: %s. An incomplete download: "
                               "fetch the model again (model_snapshot), or select every shard with the "
                               "patterns" % (where, len(missing), ", ".join(missing[:10])
                                             + (" ..." if len(missing) > 10 else "")))
    return named, {"weights_index": INDEX_NAME, "weights_files": named,
                   "weights_ignored": [n for n in weights if n not in set(named)]}


def local_model(model_dir):
    """(config.json parsed, the weight files, select_weights()'s note) of a local model directory: the
    config and the index read with local_read's bounds (regular files only, never a link, FIFO or device,
    at most CONFIG_MAX_BYTES / INDEX_MAX_BYTES)."""
    try:
        names = os.listdir(model_dir)
    except OSError as exc:
        raise local_read.LocalReadError("cannot read the model directory %s: %s"
                                        % (model_dir, exc.strerror or exc), exc.errno) from None
    config = local_read.read_json(os.path.join(model_dir, "config.json"), CONFIG_MAX_BYTES,
                                  "the model's config.json")
    index = None
    if INDEX_NAME in names:
        path = os.path.join(model_dir, INDEX_NAME)
        index = local_read.read_json(path, INDEX_MAX_BYTES, "the model's shard index")
        index = index if index is not None else {}
        where = path
    else:
        where = model_dir
    files, note = select_weights(names, index, where)
    return config, files, note


def local_summary(model_dir, vllm_summary):
    """(the vLLM summary, per-shard header summaries) of a local model directory: config.json and the header
    of every weight file vLLM loads (select_weights) checked; ``vllm_summary``: memory_plan_vllm's."""
    config, files, note = local_model(model_dir)
    shards = []
    for name in files:
        info = read_local(os.path.join(model_dir, name))
        info["name"] = name
        shards.append(info)
    summary = vllm_summary(config, sum(s["size"] for s in shards), model_dir,
                           os.path.join(model_dir, "config.json"), note)
    return summary, shards
