# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Role gateway for real: its templates rendered with Ansible's own Templar from the role's defaults and the
plan task (tests/fixtures/gateway_render.py), checked by `haproxy -c`, then a real HAProxy on 127.0.0.1 in
front of engine doubles: two fake vLLM servers (tests/fixtures/fake_vllm/vllm), each playing one node's
instance (node address 127.0.0.1, as in the Molecule scenarios), or the streaming double
(tests/fixtures/stream_double.py) that records when it wrote each chunk and every request it received.
Free loopback ports only. Skipped when haproxy or openssl is absent (CI installs them).
"""
import http.client
import json
import shutil
import socket
import ssl
import statistics
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from tests.fixtures.fake_vllm import SCRIPT as FAKE_VLLM
from tests.fixtures.fake_vllm import fake_env
from tests.fixtures.gateway_render import (
    BACKEND_KEY,
    CLIENT_KEYS,
    ROLE,
    free_port,
    node_vars,
    render,
    running_gateway,
)
from tests.fixtures.stream_double import StreamDouble, timed_request
from tests.helpers import run_local_playbook, wait_healthy

pytestmark = pytest.mark.skipif(not (shutil.which("haproxy") and shutil.which("openssl")),
                                reason="needs haproxy and openssl (apt-get install haproxy openssl)")

ALICE, BOB = CLIENT_KEYS[0]["key"], CLIENT_KEYS[1]["key"]
CHAT = {"model": "qwen", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


def call(gw, path, key=None, body=None, headers=None, method=None, timeout=30):
    """One request to the gateway: (status, body text)."""
    all_headers = {"Authorization": "Bearer %s" % key} if key else {}
    all_headers.update(headers or {})
    out = timed_request("127.0.0.1", gw["port"], path, body=body, headers=all_headers, tls=gw["tls"],
                        timeout=timeout, method=method)
    return out["status"], out["body"].decode()


def served_by(log_text, server):
    return sum(1 for line in log_text.splitlines() if "be_qwen/%s " % server in line and " 200 " in line)


@pytest.fixture
def vllm_gateway(tmp_path):
    """The role's gateway (TLS, the defaults) in front of two fake vLLM processes serving qwen."""
    ports = (free_port(), free_port())
    procs = []
    try:
        for i, port in enumerate(ports, 1):
            log = tmp_path / ("vllm%d.log" % i)
            env = fake_env(tmp_path / ("rec%d.json" % i), api_key=BACKEND_KEY)
            procs.append(subprocess.Popen([sys.executable, FAKE_VLLM, "serve", "/m/qwen",
                                           "--served-model-name", "qwen", "--host", "127.0.0.1",
                                           "--port", str(port)],
                                          env=env, stdout=open(str(log), "w"), stderr=subprocess.STDOUT))
            wait_healthy(procs[-1], "http://127.0.0.1:%d" % port, log)
        hostvars = {"n%d" % i: node_vars({"qwen": ("qwen", port, "vllm")}) for i, port in enumerate(ports, 1)}
        with running_gateway(tmp_path, hostvars) as gw:
            gw["procs"] = procs
            yield gw
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.terminate()
                proc.wait(10)


def test_gateway_routes_checks_keys_and_survives_a_dead_server(vllm_gateway):
    gw = vllm_gateway
    cfg_text = open(gw["cfg"]).read()
    assert "balance leastconn" in cfg_text and "option redispatch" in cfg_text
    # Requests reach both instances (leastconn shares them), with the backend's key replacing the client's.
    for _ in range(10):
        status, body = call(gw, "/v1/chat/completions", ALICE, CHAT)
        assert status == 200, body
    status, body = call(gw, "/v1/models", ALICE)
    assert status == 200 and '"qwen"' in body
    time.sleep(0.5)
    text = gw["log"].read_text()
    assert served_by(text, "n1-qwen") >= 3 and served_by(text, "n2-qwen") >= 3, text
    # Refused at the edge: no key, unknown key, wrong scheme (401, JSON), paths outside /v1/ (404).
    for key in (None, "sk-unknown", "Basic%20x"):
        status, body = call(gw, "/v1/chat/completions", key, CHAT)
        assert status == 401 and json.loads(body)["error"]["type"] == "authentication_error", (key, body)
    for path in ("/metrics", "/health", "/version", "/v1/../metrics"):
        status, body = call(gw, path, ALICE)
        assert status in (400, 403, 404) and "vllm:" not in body, (path, status, body)
    # One instance stopped: every request still succeeds (its connection fails: retried elsewhere).
    gw["procs"][0].kill()
    gw["procs"][0].wait(5)
    failures = [s for s in (call(gw, "/v1/chat/completions", ALICE, CHAT)[0] for _ in range(20)) if s != 200]
    assert failures == []
    # Before the health check (1 s x 3) marks it down, requests sent to the dead one were retried elsewhere.
    retried = [line for line in gw["log"].read_text().splitlines()
               if " 200 " in line
               and line.split(" 0/0 key=")[0].rsplit("/", 1)[-1].strip("+") not in ("0", "")]
    assert retried, gw["log"].read_text()
    # Draining through the runtime API, as the rolling update does.
    assert gw["admin"]("set server be_qwen/n2-qwen state drain").strip() == ""
    assert "be_qwen,n2-qwen" in gw["admin"]("show stat")
    # The access log: key names, backend/server, status; no key material.
    time.sleep(0.5)
    text = gw["log"].read_text()
    assert 'key="alice"' in text and " 401 " in text
    for secret in (ALICE, BOB, BACKEND_KEY, "sk-unknown"):
        assert secret not in text


def test_the_metrics_frontend_serves_haproxy_exporter_on_loopback(tmp_path):
    """The frontend role monitoring's agent scrapes: HAProxy's own Prometheus exporter, /metrics only. Its own
    HAProxy on free ports (the backends need not answer), so that it never meets the fixture's ports."""
    metrics_port = free_port()
    nodes = {"n1": node_vars({"qwen": ("qwen", free_port(), "vllm")})}
    cfg = render(tmp_path, nodes, gateway_tls=False, gateway_metrics_port=metrics_port)
    assert "bind 127.0.0.1:%d" % metrics_port in open(cfg).read()
    log = tmp_path / "haproxy.log"
    proxy = subprocess.Popen(["haproxy", "-db", "-f", cfg], stdout=open(str(log), "w"),
                             stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 20
        while True:
            assert proxy.poll() is None, log.read_text()
            try:
                conn = http.client.HTTPConnection("127.0.0.1", metrics_port, timeout=10)
                conn.request("GET", "/metrics")
                resp = conn.getresponse()
                break
            except OSError:
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.2)
        text = resp.read().decode()
        assert resp.status == 200 and 'haproxy_backend_active_servers{proxy="be_qwen"}' in text, text[-500:]
        conn.request("GET", "/v1/models")
        resp = conn.getresponse()
        assert (resp.status, resp.read()) == (404, b"not found")
        conn.close()
    finally:
        proxy.terminate()
        proxy.wait(10)


def test_no_metrics_frontend_without_the_exporter_or_a_port(tmp_path):
    without = {"_gateway_haproxy_vv": {"stdout": "Available services : none"}}
    nodes = {"n1": node_vars({"qwen": ("qwen", free_port(), "vllm")})}
    for extra in ({"gateway_metrics_port": 0}, without):
        cfg = render(tmp_path, nodes, gateway_tls=False, **extra)
        assert "prometheus-exporter" not in open(cfg).read()


def test_maps_hold_no_plaintext_key_and_config_validates(tmp_path):
    cfg = render(tmp_path, node_vars_by_host(), gateway_tls=False)
    check = subprocess.run(["haproxy", "-c", "-f", cfg], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           universal_newlines=True, check=False)
    assert check.returncode == 0, check.stdout
    keys_map = (tmp_path / "keys.map").read_text()
    assert "alice" in keys_map and CLIENT_KEYS[0]["key"] not in keys_map
    assert " ssl crt " not in open(cfg).read()


def node_vars_by_host(models=(("qwen", "llama.cpp"),), settings=None):
    """One node per model, each instance on a port of its own (nothing listens: enough for haproxy -c)."""
    return {"n%d" % i: node_vars({model: (model, free_port(), engine)}, settings=settings)
            for i, (model, engine) in enumerate(models, 1)}


# ---------------------------------------------------------------- streams pass through as written

def _lateness(gw_port, double, tls, streams, via_gateway):
    """Per stream: [arrival - write] in ms of each data chunk, client and double in this process."""
    out = []
    body = dict(CHAT, stream=True, max_tokens=double.chunks)
    for _ in range(streams):
        if via_gateway:
            answer = timed_request("127.0.0.1", gw_port, "/v1/chat/completions", body,
                                   {"Authorization": "Bearer " + ALICE}, tls=tls)
        else:
            answer = timed_request("127.0.0.1", double.port, "/v1/chat/completions", body,
                                   {"Authorization": "Bearer " + BACKEND_KEY})
        assert answer["status"] == 200, answer
        writes = double.completions()[-1]["writes"]
        arrivals = [t for t, _ in answer["events"]][:len(writes)]
        assert len(arrivals) == len(writes) == double.chunks
        out.append([(a - w) * 1000.0 for a, w in zip(arrivals, writes, strict=True)])
    return out


@pytest.mark.parametrize("tls", [False, True], ids=["plain", "tls"])
@pytest.mark.parametrize("engine", ["llama.cpp", "vllm"])
def test_stream_chunks_arrive_as_the_engine_writes_them(tmp_path, tls, engine):
    """Each SSE chunk leaves the gateway when the engine writes it: the first chunk through the gateway within
    a few ms of the direct one. Before `option http-no-delay`, without TLS: 150-200 ms late, a short stream
    arriving all at once at its end."""
    # The best of three rounds: a CI machine running three jobs on two cores can hold a few chunks of one
    # round for 60 ms; a gateway that buffers holds them in every round (150-200 ms, as before the fix).
    rounds = []
    with StreamDouble(engine=engine, api_key=BACKEND_KEY, chunks=5, first_delay=0.05,
                      interval=0.04) as double:
        hostvars = {"n1": node_vars({"qwen": ("qwen", double.port, engine)})}
        with running_gateway(tmp_path, hostvars, gateway_tls=tls) as gw:
            for _ in range(3):
                direct = _lateness(gw["port"], double, tls, 3, via_gateway=False)
                through = _lateness(gw["port"], double, tls, 5, via_gateway=True)
                lateness = sorted(x for s in through for x in s)
                rounds.append((lateness[int(len(lateness) * 0.8)], direct, through))
                if rounds[-1][0] < 30.0:
                    break
    p80, direct, through = min(rounds, key=lambda r: r[0])
    first_direct = statistics.median(s[0] for s in direct)
    first_gateway = statistics.median(s[0] for s in through)
    every_chunk = statistics.median(x for s in through for x in s)
    assert first_gateway - first_direct < 10.0, (first_direct, first_gateway, through)
    assert every_chunk < 10.0, through
    # The chunks are spread as the engine spread them (40 ms apart), not held and bunched: before, a chunk
    # was 0-150 ms late depending on its place (a median of 72 ms); a busy machine may delay a few.
    assert p80 < 30.0, [r[2] for r in rounds]


# ---------------------------------------------------------------- no generation sent twice

def test_silent_engine_past_the_timeout_sees_a_post_once(tmp_path):
    """Two engines that stay silent longer than the backend's timeout server (1 s here): the client gets
    504, and the generation reached one engine once (before: retry-on response-timeout sent it 4 times)."""
    with StreamDouble(silence=4.0) as one, StreamDouble(silence=4.0) as two:
        hostvars = {"n1": node_vars({"qwen": ("qwen", one.port, "llama.cpp")}, settings={"ctx_size": 10}),
                    "n2": node_vars({"qwen": ("qwen", two.port, "llama.cpp")}, settings={"ctx_size": 10})}
        with running_gateway(tmp_path, hostvars, gateway_timeout_server="1s",
                             gateway_api_keys=[dict(CLIENT_KEYS[0])]) as gw:
            cfg_text = open(gw["cfg"]).read()
            assert "    timeout server 1s\n" in cfg_text, cfg_text
            started = time.monotonic()
            status, _ = call(gw, "/v1/chat/completions", ALICE, CHAT)
            elapsed = time.monotonic() - started
            time.sleep(3.5)  # any retry (one per second) would have reached an engine by now
            seen = len(one.completions()) + len(two.completions())
    assert seen == 1, "the engines received the generation %d times" % seen
    assert status == 504 and elapsed < 3.0, (status, elapsed)


def test_post_to_a_dead_server_is_retried_on_another(tmp_path):
    """Connection refused: nothing reached an engine, so the POST goes to the other server, once."""
    dead = free_port()
    with StreamDouble() as alive:
        hostvars = {"n1": node_vars({"qwen": ("qwen", dead, "llama.cpp")}),
                    "n2": node_vars({"qwen": ("qwen", alive.port, "llama.cpp")})}
        with running_gateway(tmp_path, hostvars, wait_up=False) as gw:
            statuses = [call(gw, "/v1/chat/completions", ALICE, CHAT)[0] for _ in range(4)]
            assert statuses == [200] * 4
            assert len(alive.completions()) == 4


@pytest.mark.parametrize("tls", [False, True], ids=["plain", "tls"])
def test_no_generation_rides_a_server_connection_the_engine_may_be_closing(tmp_path, tls):
    """llama-server closes its connection right after each streamed answer (its headers say keep-alive) and
    an idle one after 5 s; a request the gateway sends over it as it closes is lost (502, or the client's
    connection closed unanswered; a POST is never retried). The engine
    here drops every request that arrives on a connection it already answered on (the race, every time):
    through the gateway each generation still succeeds, once, whether the client keeps its connection or
    opens one per request. Before (http-reuse safe), every request after the first of a kept-alive client
    was lost (its connection closed unanswered)."""
    with StreamDouble(api_key=BACKEND_KEY, chunks=2, first_delay=0, interval=0, drop_reused=True) as double:
        hostvars = {"n1": node_vars({"qwen": ("qwen", double.port, "llama.cpp")})}
        with running_gateway(tmp_path, hostvars, gateway_tls=tls) as gw:
            fresh = [call(gw, "/v1/chat/completions", ALICE, dict(CHAT, stream=True))[0] for _ in range(6)]
            if tls:
                conn = http.client.HTTPSConnection("127.0.0.1", gw["port"], timeout=30,
                                                   context=ssl._create_unverified_context())  # noqa: S323
            else:
                conn = http.client.HTTPConnection("127.0.0.1", gw["port"], timeout=30)
            kept = []
            try:
                for _ in range(6):
                    try:
                        conn.request("POST", "/v1/chat/completions", body=json.dumps(dict(CHAT, stream=True)),
                                     headers={"Authorization": "Bearer " + ALICE})
                        resp = conn.getresponse()
                        resp.read()
                        kept.append(resp.status)
                    except (OSError, http.client.HTTPException) as exc:  # closed unanswered: lost too
                        kept.append(type(exc).__name__)
                        conn.close()
            finally:
                conn.close()
            log = gw["log"].read_text()
    assert fresh == [200] * 6 and kept == [200] * 6, (fresh, kept, log)
    assert double.dropped == 0 and len(double.completions()) == 12, (double.dropped, log)


# ---------------------------------------------------------------- routing by model, whatever the body size

def _big_body(model, size=5 << 20, model_last=True):
    filler = [{"role": "user", "content": "word " * (size // 5)}]
    pairs = [("messages", filler), ("stream", False)]
    pairs = pairs + [("model", model)] if model_last else [("model", model)] + pairs
    return json.dumps(dict(pairs)).encode()


@pytest.fixture
def two_models(tmp_path):
    quick = {"api_key": BACKEND_KEY, "chunks": 1, "first_delay": 0}
    with StreamDouble(models=("qwen",), engine="vllm", **quick) as qwen, \
            StreamDouble(models=("llama",), engine="llama.cpp", **quick) as llama:
        hostvars = {"n1": node_vars({"qwen": ("qwen", qwen.port, "vllm"), "llama": ("llama", llama.port,
                                                                                   "llama.cpp")})}
        with running_gateway(tmp_path, hostvars) as gw:
            gw.update(qwen=qwen, llama=llama)
            yield gw


def test_large_body_with_model_last_is_routed_by_header_or_refused(two_models):
    gw, qwen, llama = two_models, two_models["qwen"], two_models["llama"]
    body = _big_body("llama")
    # "model" after 5 MB of messages (as the OpenAI Python SDK writes it): refused, saying what to do;
    # before, it went to the first model's engine.
    status, text = call(gw, "/v1/chat/completions", ALICE, body)
    assert status == 400 and "X-Model" in text and "no model named" in json.loads(text)["error"]["message"]
    assert qwen.completions() == [] and llama.completions() == []
    # The X-Model header routes it, whole.
    status, text = call(gw, "/v1/chat/completions", ALICE, body, headers={"X-Model": "llama"})
    assert status == 200, text
    assert [r["length"] for r in llama.completions()] == [len(body)] and qwen.completions() == []
    # "model" first: read from the body.
    status, text = call(gw, "/v1/chat/completions", ALICE, _big_body("qwen", model_last=False))
    assert status == 200 and len(qwen.completions()) == 1, text
    # Header and body disagree: refused. A model the gateway does not serve: 404, never another model.
    status, text = call(gw, "/v1/chat/completions", ALICE, CHAT, headers={"X-Model": "llama"})
    assert status == 400 and "differ" in text, text
    status, text = call(gw, "/v1/chat/completions", ALICE, dict(CHAT, model="gpt-4\"x"))
    assert status == 404 and json.loads(text)["error"]["code"] == "model_not_found", text
    assert 'gpt-4\\"x' in text and "llama, qwen" in text
    status, text = call(gw, "/v1/chat/completions", ALICE, CHAT, headers={"X-Model": "nope"})
    assert status == 400 or status == 404, text
    assert len(qwen.completions()) == 1 and len(llama.completions()) == 1


def test_large_body_with_model_last_goes_to_the_only_model(tmp_path):
    """A gateway in front of one model has nothing to decide: the body goes to it whole."""
    with StreamDouble(models=("qwen",), engine="vllm", api_key=BACKEND_KEY, chunks=1, first_delay=0) as qwen:
        hostvars = {"n1": node_vars({"qwen": ("qwen", qwen.port, "vllm")})}
        with running_gateway(tmp_path, hostvars) as gw:
            body = _big_body("qwen")
            status, text = call(gw, "/v1/chat/completions", ALICE, body)
            assert status == 200, text
            status, text = call(gw, "/v1/chat/completions", ALICE, dict(CHAT, model="llama"))
            assert status == 404 and "model_not_found" in text
    assert [r["length"] for r in qwen.completions()] == [len(body)]


def test_slow_upload_is_routed_and_not_cut(tmp_path):
    """A body that arrives slower than gateway_timeout_body (1 s here) with "model" first: routed when its
    first bytes are in, the rest streams at the client's pace (before: 408 after timeout http-request)."""
    with StreamDouble(engine="vllm", api_key=BACKEND_KEY, chunks=1, first_delay=0) as qwen:
        hostvars = {"n1": node_vars({"qwen": ("qwen", qwen.port, "vllm")})}
        with running_gateway(tmp_path, hostvars, gateway_tls=False, gateway_timeout_body="1s") as gw:
            body = _big_body("qwen", size=300000, model_last=False)
            sock = socket.create_connection(("127.0.0.1", gw["port"]))
            head = ("POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer %s\r\n"
                    "Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % (ALICE, len(body)))
            sock.sendall(head.encode())

            def send():
                for i in range(0, len(body), 60000):
                    sock.sendall(body[i:i + 60000])
                    time.sleep(0.6)

            sender = threading.Thread(target=send)
            sender.start()
            answer = b""
            sock.settimeout(20)
            while b"\r\n\r\n" not in answer:
                data = sock.recv(65536)
                if not data:
                    break
                answer += data
            sender.join(20)
            sock.close()
    assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
    assert [r["length"] for r in qwen.completions()] == [len(body)]


# ---------------------------------------------------------------- rate limits count generations

def test_rate_limits_count_generations_not_listings(tmp_path):
    with StreamDouble(api_key=BACKEND_KEY, chunks=1, first_delay=0) as qwen:
        hostvars = {"n1": node_vars({"qwen": ("qwen", qwen.port, "llama.cpp")})}
        with running_gateway(tmp_path, hostvars, gateway_tls=False, gateway_request_rate_limit=10) as gw:
            # bob: 3 generations a minute. Listing the models does not use them up (before, it did).
            assert [call(gw, "/v1/models", BOB)[0] for _ in range(5)] == [200] * 5
            statuses = [call(gw, "/v1/chat/completions", BOB, CHAT) for _ in range(4)]
            assert [s for s, _ in statuses] == [200, 200, 200, 429]
            assert "generations per minute" in statuses[-1][1]
            # alice is not limited by bob's use.
            assert call(gw, "/v1/chat/completions", ALICE, CHAT)[0] == 200
            # All requests together (10 a minute here): bob's 10th passes, his 11th is refused.
            assert [call(gw, "/v1/models", BOB)[0] for _ in range(2)] == [200, 429]
            time.sleep(0.3)
            log = gw["log"].read_text()
    assert len(qwen.completions()) == 4  # the refused generation never reached the engine
    assert 'key="bob"' in log and BOB not in log


# ---------------------------------------------------------------- nothing user-given becomes syntax

@pytest.mark.parametrize("key", ["sk-$HOME-%[env(HOME)]", 'k"$HOME%[env(HOME)]\\x#\'`%%{}'],
                         ids=["expanded", "syntax"])
def test_backend_key_with_haproxy_syntax_reaches_the_engine_verbatim(tmp_path, key):
    """A backend key holding '$NAME' or '%[...]': before, HAProxy expanded it (every request got 401 while the
    health checks stayed UP); one holding '"', '\\', '#' or quotes broke or rewrote the line. Now the engine
    receives exactly `Bearer <key>`."""
    with StreamDouble(api_key=key, chunks=1, first_delay=0) as engine:
        hostvars = {"n1": node_vars({"qwen": ("qwen", engine.port, "llama.cpp")}, key=key)}
        with running_gateway(tmp_path, hostvars, gateway_tls=False) as gw:
            status, text = call(gw, "/v1/chat/completions", ALICE, CHAT)
    assert status == 200, text
    assert [r["authorization"] for r in engine.completions()] == ["Bearer " + key]


@pytest.mark.parametrize("hostvars,setting", [
    # a backend key with a newline and a quote: before, lines of haproxy.cfg (haproxy -c called it valid)
    ({"n1": node_vars({"qwen": ("qwen", 8000, "vllm")}, key='k"\n    http-request deny\n#')},
     "serving_api_keys[qwen] of host n1"),
    # a served model name starting with '#': before, a comment in models.map (its requests went elsewhere)
    ({"n1": node_vars({"qwen": ("#qwen", 8000, "vllm"), "llama": ("llama", 8001, "vllm")})},
     "instance qwen of n1: served_model_name"),
    # an instance host with a newline: before, straight into a server line
    ({"n1": node_vars({"qwen": ("qwen", 8000, "vllm")}, host="10.0.0.5\n    server evil 10.6.6.6:80")},
     "instance qwen of n1: its address"),
])
def test_values_that_would_be_syntax_are_refused_at_plan_time(tmp_path, hostvars, setting):
    from ansible.errors import AnsibleError
    with pytest.raises(AnsibleError) as error:
        render(tmp_path, hostvars)
    message = str(error.value)
    assert setting in message, message
    assert "http-request deny" not in message  # a key's value is never shown


def test_plan_refusal_is_shown_by_the_play_and_hides_the_key(tmp_path):
    """The plan task keeps the backends' keys (no_log), which would hide a refusal too: the check before it
    shows the refusal, naming the setting, never the key (before: 'the output has been hidden')."""
    play = tmp_path / "play.yml"
    play.write_text(textwrap.dedent("""
        - hosts: localhost
          gather_facts: false
          tasks:
            - ansible.builtin.include_vars: {role}/defaults/main.yml
            - ansible.builtin.include_vars: {role}/vars/main.yml
            - ansible.builtin.set_fact:
                gateway_upstream_hosts: [localhost]
                llmops_instances: {{qwen: {{served_model_name: qwen, port: 8000, host: 0.0.0.0}}}}
                serving_api_keys: {{qwen: "sk-secret-17\\n    http-request deny"}}
                gateway_api_keys: [{{name: a, key: k}}]
            - ansible.builtin.import_tasks: {role}/tasks/plan.yml
        """).format(role=ROLE))
    result, recap = run_local_playbook(play, str(tmp_path))
    output = result.stdout + result.stderr
    assert recap.get("failed") == 1, output
    assert "serving_api_keys[qwen] of host localhost: the key contains whitespace" in output, output
    assert "sk-secret-17" not in output and "hidden" not in output
