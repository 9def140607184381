# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The planner refuses an engine runtime the node's driver cannot run, before any unit changes: the CUDA a
build fact publishes (llmops_vllm / llmops_llama_cpp cuda_version) against llmops_gpus' driver, with CUDA's
rules (plugins/module_utils/_gpu/cuda_compat.py; their decision table is test_cuda_compat.py)."""
import pytest
from ansible_collections.llmops.serving.plugins.plugin_utils.serving_errors import ServingError

from tests.unit.plugins.plugin_utils.serving_helpers import plan


def node(driver="550.54.14", name="NVIDIA L20", count=2):
    return {"present": True, "count": count, "driver_version": driver,
            "gpus": [{"index": i, "uuid": "GPU-%08d-aaaa-bbbb-cccc-dddddddddddd" % i, "name": name,
                      "memory_total_mib": 46068, "memory_free_mib": 46000, "compute_cap": "8.9",
                      "driver_version": driver} for i in range(count)]}


VLLM_IMAGE = {"mode": "container", "image": "vllm/vllm-openai:v0.33.0", "binary": "", "version": "0.33.0",
              "cuda_version": "13.0", "cuda_source": "image env CUDA_VERSION"}
CPP_CUDA = {"mode": "container", "image": "llmops/llama.cpp:b7-cuda89", "build_id": "b7", "version": "b7",
            "binary": "/opt/llama.cpp/bin/llama-server", "cuda_version": "12.4", "cuda_source": "nvcc"}
VLLM_INSTANCE = {"name": "q", "engine": "vllm", "model": "/m/Q", "port": 8000, "gpus": [0, 1],
                 "settings": {"tensor_parallel_size": 2}}
CPP_INSTANCE = {"name": "c", "model": "tiny", "port": 8003, "gpus": [0]}


def vplan(gpus, build=VLLM_IMAGE, **fields):
    return plan([dict(VLLM_INSTANCE, **fields)], vllm=build, gpus=gpus)[0]


def test_cuda_13_vllm_on_r550_is_refused_with_the_minimum_driver_and_the_ways_out():
    with pytest.raises(ServingError) as info:
        vplan(node("550.54.14"))
    message = str(info.value)
    assert message.startswith("instance q: CUDA 13.0 of vllm 0.33.0 needs NVIDIA driver >= 580.65.06 "
                              "(R580 or newer")
    assert "the node has 550.54.14 (R550, CUDA 12.4)" in message
    # the ways out name the configured version and claim nothing that no index or registry was asked about
    assert ("(1) a CUDA 12.x build of vLLM 0.33.0 (role vllm: vllm_cuda_variant: cu129, the image "
            "vllm/vllm-openai:v0.33.0-cu129" in message)
    assert "not checked here (no registry or index is read)" in message and "has none" not in message
    assert ("(2) a vLLM release built for CUDA 12.x (vllm_version" in message
            and "the L20 seed notes ran vLLM 0.20.1 on driver 550.54.14 (R550)" in message)
    assert "(3) install NVIDIA driver >= 580.65.06 (R580 or newer) and reboot" in message
    assert ("(4) opt in to CUDA forward compatibility (cuda-compat-13-0), which NVIDIA does not support "
            "here" in message)
    # where the runtime's CUDA was read
    assert message.endswith("(forward compatibility is opted in per instance: cuda_forward_compat: true). "
                            "CUDA 13.0 of vllm 0.33.0 is read from: image env CUDA_VERSION.")


def test_the_ways_out_name_the_configured_version():
    build = dict(VLLM_IMAGE, image="vllm/vllm-openai:v0.31.0", version="0.31.0")
    with pytest.raises(ServingError) as info:
        vplan(node("550.54.14"), build=build)
    message = str(info.value)
    assert "CUDA 13.0 of vllm 0.31.0 needs" in message and "vllm/vllm-openai:v0.31.0-cu129" in message
    assert "0.33.0-cu129" not in message


def test_cuda_13_vllm_on_r580_and_cuda_12_vllm_on_r550_are_planned():
    p = vplan(node("580.65.06"))
    assert p["cuda"]["decision"] == "ok" and p["cuda"]["minimum_driver"] == "580.65.06"
    assert p["cuda"]["source"] == "image env CUDA_VERSION" and p["warnings"] == []
    p = vplan(node("550.54.14"), build=dict(VLLM_IMAGE, image="vllm/vllm-openai:v0.32.0-cu129",
                                              version="0.32.0", cuda_version="12.9"))
    assert p["cuda"]["decision"] == "ok" and "minor-version compatibility" in p["cuda"]["message"]
    assert "VLLM_ENABLE_CUDA_COMPATIBILITY" not in p["env"]
    # the flag table was checked against 0.33.0, not 0.32.0: the plan says so (test_vllm_runtime.py)
    (table,) = p["warnings"]
    assert table.startswith("vLLM 0.32.0 runs with the flag table checked against vLLM 0.33.0 only")


@pytest.mark.parametrize("gpu_name,warned", [
    ("NVIDIA L20", ["only on the driver branches it lists (R535), not R550"]),
    ("NVIDIA GeForce RTX 4090", ["only on the driver branches it lists (R535), not R550", "GeForce cards"]),
])
def test_forward_compatibility_is_an_explicit_opt_in_per_instance(gpu_name, warned):
    p = vplan(node("550.54.14", name=gpu_name), cuda_forward_compat=True)
    assert p["cuda"]["decision"] == "forward_compat" and "cuda-compat-13-0" in p["cuda"]["message"]
    # vLLM 0.33.0 loads the compat libcuda itself when told (vllm/env_override.py)
    assert p["env"]["VLLM_ENABLE_CUDA_COMPATIBILITY"] == "1"
    assert len(p["warnings"]) == len(warned)
    for word, warning in zip(warned, p["warnings"]):  # noqa: B905
        assert word in warning
    with pytest.raises(ServingError, match="cuda_forward_compat must be true or false"):
        vplan(node(), cuda_forward_compat="yes")


def test_llama_cpp_build_facts_are_checked_the_same_way():
    cpp = plan([CPP_INSTANCE], build=CPP_CUDA, gpus=node("550.54.14"))[0]
    assert cpp["cuda"]["decision"] == "ok" and cpp["cuda"]["runtime_cuda"] == "12.4"
    with pytest.raises(ServingError, match=r"instance c: CUDA 12.4 of llama-server b7 needs NVIDIA driver >= "
                                           r"525.60.13 .*\(1\) rebuild llama.cpp with a CUDA toolkit"):
        plan([CPP_INSTANCE], build=CPP_CUDA, gpus=node("520.61.05"))
    fc = plan([dict(CPP_INSTANCE, cuda_forward_compat=True)], build=dict(CPP_CUDA, cuda_version="13.0"),
              gpus=node("535.261.03"))[0]
    assert fc["cuda"]["decision"] == "forward_compat"
    # llama.cpp has no switch of its own: the plan says what the instance's env must do
    assert fc["warnings"] == ["forward compatibility for llama.cpp: put the cuda-compat-13-0 directory first "
                              "on LD_LIBRARY_PATH in the instance's env"]


def test_what_is_not_known_is_not_checked_and_not_invented():
    cpu = plan([CPP_INSTANCE], build=dict(CPP_CUDA, cuda_version=None), gpus=node("520.61.05"))[0]
    assert cpu["cuda"]["decision"] == "unchecked" and cpu["cuda"]["runtime_cuda"] is None
    assert cpu["warnings"] == []
    no_gpus = vplan(None)
    assert no_gpus["cuda"]["decision"] == "unchecked" and "driver is not known" in no_gpus["cuda"]["message"]
    # an image override replaces the runtime the fact describes: its CUDA is not the fact's
    other = plan([dict(VLLM_INSTANCE)], vllm=VLLM_IMAGE, gpus=node("550.54.14"),
                 image_override={"vllm": "registry.lan/vllm-custom:cu124"})[0]
    assert other["cuda"]["decision"] == "unchecked"
    assert other["cuda"]["source"] == "serving_image overrides the runtime the build fact describes"
