# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The fake vLLM (tests/fixtures/fake_vllm/vllm): argv/env recording, option checking, HTTP endpoints."""
import http.client
import json
import socket
import subprocess
import time

import pytest
from ansible_collections.llmops.serving.plugins.plugin_utils.vllm_flags import build_argv

from tests.fixtures.fake_vllm import SCRIPT, fake_env
from tests.fixtures.vllm import vllm_cli
from tests.unit.plugins.plugin_utils.test_vllm_flags import SEED_MODEL, SEED_SETTINGS

KEY = "sk-fake-vllm-test"


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def request(port, method, path, body=None, key=None, timeout=5):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = "Bearer " + key
    conn.request(method, path, body=json.dumps(body) if body is not None else None, headers=headers)
    response = conn.getresponse()
    data = response.read()
    conn.close()
    return response.status, data


def wait_listening(port, proc, deadline=10.0):
    end = time.time() + deadline
    while time.time() < end:
        assert proc.poll() is None, proc.stderr.read()
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise AssertionError("fake vLLM did not listen on %d" % port)


@pytest.fixture
def serve(tmp_path):
    procs = []

    def start(*options, **env_args):
        port = free_port()
        record = tmp_path / "record.json"
        argv = ["vllm", "serve", "/models/qwen", "--host", "127.0.0.1", "--port", str(port)] + list(options)
        env = fake_env(record, **env_args)
        env["FAKE_VLLM_ACCESS_LOG"] = "0"
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                universal_newlines=True)
        procs.append(proc)
        wait_listening(port, proc)
        return port, json.loads(record.read_text())

    yield start
    for proc in procs:
        proc.terminate()
        proc.wait(timeout=5)


def test_records_argv_environment_and_options(serve):
    port, record = serve("--served-model-name", "qwen-local", "--max-model-len", "100000",
                         "--no-async-scheduling", "--compilation-config", '{"cudagraph_mode":"PIECEWISE"}',
                         api_key=KEY)
    assert record["argv"][1:4] == ["serve", "/models/qwen", "--host"]
    assert record["env"]["VLLM_API_KEY"] == KEY
    assert record["model"] == "/models/qwen"
    assert record["options"]["--served-model-name"] == ["qwen-local"]
    assert record["options"]["--no-async-scheduling"] == [None]
    assert record["options"]["--port"] == [str(port)]


def test_api_key_guards_v1_only(serve):
    port, _ = serve("--served-model-name", "qwen-local", api_key=KEY)
    assert request(port, "GET", "/v1/models")[0] == 401
    assert request(port, "GET", "/v1/models", key="wrong")[0] == 401
    assert request(port, "GET", "/health")[0] == 200
    assert request(port, "GET", "/metrics")[0] == 200
    status, data = request(port, "GET", "/v1/models", key=KEY)
    assert status == 200
    model = json.loads(data)["data"][0]
    assert model["id"] == "qwen-local" and model["max_model_len"] == 4096 and model["root"] == "/models/qwen"


def test_models_lists_every_served_name_and_max_model_len(serve):
    port, _ = serve("--served-model-name", "a", "b", "--max-model-len", "8192")
    data = json.loads(request(port, "GET", "/v1/models")[1])["data"]
    assert [(m["id"], m["max_model_len"]) for m in data] == [("a", 8192), ("b", 8192)]


def test_health_is_503_during_startup_then_200(serve):
    port, _ = serve(startup_delay=1.0)
    assert request(port, "GET", "/health")[0] == 503
    assert request(port, "GET", "/v1/models")[0] == 503
    time.sleep(1.1)
    assert request(port, "GET", "/health")[0] == 200


def test_chat_completion_is_deterministic_and_counted_in_metrics(serve):
    port, _ = serve("--served-model-name", "qwen-local", api_key=KEY)
    body = {"model": "qwen-local", "messages": [{"role": "user", "content": "say hi"}]}
    first = json.loads(request(port, "POST", "/v1/chat/completions", body, key=KEY)[1])
    second = json.loads(request(port, "POST", "/v1/chat/completions", body, key=KEY)[1])
    assert first["choices"][0]["message"] == second["choices"][0]["message"]
    assert first["choices"][0]["message"]["content"] == "Hello from fake vLLM."
    assert first["usage"]["prompt_tokens"] == 2
    metrics = request(port, "GET", "/metrics")[1].decode()
    assert 'vllm:request_success_total{engine="0",model_name="qwen-local"} 2' in metrics
    unknown = dict(body, model="other")
    assert request(port, "POST", "/v1/chat/completions", unknown, key=KEY)[0] == 404


def test_chat_completion_streams_server_sent_events(serve):
    port, _ = serve()
    body = {"model": "/models/qwen", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    status, data = request(port, "POST", "/v1/chat/completions", body)
    assert status == 200
    events = [line[len("data: "):] for line in data.decode().splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    text = "".join(json.loads(e)["choices"][0]["delta"].get("content", "") for e in events[:-1])
    assert text == "Hello from fake vLLM."


def test_streamed_usage_and_ignore_eos_as_vllm_sends_them(serve):
    port, _ = serve()
    body = {"model": "/models/qwen", "stream": True, "stream_options": {"include_usage": True},
            "ignore_eos": True, "max_tokens": 12, "messages": [{"role": "user", "content": "one two three"}]}
    events = [line[len("data: "):] for line in request(port, "POST", "/v1/chat/completions", body)[1]
              .decode().splitlines() if line.startswith("data: ")]
    last = json.loads(events[-2])
    assert last["choices"] == [] and last["usage"] == {"prompt_tokens": 3, "completion_tokens": 12,
                                                       "total_tokens": 15}
    words = "".join(json.loads(e)["choices"][0]["delta"].get("content", "") for e in events[:-2]).split()
    assert len(words) == 12, "ignore_eos runs to max_tokens"
    without = dict(body, stream_options=None)
    events = request(port, "POST", "/v1/chat/completions", without)[1].decode()
    assert '"usage"' not in events


def test_unknown_options_exit_2_like_argparse(tmp_path):
    options = tmp_path / "options.json"
    options.write_text(json.dumps({"options": {"--host": {"kind": "value"}, "--port": {"kind": "value"},
                                               "--enforce-eager": {"kind": "bool"}}}))
    env = fake_env(tmp_path / "record.json", options=options)
    result = subprocess.run(["vllm", "serve", "m", "--enforce-eager", "--swap-space", "4"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True,
                            timeout=10, check=False)
    assert result.returncode == 2
    assert "vllm serve: error: unrecognized arguments: --swap-space 4" in result.stderr


def test_the_pinned_option_set_accepts_the_flag_tables_output(tmp_path):
    """With FAKE_VLLM_OPTIONS from the pinned wheel, the fake parses what vllm_flags renders for seed 003."""
    try:
        options = vllm_cli.options_file()
    except vllm_cli.WheelUnavailable as exc:
        pytest.skip("the pinned vLLM wheel cannot be obtained here (%s); CI fetches it" % exc)
    argv = build_argv(SEED_SETTINGS, model=SEED_MODEL, host="127.0.0.1", port=1,
                      served_model_name="qwen-local")
    env = fake_env(tmp_path / "record.json", options=options)
    env["FAKE_VLLM_FAIL_START"] = "7"       # parse and record, then stop instead of serving
    result = subprocess.run(["vllm", "serve"] + argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            universal_newlines=True, timeout=10, check=False)
    assert result.returncode == 7, result.stderr
    record = json.loads((tmp_path / "record.json").read_text())
    assert record["options"]["--speculative-config"] == ['{"method":"mtp","num_speculative_tokens":3}']


def test_runs_on_python36_syntax():
    """The fake is copied into the Debian/EL test hosts: no f-strings or 3.7+ modules."""
    with open(SCRIPT) as handle:
        source = handle.read()
    assert "ThreadingHTTPServer" not in source and 'f"' not in source
