# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""inventories/l20's vLLM instance (GPUs 0 and 1, beside the llama.cpp one on 2 and 3): its plan and unit,
rendered through the same helpers as tests/roles/test_inventory_l20.py, say what seed 003 says for the FP8
checkpoint, run from the pinned image (CentOS 7.9), on loopback, with the key only in its env file.
"""
import json
import os

import yaml

from tests.roles.test_inventory_l20 import INVENTORY, L20_VLLM_IMAGE, TEST_VLLM_KEY, l20_vars
from tests.roles.test_serving_env_secrets import render_env_file
from tests.roles.test_serving_unit import directive, exec_start_argv, render_unit
from tests.unit.plugins.plugin_utils.test_vllm_flags import SEED_SETTINGS, comparable, options_of

VLLM_INDEX = 1
MODEL_DIR = "/home/models/Qwen3.6-27B-FP8"


def vllm_plan(variables):
    plan = variables["_serving_plan"][VLLM_INDEX]
    assert plan["engine"] == "vllm"
    return plan


def test_l20_vllm_plan_on_gpus_0_1_beside_llama_cpp_on_2_3():
    variables = l20_vars()
    llama, vllm = variables["_serving_plan"]
    assert llama["engine"] == "llama.cpp" and llama["gpus"] == [2, 3]
    assert vllm["gpus"] == [0, 1]
    assert vllm["mode"] == "container" and vllm["image"] == L20_VLLM_IMAGE
    assert vllm["unit"] == "vllm-qwen36-27b-fp8.service"
    assert vllm["url"] == "http://127.0.0.1:8000"          # loopback: vLLM's key leaves /metrics open
    assert vllm["served_model_name"] == "qwen3.6-27b-fp8"
    assert vllm["model_check"] == MODEL_DIR + "/config.json"
    assert vllm["api_key_env"] == "VLLM_API_KEY" and vllm["key_file"] is None
    assert vllm["warnings"] == []                          # FP8 on sm_89 is native
    assert TEST_VLLM_KEY not in json.dumps(variables["_serving_plan"])


def test_l20_vllm_unit_key_lines():
    variables = l20_vars()
    text = render_unit(variables, index=VLLM_INDEX)
    argv = exec_start_argv(text)
    image_at = argv.index(L20_VLLM_IMAGE)
    assert argv[argv.index("--gpus") + 1] == '"device=0,1"'
    assert "%s:/models:ro" % os.path.dirname(MODEL_DIR) in argv
    assert argv[argv.index("--env-file") + 1] == "/etc/llama-server/qwen36-27b-fp8.env"
    ours = dict((f, comparable(f, v)) for f, v in options_of(argv[image_at + 1:]))
    assert ours.pop("<model>") == ["/models/Qwen3.6-27B-FP8"]
    assert ours["--host"] == ["127.0.0.1"] and ours["--port"] == ["8000"]
    assert ours["--served-model-name"] == ["qwen3.6-27b-fp8"]
    # seed 003's options, as the seed gives them
    for key in ("tensor_parallel_size", "quantization", "kv_cache_dtype", "speculative_config",
                "reasoning_parser", "tool_call_parser", "default_chat_template_kwargs",
                "override_generation_config", "chat_template_content_format", "max_num_batched_tokens"):
        flag = "--" + key.replace("_", "-")
        value = SEED_SETTINGS[key]
        assert ours[flag] == ([value] if isinstance(value, dict) else [str(value)]), flag
    for flag in ("--enable-prefix-caching", "--enable-chunked-prefill", "--enable-auto-tool-choice"):
        assert ours[flag] == [], flag
    assert ours["--speculative-config"] == [{"method": "mtp", "num_speculative_tokens": 3}]
    assert "--api-key" not in ours and TEST_VLLM_KEY not in text
    assert directive(text, "Service", "Restart") == ["always"]
    assert directive(text, "Service", "TimeoutStartSec") == ["1800"]
    assert "docker.service" in directive(text, "Unit", "Requires")[0]
    (check,) = directive(text, "Service", "ExecStartPre")[1:]
    assert check.endswith("nvidia-smi -i 0,1 --query-gpu=index --format=csv,noheader")


def test_l20_vllm_key_from_vault_in_env_file_only():
    variables = l20_vars()
    env_text = render_env_file(variables, index=VLLM_INDEX)
    assert "VLLM_API_KEY=%s" % TEST_VLLM_KEY in env_text      # docker --env-file: no quoting
    example = yaml.safe_load(open(os.path.join(INVENTORY, "group_vars", "l20", "vault.yml.example")))
    assert "qwen36-27b-fp8" in example["vault_serving_api_keys"]


def test_l20_vllm_runtime_is_the_pinned_image():
    group = yaml.safe_load(open(os.path.join(INVENTORY, "group_vars", "l20", "main.yml")))
    assert group["vllm_runtime"] == "container"             # CentOS 7.9: glibc 2.17, python 3.6
