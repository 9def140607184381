# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The memory_plan_info module (formerly serving_plan) run the way Ansible runs it (a JSON args file):
documentation matches the argument spec, plans for both engines, refusals fail the task naming every
instance, check mode, never changed."""
import json
import os

import yaml
from ansible_collections.llmops.serving.plugins.modules import memory_plan_info

from tests.helpers import assert_docs_match_argument_spec, run_module_file
from tests.unit.plugins.module_utils.test_memory_plan import SEED_SETTINGS, l20, llama_8b, qwen36_27b
from tests.unit.plugins.modules.test_gguf_module import capture_module_kwargs


def test_documentation_matches_argument_spec():
    doc = assert_docs_match_argument_spec(memory_plan_info, capture_module_kwargs(memory_plan_info),
                                          {"plans", "messages", "refusals"})
    extends = yaml.safe_load(memory_plan_info.DOCUMENTATION)["extends_documentation_fragment"]
    assert "llmops.serving.attributes.info_module" in extends
    attributes = doc["attributes"]
    assert attributes["check_mode"]["support"] == "full" and attributes["diff_mode"]["support"] == "none"


def run_module(tmp_path, args, check_mode=False):
    return run_module_file(tmp_path, "memory_plan_info", args, check_mode=check_mode)


def _vllm_dir(tmp_path):
    model_dir = tmp_path / "qwen-fp8"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps({"text_config": {
        "num_hidden_layers": 64, "hidden_size": 5120, "intermediate_size": 17408, "num_attention_heads": 24,
        "num_key_value_heads": 4, "head_dim": 256, "full_attention_interval": 4, "mtp_num_hidden_layers": 1,
        "vocab_size": 248320, "max_position_embeddings": 262144, "torch_dtype": "bfloat16"},
        "quantization_config": {"quant_method": "fp8"}}))
    with open(str(model_dir / "model.safetensors"), "wb") as f:
        f.truncate(29 * 10 ** 9)  # sparse: the planner reads sizes only
    return str(model_dir)


def test_plans_both_engines_read_only(tmp_path):
    args = {"gpus": [l20(0), l20(1), l20(2), l20(3)], "instances": [
        {"name": "qwen36-27b", "gpus": [2, 3], "model": qwen36_27b(), "settings": SEED_SETTINGS},
        {"name": "qwen36-27b-fp8", "engine": "vllm", "gpus": [0, 1], "model_dir": _vllm_dir(tmp_path),
         "settings": {"tensor_parallel_size": 2, "kv_cache_dtype": "fp8_e4m3", "max_model_len": 131072,
                      "gpu_memory_utilization": 0.92}}]}
    result = run_module(tmp_path, args)
    assert not result.get("failed"), result
    assert result["changed"] is False and result["refusals"] == []
    llama, vllm = result["plans"]["qwen36-27b"], result["plans"]["qwen36-27b-fp8"]
    assert llama["fits"] and [g["index"] for g in llama["gpus"]] == [2, 3]
    assert abs(llama["total_bytes"] - 33e9) < 0.15 * 33e9
    assert vllm["fits"] and vllm["tensor_parallel_size"] == 2
    assert vllm["weights_per_rank"] == 29 * 10 ** 9 // 2
    assert len(result["messages"]) == 2 and result["messages"][0].startswith("qwen36-27b: GPU 2")
    assert run_module(tmp_path, args, check_mode=True)["plans"] == result["plans"]


def test_refusals_fail_the_task_naming_each_instance(tmp_path):
    tight = {"index": 0, "name": "NVIDIA L4", "memory_total_mib": 23034, "memory_free_mib": 9000}
    args = {"gpus": [tight, l20(1, free_mib=20000)], "instances": [
        {"name": "llama-a", "gpus": [0], "model": llama_8b(), "settings": {"ctx_size": 65536, "parallel": 2}},
        {"name": "qwen-b", "gpus": [1], "model": qwen36_27b(),
         "settings": dict(SEED_SETTINGS, tensor_split=None)}]}
    result = run_module(tmp_path, args)
    assert result["failed"] and result["changed"] is False
    assert "instance llama-a does not fit: GPU 0 (NVIDIA L4)" in result["msg"]
    assert "instance qwen-b does not fit: GPU 1 (NVIDIA L20)" in result["msg"]
    assert len(result["refusals"]) == 2
    relaxed = run_module(tmp_path, dict(args, fail_on_refusal=False))
    assert not relaxed.get("failed") and relaxed["refusals"] == result["refusals"]
    assert relaxed["plans"]["qwen-b"]["max_ctx_size"] < 262144


def test_bad_input_fails_with_the_reason(tmp_path):
    result = run_module(tmp_path, {"gpus": [l20(0)], "instances": [
        {"name": "x", "gpus": [5], "model": llama_8b(), "settings": {"ctx_size": 4096}}]})
    assert result["failed"] and "instance x uses GPU(s) 5 that llmops_gpus does not list" in result["msg"]


def test_model_path_on_a_host_without_gpus_plans_host_memory(tmp_path):
    from tests.fixtures.gguf import make_tiny_model

    path = make_tiny_model.cached_tiny_model("llama")
    settings = {"ctx_size": 4096, "parallel": 2}
    args = {"gpus": {"gpus": [], "count": 0}, "host_memory_mib": 2048, "instances": [
        {"name": "cpu", "model_path": path, "gpus": [], "settings": settings}]}
    result = run_module(tmp_path, args)
    assert not result.get("failed"), result
    plan = result["plans"]["cpu"]
    assert plan["device"] == "host" and plan["fits"] and plan["gpus"] == []
    assert plan["host_memory_mib"] == 2048 and result["messages"][0].startswith("cpu: host memory")
    unknown = run_module(tmp_path, dict(args, host_memory_mib=None))
    assert unknown["plans"]["cpu"]["fits"] is None and unknown["refusals"] == []
    tight = run_module(tmp_path, dict(args, host_memory_mib=1030))
    assert tight["failed"] and "instance cpu does not fit in host memory" in tight["msg"]


def test_models_not_on_the_node_yet_are_reported_not_planned(tmp_path):
    """A check-mode first run (nothing downloaded), or a vLLM directory whose config.json has no layer counts:
    the plan says why it cannot plan instead of failing or guessing."""
    bare = tmp_path / "bare-config"
    bare.mkdir()
    (bare / "config.json").write_text('{"model_type": "qwen3_5"}')
    args = {"gpus": [l20(0), l20(1), l20(2)], "instances": [
        {"name": "later", "gpus": [0], "model_path": str(tmp_path / "absent.gguf"), "settings": {}},
        {"name": "vllm-later", "engine": "vllm", "gpus": [1], "model_dir": str(tmp_path / "absent"),
         "settings": {}},
        {"name": "vllm-bare", "engine": "vllm", "gpus": [2], "model_dir": str(bare), "settings": {}}]}
    result = run_module(tmp_path, args)
    assert not result.get("failed"), result
    assert [p["planned"] for p in result["plans"].values()] == [False, False, False]
    assert all(p["fits"] is None for p in result["plans"].values()) and result["refusals"] == []
    assert result["messages"] == [
        "later: not planned: %s is not on the node yet" % (tmp_path / "absent.gguf"),
        "vllm-later: not planned: %s is not on the node yet" % (tmp_path / "absent" / "config.json"),
        "vllm-bare: not planned: %s has no layer count in config.json or no *.safetensors weights" % bare]


def test_a_file_that_is_not_gguf_fails_with_the_reader_s_reason(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"<html>login</html>" * 10)
    result = run_module(tmp_path, {"gpus": [l20(0)], "instances": [
        {"name": "x", "gpus": [0], "model_path": str(bad), "settings": {}}]})
    assert result["failed"] and "GGUF" in result["msg"] and "Traceback" not in json.dumps(result)


def test_a_ray_instance_is_planned_on_every_gpu_of_its_nodes(tmp_path):
    nodes = [{"host": "head", "gpus": [l20(i) for i in range(4)]},
             {"host": "worker1", "gpus": [l20(i) for i in range(8)], "num_gpus": 4}]
    ray = {"name": "big", "engine": "vllm", "gpus": [0, 1, 2, 3], "model_dir": _vllm_dir(tmp_path),
           "ray_cluster": "ray_cluster", "nodes": nodes,
           "settings": {"tensor_parallel_size": 4, "pipeline_parallel_size": 2, "max_model_len": 131072,
                        "distributed_executor_backend": "ray"}}
    result = run_module(tmp_path, {"gpus": [l20(i) for i in range(4)], "instances": [ray]})
    assert not result.get("failed"), result
    plan = result["plans"]["big"]
    assert plan["fits"] and plan["nodes"] == ["head", "worker1"] and plan["pipeline_parallel_size"] == 2
    assert [r["host"] for r in plan["gpus"]] == ["head"] * 4 + ["worker1"] * 4
    assert plan["weights_per_rank"] == 29 * 10 ** 9 // 8
    unknown = dict(ray, nodes=[nodes[0], {"host": "worker1", "gpus": None}])
    result = run_module(tmp_path, {"gpus": [l20(i) for i in range(4)], "instances": [unknown]})
    assert not result.get("failed") and result["plans"]["big"]["planned"] is False
    assert "the GPUs of worker1 in ray_cluster ray_cluster are unknown" in result["messages"][0]


# --- the action plugin: plans on the controller when the node has nothing to add --------------------------

def _play(tmp_path, args):
    """A play that plans on a host no connection reaches (the discard port of loopback over ssh): a task that
    needs the node fails as unreachable; one planned on the controller succeeds."""
    import sys

    from tests.helpers import run_local_playbook

    play = tmp_path / "plan.yml"
    play.write_text(json.dumps([{
        "hosts": "localhost", "gather_facts": False,
        "vars": {"ansible_connection": "ssh", "ansible_host": "127.0.0.1", "ansible_port": 9,
                 "ansible_ssh_timeout": 3, "plan_args": args},
        "tasks": [{"name": "plan", "llmops.serving.memory_plan_info": "{{ plan_args }}",
                   "register": "planned",
                   "ignore_unreachable": True, "ignore_errors": True},
                  {"name": "show", "ansible.builtin.copy": {
                      "content": "{{ planned | to_json }}", "dest": str(tmp_path / "result.json")},
                   "delegate_to": "localhost",
                   "vars": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}}]}]))
    proc, _recap = run_local_playbook(play, "")
    assert (tmp_path / "result.json").exists(), proc.stdout + proc.stderr
    assert proc.returncode in (0, 2), proc.stdout + proc.stderr
    return json.loads((tmp_path / "result.json").read_text())


def test_the_action_plans_on_the_controller_what_the_module_plans_on_the_node(tmp_path):
    args = {"gpus": [l20(0), l20(1), l20(2), l20(3)], "instances": [
        {"name": "qwen36-27b", "gpus": [2, 3], "model": qwen36_27b(), "settings": SEED_SETTINGS}]}
    on_node = run_module(tmp_path, args)
    on_controller = _play(tmp_path, args)
    assert not on_controller.get("unreachable") and not on_controller.get("failed"), on_controller
    assert on_controller["plans"] == on_node["plans"] and on_controller["messages"] == on_node["messages"]
    # a refusal fails the task there too, with the module's message
    tight = dict(args, gpus=[l20(2, free_mib=9000), l20(3, free_mib=9000)])
    tight["instances"] = [dict(args["instances"][0], gpus=[0, 1])]
    refused = _play(tmp_path, tight)
    assert refused["failed"] and refused["msg"] == run_module(tmp_path, tight)["msg"]
    # the module's argument spec holds on the controller too
    bad = _play(tmp_path, dict(args, memory_basis="most"))
    assert bad["failed"] and "memory_basis" in bad["msg"] and "most" in bad["msg"]


def test_the_action_runs_the_module_on_the_node_for_a_model_path(tmp_path):
    args = {"gpus": [l20(0)], "instances": [
        {"name": "x", "gpus": [0], "model_path": "/models/x.gguf", "settings": {}}]}
    assert _play(tmp_path, args).get("unreachable") is True


def test_a_fifo_or_device_link_as_config_json_fails_at_once(tmp_path):
    model_dir = _vllm_dir(tmp_path)
    config = os.path.join(model_dir, "config.json")
    args = {"gpus": [l20(0)],
            "instances": [{"name": "v", "engine": "vllm", "gpus": [0], "model_dir": model_dir}]}
    assert run_module(tmp_path, args)["plans"]["v"]["planned"]
    for make, what in ((os.mkfifo, "a FIFO (named pipe)"), (lambda p: os.symlink("/dev/zero", p),
                                                             "a symbolic link (to /dev/zero)")):
        os.unlink(config)
        make(config)
        out = run_module_file(tmp_path, "memory_plan_info", args, timeout=20)  # it hung / ate 1 GB before
        assert out["failed"] and "config.json %s is %s" % (config, what) in out["msg"], out
