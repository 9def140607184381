# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The tiny-GGUF generator (tests/fixtures/gguf/make_tiny_model.py): the files are real GGUF models that
gguf_info describes correctly, that agree with llama.cpp's gguf-py, and that llama-server loads and serves
(with MTP speculative decoding for qwen35)."""
import hashlib
import json
import os
import socket
import struct
import subprocess
import sys
import urllib.request

import pytest
from ansible_collections.llmops.serving.plugins.module_utils._model_format import gguf

from tests.fixtures import llama_cpp_source

np = pytest.importorskip("numpy")

from tests.fixtures.gguf import make_tiny_model as mtm  # noqa: E402  (needs numpy)
from tests.helpers import ROOT, wait_healthy  # noqa: E402


@pytest.fixture(scope="module")
def qwen35():
    return mtm.cached_tiny_model("qwen35")


@pytest.fixture(scope="module")
def llama():
    return mtm.cached_tiny_model("llama")


_READERS = {}


def _reader(path):
    """gguf-py's reader for path (slow on big vocabularies: built once per file)."""
    sys.path.insert(0, llama_cpp_source.gguf_py_path())
    import gguf as gguf_py
    if path not in _READERS:
        _READERS[path] = gguf_py.GGUFReader(path)
    return gguf_py, _READERS[path]


def test_qwen35_hybrid_layout_and_mtp(qwen35):
    info = gguf.inspect(qwen35)
    h = mtm.QWEN35
    assert info["architecture"] == "qwen35"
    assert info["block_count"] == h["n_layer"] + h["n_nextn"] == 5
    assert info["nextn_predict_layers"] == 1
    assert info["layer_types"] == ["recurrent", "recurrent", "recurrent", "attention", "nextn"]
    assert info["attention_layers"] == [3] and info["recurrent_layers"] == [0, 1, 2]
    assert info["nextn_layers"] == [4] and info["hybrid"] is True
    assert info["full_attention_interval"] == 4
    assert info["key_length"] == info["value_length"] == 64 and info["key_length"] % 32 == 0
    assert info["ssm"] == {"conv_kernel": 4, "state_size": 32, "group_count": 2, "time_step_rank": 4,
                           "inner_size": 128}
    assert info["tokenizer_model"] == "gpt2" and info["tokenizer_pre"] == "qwen35"
    assert info["vocab_size"] == 151936
    assert "<|im_start|>" in info["chat_template"] and info["chat_template_risks"] == []
    assert info["file_type"] == "MOSTLY_Q4_0"
    assert set(info["tensor_types"]) == {"Q4_0", "Q8_0", "F32"}
    assert info["size"] < 16 * 1024 * 1024
    assert all(b > 0 for b in info["layer_bytes"])


def test_qwen35_tensor_names_match_llama_cpp_expectations(qwen35):
    sys.path.insert(0, llama_cpp_source.gguf_py_path())
    import gguf as gguf_py
    names = {t["name"] for t in gguf.read_structure(qwen35)["tensors"]}
    allowed = {gguf_py.TENSOR_NAMES[t] for t in gguf_py.MODEL_TENSORS[gguf_py.MODEL_ARCH.QWEN35]}
    for name in names:
        base = name.rsplit(".", 1)[0] if name.endswith((".weight", ".bias")) else name
        generic = ".".join("{bid}" if p.isdigit() else p for p in base.split("."))
        assert generic in allowed, name
    for il in range(3):
        assert "blk.%d.ssm_a" % il in names and "blk.%d.ssm_dt.bias" % il in names
        assert "blk.%d.attn_qkv.weight" % il in names and "blk.%d.attn_q.weight" % il not in names
    assert "blk.3.attn_q.weight" in names and "blk.3.ssm_a" not in names
    for suffix in ("eh_proj", "enorm", "hnorm", "shared_head_norm"):
        assert "blk.4.nextn.%s.weight" % suffix in names


@pytest.fixture(scope="module")
def small_vocab_models(tmp_path_factory):
    """Both architectures with the smallest real vocabulary (llama-spm, 32000 tokens): quick for gguf-py."""
    d = tmp_path_factory.mktemp("small-vocab")
    return dict((arch, mtm.make_tiny_model(arch, str(d / ("%s.gguf" % arch)), vocab="llama-spm"))
                for arch in ("llama", "qwen35"))


@pytest.mark.parametrize("arch", ["llama", "qwen35"])
def test_parser_agrees_with_gguf_py(arch, small_vocab_models):
    path = small_vocab_models[arch]
    gguf_py, reader = _reader(path)
    s = gguf.read_structure(path)
    assert [t["name"] for t in s["tensors"]] == [t.name for t in reader.tensors]
    assert [t["nbytes"] for t in s["tensors"]] == [int(t.n_bytes) for t in reader.tensors]
    assert ([s["data_offset"] + t["offset"] for t in s["tensors"]]
            == [int(t.data_offset) for t in reader.tensors])
    assert [t["shape"] for t in s["tensors"]] == [[int(d) for d in t.shape] for t in reader.tensors]
    assert sorted(s["kv"]) == sorted(k for k in reader.fields if not k.startswith("GGUF."))
    assert gguf.inspect(path)["vocab_size"] == 32000


def test_llama_model(llama):
    info = gguf.inspect(llama)
    assert info["architecture"] == "llama" and info["block_count"] == 2
    assert info["layer_types"] == ["attention", "attention"] and not info["hybrid"]
    assert info["nextn_predict_layers"] == 0
    assert info["vocab_size"] == 128256 and info["tokenizer_pre"] == "llama-bpe"
    assert "<|start_header_id|>" in info["chat_template"]


def test_tokenizer_copied_verbatim(qwen35):
    """The serialized tokenizer.* key/values of the vocab file appear byte for byte in the model."""
    vocab = mtm.vocab_path("qwen35")
    s = gguf.read_structure(vocab)
    keys = list(s["kv"])
    first = keys.index("tokenizer.ggml.model")
    assert all(k.startswith("tokenizer.") for k in keys[first:])
    with open(vocab, "rb") as f:
        vdata = f.read()
    key = b"tokenizer.ggml.model"
    start = vdata.index(struct.pack("<Q", len(key)) + key)
    block = vdata[start:s["header_size"]]
    assert len(block) > 5 * 1024 * 1024
    with open(qwen35, "rb") as f:
        assert block in f.read()


@pytest.mark.slow
def test_generation_is_deterministic(tmp_path, qwen35):
    out = str(tmp_path / "again.gguf")
    assert mtm.make_tiny_model("qwen35", out) == out
    assert _sha(out) == _sha(qwen35)
    assert not [p for p in os.listdir(str(tmp_path)) if ".partial" in p]


def test_cli(tmp_path):
    out = str(tmp_path / "cli.gguf")
    proc = subprocess.run([sys.executable, "-m", "tests.fixtures.gguf.make_tiny_model", "--arch", "llama",
                           "--out", out, "--vocab", "llama-spm", "--name", "cli-test"],
                          cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True)
    assert proc.returncode == 0, proc.stderr
    info = gguf.inspect(out)
    assert info["name"] == "cli-test" and info["tokenizer_model"] == "llama" and info["vocab_size"] == 32000
    bad = subprocess.run([sys.executable, "-m", "tests.fixtures.gguf.make_tiny_model", "--arch", "llama",
                          "--out", out, "--vocab", "nope"], cwd=ROOT, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, universal_newlines=True)
    assert bad.returncode == 2 and "no vocab 'nope'" in bad.stderr and "qwen35" in bad.stderr


def _sha(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


# --- serving with a real llama-server --------------------------------------------------------------

def _llama_server():
    path = os.environ.get("LLMOPS_LLAMA_SERVER") or os.path.join(ROOT, ".cache", "host-build", "bin",
                                                                   "llama-server")
    if not os.access(path, os.X_OK):
        pytest.skip("no llama-server binary (set LLMOPS_LLAMA_SERVER or build .cache/host-build)")
    return path


def _free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def _serve_and_chat(model, extra, tmp_path):
    port = _free_port()
    log = open(str(tmp_path / "server.log"), "w")
    proc = subprocess.Popen([_llama_server(), "-m", model, "--host", "127.0.0.1", "--port", str(port),
                             "-t", "2"] + extra, stdout=log, stderr=subprocess.STDOUT)
    base = "http://127.0.0.1:%d" % port
    try:
        wait_healthy(proc, base, str(tmp_path / "server.log"))
        body = json.dumps({"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 16,
                           "temperature": 0.7}).encode()
        req = urllib.request.Request(base + "/v1/chat/completions", data=body,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as r:
            return json.loads(r.read().decode())
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


SEED_FLAGS = ["-c", "4096", "--parallel", "2", "--kv-unified", "-ctk", "q8_0", "-ctv", "q8_0",
              "--spec-type", "draft-mtp", "--spec-draft-n-max", "3", "--spec-draft-p-min", "0.85",
              "--jinja", "-fa", "auto"]


@pytest.mark.needs_llama_server
def test_llama_server_serves_qwen35_with_mtp(qwen35, tmp_path):
    reply = _serve_and_chat(qwen35, SEED_FLAGS, tmp_path)
    assert reply["usage"]["completion_tokens"] == 16
    assert reply["choices"][0]["message"]["content"]
    # the MTP head drafts and the trunk accepts: speculative decoding really runs
    assert reply["timings"]["draft_n"] > 0
    assert reply["timings"]["draft_n_accepted"] > 0


@pytest.mark.needs_llama_server
def test_llama_server_serves_llama(llama, tmp_path):
    reply = _serve_and_chat(llama, ["-c", "2048", "--jinja", "-ctk", "q8_0", "-ctv", "q8_0", "-fa", "auto"],
                            tmp_path)
    assert reply["usage"]["completion_tokens"] == 16
    assert reply["usage"]["prompt_tokens"] > 5  # the Llama 3 template was applied


@pytest.mark.parametrize("arch", ["qwen35", "llama"])
def test_split_set_figures_equal_the_unsplit_model(arch):
    """A 3-part split of the tiny model, laid out by llama.cpp's gguf-py writer (key/values in the first
    part only), gives the unsplit file's layer_bytes, non_layer_tensors, tensor_bytes...: what the memory
    planner reads covers the whole model, the named part's own figures stay in split_set.parts."""
    from tests.fixtures.gguf.split_model import cached_split_tiny_model
    source = mtm.cached_tiny_model(arch)
    paths = cached_split_tiny_model(arch, parts=3)
    whole = gguf.inspect(source)
    first = gguf.read_structure(paths[0])
    info = gguf.add_split_set(gguf.summarize(first), first)
    for key in gguf.TENSOR_FIELDS:
        assert info[key] == whole[key], key
    parts = info["split_set"]["parts"]
    assert [p["path"] for p in parts] == paths and [p["size"] for p in parts] == [os.path.getsize(p)
                                                                                   for p in paths]
    assert info["split_set"]["tensor_bytes"] == whole["tensor_bytes"] == sum(p["tensor_bytes"] for p in parts)
    named = gguf.summarize(first)  # the first part alone holds about a third of the tensors
    assert [parts[0][k] for k in gguf.TENSOR_FIELDS] == [named[k] for k in gguf.TENSOR_FIELDS]
    assert all(p["tensor_count"] < whole["tensor_count"] for p in parts)
    assert parts[0]["layer_bytes"] != whole["layer_bytes"]
    assert "general.architecture" not in gguf.read_structure(paths[1])["kv"]  # llama.cpp's layout
