# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Deadlines and read limits of the download machinery (GitHub issue 23): a server that sends one byte per
second (never silent long enough for the idle timeout) meets a total deadline per request, in model_download
(a HEAD, the ModelScope listing, while the destination lock is held) and in gguf_info's remote header read;
a ModelScope listing is read and parsed within documented limits; error and redirect bodies are read
bounded; download_wait reads the progress file without blocking on a FIFO or following a link."""
import http.client
import json
import os
import subprocess
import time
import tracemalloc

import pytest
from ansible_collections.llmops.serving.plugins.module_utils._download import http as download_http
from ansible_collections.llmops.serving.plugins.module_utils._download import source as download_source
from ansible_collections.llmops.serving.plugins.module_utils._model_format import gguf_remote

from tests.fixtures.fake_hub.helpers import MIB, dl, fails_fast, params
from tests.fixtures.gguf.builder import tiny_qwen35

# timeout 1 s: the deadline of one request is DEADLINE_FACTOR (4) times that. The drips below send 4 bytes/s:
# never silent for the idle timeout, far too slow to end within the deadline.
FAST = dict(timeout=1, retries=0)


def elapsed(fn, *a, **kw):
    t = time.monotonic()
    with fails_fast(30):
        try:
            fn(*a, **kw)
        except dl.DownloadError as e:
            return time.monotonic() - t, e
    raise AssertionError("no error")


# =============================================================================================
# A total deadline per request
# =============================================================================================
def test_a_head_sent_at_one_byte_per_second_meets_the_deadline(hub, dest, model):
    hub.set_fault("drip", bps=4, match="/resolve/", method="HEAD")
    took, e = elapsed(dl.run, params(hub, dest, **FAST))
    assert took < 4 * 1 + 3, took
    assert "within 4 s" in e.msg and "model.gguf" in e.msg, e.msg
    assert os.listdir(str(dest)) == []


def test_a_modelscope_listing_at_one_byte_per_second_releases_the_lock(hub, dest, model):
    hub.set_fault("drip", bps=4, match="/api/v1/")
    took, e = elapsed(dl.run, params(hub, dest, source="modelscope", **FAST))
    assert took < 4 * 1 + 3, took
    assert "file listing" in e.msg and "within 4 s" in e.msg, e.msg
    assert not os.path.exists(os.path.join(str(dest), ".model.gguf.llmops.lock"))


def test_a_remote_gguf_header_at_one_byte_per_second_meets_the_deadline(hub):
    hub.state.root  # noqa: B018 - the fixture's hub serves the tiny model below
    path = os.path.join(hub.state.root, "org", "m", "tiny.gguf")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(tiny_qwen35().build().data)
    hub.set_fault("drip", bps=4, match="/cdn/", method="GET")
    took, e = elapsed(gguf_remote.inspect_remote,
                      dict(repo="org/m", filename="tiny.gguf", endpoint=hub.url, retry_delay=0.01, **FAST))
    assert took < 4 * 1 + 3, took
    assert "within 4 s" in e.msg and "tiny.gguf" in e.msg, e.msg


def test_a_slow_but_steady_answer_within_the_deadline_still_works(hub, dest, model):
    hub.set_fault("drip", bps=400, match="/resolve/", method="HEAD")  # ~300 header bytes: under a second
    r = dl.run(params(hub, dest, timeout=1))
    assert r["changed"]


# =============================================================================================
# Read limits
# =============================================================================================
def pad_listing(hub, size, kind="entries"):
    """Make the hub's listing at least size bytes, and have it built before a test measures memory (the
    fake hub runs in the test's process: its own copy must not count)."""
    hub.set_fault("listing_pad", bytes=size, kind=kind, times=-1)
    c = http.client.HTTPConnection(hub.host, hub.port, timeout=60)
    c.request("GET", "/api/v1/models/org/m/repo/files?Revision=master&Recursive=true")
    assert len(c.getresponse().read()) >= size
    c.close()
    hub.reset_stats()


def test_a_60_mb_listing_is_refused_without_reading_it(hub, dest, model):
    pad_listing(hub, 60 * 1000 * 1000)
    tracemalloc.start()
    try:
        took, e = elapsed(dl.run, params(hub, dest, source="modelscope", retries=0))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert "larger than %d bytes" % download_source.LISTING_MAX_BYTES in e.msg, e.msg
    assert took < 5 and peak < 32 * MIB, (took, peak)


def test_a_60_mb_listing_is_refused_by_gguf_info_too(hub, model):
    pad_listing(hub, 60 * 1000 * 1000)
    with fails_fast(30), pytest.raises(dl.DownloadError) as e:
        gguf_remote.inspect_remote(dict(repo="org/m", filename="model.gguf", endpoint=hub.url,
                                        source="modelscope", retries=0))
    assert "not a file listing" in e.value.msg


@pytest.mark.parametrize("kind", ["entries", "lists"])
def test_a_listing_under_the_byte_limit_parses_in_bounded_memory(hub, dest, model, kind):
    pad_listing(hub, download_source.LISTING_MAX_BYTES - 4096, kind)
    tracemalloc.start()
    try:
        t = time.monotonic()
        with fails_fast(60):
            try:
                r = dl.run(params(hub, dest, source="modelscope", retries=0, timeout=10))
            except dl.DownloadError as e:
                r = e
        took = time.monotonic() - t
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    # 16 MiB of JSON: the raw bytes, their text, and what is kept (the entries of the files asked for)
    assert peak < 4 * download_source.LISTING_MAX_BYTES, peak
    assert took < 30, took
    if kind == "entries":
        assert r["changed"], r
    else:
        assert "values" in r.msg, r.msg


def test_listing_parse_limits_without_a_server():
    o = {"repo": "org/m", "endpoint": "http://hub", "filename": "m.gguf"}
    deep = b'{"Code": 200, "Data": {"Files": ' + b"[" * 100000 + b"]" * 100000 + b"}}"
    with pytest.raises(dl.DownloadError, match="not a file listing"):
        download_source.parse_listing(deep, o, "master")
    values = b",".join([b"0"] * (download_source.LISTING_MAX_VALUES + 1))
    many = b'{"Code": 200, "Data": {"Files": [' + values + b"]}}"
    with pytest.raises(dl.DownloadError, match="values"):
        download_source.parse_listing(many, o, "master")
    ok = json.dumps({"Code": 200, "Data": {"Files": [
        {"Path": "m.gguf", "Size": 3, "Sha256": "a" * 64}, {"Path": "other.bin", "Size": 1}]}}).encode()
    assert list(download_source.parse_listing(ok, o, "master")) == ["m.gguf"]


class _Body(object):
    """A response whose body never ends: read(n) hands out n bytes and counts them."""

    status = 404

    def __init__(self):
        self.read_bytes = 0
        self.closed = False

    def getheader(self, name, default=None):
        return default

    def read(self, n=None):
        assert n is not None, "an unbounded read of a body that never ends"
        self.read_bytes += n
        return b"x" * n

    def isclosed(self):
        return False

    def close(self):
        self.closed = True


def test_error_bodies_are_read_bounded():
    resp = _Body()
    err = download_http.status_error(resp, "http://hub/x", "GET x")
    assert "404" in err.msg and resp.read_bytes <= download_http.ERROR_BODY_MAX + 1 and resp.closed


# =============================================================================================
# download_wait: the progress file is read without blocking and without following links
# =============================================================================================
def _probe(tmp_path, progress):
    from ansible_collections.llmops.serving.plugins.action.download_wait import parse_probe, probe_command
    job = tmp_path / "job"
    job.write_text('{"started": 1, "finished": 0}')
    t = time.monotonic()
    out = subprocess.run(["/bin/sh", "-c", probe_command(str(job), str(progress), 0)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, timeout=20, universal_newlines=True).stdout
    return time.monotonic() - t, out, parse_probe(out)


def test_the_probe_does_not_block_on_a_fifo(tmp_path):
    fifo = tmp_path / "progress.json"
    os.mkfifo(str(fifo))
    took, _out, state = _probe(tmp_path, fifo)
    assert took < 5 and state == (False, None)


def test_the_probe_does_not_follow_a_link_to_another_file(tmp_path):
    secret = tmp_path / "shadow"
    secret.write_text('{"state": "root:$6$secrethash", "bytes_total": 1}')
    link = tmp_path / "progress.json"
    os.symlink(str(secret), str(link))
    _took, out, state = _probe(tmp_path, link)
    assert "secrethash" not in out and state == (False, None)


def test_the_probe_reads_a_bounded_prefix(tmp_path):
    big = tmp_path / "progress.json"
    with open(str(big), "w") as f:
        f.write('{"state": "downloading", "pad": "' + "x" * (4 * MIB) + '"}')
    _took, out, state = _probe(tmp_path, big)
    assert len(out) < 128 * 1024 and state == (False, None)


def test_the_probe_still_reads_a_regular_progress_file(tmp_path):
    progress = tmp_path / "progress.json"
    progress.write_text(json.dumps({"state": "downloading", "bytes_total": 10, "bytes_done": 5}))
    _took, _out, state = _probe(tmp_path, progress)
    assert state == (False, {"state": "downloading", "bytes_total": 10, "bytes_done": 5})
