# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The planner with vLLM instances: exposure, key in the env file, GPUs and preflight, stable names."""
import pytest
from ansible_collections.llmops.serving.plugins.plugin_utils import instance_plan
from ansible_collections.llmops.serving.plugins.plugin_utils.serving_errors import ServingError

from tests.unit.plugins.plugin_utils.serving_helpers import GPUS, pairs, plan

VLLM = {"mode": "host", "binary": "/opt/vllm/venv/bin/vllm", "version": "0.33.0"}
MODELS = {"tiny": {"path": "/home/models/tiny/tiny.gguf", "sha256": "ab" * 32},
          "qwen-fp8": {"path": "/home/models/Qwen-FP8", "sha256": None}}


def vplan(instances, **kw):
    kw.setdefault("models", MODELS)
    return plan([dict({"engine": "vllm"}, **i) for i in instances], vllm=VLLM, **kw)


def test_vllm_host_plan_runs_vllm_serve_with_the_model_positional_and_a_stable_name():
    p = vplan([{"name": "q", "model": "qwen-fp8", "port": 8000, "gpus": [0, 1],
                "settings": {"tensor_parallel_size": 2}}], gpus=GPUS)[0]
    assert p["engine"] == "vllm" and p["unit"] == "vllm-q.service"
    assert p["subcommand"] == ["serve"] and p["argv"][0] == "/home/models/Qwen-FP8"
    args = pairs(p["argv"][1:])
    assert args["--host"] == "127.0.0.1" and args["--served-model-name"] == "qwen-fp8"
    assert p["env"]["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert p["env"]["VLLM_ENGINE_READY_TIMEOUT_S"] == "1800" and p["timeout_start_sec"] == 1800
    assert p["model_check"] == "/home/models/Qwen-FP8/config.json"
    assert p["build_id"] == "0.33.0" and not p["mlock"]
    # an absolute path gets the instance name, never the path, as its served name
    p = vplan([{"name": "q", "model": "/srv/m/Qwen", "port": 8000}])[0]
    assert pairs(p["argv"][1:])["--served-model-name"] == "q"
    with pytest.raises(ServingError, match="must be a name, not a path"):
        vplan([{"name": "q", "model": "/srv/m/Qwen", "port": 8000, "served_model_name": "/srv/m/Qwen"}])


def test_llama_cpp_gets_the_stable_name_as_alias_and_keeps_its_unit_name():
    p = plan([{"name": "q", "model": "tiny", "port": 8003}])[0]
    assert pairs(p["argv"])["--alias"] == "tiny" and p["unit"] == "llama-server-q.service"
    with pytest.raises(ServingError, match="served_model_name"):
        plan([{"name": "q", "model": "tiny", "port": 8003, "settings": {"alias": "x"}}])


def test_vllm_key_goes_to_the_env_file_never_argv():
    inst = [{"name": "q", "engine": "vllm", "model": "/srv/m/Qwen", "port": 8000,
             "env": {"HF_TOKEN": "hf_1"}}]
    p = plan(inst, vllm=VLLM, api_key_names=["q"])[0]
    assert p["key_file"] is None and p["api_key_env"] == "VLLM_API_KEY"
    assert "--api-key" not in p["argv"] and p["env_names"] == ["HF_TOKEN", "VLLM_API_KEY"]
    text = instance_plan.instance_env_file(inst, "q", api_keys={"q": "sk-secret"})
    assert text == 'HF_TOKEN="hf_1"\nVLLM_API_KEY="sk-secret"\n'
    assert "sk-secret" not in repr(p)
    with pytest.raises(ServingError, match="VLLM_API_KEY comes from serving_api_keys"):
        plan([dict(inst[0], env={"VLLM_API_KEY": "x"})], vllm=VLLM)


def test_vllm_exposure_needs_a_proxy_or_explicit_acceptance():
    inst = {"name": "q", "model": "/srv/m/Qwen", "port": 8000, "host": "0.0.0.0"}
    with pytest.raises(ServingError, match=r"guards only /v1, /v2 and /inference.*/metrics.*"
                                           r"serving_fronted_by_proxy.*accept_exposure"):
        vplan([inst], api_key_names=["q"])
    assert vplan([inst], api_key_names=["q"], fronted_by_proxy=True)[0]["host"] == "0.0.0.0"
    assert vplan([dict(inst, accept_exposure=True)], api_key_names=["q"])[0]["url"] == "http://127.0.0.1:8000"
    with pytest.raises(ServingError, match="without an API key"):
        vplan([dict(inst, accept_exposure=True)])


def test_vllm_gpus_parallel_sizes_and_device_ids():
    with pytest.raises(ServingError, match="= 2, but the instance has 1 GPU"):
        vplan([{"name": "q", "model": "/m/Q", "port": 1, "gpus": [0],
                "settings": {"tensor_parallel_size": 2}}])
    with pytest.raises(ServingError, match="set the instance's gpus"):
        vplan([{"name": "q", "model": "/m/Q", "port": 1, "settings": {"tensor_parallel_size": 2}}])
    with pytest.raises(ServingError, match="set the instance's gpus"):
        vplan([{"name": "q", "model": "/m/Q", "port": 1, "settings": {"device_ids": [0]}}])
    with pytest.raises(ServingError, match="given to both"):
        plan([{"name": "a", "model": "tiny", "port": 1, "gpus": [0]},
              {"name": "b", "engine": "vllm", "model": "/m/Q", "port": 2, "gpus": [0]}], vllm=VLLM, gpus=GPUS)


def _gpus(cap, free):
    return {"present": True, "gpus": [{"index": i, "uuid": "GPU-%d" % i, "compute_cap": cap,
                                       "memory_total_mib": 11264, "memory_free_mib": free} for i in range(2)]}


def test_fp8_below_sm89_is_a_warning_not_silence():
    inst = [{"name": "q", "model": "/m/Q", "port": 1, "gpus": [0, 1],
             "settings": {"tensor_parallel_size": 2, "quantization": "fp8", "kv_cache_dtype": "fp8_e4m3"}}]
    (p,) = vplan(inst, gpus=_gpus("7.5", 11000))
    (warning,) = p["warnings"]
    assert "weight-only/emulated" in warning and "7.5" in warning
    assert vplan(inst, gpus=_gpus("8.9", 11000))[0]["warnings"] == []


def test_memory_refused_before_start_warned_while_running():
    inst = [{"name": "q", "model": "/m/Q", "port": 1, "gpus": [0, 1],
             "settings": {"tensor_parallel_size": 2, "gpu_memory_utilization": 0.92}}]
    with pytest.raises(ServingError, match=r"0.92 x 11264 MiB = 10362 MiB, but only 900 MiB are free"):
        vplan(inst, gpus=_gpus("7.5", 900))
    (p,) = vplan(inst, gpus=_gpus("7.5", 900), running_units=["vllm-q.service"])
    assert any("own running process" in w for w in p["warnings"])


def vllm_container_plan():
    return plan([{"name": "q", "engine": "vllm", "model": "/srv/m/Qwen", "port": 8000, "gpus": [0, 1],
                  "settings": {"tensor_parallel_size": 2}}],
                vllm={"mode": "container", "image": "vllm/vllm-openai@sha256:" + "a" * 64}, gpus=GPUS,
                api_key_names=["q"])[0]


def test_container_mode_uses_the_images_entrypoint_and_host_ipc():
    from ansible_collections.llmops.serving.plugins.plugin_utils.container import docker_run_args

    p = vllm_container_plan()
    args = docker_run_args(p)
    image_at = args.index(p["image"])
    assert args[image_at + 1] == "/models/Qwen"                    # vllm-openai's entrypoint is `vllm serve`
    assert "--ipc" in args[:image_at] and "/srv/m:/models:ro" in args
    assert args[args.index("--env-file") + 1] == "/etc/llama-server/q.env"
    assert "VLLM_ENGINE_READY_TIMEOUT_S=1800" in args and "--api-key" not in args
    args = docker_run_args(p, entrypoint="/usr/local/bin/vllm")
    assert args[args.index(p["image"]) + 1] == "serve"


def test_runtime_wide_env_of_the_build_reaches_the_unit_unless_the_instance_overrides_it():
    vllm = dict(VLLM, env={"VLLM_USE_DEEP_GEMM": "0", "OMP_NUM_THREADS": 8})
    (p,) = plan([{"name": "q", "engine": "vllm", "model": "/m/Q", "port": 8000,
                  "env": {"OMP_NUM_THREADS": "4"}}], vllm=vllm)
    assert p["env"]["VLLM_USE_DEEP_GEMM"] == "0"
    assert "OMP_NUM_THREADS" not in p["env"]          # the instance's env file has its own value
    assert p["env_names"] == ["OMP_NUM_THREADS"]


def test_runtime_wide_env_may_not_set_what_the_role_computes():
    vllm = dict(VLLM, env={"CUDA_VISIBLE_DEVICES": "0"})
    with pytest.raises(ServingError, match="CUDA_VISIBLE_DEVICES"):
        plan([{"name": "q", "engine": "vllm", "model": "/m/Q", "port": 8000}], vllm=vllm)


def test_container_user_gets_a_writable_home_for_vllm_caches():
    """vllm-openai's HOME is /root: as the service user, vLLM needs the user's home for ~/.cache/vllm."""
    from ansible_collections.llmops.serving.plugins.plugin_utils.container import docker_run_args

    p = vllm_container_plan()
    args = docker_run_args(p, user="998:997", home="/var/lib/llama-server")
    assert args[args.index("--user") + 1] == "998:997"
    assert "/var/lib/llama-server:/var/lib/llama-server" in args
    assert "HOME=/var/lib/llama-server" in args
    assert args.index("HOME=/var/lib/llama-server") < args.index(p["image"])
    # root in the container (no user) keeps the image's own HOME
    assert not any(str(a).startswith("HOME=") for a in docker_run_args(p, home="/var/lib/llama-server"))


# --- vLLM across nodes: ray_cluster -----------------------------------------------------------------------

def _l20s(count):
    return {"present": True, "count": count,
            "gpus": [{"index": i, "uuid": "GPU-%08d-aaaa-bbbb-cccc-dddddddddddd" % i, "compute_cap": "8.9",
                      "memory_total_mib": 46068, "memory_free_mib": 45600} for i in range(count)]}


RAY_GROUPS = {"ray_cluster": ["worker1", "head"], "ray_head": ["head"]}
RAY_HOSTVARS = {"head": {"llmops_gpus": _l20s(4)}, "worker1": {"llmops_gpus": _l20s(4)}}
RAY_INSTANCE = {"name": "big", "model": "/m/Big-FP8", "port": 8000, "gpus": [0, 1, 2, 3],
                "ray_cluster": "ray_cluster",
                "settings": {"tensor_parallel_size": 4, "pipeline_parallel_size": 2}}


def rplan(instance=None, hostvars=None, **kw):
    kw.setdefault("gpus", _l20s(4))
    return vplan([instance or RAY_INSTANCE], hostvars=RAY_HOSTVARS if hostvars is None else hostvars,
                 groups=RAY_GROUPS, inventory_hostname="head", **kw)


def test_ray_cluster_instance_spans_the_groups_gpus_with_the_ray_backend_and_publishes_its_group():
    from ansible_collections.llmops.serving.plugins.filter.serving import serving_instance_fact

    (p,) = rplan()
    args = pairs(p["argv"][1:])
    assert args["--distributed-executor-backend"] == "ray"
    assert p["settings"]["distributed_executor_backend"] == "ray"
    assert args["--tensor-parallel-size"] == "4" and args["--pipeline-parallel-size"] == "2"
    assert p["ray_cluster"] == "ray_cluster" and p["warnings"] == []
    fact = serving_instance_fact(p)
    assert fact["ray_cluster"] == "ray_cluster" and fact["gpus"] == [0, 1, 2, 3]
    assert serving_instance_fact(vplan([{"name": "q", "model": "/m/Q", "port": 1}])[0])["ray_cluster"] is None


def test_ray_cluster_refusals_say_what_to_change():
    with pytest.raises(ServingError, match=r"ray_cluster is for engine vllm .* remove ray_cluster or set "
                                           r"engine: vllm"):
        plan([{"name": "c", "model": "tiny", "port": 1, "ray_cluster": "ray_cluster"}])
    with pytest.raises(ServingError, match=r"its settings say 'mp': remove that setting "
                                           r"\(ray_cluster implies ray\)"):
        rplan(dict(RAY_INSTANCE, settings=dict(RAY_INSTANCE["settings"], distributed_executor_backend="mp")))
    with pytest.raises(ServingError, match=r"^instance big: ray_cluster ray_cluster: tensor_parallel_size 8 "
                                           r"is more than the GPUs head, worker1 .*"
                                           r"tensor parallelism stays within a node"):
        rplan(dict(RAY_INSTANCE, settings={"tensor_parallel_size": 8}))
    with pytest.raises(ServingError, match=r"ray_cluster gpu_nodes is not an inventory group with hosts"):
        rplan(dict(RAY_INSTANCE, ray_cluster="gpu_nodes"))
    with pytest.raises(ServingError, match=r"gpus list 2 GPU\(s\) of the head head, but the head declares 4"):
        rplan(dict(RAY_INSTANCE, gpus=[0, 1]))


def test_a_default_backend_is_replaced_for_a_ray_instance_and_num_gpus_counts():
    (p,) = rplan(defaults={"vllm": {"distributed_executor_backend": "mp"}})
    assert p["settings"]["distributed_executor_backend"] == "ray"
    hostvars = {"head": RAY_HOSTVARS["head"],
                "worker1": {"llmops_gpus": _l20s(8), "ray_cluster_num_gpus": "4"}}
    assert rplan(hostvars=hostvars)[0]["warnings"] == []
    hostvars["worker1"]["ray_cluster_num_gpus"] = 8
    with pytest.raises(ServingError, match=r"declares 12 GPU\(s\) to Ray \(head 4, worker1 8\)"):
        rplan(hostvars=hostvars)


def test_ray_cluster_nodes_unknown_are_warned_not_guessed():
    (p,) = rplan(hostvars={"head": RAY_HOSTVARS["head"], "worker1": {}})
    assert any("GPUs of worker1 are not known" in w for w in p["warnings"])
    (p,) = vplan([RAY_INSTANCE], gpus=_l20s(4))            # no hostvars/groups given (the role's old call)
    assert any("nodes are not known here" in w for w in p["warnings"])


def test_ray_cluster_nodes_head_first_with_its_own_gpus():
    nodes = instance_plan.ray_cluster_nodes("ray_cluster", RAY_HOSTVARS, RAY_GROUPS, head="head",
                                            head_gpus=[3, 2, 1, 0])
    assert [n["host"] for n in nodes] == ["head", "worker1"] and [n["num_gpus"] for n in nodes] == [4, 4]
    assert [g["index"] for g in nodes[0]["gpus"]] == [3, 2, 1, 0] and nodes[1]["unknown"] is None
    assert instance_plan.ray_cluster_nodes("ray_cluster", None, None) is None
    with pytest.raises(ServingError, match="must be a number of GPUs"):
        instance_plan.ray_cluster_nodes("ray_cluster", {"worker1": {"ray_cluster_num_gpus": "all"}},
                                        RAY_GROUPS)
