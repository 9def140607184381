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
import re
import shutil
import subprocess
import sys
import threading
import time
import urllib.request
import xml.etree.ElementTree as ET

import pytest

from tests.fixtures.fake_openai.server import FakeOpenAI
from tests.helpers import ROOT, load_yaml, role_templar, run_local_playbook

ROLE = os.path.join(ROOT, "roles", "validate")
PLAYBOOK = os.path.join(ROOT, "playbooks", "validate.yml")
MODULE = os.path.join(ROOT, "plugins", "modules", "llm_benchmark.py")
# The CPU build of the pinned source: unit_llama_server sets $LLMOPS_LLAMA_SERVER (llama_cpp scenario's).
LLAMA_SERVER = (os.environ.get("LLMOPS_LLAMA_SERVER")
                or os.path.join(ROOT, ".cache", "ci-llama", "bin", "llama-server"))
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


def free_port():
    import socket
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


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
    with FakeOpenAI(engine="vllm", model="qwen-local", api_key=KEY, decode_tps=200.0,
                    prefill_tps=20000.0) as fake:
        yield vllm_instance(fake.url, env_file)


def run_validate(tmp_path, instances, extra_args=(), extra_env=None, **variables):
    reports = tmp_path / "reports"
    values = {"llmops_target": "localhost", "ansible_connection": "local", "ansible_become": False,
              "ansible_python_interpreter": sys.executable, "llmops_instances": instances,
              "validate_report_dir": str(reports), "validate_runs": SMALL_RUNS, "validate_warmup_requests": 1,
              "validate_timeout": 60, "validate_state_dir": str(tmp_path / "node")}
    values.update(variables)
    (tmp_path / "vars.json").write_text(json.dumps(values))
    extra = ["-e", "@%s" % (tmp_path / "vars.json")] + list(extra_args)
    result, recap = run_local_playbook(PLAYBOOK, str(tmp_path), extra_args=extra, extra_env=extra_env)
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
    port = free_port()
    proc = subprocess.Popen([LLAMA_SERVER, "-m", str(model), "--host", "127.0.0.1", "--port", str(port),
                             "--threads", "1", "--ctx-size", "2048", "--parallel", "2", "--alias", "tiny",
                             "--api-key-file", str(key_file)], stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_http("http://127.0.0.1:%d/health" % port, proc)
        yield {"url": "http://127.0.0.1:%d" % port, "engine": "llama.cpp", "served_model_name": "tiny",
               "key_file": str(key_file), "api_key_env": None, "env_file": None,
               "unit": "llama-server-tiny.service", "port": port, "host": "127.0.0.1", "gpus": [],
               "model": "tiny", "model_path": str(model), "model_sha256": SHA, "mode": "host",
               "build_id": "ci-llama", "settings": {"ctx_size": 2048, "parallel": 2}}
    finally:
        stop(proc)
        log.close()


@needs_module
@pytest.mark.needs_llama_server
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


# --- measure only what changed, never compete with the users ----------------------------------------------

PROFILE = {"ANSIBLE_CALLBACKS_ENABLED": "ansible.posix.profile_tasks"}
SITE = {"llmops_site_run": True}          # what site.yml's import of playbooks/validate.yml sets


def llama_instance(url, key_file, fingerprint):
    return {"url": url, "engine": "llama.cpp", "served_model_name": "tiny", "key_file": str(key_file),
            "api_key_env": None, "env_file": None, "unit": "llama-server-tiny.service",
            "port": int(url.rsplit(":", 1)[1]), "host": "127.0.0.1", "gpus": [], "model": "tiny",
            "model_path": "/models/tiny.gguf", "model_sha256": SHA, "mode": "host", "build_id": "b1",
            "settings": {"ctx_size": 2048, "parallel": 2}, "fingerprint": fingerprint}


@pytest.fixture
def two_fakes(tmp_path):
    """A vLLM-flavoured and a llama-server-flavoured fake (the latter's key in a key file, its load on
    /slots), and their llmops_instances entries with deployment fingerprints."""
    env_file = tmp_path / "fake.env"
    env_file.write_text("VLLM_API_KEY=%s\n" % KEY)
    key_file = tmp_path / "tiny.key"
    key_file.write_text(KEY + "\n")
    with FakeOpenAI(engine="vllm", model="qwen-local", api_key=KEY, decode_tps=400.0,
                    prefill_tps=50000.0) as vllm, \
            FakeOpenAI(engine="llama.cpp", model="tiny", api_key=KEY, decode_tps=400.0,
                       prefill_tps=50000.0) as llama:
        instances = {"qwen-fp8": dict(vllm_instance(vllm.url, env_file), fingerprint="aaaaaaaaaaaaaaaa"),
                     "tiny": llama_instance(llama.url, key_file, "bbbbbbbbbbbbbbbb")}
        yield {"qwen-fp8": vllm, "tiny": llama}, instances


def seen(fakes):
    """What each fake has received so far: (completions, GETs)."""
    return {name: (len(fake.requests), len(fake.gets)) for name, fake in fakes.items()}


def snapshot(tmp_path):
    """Every report file (node and controller) with its content and mtime."""
    files = sorted(list((tmp_path / "reports").glob("localhost.*")) + list((tmp_path / "node").glob("*")))
    return {str(f): (f.read_text(), f.stat().st_mtime_ns) for f in files}


# the two calibration warm-ups (sent even when validate_warmup_requests is 1) and the runs
REQUESTS_PER_MEASUREMENT = 2 + sum(run["requests"] for run in SMALL_RUNS)


@needs_module
def test_a_second_run_with_nothing_changed_sends_nothing_changes_nothing_and_says_the_last_figures(
        tmp_path, two_fakes):
    fakes, instances = two_fakes
    result, recap, reports = run_validate(tmp_path, instances, **SITE)
    assert recap.get("failed") == 0, result.stdout + result.stderr
    assert {name: n for name, (n, _gets) in seen(fakes).items()} == {
        "qwen-fp8": REQUESTS_PER_MEASUREMENT, "tiny": REQUESTS_PER_MEASUREMENT}
    first = json.loads((reports / "localhost.json").read_text())
    assert (tmp_path / "node" / "report.json").read_text() == (reports / "localhost.json").read_text()
    before, files = seen(fakes), snapshot(tmp_path)

    result, recap, reports = run_validate(tmp_path, instances, extra_env=PROFILE, **SITE)
    assert recap.get("failed") == 0 and recap.get("changed") == 0, result.stdout + result.stderr
    assert seen(fakes) == before                         # not a completion, not even a GET of the load
    assert snapshot(tmp_path) == files                   # no report rewritten, node or controller
    out = flat(result.stdout)
    for name in ("qwen-fp8", "tiny"):
        entry = first["instances"][name]
        assert ("%s: not measured, unchanged since its measurement at %s: decode %.1f tok/s"
                % (name, entry["measured_at"], entry["result"]["summary"]["decode_tps"])) in out
    # profile_tasks: the benchmark task ran no item
    assert "TASK [llmops.serving.validate : Benchmark the instance on the node" in result.stdout
    assert "ok: [localhost] => (item=" not in result.stdout.split("Benchmark the instance on the node")[1] \
        .split("TASK [")[0]
    print("\n".join(line for line in result.stdout.splitlines() if re.search(r" -+ \d+\.\d+s$", line))[:3000])


@needs_module
def test_a_controller_without_the_reports_gets_them_from_the_node_without_a_measurement(tmp_path, two_fakes):
    fakes, instances = two_fakes
    run_validate(tmp_path, instances, **SITE)
    node = (tmp_path / "node" / "report.json").read_text()
    shutil.rmtree(str(tmp_path / "reports"))              # an AWX job's fresh container
    before = seen(fakes)
    result, recap, reports = run_validate(tmp_path, instances, **SITE)
    assert recap.get("failed") == 0 and recap.get("changed") == 0, result.stdout + result.stderr
    assert seen(fakes) == before
    assert (reports / "localhost.json").read_text() == node == (tmp_path / "node" / "report.json").read_text()
    assert (reports / "localhost.md").exists() and (reports / "localhost.svg").exists()


@needs_module
def test_a_settings_change_measures_that_instance_once_and_keeps_the_others_measurement(tmp_path, two_fakes):
    fakes, instances = two_fakes
    run_validate(tmp_path, instances, **SITE)
    first = json.loads((tmp_path / "node" / "report.json").read_text())
    before = seen(fakes)
    changed = dict(instances, tiny=dict(instances["tiny"], settings={"ctx_size": 4096, "parallel": 2},
                                        fingerprint="cccccccccccccccc"))
    time.sleep(1.1)                                        # a later timestamp (seconds)
    result, recap, reports = run_validate(tmp_path, changed, **SITE)
    assert recap.get("failed") == 0 and recap.get("changed") == 0, result.stdout + result.stderr
    after = seen(fakes)
    assert after["qwen-fp8"] == before["qwen-fp8"]
    assert after["tiny"][0] - before["tiny"][0] == REQUESTS_PER_MEASUREMENT    # exactly one measurement
    assert ("tiny: measuring, its deployment differs from the one measured at %s (settings changed)"
            % first["instances"]["tiny"]["measured_at"]) in flat(result.stdout)
    report = json.loads((reports / "localhost.json").read_text())
    assert report["instances"]["qwen-fp8"] == first["instances"]["qwen-fp8"]
    tiny = report["instances"]["tiny"]
    assert tiny["fingerprint"] == "cccccccccccccccc" and tiny["settings"]["ctx_size"] == 4096
    assert tiny["measured_at"] > first["instances"]["tiny"]["measured_at"]
    assert tiny["load"]["source"] == "/slots" and tiny["load"]["busy"] is False
    assert (tmp_path / "node" / "report.json").read_text() == (reports / "localhost.json").read_text()


@needs_module
def test_a_deployment_changed_in_this_run_or_a_forced_run_is_measured_again(tmp_path, two_fakes):
    fakes, instances = two_fakes
    run_validate(tmp_path, instances, **SITE)
    before = seen(fakes)
    result, recap, _ = run_validate(tmp_path, instances, llmops_deployments={"qwen-fp8": {"changed": True}},
                                    **SITE)
    assert recap.get("failed") == 0, result.stdout + result.stderr
    assert "qwen-fp8: measuring, its deployment changed in this run." in flat(result.stdout)
    after = seen(fakes)
    assert after["qwen-fp8"][0] - before["qwen-fp8"][0] == REQUESTS_PER_MEASUREMENT
    assert after["tiny"] == before["tiny"]
    # playbooks/validate.yml on its own (no llmops_site_run) measures every instance
    result, recap, _ = run_validate(tmp_path, instances)
    assert recap.get("failed") == 0, result.stdout + result.stderr
    assert {name: n - after[name][0] for name, (n, _g) in seen(fakes).items()} == {
        "qwen-fp8": REQUESTS_PER_MEASUREMENT, "tiny": REQUESTS_PER_MEASUREMENT}
    assert "tiny: measuring, validate_force is set." in flat(result.stdout)


def release_after_polls(fake, path, polls, timeout=120):
    """The users finish once the benchmark has read the load `polls` more times (not after a fixed time:
    the playbook's start-up takes what the machine gives it)."""
    start = fake.gets.count(path)

    def watch():
        deadline = time.monotonic() + timeout
        while fake.gets.count(path) < start + polls and time.monotonic() < deadline:
            time.sleep(0.05)
        fake.settings["busy_requests"] = 0

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


@needs_module
def test_a_busy_instance_is_skipped_with_a_message_and_the_report_records_the_load(tmp_path, two_fakes):
    fakes, instances = two_fakes
    fakes["tiny"].settings["busy_requests"] = 2            # both slots taken by users
    result, recap, reports = run_validate(tmp_path, instances, validate_busy_policy="skip", **SITE)
    assert recap.get("failed") == 0, result.stdout + result.stderr
    assert len(fakes["tiny"].requests) == 0 and fakes["tiny"].gets == ["/slots"]
    assert len(fakes["qwen-fp8"].requests) == REQUESTS_PER_MEASUREMENT
    assert ("tiny: 2 requests processing (/slots, 2 slots): not measured, so as not to compete with its "
            "users (busy_policy skip)") in flat(result.stdout)
    report = json.loads((reports / "localhost.json").read_text())
    skipped = report["instances"]["tiny"]["skipped"]
    assert skipped["load"]["processing"] == 2 and skipped["load"]["slots"] == 2
    assert skipped["fingerprint"] == "bbbbbbbbbbbbbbbb" and "result" not in report["instances"]["tiny"]
    assert report["instances"]["qwen-fp8"]["load"]["message"] == "idle (/metrics)"
    assert "**not measured**" in (reports / "localhost.md").read_text()
    assert KEY not in result.stdout

    # the next run tries again: waits for the users to finish, then measures, and says how long it waited
    release_after_polls(fakes["tiny"], "/slots", 3)
    result, recap, reports = run_validate(tmp_path, instances, validate_busy_policy="wait",
                                          validate_busy_wait=60, validate_busy_poll=0.5, **SITE)
    assert recap.get("failed") == 0, result.stdout + result.stderr
    assert "tiny: measuring, it has no earlier measurement." in flat(result.stdout)
    assert len(fakes["tiny"].requests) == REQUESTS_PER_MEASUREMENT
    assert len(fakes["qwen-fp8"].requests) == REQUESTS_PER_MEASUREMENT         # unchanged: not again
    tiny = json.loads((reports / "localhost.json").read_text())["instances"]["tiny"]
    assert tiny["skipped"] is None and tiny["load"]["busy"] is False and tiny["load"]["checks"] >= 4
    assert tiny["load"]["waited_s"] >= 1.0                 # three polls 0.5 s apart
    assert re.match(r"idle \(/slots, 2 slots\) after waiting \d+ s \(it was 2 requests processing",
                    tiny["load"]["message"])


@needs_module
def test_a_busy_instance_that_stays_busy_is_not_measured_after_the_wait(tmp_path, two_fakes):
    fakes, instances = two_fakes
    fakes["qwen-fp8"].settings.update(busy_requests=1, busy_waiting=3)
    result, recap, reports = run_validate(tmp_path, {"qwen-fp8": instances["qwen-fp8"]}, validate_busy_wait=2,
                                          validate_busy_poll=0.5, **SITE)
    assert recap.get("failed") == 0, result.stdout + result.stderr
    assert len(fakes["qwen-fp8"].requests) == 0 and len(fakes["qwen-fp8"].gets) >= 4
    assert re.search(r"qwen-fp8: 1 request processing, 3 waiting \(/metrics\) after waiting 2 s \(busy_wait "
                     r"2(\.0)?\): not measured, so as not to compete with its users", flat(result.stdout))
    load = json.loads((reports / "localhost.json").read_text())["instances"]["qwen-fp8"]["skipped"]["load"]
    assert (load["processing"], load["waiting"], load["busy"]) == (1, 3, True)
