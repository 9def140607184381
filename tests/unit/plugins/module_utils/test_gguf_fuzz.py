# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Fuzzing gguf_info's parser: structure-aware mutations of valid GGUF files must end in GGUFError or in a
consistent success, quickly and without allocating much; a success must also parse with llama.cpp's own
gguf-py (differential oracle)."""
import os
import shutil
import struct
import sys
import tempfile
import time
import tracemalloc

import pytest
from ansible_collections.llmops.serving.plugins.module_utils._model_format import gguf
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from tests.fixtures import llama_cpp_source
from tests.fixtures.gguf.builder import (
    ARRAY,
    BOOL,
    FLOAT32,
    STRING,
    UINT8,
    UINT32,
    UINT64,
    GGUFBuilder,
    tiny_qwen35,
)

TEMPLATE = "{% for m in messages %}{{ '<|im_start|>' + m['role'] }}{{ m['content'] }}{% endfor %}"
SEED = tiny_qwen35(chat_template=TEMPLATE, split=(0, 1, 12)).build()
INTERESTING = [0, 1, 2, 3, 4, 7, 8, 9, 12, 13, 31, 32, 33, 63, 64, 65, 255, 256, 4095, 65535, 65536,
               (1 << 24), (1 << 31) - 1, 1 << 31, (1 << 32) - 1, 1 << 32, 1 << 40, 1 << 62,
               (1 << 63) - 1, 1 << 63, (1 << 64) - 1]
TIME_BOUND = 2.0
MIB = 1024 * 1024

_DIR = tempfile.mkdtemp(prefix="gguf-fuzz-")


def _gguf_py():
    pytest.importorskip("numpy")
    path = llama_cpp_source.gguf_py_path()
    if path not in sys.path:
        sys.path.insert(0, path)
    import gguf as gguf_py
    return gguf_py


def check(data, name="fuzz.gguf", oracle=None):
    """Parse data; it must fail with GGUFError or succeed consistently, within TIME_BOUND."""
    path = os.path.join(_DIR, name)
    with open(path, "wb") as f:
        f.write(data)
    start = time.monotonic()
    try:
        info = gguf.inspect(path, include_kv=True)
    except gguf.GGUFError as exc:
        assert str(exc) and exc.path == path
        assert exc.offset is None or 0 <= exc.offset <= max(len(data), 1 << 64)
        info = None
    elapsed = time.monotonic() - start
    assert elapsed < TIME_BOUND, "parse took %.2fs" % elapsed
    if info is not None:
        assert info["size"] == len(data)
        assert info["data_offset"] % info["alignment"] == 0
        assert info["tensor_bytes"] == sum(info["layer_bytes"]) + info["non_layer_bytes"]
        assert info["tensor_bytes"] <= len(data)
        assert len(info["layer_types"]) == (info["block_count"] or 0)
        if oracle is not None:
            _agree_with_gguf_py(oracle, path, info)
    return info


def _agree_with_gguf_py(gguf_py, path, info):
    try:
        reader = gguf_py.GGUFReader(path)
    except UnicodeDecodeError:
        return  # gguf-py decodes names strictly; llama.cpp (and we) take any bytes
    assert len(reader.tensors) == info["tensor_count"]
    assert sum(int(t.n_bytes) for t in reader.tensors) == info["tensor_bytes"]
    assert len([k for k in reader.fields if not k.startswith("GGUF.")]) == info["kv_count"]


def test_seed_is_valid():
    info = check(SEED.data)
    assert info["layer_types"] == ["recurrent", "recurrent", "recurrent", "attention", "nextn"]


def test_every_field_with_every_interesting_value():
    """Exhaustive structure-aware sweep: each count, length, type, dimension, offset and scalar metadata value
    (block_count, nextn_predict_layers, split.count...) of the seed set to each boundary value. Memory stays
    bounded while the huge values are tried."""
    kinds = {}
    for kind, _, _ in SEED.fields:
        kinds[kind] = kinds.get(kind, 0) + 1
    cases = [(kind, index, value) for kind, count in kinds.items() for index in range(count)
             for value in INTERESTING]
    outcomes = {"ok": 0, "error": 0}
    for kind, index, value in cases:
        if value < 1 << 24:
            info = check(SEED.patch(kind, value, index=index))
            outcomes["ok" if info else "error"] += 1
    tracemalloc.start()
    try:
        for kind, index, value in cases:
            if value >= 1 << 24:
                info = check(SEED.patch(kind, value, index=index))
                outcomes["ok" if info else "error"] += 1
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 16 * 1024 * 1024
    assert outcomes["error"] > 1000 and outcomes["ok"] > 10  # the sweep hits both sides
    assert any(kind == "value.uint32" for kind, _, _ in cases)  # metadata values are swept too


@st.composite
def mutations(draw, seed):
    data = bytearray(seed.data)
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["field", "field", "flip", "truncate", "insert", "delete", "dup"]))
        if op == "field":
            kind, offset, fmt = draw(st.sampled_from(seed.fields))
            size = struct.calcsize(fmt)
            value = draw(st.one_of(st.sampled_from(INTERESTING), st.integers(0, (1 << (8 * size)) - 1)))
            if offset + size <= len(data):
                data[offset:offset + size] = (value & ((1 << (8 * size)) - 1)).to_bytes(size, "little")
        elif op == "flip" and data:
            pos = draw(st.integers(0, len(data) - 1))
            data[pos] ^= draw(st.integers(1, 255))
        elif op == "truncate":
            del data[draw(st.integers(0, len(data))):]
        elif op == "insert":
            pos = draw(st.integers(0, len(data)))
            data[pos:pos] = draw(st.binary(min_size=1, max_size=16))
        elif op == "delete" and data:
            pos = draw(st.integers(0, len(data) - 1))
            del data[pos:pos + draw(st.integers(1, 16))]
        elif op == "dup" and data:
            a = draw(st.integers(0, len(data) - 1))
            b = draw(st.integers(a, min(len(data), a + 64)))
            pos = draw(st.integers(0, len(data)))
            data[pos:pos] = data[a:b]
    return bytes(data)


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutations(SEED))
def test_random_mutations_fail_cleanly(data):
    check(data)


COUNTS = st.one_of(st.sampled_from(INTERESTING), st.integers(0, 1 << 20), st.integers(0, (1 << 64) - 1))


@st.composite
def crafted_counts(draw):
    """A small file whose counts (block_count, n_kv, n_tensors, array counts, string lengths, n_dims, dims)
    are drawn from anywhere in their range: each must end in a clean error or a consistent success, fast and
    small, whatever the file claims."""
    arch = draw(st.sampled_from(["qwen35", "llama", "jamba", "granitehybrid"]))
    b = GGUFBuilder()
    b.add("general.architecture", STRING, arch)
    b.add("%s.block_count" % arch, draw(st.sampled_from([UINT32, UINT64])), 4)
    b.add("%s.nextn_predict_layers" % arch, UINT32, 1)
    b.add("%s.attention.head_count_kv" % arch, ARRAY, [0, 0, 0, 2], UINT32)
    b.add("%s.attention.recurrent_layers" % arch, ARRAY, [True, False, True, False], BOOL)
    b.add("tokenizer.ggml.tokens", ARRAY, ["a", "b", "c"], STRING)
    b.add("tokenizer.ggml.scores", ARRAY, [0.0, 1.0, 2.0], FLOAT32)
    b.add("x.u8", ARRAY, [1, 2, 3], UINT8)
    for il in range(4):
        b.tensor("blk.%d.attn_norm.weight" % il, [32], "F32")
    built = b.build()
    data = built.data
    kinds = sorted(set(kind for kind, _, _ in built.fields))
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(kinds))
        index = draw(st.integers(0, len([f for f in built.fields if f[0] == kind]) - 1))
        _, offset, fmt = built.field(kind, index)
        size = struct.calcsize(fmt)
        value = draw(COUNTS) & ((1 << (8 * size)) - 1)
        data = data[:offset] + value.to_bytes(size, "little") + data[offset + size:]
    return data


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(crafted_counts())
def test_crafted_counts_are_bounded_in_time_and_memory(data):
    tracemalloc.start()
    try:
        check(data, name="counts.gguf")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 * MIB


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutations(SEED))
def test_successes_agree_with_gguf_py(data):
    info = check(data, oracle=_gguf_py())
    event("parsed" if info else "GGUFError")


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=512))
def test_arbitrary_bytes(data):
    check(b"GGUF" + data if data[:1] == b"\0" else data)


@pytest.fixture(scope="module")
def real_model_header():
    """The tiny qwen35 model's metadata + tensor table (real vocabulary, 151936 tokens), with its data."""
    pytest.importorskip("numpy")
    from tests.fixtures.gguf.make_tiny_model import cached_tiny_model
    path = cached_tiny_model("qwen35")
    with open(path, "rb") as f:
        return f.read()


@pytest.mark.slow
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(pos=st.integers(0, 200000), value=st.binary(min_size=1, max_size=8), cut=st.booleans())
def test_mutations_of_a_real_model(real_model_header, pos, value, cut):
    """Byte edits in the first 200 KB (header, tokenizer arrays) of a real 11 MB model, or a truncation."""
    data = bytearray(real_model_header)
    if cut:
        del data[pos:]
    else:
        data[pos:pos + len(value)] = value
    check(bytes(data), name="real.gguf")


def teardown_module(module):
    shutil.rmtree(_DIR, ignore_errors=True)
