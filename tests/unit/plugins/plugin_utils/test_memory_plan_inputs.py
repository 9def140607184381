# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""What the memory planner is given: settings merged over the engine's defaults, the best model metadata
known at each stage, GPUs in the instance's order, and a running instance's GPUs counted free."""
import pytest
from ansible_collections.llmops.serving.plugins.plugin_utils.memory_plan_inputs import memory_plan_inputs
from ansible_collections.llmops.serving.plugins.plugin_utils.serving_errors import ServingError

GGUF = {"architecture": "qwen35", "block_count": 5, "layer_bytes": [10, 10, 10, 10, 10]}
HEADER = dict(GGUF, remote={"url": "http://hub/x.gguf"})
GPUS = {"present": True, "count": 4,
        "gpus": [{"index": i, "uuid": "GPU-%08d-aaaa-bbbb-cccc-dddddddddddd" % i, "memory_total_mib": 46068,
                  "memory_free_mib": 45596 - 1000 * i} for i in range(4)]}
DEFAULTS = {"llama.cpp": {"n_gpu_layers": 999, "jinja": True}, "vllm": {}}


def _one(instances, **kw):
    kw.setdefault("defaults", DEFAULTS)
    kw.setdefault("gpus", GPUS)
    return memory_plan_inputs(instances, **kw)


def test_settings_merge_over_engine_defaults_and_null_drops_a_default():
    out = _one([{"name": "q", "model": "m", "gpus": [3, 2], "settings": {"ctx_size": 8192, "jinja": None}}],
               models={"m": {"path": "/models/m.gguf", "gguf": GGUF}})
    item = out["instances"][0]
    assert item["settings"] == {"n_gpu_layers": 999, "ctx_size": 8192}
    assert item["engine"] == "llama.cpp" and item["model"] == GGUF
    assert item["gpus"] == [3, 2], "tensor_split follows the instance's GPU order"


def test_downloaded_metadata_wins_over_the_remote_header_then_header_then_path():
    inst = [{"name": "q", "model": "m", "gpus": [0]}]
    assert _one(inst, models={"m": {"gguf": GGUF}}, headers={"m": HEADER})["instances"][0]["model"] == GGUF
    assert _one(inst, headers={"m": HEADER})["instances"][0]["model"] == HEADER
    downloaded_without_metadata = _one(inst, models={"m": {"path": "/m.gguf", "gguf": {}}})
    assert downloaded_without_metadata["instances"][0]["model_path"] == "/m.gguf"
    by_path = _one([{"name": "q", "model": "/abs/m.gguf", "gpus": [0]}])
    assert by_path["instances"][0]["model_path"] == "/abs/m.gguf"


def test_unknown_model_is_skipped_with_a_reason_not_planned_blind():
    out = _one([{"name": "q", "model": "later", "gpus": [0]}])
    assert out["instances"] == []
    assert out["skipped"] == ["q: model later is not known yet (no header read, not downloaded)"]


def test_vllm_gets_its_model_directory():
    out = _one([{"name": "v", "engine": "vllm", "model": "/home/models/Qwen3.6-27B-FP8", "gpus": [0, 1],
                 "settings": {"tensor_parallel_size": 2}}])
    assert out["instances"][0]["model_dir"] == "/home/models/Qwen3.6-27B-FP8"
    assert out["instances"][0]["settings"] == {"tensor_parallel_size": 2}


def test_vllm_snapshot_not_downloaded_is_planned_from_the_hub_then_from_its_directory():
    """Preflight: model_models' snapshot has no directory yet, safetensors_info read config.json and the shard
    headers from the hub; the serve stage reads the snapshot directory llmops_models names."""
    vllm = {"num_hidden_layers": 64, "weights_bytes": 29 * 1024 ** 3, "model_dir": "hub"}
    inst = [{"name": "v", "engine": "vllm", "model": "qwen3.6-27b-fp8", "gpus": [0, 1]}]
    assert _one(inst, headers={"qwen3.6-27b-fp8": {"vllm": vllm}})["instances"][0]["model"] == vllm
    served = _one(inst, models={"qwen3.6-27b-fp8": {"path": "/home/models/Qwen3.6-27B-FP8",
                                                     "dir": "/home/models/Qwen3.6-27B-FP8"}},
                  headers={"qwen3.6-27b-fp8": {"vllm": vllm}})
    assert served["instances"][0]["model_dir"] == "/home/models/Qwen3.6-27B-FP8"
    assert _one(inst, headers={"qwen3.6-27b-fp8": {"architecture": "qwen35"}})["instances"] == []


def test_running_instance_gpus_count_as_free_and_the_fact_is_not_modified():
    out = _one([{"name": "q", "model": "/m.gguf", "gpus": ["GPU-00000002-aaaa-bbbb-cccc-dddddddddddd"]}],
               running_units=["llama-server-q.service"], unit_prefix={"llama.cpp": "llama-server-"})
    assert out["instances"][0]["gpus"] == [2] and out["instances"][0]["running"] is True
    by_index = dict((g["index"], g["memory_free_mib"]) for g in out["gpus"]["gpus"])
    assert by_index == {0: 45596, 1: 44596, 2: 46068, 3: 42596}
    assert GPUS["gpus"][2]["memory_free_mib"] == 43596


def test_a_gpu_the_host_does_not_have_is_refused():
    with pytest.raises(ServingError, match="GPU 7 does not exist"):
        _one([{"name": "q", "model": "/m.gguf", "gpus": [7]}])


def test_gpus_not_visible_yet_are_planned_later_and_cpu_instances_now():
    out = _one([{"name": "q", "model": "/m.gguf", "gpus": [2, 3]},
                {"name": "cpu", "model": "/m.gguf", "settings": {"n_gpu_layers": 0}}], gpus=None)
    assert out["skipped"] == ["q: GPUs 2, 3 are not visible yet (no working driver); planned again in the "
                              "serve stage"]
    assert [i["name"] for i in out["instances"]] == ["cpu"] and out["instances"][0]["gpus"] == []
    assert out["gpus"] == {"present": False, "gpus": []}


RAY = {"name": "big", "engine": "vllm", "model": "/home/models/Big-FP8", "gpus": [0, 1, 2, 3],
       "ray_cluster": "ray_cluster", "settings": {"tensor_parallel_size": 4, "pipeline_parallel_size": 2}}
GROUPS = {"ray_cluster": ["head", "worker1"]}


def test_ray_instance_carries_every_node_of_its_group_head_first():
    hostvars = {"head": {"llmops_gpus": GPUS}, "worker1": {"llmops_gpus": GPUS}}
    out = _one([RAY], hostvars=hostvars, groups={"ray_cluster": ["worker1", "head"]},
               inventory_hostname="head", running_units=["vllm-big.service"], unit_prefix={"vllm": "vllm-"})
    (item,) = out["instances"]
    assert item["ray_cluster"] == "ray_cluster" and item["settings"]["distributed_executor_backend"] == "ray"
    assert [n["host"] for n in item["nodes"]] == ["head", "worker1"]
    assert [n["num_gpus"] for n in item["nodes"]] == [4, 4]
    # the instance runs now: its GPUs on every node count free after its restart; the facts stay as they are
    assert all(g["memory_free_mib"] == 46068 for n in item["nodes"] for g in n["gpus"])
    assert GPUS["gpus"][3]["memory_free_mib"] == 42596


def test_ray_node_num_gpus_and_unknown_facts_reach_the_planner():
    hostvars = {"head": {"llmops_gpus": GPUS}, "worker1": {"ray_cluster_num_gpus": 4}}
    (item,) = _one([RAY], hostvars=hostvars, groups=GROUPS, inventory_hostname="head")["instances"]
    assert item["nodes"][1] == {"host": "worker1", "gpus": None, "num_gpus": 4}
    hostvars = {"head": {"llmops_gpus": GPUS}, "worker1": {"llmops_gpus": GPUS, "ray_cluster_num_gpus": 2}}
    (item,) = _one([dict(RAY, gpus=[])], hostvars=hostvars, groups=GROUPS,
                   inventory_hostname="head")["instances"]
    assert [g["index"] for g in item["nodes"][1]["gpus"]] == [0, 1] and item["nodes"][1]["num_gpus"] == 2


def test_ray_instance_without_hostvars_is_skipped_and_other_engines_are_refused():
    out = _one([RAY])
    assert out["instances"] == [] and out["skipped"] == [
        "big: ray_cluster ray_cluster: the cluster's nodes are not known here (hostvars/groups not given to "
        "serving_memory_plan_inputs)"]
    with pytest.raises(ServingError, match="ray_cluster is for engine vllm"):
        _one([dict(RAY, engine="llama.cpp", model="/m.gguf")], hostvars={}, groups=GROUPS)
