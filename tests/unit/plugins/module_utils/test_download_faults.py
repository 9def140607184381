# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""model_download against a misbehaving hub: every fault, and the final path never holds bad bytes."""
import json
import os
import time

import pytest

from tests.fixtures.fake_hub.helpers import (
    MIB,
    assert_final_good_or_absent,
    body_bytes,
    dl,
    params,
    quarantined,
    sha256_of,
)

SIZE = 3 * MIB + 4321


@pytest.fixture
def model(hub):
    return hub.add_file("org/m/model.gguf", SIZE, seed=7)


def final(dest):
    return os.path.join(str(dest), "model.gguf")


def test_clean_download_pins_commit_and_verifies(hub, dest, model):
    r = dl.run(params(hub, dest))
    assert r["changed"] and r["verified"] == "download" and r["sha256"] == model
    assert r["commit"] == hub.commit("org/m") and "/resolve/%s/" % r["commit"] in r["source_url"]
    assert sha256_of(r["path"]) == model and r["size"] == SIZE == r["downloaded_bytes"]
    gets = [e for e in hub.requests() if e["method"] == "GET"]
    assert all(hub.commit("org/m") in e["path"] for e in gets if "/resolve/" in e["path"])
    assert not os.path.exists(r["path"] + ".part") and not os.path.exists(r["path"] + ".part.json")


def test_cut_once_resumes_without_refetching(hub, dest, model):
    hub.set_fault("cut", after=MIB + 17, times=1)
    r = dl.run(params(hub, dest))
    assert r["sha256"] == model and sha256_of(final(dest)) == model
    assert body_bytes(hub) == SIZE  # the first MiB was not fetched twice
    ranges = [e["range"] for e in hub.requests() if e["path"].startswith("/cdn/")]
    assert "bytes=%d-%d" % (MIB + 17, SIZE - 1) in ranges


def test_cut_every_time_still_completes(hub, dest, model):
    hub.set_fault("cut", after=MIB, times=-1)
    r = dl.run(params(hub, dest))
    assert sha256_of(r["path"]) == model
    assert len([e for e in hub.requests() if e["path"].startswith("/cdn/")]) >= 4


def test_no_progress_gives_up_and_keeps_partial(hub, dest, model):
    hub.set_fault("cut", after=MIB, times=1)
    with pytest.raises(dl.DownloadError) as e:
        dl.run(params(hub, dest, retries=0))
    assert "rerun to resume" in e.value.msg
    assert not os.path.exists(final(dest))
    state = json.load(open(final(dest) + ".part.json"))
    assert state["done"] == [[0, MIB]]
    # second attempt: only the rest travels
    hub.reset_stats()
    r = dl.run(params(hub, dest))
    assert r["resumed_from"] == MIB and r["downloaded_bytes"] == SIZE - MIB
    assert body_bytes(hub) == SIZE - MIB < SIZE
    assert sha256_of(r["path"]) == model


def test_connection_refused_fails_cleanly(hub, dest, model):
    p = params(hub, dest, endpoint="http://127.0.0.1:9", retries=1)
    with pytest.raises(dl.DownloadError) as e:
        dl.run(p)
    assert "giving up" in e.value.msg and not os.listdir(str(dest))


def test_server_ignoring_range_on_resume_restarts_honestly(hub, dest, model):
    hub.set_fault("cut", after=MIB, times=1)
    with pytest.raises(dl.DownloadError):
        dl.run(params(hub, dest, retries=0))
    hub.set_fault("ignore_range")
    hub.reset_stats()
    r = dl.run(params(hub, dest))
    assert r["sha256"] == model and sha256_of(r["path"]) == model
    assert r["downloaded_bytes"] == SIZE  # started over from byte 0, and says so


def test_server_answering_416_falls_back_to_full_get(hub, dest, model):
    hub.set_fault("cut", after=MIB, times=1)
    with pytest.raises(dl.DownloadError):
        dl.run(params(hub, dest, retries=0))
    hub.set_fault("416", times=-1)
    r = dl.run(params(hub, dest))
    assert sha256_of(r["path"]) == model
    assert any(e["status"] == 416 for e in hub.requests())


def test_corrupt_byte_is_quarantined_and_fails_loudly(hub, dest, model):
    hub.set_fault("corrupt", offset=2 * MIB + 5)
    with pytest.raises(dl.DownloadError) as e:
        dl.run(params(hub, dest))
    msg = e.value.msg
    assert "checksum mismatch" in msg and model in msg and "got" in msg
    assert not os.path.exists(final(dest))
    q = quarantined(dest)
    assert len(q) == 1 and os.path.getsize(q[0]) == SIZE and sha256_of(q[0]) != model
    assert not os.path.exists(final(dest) + ".part") and not os.path.exists(final(dest) + ".part.json")
    hub.clear_faults()
    r = dl.run(params(hub, dest))
    assert sha256_of(r["path"]) == model


def test_stall_hits_read_timeout_and_resumes(hub, dest, model):
    hub.set_fault("stall", after=MIB, seconds=3)
    t = time.monotonic()
    r = dl.run(params(hub, dest, timeout=1))
    assert sha256_of(r["path"]) == model
    assert time.monotonic() - t < 3
    assert body_bytes(hub) <= SIZE + MIB


@pytest.mark.parametrize("code", [429, 503])
def test_retry_after_is_honoured(hub, dest, model, code):
    hub.set_fault("status", code=code, times=2, retry_after=1)
    t = time.monotonic()
    r = dl.run(params(hub, dest))
    assert sha256_of(r["path"]) == model
    assert time.monotonic() - t >= 1.9  # two Retry-After: 1 waits, not the 0.01 s backoff


def test_status_forever_gives_up(hub, dest, model):
    hub.set_fault("status", code=503, times=-1, retry_after=0)
    with pytest.raises(dl.DownloadError) as e:
        dl.run(params(hub, dest, retries=2))
    assert "503" in e.value.msg and not os.path.exists(final(dest))


PSIZE = 24 * MIB + 999


@pytest.fixture
def big(hub):
    return hub.add_file("org/m/big.gguf", PSIZE, seed=9)


def pparams(hub, dest, **kw):
    return params(hub, dest, filename="big.gguf", parallel_min_size=MIB, connections=4, **kw)


def test_parallel_download_is_correct_and_parallel(hub, dest, big):
    r = dl.run(pparams(hub, dest))
    assert r["sha256"] == big and sha256_of(r["path"]) == big
    ranged = [e for e in hub.requests() if e["path"].startswith("/cdn/") and e["status"] == 206]
    assert len(ranged) >= 4  # several chunks
    assert body_bytes(hub) == PSIZE


def test_parallel_interrupted_resumes_without_starting_over(hub, dest, big):
    hub.set_fault("cut", after=3 * MIB, times=-1)
    with pytest.raises(dl.DownloadError):
        dl.run(pparams(hub, dest, retries=0))
    state = json.load(open(os.path.join(str(dest), "big.gguf.part.json")))
    have = sum(b - a for a, b in state["done"])
    assert have >= 3 * MIB
    assert_final_good_or_absent(os.path.join(str(dest), "big.gguf"), big)
    hub.clear_faults()
    hub.reset_stats()
    r = dl.run(pparams(hub, dest))
    assert r["resumed_from"] == have and body_bytes(hub) == PSIZE - have < PSIZE
    assert sha256_of(r["path"]) == big == r["sha256"]


def test_parallel_with_drops_and_stalls(hub, dest, big):
    hub.set_fault("cut", after=2 * MIB + 3, times=3)
    hub.set_fault("stall", after=MIB, seconds=2, times=1)
    r = dl.run(pparams(hub, dest, timeout=1))
    assert sha256_of(r["path"]) == big == r["sha256"]


def test_parallel_server_ignoring_range_falls_back(hub, dest, big):
    hub.set_fault("ignore_range")
    r = dl.run(pparams(hub, dest))
    assert sha256_of(r["path"]) == big == r["sha256"]


def test_parallel_corruption_quarantined(hub, dest, big):
    hub.set_fault("corrupt", offset=20 * MIB)
    with pytest.raises(dl.DownloadError) as e:
        dl.run(pparams(hub, dest))
    assert "checksum mismatch" in e.value.msg
    assert not os.path.exists(os.path.join(str(dest), "big.gguf")) and len(quarantined(dest)) == 1


def test_complete_part_left_before_rename_is_finished_without_download(hub, dest, model):
    # a run killed after the last byte but before the rename: .part complete, ranges all done
    hub.set_fault("cut", after=MIB, times=1)
    with pytest.raises(dl.DownloadError):
        dl.run(params(hub, dest, retries=0))
    dl.run(params(hub, dest))
    path = final(dest)
    os.rename(path, path + ".part")
    with open(path + ".part.json", "w") as f:
        json.dump({"version": 1, "identity": dl.FileDownload(
            dl.normalize(params(hub, dest)), _target(hub, dest), None)._identity(),
            "done": [[0, SIZE]], "cdn_etag": None}, f)
    os.unlink(dl.sidecar_path(path))
    hub.reset_stats()
    r = dl.run(params(hub, dest))
    assert r["changed"] and r["downloaded_bytes"] == 0 and r["resumed_from"] == SIZE
    assert body_bytes(hub) == 0 and sha256_of(path) == model


def _target(hub, dest):
    o = dl.normalize(params(hub, dest))
    t = dl.build_targets(o)[0]
    s = dl.Session()
    try:
        return dl.fetch_metadata(o, t, s)
    finally:
        s.close()
