# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Role gateway for real: its templates rendered with Ansible's own Templar from the role's defaults and the
plan task's expression, checked by `haproxy -c`, then a real HAProxy on 127.0.0.1 in front of two fake vLLM
servers (tests/fixtures/fake_vllm/vllm), each playing one node's instance (node address 127.0.0.1, as in the
Molecule scenarios). Ports 18240-18249 only (the metrics frontend's own test: free ports). Skipped when
haproxy or openssl is absent (CI installs them).
"""
import http.client
import json
import os
import shutil
import socket
import ssl
import subprocess
import sys
import time

import pytest

from tests.fixtures.fake_vllm import SCRIPT as FAKE_VLLM
from tests.fixtures.fake_vllm import fake_env
from tests.helpers import ROOT, load_yaml, role_templar, wait_healthy

ROLE = os.path.join(ROOT, "roles", "gateway")
GW_PORT, PORTS, METRICS_PORT = 18240, (18241, 18242), 18249
BACKEND_KEY = "backend-secret-7c1e"
CLIENT_KEYS = [{"name": "alice", "key": "sk-alice-3f9a", "rate_limit": 1000},
               {"name": "bob", "key": "sk-bob-81d2", "rate_limit": 3}]

pytestmark = pytest.mark.skipif(not (shutil.which("haproxy") and shutil.which("openssl")),
                                reason="needs haproxy and openssl (apt-get install haproxy openssl)")


def _plan_expr():
    task = load_yaml(os.path.join(ROLE, "tasks", "plan.yml"))[0]
    return task["ansible.builtin.set_fact"]["_gateway_config"]


def render(tmp_path, **extra):
    """The role's files as a play would write them, under tmp_path; returns (variables, paths)."""
    variables = {}
    variables.update(load_yaml(os.path.join(ROLE, "defaults", "main.yml")))
    variables.update(load_yaml(os.path.join(ROLE, "vars", "Debian.yml")))
    variables.update(load_yaml(os.path.join(ROLE, "vars", "main.yml")))
    hostvars = {"n%d" % i: {"llmops_node_address": "127.0.0.1", "serving_api_keys": {"qwen": BACKEND_KEY},
                            "llmops_instances": {"qwen": {"served_model_name": "qwen", "port": port,
                                                          "host": "127.0.0.1", "engine": "vllm"}}}
                for i, port in enumerate(PORTS, 1)}
    variables.update({
        "inventory_hostname": "gw", "ansible_managed": "Ansible managed",
        "groups": {"llm_nodes": ["n1", "n2"]},
        "hostvars": hostvars, "gateway_api_keys": CLIENT_KEYS, "gateway_bind_address": "127.0.0.1",
        "gateway_port": GW_PORT, "gateway_health_inter": "1s", "gateway_health_fall": 3,
        "gateway_metrics_port": METRICS_PORT,
        # What tasks/version.yml registers: the installed HAProxy's build options and services.
        "_gateway_haproxy_vv": {"stdout": subprocess.run(["haproxy", "-vv"], stdout=subprocess.PIPE,
                                                         universal_newlines=True, check=False).stdout},
        "gateway_admin_socket": str(tmp_path / "admin.sock"), "_gateway_config_dir": str(tmp_path),
        "_gateway_config_file": str(tmp_path / "haproxy.cfg"), "_gateway_user": "", "_gateway_chroot": "",
    })
    variables.update(extra)
    templar = role_templar(ROLE, variables)
    variables["_gateway_config"] = templar.template(_plan_expr())
    templar = role_templar(ROLE, variables)
    files = {"haproxy.cfg.j2": variables["_gateway_config_file"], "keys.map.j2": "_gateway_keys_map",
             "ratelimits.map.j2": "_gateway_limits_map", "models.map.j2": "_gateway_models_map"}
    for src, dest in files.items():
        dest = templar.template(variables[dest]) if dest.startswith("_") else dest
        with open(os.path.join(ROLE, "templates", src)) as handle:
            text = templar.template(handle.read(), escape_backslashes=False)
        with open(dest, "w") as handle:
            handle.write(text + "\n")
    return variables, variables["_gateway_config_file"]


def self_signed(tmp_path):
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                    "-subj", "/CN=gw", "-keyout", str(tmp_path / "k.pem"), "-out", str(tmp_path / "c.pem")],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    (tmp_path / "gateway.pem").write_text((tmp_path / "c.pem").read_text() + (tmp_path / "k.pem").read_text())


def admin(sock_path, command):
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    client.connect(sock_path)
    client.sendall(command.encode() + b"\n")
    chunks = []
    while True:
        data = client.recv(65536)
        if not data:
            break
        chunks.append(data)
    client.close()
    return b"".join(chunks).decode()


def request(path, key=None, body=None, method=None):
    conn = http.client.HTTPSConnection("127.0.0.1", GW_PORT, timeout=10,
                                       context=ssl._create_unverified_context())  # noqa: S323 (self-signed)
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = "Bearer %s" % key
    data = json.dumps(body).encode() if body is not None else None
    conn.request(method or ("POST" if body is not None else "GET"), path, body=data, headers=headers)
    resp = conn.getresponse()
    out = resp.status, resp.read().decode()
    conn.close()
    return out


CHAT = {"model": "qwen", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


@pytest.fixture
def gateway(tmp_path):
    variables, cfg = render(tmp_path)
    self_signed(tmp_path)
    procs = []
    for i, port in enumerate(PORTS, 1):
        log = tmp_path / ("vllm%d.log" % i)
        env = fake_env(tmp_path / ("rec%d.json" % i), api_key=BACKEND_KEY)
        procs.append(subprocess.Popen([sys.executable, FAKE_VLLM, "serve", "/m/qwen",
                                       "--served-model-name", "qwen", "--host", "127.0.0.1",
                                       "--port", str(port)],
                                      env=env, stdout=open(str(log), "w"), stderr=subprocess.STDOUT))
        wait_healthy(procs[-1], "http://127.0.0.1:%d" % port, log)
    check = subprocess.run(["haproxy", "-c", "-f", cfg], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           universal_newlines=True, check=False)
    assert check.returncode == 0, check.stdout + open(cfg).read()
    log = tmp_path / "haproxy.log"
    proxy = subprocess.Popen(["haproxy", "-db", "-f", cfg], stdout=open(str(log), "w"),
                             stderr=subprocess.STDOUT)
    sock = str(tmp_path / "admin.sock")
    deadline = time.monotonic() + 20
    while True:
        assert proxy.poll() is None, log.read_text()
        try:
            stat = admin(sock, "show stat")
            if sum(1 for line in stat.splitlines() if line.startswith("be_qwen,n") and ",UP," in line) == 2:
                break
        except OSError:
            pass
        assert time.monotonic() < deadline, "servers not UP: %s" % log.read_text()
        time.sleep(0.2)
    yield {"procs": procs, "log": log, "sock": sock, "cfg": cfg, "vars": variables}
    proxy.terminate()
    proxy.wait(10)
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(10)


def served_by(log_text, server):
    return sum(1 for line in log_text.splitlines() if "be_qwen/%s " % server in line and " 200 " in line)


def test_gateway_routes_checks_keys_limits_and_survives_a_dead_server(gateway):
    alice, bob = CLIENT_KEYS[0]["key"], CLIENT_KEYS[1]["key"]
    cfg_text = open(gateway["cfg"]).read()
    assert "balance leastconn" in cfg_text and "option redispatch" in cfg_text
    # Requests reach both instances (leastconn shares them), with the backend's key replacing the client's.
    for _ in range(10):
        status, body = request("/v1/chat/completions", alice, CHAT)
        assert status == 200, body
    status, body = request("/v1/models", alice)
    assert status == 200 and '"qwen"' in body
    time.sleep(0.5)
    text = gateway["log"].read_text()
    assert served_by(text, "n1-qwen") >= 3 and served_by(text, "n2-qwen") >= 3, text
    # Refused at the edge: no key, unknown key, wrong scheme (401, JSON), paths outside /v1/ (404).
    for key in (None, "sk-unknown", "Basic%20x"):
        status, body = request("/v1/chat/completions", key, CHAT)
        assert status == 401 and json.loads(body)["error"]["type"] == "authentication_error", (key, body)
    for path in ("/metrics", "/health", "/version", "/v1/../metrics"):
        status, body = request(path, alice)
        assert status in (400, 403, 404) and "vllm:" not in body, (path, status, body)
    # Rate limit per key name: bob (3/min) gets 429 on the 4th request, alice does not.
    statuses = [request("/v1/chat/completions", bob, CHAT)[0] for _ in range(4)]
    assert statuses == [200, 200, 200, 429], statuses
    assert request("/v1/chat/completions", alice, CHAT)[0] == 200
    # One instance stopped: every request still succeeds (retried elsewhere, then marked down).
    gateway["procs"][0].kill()
    gateway["procs"][0].wait(5)
    failures = [s for s in (request("/v1/chat/completions", alice, CHAT)[0] for _ in range(20)) if s != 200]
    assert failures == []
    # Before the health check (1 s x 3) marks it down, requests sent to the dead one were retried elsewhere.
    retried = [line for line in gateway["log"].read_text().splitlines()
               if " 200 " in line
               and line.split(" 0/0 key=")[0].rsplit("/", 1)[-1].strip("+") not in ("0", "")]
    assert retried, gateway["log"].read_text()
    # Draining through the runtime API, as the rolling update does.
    assert admin(gateway["sock"], "set server be_qwen/n2-qwen state drain").strip() == ""
    assert "be_qwen,n2-qwen" in admin(gateway["sock"], "show stat")
    # The access log: key names, backend/server, status; no key material.
    time.sleep(0.5)
    text = gateway["log"].read_text()
    assert 'key="alice"' in text and 'key="bob"' in text and " 429 " in text and " 401 " in text
    for secret in (alice, bob, BACKEND_KEY, "sk-unknown"):
        assert secret not in text


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_the_metrics_frontend_serves_haproxy_exporter_on_loopback(tmp_path):
    """The frontend role monitoring's agent scrapes: HAProxy's own Prometheus exporter, /metrics only. Its own
    HAProxy on free ports (the backends need not answer), so that it never meets the fixture's ports."""
    metrics_port = free_port()
    _, cfg = render(tmp_path, gateway_tls=False, gateway_port=free_port(), gateway_metrics_port=metrics_port)
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
    for extra in ({"gateway_metrics_port": 0}, without):
        _, cfg = render(tmp_path, gateway_tls=False, **extra)
        assert "prometheus-exporter" not in open(cfg).read()


def test_maps_hold_no_plaintext_key_and_config_validates(tmp_path):
    _, cfg = render(tmp_path, gateway_tls=False)
    check = subprocess.run(["haproxy", "-c", "-f", cfg], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           universal_newlines=True, check=False)
    assert check.returncode == 0, check.stdout
    keys_map = (tmp_path / "keys.map").read_text()
    assert "alice" in keys_map and CLIENT_KEYS[0]["key"] not in keys_map
    assert " ssl crt " not in open(cfg).read()
