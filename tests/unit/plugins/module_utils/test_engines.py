# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""One descriptor per engine (plugins/module_utils/engines.py, issue 37.3).

* A test-only third engine is added as a descriptor and nothing else (it borrows vLLM's flag table and memory
  planner by naming them, as a real third engine would name its own): instance planning, the memory planner's
  inputs and dispatch, the gateway's context, monitoring's scrape jobs and figures, the benchmark's key,
  load and speculative-decoding counters and the roles' filters all take it.
* No comparison with an engine's name outside engines.py: a scan of plugins/ and roles/ for the ways such a
  branch is written (== 'vllm', 'llama.cpp' in ..., or 'llama.cpp', a mapping keyed by an engine name,
  another ENGINES or DEFAULT_ENGINE) finds only the exceptions listed here, each with its reason.
"""
import contextlib
import pathlib
import re

import pytest
from ansible_collections.llmops.serving.plugins.filter import serving as serving_filters
from ansible_collections.llmops.serving.plugins.module_utils import engines
from ansible_collections.llmops.serving.plugins.module_utils._benchmark import client as lb
from ansible_collections.llmops.serving.plugins.module_utils._benchmark import load as llm_load
from ansible_collections.llmops.serving.plugins.module_utils._memory_plan import plan as memory_plan
from ansible_collections.llmops.serving.plugins.plugin_utils import (
    gateway_config,
    instance_plan,
    memory_plan_inputs,
    monitoring,
)
from ansible_collections.llmops.serving.plugins.plugin_utils.serving_errors import ServingError

from tests.fixtures.fake_openai.server import FakeOpenAI
from tests.helpers import ROOT

# SGLang-like: its own setting names, key variable, unit prefix, build fact and Prometheus names; vLLM's
# command line and memory rules (named, not copied). Its spec counters are the ones FakeOpenAI serves for
# any engine but llama.cpp.
THIRD = engines.Engine(
    name="sglang-test", label="SGLang (test)", aliases=("sglang_test",),
    context_setting="context_length", slots_setting="max_running_requests",
    key_variable="SGLANG_API_KEY", key_in_env=True, unit_prefix="sglang-test-", model_kind="snapshot",
    ray=False, build_role="sglang_test", build_fact="llmops_sglang_test",
    flag_table="vllm_flags", planner="vllm", slots_path=None,
    load_metrics=("sglang:num_running_reqs", "sglang:num_queue_reqs"),
    spec_metrics=engines.VLLM.spec_metrics,
)
BUILD = {"mode": "host", "binary": "/opt/sglang/bin/serve", "version": "0.33.0"}
MODELS = {"qwen": {"path": "/home/models/Qwen", "dir": "/home/models/Qwen", "snapshot": True},
          "tiny": {"path": "/home/models/tiny.gguf"}}
KEY = "sk-third-0123456789abcdef"


@contextlib.contextmanager
def registered(descriptor):
    """`descriptor` in the registry for the block, as if engines.py listed it; removed after."""
    assert descriptor.name not in engines.ENGINES
    engines.ENGINES[descriptor.name] = descriptor
    try:
        yield descriptor
    finally:
        del engines.ENGINES[descriptor.name]


@pytest.fixture
def third():
    with registered(THIRD) as descriptor:
        yield descriptor


def test_the_registry_knows_each_engine_once():
    assert engines.names() == ("llama.cpp", "vllm") and engines.DEFAULT_ENGINE == "llama.cpp"
    assert engines.get("vllm") is engines.VLLM and engines.lookup("sglang") is None
    assert engines.by_alias("LLAMA_CPP") is engines.LLAMA_CPP and engines.by_alias("tgi") is None
    assert engines.with_field("ray", True) == ("vllm",)
    assert engines.field("llama.cpp", "context_setting") == "ctx_size"
    with pytest.raises(engines.UnknownEngine, match="'sglang'; known engines: llama.cpp, vllm"):
        engines.get("sglang")
    with pytest.raises(ValueError, match="no field 'colour'"):
        engines.field("vllm", "colour")
    # every descriptor names an implementation that exists
    for descriptor in engines.ENGINES.values():
        assert descriptor.flag_table in instance_plan.FLAG_TABLES
        assert descriptor.planner in memory_plan.PLANNERS
        assert descriptor.model_kind in engines.MODEL_KINDS


def test_a_third_engine_is_planned_from_its_descriptor(third):
    inst = {"name": "s", "engine": "sglang-test", "model": "qwen", "port": 30000, "env": {"HF_HOME": "/h"}}
    p = instance_plan.plan_instances([inst], builds={"sglang-test": BUILD}, models=MODELS,
                                     api_key_names=["s"])[0]
    assert p["engine"] == "sglang-test" and p["unit"] == "sglang-test-s.service"
    assert p["key_file"] is None and p["api_key_env"] == "SGLANG_API_KEY"
    assert p["env_names"] == ["HF_HOME", "SGLANG_API_KEY"] and p["binary"] == "/opt/sglang/bin/serve"
    assert instance_plan.unit_names([inst, {"name": "l", "model": "tiny"}]) == [
        "sglang-test-s.service", "llama-server-l.service"]
    assert instance_plan.instance_env_file([inst], "s", api_keys={"s": KEY}) == \
        'HF_HOME="/h"\nSGLANG_API_KEY="%s"\n' % KEY
    # per-engine role variables take it as a key; its descriptor's build fact and model kind speak in refusals
    p = instance_plan.plan_instances([inst], builds={"sglang-test": BUILD}, models=MODELS,
                                     unit_prefix={"sglang-test": "sg-"})[0]
    assert p["unit"] == "sg-s.service"
    with pytest.raises(ServingError, match=r"the sglang_test role first \(fact llmops_sglang_test\.binary"):
        instance_plan.plan_instances([inst], builds={}, models=MODELS)
    with pytest.raises(ServingError, match="is a GGUF file .*; SGLang \\(test\\) serves a model directory"):
        instance_plan.plan_instances([dict(inst, model="tiny")], builds={"sglang-test": BUILD}, models=MODELS)
    with pytest.raises(ServingError, match="ray_cluster is for engine vllm .* sglang-test runs on one"):
        instance_plan.plan_instances([dict(inst, ray_cluster="ray")], builds={"sglang-test": BUILD},
                                     models=MODELS)
    # gone with its descriptor
    engines.ENGINES.pop("sglang-test")
    try:
        with pytest.raises(ServingError, match="unknown engine 'sglang-test'"):
            instance_plan.plan_instances([inst], builds={}, models=MODELS)
    finally:
        engines.ENGINES["sglang-test"] = THIRD


def test_the_memory_planner_takes_a_third_engine(third, tmp_path):
    inst = {"name": "s", "engine": "sglang-test", "model": "qwen", "port": 30000}
    item = memory_plan_inputs.memory_plan_inputs([inst], models=MODELS)["instances"][0]
    assert item["engine"] == "sglang-test" and item["model_dir"] == "/home/models/Qwen"
    assert memory_plan.engine_planner("SGLANG_TEST") is memory_plan.PLANNERS["vllm"]
    # its settings are checked by its planner's rules (vLLM's here), a model not on the node is not planned
    plans, _messages, _refusals = memory_plan.plan_instances(
        [{"name": "s", "engine": "sglang-test", "model_dir": str(tmp_path / "Qwen"),
          "settings": {"tensor_parallel_size": 1}}], [])
    assert plans["s"]["planned"] is False and plans["s"]["engine"] == "sglang-test"
    with pytest.raises(memory_plan.PlanError, match="gpu_memory_utilization must be above 0"):
        memory_plan.plan_instances([{"name": "s", "engine": "sglang-test",
                                     "settings": {"gpu_memory_utilization": 0}}], [])
    with pytest.raises(memory_plan.PlanError, match=r"engine 'tgi' \(llama.cpp or vllm or sglang-test\)"):
        memory_plan.plan_instances([{"name": "t", "engine": "tgi"}], [])


def test_gateway_and_monitoring_read_its_setting_names(third):
    fact = {"engine": "sglang-test", "settings": {"context_length": 32768, "max_model_len": 1}}
    assert gateway_config.instance_context(fact, 4096) == (32768, "context_length")
    assert gateway_config.instance_context({"engine": "sglang-test", "settings": {}}, 4096)[0] == 4096
    instances = {"s": {"engine": "sglang-test", "url": "http://127.0.0.1:30000", "served_model_name": "qwen",
                       "settings": {"context_length": 32768, "max_running_requests": 48}}}
    plan = monitoring.agent_plan("n", instances, {"remote_write_url": "https://mon.lan:9090/api/v1/write",
                                                  "remote_write_password_file": "/etc/pw"})
    job = [j for j in plan["config"]["scrape_configs"] if j["job_name"] == "llmops_instance_s"][0]
    assert job["static_configs"][0]["labels"]["llm_engine"] == "sglang-test"
    text = monitoring.node_textfile(instances)
    assert 'llmops_instance_slots{llm_instance="s",llm_engine="sglang-test"} 48' in text
    assert 'llmops_instance_context_tokens{llm_instance="s",llm_engine="sglang-test"} 32768' in text
    assert "SGLang (test) max_running_requests" in text
    wanted = {"n": {"serving_instances": [{"name": "s", "engine": "sglang-test"}]}}
    nodes = monitoring.inventory_nodes(["n"], wanted)
    assert nodes == {"n": {"s": {"engine": "sglang-test"}}}


class _MetricsOnly:
    """An endpoint whose /metrics is `text` (what load.read_load and client.scrape_counters call)."""

    def __init__(self, text):
        self.text, self.gets = text, []

    def get(self, path):
        self.gets.append(path)
        return (200, self.text) if path == "/metrics" else (404, "")


def test_the_benchmark_reads_its_key_load_and_counters_by_its_descriptor(third, tmp_path):
    env = tmp_path / "s.env"
    env.write_text('SGLANG_API_KEY="%s"\nVLLM_API_KEY="other"\n' % KEY)
    assert lb.read_api_key(env_file=str(env), engine="sglang-test") == KEY
    endpoint = _MetricsOnly('sglang:num_running_reqs{tp_rank="0"} 2\nsglang:num_queue_reqs 3\n'
                            'vllm:num_requests_running 9\n')
    assert llm_load.read_load(endpoint, "sglang-test") == {
        "source": "/metrics", "processing": 2, "waiting": 3, "slots": None}
    assert endpoint.gets == ["/metrics"]  # no slots_path: /slots is not asked
    with FakeOpenAI(engine="sglang-test", decode_tps=500.0, prefill_tps=1e6, draft_n_per_token=3.0,
                    draft_accept=0.5, cached_tokens=0) as fake:
        result = lb.benchmark(fake.url, "sglang-test", runs=[{"prompt_tokens": 30, "max_tokens": 11,
                                                              "requests": 2}], timeout=10)
    assert result["engine"] == "sglang-test" and result["runs"][0]["draft_acceptance"] == 0.5


def test_the_roles_filters_read_the_descriptor(third):
    assert serving_filters.engine_setting("sglang-test", "unit_prefix") == "sglang-test-"
    assert serving_filters.engine_setting("vllm", "model_kind") == "snapshot"
    with pytest.raises(ServingError, match="unknown engine 'tgi'"):
        serving_filters.engine_setting("tgi", "label")
    assert serving_filters.engine_build_roles([]) == ["llama_cpp"]
    assert serving_filters.engine_build_roles([], "vllm") == ["vllm"]
    assert serving_filters.engine_build_roles([{"engine": "sglang-test"}, {"name": "l"}]) == [
        "llama_cpp", "sglang_test"]


# --- no engine-name branch outside engines.py ----------------------------------------------------------

_NAME = r"""['"](?:vllm|llama\.cpp)['"]"""
_BRANCH = re.compile("|".join([
    r"(?:==|!=)\s*" + _NAME,                      # engine == 'vllm'
    _NAME + r"\s*(?:==|!=|not\s+in\b|in\b)",      # 'vllm' in engines, 'llama.cpp' != x
    r"\bor\s+" + _NAME,                           # engine or 'llama.cpp'
    r"default\(\s*" + _NAME + r"\s*\)",           # | default('llama.cpp')
    r"[{,]\s*" + _NAME + r"\s*:",                 # {'vllm': ...}: a table keyed by engine name
    r"^\s*(?:DEFAULT_ENGINE|ENGINES)\s*=",        # a second registry or default
]), re.M)
# file -> (the text of the lines that may match there, None: any; why)
_SUMMARY_KEY = "safetensors_info's result key: the model summary vLLM's planner reads, not a decision"
ALLOWED = {
    "plugins/module_utils/engines.py": (None, "the descriptors themselves"),
    "plugins/module_utils/_model_format/safetensors_remote.py": (('{"vllm": the planner', '{"vllm": summary'),
                                                                 _SUMMARY_KEY),
    "plugins/modules/safetensors_info.py": (('{"vllm": summary',), _SUMMARY_KEY),
    "roles/serving/tasks/plan.yml": (
        ("builds={'llama.cpp': llmops_llama_cpp",),
        "the build facts by engine; the role tests render the task without hostvars, so no filter can look "
        "the descriptors' build_fact up there"),
    "roles/serving/tasks/runtime_check.yml": (
        ("builds={'vllm': llmops_vllm_planned",),
        "role vllm's planned runtime (its entry point `planned`) is the only one known before the build"),
    "roles/nvidia_container_toolkit/tasks/disk.yml": (
        ("if 'vllm' in nvidia_container_toolkit_disk_engines",),
        "the disk the vLLM image takes; the playbook (playbooks/preflight.yml) names the engines"),
    "playbooks/preflight.yml": (
        ("when: \"'vllm' in _preflight_build_roles\"",),
        "a build role's name, not an engine's: role vllm's entry point `planned` (the CUDA a vLLM image or "
        "wheel declares, read before the build) exists in that role only"),
}


def engine_branches(root):
    """[(path, line)] of the lines under plugins/, roles/ and playbooks/ that branch on an engine's name."""
    found = []
    for top in ("plugins", "roles", "playbooks"):
        for path in sorted((root / top).rglob("*")):
            if path.suffix not in (".py", ".yml", ".yaml", ".j2") or not path.is_file():
                continue
            for line in path.read_text(encoding="utf-8").splitlines():
                if _BRANCH.search(line):
                    found.append((path.relative_to(root).as_posix(), line.strip()))
    return found


def unexpected(found):
    out = []
    for path, line in found:
        allowed = ALLOWED.get(path)
        if allowed is None or (allowed[0] is not None and not any(text in line for text in allowed[0])):
            out.append("%s: %s" % (path, line))
    return out


def test_no_engine_name_branch_outside_the_descriptors():
    assert unexpected(engine_branches(pathlib.Path(ROOT))) == []


def test_the_scan_finds_the_branches_it_refuses(tmp_path):
    (tmp_path / "plugins").mkdir()
    (tmp_path / "roles" / "r" / "tasks").mkdir(parents=True)
    (tmp_path / "plugins" / "x.py").write_text(
        'if engine == "vllm":\n    pass\nENGINES = ("a",)\nkey = x or "llama.cpp"\nt = {"llama.cpp": 1}\n'
        'engine = descriptor.name  # vllm\n')
    (tmp_path / "roles" / "r" / "tasks" / "main.yml").write_text(
        "when: \"'vllm' in engines\"\nx: \"{{ e | default('llama.cpp') }}\"\nname: llama.cpp\n")
    assert [line for _path, line in engine_branches(tmp_path)] == [
        'if engine == "vllm":', 'ENGINES = ("a",)', 'key = x or "llama.cpp"', 't = {"llama.cpp": 1}',
        "when: \"'vllm' in engines\"", "x: \"{{ e | default('llama.cpp') }}\""]
    assert len(unexpected(engine_branches(tmp_path))) == 6
