# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""model_snapshot against the fake hub (issue 22, part 3): a vLLM model directory fetched at one commit,
every file verified, resumed after kill -9, an update built beside the snapshot that serves and switched
atomically, the manifest's fast path."""
import glob
import hashlib
import json
import os
import signal
import subprocess
import sys
import time

import pytest
from ansible_collections.llmops.serving.plugins.module_utils._snapshot import fetch as sn
from ansible_collections.llmops.serving.plugins.module_utils._snapshot import store

from tests.fixtures.fake_hub import checkpoint
from tests.fixtures.fake_hub.helpers import MIB, body_bytes, snapshot_params, tree_digests
from tests.fixtures.fake_hub.server import FakeHub, git_blob_sha1
from tests.helpers import ROOT

REPO = checkpoint.REPO
SHARD1 = "model-00001-of-00002.safetensors"
SHARD2 = "model-00002-of-00002.safetensors"


def start(tmp_path, vocab_size=256, **kw):
    root = tmp_path / "hub"
    root.mkdir()
    digests = checkpoint.write_checkpoint(root / "Qwen" / "Qwen3.6-27B-FP8", vocab_size=vocab_size)
    hub = FakeHub(str(root), **kw).start()
    hub.digests = digests
    hub.repo_dir = root / "Qwen" / "Qwen3.6-27B-FP8"
    return hub


@pytest.fixture
def qhub(tmp_path):
    hub = start(tmp_path)
    yield hub
    hub.stop()


@pytest.fixture
def dest(tmp_path):
    return tmp_path / "models" / "Qwen3.6-27B-FP8"


def served(dest):
    """What vLLM would read at dest (the repo files, the manifest left out)."""
    d = tree_digests(dest)
    d.pop(".llmops-snapshot.json", None)
    return d


def resolve_paths(hub):
    return [e["path"] for e in hub.requests() if "/resolve/" in e["path"]]


# =============================================================================================
# the listing, LFS and plain git files, the commit pin
# =============================================================================================
def test_snapshot_is_the_repo_at_one_commit_every_file_verified(qhub, dest):
    r = sn.run(snapshot_params(qhub, dest))
    commit = qhub.commit(REPO)
    assert r["changed"] and r["commit"] == commit == r["id"] and r["verified"] == "download"
    assert served(dest) == qhub.digests and r["file_count"] == len(qhub.digests) == 9
    assert os.path.islink(str(dest)) and os.readlink(str(dest)) == ".Qwen3.6-27B-FP8.snapshots/" + commit
    assert r["snapshot_dir"] == str(dest.parent / ".Qwen3.6-27B-FP8.snapshots" / commit)
    # the revision resolved once; every file came from /resolve/<commit>/, never from the branch
    api = [e["path"] for e in qhub.requests() if e["path"].startswith("/api/")]
    assert api == ["/api/models/%s/revision/main" % REPO,
                   "/api/models/%s/tree/%s?recursive=true" % (REPO, commit)]
    assert sorted(p.split("/resolve/%s/" % commit)[1] for p in resolve_paths(qhub)) == sorted(qhub.digests)
    manifest = json.load(open(r["manifest"]))
    by_path = dict((f["path"], f) for f in manifest["files"])
    assert by_path[SHARD1]["lfs"] and by_path["tokenizer.json"]["lfs"] and by_path[SHARD1]["git_sha1"] is None
    config = (qhub.repo_dir / "config.json").read_bytes()
    assert not by_path["config.json"]["lfs"] and by_path["config.json"]["git_sha1"] == git_blob_sha1(config)
    assert all(by_path[p]["sha256"] == qhub.digests[p] for p in qhub.digests)
    assert manifest["repo"] == REPO and manifest["commit"] == commit
    assert r["sha256"] == manifest["content_sha256"]
    assert r["total_size"] == sum(os.path.getsize(str(qhub.repo_dir / p)) for p in qhub.digests)
    # the build and its journal are gone; only the snapshot, the link and nothing else
    assert sorted(os.listdir(str(dest.parent))) == [".Qwen3.6-27B-FP8.snapshots", "Qwen3.6-27B-FP8"]
    assert os.listdir(str(dest.parent / ".Qwen3.6-27B-FP8.snapshots")) == [commit]


def test_paginated_tree_listing_is_read_to_the_end(tmp_path, dest):
    hub = start(tmp_path, tree_page_size=2)
    try:
        r = sn.run(snapshot_params(hub, dest))
        pages = [e for e in hub.requests() if "/tree/" in e["path"]]
        assert len(pages) == 5 and served(dest) == hub.digests and r["file_count"] == 9
    finally:
        hub.stop()


def test_allow_and_ignore_patterns(qhub, dest):
    r = sn.run(snapshot_params(qhub, dest, allow_patterns=["*.safetensors", "*.json"],
                               ignore_patterns=["generation_config.json"]))
    assert sorted(served(dest)) == sorted([SHARD1, SHARD2, "config.json", "model.safetensors.index.json",
                                           "tokenizer.json", "tokenizer_config.json"])
    assert r["file_count"] == 6
    with pytest.raises(sn.DownloadError, match="no file of .* matches allow_patterns"):
        sn.run(snapshot_params(qhub, dest.parent / "other", allow_patterns=["*.gguf"]))


# =============================================================================================
# the shard index against the shards (vLLM loads every shard model.safetensors.index.json names)
# =============================================================================================
INDEX = "model.safetensors.index.json"


def test_an_index_with_every_shard_is_published(qhub, dest):
    r = sn.run(snapshot_params(qhub, dest, allow_patterns=["model*", "config.json"]))
    assert r["changed"] and sorted(served(dest)) == sorted([SHARD1, SHARD2, INDEX, "config.json"])


@pytest.mark.parametrize("patterns, why", [
    ({"ignore_patterns": ["*-00002-of-*"]}, "ignore_patterns excludes it ('*-00002-of-*')"),
    ({"allow_patterns": ["*-00001-of-*", "*.json"]}, "it matches none of allow_patterns"),
])
def test_an_index_naming_a_shard_the_patterns_leave_out_is_never_published(qhub, dest, patterns, why):
    with pytest.raises(sn.DownloadError) as e:
        sn.run(snapshot_params(qhub, dest, **patterns))
    msg = e.value.msg
    assert "refused to publish" in msg and INDEX in msg and "%s (%s" % (SHARD2, why) in msg, msg
    assert SHARD1 not in msg and e.value.result["missing_shards"] == [SHARD2]
    assert not os.path.lexists(str(dest))  # nothing switched in
    # with a snapshot serving: the new patterns are refused the same way, the snapshot keeps serving
    first = sn.run(snapshot_params(qhub, dest))
    with pytest.raises(sn.DownloadError, match="refused to publish"):
        sn.run(snapshot_params(qhub, dest, **patterns))
    assert os.readlink(str(dest)).endswith("/" + first["commit"]) and served(dest) == qhub.digests


def test_an_index_naming_a_shard_the_repository_lacks_is_never_published(qhub, dest):
    path = str(qhub.repo_dir / INDEX)
    index = json.load(open(path))
    index["weight_map"]["lm_head.bias"] = "model-00003-of-00002.safetensors"
    with open(path, "w") as f:
        json.dump(index, f)
    with pytest.raises(sn.DownloadError) as e:
        sn.run(snapshot_params(qhub, dest))
    msg = e.value.msg
    lacks = "model-00003-of-00002.safetensors (the repository has no such file at %s)" % qhub.commit(REPO)
    assert lacks in msg, msg
    assert not os.path.lexists(str(dest))


@pytest.mark.parametrize("weight_map", [None, ["x"], {"w": "../other/model.safetensors"}, {"w": 7}])
def test_an_index_that_is_no_index_is_never_published(qhub, dest, weight_map):
    path = str(qhub.repo_dir / INDEX)
    with open(path, "w") as f:
        json.dump({"metadata": {}} if weight_map is None else {"weight_map": weight_map}, f)
    with pytest.raises(sn.DownloadError, match="is not a safetensors index"):
        sn.run(snapshot_params(qhub, dest))
    assert not os.path.lexists(str(dest))


@pytest.mark.parametrize("ignore", [["*.index.json"], ["*.index.json", "*-00002-of-*"]])
def test_no_index_is_fine(qhub, dest, ignore):
    r = sn.run(snapshot_params(qhub, dest, ignore_patterns=ignore))
    assert r["changed"] and INDEX not in served(dest) and SHARD1 in served(dest)


def test_modelscope_layout_verified_by_sha256(qhub, dest):
    commit = qhub.commit(REPO)
    r = sn.run(snapshot_params(qhub, dest, source="modelscope"))
    assert served(dest) == qhub.digests and r["commit"] is None and r["id"].startswith("ms-")
    assert all("/models/%s/resolve/master/" % REPO in p for p in resolve_paths(qhub))
    manifest = json.load(open(r["manifest"]))
    assert all(f["git_sha1"] is None and f["sha256"] == qhub.digests[f["path"]] for f in manifest["files"])
    # the same content again: nothing to do; a pinned commit names the snapshot by it
    assert not sn.run(snapshot_params(qhub, dest, source="modelscope"))["changed"]
    pinned = dest.parent / "pinned"
    r = sn.run(snapshot_params(qhub, pinned, source="modelscope", revision=commit))
    assert r["id"] == commit and os.readlink(str(pinned)).endswith("/" + commit)


def test_parallel_fetch_stays_within_one_connection_budget(tmp_path, dest):
    hub = start(tmp_path, vocab_size=4096)  # shards of about 1 MiB
    try:
        hub.set_fault("rate", bps=4 * MIB)
        hub.reset_stats()
        r = sn.run(snapshot_params(hub, dest, connections=3, parallel_min_size=256 * 1024))
        assert served(dest) == hub.digests and r["downloaded_bytes"] == r["total_size"]
        # the files overlapped, never over the budget (a shard over parallel_min_size held all three)
        assert 2 <= hub.max_active() <= 3
    finally:
        hub.stop()


# =============================================================================================
# corrupted bytes
# =============================================================================================
@pytest.mark.parametrize("name,offset", [(SHARD2, 5000), ("config.json", 10)])
def test_corrupted_file_is_refused_and_moved_to_corrupt(qhub, dest, name, offset):
    """LFS shard (sha256) and plain git file (git blob id): the bytes go to corrupt/, nothing is switched;
    the rerun fetches that file only."""
    qhub.set_fault("corrupt", offset=offset, times=1)
    with pytest.raises(sn.DownloadError) as e:
        sn.run(snapshot_params(qhub, dest, allow_patterns=[name]))
    commit = qhub.commit(REPO)
    assert "checksum mismatch for %s" % name in e.value.msg
    assert ("sha256" if name == SHARD2 else "git blob id") in e.value.msg
    q = e.value.result["quarantined"]
    assert q in e.value.msg
    assert os.path.dirname(q) == str(dest.parent / ".Qwen3.6-27B-FP8.snapshots" / "corrupt")
    assert hashlib.sha256(open(q, "rb").read()).hexdigest() != qhub.digests[name]
    assert os.path.getsize(q) == os.path.getsize(str(qhub.repo_dir / name))
    assert not os.path.lexists(str(dest))  # no snapshot was switched to
    build = dest.parent / ".Qwen3.6-27B-FP8.snapshots" / (commit + ".partial")
    assert not os.path.exists(str(build / name))
    qhub.reset_stats()
    sn.run(snapshot_params(qhub, dest, allow_patterns=[name]))
    assert served(dest) == {name: qhub.digests[name]} and os.path.exists(q)


def test_damaged_file_in_the_served_snapshot_is_repaired_beside_it(qhub, dest):
    first = sn.run(snapshot_params(qhub, dest))
    victim = dest / SHARD1
    with open(str(victim), "r+b") as f:
        f.seek(100)
        f.write(b"\xff\xfe")
    qhub.reset_stats()
    r = sn.run(snapshot_params(qhub, dest))
    assert r["changed"] and "does not match its manifest" in r["msg"] and served(dest) == qhub.digests
    assert r["snapshot_dir"].endswith(first["id"] + ".1")
    assert r["downloaded_bytes"] == os.path.getsize(str(victim))
    assert r["reused_bytes"] == first["total_size"] - r["downloaded_bytes"]
    assert not os.path.exists(first["snapshot_dir"])  # the damaged snapshot is retired...
    moved = glob.glob(str(dest.parent / ".Qwen3.6-27B-FP8.snapshots" / "corrupt" / (SHARD1 + ".corrupt-*")))
    assert len(moved) == 1 and moved[0] in r["msg"]  # ...its damaged file kept for inspection
    again = sn.run(snapshot_params(qhub, dest))
    assert not again["changed"] and again["verified"] == "manifest"


def test_file_removed_from_the_served_snapshot_is_fetched_into_a_repaired_one(qhub, dest):
    sn.run(snapshot_params(qhub, dest))
    size = os.path.getsize(str(dest / "tokenizer.json"))
    os.unlink(str(dest / "tokenizer.json"))
    checked = sn.run(snapshot_params(qhub, dest), check_mode=True)
    assert checked["changed"] and "would repair the snapshot: 1 file(s) missing" in checked["msg"]
    qhub.reset_stats()
    r = sn.run(snapshot_params(qhub, dest))
    assert r["changed"] and served(dest) == qhub.digests and r["fetched"] == ["tokenizer.json"]
    assert body_bytes(qhub) == r["downloaded_bytes"] == size


# =============================================================================================
# kill -9 mid-snapshot, then resume
# =============================================================================================
def kept_by(build):
    """What a killed run left in the build: finished files, and the ranges each .part.json says are on disk
    (a state left beside a file renamed just before the kill counts once, as the file)."""
    try:
        # (glob would skip .gitattributes; a state being written at the kill is a temporary file, not data)
        names = [n for n in os.listdir(str(build)) if not n.endswith(".tmp")]
        finished = [n for n in names if not n.endswith((".part", ".part.json"))]
        ranges = [json.load(open(str(build / n)))["done"] for n in names
                  if n.endswith(".part.json") and n[:-len(".part.json")] not in finished]
        finished = [str(build / n) for n in finished]
    except (OSError, ValueError):
        return 0, []
    return sum(os.path.getsize(p) for p in finished) + sum(b - a for done in ranges for a, b in done), ranges


def test_kill_9_mid_snapshot_resumes_the_bytes_it_had(tmp_path, dest):
    """SIGKILL of the module process while the shards arrive: dest is untouched, and the next run fetches
    exactly what was missing (finished files from the journal, partial ones from their .part ranges)."""
    hub = start(tmp_path, vocab_size=16384)  # shards of about 2 MiB each
    try:
        hub.set_fault("rate", bps=1 * MIB)
        args = snapshot_params(hub, dest, connections=2, parallel_min_size=64 * 1024, retries=1)
        f = tmp_path / "args.json"
        f.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": args}))
        env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "collections"))
        p = subprocess.Popen([sys.executable, os.path.join(ROOT, "plugins", "modules", "model_snapshot.py"),
                              str(f)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        build = dest.parent / ".Qwen3.6-27B-FP8.snapshots" / (hub.commit(REPO) + ".partial")
        deadline = time.monotonic() + 60
        while kept_by(build)[0] < 512 * 1024 and time.monotonic() < deadline:  # mid-way, whatever the load
            assert p.poll() is None, p.communicate()
            time.sleep(0.05)
        p.send_signal(signal.SIGKILL)
        p.communicate()
        while hub.state.active and time.monotonic() < deadline:  # the hub logs the cut responses first
            time.sleep(0.05)
        assert not os.path.lexists(str(dest))
        kept, ranges = kept_by(build)
        assert ranges and kept >= 512 * 1024, ranges
        hub.clear_faults()
        hub.reset_stats()
        r = sn.run(snapshot_params(hub, dest))
        assert served(dest) == hub.digests
        assert r["resumed_from"] == kept  # every byte the killed run had was reused...
        assert body_bytes(hub) == r["downloaded_bytes"] == r["total_size"] - kept  # ...only the rest fetched
    finally:
        hub.stop()


# =============================================================================================
# updates: built beside the serving snapshot, switched atomically
# =============================================================================================
def _change_shard(hub):
    data = checkpoint.safetensors_bytes(checkpoint.shard_tensors(256)[1], seed=99)
    (hub.repo_dir / SHARD2).write_bytes(data)
    hub.digests[SHARD2] = hashlib.sha256(data).hexdigest()
    return hub.move_main(REPO)


def test_failed_update_leaves_the_old_snapshot_serving(qhub, dest):
    first = sn.run(snapshot_params(qhub, dest))
    old = served(dest)
    new_commit = _change_shard(qhub)
    # update false: the moved branch is reported, the snapshot kept
    r = sn.run(snapshot_params(qhub, dest))
    assert not r["changed"] and r["update_available"] and r["commit"] == first["commit"]
    # the update fails mid-way: the old snapshot still serves, byte for byte
    qhub.set_fault("cut", after=1000, times=1)
    with pytest.raises(sn.DownloadError, match="giving up"):
        sn.run(snapshot_params(qhub, dest, update=True, retries=0))
    assert os.readlink(str(dest)).endswith("/" + first["commit"]) and served(dest) == old
    assert json.load(open(str(dest / ".llmops-snapshot.json")))["commit"] == first["commit"]
    # the retry fetches only the changed shard; everything else is linked from the serving snapshot
    qhub.clear_faults()
    qhub.reset_stats()
    r = sn.run(snapshot_params(qhub, dest, update=True))
    assert r["commit"] == new_commit and served(dest) == qhub.digests and r["previous"] == first["commit"]
    # (the failed run had linked the unchanged files and fetched 1000 bytes of the shard: all kept)
    assert sorted(r["fetched"]) == [SHARD2] and r["resumed_from"] == r["total_size"] - r["downloaded_bytes"]
    assert body_bytes(qhub) == r["downloaded_bytes"] == os.path.getsize(str(dest / SHARD2)) - 1000
    assert os.path.samefile(str(dest / SHARD1), os.path.join(first["snapshot_dir"], SHARD1))
    assert tree_digests(first["snapshot_dir"]) == dict(old, **{".llmops-snapshot.json": tree_digests(
        first["snapshot_dir"])[".llmops-snapshot.json"]})  # the previous snapshot is kept intact
    # a third commit: the one before the previous is removed, the previous kept
    third = _change_shard(qhub)
    r = sn.run(snapshot_params(qhub, dest, update=True))
    assert sorted(os.listdir(str(dest.parent / ".Qwen3.6-27B-FP8.snapshots"))) == sorted([new_commit, third])
    assert "removed older snapshots: %s" % first["commit"] in r["msg"]


def test_kill_between_build_and_switch_never_leaves_a_mix(qhub, dest, monkeypatch):
    """The switch is one rename(2): interrupted right before it, dest still names the old snapshot."""
    first = sn.run(snapshot_params(qhub, dest))
    _change_shard(qhub)

    class Killed(BaseException):
        pass

    def die(layout, name):
        raise Killed()
    monkeypatch.setattr(store, "switch", die)
    with pytest.raises(Killed):
        sn.run(snapshot_params(qhub, dest, update=True))
    assert os.readlink(str(dest)).endswith("/" + first["commit"])
    monkeypatch.undo()
    qhub.reset_stats()
    r = sn.run(snapshot_params(qhub, dest, update=True))
    assert served(dest) == qhub.digests and r["downloaded_bytes"] == 0  # the finished build was reused


# =============================================================================================
# the manifest's fast path
# =============================================================================================
def test_new_patterns_rebuild_at_the_same_commit_unless_update(qhub, dest):
    first = sn.run(snapshot_params(qhub, dest))
    new_commit = qhub.move_main(REPO)  # (the fake hub serves the same files at every commit)
    qhub.reset_stats()
    r = sn.run(snapshot_params(qhub, dest, ignore_patterns=["*.md"]))
    assert r["commit"] == first["commit"] and r["update_available"] and "patterns changed" in r["msg"]
    assert "/tree/%s?" % first["commit"] in str(qhub.requests())  # listed at the snapshot's commit
    assert "README.md" not in served(dest) and r["downloaded_bytes"] == 0  # all linked from the snapshot
    r = sn.run(snapshot_params(qhub, dest, ignore_patterns=["*.md"], update=True))
    assert r["commit"] == new_commit and r["downloaded_bytes"] == 0


def test_forged_manifest_path_is_never_used(qhub, dest, tmp_path):
    first = sn.run(snapshot_params(qhub, dest))
    manifest = json.load(open(first["manifest"]))
    manifest["files"][0]["path"] = "../../../escaped"
    with open(first["manifest"], "w") as f:
        json.dump(manifest, f)
    r = sn.run(snapshot_params(qhub, dest))  # the manifest is not trusted: a fresh snapshot replaces it
    assert r["changed"] and served(dest) == qhub.digests and "no valid manifest" in r["msg"]
    assert not os.path.lexists(str(tmp_path / "escaped")) and not os.path.exists(first["snapshot_dir"])


def test_rerun_trusts_the_manifest_and_hashes_only_what_changed(qhub, dest, monkeypatch):
    sn.run(snapshot_params(qhub, dest))
    hashed = []
    real = sn.hash_pair
    monkeypatch.setattr(sn, "hash_pair",
                        lambda path, progress=None: hashed.append(path) or real(path, progress))
    qhub.reset_stats()
    r = sn.run(snapshot_params(qhub, dest))
    assert not r["changed"] and r["verified"] == "manifest" and hashed == []
    assert [e["path"] for e in qhub.requests()] == ["/api/models/%s/revision/main" % REPO]  # one request
    # pinned to the current commit: no request at all
    qhub.reset_stats()
    assert sn.run(snapshot_params(qhub, dest, revision=r["commit"]))["verified"] == "manifest"
    assert qhub.requests() == []
    # a touched file (same bytes) is hashed, found good, and trusted again afterwards
    os.utime(str(dest / "config.json"))
    r = sn.run(snapshot_params(qhub, dest))
    assert r["verified"] == "hashed" and [os.path.basename(p) for p in hashed] == ["config.json"]
    hashed[:] = []
    assert sn.run(snapshot_params(qhub, dest))["verified"] == "manifest" and hashed == []
    # force_verify hashes every file
    assert sn.run(snapshot_params(qhub, dest, force_verify=True))["verified"] == "hashed" and len(hashed) == 9


def test_unreachable_hub_keeps_the_verified_snapshot(qhub, dest):
    sn.run(snapshot_params(qhub, dest))
    r = sn.run(snapshot_params(qhub, dest, endpoint="http://127.0.0.1:9", retries=0))
    assert not r["changed"] and "could not reach the hub" in r["msg"]


def test_check_mode_reports_and_writes_nothing(qhub, dest):
    r = sn.run(snapshot_params(qhub, dest), check_mode=True)
    assert r["changed"] and not os.path.exists(str(dest.parent))
    assert sorted(a["path"] for a in r["actions"]) == sorted(qhub.digests)
    assert all(a["action"] == "download" for a in r["actions"])
    assert r["diff"]["before"] == "" and SHARD1 in r["diff"]["after"]
    sn.run(snapshot_params(qhub, dest))
    r = sn.run(snapshot_params(qhub, dest), check_mode=True)
    assert not r["changed"] and r["verified"] == "manifest"
    _change_shard(qhub)
    r = sn.run(snapshot_params(qhub, dest, update=True), check_mode=True)
    actions = dict((a["path"], a["action"]) for a in r["actions"])
    assert actions.pop(SHARD2) == "download" and set(actions.values()) == {"link"}
    assert r["diff"]["before"] != r["diff"]["after"]


def test_one_run_per_dest(qhub, dest):
    sn.run(snapshot_params(qhub, dest))
    layout = store.Layout(str(dest))
    held = sn.DestLock.acquire(layout.lock, 1, "test")
    try:
        with pytest.raises(sn.DownloadError, match="pid %d" % os.getpid()):
            sn.run(snapshot_params(qhub, dest, lock_timeout=0))
    finally:
        held.release()
