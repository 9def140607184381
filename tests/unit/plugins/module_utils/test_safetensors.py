# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""safetensors headers (issue 22): checked as the safetensors library checks them, read locally or from the
hub with two Range requests per shard, and the vLLM planner given the same model before the download as after
it."""
import json
import os
import struct
import time

import pytest
from ansible_collections.llmops.serving.plugins.module_utils._download.messages import DownloadError
from ansible_collections.llmops.serving.plugins.module_utils._memory_plan import plan as mp
from ansible_collections.llmops.serving.plugins.module_utils._model_format import safetensors as st
from ansible_collections.llmops.serving.plugins.module_utils._model_format import safetensors_remote as sr

from tests.fixtures.fake_hub import checkpoint
from tests.fixtures.fake_hub.server import FakeHub

REPO = checkpoint.REPO
SHARDS = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
TOKEN = "hf_SafeTensorsToken0123456789"


@pytest.fixture
def repo_dir(tmp_path):
    d = tmp_path / "hub" / "Qwen" / "Qwen3.6-27B-FP8"
    checkpoint.write_checkpoint(d)
    return d


@pytest.fixture
def hub(tmp_path, repo_dir):
    h = FakeHub(str(tmp_path / "hub")).start()
    yield h
    h.stop()


def params(hub, **kw):
    return dict(dict(repo=REPO, endpoint=hub.url, retry_delay=0.01, timeout=2), **kw)


def header_file(tmp_path, header, data=b"", length=None, name="x.safetensors"):
    raw = json.dumps(header).encode() if not isinstance(header, bytes) else header
    path = tmp_path / name
    path.write_bytes(struct.pack("<Q", len(raw) if length is None else length) + raw + data)
    return str(path)


def test_fixture_shards_parse_like_safetensors(repo_dir):
    info = st.read_local(str(repo_dir / SHARDS[0]))
    assert info["tensor_count"] == 11 and info["dtypes"]["F8_E4M3"] == 4 * 64 * 128
    assert info["tensor_bytes"] + info["header_bytes"] + 8 == info["size"] == os.path.getsize(
        str(repo_dir / SHARDS[0]))
    assert info["metadata"] == {"format": "pt"}


T = {"dtype": "BF16", "shape": [2, 3], "data_offsets": [0, 12]}
HOSTILE = {
    "length-over-limit": (dict(a=T), b"\0" * 12, 1 << 62, "over the limit"),
    "length-past-the-file": (dict(a=T), b"\0" * 12, 10 ** 6, "runs past the end"),
    "not-json": (b"{not json", b"", None, "not JSON"),
    "deep-json": (b"[" * 100000 + b"]" * 100000, b"", None, "not JSON"),
    "not-object": ([1, 2], b"", None, "not a JSON object"),
    "unknown-dtype": (dict(a=dict(T, dtype="F128")), b"\0" * 12, None, "unknown dtype"),
    "negative-dim": (dict(a=dict(T, shape=[-2, -3])), b"\0" * 12, None, "not a non-negative integer"),
    "bool-dim": (dict(a=dict(T, shape=[True, 12])), b"\0" * 12, None, "not a non-negative integer"),
    "huge-shape": (dict(a=dict(T, shape=[2 ** 40, 2 ** 40])), b"\0" * 12, None, "data_offsets say 12"),
    "bad-offsets": (dict(a=dict(T, data_offsets=[12, 0])), b"\0" * 12, None, "not \\[begin, end\\]"),
    "gap": (dict(a=dict(T, data_offsets=[4, 16])), b"\0" * 16, None, "a gap or an overlap"),
    "overlap": (dict(a=T, b=dict(T, data_offsets=[6, 18])), b"\0" * 18, None, "a gap or an overlap"),
    "truncated": (dict(a=T), b"\0" * 6, None, "truncated or padded"),
    "padded": (dict(a=T), b"\0" * 20, None, "truncated or padded"),
    "metadata": (dict(a=T, __metadata__={"k": 1}), b"\0" * 12, None, "__metadata__"),
    "sub-byte": (dict(a=dict(T, dtype="F4", shape=[3], data_offsets=[0, 2])), b"\0" * 2, None, "not whole"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_crafted_headers_are_refused_fast(tmp_path, case):
    header, data, length, why = HOSTILE[case]
    path = header_file(tmp_path, header, data, length)
    t0 = time.process_time()  # CPU time: a loaded machine stretches the wall clock, not the work
    with pytest.raises(st.SafetensorsError, match=why):
        st.read_local(path)
    assert time.process_time() - t0 < 1.0


def test_a_link_or_fifo_is_never_read(tmp_path, repo_dir):
    os.symlink(str(repo_dir / SHARDS[0]), str(tmp_path / "link.safetensors"))
    with pytest.raises(OSError):
        st.read_local(str(tmp_path / "link.safetensors"))
    os.mkfifo(str(tmp_path / "fifo.safetensors"))
    with pytest.raises(st.SafetensorsError, match="not a regular file"):
        st.read_local(str(tmp_path / "fifo.safetensors"))


def test_remote_summary_is_the_local_one_read_with_two_ranges_per_shard(hub, repo_dir):
    r = sr.remote_summary(params(hub))
    local, shards = st.local_summary(str(repo_dir), mp.vllm_summary)
    assert dict(r["vllm"], model_dir=None) == dict(local, model_dir=None)
    assert [dict(s) for s in r["shards"]] == [dict(s, name=s["name"]) for s in shards]
    assert r["commit"] == hub.commit(REPO) and r["remote"]["revision"] == r["commit"]
    ranged = [e for e in hub.requests() if e["range"]]
    for name, info in zip(SHARDS, r["shards"]):  # noqa: B905
        mine = [e["range"] for e in ranged if e["path"].startswith("/cdn/") and name in e["path"]]
        assert mine == ["bytes=0-7", "bytes=8-%d" % (8 + info["header_bytes"] - 1)]
    # nothing but headers: every shard body byte the hub sent is a header byte (or its length)
    sent = sum(e["body_bytes"] for e in ranged)
    assert sent == r["remote"]["bytes_read"] <= sum(8 + s["header_bytes"] + 16 for s in r["shards"])
    assert r["remote"]["requests"] == 4 + 2 * len(SHARDS)  # revision, tree, config.json, index, 2 per shard


def test_remote_plan_before_the_download_equals_the_plan_after_it(hub, repo_dir):
    gpu = {"index": 0, "name": "NVIDIA L20", "memory_total_mib": 46068, "memory_free_mib": 46000}
    settings = {"max_model_len": 4096, "gpu_memory_utilization": 0.5}
    before, _m, _r = mp.plan_instances([{"name": "v", "engine": "vllm", "gpus": [0], "settings": settings,
                                         "model": sr.remote_summary(params(hub))["vllm"]}], [gpu])
    after, _m, _r = mp.plan_instances([{"name": "v", "engine": "vllm", "gpus": [0], "settings": settings,
                                        "model_dir": str(repo_dir)}], [gpu])
    assert before["v"]["planned"] and before["v"]["message"].split(": ", 1)[1] == \
        after["v"]["message"].split(": ", 1)[1]
    assert before["v"]["gpus"] == after["v"]["gpus"]


def test_remote_patterns_select_the_shards(hub):
    r = sr.remote_summary(params(hub), allow=["config.json", "model-00001*"])
    assert [s["name"] for s in r["shards"]] == [SHARDS[0]]
    assert r["vllm"]["weights_bytes"] == r["shards"][0]["size"]
    with pytest.raises(DownloadError, match="no config.json"):
        sr.remote_summary(params(hub), ignore=["config.json"])


def test_server_ignoring_range_is_refused_without_reading_the_shard(hub):
    hub.set_fault("ignore_range")
    with pytest.raises(DownloadError, match="does not support range requests"):
        sr.remote_summary(params(hub))
    # refused at the first answer (a 200 with the whole shard), its body never read, nothing asked again
    time.sleep(0.5)  # the hub logs a response once it has sent it
    assert [e["range"] for e in hub.requests()
            if e["path"].startswith("/cdn/") and ".safetensors?" in e["path"]] == ["bytes=0-7"]


def test_config_that_does_not_match_the_listing_is_refused(hub):
    hub.set_fault("corrupt", offset=5, times=1)
    with pytest.raises(DownloadError, match="config.json of .* does not match the listing's git blob id"):
        sr.remote_summary(params(hub))


def test_shard_cut_short_on_the_hub_is_refused(hub, repo_dir):
    data = (repo_dir / SHARDS[1]).read_bytes()
    (repo_dir / SHARDS[1]).write_bytes(data[:-10])  # the listing and Content-Range agree on the short size
    with pytest.raises(st.SafetensorsError, match="truncated or padded"):
        sr.remote_summary(params(hub))


def test_remote_token_goes_only_to_the_endpoint_origin(tmp_path, repo_dir):
    cdn = FakeHub(str(tmp_path / "hub")).start()
    hub = FakeHub(str(tmp_path / "hub"), gated=(REPO,), tokens=(TOKEN,), cdn_host="127.0.0.1:%d" % cdn.port)
    hub.start()
    try:
        with pytest.raises(DownloadError, match="gated or private") as e:
            sr.remote_summary(params(hub))
        assert TOKEN not in e.value.msg
        r = sr.remote_summary(params(hub, token=TOKEN))
        assert TOKEN not in json.dumps(r) and len(r["shards"]) == 2
        assert [e for e in cdn.requests() if e["path"].startswith("/cdn/")]
        assert [e for e in cdn.requests() if e["authorization"]] == []
        assert all(e["authorization"] for e in hub.requests() if e["status"] == 200)
    finally:
        hub.stop()
        cdn.stop()


# ---------------------------------------------------------------------------------------------------------
# Issue 34: what config.json and the shard index may make the readers do


def write_config(model_dir, **text_config):
    config = checkpoint.config()
    config["text_config"].update(text_config)
    (model_dir / "config.json").write_text(json.dumps(config))


@pytest.mark.parametrize("key,value", [
    ("num_hidden_layers", 30000000), ("num_hidden_layers", 300000000), ("num_hidden_layers", 10 ** 400),
    ("num_hidden_layers", 1e400), ("num_hidden_layers", "many"), ("num_hidden_layers", -1),
    ("mtp_num_hidden_layers", 5000), ("full_attention_interval", 10 ** 9), ("num_experts", 10 ** 9),
    ("vocab_size", 2 ** 40), ("hidden_size", 1.5),
])
def test_a_config_count_out_of_range_is_refused_fast(repo_dir, key, value):
    write_config(repo_dir, **{key: value})
    t0 = time.process_time()
    for read in (lambda: mp.vllm_model_summary(str(repo_dir)),
                 lambda: st.local_summary(str(repo_dir), mp.vllm_summary)):
        with pytest.raises(mp.PlanError, match="%s.*(must be|out of range|not a real model)" % key):
            read()
    assert time.process_time() - t0 < 1.0  # 30,000,000 layers took 26 s and 1.7 GB


def test_real_counts_up_to_the_caps_are_read(repo_dir):
    write_config(repo_dir, num_hidden_layers=4096, full_attention_interval=4, num_experts=512,
                 vocab_size=262144, max_position_embeddings=10485760)
    summary = mp.vllm_model_summary(str(repo_dir))
    assert summary["num_hidden_layers"] == 4096 and len(summary["layer_types"]) == 4096
    assert summary["full_attention_layers"] == 1024 and summary["max_position_embeddings"] == 10485760
    write_config(repo_dir, num_hidden_layers=4097)
    with pytest.raises(mp.PlanError, match="num_hidden_layers must be from 0 to 4096, got 4097"):
        mp.vllm_model_summary(str(repo_dir))


def test_the_remote_config_is_capped_the_same(hub, repo_dir):
    write_config(repo_dir, num_hidden_layers=30000000)
    with pytest.raises(mp.PlanError, match="num_hidden_layers must be from 0 to 4096"):
        sr.remote_summary(params(hub))


def test_a_fifo_or_device_link_as_config_json_is_refused_not_read(repo_dir):
    from tests.unit.plugins.module_utils.test_local_read import within
    config = repo_dir / "config.json"
    config.unlink()
    os.mkfifo(str(config))
    with within(10):
        for read in (lambda: mp.vllm_model_summary(str(repo_dir)),
                     lambda: st.local_summary(str(repo_dir), mp.vllm_summary)):
            with pytest.raises((mp.PlanError, OSError), match="config.json .* is a FIFO"):
                read()
    config.unlink()
    os.symlink("/dev/zero", str(config))
    with within(10):
        with pytest.raises(mp.PlanError, match=r"config.json .* is a symbolic link \(to /dev/zero\)"):
            mp.vllm_model_summary(str(repo_dir))
        with pytest.raises(OSError, match=r"is a symbolic link \(to /dev/zero\)"):
            st.local_summary(str(repo_dir), mp.vllm_summary)


def test_an_index_wins_over_a_consolidated_copy(hub, repo_dir):
    one = sum((repo_dir / s).stat().st_size for s in SHARDS)
    # Mistral's layout: the sharded weights, their index, and the same weights again in one file
    (repo_dir / "consolidated.safetensors").write_bytes(checkpoint.safetensors_bytes(
        [t for shard in checkpoint.shard_tensors() for t in shard]))
    local, shards = st.local_summary(str(repo_dir), mp.vllm_summary)
    remote = sr.remote_summary(params(hub))
    planned = mp.vllm_model_summary(str(repo_dir))
    for summary in (local, remote["vllm"], planned):
        assert summary["weights_bytes"] == one
        assert summary["weights_index"] == "model.safetensors.index.json"
        assert summary["weights_files"] == SHARDS
        assert summary["weights_ignored"] == ["consolidated.safetensors"]
    assert [s["name"] for s in shards] == SHARDS == [s["name"] for s in remote["shards"]]


def test_without_an_index_every_top_level_shard_counts(repo_dir):
    (repo_dir / "model.safetensors.index.json").unlink()
    summary = mp.vllm_model_summary(str(repo_dir))
    assert summary["weights_index"] is None and summary["weights_files"] == SHARDS
    assert summary["weights_bytes"] == sum((repo_dir / s).stat().st_size for s in SHARDS)


def test_an_index_naming_a_missing_shard_is_refused_naming_it(hub, repo_dir):
    (repo_dir / SHARDS[1]).unlink()
    why = "names 1 shard.s. the model does not have: %s" % SHARDS[1]
    with pytest.raises(st.SafetensorsError, match=why):
        st.local_summary(str(repo_dir), mp.vllm_summary)
    with pytest.raises(mp.PlanError, match=why):
        mp.vllm_model_summary(str(repo_dir))
    with pytest.raises(st.SafetensorsError, match=why):
        sr.remote_summary(params(hub))
    # the patterns leave a shard out while selecting the index: the same refusal
    (repo_dir / SHARDS[1]).write_bytes(checkpoint.files()[SHARDS[1]])
    with pytest.raises(st.SafetensorsError, match=why):
        sr.remote_summary(params(hub), allow=["*.json", "model-00001*"])


@pytest.mark.parametrize("index", [{"weight_map": {}}, {"weight_map": {"a": "../x.safetensors"}}, [],
                                   {"weight_map": {"a": 5}}])
def test_an_index_that_is_not_one_is_refused(repo_dir, index):
    (repo_dir / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(st.SafetensorsError, match="(no weight_map|not a \\*.safetensors file)"):
        st.local_summary(str(repo_dir), mp.vllm_summary)
