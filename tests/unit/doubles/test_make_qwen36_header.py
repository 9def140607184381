# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The sparse Qwen3.6-27B stand-in (tests/fixtures/gguf/make_qwen36_header.py): sparse, the seed's size,
and the layout gguf_info and llama.cpp's qwen35 loader expect."""
import os
import re

import pytest
from ansible_collections.llmops.serving.plugins.module_utils._model_format import gguf

from tests.fixtures.gguf import make_qwen36_header

_BLK = re.compile(r"^blk\.(\d+)\.(.*)$")


@pytest.fixture(scope="module")
def qwen36(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("qwen36") / "qwen36.gguf")
    size = make_qwen36_header.write_qwen36_header(path)
    return path, size


def test_file_is_sparse_and_the_seed_size(qwen36):
    path, size = qwen36
    st = os.stat(path)
    assert st.st_size == size
    assert abs(size - make_qwen36_header.SEED_FILE_BYTES) / make_qwen36_header.SEED_FILE_BYTES < 0.01
    assert st.st_blocks * 512 < 4 * 1024 * 1024  # only the header is written


def test_gguf_info_reads_the_real_hyper_parameters(qwen36):
    info = gguf.inspect(qwen36[0])
    assert info["architecture"] == "qwen35"
    assert info["block_count"] == 65 and info["nextn_predict_layers"] == 1
    assert info["nextn_layers"] == [64]
    assert info["attention_layers"] == list(range(3, 64, 4))
    assert len(info["recurrent_layers"]) == 48
    assert (info["embedding_length"], info["feed_forward_length"]) == (5120, 17408)
    assert (info["head_count"], info["head_count_kv"]) == (24, 4)
    assert (info["key_length"], info["value_length"]) == (256, 256)
    assert info["ssm"] == {"conv_kernel": 4, "state_size": 128, "group_count": 16, "time_step_rank": 48,
                           "inner_size": 6144}
    assert info["vocab_size"] == 248320 and info["context_length"] == 262144
    assert info["tensor_bytes"] + info["data_offset"] == info["size"]
    types = info["tensor_types"]
    assert max(types, key=lambda t: types[t]["bytes"]) == "Q5_K"
    assert set(types) == {"F32", "Q4_K", "Q5_K", "Q6_K", "Q8_0"}
    # parameters: ~27B (Qwen3.6-27B)
    assert 26.5e9 < _parameters(qwen36[0]) < 28e9


def _parameters(path):
    total = 0
    for t in gguf.read_structure(path)["tensors"]:
        n = 1
        for d in t["shape"]:
            n *= d
        total += n
    return total


def _layout(path):
    """Tensor name suffixes per kind of block, and the names outside blocks."""
    info = gguf.inspect(path)
    kinds = info["layer_types"]
    per_kind = {}
    other = set()
    for t in gguf.read_structure(path)["tensors"]:
        m = _BLK.match(t["name"])
        if m:
            per_kind.setdefault(kinds[int(m.group(1))], set()).add(m.group(2))
        else:
            other.add(t["name"])
    return per_kind, other


def test_tensor_names_match_the_tiny_model_that_llama_cpp_loads(qwen36):
    # make_tiny_model's qwen35 file is loaded and served by the CPU llama-server in other tests: every
    # block kind must carry the same tensors (the stand-in adds an untied output head).
    from tests.fixtures.gguf.make_tiny_model import cached_tiny_model
    tiny_kinds, tiny_other = _layout(cached_tiny_model("qwen35"))
    kinds, other = _layout(qwen36[0])
    assert kinds == tiny_kinds
    assert other == tiny_other | {"output.weight"}


def test_shapes_follow_the_qwen35_loader(qwen36):
    c = make_qwen36_header.QWEN36
    shapes = dict((t["name"], t["shape"]) for t in gguf.read_structure(qwen36[0])["tensors"])
    conv_dim = c["ssm_d_state"] * c["ssm_n_group"] * 2 + c["ssm_d_inner"]
    assert shapes["blk.0.attn_qkv.weight"] == [5120, conv_dim] == [5120, 10240]
    assert shapes["blk.0.ssm_conv1d.weight"] == [4, 10240]
    assert shapes["blk.0.attn_gate.weight"] == [5120, 6144]
    assert shapes["blk.0.ssm_out.weight"] == [6144, 5120]
    assert shapes["blk.3.attn_q.weight"] == [5120, 256 * 24 * 2]
    assert shapes["blk.3.attn_k.weight"] == shapes["blk.3.attn_v.weight"] == [5120, 256 * 4]
    assert shapes["blk.64.attn_q.weight"] == [5120, 12288]
    assert shapes["blk.64.nextn.eh_proj.weight"] == [10240, 5120]
    assert shapes["token_embd.weight"] == shapes["output.weight"] == [5120, 248320]
