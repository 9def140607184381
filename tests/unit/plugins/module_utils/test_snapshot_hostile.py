# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""model_snapshot against a hostile world (issue 22): listings that try to write outside the snapshot, collide
with its own names or never end; links, FIFOs and extra files planted in a snapshot or a build; a dest it
did not make; where the token may go."""
import json
import os
import subprocess
import sys
import textwrap
import time

import pytest
from ansible_collections.llmops.serving.plugins.module_utils._snapshot import fetch as sn
from ansible_collections.llmops.serving.plugins.module_utils._snapshot import listing

from tests.fixtures.fake_hub import checkpoint
from tests.fixtures.fake_hub.helpers import MIB, snapshot_params, tree_digests
from tests.fixtures.fake_hub.server import FakeHub
from tests.helpers import ROOT
from tests.unit.plugins.module_utils.test_download_hostile import fails_fast

REPO = checkpoint.REPO
TOKEN = "hf_SnApShOtToKeN0123456789"
OID = "0" * 40


def start(tmp_path, **kw):
    root = tmp_path / "hub"
    root.mkdir(exist_ok=True)
    digests = checkpoint.write_checkpoint(root / "Qwen" / "Qwen3.6-27B-FP8")
    hub = FakeHub(str(root), **kw).start()
    hub.digests = digests
    return hub


@pytest.fixture
def qhub(tmp_path):
    hub = start(tmp_path)
    yield hub
    hub.stop()


@pytest.fixture
def dest(tmp_path):
    return tmp_path / "models" / "Qwen3.6-27B-FP8"


def untouched(dest):
    """Nothing beside dest: no link, no store, no lock left behind."""
    parent = dest.parent
    return not os.path.exists(str(parent)) or os.listdir(str(parent)) == []


# =============================================================================================
# hostile listings: refused before anything is written
# =============================================================================================
HF_HOSTILE = {
    "dot-dot": ({"type": "file", "path": "../escaped.json", "size": 2, "oid": OID}, "'..' segment"),
    "nested-dot-dot": ({"type": "file", "path": "a/../../escaped", "size": 2, "oid": OID}, "'..' segment"),
    "absolute": ({"type": "file", "path": "/etc/cron.d/evil", "size": 2, "oid": OID}, "is absolute"),
    "backslash": ({"type": "file", "path": "..\\escaped", "size": 2, "oid": OID}, "backslash"),
    "control": ({"type": "file", "path": "a\nb", "size": 2, "oid": OID}, "control characters"),
    "duplicate": ({"type": "file", "path": "config.json", "size": 2, "oid": OID}, "listed twice"),
    "file-and-folder": ({"type": "file", "path": "config.json/x", "size": 2, "oid": OID}, "as a folder of"),
    "manifest": ({"type": "file", "path": ".llmops-snapshot.json", "size": 2, "oid": OID}, "manifest"),
    "part": ({"type": "file", "path": "tokenizer.json.part", "size": 2, "oid": OID}, "partial download of"),
    "no-checksum": ({"type": "file", "path": "x.bin", "size": 2}, "no checksum"),
    "bad-sha256": ({"type": "file", "path": "x.bin", "size": 2, "oid": OID,
                    "lfs": {"oid": "zz", "size": 2, "pointerSize": 1}}, "malformed sha256"),
    "negative-size": ({"type": "file", "path": "x.bin", "size": -1, "oid": OID}, "no valid size"),
    "symlink-type": ({"type": "symlink", "path": "x.bin", "size": 2, "oid": OID}, "not a file or directory"),
}


@pytest.mark.parametrize("case", sorted(HF_HOSTILE))
def test_hostile_hugging_face_listing_is_refused_before_anything_is_written(qhub, dest, tmp_path, case):
    entry, why = HF_HOSTILE[case]
    qhub.set_fault("listing", extra=[entry])
    with fails_fast(), pytest.raises(sn.DownloadError) as e:
        sn.run(snapshot_params(qhub, dest))
    assert why in e.value.msg and e.value.result.get("hostile_listing"), e.value.msg
    assert untouched(dest) and not os.path.exists(str(tmp_path / "escaped.json"))
    assert not [r for r in qhub.requests() if "/resolve/" in r["path"]]  # not one file was fetched


@pytest.mark.parametrize("path,why", [("../escaped", "'..' segment"), ("/abs/x", "is absolute"),
                                      ("sub\\..\\x", "backslash")])
def test_hostile_modelscope_listing_is_refused(qhub, dest, path, why):
    qhub.set_fault("listing", extra=[{"Path": path, "Type": "blob", "Size": 2, "Sha256": "0" * 64}])
    with pytest.raises(sn.DownloadError, match=why):
        sn.run(snapshot_params(qhub, dest, source="modelscope"))
    assert untouched(dest)


def test_listing_with_too_many_files_is_refused(qhub, dest, monkeypatch):
    monkeypatch.setattr(listing, "MAX_FILES", 5)
    with pytest.raises(sn.DownloadError, match="lists 9 files, more than 5"):
        sn.run(snapshot_params(qhub, dest))
    assert untouched(dest)


def test_listing_nested_too_deep_is_refused_not_crashed():
    with pytest.raises(sn.DownloadError, match="not JSON"):
        listing._json(b"[" * 200000 + b"]" * 200000, "the listing")


def test_hostile_listing_never_replaces_the_serving_snapshot(qhub, dest):
    first = sn.run(snapshot_params(qhub, dest))
    qhub.move_main(REPO)
    qhub.set_fault("listing", extra=[{"type": "file", "path": "../../etc/x", "size": 2, "oid": OID}])
    with pytest.raises(sn.DownloadError, match="'..' segment"):
        sn.run(snapshot_params(qhub, dest, update=True))
    assert os.readlink(str(dest)).endswith(first["id"])


# the 60 MB listing, measured in a child process: peak RSS and time
PROBE = textwrap.dedent("""
    import json, resource, sys, time
    from ansible_collections.llmops.serving.plugins.module_utils._snapshot import fetch as sn
    args = json.loads(sys.argv[1])
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.monotonic()
    try:
        sn.run(args)
        out = {"error": None}
    except sn.DownloadError as e:
        out = {"error": e.msg, "result": e.result}
    out["elapsed_s"] = time.monotonic() - t0
    out["base_kib"] = base
    out["peak_kib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps(out))
""")


# Linux hands a process the peak RSS of the process it was forked from (ru_maxrss survives fork + exec), so a
# child of pytest would report pytest's peak: the probe runs as a grandchild, forked from a small Python.
SPAWN = "import subprocess, sys; sys.exit(subprocess.call([sys.executable, '-c', sys.argv[1], sys.argv[2]]))"


def probe(args):
    p = subprocess.run([sys.executable, "-c", SPAWN, PROBE, json.dumps(args)], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, timeout=120,
                       env=dict(os.environ, PYTHONPATH=os.path.join(ROOT, "collections")))
    assert p.returncode == 0, p.stderr.decode()[-2000:]
    return json.loads(p.stdout.decode().strip().splitlines()[-1])


@pytest.mark.parametrize("layout", ["huggingface", "modelscope"])
@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_60_mb_listing_is_refused_in_bounded_time_and_memory(qhub, dest, layout, chunked):
    qhub.set_fault("listing", pad_bytes=60 * 1000 * 1000, chunked=chunked)
    out = probe(snapshot_params(qhub, dest, source=layout, retries=0))
    assert out["error"] and out["result"].get("listing_too_large"), out
    assert ("refused without reading it" if not chunked else "refused after reading 8.0 MiB") in out["error"]
    # bounded: the 8 MiB cap (plus one byte) at most was held, never the 60 MB (measured: +0.3 MB with a
    # Content-Length, +9 MB chunked)
    assert out["peak_kib"] - out["base_kib"] < 24 * 1024, out
    assert out["elapsed_s"] < 10, out
    time.sleep(0.3)
    sent = [r for r in qhub.requests() if "tree" in r["path"] or "repo/files" in r["path"]]
    assert sent and sent[-1]["body_bytes"] < 30 * MIB  # the hub could not push the whole listing through
    assert untouched(dest)


def test_snapshot_memory_does_not_grow_with_the_model(tmp_path):
    """64 MiB of shards (two of 32 MiB) through 8 connections: the peak RSS grows by buffers, never by a file
    (measured: +27 MB; holding one shard whole would add 32 MiB more)."""
    root = tmp_path / "big"
    checkpoint.write_checkpoint(root / "Qwen" / "Qwen3.6-27B-FP8", vocab_size=262144)
    hub = FakeHub(str(root)).start()
    try:
        dest = tmp_path / "m" / "Qwen3.6-27B-FP8"
        out = probe(snapshot_params(hub, dest, parallel_min_size=4 * MIB))
        assert out["error"] is None, out
        assert out["peak_kib"] - out["base_kib"] < 40 * 1024, out
        assert sum(os.path.getsize(str(dest / n)) for n in os.listdir(str(dest))) > 64 * MIB
    finally:
        hub.stop()


# =============================================================================================
# links, FIFOs and extra files planted in a snapshot or a build
# =============================================================================================
def test_symlink_planted_in_the_snapshot_is_refused(qhub, dest, tmp_path):
    sn.run(snapshot_params(qhub, dest))
    target = tmp_path / "secret"
    target.write_text("root only")
    os.symlink(str(target), str(dest / "extra.safetensors"))
    with pytest.raises(sn.DownloadError) as e:
        sn.run(snapshot_params(qhub, dest))
    assert "extra.safetensors is a symbolic link" in e.value.msg and "Remove it" in e.value.msg
    assert target.read_text() == "root only"


def test_file_replaced_by_a_symlink_in_the_snapshot_is_refused(qhub, dest, tmp_path):
    sn.run(snapshot_params(qhub, dest))
    target = tmp_path / "elsewhere.json"
    target.write_text("{}")
    os.unlink(str(dest / "config.json"))
    os.symlink(str(target), str(dest / "config.json"))
    with pytest.raises(sn.DownloadError, match="config.json is a symbolic link"):
        sn.run(snapshot_params(qhub, dest))
    assert target.read_text() == "{}"


def test_fifo_planted_in_the_snapshot_fails_fast(qhub, dest):
    sn.run(snapshot_params(qhub, dest))
    os.mkfifo(str(dest / "tokenizer.json.fifo"))
    with fails_fast(), pytest.raises(sn.DownloadError, match="FIFO"):
        sn.run(snapshot_params(qhub, dest))


def test_extra_weights_file_in_the_snapshot_is_refused(qhub, dest):
    sn.run(snapshot_params(qhub, dest))
    (dest / "model-00003-of-00002.safetensors").write_bytes(b"\0" * 16)
    with pytest.raises(sn.DownloadError, match="not part of the snapshot.*extra \\*.safetensors"):
        sn.run(snapshot_params(qhub, dest))


def test_symlink_planted_in_the_build_is_refused_and_never_written_through(qhub, dest, tmp_path):
    qhub.set_fault("cut", after=100, times=1)
    with pytest.raises(sn.DownloadError):
        sn.run(snapshot_params(qhub, dest, retries=0, allow_patterns=["*.safetensors"]))
    build = dest.parent / ".Qwen3.6-27B-FP8.snapshots" / (qhub.commit(REPO) + ".partial")
    assert build.is_dir()
    target = tmp_path / "victim"
    target.write_text("keep me")
    for name in os.listdir(str(build)):
        os.unlink(str(build / name))
    os.symlink(str(target), str(build / "model-00001-of-00002.safetensors.part"))
    with fails_fast(), pytest.raises(sn.DownloadError, match="symbolic link"):
        sn.run(snapshot_params(qhub, dest, allow_patterns=["*.safetensors"]))
    assert target.read_text() == "keep me" and not os.path.lexists(str(dest))


def test_dest_that_is_not_ours_is_refused(qhub, dest, tmp_path):
    dest.mkdir(parents=True)
    (dest / "config.json").write_text("{}")
    with pytest.raises(sn.DownloadError, match="did not create.*Move it aside"):
        sn.run(snapshot_params(qhub, dest))
    assert os.listdir(str(dest)) == ["config.json"]
    other = dest.parent / "elsewhere"
    other.mkdir()
    os.rmdir(str(dest)) if False else None
    link = dest.parent / "linked"
    os.symlink(str(other), str(link))
    with pytest.raises(sn.DownloadError, match="not to a snapshot"):
        sn.run(snapshot_params(qhub, link))
    assert os.listdir(str(other)) == []


# =============================================================================================
# the token
# =============================================================================================
def test_token_goes_only_to_the_endpoint_origin(tmp_path, dest):
    """A gated repo whose LFS files redirect to a CDN on another port of the same host: the listing and
    resolve requests carry the token, the CDN never sees it; no message or manifest holds it."""
    root = tmp_path / "hub"
    root.mkdir()
    checkpoint.write_checkpoint(root / "Qwen" / "Qwen3.6-27B-FP8")
    cdn = FakeHub(str(root)).start()
    hub = FakeHub(str(root), gated=(REPO,), tokens=(TOKEN,), cdn_host="127.0.0.1:%d" % cdn.port).start()
    try:
        with pytest.raises(sn.DownloadError, match="gated or private") as e:
            sn.run(snapshot_params(hub, dest))
        assert TOKEN not in e.value.msg
        r = sn.run(snapshot_params(hub, dest, token=TOKEN))
        assert r["file_count"] == 9 and TOKEN not in json.dumps(r)
        api = [e for e in hub.requests() if e["path"].startswith("/api/") and e["status"] == 200]
        assert api and all(e["authorization"] == "Bearer " + TOKEN for e in api)
        assert [e for e in cdn.requests() if e["path"].startswith("/cdn/")], "the CDN hop was not taken"
        assert [e for e in cdn.requests() if e["authorization"]] == []
        for path, _sha in tree_digests(r["snapshot_dir"]).items():
            assert TOKEN.encode() not in open(os.path.join(r["snapshot_dir"], path), "rb").read()
    finally:
        hub.stop()
        cdn.stop()


def test_token_with_a_newline_is_refused_without_echo(qhub, dest):
    with pytest.raises(sn.DownloadError) as e:
        sn.run(snapshot_params(qhub, dest, token=TOKEN + "\n"))
    assert "whitespace or control characters" in e.value.msg and TOKEN not in e.value.msg
    assert qhub.requests() == []
