# -*- coding: utf-8 -*-
# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
# PRIVATE to llmops.serving: it can change at any time; do not import it from other collections.
"""GGUF structure check and model summary for llmops.serving.gguf_info.

Reads ONLY the header, the key/value metadata and the tensor table of a GGUF file (never tensor data), with
every read bounded by hard limits and by the file size, and checks the structure the way llama.cpp's
gguf.cpp does: magic, version 2/3, counts, string/array lengths, value and tensor types, dimensions,
alignment, tensor offsets (in order, aligned, no overlap, no gap) and that the data section ends exactly
where the file ends (a truncated download is caught without hashing). Anything wrong raises GGUFError with
what is wrong and the byte offset where it was found; crafted files never crash, hang or allocate much.

Plain Python 3.6, standard library only, importable without Ansible.
"""

from __future__ import absolute_import, division, print_function

import math
import os
import re
import struct
import sys
import time

from ansible_collections.llmops.serving.plugins.module_utils._files import identity as file_identity
from ansible_collections.llmops.serving.plugins.module_utils._model_format.chat_template import (
    chat_template_risks,
)
from ansible_collections.llmops.serving.plugins.module_utils.validators import matches, whole

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
GGML_MAX_NAME = 64        # llama.cpp: tensor names must be shorter than this
LLAMA_MAX_LAYERS = 512    # llama.cpp src/llama-hparams.h: the most blocks a model it loads can have
INT64_MAX = (1 << 63) - 1
# What summarize() computes from a header, as a version: role model reuses a header recorded by a past run
# (llmops_models in the fact cache) only when it was computed by this version. Bump it with any change to
# what summarize(), chat_template_risks(), layer_layout() or DEFAULT_LIMITS make of the same bytes.
SUMMARY_VERSION = 1

# Hard limits, all configurable. llama.cpp's own caps are far higher (1 GiB strings, 2^30 elements); these
# are sane for real models: a 671B MoE has < 2000 tensors and ~60 keys; a 256k vocab is < 2^18 tokens. The
# metadata budgets bound the whole header at once: the largest real tokenizer metadata (gemma-4's vocab
# file) is 15.8 MB with 777k strings, and llama.cpp loads at most LLAMA_MAX_LAYERS blocks.
DEFAULT_LIMITS = {
    "max_tensors": 65536,
    "max_kv": 65536,
    "max_string_bytes": 16 * 1024 * 1024,
    "max_array_elements": 16 * 1024 * 1024,
    "max_dims": 4,
    "max_block_count": 4096,
    "max_metadata_bytes": 64 * 1024 * 1024,
    "max_metadata_strings": 2 * 1024 * 1024,
}

# Smallest possible encodings, used to refuse counts the rest of the file cannot hold before reading them:
# a key/value pair is a key length, a key of >= 1 byte, a value type and a value of >= 1 byte; a tensor info
# is a name length (the name may be empty), a dimension count, a type and an offset.
MIN_KV_BYTES = 8 + 1 + 4 + 1
MIN_TENSOR_INFO_BYTES = 8 + 4 + 4 + 8

# What keeping parsed metadata costs in memory, charged to max_metadata_bytes: Python objects are several
# times larger than their encoding in the file (a float32 takes 4 bytes there, a list slot and a float object
# here), so the budget counts them at this price rather than at their size in the file. Strings are charged
# at their decoded size (one character outside the BMP makes every character of a str take 4 bytes).
KV_COST = 200             # dict slot, (type, value) tuple, small value object
ELEMENT_COST = 40         # list slot + int/float object of a kept array element
TENSOR_COST = 600         # the tensor dict, its shape list and ints

# GGUF metadata value types: id -> (name, struct format or None).
T_UINT8, T_INT8, T_UINT16, T_INT16, T_UINT32, T_INT32, T_FLOAT32, T_BOOL = 0, 1, 2, 3, 4, 5, 6, 7
T_STRING, T_ARRAY, T_UINT64, T_INT64, T_FLOAT64 = 8, 9, 10, 11, 12
VALUE_TYPES = {
    T_UINT8: ("uint8", "<B"), T_INT8: ("int8", "<b"), T_UINT16: ("uint16", "<H"), T_INT16: ("int16", "<h"),
    T_UINT32: ("uint32", "<I"), T_INT32: ("int32", "<i"), T_FLOAT32: ("float32", "<f"),
    T_BOOL: ("bool", "<B"),
    T_STRING: ("string", None), T_ARRAY: ("array", None),
    T_UINT64: ("uint64", "<Q"), T_INT64: ("int64", "<q"), T_FLOAT64: ("float64", "<d"),
}
INTEGER_TYPES = (T_UINT8, T_INT8, T_UINT16, T_INT16, T_UINT32, T_INT32, T_UINT64, T_INT64)

# ggml tensor types: id -> (name, block size in elements, bytes per block). Ids missing here were removed
# from ggml (Q4_2, Q4_3, the Q4_0_4_4 repacks...) and are invalid in files. Source: ggml/include/ggml.h and
# gguf-py GGML_QUANT_SIZES of the pinned llama.cpp.
GGML_TYPES = {
    0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20),
    6: ("Q5_0", 32, 22), 7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 9: ("Q8_1", 32, 36),
    10: ("Q2_K", 256, 84), 11: ("Q3_K", 256, 110), 12: ("Q4_K", 256, 144), 13: ("Q5_K", 256, 176),
    14: ("Q6_K", 256, 210), 15: ("Q8_K", 256, 292), 16: ("IQ2_XXS", 256, 66), 17: ("IQ2_XS", 256, 74),
    18: ("IQ3_XXS", 256, 98), 19: ("IQ1_S", 256, 50), 20: ("IQ4_NL", 32, 18), 21: ("IQ3_S", 256, 110),
    22: ("IQ2_S", 256, 82), 23: ("IQ4_XS", 256, 136), 24: ("I8", 1, 1), 25: ("I16", 1, 2),
    26: ("I32", 1, 4), 27: ("I64", 1, 8), 28: ("F64", 1, 8), 29: ("IQ1_M", 256, 56), 30: ("BF16", 1, 2),
    34: ("TQ1_0", 256, 54), 35: ("TQ2_0", 256, 66), 39: ("MXFP4", 32, 17), 40: ("NVFP4", 64, 36),
    41: ("Q1_0", 128, 18), 42: ("Q2_0", 64, 18),
}

# general.file_type (llama_ftype in include/llama.h) -> name.
FILE_TYPES = {
    0: "ALL_F32", 1: "MOSTLY_F16", 2: "MOSTLY_Q4_0", 3: "MOSTLY_Q4_1", 4: "MOSTLY_Q4_1_SOME_F16",
    7: "MOSTLY_Q8_0", 8: "MOSTLY_Q5_0", 9: "MOSTLY_Q5_1", 10: "MOSTLY_Q2_K", 11: "MOSTLY_Q3_K_S",
    12: "MOSTLY_Q3_K_M", 13: "MOSTLY_Q3_K_L", 14: "MOSTLY_Q4_K_S", 15: "MOSTLY_Q4_K_M", 16: "MOSTLY_Q5_K_S",
    17: "MOSTLY_Q5_K_M", 18: "MOSTLY_Q6_K", 19: "MOSTLY_IQ2_XXS", 20: "MOSTLY_IQ2_XS", 21: "MOSTLY_Q2_K_S",
    22: "MOSTLY_IQ3_XS", 23: "MOSTLY_IQ3_XXS", 24: "MOSTLY_IQ1_S", 25: "MOSTLY_IQ4_NL", 26: "MOSTLY_IQ3_S",
    27: "MOSTLY_IQ3_M", 28: "MOSTLY_IQ2_S", 29: "MOSTLY_IQ2_M", 30: "MOSTLY_IQ4_XS", 31: "MOSTLY_IQ1_M",
    32: "MOSTLY_BF16", 36: "MOSTLY_TQ1_0", 37: "MOSTLY_TQ2_0", 38: "MOSTLY_MXFP4_MOE", 39: "MOSTLY_NVFP4",
    40: "MOSTLY_Q1_0", 41: "MOSTLY_Q2_0", 1024: "GUESSED",
}

# Hybrid architectures whose layout follows {arch}.full_attention_interval (default 4 in llama.cpp).
INTERVAL_HYBRIDS = ("qwen3next", "qwen35", "qwen35moe")

SPLIT_RE = whole(r"(?P<prefix>.*)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf")

# Values kept whole in the parsed key/values; longer arrays keep only a head (tokens, merges, scores).
KEEP_NUMERIC_ARRAY = 4096
KEEP_STRING_ARRAY = 64
ARRAY_HEAD = 8

READ_CHUNK = 1024 * 1024


_U64 = struct.Struct("<Q")
_U32 = struct.Struct("<I")


class _Lazy(object):
    """What is being read, formatted only when an error message needs it (the header loops run up to
    ~10^5 times: formatting every description eagerly would double the parse time)."""

    __slots__ = ("fmt", "args")

    def __init__(self, fmt, *args):
        self.fmt = fmt
        self.args = args

    def __str__(self):
        return self.fmt % self.args


_SURROGATE = re.compile(u"[\ud800-\udfff]")


class GGUFError(Exception):
    """The file is not a well-formed GGUF model file. `offset` is the byte where the problem is."""

    def __init__(self, message, offset=None, path=None):
        self.message = message
        self.offset = offset
        self.path = path
        Exception.__init__(self, self._text())

    def _text(self):
        text = self.message
        if self.offset is not None:
            text = "%s (at byte offset %d)" % (text, self.offset)
        if self.path:
            text = "%s: %s" % (self.path, text)
        return text

    def __str__(self):
        return self._text()


class GGUFArray(object):
    """A metadata array: element type, element count, the values (or the first few when long)."""

    def __init__(self, element_type, count, values, complete):
        self.element_type = element_type
        self.count = count
        self.values = values
        self.complete = complete

    def summary(self):
        out = {"type": "array", "element_type": VALUE_TYPES[self.element_type][0], "count": self.count}
        if self.complete and self.count <= KEEP_STRING_ARRAY:
            out["values"] = list(self.values)
        else:
            out["head"] = list(self.values[:ARRAY_HEAD])
        return out

    def __repr__(self):
        return "GGUFArray(%s, %d)" % (VALUE_TYPES[self.element_type][0], self.count)


def _decode(data):
    """GGUF strings are bytes (llama.cpp reads them into std::string without validating UTF-8). Invalid bytes
    are kept as surrogate escapes, so that two keys or tensor names that differ only in invalid bytes stay
    different and byte lengths stay exact; text handed to Ansible is cleaned by _clean()."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return data.decode("utf-8", "surrogateescape")


class _Reader(object):
    """Bounded, buffered sequential reader. Never reads past file_size, never buffers more than it needs, and
    keeps the header's budgets: bytes of metadata (max_metadata_bytes, both its size in the file and the
    memory its kept values take) and strings (max_metadata_strings)."""

    def __init__(self, fileobj, file_size, limits):
        self.f = fileobj
        self.size = file_size
        self.limits = limits
        self.pos = 0
        self.buf = b""
        self.buf_start = 0
        self.meta_limit = limits["max_metadata_bytes"]
        self.memory = 0
        self.strings = 0
        self.last_length = 0  # bytes in the file of the last string read

    def _over_budget(self, end, what, at):
        raise GGUFError("%s would end at byte %d: the metadata is larger than the limit of %d bytes "
                        "(max_metadata_bytes)" % (what, end, self.meta_limit), at)

    def _check_room(self, n, what, doing):
        """Refuse n more bytes past the end of the file or past the metadata budget."""
        if self.pos + n > self.size:
            raise GGUFError(
                "unexpected end of file %s %s: need %d bytes, only %d left of %d (truncated file?)"
                % (doing, what, n, self.size - self.pos, self.size), self.pos)
        if self.pos + n > self.meta_limit:
            self._over_budget(self.pos + n, what, self.pos)

    def _need(self, n, what):
        self._check_room(n, what, "reading")
        rel = self.pos - self.buf_start
        if rel >= 0 and rel + n <= len(self.buf):
            return rel
        want = min(max(n, READ_CHUNK), self.size - self.pos)
        self.f.seek(self.pos)
        data = self.f.read(want)
        if len(data) < n:
            raise GGUFError("short read of %s: file shrank while reading" % what, self.pos)
        self.buf = data
        self.buf_start = self.pos
        return 0

    def room(self, nbytes, what, at):
        """Refuse `what`, which needs at least nbytes more, when the file or the metadata budget cannot hold
        them: a crafted count fails where it is read, before anything is allocated or walked."""
        left = self.size - self.pos
        if nbytes > left:
            raise GGUFError("%s needs at least %d bytes but only %d bytes are left in the file (truncated or "
                            "crafted file?)" % (what, nbytes, left), at)
        if self.pos + nbytes > self.meta_limit:
            self._over_budget(self.pos + nbytes, what, at)

    def charge(self, nbytes, what, at):
        """Count nbytes of memory kept for the parsed header against max_metadata_bytes."""
        self.memory += nbytes
        if self.memory > self.meta_limit:
            raise GGUFError("metadata needs more than %d bytes of memory to keep (limit max_metadata_bytes), "
                            "reached at %s: crafted file?" % (self.meta_limit, what), at)

    def count_strings(self, n, what, at):
        self.strings += n
        if self.strings > self.limits["max_metadata_strings"]:
            limit = self.limits["max_metadata_strings"]
            raise GGUFError("%s brings the metadata to %d strings, over the limit of %d strings "
                            "(max_metadata_strings)" % (what, self.strings, limit), at)

    def unpack(self, fmt, size, what):
        rel = self._need(size, what)
        value = struct.unpack_from(fmt, self.buf, rel)[0]
        self.pos += size
        return value

    def _fixed(self, packer, what):
        """One little-endian integer; the common case (buffered, within budget) checks nothing else."""
        size = packer.size
        rel = self.pos - self.buf_start
        if not (rel >= 0 and rel + size <= len(self.buf) and self.pos + size <= self.meta_limit):
            rel = self._need(size, what)
        self.pos += size
        return packer.unpack_from(self.buf, rel)[0]

    def u32(self, what):
        return self._fixed(_U32, what)

    def u64(self, what):
        return self._fixed(_U64, what)

    def raw(self, n, what):
        rel = self._need(n, what)
        self.pos += n
        return self.buf[rel:rel + n]

    def skip(self, n, what):
        self._check_room(n, what, "skipping")
        self.pos += n

    def string_length(self, what, counted=False):
        start = self.pos
        n = self.u64(_Lazy("length of %s", what))
        if n > self.limits["max_string_bytes"]:
            raise GGUFError("%s is %d bytes long, over the limit of %d bytes"
                            % (what, n, self.limits["max_string_bytes"]), start)
        if self.pos + n > self.size:
            raise GGUFError("%s is %d bytes long but only %d bytes are left in the file (truncated file?)"
                            % (what, n, self.size - self.pos), start)
        if self.pos + n > self.meta_limit:
            self._over_budget(self.pos + n, what, start)
        if not counted:
            self.count_strings(1, what, start)
        return n

    def string(self, what, keep=True, counted=False):
        """The next string, decoded with _decode() and charged to the memory budget (None when not kept)."""
        start = self.pos
        n = self.string_length(what, counted)
        if not keep:
            self.pos += n
            return None
        text = _decode(self.raw(n, what))
        self.charge(sys.getsizeof(text), what, start)
        self.last_length = n
        return text

    def skip_strings(self, count, what):
        """Skip `count` length-prefixed strings quickly (token and merge lists are ~10^5 of them). The caller
        has charged them to the strings budget, which bounds how long this runs."""
        max_len = self.limits["max_string_bytes"]
        unpack_from = _U64.unpack_from
        i = 0
        while i < count:
            rel = self._need(8, "length of %s element %d" % (what, i))
            buf = self.buf
            end = len(buf) - 8
            rel0 = rel
            n = 0
            done = 0
            for done in range(1, count - i + 1):  # a for loop over range is ~2x faster than while here
                n = unpack_from(buf, rel)[0]
                if n > max_len:
                    raise GGUFError("%s element %d is %d bytes long, over the limit of %d bytes"
                                    % (what, i + done - 1, n, max_len), self.pos + rel - rel0)
                rel += 8 + n
                if rel > end:
                    break
            last_at = self.pos + rel - rel0 - 8 - n
            self.pos += rel - rel0
            i += done
            if self.pos > self.size:
                raise GGUFError("%s element %d is %d bytes long but only %d bytes are left in the file "
                                "(truncated file?)" % (what, i - 1, n, self.size - last_at - 8), last_at)
            if self.pos > self.meta_limit:
                self._over_budget(self.pos, "%s element %d" % (what, i - 1), last_at)


def _check_limits(limits):
    out = dict(DEFAULT_LIMITS)
    for key, value in (limits or {}).items():
        if key not in DEFAULT_LIMITS:
            raise ValueError("unknown GGUF limit %r (known: %s)" % (key, ", ".join(sorted(DEFAULT_LIMITS))))
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError("GGUF limit %s must be a positive integer, got %r" % (key, value))
        out[key] = value
    return out


def _read_value(r, vtype, key, keep_strings):
    if vtype == T_STRING:
        return r.string(_Lazy("string value of key %r", key), keep=keep_strings)
    fmt = VALUE_TYPES[vtype][1]
    size = struct.calcsize(fmt)
    value = r.unpack(fmt, size, _Lazy("value of key %r", key))
    if vtype == T_BOOL:
        return bool(value)
    return value


def _read_array(r, key):
    start = r.pos
    etype = r.u32("element type of array %r" % key)
    if etype not in VALUE_TYPES:
        raise GGUFError("array %r has invalid element type %d" % (key, etype), start)
    if etype == T_ARRAY:
        raise GGUFError("array %r contains arrays: nested arrays are not supported by llama.cpp" % key, start)
    count_at = r.pos
    count = r.u64("element count of array %r" % key)
    if count > r.limits["max_array_elements"]:
        raise GGUFError("array %r has %d elements, over the limit of %d"
                        % (key, count, r.limits["max_array_elements"]), count_at)
    min_size = 8 if etype == T_STRING else struct.calcsize(VALUE_TYPES[etype][1])
    left = r.size - r.pos
    if count * min_size > left:
        raise GGUFError("array %r claims %d elements (at least %d bytes) but only %d bytes are left in the "
                        "file (truncated file?)" % (key, count, count * min_size, left), count_at)
    r.room(count * min_size, "array %r of %d elements" % (key, count), count_at)
    if etype == T_STRING:
        r.count_strings(count, "array %r of %d strings" % (key, count), count_at)
        keep = count if count <= KEEP_STRING_ARRAY else ARRAY_HEAD
        values = [r.string("element %d of array %r" % (i, key), counted=True) for i in range(keep)]
        r.charge(ELEMENT_COST * keep, "array %r" % key, count_at)
        r.skip_strings(count - keep, "array %r" % key)
        return GGUFArray(etype, count, values, keep == count)
    fmt = VALUE_TYPES[etype][1]
    keep = count if count <= KEEP_NUMERIC_ARRAY else ARRAY_HEAD
    r.charge(ELEMENT_COST * keep, "array %r" % key, count_at)
    data = r.raw(keep * min_size, "array %r" % key)
    values = list(struct.unpack("<%d%s" % (keep, fmt[1]), data))
    if etype == T_BOOL:
        values = [bool(v) for v in values]
    r.skip((count - keep) * min_size, "array %r" % key)
    return GGUFArray(etype, count, values, keep == count)


def _pad(n, alignment):
    return (n + alignment - 1) // alignment * alignment


def read_structure(path, limits=None):
    """Parse and check a GGUF file's header, metadata and tensor table. Returns a dict:
    version, kv (key -> (type id, value)), tensors (list of dicts), alignment, data_offset, file_size,
    tensor_bytes (sum of tensor sizes), data_size (padded), limits. Raises GGUFError."""
    limits = _check_limits(limits)
    try:
        st = os.stat(path)
    except OSError as exc:
        raise GGUFError("cannot stat: %s" % (exc.strerror or exc), path=path) from None
    if not os.path.isfile(path):
        raise GGUFError("not a regular file", path=path)
    try:
        with open(path, "rb") as f:
            started = time.time()
            before = os.fstat(f.fileno())
            result = read_structure_from(f, st.st_size, path, limits)
            identity = file_identity.identity(os.fstat(f.fileno()))
    except (IOError, OSError) as exc:
        raise GGUFError("cannot read: %s" % (exc.strerror or exc), path=path) from None
    # The identity of the bytes read (file_identity.py), for a later run to know the file unchanged: only when
    # nothing changed the file while it was read and its last change is settled (file_identity.settled).
    if identity == file_identity.identity(before) and file_identity.settled(before, started):
        result["identity"] = identity
    return result


def read_structure_from(source, size, name, limits=None):
    """read_structure() over any random-access source (an open file, a remote file read with HTTP Range:
    gguf_remote.py). `source` has seek(offset) and read(n), which returns n bytes unless the source ends
    first; `size` is the source's total size in bytes (the structure is checked against it); `name` is what
    the result and errors call it (a path, a URL without secrets). Errors the source raises pass through."""
    limits = _check_limits(limits)
    try:
        result = _parse(_Reader(source, size, limits))
    except GGUFError as exc:
        exc.path = name
        raise
    result["path"] = name
    result["limits"] = limits
    return result


def _parse(r):
    limits = r.limits
    if r.size < 4:
        raise GGUFError("file is %d bytes: too short to be GGUF (empty or truncated download?)" % r.size, 0)
    magic = r.raw(4, "magic")
    if magic != GGUF_MAGIC:
        raise GGUFError("bad magic %r, expected %r: not a GGUF file (an HTML error page or a LFS pointer?)"
                        % (magic, GGUF_MAGIC), 0)
    version = r.u32("version")
    if version not in SUPPORTED_VERSIONS:
        hint = ""
        if version == 1:
            hint = ": GGUFv1 is no longer supported by llama.cpp, convert the model again"
        elif struct.unpack(">I", struct.pack("<I", version))[0] in SUPPORTED_VERSIONS:
            hint = ": the file looks big-endian, llama.cpp on x86/ARM needs little-endian"
        raise GGUFError("unsupported GGUF version %d (supported: 2, 3)%s" % (version, hint), 4)
    n_tensors = r.u64("tensor count")
    if n_tensors > limits["max_tensors"]:
        raise GGUFError("tensor count %d is over the limit of %d" % (n_tensors, limits["max_tensors"]), 8)
    n_kv = r.u64("key/value count")
    if n_kv > limits["max_kv"]:
        raise GGUFError("key/value count %d is over the limit of %d" % (n_kv, limits["max_kv"]), 16)
    r.room(n_tensors * MIN_TENSOR_INFO_BYTES, "tensor count %d" % n_tensors, 8)
    r.room(n_kv * MIN_KV_BYTES, "key/value count %d" % n_kv, 16)

    kv = {}
    for i in range(n_kv):
        key_at = r.pos
        key = r.string(_Lazy("key of key/value pair %d", i))
        if not key:
            raise GGUFError("key of key/value pair %d is empty" % i, key_at)
        if key in kv:  # keys compare as bytes, like llama.cpp's std::string keys (see _decode)
            raise GGUFError("duplicate key %r (key/value pair %d)" % (key, i), key_at)
        r.charge(KV_COST, _Lazy("key/value pair %d", i), key_at)
        type_at = r.pos
        vtype = r.u32(_Lazy("type of key %r", key))
        if vtype not in VALUE_TYPES:
            raise GGUFError("key %r has invalid value type %d (valid: 0-12)" % (key, vtype), type_at)
        if vtype == T_ARRAY:
            value = _read_array(r, key)
        else:
            value = _read_value(r, vtype, key, keep_strings=True)
        kv[key] = (vtype, value)

    alignment = DEFAULT_ALIGNMENT
    if "general.alignment" in kv:
        atype, avalue = kv["general.alignment"]
        if atype != T_UINT32:
            raise GGUFError("general.alignment must be uint32, is %s" % VALUE_TYPES[atype][0])
        if avalue == 0 or avalue & (avalue - 1):
            raise GGUFError("general.alignment %d is not a power of 2" % avalue)
        alignment = avalue

    r.room(n_tensors * MIN_TENSOR_INFO_BYTES, "the tensor table of %d tensors" % n_tensors, r.pos)
    tensors = []
    names = set()
    for i in range(n_tensors):
        info_at = r.pos
        name = r.string(_Lazy("name of tensor %d", i))
        name_len = r.last_length
        if name_len >= GGML_MAX_NAME:
            raise GGUFError("name of tensor %d is %d bytes, llama.cpp allows at most %d"
                            % (i, name_len, GGML_MAX_NAME - 1), info_at)
        if name in names:
            raise GGUFError("duplicate tensor name %r (tensor %d)" % (name, i), info_at)
        names.add(name)
        r.charge(TENSOR_COST, _Lazy("tensor %d", i), info_at)
        dims_at = r.pos
        n_dims = r.u32(_Lazy("dimension count of tensor %r", name))
        if n_dims > limits["max_dims"]:
            raise GGUFError("tensor %r has %d dimensions, at most %d are allowed"
                            % (name, n_dims, limits["max_dims"]), dims_at)
        shape = []
        nelements = 1
        for j in range(n_dims):
            ne_at = r.pos
            ne = r.u64(_Lazy("dimension %d of tensor %r", j, name))
            if ne > INT64_MAX:
                raise GGUFError("tensor %r dimension %d is negative" % (name, j), ne_at)
            nelements *= ne
            if nelements > INT64_MAX:
                raise GGUFError("tensor %r has more than 2^63 elements: shape %r overflows"
                                % (name, shape + [ne]), ne_at)
            shape.append(ne)
        type_at = r.pos
        ttype = r.u32(_Lazy("type of tensor %r", name))
        if ttype not in GGML_TYPES:
            raise GGUFError("tensor %r has invalid or removed ggml type %d" % (name, ttype), type_at)
        tname, block, type_size = GGML_TYPES[ttype]
        ne0 = shape[0] if shape else 1
        if ne0 % block:
            raise GGUFError("tensor %r of type %s has %d elements per row, not a multiple of the block "
                            "size %d" % (name, tname, ne0, block), type_at)
        nbytes = nelements // block * type_size
        offset_at = r.pos
        offset = r.u64(_Lazy("data offset of tensor %r", name))
        tensors.append({"name": name, "shape": shape, "type": tname, "type_id": ttype,
                        "offset": offset, "nbytes": nbytes, "info_offset": info_at, "offset_at": offset_at})

    header_end = r.pos
    data_offset = _pad(header_end, alignment)

    # Tensor data: llama.cpp requires each tensor at the running offset, every tensor padded to alignment.
    expected = 0
    for t in tensors:
        if t["offset"] % alignment:
            raise GGUFError("tensor %r data offset %d is not aligned to %d"
                            % (t["name"], t["offset"], alignment), t["offset_at"])
        if t["offset"] < expected:
            raise GGUFError("tensor %r data at offset %d overlaps the previous tensor (expected offset %d)"
                            % (t["name"], t["offset"], expected), t["offset_at"])
        if t["offset"] > expected:
            raise GGUFError("tensor %r data at offset %d leaves a gap after the previous tensor (expected "
                            "offset %d; llama.cpp needs tensors stored in order)"
                            % (t["name"], t["offset"], expected), t["offset_at"])
        end = data_offset + t["offset"] + t["nbytes"]
        if end > r.size:
            raise GGUFError(
                "tensor %r data ends at byte %d, beyond the end of the file (%d bytes): the file is "
                "truncated (%d bytes missing) - download it again" % (t["name"], end, r.size, end - r.size),
                t["offset_at"])
        expected = t["offset"] + _pad(t["nbytes"], alignment)

    tensor_bytes = sum(t["nbytes"] for t in tensors)
    if tensors:
        min_size = data_offset + tensors[-1]["offset"] + tensors[-1]["nbytes"]
        max_size = data_offset + expected
    else:
        min_size, max_size = header_end, data_offset
    if r.size > max_size:
        raise GGUFError("file has %d unexpected bytes after the tensor data (expected size %d, file is %d): "
                        "wrong or corrupted file" % (r.size - max_size, max_size, r.size), max_size)
    if r.size < min_size:  # already caught per tensor; kept for tensorless files
        raise GGUFError("file is truncated: %d bytes, expected at least %d" % (r.size, min_size), r.size)

    for t in tensors:
        del t["offset_at"]
    return {
        "version": version, "kv": kv, "tensors": tensors, "alignment": alignment,
        "header_size": header_end, "data_offset": data_offset, "file_size": r.size,
        "tensor_bytes": tensor_bytes, "data_size": expected,
    }


# ---------------------------------------------------------------------------------------------------------
# Model summary


def _clean_text(text, keep_distinct=False):
    """Text for Ansible: invalid bytes (surrogate escapes from _decode) become U+FFFD, or \\xNN escapes
    where distinct strings must stay distinct (dict keys)."""
    if not _SURROGATE.search(text):
        return text
    return text.encode("utf-8", "surrogateescape").decode(
        "utf-8", "backslashreplace" if keep_distinct else "replace")


def _clean(value):
    """value with every string cleaned by _clean_text(), recursively: no lone surrogate reaches JSON."""
    if isinstance(value, str):
        return _clean_text(value)
    if isinstance(value, dict):
        return dict((_clean_text(k, True) if isinstance(k, str) else k, _clean(v)) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def _plain(value):
    if isinstance(value, GGUFArray):
        return value.summary()
    if isinstance(value, float) and math.isnan(value):  # NaN is not JSON
        return None
    return value


def _get(kv, key, default=None):
    item = kv.get(key)
    if item is None:
        return default
    return item[1]


def _scalar_or_layers(kv, key):
    """A hyperparameter that may be a scalar or a per-layer array: scalar, list, or None."""
    value = _get(kv, key)
    if isinstance(value, GGUFArray):
        return list(value.values) if value.complete and value.element_type in INTEGER_TYPES else None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return value
    return None


def _uint(kv, key):
    item = kv.get(key)
    if item is None or item[0] not in INTEGER_TYPES:
        return None
    return item[1]


def layer_layout(kv, arch, block_count, nextn):
    """Per-block kind: 'attention', 'recurrent' or 'nextn' (MTP blocks stored after the trunk).

    Mirrors llama.cpp: an explicit {arch}.attention.recurrent_layers bool array wins; the Qwen3-Next/3.5
    family uses full_attention_interval (every Nth trunk block is attention, default 4); other hybrids
    (Jamba, Granite-hybrid, Nemotron-H, LFM2, Falcon-H1...) mark recurrent blocks with head_count_kv 0 in a
    per-layer array; pure SSM/RWKV models have ssm or wkv keys and no attention heads."""
    if not block_count:
        return [], None
    trunk = max(block_count - (nextn or 0), 0)
    kinds = None
    source = "default"
    recurrent = _get(kv, "%s.attention.recurrent_layers" % arch)
    interval = _uint(kv, "%s.full_attention_interval" % arch)
    head_kv = _scalar_or_layers(kv, "%s.attention.head_count_kv" % arch)
    head = _scalar_or_layers(kv, "%s.attention.head_count" % arch)
    if isinstance(recurrent, GGUFArray) and recurrent.complete and recurrent.count >= trunk:
        kinds = ["recurrent" if recurrent.values[i] else "attention" for i in range(trunk)]
        source = "%s.attention.recurrent_layers" % arch
    elif interval is not None or arch in INTERVAL_HYBRIDS:
        interval = interval or 4
        kinds = ["attention" if (i + 1) % interval == 0 else "recurrent" for i in range(trunk)]
        source = "%s.full_attention_interval" % arch
    elif isinstance(head_kv, list) and len(head_kv) >= trunk:
        kinds = ["recurrent" if head_kv[i] == 0 else "attention" for i in range(trunk)]
        source = "%s.attention.head_count_kv" % arch
    elif not head and any(k.startswith(arch + ".ssm.") or k.startswith(arch + ".wkv.") for k in kv):
        kinds = ["recurrent"] * trunk
        source = "%s.ssm" % arch
    else:
        kinds = ["attention"] * trunk
    return kinds + ["nextn"] * (block_count - trunk), source


def split_info(kv):
    no = _uint(kv, "split.no")
    count = _uint(kv, "split.count")
    tensors = _uint(kv, "split.tensors.count")
    if no is None and count is None and tensors is None:
        return None
    return {"no": no, "count": count, "tensors_count": tensors}


_BLK = re.compile(r"^blk\.(\d+)\.")


def check_block_count(struct_info, key, block_count, n_tensors=None, holder="the file"):
    """Everything per layer (layer_types, layer_bytes...) is sized by block_count, a number the file states:
    bound it by max_block_count and, when the model has tensors, by their count (every llama.cpp block has
    at least one tensor), before anything is built from it. n_tensors defaults to the file's own; a part of
    a split set holds only some of the model's tensors, so summarize() passes 0 (no bound) for it and
    check_split_set() bounds block_count by the whole set's count."""
    if block_count is None:
        return
    limit = (struct_info.get("limits") or DEFAULT_LIMITS)["max_block_count"]
    path = struct_info.get("path")
    if block_count > limit:
        raise GGUFError("%s %d is over the limit of %d blocks (llama.cpp loads at most %d; raise "
                        "limits.max_block_count only for a real model with more)"
                        % (_clean_text(key), block_count, limit, LLAMA_MAX_LAYERS), path=path)
    if n_tensors is None:
        n_tensors = len(struct_info["tensors"])
    if n_tensors and block_count > n_tensors:
        raise GGUFError("%s %d is more than the %d tensors of %s: every block has at least one tensor"
                        % (_clean_text(key), block_count, n_tensors, holder), path=path)


# The figures gguf_info gives of a model's tensors: the named file's from summarize(), the whole set's once
# add_split_set() has read every part of a split set.
TENSOR_FIELDS = ("tensor_count", "tensor_bytes", "tensor_types", "layer_bytes", "non_layer_bytes",
                 "non_layer_tensors")


def tally_tensors(tensors, block_count):
    """TENSOR_FIELDS of `tensors` (read_structure()'s list): bytes per block blk.N (N < block_count), bytes
    outside the blocks in all and by tensor name, count and bytes per ggml type."""
    layer_bytes = [0] * (block_count or 0)
    other_bytes = 0
    # Tensors outside the blocks by name (token_embd, output, output_norm...): a planner places them apart
    # (llama.cpp keeps the input embedding in host memory and the output head with the last layer).
    other_tensors = {}
    types = {}
    total = 0
    for t in tensors:
        m = _BLK.match(t["name"])
        idx = int(m.group(1)) if m else None
        if idx is not None and idx < len(layer_bytes):
            layer_bytes[idx] += t["nbytes"]
        else:
            other_bytes += t["nbytes"]
            other_tensors[t["name"]] = other_tensors.get(t["name"], 0) + t["nbytes"]
        entry = types.setdefault(t["type"], {"count": 0, "bytes": 0})
        entry["count"] += 1
        entry["bytes"] += t["nbytes"]
        total += t["nbytes"]
    return {"tensor_count": len(tensors), "tensor_bytes": total, "tensor_types": types,
            "layer_bytes": layer_bytes, "non_layer_bytes": other_bytes, "non_layer_tensors": other_tensors}


def add_tallies(total, part):
    """Add the TENSOR_FIELDS `part` (tally_tensors() of one part) into `total` (the same shape, as long)."""
    for key in ("tensor_count", "tensor_bytes", "non_layer_bytes"):
        total[key] += part[key]
    for i, nbytes in enumerate(part["layer_bytes"]):
        total["layer_bytes"][i] += nbytes
    for name, nbytes in part["non_layer_tensors"].items():
        total["non_layer_tensors"][name] = total["non_layer_tensors"].get(name, 0) + nbytes
    for type_name, entry in part["tensor_types"].items():
        into = total["tensor_types"].setdefault(type_name, {"count": 0, "bytes": 0})
        into["count"] += entry["count"]
        into["bytes"] += entry["bytes"]
    return total


def summarize(struct_info, include_kv=False):
    """The facts gguf_info returns, built from read_structure()'s result: the model's keys and the named
    file's tensors (add_split_set() makes the TENSOR_FIELDS cover a whole split set)."""
    kv = struct_info["kv"]
    arch = _get(kv, "general.architecture")
    if not isinstance(arch, str) or not arch:
        raise GGUFError("general.architecture is missing or not a string: not a llama.cpp model file",
                        path=struct_info.get("path"))
    p = arch + "."
    ft = _uint(kv, "general.file_type")
    block_count = _uint(kv, p + "block_count")
    split = split_info(kv)
    spread = bool(split and split["count"] and split["count"] > 1)  # bounded by the whole set's tensors
    check_block_count(struct_info, p + "block_count", block_count, 0 if spread else None)
    nextn = _uint(kv, p + "nextn_predict_layers") or 0
    if block_count is not None and nextn > block_count:
        raise GGUFError("%snextn_predict_layers %d is larger than block_count %d"
                        % (_clean_text(p), nextn, block_count),
                        path=struct_info.get("path"))
    kinds, source = layer_layout(kv, arch, block_count, nextn) if block_count else ([], None)

    template = _get(kv, "tokenizer.chat_template")
    template = template if isinstance(template, str) else None
    tokens = _get(kv, "tokenizer.ggml.tokens")
    ssm = dict((k[len(p) + 4:], _plain(v[1])) for k, v in kv.items() if k.startswith(p + "ssm."))

    info = {
        "path": struct_info.get("path"),
        "gguf_version": struct_info["version"],
        "architecture": arch,
        "name": _get(kv, "general.name"),
        "file_type": FILE_TYPES.get(ft, None if ft is None else "UNKNOWN_%d" % ft),
        "file_type_id": ft,
        "block_count": block_count,
        "context_length": _uint(kv, p + "context_length"),
        "embedding_length": _uint(kv, p + "embedding_length"),
        "feed_forward_length": _scalar_or_layers(kv, p + "feed_forward_length"),
        "head_count": _scalar_or_layers(kv, p + "attention.head_count"),
        "head_count_kv": _scalar_or_layers(kv, p + "attention.head_count_kv"),
        "key_length": _uint(kv, p + "attention.key_length"),
        "value_length": _uint(kv, p + "attention.value_length"),
        "expert_count": _uint(kv, p + "expert_count"),
        "nextn_predict_layers": nextn,
        "layer_types": kinds,
        "layer_types_source": source,
        "attention_layers": [i for i, k in enumerate(kinds) if k == "attention"],
        "recurrent_layers": [i for i, k in enumerate(kinds) if k == "recurrent"],
        "nextn_layers": [i for i, k in enumerate(kinds) if k == "nextn"],
        "hybrid": "recurrent" in kinds and "attention" in kinds,
        "full_attention_interval": _uint(kv, p + "full_attention_interval"),
        "ssm": ssm,
        "tokenizer_model": _get(kv, "tokenizer.ggml.model"),
        "tokenizer_pre": _get(kv, "tokenizer.ggml.pre"),
        "vocab_size": tokens.count if isinstance(tokens, GGUFArray) else _uint(kv, p + "vocab_size"),
        "chat_template": template,
        "chat_template_risks": chat_template_risks(template),
        "split": split,
        "kv_count": len(kv),
        "alignment": struct_info["alignment"],
        "data_offset": struct_info["data_offset"],
        "size": struct_info["file_size"],
    }
    info.update(tally_tensors(struct_info["tensors"], block_count))
    if "identity" in struct_info:  # a local file (not a remote header) not changed lately
        info["identity"] = struct_info["identity"]
    info["summary_version"] = SUMMARY_VERSION
    if include_kv:
        info["kv"] = dict((k, _plain(v[1])) for k, v in kv.items())
    return _clean(info)


def inspect(path, limits=None, include_kv=False):
    """read_structure() + summarize() in one call."""
    return summarize(read_structure(path, limits), include_kv=include_kv)


# ---------------------------------------------------------------------------------------------------------
# Split sets


def split_parts(path):
    """All part paths of the split set `path` belongs to (llama.cpp's PREFIX-0000N-of-0000M.gguf), or None."""
    directory, base = os.path.split(path)
    m = SPLIT_RE.match(base)
    if not m:
        return None
    count = int(m.group("count"))
    if count < 1 or int(m.group("no")) < 1 or int(m.group("no")) > count:
        return None
    return [os.path.join(directory, "%s-%05d-of-%05d.gguf" % (m.group("prefix"), i, count))
            for i in range(1, count + 1)]


def check_split_set(first_info, first_struct, limits=None, read_part=None):
    """Given the summary of one part, check that every part exists, parses, and agrees. Returns a dict.

    read_part(name) -> read_structure() result of another part; by default the local file is read. A remote
    reader (gguf_remote.py) passes its own, and a missing part fails there (HTTP 404)."""
    path = first_info["path"]
    parts = split_parts(path)
    split = first_info.get("split")
    if split is None or not split.get("count"):
        if parts and len(parts) > 1:
            raise GGUFError("file name says it is part of a %d-part split set but it has no split.count key"
                            % len(parts), path=path)
        return None
    count = split["count"]
    if parts is None:
        raise GGUFError("split.count is %d but the file name is not PREFIX-0000N-of-%05d.gguf, so the other "
                        "parts cannot be found" % (count, count), path=path)
    if len(parts) != count:
        raise GGUFError("file name says %d parts but split.count is %d" % (len(parts), count), path=path)
    declared = split.get("tensors_count")
    _check_set_counts(first_struct, limits, count, declared, path)
    missing = [] if read_part else [p for p in parts if not os.path.isfile(p)]
    if missing:
        shown = ", ".join(missing[:5]) + (" and %d more" % (len(missing) - 5) if len(missing) > 5 else "")
        raise GGUFError("split set incomplete: missing %s (%d of %d parts)" % (shown, len(missing), count),
                        path=path)
    if read_part is None:
        def read_part(name):
            return read_structure(name, limits)
    # The parts' running total of tensors is checked as they are read: a set whose parts hold more tensors
    # than it declares fails at the part that overflows, and the per-part figures kept stay within what
    # max_tensors allows for one file.
    most = declared if declared is not None else _limits_of(first_struct, limits)["max_tensors"]
    block_count = first_info.get("block_count")
    figures = []
    total_tensors = 0
    for i, part in enumerate(parts):
        s = first_struct if part == path else read_part(part)
        kv = s["kv"]
        sp = split_info(kv) or {}
        if sp.get("no") != i:
            raise GGUFError("split.no is %r, expected %d for part %d of %d" % (sp.get("no"), i, i + 1, count),
                            path=part)
        if sp.get("count") != count:
            raise GGUFError("split.count is %r, expected %d like the first part" % (sp.get("count"), count),
                            path=part)
        if sp.get("tensors_count") != declared:
            raise GGUFError("split.tensors.count is %r, the other parts say %r"
                            % (sp.get("tensors_count"), declared), path=part)
        arch = _get(kv, "general.architecture")
        if i > 0 and arch is not None and arch != first_info["architecture"]:
            raise GGUFError("architecture %r differs from the first part's %r"
                            % (arch, first_info["architecture"]), path=part)
        total_tensors += len(s["tensors"])
        if total_tensors > most:
            raise GGUFError("parts 1 to %d of %d already hold %d tensors, more than the %d of %s"
                            % (i + 1, count, total_tensors, most,
                               "split.tensors.count" if declared is not None else "limit max_tensors"),
                            path=part)
        figures.append(dict(_clean(tally_tensors(s["tensors"], block_count)), path=part, size=s["file_size"]))
    if declared is not None and total_tensors != declared:
        raise GGUFError("the %d parts hold %d tensors but split.tensors.count is %d"
                        % (count, total_tensors, declared), path=path)
    check_block_count(first_struct, "%s.block_count" % first_info["architecture"], block_count, total_tensors,
                      "the %d parts of the split set" % count)
    return {"parts": figures, "count": count, "tensor_count": total_tensors,
            "size": sum(f["size"] for f in figures), "tensor_bytes": sum(f["tensor_bytes"] for f in figures)}


def _limits_of(struct_info, limits):
    return struct_info.get("limits") or _check_limits(limits)


def _check_set_counts(first_struct, limits, count, declared, path):
    """Bound what a split set declares before any other part is read: its tensors by max_tensors (the limit
    of one file bounds a whole set too) and its parts by its tensors (only the first part may hold none)."""
    if declared is None:
        return
    max_tensors = _limits_of(first_struct, limits)["max_tensors"]
    if declared > max_tensors:
        raise GGUFError("split.tensors.count %d is over the limit of %d tensors (max_tensors, which bounds a "
                        "whole split set too)" % (declared, max_tensors), path=path)
    if count > declared + 1:
        raise GGUFError("split.count %d is more than split.tensors.count %d + 1: every part but the first "
                        "holds at least one tensor" % (count, declared), path=path)


def add_split_set(info, struct_info, limits=None, read_part=None):
    """summarize()'s `info` completed for a split set: check_split_set() as RV(split_set), and the
    TENSOR_FIELDS (layer_bytes, non_layer_tensors, tensor_bytes...) made the WHOLE set's, so that a memory
    planner reading them plans the whole model; the named file's own figures stay in split_set.parts[i]
    (i = split.no). info is returned unchanged when the file is not part of a split set."""
    split_set = check_split_set(info, struct_info, limits, read_part=read_part)
    if split_set is None:
        return info
    total = tally_tensors([], info.get("block_count"))
    for figures in split_set["parts"]:
        add_tallies(total, figures)
    info.update(total)
    info["split_set"] = split_set
    return info


def normalize_digest(value):
    """Accept 'HEX' or 'sha256:HEX' (any case); return lowercase hex or raise ValueError."""
    text = (value or "").strip().lower()
    if text.startswith("sha256:"):
        text = text[len("sha256:"):]
    if not matches(r"[0-9a-f]{64}", text):
        raise ValueError("sha256 must be 64 hex digits (optionally prefixed 'sha256:'), got %r" % value)
    return text
