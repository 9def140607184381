# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Every loopback request the collection makes ignores proxy variables: a node with http_proxy and
HTTPS_PROXY in /etc/environment (no no_proxy) still passes its health gate, validates, benchmarks and reads
its instances' load. The proxy here (tests/fixtures/recording_proxy.py) reaches nothing and records whoever
used it; the first test shows the variables do send Python's default HTTP client to it.

Where the other loopback requests are: the fleet's drains go to HAProxy's admin socket (a Unix socket);
the monitoring agent (Prometheus) reads no proxy variable unless its scrape configuration says
proxy_from_environment; the node's models come from model_download, which bypasses proxies for loopback
hosts itself (tests/unit/plugins/module_utils/test_download*.py). No role task uses `uri` or `get_url` on
loopback.
"""
import http.server
import os
import subprocess
import threading
import urllib.request

import pytest
from ansible_collections.llmops.serving.plugins.module_utils._benchmark import client as lb
from ansible_collections.llmops.serving.plugins.module_utils._benchmark import load as llm_load

from tests.fixtures.fake_openai.server import FakeOpenAI
from tests.fixtures.recording_proxy import PROXY_VARIABLES, RecordingProxy
from tests.helpers import install_serving_wait

KEY = "sk-proxy-test-4b7d"


@pytest.fixture
def proxied(monkeypatch):
    """The recording proxy, and this process's environment pointing every proxy variable at it."""
    with RecordingProxy() as proxy:
        for name, value in proxy.environment(os.environ).items():
            if name in PROXY_VARIABLES:
                monkeypatch.setenv(name, value)
        monkeypatch.delenv("no_proxy", raising=False)
        monkeypatch.delenv("NO_PROXY", raising=False)
        yield proxy


def test_the_variables_do_send_a_default_client_to_the_proxy(proxied):
    """The control: urllib's default opener takes 127.0.0.1 to the proxy (so the tests below can fail). A new
    opener: urlopen's global one read the proxy variables when an earlier test in this process built it."""
    with FakeOpenAI() as fake:
        with pytest.raises(urllib.request.HTTPError) as err:
            urllib.request.build_opener().open(fake.url + "/health", timeout=5)
    assert err.value.code == 502 and proxied.seen and "127.0.0.1" in proxied.seen[0], proxied.seen


class Engine(http.server.BaseHTTPRequestHandler):
    """An instance after loading: /health 200, /v1/models lists qwen-local with the key."""

    def do_GET(self):  # noqa: N802 (http.server API)
        authorized = self.headers.get("Authorization") == "Bearer " + KEY
        models = b'{"object":"list","data":[{"id":"qwen-local","object":"model"}]}'
        body = {"/health": b'{"status":"ok"}', "/v1/models": models}.get(self.path)
        self.send_response(200 if body and (authorized or self.path == "/health") else 401)
        self.end_headers()
        self.wfile.write(body or b"")

    def log_message(self, *args):
        pass


def test_the_health_gate_ignores_proxies(proxied, tmp_path):
    """roles/serving/files/serving-wait.py, installed and run as the serving role does (before: urlopen went
    to the proxy, 502 until the timeout, and the deploy was rolled back)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    systemctl = bin_dir / "systemctl"
    systemctl.write_text("#!/bin/sh\necho ActiveState=active\necho SubState=running\n")
    systemctl.chmod(0o755)
    key_file = tmp_path / "q.key"
    key_file.write_text(KEY + "\n")
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Engine)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    env = dict(os.environ, PATH="%s:%s" % (bin_dir, os.environ["PATH"]))
    wait_command = install_serving_wait(tmp_path / "node")
    try:
        url = "http://127.0.0.1:%d" % httpd.server_port
        proc = subprocess.run(wait_command + ["--url", url, "--unit", "llama-server-q.service",
                                              "--model", "qwen-local", "--key-file", str(key_file),
                                              "--timeout", "3", "--interval", "0.1"],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              universal_newlines=True, timeout=60, check=False)
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert proc.returncode == 0 and "serving qwen-local" in proc.stdout, proc.stdout
    assert proxied.seen == []


@pytest.mark.parametrize("engine", ["llama.cpp", "vllm"])
def test_the_benchmark_and_the_load_check_ignore_proxies(proxied, engine):
    """llm_benchmark (validate, the fleet's smoke test) and llm_load (its busy check): /v1/models, /slots or
    /metrics, and the streamed generations."""
    with FakeOpenAI(engine=engine, api_key=KEY, decode_tps=2000.0, prefill_tps=1e6) as fake:
        endpoint = llm_load.load_endpoint(fake.url, KEY)
        load = llm_load.check_load(endpoint, engine, policy="measure")
        result = lb.benchmark(fake.url, engine, api_key=KEY, warmup_requests=2, timeout=10,
                              runs=[{"prompt_tokens": 60, "max_tokens": 4, "concurrency": 2, "requests": 2}])
    assert load["source"] in ("/slots", "/metrics"), load
    assert result["errors"] == 0 and result["runs"][0]["ok"] == 2, result
    assert proxied.seen == []
