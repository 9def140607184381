# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""gguf_remote.py: a GGUF header read over HTTP Range from the fake hub gives the same facts as the local
file, costs few requests and bytes (a 19 GB sparse model: one window), refuses a server that ignores Range,
keeps the local reader's limits, and follows model_download's token rules."""
import os
import shutil
import time

import pytest
from ansible_collections.llmops.serving.plugins.module_utils._download.messages import DownloadError
from ansible_collections.llmops.serving.plugins.module_utils._model_format import gguf, gguf_remote

from tests.fixtures.fake_hub.server import FakeHub
from tests.fixtures.gguf.builder import ARRAY, STRING, UINT32, GGUFBuilder, tiny_qwen35

MIB = 1024 * 1024
TOKEN = "hf_RemoteHeaderToken0123456789"


@pytest.fixture
def hub(tmp_path):
    root = tmp_path / "hub"
    root.mkdir()
    h = FakeHub(str(root), gated=("org/gated",), tokens=(TOKEN,), hash_max_size=64 * MIB).start()
    yield h
    h.stop()


def put(hub, rel, data=None, source=None, sparse_size=None):
    """Place a file under the hub's root: bytes, a copy of source, or bytes extended sparsely."""
    path = os.path.join(hub.state.root, *rel.split("/"))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    if source:
        shutil.copyfile(source, path)
    else:
        with open(path, "wb") as f:
            f.write(data)
            if sparse_size:
                f.truncate(sparse_size)
    return path


def big_model():
    """A 27B-like header (65 blocks, Q5_K matrices) whose tensor data makes a ~20 GB file."""
    b = GGUFBuilder()
    b.add("general.architecture", STRING, "qwen35")
    b.add("general.name", STRING, "synthetic-27b")
    b.add("qwen35.block_count", UINT32, 65)
    b.add("qwen35.nextn_predict_layers", UINT32, 1)
    b.add("qwen35.full_attention_interval", UINT32, 4)
    b.add("tokenizer.ggml.tokens", ARRAY, ["t%d" % i for i in range(1000)], STRING)
    b.tensor("token_embd.weight", [5120, 248320], "Q5_K")
    for il in range(65):
        for name in ("ffn_gate", "ffn_up", "ffn_down"):
            b.tensor("blk.%d.%s.weight" % (il, name), [5120, 24576], "Q5_K")
        b.tensor("blk.%d.attn_qkv.weight" % il, [5120, 10240], "Q5_K")
    return b.build(with_data=False)


def hub_params(hub, **kw):
    p = dict(repo="org/m", filename="model.gguf", endpoint=hub.url, timeout=5, retries=1, retry_delay=0.01)
    p.update(kw)
    return p


def settled(hub):
    """The hub's request log once its handler threads are done: an entry is recorded after its response
    went out, so the client can be done before the log is."""
    log = hub.requests()
    deadline = time.monotonic() + 2
    while time.monotonic() < deadline:
        time.sleep(0.1)
        again = hub.requests()
        if len(again) == len(log):
            break
        log = again
    return log


def gets(hub):
    return [e for e in settled(hub) if e["method"] == "GET"]


def strip_path(info):
    return dict((k, v) for k, v in info.items() if k not in ("path", "remote", "identity"))


# --- same facts as the local file -----------------------------------------------------------------------

def test_real_tiny_model_remote_equals_local_and_reads_only_the_header(hub):
    from tests.fixtures.gguf import make_tiny_model as mtm  # needs numpy and the llama.cpp source
    local_path = mtm.cached_tiny_model("qwen35")
    put(hub, "org/m/model.gguf", source=local_path)
    local = gguf.inspect(local_path, include_kv=True)
    remote = gguf_remote.inspect_remote(hub_params(hub), include_kv=True)
    assert strip_path(remote) == strip_path(local)
    assert remote["path"] == hub.url + "/org/m/resolve/main/model.gguf"
    header = gguf.read_structure(local_path)["header_size"]  # 5.9 MB: the qwen35 vocabulary
    r = remote["remote"]
    assert r["url"] == remote["path"] and r["size"] == os.path.getsize(local_path)
    assert r["commit"] == hub.commit("org/m") and r["sha256"] and len(r["sha256"]) == 64
    # windows of 1, 2, 4 MiB: the header, never the 5.8 MB of tensor data after it
    assert header <= r["bytes_read"] <= 2 * header + MIB, r
    assert r["requests"] <= 5, r
    ranges = [e["range"] for e in gets(hub)]
    assert all(ranges), "every GET is a Range request"
    assert max(int(x.split("-")[1]) for x in ranges) < header + 4 * MIB
    assert sum(e["body_bytes"] for e in gets(hub)) == r["bytes_read"]
    # the same file by plain url (no hub metadata) gives the same facts
    hub.reset_stats()
    by_url = gguf_remote.inspect_remote({"url": hub.url + "/cdn/org/m/model.gguf?sig=s3cr3t", "timeout": 5},
                                        include_kv=True)
    assert strip_path(by_url) == strip_path(local)
    assert by_url["remote"]["url"] == hub.url + "/cdn/org/m/model.gguf"  # no query string
    assert "s3cr3t" not in repr(by_url)


def test_sparse_20_gb_model_costs_one_window(hub):
    built = big_model()
    assert built.total_size > 18 * 10 ** 9
    path = put(hub, "org/m/model.gguf", built.data, sparse_size=built.total_size)
    t0 = time.monotonic()
    remote = gguf_remote.inspect_remote(hub_params(hub))
    took = time.monotonic() - t0
    r = remote["remote"]
    assert r["size"] == built.total_size == remote["size"]
    assert r["bytes_read"] <= MIB < 4 * MIB and r["requests"] <= 2, r  # HEAD + one ranged GET
    assert sum(e["body_bytes"] for e in settled(hub)) <= MIB
    assert remote["tensor_bytes"] == sum(t["nbytes"] for t in gguf.read_structure(path)["tensors"])
    assert len(remote["layer_bytes"]) == 65 and remote["nextn_layers"] == [64]
    assert strip_path(remote) == strip_path(gguf.inspect(path))
    assert took < 10


def test_modelscope_layout_reads_the_header_with_the_listing_metadata(hub):
    """source: modelscope (the model role's `source:`): size and sha256 from the repo's file listing, bytes
    from /models/<repo>/resolve/master/, header only."""
    built = big_model()
    path = put(hub, "org/m/model.gguf", built.data, sparse_size=built.total_size)
    remote = gguf_remote.inspect_remote(hub_params(hub, source="modelscope"))
    r = remote["remote"]
    assert r["url"] == hub.url + "/models/org/m/resolve/master/model.gguf"
    assert r["size"] == built.total_size and r["bytes_read"] <= MIB
    assert strip_path(remote) == strip_path(gguf.inspect(path))
    paths = [e["path"] for e in settled(hub)]
    assert paths[0] == "/api/v1/models/org/m/repo/files?Revision=master&Recursive=true"
    assert not [p for p in paths if p.startswith("/org/")], "no Hugging Face style request"


def test_window_grows_by_doubling(hub):
    b = tiny_qwen35(n_vocab=8)
    # 14.4 MB of merges, like a large tokenizer: windows of 1, 2, 4 MiB, then 4 MiB (max_window) each
    b.add("tokenizer.ggml.merges", ARRAY, ["m%07d" % i for i in range(900000)], STRING)
    data = b.build().data
    put(hub, "org/m/model.gguf", data)
    header = len(data)
    remote = gguf_remote.inspect_remote(hub_params(hub), max_window=4 * MIB)
    r = remote["remote"]
    ranged = [e["range"][len("bytes="):].split("-") for e in gets(hub) if e["status"] == 206]
    got = [int(last) - int(first) + 1 for first, last in ranged]
    assert got[:4] == [MIB, 2 * MIB, 4 * MIB, 4 * MIB] and max(got) == 4 * MIB, got
    assert len(got) == 5  # 1 + 2 + 4 + 4 + 4 MiB >= 14.4 MB
    assert r["requests"] == 1 + len(got)  # HEAD + GETs, the first GET's redirect to the CDN counted once
    assert r["bytes_read"] <= header


# --- servers that do not cooperate ----------------------------------------------------------------------

def test_server_ignoring_range_is_refused_after_the_first_window(hub):
    built = big_model()
    put(hub, "org/m/model.gguf", built.data, sparse_size=built.total_size)
    hub.set_fault("ignore_range")
    t0 = time.monotonic()
    with pytest.raises(DownloadError, match="does not support range requests; download the model first") as e:
        gguf_remote.inspect_remote(hub_params(hub))
    assert "or use a mirror that does" in e.value.msg
    assert time.monotonic() - t0 < 10
    remote = gguf_remote.RemoteGGUF(hub_params(hub))
    with pytest.raises(DownloadError):
        remote.read_structure()
    assert remote.bytes_read == 0  # the 200's Content-Length says 19 GB: nothing of it is read
    remote.close()


def test_small_file_served_whole_without_range_is_fine(hub):
    data = tiny_qwen35().build().data
    put(hub, "org/m/model.gguf", data)
    hub.set_fault("ignore_range")
    remote = gguf_remote.inspect_remote(hub_params(hub))  # fits in the first window
    assert remote["remote"]["bytes_read"] == len(data) and remote["architecture"] == "qwen35"


def test_not_found_names_what_to_check(hub):
    put(hub, "org/m/model.gguf", tiny_qwen35().build().data)
    with pytest.raises(DownloadError, match="404.*check repo, filename and revision"):
        gguf_remote.inspect_remote(hub_params(hub, filename="nope.gguf"))
    with pytest.raises(DownloadError, match="RevisionNotFound"):
        gguf_remote.inspect_remote(hub_params(hub, revision="v9"))


def test_not_a_gguf(hub):
    put(hub, "org/m/model.gguf", b"<html>this is not a model</html>" * 100)
    with pytest.raises(gguf.GGUFError, match="bad magic .*not a GGUF file"):
        gguf_remote.inspect_remote(hub_params(hub))
    hub.set_fault("html")
    with pytest.raises(DownloadError, match="HTML page"):
        gguf_remote.inspect_remote(hub_params(hub))


def test_stalled_server_times_out_with_advice(hub):
    built = big_model()
    put(hub, "org/m/model.gguf", built.data, sparse_size=built.total_size)
    hub.set_fault("stall", after=100, seconds=3, times=-1)
    t0 = time.monotonic()
    with pytest.raises(DownloadError, match="timed out.*raise timeout, now 1 s"):
        gguf_remote.inspect_remote(hub_params(hub, timeout=1, retries=0))
    assert time.monotonic() - t0 < 8


# --- hostile headers keep the local limits, and fail within the first window ----------------------------

@pytest.mark.parametrize("kind, value, message", [
    ("key.len", 1 << 40, "over the limit of 16777216 bytes"),
    ("n_kv", 1 << 62, "key/value count .* over the limit"),
    ("array.count", 1 << 23, "metadata is larger than the limit|only .* bytes are left"),
])
def test_hostile_header_fails_fast_with_few_bytes(hub, kind, value, message):
    built = big_model()
    put(hub, "org/m/model.gguf", built.patch(kind, value), sparse_size=built.total_size)
    remote = gguf_remote.RemoteGGUF(hub_params(hub))
    t0 = time.monotonic()
    with pytest.raises(gguf.GGUFError, match=message):
        remote.read_structure({"max_metadata_bytes": 4 * MIB} if kind == "array.count" else None)
    assert time.monotonic() - t0 < 5
    assert remote.bytes_read <= MIB and remote.session.requests <= 2
    remote.close()


# --- split sets -----------------------------------------------------------------------------------------

def _split_set(hub, count=3, per_part=12, skip=()):
    paths = []
    for no in range(count):
        data = tiny_qwen35(split=(no, count, count * per_part)).build().data
        rel = "org/m/q5/model-%05d-of-%05d.gguf" % (no + 1, count)
        if no not in skip:
            paths.append(put(hub, rel, data))
    return paths


def test_split_set_reads_every_part_header(hub):
    paths = _split_set(hub)
    local = gguf.check_split_set(gguf.summarize(gguf.read_structure(paths[0])), gguf.read_structure(paths[0]))
    remote = gguf_remote.inspect_remote(hub_params(hub, filename="q5/model-00001-of-00003.gguf"))
    split_set = remote["split_set"]
    assert [p["path"].rsplit("/", 1)[1] for p in split_set["parts"]] == [os.path.basename(p) for p in paths]
    assert split_set["parts"][2]["path"] == hub.url + "/org/m/resolve/main/q5/model-00003-of-00003.gguf"
    for key in ("count", "tensor_count", "size", "tensor_bytes"):
        assert split_set[key] == local[key], key
    assert [p["size"] for p in split_set["parts"]] == [p["size"] for p in local["parts"]]
    # every part read at the commit the first resolved to, each with a HEAD and ranged GETs
    heads = [e["path"] for e in settled(hub) if e["method"] == "HEAD"]
    assert heads[0].endswith("/resolve/main/q5/model-00001-of-00003.gguf")
    assert all("/resolve/%s/" % hub.commit("org/m") in h for h in heads[1:]) and len(heads) == 3
    assert remote["remote"]["requests"] == 6


def test_split_tiny_model_remote_figures_equal_the_unsplit_model(hub):
    """The tiny model split in 3 (key/values in the first part only) read through the hub: layer_bytes,
    non_layer_tensors, tensor_bytes... are the unsplit file's, as for the local set; without check_split
    they are the named part's."""
    from tests.fixtures.gguf import make_tiny_model as mtm  # needs numpy and the llama.cpp source
    from tests.fixtures.gguf.split_model import cached_split_tiny_model
    paths = cached_split_tiny_model("qwen35", parts=3)
    for path in paths:
        put(hub, "org/m/q5/" + os.path.basename(path), source=path)
    whole = gguf.inspect(mtm.cached_tiny_model("qwen35"))
    first = gguf.read_structure(paths[0])
    local = gguf.add_split_set(gguf.summarize(first), first)
    params = hub_params(hub, filename="q5/model-00001-of-00003.gguf")
    remote = gguf_remote.inspect_remote(params)
    for key in gguf.TENSOR_FIELDS:
        assert remote[key] == whole[key] == local[key], key
    parts = remote["split_set"]["parts"]
    base = hub.url + "/org/m/resolve/main/q5/"
    assert [p["path"] for p in parts] == [base + os.path.basename(p) for p in paths]
    assert [dict(p, path=None) for p in parts] == [dict(p, path=None) for p in local["split_set"]["parts"]]
    assert remote["remote"]["bytes_read"] < sum(os.path.getsize(p) for p in paths)  # headers only
    alone = gguf_remote.inspect_remote(params, check_split=False)
    assert "split_set" not in alone
    assert alone["layer_bytes"] == parts[0]["layer_bytes"] != whole["layer_bytes"]
    assert alone["tensor_count"] == parts[0]["tensor_count"] < whole["tensor_count"]


def test_split_set_missing_part_says_so(hub):
    _split_set(hub, skip=(2,))
    with pytest.raises(DownloadError, match="model-00003-of-00003.gguf.*404"):
        gguf_remote.inspect_remote(hub_params(hub, filename="q5/model-00001-of-00003.gguf"))
    assert gguf_remote.inspect_remote(hub_params(hub, filename="q5/model-00001-of-00003.gguf"),
                                      check_split=False)["split"]["count"] == 3


# --- the token ------------------------------------------------------------------------------------------

def test_gated_repo_without_and_with_a_wrong_token(hub):
    put(hub, "org/gated/model.gguf", tiny_qwen35().build().data)
    with pytest.raises(DownloadError, match="401.*No token was sent.*model_hf_token.*token_var"):
        gguf_remote.inspect_remote(hub_params(hub, repo="org/gated"))
    wrong = "hf_WrongToken987654321"
    with pytest.raises(DownloadError, match="401.*token was sent and refused.*model_hf_token") as e:
        gguf_remote.inspect_remote(hub_params(hub, repo="org/gated", token=wrong))
    assert wrong not in str(e.value) and wrong not in repr(e.value.result)
    ok = gguf_remote.inspect_remote(hub_params(hub, repo="org/gated", token=TOKEN))
    assert ok["architecture"] == "qwen35" and TOKEN not in repr(ok)


def test_token_never_goes_to_the_cdn_on_another_host(tmp_path):
    root = tmp_path / "hub"
    h = FakeHub(str(root), gated=("org/gated",), tokens=(TOKEN,), lfs_min_size=1, cdn_host="localhost")
    h.start()
    try:
        put(h, "org/gated/model.gguf", tiny_qwen35().build().data)
        ok = gguf_remote.inspect_remote(hub_params(h, repo="org/gated", token=TOKEN))
        assert ok["architecture"] == "qwen35"
        log = settled(h)
        hub_side = [e for e in log if e["host"].startswith("127.0.0.1")]
        cdn_side = [e for e in log if e["host"].startswith("localhost")]
        assert hub_side and all(e["authorization"] == "Bearer " + TOKEN for e in hub_side)
        assert cdn_side and all(e["authorization"] is None for e in cdn_side)
    finally:
        h.stop()


def test_token_not_carried_by_a_mirror_redirect_to_another_origin(tmp_path, hub):
    other = FakeHub(str(tmp_path / "other"), hash_max_size=64 * MIB).start()
    try:
        put(other, "org/m/model.gguf", tiny_qwen35().build().data)
        hub.set_fault("redirect", to=other.url)
        ok = gguf_remote.inspect_remote(hub_params(hub, token=TOKEN))
        assert ok["architecture"] == "qwen35"
        assert any(e["authorization"] for e in settled(hub))
        assert settled(other) and not any(e["authorization"] for e in settled(other))
    finally:
        other.stop()
