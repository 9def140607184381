# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""model_download behaviour: fast path, force_verify, split sets, secrets, check mode, disk full,
moved revisions, progress, plain URLs, and the module file run end to end."""
import errno
import hashlib
import json
import os
import re
import stat
import subprocess
import sys

import pytest
from ansible_collections.llmops.serving.plugins.module_utils._download import ranges as download_ranges
from ansible_collections.llmops.serving.plugins.module_utils._download import source as download_source
from ansible_collections.llmops.serving.plugins.module_utils._download import transfer as download_transfer
from ansible_collections.llmops.serving.plugins.module_utils._download.messages import human
from ansible_collections.llmops.serving.plugins.module_utils._files import disk_plan

from tests.fixtures.disk_full import FullAt
from tests.fixtures.fake_hub.helpers import (
    MIB,
    MODEL_SIZE,
    TOKEN,
    assert_final_good_or_absent,
    body_bytes,
    dl,
    make_dest,
    params,
    quarantined,
    sha256_of,
    start_hub,
)
from tests.helpers import ROOT  # noqa: E402

SIZE = MODEL_SIZE  # the size of the shared `model` fixture (conftest.py)


def gets(hub):
    return [e for e in hub.requests() if e["method"] == "GET"]


class _NoHash(object):
    """Stands in for hashlib: any hashing fails the test."""

    def sha256(self, *a):
        raise AssertionError("the sidecar fast path must not hash")


def test_rerun_uses_sidecar_without_hashing_or_downloading(hub, dest, model, monkeypatch):
    r1 = dl.run(params(hub, dest))
    side = json.load(open(dl.sidecar_path(r1["path"])))
    st = os.stat(r1["path"])
    assert side["sha256"] == model and side["inode"] == st.st_ino and side["mtime_ns"] == st.st_mtime_ns
    assert side["commit"] == hub.commit("org/m") and side["size"] == SIZE
    hub.reset_stats()
    monkeypatch.setattr(dl, "hash_file", _NoHash().sha256)
    monkeypatch.setattr(download_transfer, "hashlib", _NoHash())
    r2 = dl.run(params(hub, dest))
    assert not r2["changed"] and r2["verified"] == "sidecar" and r2["sha256"] == model
    assert r2["downloaded_bytes"] == 0 and gets(hub) == []
    assert r2["elapsed_s"] < 1.0


def test_force_verify_rehashes_and_catches_silent_corruption(hub, dest, model):
    r1 = dl.run(params(hub, dest))
    r2 = dl.run(params(hub, dest, force_verify=True))
    assert r2["verified"] == "hashed" and not r2["changed"]
    # flip a byte in place and restore the mtime: the sidecar still "matches", force_verify does not
    st = os.stat(r1["path"])
    with open(r1["path"], "r+b") as f:
        f.seek(1000)
        b = f.read(1)
        f.seek(1000)
        f.write(bytes([b[0] ^ 1]))
    os.utime(r1["path"], ns=(st.st_atime_ns, st.st_mtime_ns))
    # the restored mtime alone no longer fools the record (ctime moved, see test_download_hostile);
    # corruption below the filesystem changes no metadata at all: make the record match again
    side = dl.sidecar_path(r1["path"])
    rec = json.load(open(side))
    rec["ctime_ns"] = os.stat(r1["path"]).st_ctime_ns
    with open(side, "w") as f:
        json.dump(rec, f)
    r3 = dl.run(params(hub, dest))
    assert r3["verified"] == "sidecar"  # documented limit of the fast path: force_verify catches it
    r4 = dl.run(params(hub, dest, force_verify=True))
    assert r4["changed"] and r4["verified"] == "download" and "did not match" in r4["msg"]
    assert sha256_of(r4["path"]) == model and len(quarantined(dest)) == 1


def test_changed_mtime_rehashes_once(hub, dest, model):
    r1 = dl.run(params(hub, dest))
    os.utime(r1["path"], (1, 1))
    hub.reset_stats()
    r2 = dl.run(params(hub, dest))
    assert r2["verified"] == "hashed" and not r2["changed"] and gets(hub) == []
    assert dl.run(params(hub, dest))["verified"] == "sidecar"


def test_existing_file_without_sidecar(hub, dest, model):
    src = os.path.join(hub.state.root, "org", "m", "model.gguf")
    with open(src, "rb") as f, open(os.path.join(str(dest), "model.gguf"), "wb") as g:
        g.write(f.read())  # e.g. fetched earlier with curl
    r = dl.run(params(hub, dest))
    assert r["verified"] == "hashed" and not r["changed"] and r["downloaded_bytes"] == 0
    with open(os.path.join(str(dest), "model.gguf"), "wb") as g:
        g.write(b"truncated")
    os.unlink(dl.sidecar_path(r["path"]))
    r = dl.run(params(hub, dest))
    assert r["changed"] and sha256_of(r["path"]) == model and len(quarantined(dest)) == 1


def test_split_gguf_set_is_one_model(hub, dest):
    shas = [hub.add_file("org/m/q/Big-0000%d-of-00003.gguf" % i, MIB + i, seed=i) for i in (1, 2, 3)]
    r = dl.run(params(hub, dest, filename="q/Big-00001-of-00003.gguf"))
    assert r["changed"] and len(r["paths"]) == 3 and r["path"] == r["paths"][0]
    assert [os.path.basename(p) for p in r["paths"]] == ["Big-0000%d-of-00003.gguf" % i for i in (1, 2, 3)]
    assert [sha256_of(p) for p in r["paths"]] == shas == [p["sha256"] for p in r["parts"]]
    assert r["size"] == 3 * MIB + 6
    r2 = dl.run(params(hub, dest, filename="q/Big-00001-of-00003.gguf"))
    assert not r2["changed"] and r2["verified"] == "sidecar"
    with pytest.raises(dl.DownloadError) as e:
        dl.run(params(hub, dest, filename="q/Big-00001-of-00003.gguf", sha256="0" * 64))
    assert "split" in e.value.msg


def test_split_set_with_missing_part_fails_clearly(hub, dest):
    hub.add_file("org/m/S-00001-of-00002.gguf", MIB)
    with pytest.raises(dl.DownloadError) as e:
        dl.run(params(hub, dest, filename="S-00001-of-00002.gguf"))
    assert "404" in e.value.msg and "S-00002-of-00002.gguf" in e.value.msg


def test_gated_repo_token_only_to_hub_and_never_returned(tmp_path, monkeypatch):
    gen = start_hub(tmp_path, cdn_host="localhost")  # CDN on another host name
    hub = next(gen)
    try:
        dest = make_dest(tmp_path)
        sha = hub.add_file("org/gated/model.gguf", SIZE, seed=5)
        progress = str(tmp_path / "progress.json")
        with pytest.raises(dl.DownloadError) as e:
            dl.run(params(hub, dest, repo="org/gated"))
        assert "401" in e.value.msg and "token" in e.value.msg
        r = dl.run(params(hub, dest, repo="org/gated", token=TOKEN, progress_file=progress))
        assert sha256_of(r["path"]) == sha
        reqs = hub.requests()
        assert all(q["auth"] for q in reqs if "/resolve/" in q["path"] and q["status"] != 401 and
                   q["method"] == "HEAD")
        cdn = [q for q in reqs if q["path"].startswith("/cdn/")]
        assert cdn and not any(q["auth"] for q in cdn) and all(q["host"].startswith("localhost") for q in cdn)
        blobs = [json.dumps(r)] + [open(os.path.join(str(dest), n)).read() for n in os.listdir(str(dest))
                                   if n.endswith(".json")] + [open(progress).read()]
        assert not any(TOKEN in b for b in blobs)
        with pytest.raises(dl.DownloadError) as e:
            dl.run(params(hub, dest, repo="org/gated", filename="missing-%s.gguf" % TOKEN, token=TOKEN))
        assert TOKEN not in e.value.msg and TOKEN not in str(e.value)
    finally:
        gen.close()


def test_check_mode_reports_and_touches_nothing(hub, dest, model, tmp_path):
    progress = str(tmp_path / "p.json")
    r = dl.run(params(hub, dest, progress_file=progress), check_mode=True)
    assert r["changed"] and "would download" in r["msg"] and r["sha256"] == model
    assert os.listdir(str(dest)) == [] and not os.path.exists(progress) and gets(hub) == []
    dl.run(params(hub, dest))
    r = dl.run(params(hub, dest), check_mode=True)
    assert not r["changed"] and r["verified"] == "sidecar"


def test_free_space_check_refuses_before_downloading(hub, dest, model, monkeypatch):
    class V(object):
        f_bavail, f_frsize = 10, 4096
    monkeypatch.setattr(dl.os, "statvfs", lambda p: V())
    with pytest.raises(dl.DownloadError) as e:
        dl.run(params(hub, dest))
    assert "not enough free space" in e.value.msg and str(dest) in e.value.msg
    assert gets(hub) == [] and os.listdir(str(dest)) == []


def test_free_space_check_names_the_filesystem_the_need_and_the_free_space(hub, dest, model, monkeypatch):
    """The refusal says which filesystem (its mount point), how much is free, how much the download needs
    (and the margin) and what to do; exactly enough room passes, one byte less does not."""
    margin = 3 * 4096

    class V(object):
        f_frsize = 1
        f_bavail = SIZE + margin - 1
    monkeypatch.setattr(dl.os, "statvfs", lambda p: V())
    with pytest.raises(dl.DownloadError) as e:
        dl.run(params(hub, dest, free_space_margin=margin))
    mount = disk_plan.mount_point(str(dest))
    assert e.value.msg == (
        "not enough free space for %s: the filesystem mounted at %s has %s free, %s needed (+12.0 KiB "
        "margin). Free space on %s, or set dest to a directory on another filesystem, and rerun; any partial "
        "download is kept and resumes" % (dest, mount, human(SIZE + margin - 1), human(SIZE), mount))
    assert gets(hub) == [] and os.listdir(str(dest)) == []
    V.f_bavail = SIZE + margin
    assert dl.run(params(hub, dest, free_space_margin=margin))["sha256"] == model


def test_disk_full_at_a_chosen_byte_names_the_filesystem_keeps_the_rest_and_resumes(hub, dest, model,
                                                                                    monkeypatch):
    """ENOSPC at byte `limit` (a filesystem whose preallocation reserves nothing): the message names the
    filesystem, its free space and the bytes still needed; the verified model beside it stays as it was;
    nothing reaches the final path; the rerun resumes from the bytes kept (fetches only the rest)."""
    other_sha = hub.add_file("org/m/other.gguf", MIB, seed=3)
    other = dl.run(params(hub, dest, filename="other.gguf"))["path"]
    other_record = open(os.path.join(str(dest), ".other.gguf.llmops.json")).read()
    limit = MIB + 12345
    full = FullAt(limit)
    monkeypatch.setattr(dl.os, "pwrite", full)
    with pytest.raises(dl.DownloadError) as e:
        dl.run(params(hub, dest))
    path = os.path.join(str(dest), "model.gguf")
    mount = disk_plan.mount_point(str(dest))
    assert e.value.msg.startswith("disk full while writing %s.part (No space left on device): the filesystem "
                                  "mounted at %s has " % (path, mount))
    number, unit = re.search(r" free, ([0-9.]+) (KiB|MiB) needed\. Free space on ", e.value.msg).groups()
    needed = float(number) * (1024 if unit == "KiB" else MIB)     # the bytes not written yet, as shown
    assert SIZE - limit - MIB / 10 <= needed <= SIZE - limit + download_transfer.BUF_SIZE + MIB / 10
    assert e.value.msg.endswith("and rerun; the partial download is kept and resumes")
    assert full.written == limit
    assert not os.path.exists(path) and os.path.getsize(path + ".part") == SIZE
    assert sha256_of(other) == other_sha
    assert open(os.path.join(str(dest), ".other.gguf.llmops.json")).read() == other_record
    monkeypatch.setattr(dl.os, "pwrite", full.real)
    hub.reset_stats()
    r = dl.run(params(hub, dest))
    assert limit - download_transfer.BUF_SIZE <= r["resumed_from"] <= limit
    assert body_bytes(hub) == SIZE - r["resumed_from"] and sha256_of(path) == model


def test_disk_full_at_the_record_keeps_the_verified_file_and_the_rerun_fetches_nothing(hub, dest, model,
                                                                                     monkeypatch):
    """The disk filled by another writer while the download went on into its preallocated part: the
    verified file is renamed into place, but its record cannot be written. The failure says so, names the
    filesystem and what to do; the rerun hashes the file and records it, fetching nothing."""
    real = dl.write_sidecar_record

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    monkeypatch.setattr(dl, "write_sidecar_record", full)
    with pytest.raises(dl.DownloadError) as e:
        dl.run(params(hub, dest))
    path = os.path.join(str(dest), "model.gguf")
    record = os.path.join(str(dest), ".model.gguf.llmops.json")
    mount = disk_plan.mount_point(str(dest))
    assert e.value.msg.startswith(
        "disk full while writing %s, the verification record of %s (No space left on device): the file is in "
        "place with sha256 %s, but nothing records that yet; the filesystem mounted at %s has "
        % (record, path, model, mount))
    assert e.value.msg.endswith(
        "free, 4.0 KiB needed. Free space on %s, or set dest to a directory on another filesystem, and "
        "rerun: the next run hashes the file once and records it, without downloading it again" % mount)
    assert sha256_of(path) == model and os.listdir(str(dest)) == ["model.gguf"]  # no part, no record
    monkeypatch.setattr(dl, "write_sidecar_record", real)
    hub.reset_stats()
    r = dl.run(params(hub, dest))
    assert (r["verified"], r["downloaded_bytes"], r["sha256"]) == ("hashed", 0, model) and gets(hub) == []
    assert os.path.exists(record)


def test_disk_full_mid_download_keeps_partial_and_resumes(hub, dest, model, monkeypatch):
    real = os.pwrite
    calls = {"n": 0}

    def pwrite(fd, data, off):
        calls["n"] += 1
        if calls["n"] > 1:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(fd, data, off)
    monkeypatch.setattr(dl.os, "pwrite", pwrite)
    with pytest.raises(dl.DownloadError) as e:
        dl.run(params(hub, dest))
    assert "disk full" in e.value.msg and "kept" in e.value.msg
    path = os.path.join(str(dest), "model.gguf")
    assert not os.path.exists(path) and os.path.exists(path + ".part")
    monkeypatch.setattr(dl.os, "pwrite", real)
    hub.reset_stats()
    r = dl.run(params(hub, dest))
    assert r["resumed_from"] > 0 and body_bytes(hub) < SIZE and sha256_of(path) == model


def test_moved_main_kept_unless_update(hub, dest, model):
    r1 = dl.run(params(hub, dest))
    old = r1["commit"]
    new = hub.move_main("org/m")
    r2 = dl.run(params(hub, dest))
    assert not r2["changed"] and r2["update_available"] and r2["commit"] == old
    assert new in r2["msg"] and "update: true" in r2["msg"]
    hub.reset_stats()
    r3 = dl.run(params(hub, dest, update=True))  # same bytes at the new commit: just re-record
    assert r3["commit"] == new and not r3["changed"] and gets(hub) == []
    # new content upstream
    sha2 = hub.add_file("org/m/model.gguf", SIZE + 5, seed=99)
    hub.move_main("org/m")
    r4 = dl.run(params(hub, dest))
    assert not r4["changed"] and sha256_of(r4["path"]) == model
    r5 = dl.run(params(hub, dest, update=True))
    assert r5["changed"] and sha256_of(r5["path"]) == sha2 and r5["commit"] == hub.commit("org/m")


def test_pinned_commit_rerun_needs_no_network(hub, dest, model):
    c = hub.commit("org/m")
    dl.run(params(hub, dest, revision=c))
    hub.stop()
    r = dl.run(params(hub, dest, revision=c, retries=0))
    assert r["verified"] == "sidecar" and r["commit"] == c


def test_hub_unreachable_keeps_verified_file(hub, dest, model):
    dl.run(params(hub, dest))
    hub.stop()
    r = dl.run(params(hub, dest, retries=0))
    assert not r["changed"] and "could not reach" in r["msg"]


def test_given_sha256_and_size(hub, dest, model):
    with pytest.raises(dl.DownloadError) as e:
        dl.run(params(hub, dest, sha256="ab" * 32))
    assert "differs" in e.value.msg and gets(hub) == []
    with pytest.raises(dl.DownloadError) as e:
        dl.run(params(hub, dest, sha256="xyz"))
    assert "64 hex" in e.value.msg
    r = dl.run(params(hub, dest, sha256=model.upper(), size=SIZE))
    assert r["sha256"] == model


def test_hf_endpoint_env_is_honoured(hub, dest, model, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    p = params(hub, dest)
    del p["endpoint"]
    r = dl.run(p)
    assert r["source_url"].startswith(hub.url) and sha256_of(r["path"]) == model


def test_plain_url_with_and_without_sha256(hub, dest, model):
    url = hub.url + "/cdn/org/m/model.gguf?sig=s3cr3t"
    r = dl.run(dict(url=url, dest=str(dest), sha256=model, retry_delay=0.01, free_space_margin=0))
    assert r["verified"] == "download" and r["commit"] is None and "s3cr3t" not in json.dumps(r)
    assert dl.run(dict(url=url, dest=str(dest), sha256=model))["verified"] == "sidecar"
    d2 = make_dest(dest)
    r = dl.run(dict(url=url, dest=str(d2), free_space_margin=0))
    assert r["sha256"] == model  # computed while downloading, recorded
    hub.set_fault("corrupt", offset=5)
    d3 = make_dest(d2)
    with pytest.raises(dl.DownloadError):
        dl.run(dict(url=url, dest=str(d3), sha256=model, free_space_margin=0))
    assert_final_good_or_absent(os.path.join(str(d3), "model.gguf"), model)


def test_bad_input_says_what_to_do(tmp_path):
    with pytest.raises(dl.DownloadError, match="either url, or repo"):
        dl.run(dict(dest=str(tmp_path)))
    with pytest.raises(dl.DownloadError, match="org/name"):
        dl.run(dict(repo="nope", filename="x", dest=str(tmp_path)))
    with pytest.raises(dl.DownloadError, match="filename is required"):
        dl.run(dict(repo="a/b", dest=str(tmp_path)))


def test_progress_file_reports_state(hub, dest, model, tmp_path):
    progress = str(tmp_path / "p.json")
    dl.run(params(hub, dest, progress_file=progress))
    p = json.load(open(progress))
    assert p["state"] == "done" and p["bytes_total"] == SIZE == p["bytes_done"] and p["percent"] == 100.0
    assert set(p) >= {"bytes_done", "bytes_total", "percent", "rate_mbs", "eta_s", "state"}


def test_ranges_merge():
    r = download_ranges.Ranges([(10, 20), (0, 5), (5, 10), (30, 40)])
    assert r.items == [[0, 20], [30, 40]] and r.prefix_end() == 20 and r.total() == 30
    assert r.missing(50) == [(20, 30), (40, 50)]
    r.add(15, 35)
    assert r.items == [[0, 40]]


def test_split_names():
    parts = download_source.split_parts("a-00002-of-00003.gguf")
    assert parts == ["a-0000%d-of-00003.gguf" % i for i in (1, 2, 3)]
    assert download_source.split_parts("a.gguf") == ["a.gguf"]
    with pytest.raises(dl.DownloadError):
        download_source.split_parts("a-00004-of-00003.gguf")


def _run_module(args, tmp_path):
    f = tmp_path / ("args%d.json" % len(os.listdir(str(tmp_path))))
    f.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": args}))
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "collections"))
    module = os.path.join(ROOT, "plugins", "modules", "model_download.py")
    p = subprocess.run([sys.executable, module, str(f)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       env=env, timeout=120)
    return p.stdout.decode(), json.loads(p.stdout.decode().strip().splitlines()[-1])


def test_module_end_to_end_subprocess(hub, dest, model, tmp_path):
    hub.add_file("org/gated/model.gguf", SIZE, seed=3)
    args = dict(repo="org/gated", filename="model.gguf", endpoint=hub.url, token=TOKEN, dest=str(dest),
                mode="0640", retry_delay=0.01)
    out, res = _run_module(args, tmp_path)
    assert not res.get("failed"), res
    assert res["changed"] and res["sha256"] == model and res["verified"] == "download"
    assert stat.S_IMODE(os.stat(res["path"]).st_mode) == 0o640 and TOKEN not in out
    out, res = _run_module(args, tmp_path)
    assert not res["changed"] and res["verified"] == "sidecar" and TOKEN not in out
    out, res = _run_module(dict(args, filename="nope.gguf"), tmp_path)
    assert res["failed"] and "404" in res["msg"] and TOKEN not in out
    out, res = _run_module(dict(args, _ansible_check_mode=True, filename="model.gguf", mode="0600"), tmp_path)
    assert not res.get("failed"), res
    assert hashlib.sha256(open(res["path"], "rb").read()).hexdigest() == model


def test_dest_must_be_a_directory(hub, dest, model):
    with pytest.raises(dl.DownloadError, match="directory"):
        dl.run(params(hub, str(dest) + "/model.gguf"))


def test_check_mode_reports_lack_of_space(hub, dest, model, monkeypatch):
    class V(object):
        f_bavail, f_frsize = 1, 4096
    monkeypatch.setattr(dl.os, "statvfs", lambda p: V())
    r = dl.run(params(hub, dest), check_mode=True)
    assert "would fail: not enough free space" in r["msg"] and os.listdir(str(dest)) == []


def test_small_non_lfs_file_without_hub_sha256(hub, dest):
    hub.add_file("org/m/config.json", 500, seed=4)
    r = dl.run(params(hub, dest, filename="config.json"))
    assert r["sha256"] == sha256_of(r["path"]) and "no sha256" in r["msg"]
    assert dl.run(params(hub, dest, filename="config.json"))["verified"] == "sidecar"


def test_progress_file_updates_while_downloading(hub, dest, model, tmp_path):
    import threading
    import time
    progress = str(tmp_path / "p.json")
    # ~7 s for the 2 MB file: the progress file is written at most once a second, and a loaded machine
    # must still see it move between two reads
    hub.set_fault("rate", bps=300 * 1024)
    seen = []
    stop = threading.Event()

    def poll():
        while not stop.is_set():
            try:
                seen.append(json.load(open(progress)))
            except (OSError, ValueError):
                pass
            time.sleep(0.2)
    th = threading.Thread(target=poll)
    th.start()
    try:
        dl.run(params(hub, dest, progress_file=progress))
    finally:
        stop.set()
        th.join()
    mid = [p for p in seen if p["state"] == "downloading" and 0 < p["percent"] < 100]
    assert len(mid) >= 2 and mid[-1]["bytes_done"] > mid[0]["bytes_done"]
    assert any(p["rate_mbs"] > 0 and p["eta_s"] is not None for p in mid)


def test_progress_file_says_failed_with_the_reason(hub, dest, model, tmp_path):
    progress = str(tmp_path / "p.json")
    hub.set_fault("corrupt", offset=10)
    with pytest.raises(dl.DownloadError):
        dl.run(params(hub, dest, progress_file=progress))
    p = json.load(open(progress))
    assert p["state"] == "failed" and "checksum mismatch" in p["error"]


def test_killed_module_resumes_where_it_stopped(hub, dest, tmp_path):
    """SIGKILL mid-download (as an async timeout would): the next run fetches only the rest."""
    import signal
    import time
    size = 6 * MIB
    sha = hub.add_file("org/m/slow.gguf", size, seed=11)
    hub.set_fault("rate", bps=2 * MIB)
    f = tmp_path / "kill-args.json"
    f.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": dict(repo="org/m", filename="slow.gguf", endpoint=hub.url,
                                                         dest=str(dest), free_space_margin=0)}))
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "collections"))
    module = os.path.join(ROOT, "plugins", "modules", "model_download.py")
    p = subprocess.Popen([sys.executable, module, str(f)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         env=env)
    # Killed once the module has recorded at least 1 MiB (the .part.json ranges, written about once a
    # second), not after a fixed sleep: on a loaded machine the module may take seconds to start.
    state, deadline = os.path.join(str(dest), "slow.gguf.part.json"), time.monotonic() + 60
    while time.monotonic() < deadline and p.poll() is None:
        try:
            with open(state) as handle:
                if sum(end - start for start, end in json.load(handle).get("done") or []) >= MIB:
                    break
        except (OSError, ValueError):
            pass
        time.sleep(0.1)
    p.send_signal(signal.SIGKILL)
    p.communicate()
    time.sleep(0.6)  # let the hub notice the dead peer and log that response before the stats reset
    path = os.path.join(str(dest), "slow.gguf")
    assert not os.path.exists(path) and os.path.exists(path + ".part.json")
    hub.clear_faults()
    hub.reset_stats()
    r = dl.run(params(hub, dest, filename="slow.gguf"))
    assert r["resumed_from"] >= MIB and body_bytes(hub) == size - r["resumed_from"]
    assert sha256_of(path) == sha == r["sha256"]


def test_free_space_counts_the_partial_already_on_disk(hub, dest, model, monkeypatch):
    hub.set_fault("cut", after=MIB, times=1)
    with pytest.raises(dl.DownloadError):
        dl.run(params(hub, dest, retries=0))

    class Full(object):
        f_bavail, f_frsize = 0, 4096
    # the .part is preallocated: resuming needs no new space, so a full disk does not block it
    monkeypatch.setattr(dl.os, "statvfs", lambda p: Full())
    r = dl.run(params(hub, dest))
    assert r["resumed_from"] == MIB and sha256_of(r["path"]) == model
    hub.add_file("org/m/other.gguf", MIB)
    with pytest.raises(dl.DownloadError, match="not enough free space"):
        dl.run(params(hub, dest, filename="other.gguf"))
