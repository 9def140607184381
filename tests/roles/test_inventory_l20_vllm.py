# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""inventories/l20's vLLM instance (GPUs 0 and 1, beside the llama.cpp one on 2 and 3): opt-in, because the
pinned vLLM 0.33.0 is a CUDA 13.0 build and the box runs driver 550.54.14 (CUDA 12.4). Its plan and unit,
rendered through the same helpers as tests/roles/test_inventory_l20.py: the real CUDA decision on R550, the
unit on a driver that runs it, and every difference from seed 003's unit with its reason.
"""
import json
import os
import shlex

import yaml

from tests.roles.test_inventory_l20 import INVENTORY, L20_GPUS, L20_VLLM_IMAGE, TEST_VLLM_KEY, l20_vars
from tests.roles.test_serving_env_secrets import render_env_file
from tests.roles.test_serving_unit import directive, exec_start_argv, render_unit
from tests.unit.plugins.plugin_utils.test_vllm_flags import (
    SEED_REASONING_CONFIG,
    SEED_UNIT,
    comparable,
    options_of,
    seed_exec_start,
)

VLLM_INDEX = 1
MODEL_DIR = "/home/models/Qwen3.6-27B-FP8"
# What role vllm publishes on the L20 box for the pinned image: the official image is built FROM nvidia/cuda
# 13.0 (CUDA_VERSION in its environment), read with docker image inspect.
PINNED_IMAGE_FACT = {"mode": "container", "image": L20_VLLM_IMAGE, "binary": "", "version": "0.33.0",
                     "entrypoint": ["vllm", "serve"], "extra_flags": [], "env": {},
                     "cuda_version": "13.0", "cuda_source": "image %s environment" % L20_VLLM_IMAGE}
R580_GPUS = dict(L20_GPUS, driver_version="580.65.06")


def enabled(**overrides):
    overrides.setdefault("llmops_vllm", PINNED_IMAGE_FACT)
    return l20_vars(l20_vllm_enabled=True, **overrides)


def vllm_plan(variables):
    plan = variables["_serving_instance_plans"][VLLM_INDEX]
    assert plan["engine"] == "vllm"
    return plan


def test_the_vllm_instance_is_opt_in_and_why():
    group = yaml.safe_load(open(os.path.join(INVENTORY, "group_vars", "l20", "main.yml")))
    assert group["l20_vllm_enabled"] is False
    assert group["vllm_runtime"] == "container"             # CentOS 7.9: glibc 2.17, python 3.6
    text = open(os.path.join(INVENTORY, "group_vars", "l20", "main.yml")).read()
    assert "Why the vLLM instance below is opt-in" in text and "needs driver >= 580.65.06" in text
    # facts read in the wheel, and the user's own evidence that a CUDA 12.x vLLM runs on R550
    comments = " ".join(line.strip("# ") for line in text.splitlines() if line.startswith("#"))
    assert "links libcudart.so.13" in comments and "the seed notes ran vLLM 0.20.1 on this box" in comments
    assert "has no CUDA 12.x build" not in comments
    (llama,) = l20_vars(llmops_vllm=PINNED_IMAGE_FACT)["_serving_instance_plans"]
    assert llama["engine"] == "llama.cpp"


def test_enabled_on_r550_the_pinned_cuda_13_image_is_left_out_and_llama_cpp_planned():
    """The serve stage's check (the image's own CUDA): the vLLM instance is left out with the ways out, the
    llama.cpp one is planned (preflight's check before any pull: tests/roles/test_preflight_runtime.py)."""
    variables = enabled()
    (llama,) = variables["_serving_instance_plans"]
    assert llama["engine"] == "llama.cpp" and llama["gpus"] == [2, 3]
    (refused,) = variables["_serving_refused"]
    assert refused["name"] == "qwen36-27b-fp8" and refused["model"] == "qwen3.6-27b-fp8"
    message = " ".join(refused["message"].split())
    assert ("instance qwen36-27b-fp8: CUDA 13.0 of vllm 0.33.0 needs NVIDIA driver >= 580.65.06 (R580 or "
            "newer: CUDA 13.x minor-version compatibility starts there), but the node has 550.54.14 (R550, "
            "CUDA 12.4)") in message
    assert "a CUDA 12.x build of vLLM 0.33.0" in message and "the L20 seed notes ran vLLM 0.20.1" in message
    assert "is read from: image vllm/vllm-openai:v0.33.0 environment" in message
    assert ("NVIDIA supports forward compatibility only on the driver branches it lists (R535), not R550"
            in message)


def test_enabled_with_forward_compat_is_planned_with_nvidias_objection():
    instance = dict(yaml.safe_load(open(os.path.join(INVENTORY, "group_vars", "l20", "main.yml")))
                    ["l20_vllm_instance"], cuda_forward_compat=True)
    plan = vllm_plan(enabled(l20_vllm_instance=instance))
    assert plan["cuda"]["decision"] == "forward_compat"
    assert plan["warnings"] == ["forward compatibility for CUDA 13.0 on driver 550.54.14: NVIDIA supports "
                                "forward compatibility only on the driver branches it lists (R535), not R550"]
    assert plan["env"]["VLLM_ENABLE_CUDA_COMPATIBILITY"] == "1"


def test_enabled_with_a_cuda_12_build_on_r550_is_planned():
    cu129 = dict(PINNED_IMAGE_FACT, image="vllm/vllm-openai:v0.32.0-cu129", version="0.32.0",
                 cuda_version="12.9")
    plan = vllm_plan(enabled(llmops_vllm=cu129))
    assert plan["cuda"]["decision"] == "ok" and "minor-version compatibility" in plan["cuda"]["message"]
    # the flag table was checked against 0.33.0: the plan says that 0.32.0's options are not checked
    (table,) = plan["warnings"]
    assert table.startswith("vLLM 0.32.0 runs with the flag table checked against vLLM 0.33.0 only")
    assert "--speculative-config" in table and "--reasoning-config" in table


def test_l20_vllm_plan_on_gpus_0_1_beside_llama_cpp_on_2_3():
    variables = enabled(llmops_gpus=R580_GPUS)
    llama, vllm = variables["_serving_instance_plans"]
    assert llama["engine"] == "llama.cpp" and llama["gpus"] == [2, 3]
    assert vllm["gpus"] == [0, 1]
    assert vllm["mode"] == "container" and vllm["image"] == L20_VLLM_IMAGE
    assert vllm["unit"] == "vllm-qwen36-27b-fp8.service"
    assert vllm["url"] == "http://127.0.0.1:8000"          # loopback: vLLM's key leaves /metrics open
    assert vllm["served_model_name"] == ["qwen3.6-27b-fp8", "qwen-local"]
    assert vllm["model_check"] == MODEL_DIR + "/config.json"
    assert vllm["api_key_env"] == "VLLM_API_KEY" and vllm["key_file"] is None
    assert vllm["cuda"]["decision"] == "ok" and vllm["cuda"]["driver"] == "580.65.06"
    assert vllm["warnings"] == []                          # FP8 on sm_89 is native; R580 runs CUDA 13.0
    assert TEST_VLLM_KEY not in json.dumps(variables["_serving_instance_plans"])


def test_l20_vllm_unit_key_lines():
    variables = enabled(llmops_gpus=R580_GPUS)
    text = render_unit(variables, index=VLLM_INDEX)
    argv = exec_start_argv(text)
    assert argv[argv.index("--gpus") + 1] == '"device=0,1"'
    assert "%s:/models:ro" % os.path.dirname(MODEL_DIR) in argv
    assert argv[argv.index("--env-file") + 1] == "/etc/llama-server/qwen36-27b-fp8.env"
    assert "--api-key" not in argv and TEST_VLLM_KEY not in text
    assert directive(text, "Service", "Restart") == ["always"]
    assert directive(text, "Service", "TimeoutStartSec") == ["1800"]
    assert "docker.service" in directive(text, "Unit", "Requires")[0]
    (check,) = directive(text, "Service", "ExecStartPre")[1:]
    assert check.endswith("nvidia-smi -i 0,1 --query-gpu=index --format=csv,noheader")


def test_l20_vllm_key_from_vault_in_env_file_only():
    variables = enabled(llmops_gpus=R580_GPUS)
    env_text = render_env_file(variables, index=VLLM_INDEX)
    assert "VLLM_API_KEY=%s" % TEST_VLLM_KEY in env_text      # docker --env-file: no quoting
    example = yaml.safe_load(open(os.path.join(INVENTORY, "group_vars", "l20", "vault.yml.example")))
    assert "qwen36-27b-fp8" in example["vault_serving_api_keys"]


# --- seed 003 against the project's render, difference by difference ------------------------------------

SEED_MODEL = "/home/zyyuc/models/Qwen3.6-27B-DSV4Pro-Thinking-FP8"
BUDGETLESS = dict((k, v) for k, v in SEED_REASONING_CONFIG.items() if k != "default_thinking_token_budget")
# option -> (the seed's values, ours, why). None: the option is absent. Every other option of either side
# must be equal.
SEED_003_OPTION_DIFFERENCES = {
    "<model>": (
        [SEED_MODEL], ["/models/Qwen3.6-27B-FP8"],
        "`vllm serve` takes the model as its positional argument (--model is deprecated in 0.33.0); the "
        "container sees /home/models at /models (read-only); the L20 example serves the FP8 checkpoint "
        "Qwen3.6-27B-FP8, the seed its DSV4Pro-Thinking fine-tune"),
    "--host": (
        ["0.0.0.0"], ["127.0.0.1"],
        "vLLM's API key guards only /v1, /v2 and /inference: loopback unless the gateway fronts it "
        "(serving_fronted_by_proxy) or accept_exposure is set"),
    "--served-model-name": (
        ["qwen-local"], ["qwen3.6-27b-fp8", "qwen-local"],
        "restored: the seed's clients ask for qwen-local; the stable name comes first (the health check and "
        "the gateway use it)"),
    "--dtype": (["half"], None, "the 2080 Ti (sm_75) has no bf16; the L20 uses the checkpoint's bf16"),
    "--device-ids": (
        ["0,1"], None, "the instance's gpus: docker --gpus device=0,1 (the process sees only them)"),
    "--max-num-seqs": (
        ["1"], None, "an 11 GB 2080 Ti had room for one sequence; vLLM's default on 48 GB L20s"),
    "--no-async-scheduling": (
        [], None,
        "the fork's SM75 speculative-decoding sync workaround (VLLM_SM75_SPEC_SYNC_MODE); vLLM 0.33.0 turns "
        "async scheduling off by itself for speculative methods that need it (vllm/config/vllm.py)"),
    "--skip-mm-profiling": (
        [], None,
        "saved memory on 11 GB cards; on 48 GB the multimodal profile reserves the encoder's memory, so an "
        "image request cannot run the GPU out of memory later"),
    "--reasoning-config": (
        [SEED_REASONING_CONFIG], [BUDGETLESS],
        "vLLM 0.33.0's ReasoningConfig has no default_thinking_token_budget and refuses unknown keys at "
        "start; clients send thinking_token_budget per request"),
    "--additional-config": (
        [{"gdn_prefill_backend": "flashqla_legacy"}], None,
        "the fork's FlashQLA prefill backend for SM70/SM75 (PYTHONPATH FlashQLA-SM70-SM75); upstream vLLM "
        "has its own kernels for sm_89"),
    "--compilation-config": (
        [{"cudagraph_mode": "PIECEWISE", "cudagraph_capture_sizes": [4], "max_cudagraph_capture_size": 4}],
        None,
        "one piecewise CUDA graph of size 4 fitted max_num_seqs 1 on 11 GB cards; vLLM's default graphs on "
        "the L20"),
    "--cpu-offload-gb": (["0"], None, "0 is vLLM's default"),
}
# [Service] lines of the seed unit that the project's unit does not have (or has otherwise), and why.
SEED_003_ENVIRONMENT = {
    "CUDA_HOME": "the image carries its CUDA; nothing on the host is used",
    "PATH": "the image's vllm entrypoint; no host virtualenv",
    "LD_LIBRARY_PATH": "the image's CUDA libraries and the host driver (NVIDIA container runtime)",
    "PYTHONPATH": "the fork's FlashQLA kernels for SM70/SM75",
    "HF_ENDPOINT": "vLLM loads a local model directory; the models stage downloads (llmops_mirrors.hf)",
    "VLLM_USE_DEEP_GEMM": "DeepGEMM runs on Hopper and Blackwell only (vllm/utils/deep_gemm.py): unused on "
                          "sm_89",
    "OMP_NUM_THREADS": "vLLM 0.33.0 picks the workers' thread count itself when unset "
                       "(vllm/v1/executor/multiproc_executor.py)",
    "VLLM_USE_FLASHINFER_SAMPLER": "turned off for the seed's SM75 FlashInfer build (its ExecStartPre checks "
                                   "flashinfer PR 3621 for sm75); vLLM's default on sm_89",
    "VLLM_QWOPUS_MTP_BF16_DRAFT": "a switch of the fork, not in vLLM 0.33.0 (vllm/envs.py)",
    "VLLM_SM75_SPEC_SYNC_MODE": "a switch of the fork, not in vLLM 0.33.0 (vllm/envs.py)",
}
SEED_003_SERVICE = {
    "User": ("zyyuc", None, "the container runs as the serving user (docker run --user)"),
    "WorkingDirectory": ("/home/zyyuc/vllm-2080ti-0.24.0-qwopus", "/var/lib/llama-server", "the fork's tree"),
    "ExecStartPre": ("/home/zyyuc/check-flashinfer-pr3621-sm75.sh", None,
                     "the fork's FlashInfer check; the unit checks the instance's GPUs instead"),
    "TimeoutStartSec": ("900", "1800", "loading, torch.compile and CUDA graph capture of 27B on two GPUs"),
    "StandardOutput": ("append:/home/zyyuc/vllm-0240-main-8000.log", None, "the journal (journalctl -u)"),
    "StandardError": ("append:/home/zyyuc/vllm-0240-main-8000.log", None, "the journal (journalctl -u)"),
}


def seed_service():
    """The seed unit's [Service] directives: {key: [values]} (ExecStart left out, compared option-wise)."""
    out = {}
    section = None
    with open(SEED_UNIT) as handle:
        text = handle.read().replace("\\\n", " ")
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("["):
            section = line
        elif section == "[Service]" and "=" in line and not line.startswith("#"):
            key, value = line.split("=", 1)
            out.setdefault(key, []).append(value)
    return out


def test_seed_003_differences_each_with_its_reason():
    theirs = seed_exec_start()
    theirs = dict((f, comparable(f, v)) for f, v in options_of(theirs[theirs.index(
        "vllm.entrypoints.openai.api_server") + 1:]))
    theirs["<model>"] = theirs.pop("--model")
    argv = exec_start_argv(render_unit(enabled(llmops_gpus=R580_GPUS), index=VLLM_INDEX))
    ours = dict((f, comparable(f, v)) for f, v in options_of(argv[argv.index(L20_VLLM_IMAGE) + 1:]))
    found = {}
    for flag in sorted(set(theirs) | set(ours)):
        if theirs.get(flag) != ours.get(flag):
            found[flag] = (theirs.get(flag), ours.get(flag))
    assert found == dict((f, (s, o)) for f, (s, o, _why) in SEED_003_OPTION_DIFFERENCES.items())
    assert all(why for _s, _o, why in SEED_003_OPTION_DIFFERENCES.values())
    # what the seed had that stays, restored where it had been dropped
    for flag in ("--disable-uvicorn-access-log", "--max-model-len", "--enable-prefix-caching",
                 "--speculative-config", "--tool-call-parser", "--override-generation-config"):
        assert ours[flag] == theirs[flag], flag
    assert ours["--max-model-len"] == ["100000"]


def test_seed_003_unit_lines_each_with_its_reason():
    seed = seed_service()
    text = render_unit(enabled(llmops_gpus=R580_GPUS), index=VLLM_INDEX)
    environment = dict(line.split("=", 1) for line in seed.pop("Environment"))
    assert sorted(environment) == sorted(SEED_003_ENVIRONMENT)
    ours_env = dict(line.split("=", 1) for line in directive(text, "Service", "Environment"))
    assert not set(ours_env) & set(environment)
    assert seed.pop("ExecStart")
    for key, (theirs, ours, why) in SEED_003_SERVICE.items():
        assert seed.pop(key) == [theirs], key
        if key == "ExecStartPre":
            assert theirs not in " ".join(directive(text, "Service", key))
        else:
            assert directive(text, "Service", key) == ([ours] if ours else []), key
        assert why
    # the rest is the same: Type=simple, Restart=always, RestartSec=10
    for key, values in seed.items():
        assert directive(text, "Service", key) == values, key
    assert sorted(seed) == ["Restart", "RestartSec", "Type"]


def test_the_seed_unit_file_is_the_users():
    with open(SEED_UNIT) as handle:
        text = handle.read()
    line = next(line for line in text.replace("\\\n", " ").splitlines() if line.startswith("ExecStart="))
    assert "--disable-uvicorn-access-log" in shlex.split(line)
