# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The engine-neutral instance planner: GPUs, binds and keys, ports, models, engines, env files."""
import shlex

import pytest
from ansible_collections.llmops.serving.plugins.plugin_utils import instance_plan
from ansible_collections.llmops.serving.plugins.plugin_utils.container import docker_run_args
from ansible_collections.llmops.serving.plugins.plugin_utils.serving_errors import ServingError
from ansible_collections.llmops.serving.plugins.plugin_utils.systemd import systemd_command

from tests.unit.plugins.plugin_utils.serving_helpers import GPUS, HOST_CPP, MODELS, pairs, plan


def test_main_gpu_is_physical_and_becomes_relative():
    # The seed: GPUs 2 and 3, "main GPU 0 = physical GPU 2".
    p = plan([{"name": "q", "model": "tiny", "gpus": [2, 3], "port": 8003, "settings": {"main_gpu": 2}}],
             gpus=GPUS)[0]
    assert p["env"]["CUDA_VISIBLE_DEVICES"] == "2,3"
    assert pairs(p["argv"])["--main-gpu"] == "0"
    p = plan([{"name": "q", "model": "tiny", "gpus": [3, 1], "port": 8003, "settings": {"main_gpu": 1}}],
             gpus=GPUS)[0]
    assert p["env"]["CUDA_VISIBLE_DEVICES"] == "3,1"
    assert pairs(p["argv"])["--main-gpu"] == "1"
    uuid = GPUS["gpus"][2]["uuid"]
    p = plan([{"name": "q", "model": "tiny", "gpus": [GPUS["gpus"][3]["uuid"], uuid], "port": 8003,
               "settings": {"main_gpu": uuid.lower()}}], gpus=GPUS)[0]
    assert pairs(p["argv"])["--main-gpu"] == "1"
    assert p["env"]["CUDA_VISIBLE_DEVICES"].endswith(uuid)
    with pytest.raises(ServingError, match="main_gpu 0 is not one of this instance's GPUs"):
        plan([{"name": "q", "model": "tiny", "gpus": [2, 3], "port": 8003, "settings": {"main_gpu": 0}}])


def test_gpus_checked_against_llmops_gpus_and_never_shared():
    with pytest.raises(ServingError, match="GPU 7 does not exist"):
        plan([{"name": "q", "model": "tiny", "gpus": [7], "port": 8003}], gpus=GPUS)
    with pytest.raises(ServingError, match="GPU-deadbeef-0000 does not exist"):
        plan([{"name": "q", "model": "tiny", "gpus": ["GPU-deadbeef-0000"], "port": 8003}], gpus=GPUS)
    with pytest.raises(ServingError, match="no NVIDIA GPU"):
        plan([{"name": "q", "model": "tiny", "gpus": [0], "port": 8003}], gpus={"present": False})
    with pytest.raises(ServingError, match="given to both a and b"):
        plan([{"name": "a", "model": "tiny", "gpus": [0, 1], "port": 8001},
              {"name": "b", "model": "tiny", "gpus": [1], "port": 8002}], gpus=GPUS)
    with pytest.raises(ServingError, match="tensor_split has 3 entries"):
        plan([{"name": "q", "model": "tiny", "gpus": [0, 1], "port": 8003,
               "settings": {"tensor_split": [1, 1, 1]}}])


def test_an_instance_on_a_lost_gpu_is_refused_naming_what_gpu_facts_found():
    """The fault of molecule/faults d: GPU 1 fell off the bus, so gpu_facts lists GPUs 0, 2, 3 and says why;
    before, the refusal said GPU 1 'does not exist on this host'."""
    lost = ("GPU at PCI 0000:3b:00.0 has fallen off the bus or is lost: the driver cannot reach it "
            "(GPU is lost).")
    facts = dict(GPUS, gpus=[g for g in GPUS["gpus"] if g["index"] != 1], error=lost)
    with pytest.raises(ServingError) as refused:
        plan([{"name": "b", "model": "tiny", "gpus": [1], "port": 8003}], gpus=facts)
    assert "b: GPU 1 is not usable on this host now" in str(refused.value)
    assert "working GPUs [0, 2, 3]" in str(refused.value) and lost in str(refused.value)
    assert "does not exist" not in str(refused.value)
    # the working GPUs still deploy; without an error the absent GPU still "does not exist"
    assert plan([{"name": "a", "model": "tiny", "gpus": [0], "port": 8003}], gpus=facts)[0]["gpus"] == [0]
    with pytest.raises(ServingError, match="GPU 1 does not exist"):
        plan([{"name": "b", "model": "tiny", "gpus": [1], "port": 8003}], gpus=dict(facts, error=None))


def test_open_bind_without_key_is_refused_with_instructions():
    inst = [{"name": "q", "model": "tiny", "host": "0.0.0.0", "port": 8003}]
    with pytest.raises(ServingError, match=r"binds 0\.0\.0\.0 without an API key.*"
                                                   r"serving_api_keys\['q'\]"):
        plan(inst)
    with pytest.raises(ServingError, match="without an API key"):
        plan([dict(inst[0], host="127.0.0.1,10.0.0.5")])
    p = plan(inst, api_key_names=["q"], key_dir="/etc/llama-server/")[0]
    assert p["key_file"] == "/etc/llama-server/q.key"
    assert pairs(p["argv"])["--api-key-file"] == "/etc/llama-server/q.key"
    assert p["url"] == "http://127.0.0.1:8003"
    # loopback needs no key, and gets no --api-key-file
    for host in ("127.0.0.1", "localhost", "::1", "127.0.0.2"):
        p = plan([dict(inst[0], host=host)])[0]
        assert p["key_file"] is None and "--api-key-file" not in p["argv"]
    assert plan([dict(inst[0], host="::1")])[0]["url"] == "http://[::1]:8003"


@pytest.mark.parametrize("instances,message", [
    ([{"name": "a", "model": "tiny", "port": 1}, {"name": "a", "model": "tiny", "port": 2}], "used twice"),
    ([{"name": "a", "model": "tiny", "port": 1}, {"name": "b", "model": "tiny", "port": 1}],
     "both use port 1"),
    ([{"name": "a b", "model": "tiny", "port": 1}], "names the systemd unit"),
    ([{"name": "a", "model": "tiny", "port": 0}], "port must be a number"),
    ([{"name": "a", "model": "nope", "port": 1}], "neither a model of llmops_models"),
    ([{"name": "a", "model": "tiny", "port": 1, "ctx_size": 4}], "unknown field"),
    ([{"name": "a", "model": "tiny", "port": 1, "mode": "k8s"}], "host or container"),
    ([{"name": "a", "model": "tiny", "port": 1, "gpus": [0], "env": {"CUDA_VISIBLE_DEVICES": "1"}}],
     "comes from its gpus list"),
])
def test_bad_instances(instances, message):
    with pytest.raises(ServingError, match=message):
        plan(instances)


def test_missing_engine_is_refused():
    with pytest.raises(ServingError, match="run the llama_cpp role first"):
        plan([{"name": "a", "model": "tiny", "port": 1}], build={})
    with pytest.raises(ServingError, match="needs an image"):
        plan([{"name": "a", "model": "tiny", "port": 1}], build={"mode": "container"})
    p = plan([{"name": "a", "model": "tiny", "port": 1}], build={}, binary_override="/usr/local/bin/ls")
    assert p[0]["binary"] == "/usr/local/bin/ls"


def test_container_mode_gets_only_its_gpus_readonly_mounts_and_relative_paths():
    p = plan([{"name": "q", "model": "tiny", "gpus": [2, 3], "host": "0.0.0.0", "port": 8003,
               "settings": {"mlock": True, "mmap": False}}],
             build={"mode": "container", "image": "llmops/llama.cpp:b1", "build_id": "b1"},
             api_key_names=["q"])[0]
    assert "CUDA_VISIBLE_DEVICES" not in p["env"]
    args = docker_run_args(p, user="998:997", entrypoint="/app/llama-server")
    # what docker receives once systemd has unquoted the ExecStart line
    parsed = shlex.split(systemd_command(args))
    assert parsed[parsed.index("--gpus") + 1] == '"device=2,3"'
    assert "%s:/models:ro" % "/home/models/tiny" in parsed
    assert "/etc/llama-server/q.key:/run/secrets/llama-server-api-key:ro" in parsed
    assert parsed[parsed.index("--user") + 1] == "998:997"
    assert parsed[parsed.index("--ulimit") + 1] == "memlock=-1:-1"
    # A node that cannot raise the limit (itself a container): its containers get its hard limit, as units.
    capped = shlex.split(systemd_command(docker_run_args(p, memlock="8388608")))
    assert capped[capped.index("--ulimit") + 1] == "memlock=8388608:8388608"
    assert "memlock=-1:-1" in docker_run_args(p, memlock="infinity")
    with pytest.raises(ValueError, match="neither infinity nor a number"):
        docker_run_args(p, memlock="8M; rm")
    image_at = parsed.index("llmops/llama.cpp:b1")
    # instance env (maybe secrets) comes from its 0600 file, never as -e NAME=value
    assert parsed[parsed.index("--env-file") + 1] == "/etc/llama-server/q.env"
    assert "-e" not in parsed[:image_at]
    server = pairs(parsed[image_at + 1:])
    assert server["--model"] == "/models/tiny.gguf"
    assert server["--api-key-file"] == "/run/secrets/llama-server-api-key"


def test_env_is_checked_and_only_its_names_are_in_the_plan():
    p = plan([{"name": "a", "model": "tiny", "port": 1, "env": {"HF_TOKEN": "hf_plan_secret_1", "N": 3}}])[0]
    assert p["env_names"] == ["HF_TOKEN", "N"] and p["env_file"] == "/etc/llama-server/a.env"
    assert "hf_plan_secret_1" not in repr(p)
    instances = [{"name": "a", "env": {"N": 3, "HF_TOKEN": 'x"y'}}]
    assert instance_plan.instance_env_file(instances, "a") == 'HF_TOKEN="x\\"y"\nN="3"\n'
    assert instance_plan.instance_env_file(instances, "a", mode="container") == 'HF_TOKEN=x"y\nN=3\n'
    assert instance_plan.instance_env_file([{"name": "a"}], "a") == ""
    with pytest.raises(ServingError, match="no instance named b"):
        instance_plan.instance_env_file([{"name": "a"}], "b")


def test_engine_comes_from_the_registry():
    assert instance_plan.engine_flags("llama.cpp").PROGRAM == "llama-server"
    assert instance_plan.engine_flags("vllm").PROGRAM == "vllm"
    with pytest.raises(ServingError, match="unknown engine 'sglang'; known engines: llama.cpp, vllm"):
        plan([{"name": "a", "engine": "sglang", "model": "tiny", "port": 1}])
    with pytest.raises(ServingError, match="unknown engine 'tgi'"):
        plan([{"name": "a", "model": "tiny", "port": 1}], default_engine="tgi")
    with pytest.raises(ServingError, match="no instance named b in serving_instances"):
        instance_plan.instance_env_file([{"name": "a"}], "b")
    with pytest.raises(ServingError, match="serving_default_settings is keyed by engine"):
        plan([{"name": "a", "model": "tiny", "port": 1}], defaults={"n_gpu_layers": 999})


def test_the_filter_wraps_the_planner_and_keeps_its_names():
    from ansible.errors import AnsibleFilterError
    from ansible_collections.llmops.serving.plugins.filter.serving import FilterModule

    filters = FilterModule().filters()
    instances = [{"name": "q", "model": "tiny", "gpus": [2], "port": 8003}]
    from_filter = filters["serving_instance_plans"](instances, builds={"llama.cpp": HOST_CPP}, models=MODELS,
                                                    gpus=GPUS)
    assert from_filter == plan(instances, gpus=GPUS)
    assert filters["serving_exec_start"](from_filter[0]).startswith(HOST_CPP["binary"] + " --model ")
    with pytest.raises(AnsibleFilterError, match="serving: instance name q is used twice"):
        filters["serving_instance_plans"](instances * 2, builds={"llama.cpp": HOST_CPP}, models=MODELS)
    with pytest.raises(AnsibleFilterError, match="serving: unknown llama-server setting"):
        filters["serving_argv"]({"ctx": 1})
