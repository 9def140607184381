# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""gguf_info against crafted metadata (GitHub issue 9): every count read from the file bounds what the parser
allocates and how long it runs, and strings that are not UTF-8 are taken the way llama.cpp takes them."""
import json
import os
import time
import tracemalloc

import pytest
from ansible_collections.llmops.serving.plugins.module_utils._model_format import gguf

from tests.fixtures.gguf.builder import (
    ARRAY,
    FLOAT32,
    STRING,
    UINT8,
    UINT32,
    UINT64,
    GGUFBuilder,
    tiny_qwen35,
)

MIB = 1024 * 1024


def _write(tmp_path, data, name="hostile.gguf"):
    path = str(tmp_path / name)
    with open(path, "wb") as f:
        f.write(data)
    return path


def _measure(path, **kwargs):
    """(info or GGUFError, seconds, peak traced bytes) of gguf.inspect(path)."""
    tracemalloc.start()
    # CPU time of this process, not wall time: a loaded CI machine stretches the wall clock, not the work
    start = time.process_time()
    try:
        outcome = gguf.inspect(path, **kwargs)
    except gguf.GGUFError as exc:
        outcome = exc
    finally:
        elapsed = time.process_time() - start
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    return outcome, elapsed, peak


def _with_block_count(builder, value, vtype=UINT64):
    builder.kv = [(k, vtype, value, s) if k.endswith(".block_count") else (k, t, v, s)
                  for k, t, v, s in builder.kv]
    return builder


def _vocab_only(arch, block_count, vtype=UINT64):
    b = GGUFBuilder()
    b.add("general.architecture", STRING, arch)
    b.add("%s.block_count" % arch, vtype, block_count)
    return b


# --------------------------------------------------------------------------- block_count


@pytest.mark.parametrize("arch", ["qwen35", "llama", "jamba"])
@pytest.mark.parametrize("block_count", [3000000, 1 << 32, 1 << 40, 1 << 63, (1 << 64) - 1])
def test_huge_block_count_in_a_tiny_file_fails_fast_with_a_clear_error(tmp_path, arch, block_count):
    """Before: 3,000,000 took ~10 s and ~160 MB (per-layer lists), 2^40 a MemoryError, 2^63 OverflowError."""
    path = _write(tmp_path, _vocab_only(arch, block_count).build().data)
    assert os.path.getsize(path) < 700
    outcome, elapsed, peak = _measure(path)
    assert isinstance(outcome, gguf.GGUFError), outcome
    assert "%s.block_count %d" % (arch, block_count) in str(outcome)
    assert "over the limit" in str(outcome)
    assert elapsed < 0.5 and peak < 4 * MIB


def test_block_count_of_a_file_with_tensors_is_bounded_by_its_tensors(tmp_path):
    """Every llama.cpp block has at least one tensor: 13 blocks cannot live in a 12-tensor file."""
    path = _write(tmp_path, _with_block_count(tiny_qwen35(), 13, UINT32).build().data)
    with pytest.raises(gguf.GGUFError, match="qwen35.block_count 13 is more than the 12 tensors"):
        gguf.inspect(path)
    info = gguf.inspect(_write(tmp_path, _with_block_count(tiny_qwen35(), 12, UINT32).build().data))
    assert len(info["layer_types"]) == 12


def test_block_count_limit_is_configurable(tmp_path):
    path = _write(tmp_path, _vocab_only("qwen35", 600).build().data)
    assert len(gguf.inspect(path)["layer_types"]) == 600
    with pytest.raises(gguf.GGUFError, match="over the limit of 512"):
        gguf.inspect(path, limits={"max_block_count": 512})


# --------------------------------------------------------------------------- counts beyond the file


@pytest.mark.parametrize("field,value,needle,offset_field", [
    ("n_kv", 60000, "key/value count 60000 needs at least", "n_kv"),
    ("n_tensors", 60000, "tensor count 60000 needs at least", "n_tensors"),
])
def test_counts_the_file_cannot_hold_fail_at_the_count(tmp_path, field, value, needle, offset_field):
    """Each key/value takes >= 14 bytes and each tensor info >= 24: refuse the count where it is read."""
    built = tiny_qwen35().build()
    path = _write(tmp_path, built.patch(field, value))
    with pytest.raises(gguf.GGUFError, match=needle) as err:
        gguf.read_structure(path)
    assert err.value.offset == built.field(offset_field)[1]


def test_array_count_bounded_by_the_file_and_metadata_budget(tmp_path):
    b = GGUFBuilder()
    b.add("general.architecture", STRING, "llama")
    b.add("tokenizer.ggml.scores", ARRAY, [0.0] * 4, FLOAT32)
    built = b.build()
    data = built.patch("array.count", 1 << 24)  # within max_array_elements, 64 MiB claimed in a ~100 B file
    outcome, elapsed, peak = _measure(_write(tmp_path, data))
    assert isinstance(outcome, gguf.GGUFError) and elapsed < 0.2 and peak < MIB


# --------------------------------------------------------------------------- metadata budgets


def test_kept_array_values_are_charged_to_the_metadata_memory_budget(tmp_path):
    """400 float arrays of 4096 elements: 6.5 MB of file, ~50 MB of Python floats when kept whole.
    A budget of 8 MiB refuses it before memory grows."""
    b = GGUFBuilder()
    b.add("general.architecture", STRING, "llama")
    values = [float(i) + 0.5 for i in range(4096)]
    for i in range(400):
        b.add("x.arr%d" % i, ARRAY, values, FLOAT32)
    path = _write(tmp_path, b.build().data)
    outcome, elapsed, peak = _measure(path, limits={"max_metadata_bytes": 8 * MIB})
    assert isinstance(outcome, gguf.GGUFError), outcome
    assert "metadata needs more than 8388608 bytes of memory" in str(outcome)
    assert peak < 24 * MIB


def test_metadata_section_bytes_are_budgeted(tmp_path):
    b = GGUFBuilder()
    b.add("general.architecture", STRING, "llama")
    b.add("x.blob", STRING, "a" * (2 * MIB))
    path = _write(tmp_path, b.build().data)
    assert gguf.inspect(path)["kv_count"] == 2
    with pytest.raises(gguf.GGUFError, match="metadata is larger than the limit of 1048576 bytes"):
        gguf.inspect(path, limits={"max_metadata_bytes": MIB})


def test_one_non_bmp_character_does_not_quadruple_string_memory(tmp_path):
    """A 4 MiB string with one emoji decodes to a 16 MiB Python str: charged at its decoded size."""
    b = GGUFBuilder()
    b.add("general.architecture", STRING, "llama")
    for i in range(3):
        b.add("x.s%d" % i, STRING, "\U0001F600" + "a" * (4 * MIB))
    path = _write(tmp_path, b.build().data)
    outcome, _, _ = _measure(path, limits={"max_metadata_bytes": 32 * MIB})
    assert isinstance(outcome, gguf.GGUFError) and "bytes of memory" in str(outcome)


def test_string_elements_are_budgeted_so_time_stays_bounded(tmp_path):
    """2.5 million empty strings (20 MB) would take seconds to walk: the strings budget refuses the array at
    its count, before walking it."""
    b = GGUFBuilder()
    b.add("general.architecture", STRING, "llama")
    b.add("tokenizer.ggml.tokens", ARRAY, ["a"], STRING)
    built = b.build()
    n = 2500000
    data = bytearray(built.patch("array.count", n))
    data += b"\0" * (8 * n)
    outcome, elapsed, peak = _measure(_write(tmp_path, bytes(data)))
    assert isinstance(outcome, gguf.GGUFError), outcome
    assert "strings" in str(outcome) and "over the limit of 2097152" in str(outcome)
    assert elapsed < 0.5 and peak < 2 * MIB


def test_new_limits_are_validated():
    with pytest.raises(ValueError, match="max_metadata_bytes"):
        gguf.read_structure("/nonexistent", limits={"max_metadata_bytes": 0})
    assert {"max_block_count", "max_metadata_bytes", "max_metadata_strings"} <= set(gguf.DEFAULT_LIMITS)


# --------------------------------------------------------------------------- strings that are not UTF-8


def _invalid_keys_file():
    b = GGUFBuilder()
    b.add("general.architecture", STRING, "llama")
    b.add(b"general.tag\xff", STRING, b"first \xff")
    b.add(b"general.tag\xfe", STRING, b"second \xfe")
    b.add("general.name", STRING, b"caf\xe9 model")
    b.tensor("token_embd.weight", [32, 4], "F32")
    return b


def test_keys_that_differ_only_in_invalid_bytes_are_distinct_like_in_llama_cpp(tmp_path):
    """llama.cpp compares keys as raw bytes (std::string): b'..\\xff' and b'..\\xfe' are two keys. Decoding
    with replacement first made them one, reported as a duplicate key."""
    path = _write(tmp_path, _invalid_keys_file().build().data)
    info = gguf.inspect(path, include_kv=True)
    assert info["kv_count"] == 4
    assert info["name"] == "caf\ufffd model"
    kv = info["kv"]
    assert kv["general.tag\\xff"] == "first \ufffd" and kv["general.tag\\xfe"] == "second \ufffd"
    json.dumps(info, ensure_ascii=False).encode("utf-8")  # no lone surrogates reach Ansible


def test_true_duplicates_are_still_refused(tmp_path):
    b = GGUFBuilder()
    b.add("general.architecture", STRING, "llama")
    b.add(b"general.tag\xff", STRING, "a").add(b"general.tag\xff", STRING, "b")
    with pytest.raises(gguf.GGUFError, match="duplicate key"):
        gguf.inspect(_write(tmp_path, b.build().data))


def test_tensor_names_are_compared_and_measured_as_bytes(tmp_path):
    """63 raw bytes is the longest name llama.cpp takes, whatever the bytes are; names that differ only in
    invalid bytes are different tensors."""
    b = GGUFBuilder()
    b.add("general.architecture", STRING, "llama")
    b.tensor(b"blk.0." + b"\xff" * 57, [32], "F32")
    b.tensor(b"blk.0." + b"\xfe" * 57, [32], "F32")
    info = gguf.inspect(_write(tmp_path, b.build().data))
    assert info["tensor_count"] == 2
    b = GGUFBuilder()
    b.add("general.architecture", STRING, "llama")
    b.tensor(b"blk.0." + b"\xff" * 58, [32], "F32")
    with pytest.raises(gguf.GGUFError, match="is 64 bytes, llama.cpp allows at most 63"):
        gguf.inspect(_write(tmp_path, b.build().data))


def test_invalid_utf8_architecture_and_template_are_returned_replaced(tmp_path):
    b = GGUFBuilder()
    b.add("general.architecture", STRING, b"llama\xff")
    b.add(b"llama\xff.block_count", UINT32, 1)
    b.add("tokenizer.chat_template", STRING, b"{{ m.__class__ }}\xc3")
    b.add("x.list", ARRAY, [b"a\xff", b"b"], STRING)
    b.add("x.u8", ARRAY, [1, 2], UINT8)
    b.tensor("blk.0.attn_norm.weight", [32], "F32")
    info = gguf.inspect(_write(tmp_path, b.build().data), include_kv=True)
    assert info["architecture"] == "llama\ufffd" and info["block_count"] == 1
    assert info["chat_template"] == "{{ m.__class__ }}\ufffd"
    assert info["chat_template_risks"] == ["__class__"]
    assert info["kv"]["x.list"] == {"type": "array", "element_type": "string", "count": 2,
                                    "values": ["a\ufffd", "b"]}
    json.dumps(info, ensure_ascii=False).encode("utf-8")


def test_llama_cpp_reads_keys_as_raw_bytes():
    """The behaviour mirrored above, checked in the pinned llama.cpp source: keys are std::string (no UTF-8
    validation) and duplicates are found with an unordered_set of those bytes."""
    from tests.fixtures import llama_cpp_source
    with open(os.path.join(llama_cpp_source.ensure_source(), "ggml", "src", "gguf.cpp")) as f:
        source = f.read()
    assert "std::unordered_set<std::string> seen_keys;" in source
    assert "!seen_keys.insert(key).second" in source
    body = source.split("bool read(std::string & dst) const {")[1].split("bool read(void * dst")[0]
    assert "dst.resize" in body and "utf" not in body.lower()


def test_module_fails_cleanly_on_a_hostile_file(tmp_path):
    """The module turns every crafted count into a failed task with a message, never a traceback."""
    import subprocess
    import sys

    from tests.helpers import ROOT as root
    path = _write(tmp_path, _vocab_only("qwen35", 1 << 63).build().data)
    args = tmp_path / "args.json"
    args.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": {"path": path}}))
    module = os.path.join(root, "plugins", "modules", "gguf_info.py")
    proc = subprocess.run([sys.executable, module, str(args)],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60, check=False,
                          env=dict(os.environ, PYTHONPATH=os.path.join(root, "collections")))
    result = json.loads(proc.stdout.decode())
    assert result["failed"] is True and "block_count" in result["msg"] and "Traceback" not in result["msg"]
