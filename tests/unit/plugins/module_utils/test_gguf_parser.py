# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""gguf_info's parser (plugins/module_utils/_model_format/gguf.py): crafted corpus, real vocab files, limits,
split sets,
chat template risks and the sha256 sidecar shared with model_download."""
import json
import os
import shutil
import time

import pytest
from ansible_collections.llmops.serving.plugins.module_utils._download import sidecar as model_sidecar
from ansible_collections.llmops.serving.plugins.module_utils._model_format import chat_template, gguf

from tests.fixtures import llama_cpp_source
from tests.fixtures.gguf import make_corpus
from tests.fixtures.gguf.builder import UINT32, GGUFBuilder, tiny_qwen35

CORPUS = make_corpus.CORPUS
with open(os.path.join(CORPUS, make_corpus.EXPECTED)) as _f:
    EXPECTED = json.load(_f)


def test_corpus_is_what_the_generator_writes():
    files, expected = make_corpus.build_all()
    assert expected == EXPECTED, "run: python -m tests.fixtures.gguf.make_corpus"
    on_disk = sorted(n for n in os.listdir(CORPUS) if n.endswith(".gguf"))
    assert on_disk == sorted(files)
    for name, data in files.items():
        with open(os.path.join(CORPUS, name), "rb") as f:
            assert f.read() == data, name
    assert sum(len(d) for d in files.values()) < 256 * 1024  # small enough to commit


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_corpus_file(name):
    expectation = EXPECTED[name]
    path = os.path.join(CORPUS, name)
    start = time.monotonic()
    if "error" in expectation:
        with pytest.raises(gguf.GGUFError) as err:
            gguf.inspect(path)
        assert expectation["error"] in str(err.value)
        assert path in str(err.value)
    else:
        info = gguf.inspect(path)
        for key, value in expectation["ok"].items():
            assert info[key] == value, key
    assert time.monotonic() - start < 1.0


def test_errors_carry_the_offset_of_the_bad_field():
    built = tiny_qwen35().build()
    _, offset, _ = built.field("tensor.type", 3)
    path = _write(built.patch("tensor.type", 99, index=3))
    with pytest.raises(gguf.GGUFError) as err:
        gguf.read_structure(path)
    assert err.value.offset == offset
    assert "at byte offset %d" % offset in str(err.value)


def _write(data, name="x.gguf", directory=None):
    import tempfile
    directory = directory or tempfile.mkdtemp(prefix="gguf-test-")
    path = os.path.join(directory, name)
    with open(path, "wb") as f:
        f.write(data)
    return path


VOCABS = llama_cpp_source.vocab_models()


def test_llama_cpp_ships_vocab_models():
    assert len(VOCABS) >= 10


@pytest.mark.parametrize("path", VOCABS, ids=[os.path.basename(p) for p in VOCABS])
def test_every_real_vocab_only_file(path):
    # CPU time of this process, not wall time: a loaded CI machine stretches the wall clock, not the work
    start = time.process_time()
    info = gguf.inspect(path, include_kv=True)
    elapsed = time.process_time() - start
    assert elapsed < 2.0
    assert info["tensor_count"] == 0 and info["tensor_bytes"] == 0
    assert info["size"] == os.path.getsize(path)
    assert info["architecture"]
    assert info["tokenizer_model"] in ("gpt2", "llama", "bert", "t5", "rwkv", "ugm", "plamo2", "gemma4")
    tokens = info["kv"]["tokenizer.ggml.tokens"]
    assert tokens["type"] == "array" and tokens["element_type"] == "string"
    assert tokens["count"] == info["vocab_size"] and len(tokens["head"]) == gguf.ARRAY_HEAD
    assert info["kv_count"] == len(info["kv"])
    json.dumps(info)  # Ansible must be able to return it


def test_vocab_file_agrees_with_gguf_py():
    pytest.importorskip("numpy")
    import sys
    sys.path.insert(0, llama_cpp_source.gguf_py_path())
    import gguf as gguf_py
    path = [p for p in VOCABS if p.endswith("ggml-vocab-qwen35.gguf")][0]
    reader = gguf_py.GGUFReader(path)
    info = gguf.inspect(path, include_kv=True)
    keys = [k for k in reader.fields if not k.startswith("GGUF.")]
    assert sorted(keys) == sorted(info["kv"])
    assert info["vocab_size"] == len(reader.fields["tokenizer.ggml.tokens"].data)
    assert info["chat_template"] == reader.fields["tokenizer.chat_template"].contents()


def test_limits_are_configurable_and_checked():
    path = _write(tiny_qwen35().build().data)
    gguf.inspect(path)
    with pytest.raises(gguf.GGUFError, match="tensor count 12 is over the limit of 11"):
        gguf.inspect(path, limits={"max_tensors": 11})
    with pytest.raises(gguf.GGUFError, match="key/value count"):
        gguf.inspect(path, limits={"max_kv": 3})
    with pytest.raises(gguf.GGUFError, match="has 8 elements, over the limit of 7"):
        gguf.inspect(path, limits={"max_array_elements": 7})
    with pytest.raises(gguf.GGUFError, match="over the limit of 5 bytes"):
        gguf.inspect(path, limits={"max_string_bytes": 5})
    with pytest.raises(gguf.GGUFError, match="2 dimensions, at most 1"):
        gguf.inspect(path, limits={"max_dims": 1})
    with pytest.raises(ValueError, match="unknown GGUF limit"):
        gguf.inspect(path, limits={"max_tensor": 1})
    with pytest.raises(ValueError, match="positive integer"):
        gguf.inspect(path, limits={"max_dims": 0})
    gguf.inspect(path, limits={"max_dims": None})  # Ansible passes None for unset suboptions


def test_huge_declared_sizes_allocate_little_memory():
    import tracemalloc
    built = tiny_qwen35().build()
    bombs = [built.patch("array.count", (1 << 24)), built.patch("value.len", (1 << 24) - 1),
             built.patch("n_kv", 65536), built.patch("n_tensors", 65536),
             built.patch("array.count", 1 << 24, index=1)]
    tracemalloc.start()
    try:
        for data in bombs:
            with pytest.raises(gguf.GGUFError):
                gguf.inspect(_write(data))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 * 1024 * 1024


def test_include_kv_summarizes_long_arrays():
    b = tiny_qwen35(n_vocab=100)
    info = gguf.inspect(_write(b.build().data), include_kv=True)
    assert info["kv"]["qwen35.rope.dimension_sections"]["values"] == [11, 11, 10, 0]
    tokens = info["kv"]["tokenizer.ggml.tokens"]
    assert tokens == {"type": "array", "element_type": "string", "count": 100,
                      "head": ["t%d" % i for i in range(gguf.ARRAY_HEAD)]}
    assert info["kv"]["general.architecture"] == "qwen35"
    assert "kv" not in gguf.inspect(_write(b.build().data))


def test_bytes_per_layer_and_types():
    info = gguf.inspect(_write(tiny_qwen35().build().data))
    # per block: attn_norm F32 [32] = 128 bytes, ffn_down Q8_0 [32, 2] = 2 blocks of 34 bytes
    assert info["layer_bytes"] == [128 + 68] * 5
    assert info["non_layer_bytes"] == 8 * 34 + 128
    assert info["tensor_types"] == {"F32": {"count": 6, "bytes": 6 * 128},
                                    "Q8_0": {"count": 6, "bytes": 5 * 68 + 8 * 34}}
    assert info["tensor_bytes"] == sum(info["layer_bytes"]) + info["non_layer_bytes"]


@pytest.mark.parametrize("template,risks", [
    ("{{ cycler.__init__.__globals__.os.popen('id').read() }}", ["__globals__", "__init__", "os.", "popen"]),
    ("{{ ''.__class__.__mro__[1].__subclasses__() }}", ["__class__", "__subclasses__", "__mro__"]),
    ("{{ x|attr('__globals__') }}", ["__globals__"]),
    ("{% import 'macros' as m %}", ["import"]),
    ("{% from 'x' import y %}", ["import"]),
    ("{{ subprocess }}", ["subprocess"]),
    ("{{ eval('1') }}{{ open('/etc/passwd') }}", ["eval/exec", "open("]),
    ("You may import data with os.path{% for m in messages %}{{ m['content'] }}{% endfor %}", []),
    ("{{ 'import os' }}{{ \"os.system\" }}", []),
    ("{%- if message.content is string %}{{- message.content }}{%- endif %}", []),
    ("", []),
])
def test_chat_template_risks(template, risks):
    assert sorted(chat_template.chat_template_risks(template)) == sorted(risks)


def test_chat_template_risks_is_linear_on_hostile_input():
    # CPU time of this process, not the wall clock: the test shares the machine with the other CI jobs. A
    # scan that backtracks is quadratic on these 4 MB inputs, i.e. minutes, not seconds.
    for hostile in ("{{" * 2000000, "{%" + "'" * 2000000, "{{ " + "\\'" * 1000000, "os" + " " * 2000000):
        start = time.process_time()
        chat_template.chat_template_risks(hostile)
        assert time.process_time() - start < 3.0


def test_real_qwen_style_template_has_no_risks():
    path = [p for p in VOCABS if p.endswith("ggml-vocab-qwen35.gguf")][0]
    info = gguf.inspect(path)
    assert info["chat_template"].startswith("{% for message in messages %}")
    assert info["chat_template_risks"] == []


# --- split sets -------------------------------------------------------------------------------------

def _split_set(tmp_path, count=3, per_part=12, overrides=None):
    overrides = overrides or {}
    paths = []
    for no in range(count):
        split = overrides.get(no, (no, count, count * per_part))
        path = tmp_path / ("model-%05d-of-%05d.gguf" % (no + 1, count))
        path.write_bytes(tiny_qwen35(split=split).build().data)
        paths.append(str(path))
    return paths


def _check_split(path):
    s = gguf.read_structure(path)
    return gguf.check_split_set(gguf.summarize(s), s)


def _with_split_set(path, limits=None):
    s = gguf.read_structure(path, limits)
    return gguf.add_split_set(gguf.summarize(s), s, limits)


def test_split_set_complete(tmp_path):
    paths = _split_set(tmp_path)
    result = _check_split(paths[0])
    assert [p["path"] for p in result["parts"]] == paths
    assert result["count"] == 3 and result["tensor_count"] == 36
    assert result["size"] == sum(os.path.getsize(p) for p in paths) == sum(p["size"] for p in result["parts"])
    one = gguf.inspect(paths[0])
    for part in result["parts"]:  # each part's own figures, as summarize() gives them of that file alone
        assert dict((k, part[k]) for k in gguf.TENSOR_FIELDS) == dict((k, one[k]) for k in gguf.TENSOR_FIELDS)
    assert result["tensor_bytes"] == 3 * one["tensor_bytes"]


def test_split_set_figures_cover_the_whole_set(tmp_path):
    """Every part of this crafted set holds the same 12 tensors: the whole set's figures are 3 times one
    file's, the named part's stay in split_set.parts[split.no]."""
    paths = _split_set(tmp_path)
    one = gguf.inspect(paths[1])
    info = _with_split_set(paths[1])
    assert info["split"]["no"] == 1 and info["split_set"]["parts"][1]["path"] == paths[1]
    assert info["tensor_count"] == 36 == info["split_set"]["tensor_count"]
    assert info["tensor_bytes"] == 3 * one["tensor_bytes"] == info["split_set"]["tensor_bytes"]
    assert info["layer_bytes"] == [3 * n for n in one["layer_bytes"]]
    assert info["non_layer_bytes"] == 3 * one["non_layer_bytes"]
    assert info["non_layer_tensors"] == dict((k, 3 * v) for k, v in one["non_layer_tensors"].items())
    assert info["tensor_types"] == dict((t, {"count": 3 * e["count"], "bytes": 3 * e["bytes"]})
                                        for t, e in one["tensor_types"].items())
    assert info["size"] == one["size"]  # the named file's, the set's is split_set.size
    unsplit = tmp_path / "model.gguf"
    unsplit.write_bytes(tiny_qwen35().build().data)
    assert gguf.add_split_set(gguf.inspect(str(unsplit)), gguf.read_structure(str(unsplit))) \
        == gguf.inspect(str(unsplit))


def test_split_set_claiming_more_tensors_than_a_file_may_hold_fails_before_reading_parts(tmp_path):
    paths = _split_set(tmp_path, overrides={0: (0, 3, 70000)})
    os.remove(paths[1])
    with pytest.raises(gguf.GGUFError, match="split.tensors.count 70000 is over the limit of 65536"):
        _with_split_set(paths[0])
    paths = _split_set(tmp_path, overrides=dict((no, (no, 3, 30)) for no in range(3)))
    with pytest.raises(gguf.GGUFError, match="split.tensors.count 30 is over the limit of 20"):
        _with_split_set(paths[0], {"max_tensors": 20})


def test_split_set_with_more_parts_than_tensors_fails_before_reading_parts(tmp_path):
    paths = _split_set(tmp_path, count=3, overrides=dict((no, (no, 3, 1)) for no in range(3)))
    os.remove(paths[2])
    with pytest.raises(gguf.GGUFError, match="split.count 3 is more than split.tensors.count 1 \\+ 1"):
        _with_split_set(paths[0])


def test_split_set_holding_more_tensors_than_it_declares_fails_at_the_part_that_overflows(tmp_path):
    paths = _split_set(tmp_path, overrides=dict((no, (no, 3, 20)) for no in range(3)))
    with open(paths[2], "wb") as f:  # never read: parts 1 and 2 already hold 24 of the 20 declared
        f.write(b"not a GGUF file")
    overflow = "00002-of-00003.gguf: parts 1 to 2 of 3 already hold 24 tensors, more than the 20 of split"
    with pytest.raises(gguf.GGUFError, match=overflow):
        _with_split_set(paths[0])


def test_block_count_of_a_split_set_is_bounded_by_the_whole_set(tmp_path):
    """A first part may hold fewer tensors than the model has blocks (llama-gguf-split spreads them): 20
    blocks pass with 12 tensors in each of 3 parts, 40 do not."""
    def write(block_count):
        for no in range(3):
            b = tiny_qwen35(split=(no, 3, 36))
            b.kv = [(k, t, block_count if k == "qwen35.block_count" else v, sub) for k, t, v, sub in b.kv]
            (tmp_path / ("model-%05d-of-00003.gguf" % (no + 1))).write_bytes(b.build().data)
        return str(tmp_path / "model-00001-of-00003.gguf")
    info = _with_split_set(write(20))
    assert len(info["layer_bytes"]) == 20 == len(info["split_set"]["parts"][0]["layer_bytes"])
    with pytest.raises(gguf.GGUFError, match="qwen35.block_count 40 is more than the 36 tensors of the 3 "
                                             "parts of the split set"):
        _with_split_set(write(40))


def test_split_set_missing_part(tmp_path):
    paths = _split_set(tmp_path)
    os.remove(paths[2])
    with pytest.raises(gguf.GGUFError, match="split set incomplete: missing .*00003-of-00003"):
        _check_split(paths[0])


def test_split_set_inconsistent_parts(tmp_path):
    paths = _split_set(tmp_path, overrides={1: (5, 3, 36)})
    with pytest.raises(gguf.GGUFError, match="split.no is 5, expected 1"):
        _check_split(paths[0])
    paths = _split_set(tmp_path, overrides={2: (2, 3, 40)})
    with pytest.raises(gguf.GGUFError, match="split.tensors.count is 40"):
        _check_split(paths[0])
    paths = _split_set(tmp_path, overrides={0: (0, 3, 37), 1: (1, 3, 37), 2: (2, 3, 37)})
    with pytest.raises(gguf.GGUFError, match="hold 36 tensors but split.tensors.count is 37"):
        _check_split(paths[0])


def test_split_set_truncated_part(tmp_path):
    paths = _split_set(tmp_path)
    with open(paths[1], "r+b") as f:
        f.truncate(os.path.getsize(paths[1]) - 100)
    with pytest.raises(gguf.GGUFError, match="00002-of-00003.gguf: tensor .* truncated"):
        _check_split(paths[0])


def test_split_keys_without_split_name(tmp_path):
    path = tmp_path / "model.gguf"
    path.write_bytes(tiny_qwen35(split=(0, 2, 24)).build().data)
    with pytest.raises(gguf.GGUFError, match="cannot be found"):
        _check_split(str(path))


def test_unsplit_file_has_no_split_set(tmp_path):
    path = tmp_path / "model.gguf"
    path.write_bytes(tiny_qwen35().build().data)
    assert _check_split(str(path)) is None


# --- sha256 sidecar ---------------------------------------------------------------------------------

def test_sha256_comes_from_the_download_sidecar_and_nothing_is_written(tmp_path, monkeypatch):
    path = tmp_path / "m.gguf"
    path.write_bytes(tiny_qwen35().build().data)
    import hashlib
    want = hashlib.sha256(path.read_bytes()).hexdigest()
    calls = []
    real = model_sidecar.hash_file
    monkeypatch.setattr(model_sidecar, "hash_file", lambda p: calls.append(p) or real(p))
    side = tmp_path / ".m.gguf.llmops.json"
    assert model_sidecar.sha256_cached(str(path)) == (want, False)
    assert not side.exists()  # gguf_info is an _info module: it records nothing
    assert model_sidecar.sha256_cached(str(path)) == (want, False)
    assert len(calls) == 2
    # the record model_download writes for a file it verified is used as it is
    model_sidecar.write_sidecar_record(str(path), want, commit="c" * 40, source={"repo": "org/repo"})
    before = side.read_bytes()
    record = json.loads(before)
    assert record["sha256"] == want and record["version"] == model_sidecar.SIDECAR_VERSION
    assert model_sidecar.sidecar_matches_file(record, str(path))
    assert model_sidecar.sha256_cached(str(path)) == (want, True)
    assert len(calls) == 2
    assert model_sidecar.sha256_cached(str(path), force=True) == (want, False)
    assert len(calls) == 3 and side.read_bytes() == before  # force_verify re-hashes, changes no record
    # the file changes: size/mtime differ, the record no longer matches, the file is hashed again
    with open(str(path), "ab") as f:
        f.write(b"x")
    digest, cached = model_sidecar.sha256_cached(str(path))
    assert not cached and digest != want and side.read_bytes() == before


def test_stale_or_foreign_sidecar_is_not_trusted(tmp_path):
    path = tmp_path / "m.gguf"
    path.write_bytes(b"GGUF" + b"\0" * 100)
    import hashlib
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    side = tmp_path / ".m.gguf.llmops.json"
    side.write_text(json.dumps({"version": 1, "sha256": digest, "size": 1, "mtime_ns": 1, "inode": 1,
                                "commit": "c" * 40, "source": {"repo": "org/repo"}}))
    assert model_sidecar.recorded_sha256(str(path)) is None  # stale identity: not trusted
    model_sidecar.write_sidecar_record(str(path), "not hex")
    assert model_sidecar.recorded_sha256(str(path)) is None  # a record without a sha256 vouches for nothing
    model_sidecar.write_sidecar_record(str(path), digest)
    assert model_sidecar.recorded_sha256(str(path)) == digest
    os.chmod(str(path), 0o600)  # ctime moves: the record no longer describes the file
    assert model_sidecar.recorded_sha256(str(path)) is None


def test_unreadable_sidecar_is_ignored(tmp_path):
    path = tmp_path / "m.gguf"
    path.write_bytes(b"data")
    (tmp_path / ".m.gguf.llmops.json").write_text("{not json")
    assert model_sidecar.recorded_sha256(str(path)) is None
    (tmp_path / ".m.gguf.llmops.json").write_text("[1, 2]")
    assert model_sidecar.recorded_sha256(str(path)) is None


@pytest.mark.parametrize("value,ok", [
    ("A" * 64, True), ("sha256:" + "b" * 64, True), (" " + "c" * 64 + "\n", True),
    ("a" * 63, False), ("g" * 64, False), ("", False), (None, False),
])
def test_normalize_digest(value, ok):
    if ok:
        assert gguf.normalize_digest(value) == value.strip().lower().replace("sha256:", "")
    else:
        with pytest.raises(ValueError, match="64 hex digits"):
            gguf.normalize_digest(value)


def test_not_a_file(tmp_path):
    with pytest.raises(gguf.GGUFError, match="cannot stat"):
        gguf.inspect(str(tmp_path / "missing.gguf"))
    with pytest.raises(gguf.GGUFError, match="not a regular file"):
        gguf.inspect(str(tmp_path))


def test_alignment_key_respected(tmp_path):
    b = GGUFBuilder(alignment=256)
    b.add("general.architecture", 8, "llama").add("general.alignment", UINT32, 256)
    b.tensor("a.weight", [8], "F32").tensor("b.weight", [8], "F32")
    path = _write(b.build().data, directory=str(tmp_path))
    info = gguf.inspect(path)
    assert info["alignment"] == 256 and info["data_offset"] % 256 == 0
    shutil.copy(path, path + ".copy")
    with open(path + ".copy", "ab") as f:
        f.write(b"\0")
    with pytest.raises(gguf.GGUFError, match="1 unexpected bytes"):
        gguf.inspect(path + ".copy")


def _big_model_header():
    """Header and tensor table shaped like Qwen3.6-27B Q5_K (64 blocks + MTP, 248k vocab, ~19 GB)."""
    b = tiny_qwen35(n_vocab=248320)
    e, f, v = 5120, 17408, 248320
    b.tensor("token_embd.weight", [e, v], "Q5_K")
    for il in range(65):
        b.tensor("blk.%d.attn_norm.weight" % il, [e], "F32")
        b.tensor("blk.%d.attn_qkv.weight" % il, [e, 10240], "Q5_K")
        b.tensor("blk.%d.ffn_gate.weight" % il, [e, f], "Q5_K")
        b.tensor("blk.%d.ffn_up.weight" % il, [e, f], "Q5_K")
        b.tensor("blk.%d.ffn_down.weight" % il, [f, e], "Q5_K")
    b.tensors = [t for t in b.tensors if not (t["name"].startswith("blk.") and t["shape"] in ([32], [32, 2]))]
    b.tensors = [t for t in b.tensors if t["name"] != "token_embd.weight" or t["shape"][0] == e]
    return b.build(with_data=False)


def test_a_19_gb_model_is_checked_in_milliseconds_without_reading_data(tmp_path):
    built = _big_model_header()
    path = str(tmp_path / "big.gguf")
    with open(path, "wb") as f:
        f.write(built.data)
        f.truncate(built.total_size)  # sparse: the data section is a hole, never read
    assert built.total_size > 15 * 10 ** 9
    start = time.monotonic()
    info = gguf.inspect(path)
    elapsed = time.monotonic() - start
    assert info["size"] == built.total_size and info["vocab_size"] == 248320
    assert info["tensor_bytes"] > 15 * 10 ** 9 and info["tensor_types"]["Q5_K"]["count"] == 261
    assert elapsed < 1.0, "took %.3f s" % elapsed
    with open(path, "r+b") as f:  # one byte short: a truncated download, caught without hashing
        f.truncate(built.total_size - 1)
    with pytest.raises(gguf.GGUFError, match=r"truncated \(1 bytes missing\)"):
        gguf.inspect(path)
