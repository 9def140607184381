# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""model_download against a hostile world (GitHub issue 9): where the token may go, what messages may
show, files in dest the module does not own, forged sidecar records, content that is not what it
claims, two runs on one destination, and the total size of a split set under Ansible."""
import fcntl
import json
import os
import stat
import subprocess
import sys
import threading
import time
from urllib.parse import quote, quote_plus, urlsplit

import pytest
import yaml

from tests.fixtures.fake_hub.helpers import (
    MIB,
    MODEL_SIZE,
    TOKEN,
    body_bytes,
    dl,
    fails_fast,
    params,
    quarantined,
    sha256_of,
)
from tests.fixtures.fake_hub.server import FakeHub
from tests.helpers import ROOT  # noqa: E402

SIZE = MODEL_SIZE  # the size of the shared `model` fixture (conftest.py)


def final(dest, name="model.gguf"):
    return os.path.join(str(dest), name)


def run_module(args, tmp_path, timeout=120):
    f = tmp_path / ("args-%d-%d.json" % (os.getpid(), len(os.listdir(str(tmp_path)))))
    f.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": args}))
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "collections"))
    module = os.path.join(ROOT, "plugins", "modules", "model_download.py")
    p = subprocess.run([sys.executable, module, str(f)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       env=env, timeout=timeout)
    out = p.stdout.decode() + p.stderr.decode()
    return out, json.loads(p.stdout.decode().strip().splitlines()[-1])


@pytest.fixture
def other(tmp_path, hub):
    """A second server on another port of the same loopback host, serving the same files; it records
    every request with its Authorization header (it must never see the token)."""
    h = FakeHub(hub.state.root).start()
    yield h
    h.stop()


def auth_seen(h):
    return [e for e in h.requests() if e.get("authorization")]


# =============================================================================================
# Token scope: scheme, host and port
# =============================================================================================
def test_token_not_sent_to_another_port_of_the_same_host(tmp_path, other):
    hub = FakeHub(other.state.root, gated=("org/gated",), tokens=(TOKEN,),
                  cdn_host="127.0.0.1:%d" % other.port).start()
    try:
        sha = hub.add_file("org/gated/model.gguf", SIZE, seed=5)
        dest = tmp_path / "d"
        r = dl.run(params(hub, dest, repo="org/gated", token=TOKEN))
        assert sha256_of(r["path"]) == sha
        assert [e for e in other.requests() if e["path"].startswith("/cdn/")], "the CDN hop was not taken"
        assert auth_seen(other) == [], "the token went to another port: %r" % auth_seen(other)
        assert any(e["auth"] for e in hub.requests() if "/resolve/" in e["path"])
    finally:
        hub.stop()


def test_head_redirect_without_hub_headers_gets_no_token(tmp_path, other):
    """The HEAD phase follows hops without X-Linked-* headers itself; the token stays on the endpoint."""
    hub = FakeHub(other.state.root, gated=("org/gated",), tokens=(TOKEN,)).start()
    try:
        sha = hub.add_file("org/gated/model.gguf", SIZE, seed=5)
        hub.set_fault("redirect", to="http://localhost:%d" % other.port)
        r = dl.run(params(hub, tmp_path / "d", repo="org/gated", token=TOKEN))
        assert sha256_of(r["path"]) == sha
        heads = [e for e in other.requests() if e["method"] == "HEAD"]
        assert heads, "the redirect was not followed"
        assert auth_seen(other) == [], "the token left the endpoint's origin: %r" % auth_seen(other)
    finally:
        hub.stop()


class _Resp(object):
    def __init__(self, status, headers=None, body=b""):
        self.status = status
        self._h = dict((k.lower(), v) for k, v in (headers or {}).items())
        self._body = body
        self.length = len(body)

    def getheader(self, name, default=None):
        return self._h.get(name.lower(), default)

    def read(self, n=None):
        b, self._body = self._body, b""
        return b

    def isclosed(self):
        return not self._body

    def close(self):
        pass


class _Net(object):
    """Scripted origins: {(scheme, netloc, path): response factory}; every request is logged."""

    def __init__(self, script):
        self.script = script
        self.log = []

    def install(self, monkeypatch):
        net = self

        class Conn(object):
            def __init__(self, scheme, netloc):
                self.scheme, self.netloc = scheme, netloc

            def request(self, method, target, headers=None, body=None):
                self.last = (method, urlsplit(target).path)
                net.log.append({"origin": "%s://%s" % (self.scheme, self.netloc), "method": method,
                                "path": self.last[1], "headers": dict(headers or {})})

            def getresponse(self):
                return net.script[(self.scheme, self.netloc, self.last[1])]()

            def close(self):
                pass

        monkeypatch.setattr(dl.Session, "_conn", lambda self, scheme, netloc, fresh=False:
                            (Conn(scheme, netloc), False))

    def authorized(self):
        return [e["origin"] for e in self.log if "Authorization" in e["headers"]]


@pytest.mark.parametrize("start,hop", [
    ("https://hub.example", "http://hub.example"),            # downgrade: clear text
    ("https://hub.example", "https://hub.example:8443"),      # another port
    ("https://hub.example:8443", "https://hub.example:9443"),
    ("http://hub.example:8080", "http://hub.example"),
])
def test_redirect_to_another_origin_of_the_same_host_gets_no_token(monkeypatch, start, hop):
    p = "/org/m/resolve/main/model.gguf"
    net = _Net({("https" if start.startswith("https") else "http", urlsplit(start).netloc, p):
                lambda: _Resp(302, {"Location": hop + p}),
                (urlsplit(hop).scheme, urlsplit(hop).netloc, p):
                lambda: _Resp(200, {"Content-Length": "3"}, b"abc")})
    net.install(monkeypatch)
    s = dl.Session(token=TOKEN)
    resp, url = s.request("GET", start + p)
    assert resp.status == 200 and url == hop + p
    assert net.authorized() == [start]


def test_head_phase_https_to_http_downgrade_gets_no_token(monkeypatch):
    p = "/org/m/resolve/main/model.gguf"
    commit = "a" * 40
    net = _Net({("https", "hub.example", p): lambda: _Resp(302, {"Location": "http://hub.example" + p}),
                ("http", "hub.example", p): lambda: _Resp(200, {"X-Repo-Commit": commit,
                                                                "Content-Length": "3"})})
    net.install(monkeypatch)
    o = dl.normalize(dict(repo="org/m", filename="model.gguf", endpoint="https://hub.example",
                          dest="/nonexistent-dest", token=TOKEN))
    t = dl.build_targets(o)[0]
    dl.fetch_metadata(o, t, dl.Session(token=TOKEN))
    assert net.authorized() == ["https://hub.example"], net.log


# =============================================================================================
# The token in messages
# =============================================================================================
@pytest.mark.parametrize("bad", ["\n", "\r\n", " ", "\t", "\x00"])
def test_token_with_whitespace_or_control_chars_is_refused_without_echo(hub, dest, model, bad):
    tok = TOKEN + bad
    with pytest.raises(dl.DownloadError) as e:
        dl.run(params(hub, dest, repo="org/m", token=tok))
    text = str(e.value) + e.value.msg + json.dumps(e.value.result)
    assert "whitespace" in e.value.msg and "trim" in e.value.msg
    assert TOKEN not in text and TOKEN[3:12] not in text
    assert hub.requests() == [] and os.listdir(str(dest)) == []


def test_hf_token_env_with_newline_is_refused_without_echo(hub, dest, model, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", TOKEN + "\n")
    with pytest.raises(dl.DownloadError) as e:
        dl.run(params(hub, dest))
    assert "HF_TOKEN" in e.value.msg and TOKEN not in e.value.msg


def test_module_with_vault_newline_token_never_prints_it(hub, dest, model, tmp_path):
    out, res = run_module(dict(repo="org/m", filename="model.gguf", endpoint=hub.url, dest=str(dest),
                               token=TOKEN + "\n"), tmp_path)
    assert res["failed"] and "whitespace" in res["msg"]
    assert TOKEN not in out and TOKEN[3:12] not in out, out


@pytest.mark.parametrize("tok", [TOKEN, TOKEN + "\n", "hf_a/b+c=d%e&f", "hf_\u00e9t\u00e9"])
def test_scrub_removes_every_form_of_the_token(tok):
    forms = [tok, repr(tok), json.dumps(tok), quote(tok, safe=""), quote(tok), quote_plus(tok),
             repr(tok.encode("utf-8")), tok.strip(), quote(tok, safe="").lower()]
    text = "a " + " | ".join(forms) + " z"
    out = dl.scrub(text, tok)
    core = tok.strip()
    assert core not in out and quote(core, safe="") not in out and quote(core, safe="").lower() not in out
    assert repr(core)[1:-1] not in out and repr(core.encode("utf-8"))[2:-1] not in out
    assert out.startswith("a ") and out.endswith(" z")


def test_unexpected_errors_are_scrubbed_too(hub, dest, model, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", TOKEN)

    def boom(*a, **kw):
        raise ValueError("odd header %r" % ("Bearer " + TOKEN))
    monkeypatch.setattr(dl, "fetch_metadata", boom)
    with pytest.raises(Exception) as e:
        dl.run(params(hub, dest))
    assert TOKEN not in str(e.value)


def _tasks(path):
    """The tasks of a role's task file, blocks and the role's task files it includes walked into."""
    out = []

    def walk(items):
        for t in items or []:
            out.append(t)
            for k in ("block", "rescue", "always"):
                walk(t.get(k))
            if "ansible.builtin.include_tasks" in t:
                included = os.path.join(os.path.dirname(path), t["ansible.builtin.include_tasks"])
                walk(yaml.safe_load(open(included)))
    walk(yaml.safe_load(open(path)))
    return out


def test_role_hides_every_task_that_can_carry_the_token():
    tasks = _tasks(os.path.join(ROOT, "roles", "model", "tasks", "model.yml"))
    carrying = [t for t in tasks
                if "ansible.builtin.async_status" in t or "llmops.serving.model_download" in t
                or "llmops.serving.download_wait" in t
                or any("_model_job_result" in str(v) or "_model_download_check" in str(v)
                       or "_model_download_present" in str(v)
                       for k, v in t.items() if k in ("ansible.builtin.set_fact",))]
    names = [t["name"] for t in carrying]
    assert len([t for t in carrying if "ansible.builtin.async_status" in t]) == 1, names
    assert len([t for t in carrying if "llmops.serving.download_wait" in t]) == 1, names
    for t in carrying:
        assert t.get("no_log") == "{{ _model_secret }}", t["name"]
    # a failure still says why: a task without no_log prints the module's (scrubbed) message
    fails = [t for t in tasks if "ansible.builtin.fail" in t]
    assert fails and any("msg" in str(t["ansible.builtin.fail"]) for t in fails)


# =============================================================================================
# Files the module does not own
# =============================================================================================
def _identity(hub, dest):
    o = dl.normalize(params(hub, dest))
    t = dl.build_targets(o)[0]
    s = dl.Session()
    try:
        dl.fetch_metadata(o, t, s)
    finally:
        s.close()
    return dl.FileDownload(o, t, None)._identity()


def test_planted_part_symlink_with_forged_state_is_refused(hub, dest, model, tmp_path):
    victim = tmp_path / "victim.bin"
    victim.write_bytes(b"\xAA" * SIZE)  # the size the forged state claims
    before = sha256_of(str(victim))
    os.symlink(str(victim), final(dest) + ".part")
    with open(final(dest) + ".part.json", "w") as f:
        json.dump({"version": 1, "identity": _identity(hub, dest), "done": [[0, MIB]], "cdn_etag": None}, f)
    with fails_fast(), pytest.raises(dl.DownloadError) as e:
        dl.run(params(hub, dest))
    assert final(dest) + ".part" in e.value.msg and "symbolic link" in e.value.msg and "emove" in e.value.msg
    assert sha256_of(str(victim)) == before, "root wrote through the planted link"
    assert not os.path.lexists(final(dest))


def test_zero_byte_download_through_planted_part_symlink(hub, dest, tmp_path):
    hub.add_file("org/m/empty.gguf", 0)
    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"precious")
    os.symlink(str(victim), final(dest, "empty.gguf") + ".part")
    with fails_fast(), pytest.raises(dl.DownloadError) as e:
        dl.run(params(hub, dest, filename="empty.gguf"))
    assert "empty.gguf.part" in e.value.msg
    assert victim.read_bytes() == b"precious"
    assert not os.path.islink(final(dest, "empty.gguf"))
    os.unlink(final(dest, "empty.gguf") + ".part")
    r = dl.run(params(hub, dest, filename="empty.gguf"))  # once removed, it works
    assert os.path.getsize(r["path"]) == 0 and stat.S_ISREG(os.lstat(r["path"]).st_mode)


def test_zero_byte_download_leaves_a_regular_file(hub, dest):
    hub.add_file("org/m/empty.gguf", 0)
    r = dl.run(params(hub, dest, filename="empty.gguf"))
    assert stat.S_ISREG(os.lstat(r["path"]).st_mode) and r["sha256"] == sha256_of(r["path"])
    assert sorted(os.listdir(str(dest))) == [".empty.gguf.llmops.json", "empty.gguf"]


def _plant(path, kind, tmp_path):
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "devzero":
        os.symlink("/dev/zero", path)
    elif kind == "symlink":
        victim = tmp_path / ("victim-%s" % os.path.basename(path))
        victim.write_text('{"version": 1}')
        os.symlink(str(victim), path)
        return victim
    elif kind == "socket":
        import socket
        s = socket.socket(socket.AF_UNIX)
        s.bind(path)
        s.close()
    return None


@pytest.mark.parametrize("where", ["model.gguf", "model.gguf.part", "model.gguf.part.json",
                                   ".model.gguf.llmops.json", ".model.gguf.llmops.lock"])
@pytest.mark.parametrize("kind", ["fifo", "devzero", "symlink", "socket"])
def test_foreign_file_at_an_owned_path_fails_fast_and_untouched(hub, dest, model, tmp_path, where, kind):
    if where.endswith(".json") and kind == "devzero":
        pytest.skip("reading /dev/zero as JSON would eat the box's memory on a regression (FIFO and "
                    "symlink cover these paths)")
    path = os.path.join(str(dest), where)
    victim = _plant(path, kind, tmp_path)
    before = victim.read_bytes() if victim else None
    t = time.monotonic()
    with fails_fast(), pytest.raises(dl.DownloadError) as e:
        dl.run(params(hub, dest))
    assert time.monotonic() - t < 10
    assert path in e.value.msg and "emove it" in e.value.msg, e.value.msg
    if victim:
        assert victim.read_bytes() == before
    assert os.path.lexists(path)  # refused, not silently replaced: the owner decides
    assert not (where != "model.gguf" and os.path.lexists(final(dest)))


def test_fifo_at_final_path_fails_fast(hub, dest, model):
    os.mkfifo(final(dest))
    with fails_fast(10), pytest.raises(dl.DownloadError) as e:
        dl.run(params(hub, dest))
    assert "FIFO" in e.value.msg and final(dest) in e.value.msg and "emove it" in e.value.msg


def test_symlink_to_dev_zero_at_final_path_fails_fast(hub, dest, model):
    os.symlink("/dev/zero", final(dest))
    with fails_fast(10), pytest.raises(dl.DownloadError) as e:
        dl.run(params(hub, dest))
    assert "symbolic link" in e.value.msg and final(dest) in e.value.msg
    assert os.readlink(final(dest)) == "/dev/zero"


def test_fifo_and_dev_zero_fail_fast_in_check_mode(hub, dest, model):
    os.mkfifo(final(dest))
    with fails_fast(10), pytest.raises(dl.DownloadError, match="FIFO"):
        dl.run(params(hub, dest), check_mode=True)


def test_symlinked_sidecar_is_not_trusted_nor_written_through(hub, dest, tmp_path):
    hub.add_file("org/m/plain.gguf", SIZE, seed=8)
    url = hub.url + "/cdn/org/m/plain.gguf"
    p = dict(url=url, dest=str(dest), retry_delay=0.01, free_space_margin=0)
    r = dl.run(p)
    side = dl.sidecar_path(r["path"])
    forged = json.load(open(side))
    forged["sha256"] = "0" * 64
    victim = tmp_path / "elsewhere.json"
    victim.write_text(json.dumps(forged))
    os.unlink(side)
    os.symlink(str(victim), side)
    with fails_fast(), pytest.raises(dl.DownloadError) as e:
        dl.run(p)
    assert side in e.value.msg and "symbolic link" in e.value.msg
    assert json.loads(victim.read_text()) == forged
    assert dl.read_sidecar_record(r["path"]) is None  # the shared reader never follows it either


def test_temporary_files_have_unpredictable_names(hub, dest, model, tmp_path, monkeypatch):
    """Root must not write through a link planted at a temporary file's name."""
    victims = []
    path = final(dest)
    progress = os.path.join(str(dest), ".model.progress.json")
    monkeypatch.setattr(os, "getpid", lambda: 4242)
    for p in (dl.sidecar_path(path), path + ".part.json", progress):
        for name in ("%s.tmp%d" % (p, 4242), "%s.tmp" % p):
            v = tmp_path / ("victim%d" % len(victims))
            v.write_bytes(b"keep")
            os.symlink(str(v), name)
            victims.append(v)
    r = dl.run(params(hub, dest, progress_file=progress))
    assert sha256_of(r["path"]) == model
    assert all(v.read_bytes() == b"keep" for v in victims)
    for p in (dl.sidecar_path(path), progress):
        assert stat.S_ISREG(os.lstat(p).st_mode)
    leftovers = [n for n in os.listdir(str(dest)) if n.endswith(".tmp") and not os.path.islink(
        os.path.join(str(dest), n))]
    assert leftovers == []


def test_hardlinked_part_is_refused(hub, dest, model, tmp_path):
    victim = tmp_path / "victim.bin"
    victim.write_bytes(b"\x55" * SIZE)
    os.link(str(victim), final(dest) + ".part")
    with pytest.raises(dl.DownloadError) as e:
        dl.run(params(hub, dest))
    assert "hard link" in e.value.msg and victim.read_bytes() == b"\x55" * SIZE


# =============================================================================================
# Trust of the fast path
# =============================================================================================
def test_forged_sidecar_sha256_disagreeing_with_the_hub_is_rehashed(hub, dest, model):
    r = dl.run(params(hub, dest))
    side = dl.sidecar_path(r["path"])
    rec = json.load(open(side))
    rec["sha256"] = "0" * 64
    with open(side, "w") as f:
        json.dump(rec, f)
    r2 = dl.run(params(hub, dest))
    assert r2["sha256"] == model and r2["verified"] == "hashed"
    assert json.load(open(side))["sha256"] == model
    assert dl.run(params(hub, dest))["verified"] == "sidecar"


def test_sidecar_records_ctime_and_catches_restored_mtime(hub, dest, model):
    r = dl.run(params(hub, dest))
    rec = json.load(open(dl.sidecar_path(r["path"])))
    st = os.stat(r["path"])
    assert rec["ctime_ns"] == st.st_ctime_ns
    time.sleep(0.02)
    with open(r["path"], "r+b") as f:
        f.seek(1000)
        b = f.read(1)
        f.seek(1000)
        f.write(bytes([b[0] ^ 1]))
    os.utime(r["path"], ns=(st.st_atime_ns, st.st_mtime_ns))
    assert os.stat(r["path"]).st_mtime_ns == rec["mtime_ns"]
    r2 = dl.run(params(hub, dest))
    assert r2["verified"] != "sidecar" and sha256_of(r2["path"]) == model
    assert len(quarantined(dest)) == 1


def test_fast_path_limits_are_documented():
    doc = dl.__doc__
    for word in ("ctime", "force_verify", "cannot"):
        assert word in doc
    src = open(os.path.join(ROOT, "plugins", "modules", "model_download.py")).read()
    assert "ctime" in src and "cannot detect" in src


# =============================================================================================
# Content that is not what it claims
# =============================================================================================
def test_plain_url_resume_without_validator_restarts_from_zero(hub, dest):
    hub.add_file("org/m/plain.gguf", SIZE, seed=1)
    url = hub.url + "/cdn/org/m/plain.gguf"
    p = dict(url=url, dest=str(dest), retry_delay=0.01, free_space_margin=0, timeout=2)
    hub.set_fault("no_validators")
    hub.set_fault("cut", after=MIB, times=1)
    with pytest.raises(dl.DownloadError):
        dl.run(dict(p, retries=0))
    new = hub.add_file("org/m/plain.gguf", SIZE, seed=2)  # same size, other bytes, no ETag to tell
    hub.reset_stats()
    r = dl.run(p)
    assert r["resumed_from"] == 0 and sha256_of(r["path"]) == new == r["sha256"]


def test_plain_url_without_validator_never_splices_within_a_run(hub, dest):
    hub.add_file("org/m/plain.gguf", SIZE, seed=1)
    url = hub.url + "/cdn/org/m/plain.gguf"
    hub.set_fault("no_validators")
    hub.set_fault("cut", after=MIB, times=1)
    r = dl.run(dict(url=url, dest=str(dest), retry_delay=0.01, free_space_margin=0))
    ranged = [e for e in hub.requests() if e["method"] == "GET" and e["range"] and
              not e["range"].startswith("bytes=0-")]
    assert ranged == [] and sha256_of(r["path"]) == r["sha256"]


def test_plain_url_with_etag_still_resumes(hub, dest):
    sha = hub.add_file("org/m/plain.gguf", SIZE, seed=1)
    url = hub.url + "/cdn/org/m/plain.gguf"
    p = dict(url=url, dest=str(dest), retry_delay=0.01, free_space_margin=0)
    hub.set_fault("cut", after=MIB, times=1)
    with pytest.raises(dl.DownloadError):
        dl.run(dict(p, retries=0))
    r = dl.run(p)
    assert r["resumed_from"] == MIB and sha256_of(r["path"]) == sha


@pytest.mark.parametrize("mode", ["url", "repo"])
def test_body_longer_than_the_metadata_fails_without_sha256(hub, dest, mode):
    if mode == "url":
        hub.add_file("org/m/plain.gguf", SIZE, seed=1)
        p = dict(url=hub.url + "/cdn/org/m/plain.gguf", dest=str(dest), retry_delay=0.01, free_space_margin=0)
        name = "plain.gguf"
    else:
        hub.add_file("org/m/config.json", 500, seed=4)  # small: no sha256 from the hub
        p = params(hub, dest, filename="config.json")
        name = "config.json"
    hub.set_fault("grow", extra=4096)
    with pytest.raises(dl.DownloadError) as e:
        dl.run(p)
    assert "bytes" in e.value.msg and "expected" in e.value.msg
    assert not os.path.exists(final(dest, name)) and not os.path.exists(dl.sidecar_path(final(dest, name)))


@pytest.mark.parametrize("mode", ["url", "repo"])
def test_html_login_page_instead_of_a_gguf_is_refused(hub, dest, model, mode):
    hub.set_fault("html")
    p = params(hub, dest)
    if mode == "url":
        p = dict(url=hub.url + "/cdn/org/m/model.gguf", dest=str(dest), retry_delay=0.01, free_space_margin=0)
    with pytest.raises(dl.DownloadError) as e:
        dl.run(p)
    assert "HTML" in e.value.msg and "login" in e.value.msg
    assert not os.path.exists(final(dest))


# =============================================================================================
# Concurrent runs on one destination
# =============================================================================================
def test_two_runs_on_the_same_file_both_succeed(hub, dest, model):
    hub.set_fault("rate", bps=2 * MIB)
    results, errors = [], []

    def go():
        try:
            results.append(dl.run(params(hub, dest)))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)
    threads = [threading.Thread(target=go) for _ in range(2)]
    for th in threads:
        th.start()
        time.sleep(0.2)
    for th in threads:
        th.join(60)
    assert errors == [] and len(results) == 2
    got = sorted(results, key=lambda r: r["downloaded_bytes"])
    assert got[1]["changed"] and got[1]["downloaded_bytes"] == SIZE
    assert not got[0]["changed"] and got[0]["downloaded_bytes"] == 0 and got[0]["verified"] == "sidecar"
    assert sha256_of(final(dest)) == model and body_bytes(hub) == SIZE
    assert sorted(os.listdir(str(dest))) == [".model.gguf.llmops.json", "model.gguf"]


def test_two_module_processes_on_the_same_file(hub, dest, model, tmp_path):
    hub.set_fault("rate", bps=3 * MIB)
    args = dict(repo="org/m", filename="model.gguf", endpoint=hub.url, dest=str(dest), retry_delay=0.01,
                free_space_margin=0, mode="0640")
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "collections"))
    module = os.path.join(ROOT, "plugins", "modules", "model_download.py")
    procs = []
    for i in range(2):
        f = tmp_path / ("two-%d.json" % i)
        f.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": args}))
        procs.append(subprocess.Popen([sys.executable, module, str(f)], stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, env=env))
    res = [json.loads(p.communicate(timeout=120)[0].decode().strip().splitlines()[-1]) for p in procs]
    assert not any(r.get("failed") for r in res), res
    assert sorted(r["downloaded_bytes"] for r in res) == [0, SIZE]
    assert sha256_of(final(dest)) == model and body_bytes(hub) == SIZE
    assert sorted(os.listdir(str(dest))) == [".model.gguf.llmops.json", "model.gguf"]


def test_lock_timeout_names_the_other_run(hub, dest, model):
    lock = os.path.join(str(dest), ".model.gguf.llmops.lock")
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, b"31337\n")
        t = time.monotonic()
        with pytest.raises(dl.DownloadError) as e:
            dl.run(params(hub, dest, lock_timeout=1))
        assert 0.9 <= time.monotonic() - t < 5
        assert "31337" in e.value.msg and "another" in e.value.msg and lock in e.value.msg
        assert not os.path.exists(final(dest) + ".part") and not os.path.exists(final(dest) + ".part.json")
    finally:
        os.close(fd)


def test_read_only_dest_with_verified_file_needs_no_lock(hub, dest, model, monkeypatch):
    import errno
    dl.run(params(hub, dest))
    real = os.open

    def ro_open(path, flags, *a):
        if str(path).endswith(".llmops.lock") and flags & os.O_CREAT:
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), path)
        return real(path, flags, *a)
    monkeypatch.setattr(dl.os, "open", ro_open)
    r = dl.run(params(hub, dest))
    assert r["verified"] == "sidecar" and not r["changed"]


# =============================================================================================
# Split sets: the total size survives Ansible's file attributes
# =============================================================================================
def test_split_set_total_size_survives_ansible_file_attributes(hub, dest, tmp_path):
    sizes = [MIB + i for i in (1, 2, 3)]
    for i, n in enumerate(sizes, 1):
        hub.add_file("org/m/Big-0000%d-of-00003.gguf" % i, n, seed=i)
    p = params(hub, dest, filename="Big-00001-of-00003.gguf")
    r = dl.run(p)
    assert r["total_size"] == sum(sizes)
    _out, res = run_module(dict(repo="org/m", filename="Big-00001-of-00003.gguf", endpoint=hub.url,
                                dest=str(dest)), tmp_path)
    assert not res.get("failed"), res
    assert res["total_size"] == sum(sizes)
    assert res["size"] == sizes[0]  # Ansible's add_path_info replaced it with the first file's size
    model_yml = open(os.path.join(ROOT, "roles", "model", "tasks", "model.yml")).read()
    assert "'size': _model_download.total_size" in model_yml


# =============================================================================================
# The role end to end (localhost, the model.yml of one model): the failure says why, never the token
# =============================================================================================
def _role_play(tmp_path, hub, item):
    from tests.helpers import run_local_playbook
    play = tmp_path / "play.yml"
    dest = str(tmp_path / "models" / item["name"])
    play.write_text(yaml.safe_dump([{
        "hosts": "localhost", "connection": "local", "gather_facts": False,
        "vars": {"ansible_python_interpreter": sys.executable, "vault_token": TOKEN},
        "tasks": [
            {"name": "One model through the role's task file", "ansible.builtin.include_role": {
                "name": "llmops.serving.model", "tasks_from": "model.yml"},
             "vars": {"_model_item": item, "_model_dest": dest, "_model_token": "{{ vault_token }}",
                      "_model_progress_file": dest + "/.progress.json", "model_hf_endpoint": hub.url,
                      "model_check_structure": False, "model_progress_interval": 1,
                      "model_download_timeout": 120, "model_retries": 1}},
            {"name": "Keep the record", "ansible.builtin.copy": {
                "content": "{{ _model_facts | to_json }}", "dest": str(tmp_path / "record.json"),
                "mode": "0600"}},
        ]}]))
    result, stats = run_local_playbook(play, os.path.dirname(sys.executable), extra_args=("-v",))
    return result.stdout + result.stderr, stats


def test_role_failure_says_why_without_the_token(tmp_path, hub, model):
    hub.add_file("org/gated/model.gguf", SIZE, seed=5)
    out, stats = _role_play(tmp_path, hub, {"name": "g", "repo": "org/gated", "filename": "missing.gguf"})
    assert stats.get("failed") == 1, out
    assert "404" in out and "missing.gguf" in out, out
    assert TOKEN not in out


def test_role_records_the_total_size_of_a_split_set(tmp_path, hub):
    sizes = [MIB + i for i in (1, 2, 3)]
    for i, n in enumerate(sizes, 1):
        hub.add_file("org/gated/S-0000%d-of-00003.gguf" % i, n, seed=i)
    item = {"name": "s", "repo": "org/gated", "filename": "S-00001-of-00003.gguf"}
    out, stats = _role_play(tmp_path, hub, item)
    assert stats.get("failed") == 0, out
    record = json.loads((tmp_path / "record.json").read_text())
    assert record["s"]["size"] == sum(sizes) and len(record["s"]["paths"]) == 3
    assert TOKEN not in out
