# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The fake hub's Hugging Face API (repo_info's revision, list_repo_tree's tree, its pages), the hostile
listing fault, and the tiny Qwen3.6-27B-FP8 checkpoint it serves."""
import hashlib
import json
import struct

import pytest

from tests.fixtures.fake_hub import checkpoint
from tests.fixtures.fake_hub.server import LFS_POINTER, FakeHub, git_blob_sha1
from tests.unit.doubles.test_fake_hub_modelscope import get

REPO = checkpoint.REPO


@pytest.fixture
def hub(tmp_path):
    digests = checkpoint.write_checkpoint(tmp_path / "Qwen" / "Qwen3.6-27B-FP8")
    (tmp_path / "Qwen" / "Qwen3.6-27B-FP8" / "sub").mkdir()
    (tmp_path / "Qwen" / "Qwen3.6-27B-FP8" / "sub" / "a.txt").write_bytes(b"abc")
    digests["sub/a.txt"] = hashlib.sha256(b"abc").hexdigest()
    h = FakeHub(str(tmp_path)).start()
    h.digests = digests
    h.root = tmp_path / "Qwen" / "Qwen3.6-27B-FP8"
    yield h
    h.stop()


def test_git_blob_sha1_is_gits_object_id():
    assert git_blob_sha1(b"") == "e69de29bb2d1d6434b8b29ae775ad8c2e48c5391"  # git hash-object /dev/null
    assert git_blob_sha1(b"hello\n") == "ce013625030ba8dba906f756967f9e9ca394464a"


def test_revision_resolves_the_branch_to_the_commit(hub):
    r, body = get(hub, "/api/models/%s/revision/main" % REPO)
    doc = json.loads(body)
    assert r.status == 200 and doc["sha"] == hub.commit(REPO) and doc["id"] == REPO
    assert sorted(s["rfilename"] for s in doc["siblings"]) == sorted(hub.digests)
    r, _ = get(hub, "/api/models/%s/revision/nope" % REPO)
    assert r.status == 404 and r.getheader("X-Error-Code") == "RevisionNotFound"


def test_tree_lists_lfs_and_plain_git_files_as_the_hub_does(hub):
    commit = hub.commit(REPO)
    r, body = get(hub, "/api/models/%s/tree/%s?recursive=true" % (REPO, commit))
    items = dict((i["path"], i) for i in json.loads(body))
    assert items["sub"]["type"] == "directory" and items["sub/a.txt"]["type"] == "file"
    shard = items["model-00001-of-00002.safetensors"]
    data = (hub.root / "model-00001-of-00002.safetensors").read_bytes()
    assert shard["lfs"]["oid"] == hashlib.sha256(data).hexdigest() and shard["size"] == len(data)
    pointer = (LFS_POINTER % (shard["lfs"]["oid"], len(data))).encode()
    assert shard["oid"] == git_blob_sha1(pointer) and shard["lfs"]["pointerSize"] == len(pointer)
    config = items["config.json"]
    assert "lfs" not in config and config["oid"] == git_blob_sha1((hub.root / "config.json").read_bytes())
    r, body = get(hub, "/api/models/%s/tree/main" % REPO)  # one level without recursive
    assert "sub/a.txt" not in [i["path"] for i in json.loads(body)]
    r, body = get(hub, "/api/models/%s/tree/main/sub?recursive=true" % REPO)
    assert [i["path"] for i in json.loads(body)] == ["sub/a.txt"]


def test_tree_pages_are_linked_like_the_hubs(tmp_path):
    checkpoint.write_checkpoint(tmp_path / "Qwen" / "Qwen3.6-27B-FP8")
    with FakeHub(str(tmp_path), tree_page_size=4) as hub:
        url, paths = "/api/models/%s/tree/main?recursive=true" % REPO, []
        while url:
            r, body = get(hub, url)
            paths += [i["path"] for i in json.loads(body)]
            link = r.getheader("Link")
            url = link.split(">")[0].lstrip("<") if link else None
        assert sorted(paths) == sorted(checkpoint.files())


def test_listing_fault_adds_replaces_or_pads(hub):
    hub.set_fault("listing", extra=[{"type": "file", "path": "../x", "size": 1, "oid": "0" * 40}], times=1)
    _r, body = get(hub, "/api/models/%s/tree/main?recursive=true" % REPO)
    assert json.loads(body)[-1]["path"] == "../x"
    hub.set_fault("listing", only=[{"Path": "/abs", "Type": "blob"}], times=1)
    _r, body = get(hub, "/api/v1/models/%s/repo/files?Revision=master&Recursive=true" % REPO)
    assert json.loads(body)["Data"]["Files"] == [{"Path": "/abs", "Type": "blob"}]
    for chunked in (False, True):
        hub.set_fault("listing", pad_bytes=3 * 1000 * 1000, chunked=chunked, times=1)
        r, body = get(hub, "/api/models/%s/tree/main?recursive=true" % REPO)
        assert len(body) >= 3 * 1000 * 1000 and len(json.loads(body)) > 10000
        assert (r.getheader("Content-Length") is None) == chunked


def test_checkpoint_is_a_valid_safetensors_model(hub):
    config = json.loads((hub.root / "config.json").read_bytes())
    assert config["model_type"] == "qwen3_5" and config["text_config"]["num_hidden_layers"] == 4
    index = json.loads((hub.root / "model.safetensors.index.json").read_bytes())
    tensor_bytes = 0
    for name in ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"):
        data = (hub.root / name).read_bytes()
        n = struct.unpack("<Q", data[:8])[0]
        header = json.loads(data[8:8 + n])
        spans = sorted(v["data_offsets"] for k, v in header.items() if k != "__metadata__")
        assert spans[0][0] == 0 and spans[-1][1] == len(data) - 8 - n
        tensor_bytes += spans[-1][1]
        assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))  # noqa: B905 (contiguous)
        assert all(index["weight_map"][k] == name for k in header if k != "__metadata__")
    assert index["metadata"]["total_size"] == tensor_bytes
