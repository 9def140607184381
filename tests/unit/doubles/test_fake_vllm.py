# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The fake vLLM (tests/fixtures/fake_vllm/vllm): argv/env recording, option checking, HTTP endpoints, and
the Ray placement it makes with --distributed-executor-backend ray (against a stub of the ray API: the
real cluster is molecule/ray's)."""
import http.client
import importlib.machinery
import importlib.util
import json
import os
import socket
import subprocess
import time

import pytest
from ansible_collections.llmops.serving.plugins.plugin_utils.vllm_flags import build_argv

from tests.fixtures.fake_vllm import SCRIPT, fake_env
from tests.fixtures.vllm import vllm_cli
from tests.unit.plugins.plugin_utils.test_vllm_flags import SEED_MODEL, SEED_REASONING_CONFIG, SEED_SETTINGS

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
    assert "ray" not in record, "only --distributed-executor-backend ray joins a Ray cluster"


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
    labels = 'engine="0",model_name="qwen-local"'
    assert 'vllm:request_success_total{%s,finished_reason="stop"} 2' % labels in metrics
    assert 'vllm:time_to_first_token_seconds_count{engine="0",model_name="qwen-local"} 2' in metrics
    assert "vllm:spec_decode" not in metrics     # registered only with a speculative config, as in vLLM
    unknown = dict(body, model="other")
    assert request(port, "POST", "/v1/chat/completions", unknown, key=KEY)[0] == 404


def _samples(text):
    """{(name, labels): value} of Prometheus text."""
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            series, value = line.rsplit(" ", 1)
            name, _, labels = series.partition("{")
            samples[(name, labels.rstrip("}"))] = float(value)
    return samples


def test_metrics_have_the_names_kinds_and_labels_of_the_pinned_vllm(serve):
    """Every family the fake exposes is one the pinned wheel defines, of the same kind, with vLLM's labels
    (model_name, engine); a streamed request moves the token counters, TTFT, ITL and the speculative
    decoding counters."""
    from tests.fixtures.vllm import vllm_metrics

    try:
        defined = vllm_metrics.wheel_metrics()
    except vllm_cli.WheelUnavailable as exc:
        pytest.skip(str(exc))
    port, _ = serve("--served-model-name", "q", "--speculative-config",
                    '{"method": "mtp", "num_speculative_tokens": 3}')
    body = {"model": "q", "stream": True, "max_tokens": 16, "ignore_eos": True,
            "messages": [{"role": "user", "content": "one two three"}]}
    assert request(port, "POST", "/v1/chat/completions", body)[0] == 200
    text = request(port, "GET", "/metrics")[1].decode()
    kinds = dict(line.split()[2:4] for line in text.splitlines() if line.startswith("# TYPE"))
    for family, kind in kinds.items():
        base = family[:-len("_total")] if kind == "counter" else family
        assert defined.get(base) == kind or defined.get(family) == kind, (family, kind)
    exposed = vllm_metrics.exposed_names(defined)
    samples = _samples(text)
    assert {name for name, _labels in samples} <= exposed
    assert all('engine="0",model_name="q"' in labels for _name, labels in samples)
    value = dict((name, v) for (name, labels), v in samples.items() if "le=" not in labels
                 and "position=" not in labels and "finished_reason" not in labels)
    assert value["vllm:generation_tokens_total"] == 16 and value["vllm:prompt_tokens_total"] == 3
    assert value["vllm:time_to_first_token_seconds_count"] == 1
    assert value["vllm:inter_token_latency_seconds_count"] == 15
    accepted = value["vllm:spec_decode_num_accepted_tokens_total"]
    assert 0 < accepted <= value["vllm:spec_decode_num_draft_tokens_total"]
    per_pos = [v for (name, labels), v in samples.items() if "position=" in labels]
    assert len(per_pos) == 3 and sum(per_pos) == value["vllm:spec_decode_num_accepted_tokens_total"]


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


def test_unknown_keys_of_json_options_stop_the_start_like_vllms_config_classes(tmp_path):
    """With the pinned wheel's config classes in FAKE_VLLM_OPTIONS, the seed's literal --reasoning-config
    (default_thinking_token_budget) ends the start with exit 1, as vLLM 0.33.0's pydantic classes do."""
    try:
        options = vllm_cli.options_file()
    except vllm_cli.WheelUnavailable as exc:
        pytest.skip("the pinned vLLM wheel cannot be obtained here (%s); CI fetches it" % exc)
    env = fake_env(tmp_path / "record.json", options=options)
    env["FAKE_VLLM_FAIL_START"] = "7"
    seed = ["--reasoning-config", json.dumps(SEED_REASONING_CONFIG),
            "--speculative-config", '{"method":"mtp","num-speculative-tokens":3}']
    result = subprocess.run(["vllm", "serve", "/m"] + seed, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, universal_newlines=True, timeout=10, check=False)
    assert result.returncode == 1
    assert ("ReasoningConfig: reasoning-config.default_thinking_token_budget: Unexpected keyword argument"
            in result.stderr)
    assert "num_speculative_tokens" not in result.stderr       # '-' == '_' in speculative_config's keys
    fixed = dict(SEED_REASONING_CONFIG)
    fixed.pop("default_thinking_token_budget")
    result = subprocess.run(["vllm", "serve", "/m", "--reasoning-config", json.dumps(fixed)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True,
                            timeout=10, check=False)
    assert result.returncode == 7, result.stderr


def test_runs_on_python36_syntax():
    """The fake is copied into the Debian/EL test hosts: no f-strings or 3.7+ modules."""
    with open(SCRIPT) as handle:
        source = handle.read()
    assert "ThreadingHTTPServer" not in source and 'f"' not in source


# --- Ray ----------------------------------------------------------------------------------------------------
# A stub of the ray API the fake calls, over a cluster of nodes [(node_id, ip, gpus)]: PACK fills the nodes in
# their order, as Ray packs onto the fewest nodes. Written as a module so the subprocess test imports it as
# `ray` (PYTHONPATH), exactly as the fake imports the virtualenv's Ray.
STUB_RAY = """
import json, os
NODES = json.loads(os.environ.get("STUB_RAY_NODES", "[]"))
PLACE = os.environ.get("STUB_RAY_PLACE", "1") == "1"
calls = []


class _Group(object):
    def __init__(self, bundles, strategy):
        self.bundles, self.strategy, self.removed = bundles, strategy, False

    def ready(self):
        return self


class util(object):
    @staticmethod
    def placement_group(bundles, strategy="PACK"):
        calls.append(("placement_group", bundles, strategy))
        return _Group(bundles, strategy)

    @staticmethod
    def remove_placement_group(group):
        calls.append(("remove_placement_group",))
        group.removed = True

    @staticmethod
    def placement_group_table(group):
        free = [[node_id, gpus] for node_id, _ip, gpus in NODES]
        where = {}
        for index, bundle in enumerate(group.bundles):
            slot = next(s for s in free if s[1] >= bundle["GPU"])
            slot[1] -= bundle["GPU"]
            where[index] = slot[0]
        return {"placement_group_id": "pg01", "bundles_to_node_id": where,
                "bundles": dict(enumerate(group.bundles)), "strategy": group.strategy}


def init(address=None):
    calls.append(("init", address))


def cluster_resources():
    return {"CPU": 2.0, "GPU": float(sum(gpus for _n, _ip, gpus in NODES))}


def wait(refs, timeout=None):
    calls.append(("wait", timeout))
    return (refs, []) if PLACE else ([], refs)


def nodes():
    return [{"NodeID": node_id, "NodeManagerAddress": ip, "Alive": True} for node_id, ip, _g in NODES]
"""
TWO_NODES = [["head01", "10.0.0.1", 2], ["worker02", "10.0.0.2", 2]]


@pytest.fixture
def fake_module():
    loader = importlib.machinery.SourceFileLoader("fake_vllm_server", SCRIPT)
    spec = importlib.util.spec_from_loader("fake_vllm_server", loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


@pytest.fixture
def stub_ray(tmp_path, monkeypatch):
    def make(nodes=TWO_NODES, place=True):
        monkeypatch.setenv("STUB_RAY_NODES", json.dumps(nodes))
        monkeypatch.setenv("STUB_RAY_PLACE", "1" if place else "0")
        path = tmp_path / "stub_ray.py"
        path.write_text(STUB_RAY)
        loader = importlib.machinery.SourceFileLoader("stub_ray", str(path))
        spec = importlib.util.spec_from_loader("stub_ray", loader)
        module = importlib.util.module_from_spec(spec)
        loader.exec_module(module)
        return module
    return make


@pytest.mark.parametrize("options, size", [
    ([], 1),
    (["--tensor-parallel-size", "2"], 2),
    (["-tp", "2", "--pipeline-parallel-size", "2"], 4),
    (["--tensor_parallel_size=4", "-pp", "2"], 8),
])
def test_world_size_is_tensor_times_pipeline_parallel(fake_module, options, size):
    _model, parsed = fake_module.parse(["m"] + options, None)
    assert fake_module.world_size(parsed) == size


def test_placement_spans_the_nodes_as_vllm_asks_ray(fake_module, stub_ray):
    ray = stub_ray()
    placement = fake_module.ray_placement(ray, "10.0.0.1:6379", 4, timeout=7)
    assert ray.calls[0] == ("init", "10.0.0.1:6379")
    assert ray.calls[1] == ("placement_group", [{"GPU": 1.0}] * 4, "PACK")
    assert ("wait", 7) in ray.calls
    assert [(b["index"], b["node_id"], b["node_ip"], b["gpus"]) for b in placement["bundles"]] == [
        (0, "head01", "10.0.0.1", 1.0), (1, "head01", "10.0.0.1", 1.0),
        (2, "worker02", "10.0.0.2", 1.0), (3, "worker02", "10.0.0.2", 1.0)]
    assert placement["nodes"] == [{"node_id": "head01", "node_ip": "10.0.0.1"},
                                  {"node_id": "worker02", "node_ip": "10.0.0.2"}]
    assert placement["address"] == "10.0.0.1:6379" and placement["cluster_gpus"] == 4.0


def test_placement_fails_clearly_when_the_cluster_lacks_gpus(fake_module, stub_ray):
    ray = stub_ray(nodes=[["head01", "10.0.0.1", 2]])
    with pytest.raises(fake_module.RayPlacementError, match=r"has 2 GPU\(s\), the instance needs 4"):
        fake_module.ray_placement(ray, "auto", 4)
    assert not [c for c in ray.calls if c[0] == "placement_group"], "nothing reserved"


def test_placement_not_made_in_time_is_released_and_reported(fake_module, stub_ray):
    ray = stub_ray(place=False)
    with pytest.raises(fake_module.RayPlacementError, match="did not place 4 GPU bundle"):
        fake_module.ray_placement(ray, "auto", 4, timeout=1)
    assert ("remove_placement_group",) in ray.calls


def _run_with_stub_ray(tmp_path, nodes, *options):
    (tmp_path / "ray.py").write_text(STUB_RAY)
    port = free_port()
    record = tmp_path / "record.json"
    env = fake_env(record)
    env.update({"PYTHONPATH": str(tmp_path), "STUB_RAY_NODES": json.dumps(nodes),
                "RAY_ADDRESS": "10.0.0.1:6379", "FAKE_VLLM_ACCESS_LOG": "0"})
    argv = ["vllm", "serve", "/models/qwen", "--host", "127.0.0.1", "--port", str(port),
            "--distributed-executor-backend", "ray"] + list(options)
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            universal_newlines=True)
    return proc, port, record


def test_ray_backend_records_the_placement_then_serves(tmp_path):
    proc, port, record = _run_with_stub_ray(tmp_path, TWO_NODES, "-tp", "2", "--pipeline-parallel-size", "2")
    try:
        wait_listening(port, proc)
        ray = json.loads(record.read_text())["ray"]
        assert ray["address"] == "10.0.0.1:6379"
        assert {b["node_ip"] for b in ray["bundles"]} == {"10.0.0.1", "10.0.0.2"}
        assert len(ray["bundles"]) == 4
        assert request(port, "GET", "/health")[0] == 200
    finally:
        proc.terminate()
        proc.wait(timeout=5)


def test_ray_backend_without_enough_gpus_fails_the_start_with_the_reason(tmp_path):
    proc, _port, record = _run_with_stub_ray(tmp_path, [["head01", "10.0.0.1", 2]], "-tp", "2", "-pp", "2")
    _out, err = proc.communicate(timeout=10)
    assert proc.returncode == 1
    assert "Ray placement failed: the Ray cluster at 10.0.0.1:6379 has 2 GPU(s)" in err
    assert "needs 4" in json.loads(record.read_text())["ray"]["error"]


def test_ray_backend_without_ray_installed_fails_the_start(tmp_path):
    env = fake_env(tmp_path / "record.json")
    env["PYTHONPATH"] = ""
    env["PYTHONNOUSERSITE"] = "1"
    script = ("import sys; sys.modules['ray'] = None; sys.argv = ['vllm', 'serve', 'm', "
              "'--distributed-executor-backend', 'ray']; "
              "exec(compile(open(%r).read(), 'vllm', 'exec'))" % SCRIPT)
    result = subprocess.run([os.environ.get("PYTHON", "python3"), "-c", script], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True,
                            timeout=10, check=False)
    assert result.returncode == 1, result.stderr
    assert "Ray placement failed" in result.stderr and "ray" in result.stderr.lower()


def test_the_fake_image_carries_its_cuda_like_the_official_one():
    """The fake image sets CUDA_VERSION / NVIDIA_REQUIRE_CUDA as nvidia/cuda bases do (build arg CUDA_VERSION,
    default the official v0.33.0's 13.0): what role vllm reads with docker image inspect."""
    from ansible_collections.llmops.serving.plugins.module_utils._gpu.cuda_compat import cuda_from_image_env
    with open(os.path.join(os.path.dirname(SCRIPT), "Dockerfile")) as handle:
        lines = [line.strip() for line in handle if line.strip() and not line.startswith("#")]
    args = dict(line[len("ARG "):].split("=", 1) for line in lines if line.startswith("ARG ") and "=" in line)
    env = []
    for line in lines:
        if line.startswith("ENV "):
            name, value = line[len("ENV "):].split("=", 1)
            env.append("%s=%s" % (name, value.strip('"').replace("${CUDA_VERSION}", args["CUDA_VERSION"])))
    assert args["CUDA_VERSION"] == "13.0.2"
    assert env == ["CUDA_VERSION=13.0.2", "NVIDIA_REQUIRE_CUDA=cuda>=13.0.2"]
    assert cuda_from_image_env(env) == "13.0"
    assert cuda_from_image_env(["NVIDIA_REQUIRE_CUDA=cuda>=12.9.1"]) == "12.9"
