# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Role validate: playbooks/validate.yml run against localhost, the instances played by a vLLM-flavoured
fake with a known speed (tests/fixtures/fake_openai: tests/fixtures/fake_vllm streams no usage, which the
benchmark needs; key in a 0600 env file) and by the CPU llama-server serving the tiny model (key in
a key file). Checks the reports on the "controller" (JSON, Markdown, SVG), the table in the play output, the
gate (a threshold above the measured figure fails naming it, after the reports are written), check mode and
an unknown instance name. The playbook tests need the module llmops.serving.llm_benchmark (Ansible resolves
every module of a role before it runs it, in check mode too)."""
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
import xml.etree.ElementTree as ET

import pytest

from tests.fixtures.fake_openai.server import FakeOpenAI
from tests.helpers import ROOT, load_yaml, role_templar, run_local_playbook

ROLE = os.path.join(ROOT, "roles", "validate")
PLAYBOOK = os.path.join(ROOT, "playbooks", "validate.yml")
MODULE = os.path.join(ROOT, "plugins", "modules", "llm_benchmark.py")
LLAMA_SERVER = os.path.join(ROOT, ".cache", "ci-llama", "bin", "llama-server")
# Ports of this test (18120-18139 are the validate role's).
FAKE_VLLM_PORT, LLAMA_PORT = 18121, 18122
KEY = "validate-test-key-5150"
SHA = "ab" * 32
SVG = "{http://www.w3.org/2000/svg}"
SMALL_RUNS = [{"prompt_tokens": 64, "max_tokens": 16, "concurrency": 1, "requests": 2},
              {"prompt_tokens": 64, "max_tokens": 16, "concurrency": 2, "requests": 2}]

needs_module = pytest.mark.skipif(not os.path.exists(MODULE), reason="module llm_benchmark not written yet")


# --- interface (no server) ---------------------------------------------------------------------------------

@pytest.mark.parametrize("playbook_dir, expected", [("/srv/llmops", "/srv/llmops/reports"),
                                                     ("/srv/llmops/playbooks", "/srv/llmops/reports"),
                                                     ("/srv/llmops/playbooks/", "/srv/llmops/reports")])
def test_reports_go_beside_site_yml_whichever_playbook_runs(playbook_dir, expected):
    defaults = load_yaml(os.path.join(ROLE, "defaults", "main.yml"))
    templar = role_templar(ROLE, dict(defaults, playbook_dir=playbook_dir))
    assert templar.template(defaults["validate_report_dir"]) == expected


def wait_http(url, proc, timeout=60):
    deadline = time.time() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        assert proc.poll() is None, "the server exited"
        assert time.time() < deadline, "no 200 from %s" % url
        time.sleep(0.2)


def stop(proc):
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


def vllm_instance(url, env_file):
    return {"url": url, "engine": "vllm", "served_model_name": "qwen-local", "key_file": None,
            "api_key_env": "VLLM_API_KEY", "env_file": str(env_file), "unit": "vllm-qwen-fp8.service",
            "port": int(url.rsplit(":", 1)[1]), "host": "127.0.0.1", "gpus": [0], "model": "/models/qwen-fp8",
            "model_path": "/models/qwen-fp8", "model_sha256": None, "mode": "venv", "build_id": "vllm-0.11.0",
            "settings": {"max_model_len": 4096}}


@pytest.fixture
def fake_vllm(tmp_path):
    """A vLLM-flavoured OpenAI server with a known speed (tests/fixtures/fake_openai) and its llmops_instances
    entry, the key in a 0600 env file as the serving role writes it."""
    env_file = tmp_path / "fake.env"
    env_file.write_text("VLLM_API_KEY=%s\n" % KEY)
    env_file.chmod(0o600)
    with FakeOpenAI(port=FAKE_VLLM_PORT, engine="vllm", model="qwen-local", api_key=KEY, decode_tps=200.0,
                    prefill_tps=20000.0) as fake:
        yield vllm_instance(fake.url, env_file)


def run_validate(tmp_path, instances, extra_args=(), **variables):
    reports = tmp_path / "reports"
    values = {"llmops_target": "localhost", "ansible_connection": "local", "ansible_become": False,
              "ansible_python_interpreter": sys.executable, "llmops_instances": instances,
              "validate_report_dir": str(reports), "validate_runs": SMALL_RUNS, "validate_warmup_requests": 1,
              "validate_timeout": 60}
    values.update(variables)
    (tmp_path / "vars.json").write_text(json.dumps(values))
    extra = ["-e", "@%s" % (tmp_path / "vars.json")] + list(extra_args)
    result, recap = run_local_playbook(PLAYBOOK, str(tmp_path), extra_args=extra)
    return result, recap, reports


def flat(text):
    """The play output with YAML's line wrapping undone (the callback folds long messages)."""
    return " ".join(text.split())


def read_reports(reports):
    report = json.loads((reports / "localhost.json").read_text())
    markdown = (reports / "localhost.md").read_text()
    svg = ET.fromstring((reports / "localhost.svg").read_bytes())
    return report, markdown, svg


def polylines_per_panel(svg):
    return [[p.get("data-instance") for p in g.iter(SVG + "polyline")]
            for g in svg.iter(SVG + "g") if g.get("class") == "panel"]


@needs_module
def test_fake_vllm_instance_is_benchmarked_reported_and_printed(tmp_path, fake_vllm):
    result, recap, reports = run_validate(tmp_path, {"qwen-fp8": fake_vllm})
    assert recap.get("failed") == 0, result.stdout + result.stderr
    report, markdown, svg = read_reports(reports)
    described = report["instances"]["qwen-fp8"]
    assert described["engine"] == "vllm" and described["build_id"] == "vllm-0.11.0"
    runs = described["result"]["runs"]
    assert [(r["concurrency"], r["ok"], r["errors"]) for r in runs] == [(1, 2, 0), (2, 2, 0)]
    assert report["benchmark"] == {"runs": SMALL_RUNS, "warmup_requests": 1} and report["host"] == "localhost"
    assert "## Instance qwen-fp8 (vllm)" in markdown and "| run | concurrency |" in markdown
    assert polylines_per_panel(svg) == [["qwen-fp8"], ["qwen-fp8"]]
    assert "| instance | run | concurrency |" in result.stdout        # the table in the play output
    assert KEY not in result.stdout and KEY not in json.dumps(report)


@needs_module
def test_gate_above_the_measured_figure_fails_after_writing_the_reports(tmp_path, fake_vllm):
    result, recap, reports = run_validate(tmp_path, {"qwen-fp8": fake_vllm}, validate_min_decode_tps=400)
    assert recap.get("failed") == 1
    report, _, _ = read_reports(reports)                                  # written before the gate failed
    decode = report["instances"]["qwen-fp8"]["result"]["summary"]["decode_tps"]
    message = "instance qwen-fp8: decode %.1f tok/s < validate_min_decode_tps 400" % decode
    assert message in flat(result.stdout)


@needs_module
def test_a_wrong_key_fails_the_gate_with_the_error(tmp_path, fake_vllm):
    env_file = tmp_path / "wrong.env"
    env_file.write_text("VLLM_API_KEY=not-the-key\n")
    result, recap, reports = run_validate(tmp_path, {"qwen-fp8": dict(fake_vllm, env_file=str(env_file))})
    assert recap.get("failed") == 1
    assert "instance qwen-fp8: benchmark failed:" in flat(result.stdout)
    assert (reports / "localhost.md").exists()


@needs_module
def test_check_mode_measures_nothing_and_writes_no_report(tmp_path):
    instances = {"qwen-fp8": {"url": "http://127.0.0.1:9", "engine": "vllm", "served_model_name": "q"}}
    result, recap, reports = run_validate(tmp_path, instances, extra_args=["--check"])
    assert recap.get("failed") == 0, result.stdout + result.stderr
    assert "Check mode: the benchmark of qwen-fp8 is skipped" in flat(result.stdout)
    assert not reports.exists()


@needs_module
def test_an_instance_name_no_host_serves_fails_naming_it(tmp_path):
    instances = {"qwen-fp8": {"url": "http://127.0.0.1:9", "engine": "vllm", "served_model_name": "q"}}
    result, recap, _ = run_validate(tmp_path, instances, validate_instances=["qwen-fp9"])
    assert recap.get("failed") == 1
    assert "validate_instances names qwen-fp9, served by no host of this play (instances: qwen-fp8)" \
        in flat(result.stdout)


@needs_module
def test_a_host_without_instances_says_so_and_passes(tmp_path):
    result, recap, reports = run_validate(tmp_path, {})
    assert recap.get("failed") == 0, result.stdout + result.stderr
    assert "No serving instance to benchmark on localhost" in flat(result.stdout)
    assert not reports.exists()


# --- the CPU llama-server serving the tiny model -----------------------------------------------------------

@pytest.fixture
def llama_server(tmp_path):
    if not os.access(LLAMA_SERVER, os.X_OK):
        pytest.skip("no CPU llama-server at %s" % LLAMA_SERVER)
    from tests.fixtures.gguf.make_tiny_model import cached_tiny_model
    model = tmp_path / "tiny.gguf"
    shutil.copy(cached_tiny_model("llama"), model)
    key_file = tmp_path / "tiny.key"
    key_file.write_text(KEY + "\n")
    key_file.chmod(0o600)
    log = open(tmp_path / "llama-server.log", "w")
    proc = subprocess.Popen([LLAMA_SERVER, "-m", str(model), "--host", "127.0.0.1", "--port", str(LLAMA_PORT),
                             "--threads", "1", "--ctx-size", "2048", "--parallel", "2", "--alias", "tiny",
                             "--api-key-file", str(key_file)], stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_http("http://127.0.0.1:%d/health" % LLAMA_PORT, proc)
        yield {"url": "http://127.0.0.1:%d" % LLAMA_PORT, "engine": "llama.cpp", "served_model_name": "tiny",
               "key_file": str(key_file), "api_key_env": None, "env_file": None,
               "unit": "llama-server-tiny.service", "port": LLAMA_PORT, "host": "127.0.0.1", "gpus": [],
               "model": "tiny", "model_path": str(model), "model_sha256": SHA, "mode": "host",
               "build_id": "ci-llama", "settings": {"ctx_size": 2048, "parallel": 2}}
    finally:
        stop(proc)
        log.close()


@needs_module
def test_llama_server_decode_agrees_with_its_timings_and_the_gate_names_the_figure(tmp_path, llama_server):
    runs = [{"prompt_tokens": 128, "max_tokens": 64, "concurrency": 1, "requests": 2},
            {"prompt_tokens": 128, "max_tokens": 64, "concurrency": 2, "requests": 2}]
    result, recap, reports = run_validate(tmp_path, {"tiny": llama_server}, validate_runs=runs,
                                          validate_min_decode_tps={"tiny": 1000000})
    assert recap.get("failed") == 1, result.stdout + result.stderr
    report, markdown, svg = read_reports(reports)
    summary = report["instances"]["tiny"]["result"]["summary"]
    print("llama-server tiny model: client decode %s tok/s, server decode %s tok/s, agreement %s"
          % (summary["decode_tps"], summary["server_decode_tps"], summary["decode_tps_agreement"]))
    assert 0.9 <= summary["decode_tps_agreement"] <= 1.1
    assert "instance tiny: decode %.1f tok/s < validate_min_decode_tps 1e+06" % summary["decode_tps"] \
        in flat(result.stdout)
    assert "- model sha256: `%s`" % SHA in markdown and "- build id: `ci-llama`" in markdown
    assert polylines_per_panel(svg) == [["tiny"], ["tiny"]]
