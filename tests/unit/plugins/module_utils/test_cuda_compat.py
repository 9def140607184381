# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""CUDA's compatibility rules (plugins/module_utils/_gpu/cuda_compat.py): the decision table of issue 22.

runtime CUDA {13.0, 12.9, 12.4} x driver {550.54.14 (R550, CUDA 12.4), 570.172.08 (R570, CUDA 12.8),
580.65.06 (R580, CUDA 13.0)} x GPU {NVIDIA L20 (data center), NVIDIA GeForce RTX 4090}: each cell's decision
and the words its message must carry.
"""
import pytest
from ansible_collections.llmops.serving.plugins.module_utils._gpu import cuda_compat as cc

L20 = "NVIDIA L20"
RTX4090 = "NVIDIA GeForce RTX 4090"
R550, R570, R580 = "550.54.14", "570.172.08", "580.65.06"

# (runtime, driver) -> (decision, [words in the message]); the same for both GPUs unless GPU_SPECIFIC says.
TABLE = {
    ("13.0", R550): ("refuse", ["needs NVIDIA driver >= 580.65.06 (R580 or newer",
                                "the node has 550.54.14 (R550, CUDA 12.4)",
                                "install NVIDIA driver >= 580.65.06", "cuda-compat-13-0"]),
    ("13.0", R570): ("refuse", ["needs NVIDIA driver >= 580.65.06",
                                "the node has 570.172.08 (R570, CUDA 12.8)"]),
    ("13.0", R580): ("ok", ["runs on driver 580.65.06 (R580, CUDA 13.0)", "CUDA 13.x needs >= 580.65.06"]),
    ("12.9", R550): ("ok", ["runs on driver 550.54.14", "CUDA 12.x needs >= 525.60.13",
                            "minor-version compatibility", "PTX newer than CUDA 12.4"]),
    ("12.9", R570): ("ok", ["runs on driver 570.172.08", "minor-version compatibility",
                            "PTX newer than CUDA 12.8"]),
    ("12.9", R580): ("ok", ["runs on driver 580.65.06 (R580, CUDA 13.0)", "CUDA 12.x needs >= 525.60.13"]),
    ("12.4", R550): ("ok", ["runs on driver 550.54.14 (R550, CUDA 12.4)"]),
    ("12.4", R570): ("ok", ["runs on driver 570.172.08"]),
    ("12.4", R580): ("ok", ["runs on driver 580.65.06"]),
}
# What a refusal says about forward compatibility, per GPU: NVIDIA supports it on data-center GPUs only, and
# only on the branches it lists (R535): on R550/R570 it is unsupported for both cards, for different reasons.
GPU_SPECIFIC = {
    L20: ["NVIDIA supports forward compatibility only on the driver branches it lists (R535)"],
    RTX4090: ["NVIDIA does not support forward compatibility on GeForce cards (NVIDIA GeForce RTX 4090)",
              "error 804"],
}


@pytest.mark.parametrize("gpu_name", [L20, RTX4090])
@pytest.mark.parametrize("runtime,driver", sorted(TABLE))
def test_decision_table(runtime, driver, gpu_name):
    decision, words = TABLE[(runtime, driver)]
    result = cc.decide(runtime, driver, [gpu_name], what="vLLM 0.33.0")
    assert result["decision"] == decision, result["message"]
    for word in words:
        assert word in result["message"], (word, result["message"])
    assert result["runtime_cuda"] == runtime and result["driver"] == driver
    assert result["minimum_driver"] == {"13": "580.65.06", "12": "525.60.13"}[runtime.split(".")[0]]
    assert result["warnings"] == []
    if decision == "refuse":
        for word in GPU_SPECIFIC[gpu_name]:
            assert word in result["message"], (word, result["message"])
        assert "CUDA 13.0 of vLLM 0.33.0" in result["message"]
    else:
        assert "Ways out" not in result["message"]
    if runtime == "12.4" or driver == R580:
        assert "minor-version compatibility:" not in result["message"]


def test_the_table_covers_every_cell():
    assert len(TABLE) == 9 and set(r for r, _d in TABLE) == {"13.0", "12.9", "12.4"}


def test_refusal_lists_the_engines_ways_out_first():
    result = cc.decide("13.0", R550, [L20], ways_out=["use the CUDA 12.x build of the same release"])
    message = result["message"]
    assert "Ways out: (1) use the CUDA 12.x build of the same release. (2) install NVIDIA driver" in message
    assert ("(3) opt in to CUDA forward compatibility (cuda-compat-13-0), which NVIDIA does not support"
            in message)


@pytest.mark.parametrize("gpu_name,driver,unsupported", [
    (L20, R550, ["driver branches it lists (R535), not R550"]),
    (RTX4090, R550, ["driver branches it lists (R535), not R550", "GeForce cards"]),
    (L20, "535.261.03", []),                      # R535 LTSB on a data-center GPU: supported
    (RTX4090, "535.261.03", ["GeForce cards"]),
    ("NVIDIA RTX 6000 Ada Generation", "535.261.03", ["select NGC Server Ready SKUs"]),
    ("Some Future GPU", "535.261.03", ["not one this check knows as a data-center GPU"]),
])
def test_forward_compatibility_is_an_opt_in_that_warns_where_nvidia_does_not_support_it(gpu_name, driver,
                                                                                       unsupported):
    refused = cc.decide("13.0", driver, [gpu_name])
    assert refused["decision"] == "refuse"
    if not unsupported:
        assert "NVIDIA supports it on this GPU and branch" in refused["message"]
    result = cc.decide("13.0", driver, [gpu_name], forward_compat=True)
    assert result["decision"] == "forward_compat"
    assert "cuda-compat-13-0" in result["message"] and "opted in" in result["message"]
    assert len(result["warnings"]) == len(unsupported)
    for word, warning in zip(unsupported, result["warnings"]):  # noqa: B905
        assert word in warning
    # an opt-in changes nothing where the driver already runs the runtime
    assert cc.decide("12.9", driver, [gpu_name], forward_compat=True)["decision"] == "ok"


def test_unknown_facts_are_never_guessed():
    cpu = cc.decide(None, R550, [L20], what="llama.cpp build b7")
    assert cpu["decision"] == "unchecked" and "does not say which CUDA" in cpu["message"]
    assert cpu["warnings"] == []
    no_driver = cc.decide("13.0", "", [L20])
    assert no_driver["decision"] == "unchecked" and "not known" in no_driver["message"]
    future = cc.decide("14.0", R580, [L20])
    assert future["decision"] == "unchecked" and future["warnings"] == [future["message"]]


@pytest.mark.parametrize("env,cuda", [
    (["PATH=/usr/bin", "NVIDIA_REQUIRE_CUDA=cuda>=13.0 brand=tesla,driver>=535", "CUDA_VERSION=13.0.2"],
     "13.0"),
    (["CUDA_VERSION=12.9.1"], "12.9"),
    (["NVIDIA_REQUIRE_CUDA=cuda>=12.4 brand=tesla,driver>=470,driver<471"], "12.4"),
    ({"CUDA_VERSION": "12.4.1"}, "12.4"),
    (["PATH=/usr/bin", "LANG=C.UTF-8"], None),
    ([], None),
    (None, None),
])
def test_cuda_of_an_image_from_its_environment(env, cuda):
    assert cc.cuda_from_image_env(env) == cuda


def test_cuda_of_nvcc():
    text = ("nvcc: NVIDIA (R) Cuda compiler driver\nCopyright (c) 2005-2024 NVIDIA Corporation\n"
            "Built on Thu_Mar_28_02:18:24_PDT_2024\nCuda compilation tools, release 12.4, V12.4.131\n")
    assert cc.cuda_from_nvcc(text) == "12.4"
    assert cc.cuda_from_nvcc("") is None and cc.cuda_from_nvcc(None) is None


@pytest.mark.parametrize("name,kind", [
    ("NVIDIA L20", "datacenter"), ("NVIDIA H100 80GB HBM3", "datacenter"), ("Tesla T4", "datacenter"),
    ("NVIDIA A100-SXM4-80GB", "datacenter"), ("NVIDIA L40S", "datacenter"),
    ("NVIDIA GeForce RTX 4090", "geforce"), ("NVIDIA GeForce RTX 2080 Ti", "geforce"),
    ("NVIDIA TITAN RTX", "geforce"), ("NVIDIA RTX A6000", "workstation"), ("Quadro RTX 8000", "workstation"),
    ("Mystery Accelerator", "unknown"),
])
def test_gpu_classes(name, kind):
    assert cc.gpu_class(name) == kind


def test_family_minimums_are_the_first_drivers_of_each_family():
    assert cc.FAMILY_MIN_DRIVER == {11: "450.80.02", 12: "525.60.13", 13: "580.65.06"}
    for major in (12, 13):
        first = [d for c, d in cc.CUDA_MIN_DRIVER if c.startswith("%d." % major)][0]
        assert cc.FAMILY_MIN_DRIVER[major] == first
    assert cc.minimum_driver("12.9.1") == "525.60.13" and cc.minimum_driver("13") == "580.65.06"
    assert cc.min_driver_for_cuda("12.9") == "575.51.03"      # the toolkit's own driver, not the minimum
