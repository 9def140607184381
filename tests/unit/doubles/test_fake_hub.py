# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The fake hub itself: HF-like resolve/CDN behaviour and every switchable fault."""
import hashlib
import http.client
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from urllib.parse import urlsplit

import pytest

from tests.fixtures.fake_hub.server import FakeHub, write_random_file
from tests.helpers import ROOT  # noqa: E402

SIZE = 3 * 1024 * 1024 + 123
TOKEN = "hf_fakehubtoken"


@pytest.fixture
def hub(tmp_path):
    h = FakeHub(str(tmp_path), gated=("org/gated",), tokens=(TOKEN,)).start()
    h.sha = h.add_file("org/m/model.gguf", SIZE, seed=1)
    h.small_sha = h.add_file("org/m/config.json", 100, seed=2)
    h.add_file("org/gated/model.gguf", 2048, seed=3)
    yield h
    h.stop()


def req(hub, method, path, headers=None, timeout=5):
    u = urlsplit(path if path.startswith("http") else hub.url + path)
    c = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)
    c.request(method, u.path + ("?" + u.query if u.query else ""), headers=headers or {})
    r = c.getresponse()
    return c, r


def cdn_path(hub):
    _, r = req(hub, "HEAD", "/org/m/resolve/main/model.gguf")
    return r.getheader("Location")


def file_bytes(hub):
    with open(os.path.join(hub.state.root, "org", "m", "model.gguf"), "rb") as f:
        return f.read()


def test_resolve_head_gives_lfs_metadata_and_redirect(hub):
    _, r = req(hub, "HEAD", "/org/m/resolve/main/model.gguf")
    assert r.status == 302
    assert r.getheader("X-Linked-Etag") == '"%s"' % hub.sha
    assert r.getheader("X-Linked-Size") == str(SIZE)
    commit = r.getheader("X-Repo-Commit")
    assert re.match(r"^[0-9a-f]{40}$", commit) and commit == hub.commit("org/m")
    assert "/cdn/org/m/model.gguf" in r.getheader("Location")
    # the commit id itself works as revision; an unknown one does not
    _, r2 = req(hub, "HEAD", "/org/m/resolve/%s/model.gguf" % commit)
    assert r2.status == 302 and r2.getheader("X-Repo-Commit") == commit
    _, r3 = req(hub, "HEAD", "/org/m/resolve/%s/model.gguf" % ("0" * 40))
    assert r3.status == 404 and r3.getheader("X-Error-Code") == "RevisionNotFound"


def test_unknown_file_404_and_small_file_served_directly(hub):
    _, r = req(hub, "GET", "/org/m/resolve/main/nope.gguf")
    assert r.status == 404 and r.getheader("X-Error-Code") == "EntryNotFound"
    r.read()
    _, r = req(hub, "GET", "/org/m/resolve/main/config.json")
    assert r.status == 200 and r.getheader("X-Linked-Etag") is None
    assert hashlib.sha256(r.read()).hexdigest() == hub.small_sha


def test_move_main_changes_commit(hub):
    old = hub.commit("org/m")
    new = hub.move_main("org/m")
    assert new != old
    _, r = req(hub, "HEAD", "/org/m/resolve/main/model.gguf")
    assert r.getheader("X-Repo-Commit") == new
    _, r = req(hub, "HEAD", "/org/m/resolve/%s/model.gguf" % old)
    assert r.status == 302


def test_cdn_range_if_range_and_416(hub):
    data = file_bytes(hub)
    loc = cdn_path(hub)
    _, r = req(hub, "GET", loc, {"Range": "bytes=100-199"})
    assert r.status == 206 and r.getheader("Content-Range") == "bytes 100-199/%d" % SIZE
    assert r.read() == data[100:200]
    etag = r.getheader("ETag")
    assert etag == '"%s"' % hub.sha
    _, r = req(hub, "GET", loc, {"Range": "bytes=%d-" % (SIZE - 10), "If-Range": etag})
    assert r.status == 206 and r.read() == data[-10:]
    _, r = req(hub, "GET", loc, {"Range": "bytes=10-", "If-Range": '"other"'})
    assert r.status == 200 and r.read() == data
    _, r = req(hub, "GET", loc, {"Range": "bytes=%d-" % SIZE})
    assert r.status == 416 and r.getheader("Content-Range") == "bytes */%d" % SIZE


def test_parallel_ranges_reassemble(hub):
    loc = cdn_path(hub)
    n = 6
    step = SIZE // n + 1
    out = [None] * n

    def get(i):
        _, r = req(hub, "GET", loc, {"Range": "bytes=%d-%d" % (i * step, min(SIZE, (i + 1) * step) - 1)})
        assert r.status == 206
        out[i] = r.read()
    threads = [threading.Thread(target=get, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert hashlib.sha256(b"".join(out)).hexdigest() == hub.sha


def test_gated_repo_needs_bearer_token(hub):
    _, r = req(hub, "HEAD", "/org/gated/resolve/main/model.gguf")
    assert r.status == 401 and r.getheader("X-Error-Code") == "GatedRepo"
    _, r = req(hub, "HEAD", "/org/gated/resolve/main/model.gguf", {"Authorization": "Bearer wrong"})
    assert r.status == 401
    _, r = req(hub, "HEAD", "/org/gated/resolve/main/model.gguf", {"Authorization": "Bearer " + TOKEN})
    assert r.status == 302
    assert hub.requests()[-1]["auth"] is True


def test_fault_cut_once_and_always(hub):
    loc = cdn_path(hub)
    hub.set_fault("cut", after=1000, times=1)
    _, r = req(hub, "GET", loc)
    with pytest.raises(http.client.IncompleteRead) as e:
        r.read()
    assert len(e.value.partial) == 1000
    _, r = req(hub, "GET", loc)
    assert len(r.read()) == SIZE  # only once
    hub.set_fault("cut", after=500, times=-1)
    for _ in range(3):
        _, r = req(hub, "GET", loc, {"Range": "bytes=0-9999"})
        with pytest.raises(http.client.IncompleteRead):
            r.read()


def test_fault_ignore_range(hub):
    hub.set_fault("ignore_range")
    _, r = req(hub, "GET", cdn_path(hub), {"Range": "bytes=100-199"})
    assert r.status == 200 and len(r.read()) == SIZE


def test_fault_416(hub):
    hub.set_fault("416", times=1)
    loc = cdn_path(hub)
    _, r = req(hub, "GET", loc, {"Range": "bytes=0-99"})
    assert r.status == 416 and r.getheader("Content-Range") == "bytes */%d" % SIZE
    r.read()
    _, r = req(hub, "GET", loc, {"Range": "bytes=0-99"})
    assert r.status == 206


def test_fault_corrupt(hub):
    data = file_bytes(hub)
    hub.set_fault("corrupt", offset=12345)
    _, r = req(hub, "GET", cdn_path(hub))
    got = r.read()
    assert len(got) == SIZE and got != data
    assert got[12345] == data[12345] ^ 0xFF and got[:12345] == data[:12345] and got[12346:] == data[12346:]


def test_fault_stall(hub):
    hub.set_fault("stall", after=4096, seconds=1.0)
    c, r = req(hub, "GET", cdn_path(hub), timeout=0.4)
    assert len(r.read(4096)) == 4096
    with pytest.raises(socket.timeout):
        r.read(1)
    c.close()
    t = time.monotonic()
    _, r = req(hub, "GET", cdn_path(hub), timeout=5)
    assert len(r.read()) == SIZE and time.monotonic() - t < 1.0  # stall fired once only


@pytest.mark.parametrize("code", [429, 503])
def test_fault_status_with_retry_after(hub, code):
    hub.set_fault("status", code=code, times=2, retry_after=7)
    for _ in range(2):
        _, r = req(hub, "HEAD", "/org/m/resolve/main/model.gguf")
        assert r.status == code and r.getheader("Retry-After") == "7"
    _, r = req(hub, "HEAD", "/org/m/resolve/main/model.gguf")
    assert r.status == 302


def test_fault_rate_cap_per_connection(hub):
    hub.set_fault("rate", bps=2 * 1024 * 1024)
    loc = cdn_path(hub)
    t = time.monotonic()
    _, r = req(hub, "GET", loc, {"Range": "bytes=0-%d" % (1024 * 1024 - 1)})
    assert len(r.read()) == 1024 * 1024
    dt = time.monotonic() - t
    assert 0.4 < dt < 1.5, dt
    # two connections in parallel each get the cap: 2 x 1 MiB still takes about 0.5 s
    t = time.monotonic()
    def one_mib():
        assert len(req(hub, "GET", loc, {"Range": "bytes=0-%d" % (1024 * 1024 - 1)})[1].read()) == 1024 * 1024
    ths = [threading.Thread(target=one_mib) for _ in range(2)]
    for th in ths:
        th.start()
    for th in ths:
        th.join()
    assert time.monotonic() - t < 0.9


def test_fault_empty_claims_nothing(hub):
    hub.set_fault("empty", times=1)
    _, r = req(hub, "HEAD", "/org/m/resolve/main/model.gguf")
    assert r.status == 200 and r.getheader("Content-Length") == "0"
    assert r.getheader("X-Repo-Commit") is None and r.getheader("X-Linked-Etag") is None
    assert r.getheader("ETag") is None
    _, r = req(hub, "HEAD", "/org/m/resolve/main/model.gguf")
    assert r.status == 302


def test_fault_claim_states_another_sha256_and_size_for_the_same_commit(hub):
    commit = hub.commit("org/m")
    hub.set_fault("claim", sha256="f" * 64, size=7, file="model.gguf")
    _, r = req(hub, "HEAD", "/org/m/resolve/main/model.gguf")
    assert r.getheader("X-Linked-Etag") == '"%s"' % ("f" * 64) and r.getheader("X-Linked-Size") == "7"
    assert r.getheader("X-Repo-Commit") == commit
    _, r = req(hub, "GET", "/api/v1/models/org/m/repo/files?Revision=master&Recursive=true")
    entry = [f for f in json.loads(r.read())["Data"]["Files"] if f["Path"] == "model.gguf"][0]
    assert entry["Sha256"] == "f" * 64 and entry["Size"] == 7
    _, r = req(hub, "GET", cdn_path(hub))
    assert hashlib.sha256(r.read()).hexdigest() == hub.sha  # the bytes are the true ones


def test_fault_move_after_moves_the_branch_after_n_heads(hub):
    first = hub.commit("org/m")
    hub.set_fault("move_after", heads=2)
    for _ in range(2):
        _, r = req(hub, "HEAD", "/org/m/resolve/main/model.gguf")
        assert r.getheader("X-Repo-Commit") == first
    _, r = req(hub, "HEAD", "/org/m/resolve/main/model.gguf")
    assert r.getheader("X-Repo-Commit") == hub.commit("org/m") != first


def test_fault_drip_sends_headers_one_byte_at_a_time(hub):
    hub.set_fault("drip", bps=100, match="/resolve/", method="HEAD", times=1)
    t = time.monotonic()
    _, r = req(hub, "HEAD", "/org/m/resolve/main/model.gguf")
    assert r.status == 302 and time.monotonic() - t > 1.0  # a few hundred header bytes at 100 B/s
    t = time.monotonic()
    req(hub, "HEAD", "/org/m/resolve/main/model.gguf")
    assert time.monotonic() - t < 0.5


def test_fault_listing_pad_grows_the_listing(hub):
    for kind in ("entries", "lists"):
        hub.set_fault("listing_pad", bytes=200000, kind=kind, times=1)
        _, r = req(hub, "GET", "/api/v1/models/org/m/repo/files?Revision=master&Recursive=true")
        body = r.read()
        assert len(body) >= 200000 and int(r.getheader("Content-Length")) == len(body)
        files = json.loads(body)["Data"]["Files"]
        assert any(isinstance(f, dict) and f.get("Path") == "model.gguf" for f in files)


def test_control_endpoint(hub):
    body = json.dumps({"faults": {"status": {"code": 503, "times": 1, "retry_after": 2}},
                       "move_main": "org/m"}).encode()
    c = http.client.HTTPConnection(hub.host, hub.port, timeout=5)
    c.request("POST", "/_control", body=body, headers={"Content-Type": "application/json"})
    r = c.getresponse()
    out = json.loads(r.read())
    assert r.status == 200 and out["faults"]["status"]["code"] == 503
    assert out["commit"] == hub.commit("org/m")
    _, r = req(hub, "HEAD", "/org/m/resolve/main/model.gguf")
    assert r.status == 503
    c.request("POST", "/_control", body=b'{"faults": {"nope": {}}}')
    r = c.getresponse()
    assert r.status == 400 and b"unknown fault" in r.read()
    c.request("GET", "/_control")
    stats = json.loads(c.getresponse().read())
    assert any(e["status"] == 503 for e in stats["requests"])
    c.request("POST", "/_control", body=b'{"clear": true}')
    assert json.loads(c.getresponse().read())["faults"] == {}


def test_cli_runs_as_module(tmp_path):
    sha = write_random_file(str(tmp_path / "org" / "m" / "a.bin"), 5000)
    p = subprocess.Popen([sys.executable, "-m", "tests.fixtures.fake_hub.server", "--root", str(tmp_path),
                          "--port", "0", "--host", "127.0.0.1", "--fail-status", "503", "--fail-count", "1"],
                         cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        line = p.stdout.readline()
        m = re.search(r"http://127\.0\.0\.1:(\d+)", line)
        assert m, line
        c = http.client.HTTPConnection("127.0.0.1", int(m.group(1)), timeout=5)
        c.request("GET", "/org/m/resolve/main/a.bin")
        r = c.getresponse()
        assert r.status == 503
        r.read()
        c.request("GET", "/org/m/resolve/main/a.bin")
        r = c.getresponse()
        assert r.status == 302
        r.read()
        c.request("GET", urlsplit(r.getheader("Location")).path)
        assert hashlib.sha256(c.getresponse().read()).hexdigest() == sha
    finally:
        p.terminate()
        p.wait(5)


def test_hash_max_size_serves_a_sparse_big_file_without_hashing_it(tmp_path):
    """A 19 GB sparse file is served (HEAD size, ranged GET) in well under a second: it is not hashed, and
    its stand-in digest still changes when the file does."""
    big = tmp_path / "org" / "m" / "big.gguf"
    big.parent.mkdir(parents=True)
    with open(str(big), "wb") as f:
        f.write(b"GGUF-head")
        f.truncate(19 * 10 ** 9)
    h = FakeHub(str(tmp_path), hash_max_size=64 * 1024 * 1024).start()
    try:
        t0 = time.monotonic()
        _, r = req(h, "HEAD", "/org/m/resolve/main/big.gguf")
        assert r.status == 302 and r.getheader("X-Linked-Size") == str(19 * 10 ** 9)
        first = r.getheader("X-Linked-Etag")
        _, r = req(h, "GET", r.getheader("Location"), {"Range": "bytes=0-8"})
        assert r.status == 206 and r.read() == b"GGUF-head"
        assert r.getheader("Content-Range") == "bytes 0-8/%d" % (19 * 10 ** 9)
        assert time.monotonic() - t0 < 5
        os.utime(str(big), ns=(1, 1))
        _, r = req(h, "HEAD", "/org/m/resolve/main/big.gguf")
        assert r.getheader("X-Linked-Etag") != first
    finally:
        h.stop()
    small = FakeHub(str(tmp_path), hash_max_size=10).start()  # under the limit: the real sha256
    try:
        (tmp_path / "org" / "m" / "a.bin").write_bytes(b"0123456789")
        _, r = req(small, "HEAD", "/org/m/resolve/main/a.bin")
        assert r.getheader("ETag") == '"%s"' % hashlib.sha1(b"blob 10\x000123456789").hexdigest()
    finally:
        small.stop()
