# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The gateway_server module run the way Ansible runs it (a JSON args file): documentation matches the
argument spec; against the fake runtime socket; against a real HAProxy (skipped without haproxy): a drain
waits for a slow request in flight to finish, then the server is readied."""
import os
import shutil
import subprocess
import sys
import textwrap
import threading
import time
import urllib.request

import pytest
from ansible_collections.llmops.serving.plugins.module_utils._serving import haproxy_runtime
from ansible_collections.llmops.serving.plugins.modules import gateway_server

from tests.fixtures.fake_haproxy import FakeHaproxy
from tests.fixtures.gateway_render import free_port
from tests.helpers import assert_docs_match_argument_spec, run_module_file
from tests.unit.plugins.modules.test_gguf_module import capture_module_kwargs

HAPROXY = shutil.which("haproxy") or ("/usr/sbin/haproxy" if os.path.exists("/usr/sbin/haproxy") else None)
needs_haproxy = pytest.mark.skipif(HAPROXY is None,
                                   reason="haproxy is not installed (not on PATH nor in /usr/sbin)")


def test_documentation_matches_argument_spec():
    doc = assert_docs_match_argument_spec(gateway_server, capture_module_kwargs(gateway_server),
                                          {"previous_state", "state", "status", "sessions", "waited"})
    assert doc["options"]


def run_module(tmp_path, args, check_mode=False):
    return run_module_file(tmp_path, "gateway_server", args, check_mode=check_mode)


@pytest.fixture
def fake(tmp_path):
    double = FakeHaproxy(str(tmp_path / "admin.sock")).start()
    yield double
    double.stop()


def test_fake_drain_check_mode_and_errors(tmp_path, fake):
    args = {"socket": fake.socket_path, "backend": "llm_qwen", "server": "qwen-a", "state": "drain",
            "poll_interval": 0.01}
    checked = run_module(tmp_path, args, check_mode=True)
    assert checked["changed"] is True and checked["previous_state"] == "ready"
    assert fake.state("llm_qwen", "qwen-a")["admin"] == "ready"
    fake.set_sessions("llm_qwen", "qwen-a", 4)
    result = run_module(tmp_path, args)
    assert not result.get("failed"), result
    assert result["changed"] is True and result["sessions"] == 0 and result["status"] == "DRAIN"
    assert run_module(tmp_path, args)["changed"] is False
    missing = run_module(tmp_path, dict(args, backend="llm_nope"))
    assert missing["failed"] and "no backend 'llm_nope'" in missing["msg"]
    assert "llmops_gateway" in missing["msg"]
    gone = run_module(tmp_path, dict(args, socket=str(tmp_path / "none.sock")))
    assert gone["failed"] and "does not exist" in gone["msg"]


SLOW_SERVER = textwrap.dedent("""
    import http.server, sys, time
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            if self.path.startswith("/slow"):
                time.sleep(3)
            body = sys.argv[2].encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        def log_message(self, *args):
            pass
    http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
""")


@pytest.fixture
def real_haproxy(tmp_path):
    front, port_a, port_b = free_port(), free_port(), free_port()
    sock = str(tmp_path / "admin.sock")
    (tmp_path / "srv.py").write_text(SLOW_SERVER)
    (tmp_path / "haproxy.cfg").write_text(textwrap.dedent("""
        global
            stats socket {sock} mode 600 level admin
        defaults
            mode http
            timeout connect 2s
            timeout client 30s
            timeout server 30s
        frontend llm
            bind 127.0.0.1:{front}
            default_backend llm_qwen
        backend llm_qwen
            balance roundrobin
            option httpchk GET /health
            server qwen-a 127.0.0.1:{a} check inter 300ms
            server qwen-b 127.0.0.1:{b} check inter 300ms
        """).format(sock=sock, front=front, a=port_a, b=port_b))
    procs = [subprocess.Popen([sys.executable, str(tmp_path / "srv.py"), str(port), name])
             for port, name in ((port_a, "a"), (port_b, "b"))]
    procs.append(subprocess.Popen([HAPROXY, "-f", str(tmp_path / "haproxy.cfg"), "-db"],
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    deadline = time.time() + 10
    while not os.path.exists(sock) and time.time() < deadline:
        time.sleep(0.1)
    try:
        yield sock, procs, front
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.terminate()
                proc.wait(timeout=10)


@needs_haproxy
def _sessions_on(sock, backend, server):
    rows = haproxy_runtime.parse_stat_csv(haproxy_runtime.send_command(sock, "show stat"))
    return sum(int(row["scur"] or 0) for row in rows if (row["pxname"], row["svname"]) == (backend, server))


def test_real_haproxy_drain_waits_for_request_in_flight(tmp_path, real_haproxy):
    sock, _, front = real_haproxy
    args = {"socket": sock, "backend": "llm_qwen", "server": "qwen-a", "poll_interval": 0.1}
    ready = run_module(tmp_path, dict(args, state="ready", healthy_timeout=10))
    assert not ready.get("failed"), ready
    assert ready["changed"] is False and ready["status"] == "UP"
    # Send slow requests until one lands on qwen-a (round robin), then drain qwen-a while it is in flight.
    answers = []
    threads = [threading.Thread(target=lambda: answers.append(
        urllib.request.urlopen("http://127.0.0.1:%d/slow" % front, timeout=20).read())) for _ in range(2)]
    for thread in threads:
        thread.start()
    # wait until HAProxy holds the slow request on qwen-a (a fixed sleep lost the race on a loaded machine)
    deadline = time.monotonic() + 10
    while not _sessions_on(sock, "llm_qwen", "qwen-a") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _sessions_on(sock, "llm_qwen", "qwen-a") == 1
    started = time.time()
    drained = run_module(tmp_path, dict(args, state="drain", drain_timeout=20))
    assert not drained.get("failed"), drained
    assert drained["changed"] is True and drained["previous_state"] == "ready"
    assert drained["sessions"] == 0 and drained["status"] == "DRAIN"
    assert drained["waited"] >= 1.5 and time.time() - started >= 1.5  # the 3 s request finished first
    for thread in threads:
        thread.join(timeout=20)
    assert sorted(answers) == [b"a", b"b"]  # the request on the drained server completed
    # While drained, new requests go to qwen-b only.
    url = "http://127.0.0.1:%d/" % front
    assert {urllib.request.urlopen(url, timeout=5).read() for _ in range(4)} == {b"b"}
    back = run_module(tmp_path, dict(args, state="ready", healthy_timeout=10))
    assert back["changed"] is True and back["previous_state"] == "drain" and back["status"] == "UP"


@needs_haproxy
def test_real_haproxy_unknown_names_and_down_server(tmp_path, real_haproxy):
    sock, procs, _ = real_haproxy
    args = {"socket": sock, "backend": "llm_qwen", "server": "qwen-z", "state": "drain"}
    assert "no server 'qwen-z'" in run_module(tmp_path, args)["msg"]
    assert "no backend 'llm_x'" in run_module(tmp_path, dict(args, backend="llm_x"))["msg"]
    procs[0].terminate()  # qwen-a goes DOWN: a drain with no sessions is immediate, ready times out clearly
    procs[0].wait(timeout=10)
    time.sleep(1.5)
    drained = run_module(tmp_path, dict(args, server="qwen-a", drain_timeout=60))
    assert not drained.get("failed"), drained
    assert drained["status"].startswith("DOWN") and drained["waited"] < 5
    stuck = run_module(tmp_path, dict(args, server="qwen-a", state="ready", healthy_timeout=1))
    assert stuck["failed"] and "llm_qwen/qwen-a is not UP after 1s" in stuck["msg"]


@pytest.mark.parametrize("args,message", [
    ({"poll_interval": -1}, "poll_interval must be a number of seconds above 0"),
    ({"poll_interval": 0}, "poll_interval must be"),
    ({"poll_interval": "nan"}, "poll_interval must be"),
    ({"drain_timeout": -1}, "drain_timeout must be"),
    ({"backend": "b;show sess"}, "HAProxy names hold only"),
    ({"server": "s\nshutdown sessions server b/s"}, "HAProxy names hold only"),
    ({"socket": "/run/x\u0000.sock"}, "socket must be the path"),
])
def test_bad_arguments_give_a_clear_message_not_a_traceback(tmp_path, fake, args, message):
    base = {"socket": fake.socket_path, "backend": "llm_qwen", "server": "qwen-a", "state": "drain"}
    result = run_module(tmp_path, dict(base, **args))
    assert result["failed"] and message in result["msg"], result
    assert "Traceback" not in result.get("module_stderr", "") and "exception" not in result
    assert fake.commands == []
