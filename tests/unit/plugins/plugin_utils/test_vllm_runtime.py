# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""An engine runtime against the node's driver before anything is pulled or downloaded (issue 35, point 2),
and the flag tables against the engine versions they were checked against (point 3).

* vllm_flags.planned_runtime: the CUDA of the vLLM role vllm will install, from the variant's name or from the
  table of default builds read in their wheels (RELEASE_CUDA, read again from the real wheel below).
* instance_plan.runtime_refusals / without_refused / models_in_use / driver_after_gpu_stage: which instances
  preflight leaves out, and which models with them; the others stay.
* flag_table.FlagTable.version_warning through each engine's version_warning.
"""
import re
import zipfile

import pytest
from ansible_collections.llmops.serving.plugins.plugin_utils import instance_plan, vllm_flags
from ansible_collections.llmops.serving.plugins.plugin_utils import llama_server_flags as lsf
from ansible_collections.llmops.serving.plugins.plugin_utils.serving_errors import VllmArgsError

from tests.fixtures.vllm import vllm_cli
from tests.unit.plugins.plugin_utils.serving_helpers import plan

# --- the CUDA of the vLLM that will be installed ---------------------------------------------------------


def test_the_pinned_default_build_is_cuda_13_from_the_wheels_own_files():
    runtime = vllm_flags.planned_runtime("0.33.0")
    assert runtime["cuda_version"] == "13.0" and runtime["version"] == "0.33.0"
    assert "libcudart.so.13" in runtime["cuda_source"] and "torch==2.14.0" in runtime["cuda_source"]
    assert vllm_flags.planned_runtime("0.33.0", mode="venv")["mode"] == "host"


@pytest.mark.parametrize("variant,cuda", [("cu129", "12.9"), ("cu130", "13.0"), ("cu126", "12.6"),
                                          ("cu118", "11.8")])
def test_a_variant_states_its_cuda_by_its_name(variant, cuda):
    runtime = vllm_flags.planned_runtime("0.32.0", variant)
    assert runtime["cuda_version"] == cuda
    assert runtime["cuda_source"] == "the variant name %s (vLLM names its CUDA %s build so)" % (variant, cuda)


@pytest.mark.parametrize("variant", ["cuda12", "cu12", "cu1290", "cu129\n", "rocm"])
def test_a_name_that_is_not_a_cuda_variant_is_refused(variant):
    with pytest.raises(VllmArgsError, match="is not a CUDA variant name such as cu129"):
        vllm_flags.planned_runtime("0.32.0", variant)


def test_a_release_whose_default_build_was_not_read_is_not_guessed():
    runtime = vllm_flags.planned_runtime("0.32.0")
    assert runtime["cuda_version"] is None
    assert runtime["cuda_source"].startswith("vLLM 0.32.0's default build is not in the table of builds read "
                                             "from their wheels (0.33.0)")


def test_a_wheel_file_and_a_source_tree():
    wheel = vllm_flags.planned_runtime(
        "0.33.0", wheel="/srv/vllm-0.32.0+cu129-cp38-abi3-manylinux_2_28_x86_64.whl")
    assert wheel["version"] == "0.32.0+cu129" and wheel["cuda_version"] == "12.9"
    plain = vllm_flags.planned_runtime("0.1.0", wheel="vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl")
    assert plain["version"] == "0.33.0" and plain["cuda_version"] == "13.0"
    tree = vllm_flags.planned_runtime("0.24.0", source_dir="/home/u/vllm-fork")
    assert tree["cuda_version"] is None and "source tree" in tree["cuda_source"]


@pytest.fixture(scope="module")
def pinned_wheel():
    try:
        return vllm_cli.find_wheel(download=False)
    except vllm_cli.WheelUnavailable as exc:
        pytest.skip("the pinned vLLM wheel cannot be obtained here (%s); CI fetches it" % exc)


def test_release_cuda_is_what_the_pinned_wheel_states(pinned_wheel):
    """RELEASE_CUDA['0.33.0'] and its evidence, read again in the wheel: the libcudart its extension links,
    the torch and cu13 pins of its METADATA, vllm/envs.py's VLLM_MAIN_CUDA_VERSION."""
    version = vllm_cli.VLLM_VERSION
    entry = vllm_flags.RELEASE_CUDA[version]
    with zipfile.ZipFile(pinned_wheel) as wheel:
        metadata = wheel.read("vllm-%s.dist-info/METADATA" % version).decode("utf-8")
        envs = wheel.read("vllm/envs.py").decode("utf-8")
        with wheel.open("vllm/_C_stable_libtorch.abi3.so") as lib:
            linked = set()
            tail = b""
            for block in iter(lambda: lib.read(1 << 20), b""):
                linked.update(re.findall(rb"libcudart\.so\.([0-9]+)", tail + block))
                tail = block[-32:]
    assert linked == {entry["cuda"].split(".")[0].encode()}
    assert "libcudart.so.%s" % entry["cuda"].split(".")[0] in entry["evidence"]
    torch = re.search(r"^Requires-Dist: torch==([0-9.]+)$", metadata, re.M).group(1)
    assert "torch==%s" % torch in entry["evidence"]
    assert re.search(r"^Requires-Dist: nvidia-cutlass-dsl\[cu13\]", metadata, re.M)
    main_cuda = r'os\.getenv\("VLLM_MAIN_CUDA_VERSION", ""\)\.lower\(\) or "%s"' % re.escape(entry["cuda"])
    assert re.search(main_cuda, envs)


# --- which instances preflight leaves out ----------------------------------------------------------------

def node(driver="550.54.14", present=True):
    return {"present": present, "count": 4, "driver_version": driver if present else "",
            "gpus": [{"index": i, "uuid": "GPU-%08d-aaaa-bbbb-cccc-dddddddddddd" % i, "name": "NVIDIA L20",
                      "memory_total_mib": 46068, "compute_cap": "8.9"} for i in range(4)] if present else []}


LLAMA = {"name": "qwen36-27b", "model": "qwen3.6-27b-ud-q5_k_xl", "gpus": [2, 3], "port": 8003}
VLLM = {"name": "qwen36-27b-fp8", "engine": "vllm", "model": "qwen3.6-27b-fp8", "gpus": [0, 1], "port": 8000}
INSTANCES = [LLAMA, VLLM]


def refused(instances=INSTANCES, vllm=None, gpus=None, **kw):
    builds = {"vllm": vllm_flags.planned_runtime("0.33.0") if vllm is None else vllm}
    return instance_plan.runtime_refusals(instances, builds=builds, gpus=node() if gpus is None else gpus,
                                          **kw)


def test_on_r550_the_cuda_13_vllm_instance_is_refused_and_the_llama_cpp_one_kept():
    (entry,) = refused()
    assert (entry["name"], entry["engine"], entry["model"]) == ("qwen36-27b-fp8", "vllm", "qwen3.6-27b-fp8")
    message = " ".join(entry["message"].split())
    assert message.startswith("instance qwen36-27b-fp8: CUDA 13.0 of vllm 0.33.0 needs NVIDIA driver >= "
                              "580.65.06 (R580 or newer")
    assert "the node has 550.54.14 (R550, CUDA 12.4)" in message
    assert ("is read from: the vllm-0.33.0 wheel's vllm/_C_stable_libtorch.abi3.so links libcudart.so.13"
            in message)
    assert instance_plan.without_refused(INSTANCES, [entry]) == [LLAMA]


def test_on_r580_or_with_a_cuda_12_build_nothing_is_refused():
    assert refused(gpus=node("580.65.06")) == []
    assert refused(vllm=vllm_flags.planned_runtime("0.32.0", "cu129")) == []
    # a release whose CUDA only its image will state: left to the serve stage, never guessed here
    assert refused(vllm=vllm_flags.planned_runtime("0.32.0")) == []


def test_the_driver_that_counts_is_the_one_after_the_gpu_host_stage():
    after = instance_plan.driver_after_gpu_stage(node("550.54.14"), "580.95.05", True)
    assert after == "580.95.05" and refused(driver=after) == []
    # the driver role does not manage the driver: the one the node runs now
    kept = instance_plan.driver_after_gpu_stage(node("550.54.14"), "580.95.05", False)
    assert kept == "550.54.14" and len(refused(driver=kept)) == 1
    # the inventory pins R550 while R580 runs now: the stage installs R550, so the vLLM instance is refused
    down = instance_plan.driver_after_gpu_stage(node("580.65.06"), "550.54.14", True)
    assert down == "550.54.14" and len(refused(gpus=node("580.65.06"), driver=down)) == 1
    # a bare node (no driver yet): the pinned one decides
    bare = instance_plan.driver_after_gpu_stage(node(present=False), "550.54.14", True)
    assert bare == "550.54.14" and len(refused(gpus=node(present=False), driver=bare)) == 1
    assert instance_plan.driver_after_gpu_stage(node(present=False), "", True) == ""
    assert refused(gpus=node(present=False), driver="") == []         # no driver known: not checked


def test_forward_compat_and_an_image_override_are_not_refused():
    assert refused([LLAMA, dict(VLLM, cuda_forward_compat=True)]) == []
    assert refused(image_override={"vllm": "registry.lan/vllm-custom:cu124"}) == []


def test_only_the_models_that_only_refused_instances_serve_are_left_out():
    models = [{"name": "qwen3.6-27b-ud-q5_k_xl"}, {"name": "qwen3.6-27b-fp8"}, {"name": "spare"}]
    entry = refused()
    assert instance_plan.models_in_use(models, INSTANCES, entry) == [models[0], models[2]]
    shared = [LLAMA, dict(VLLM, model="qwen3.6-27b-ud-q5_k_xl")]
    assert instance_plan.models_in_use(models, shared, refused(shared)) == models
    assert instance_plan.models_in_use(models, INSTANCES, []) == models
    # the instances may already be without the refused one (preflight.yml filters after role serving did)
    assert instance_plan.models_in_use(models, [LLAMA], entry) == [models[0], models[2]]


def test_the_final_report_names_each_refused_instance_with_its_ways_out():
    report = instance_plan.refusal_report(refused())
    assert report.startswith("1 instance(s) not deployed in this run, the others were: "
                             "[qwen36-27b-fp8 (vllm)] instance qwen36-27b-fp8: CUDA 13.0 of vllm 0.33.0 "
                             "needs")
    assert "Ways out: (1) a CUDA 12.x build of vLLM 0.33.0" in report
    assert report.endswith("Take one of the ways out and run again.")


# --- the flag tables against the versions they were checked against ---------------------------------------

def test_the_vllm_table_names_the_versions_it_was_checked_against():
    assert vllm_flags.CHECKED_VERSIONS == ("0.33.0",)
    assert vllm_flags.version_warning("0.33.0", ["--port", "8000"]) is None
    assert vllm_flags.version_warning("0.33.0+cu130", ["--port", "8000"]) is None
    warning = vllm_flags.version_warning("0.32.0", ["/models/m", "--port", "8000", "--kv-cache-dtype=fp8"])
    assert warning == (
        "vLLM 0.32.0 runs with the flag table checked against vLLM 0.33.0 only: an option that 0.32.0 lacks "
        "or spells otherwise stops it at start (the health gate then keeps the running unit). Check the "
        "options this instance renders against its --help: --kv-cache-dtype, --port")
    for other in ("0.34.0", "0.20.1"):                 # newer and older alike
        assert vllm_flags.version_warning(other, []).startswith("vLLM %s runs with the flag table" % other)
    unknown = vllm_flags.version_warning("", [])
    assert unknown.startswith("a vLLM whose version is not known runs with the flag")


def test_the_llama_server_table_names_the_commit_it_was_checked_against():
    pinned = lsf.PINNED_LLAMA_CPP["commit"]
    assert lsf.TABLE.checked_versions == (pinned,)
    assert lsf.version_warning("0.5.0-dev (build 1, commit %s)" % pinned[:7], []) is None
    assert lsf.version_warning("6000 (%s)" % pinned[:8], []) is None
    other = lsf.version_warning("0.5.0-dev (build 9, commit abcdef1)", ["--port", "8003"])
    assert other.startswith("llama-server abcdef1 runs with the flag table checked against llama-server %s "
                            "only" % pinned)
    assert other.endswith("its --help: --port")
    assert lsf.version_warning("0.5.0-dev", []) is None              # no commit named: nothing to compare


def test_the_plan_warns_about_another_vllm_version_and_not_about_the_checked_one():
    build = {"mode": "container", "image": "vllm/vllm-openai:v0.33.0", "version": "0.33.0"}
    instance = {"name": "q", "engine": "vllm", "model": "/m/Q", "port": 8000}
    assert plan([instance], vllm=build)[0]["warnings"] == []
    (warning,) = plan([instance], vllm=dict(build, version="0.32.0"))[0]["warnings"]
    assert warning.startswith("vLLM 0.32.0 runs with the flag table checked against vLLM 0.33.0 only")
    assert "--served-model-name" in warning
