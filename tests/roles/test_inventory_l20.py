# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""inventories/l20 reproduces the seed notes' llama-server line, setting by setting, for the pinned llama.cpp.

The seed line (tests/fixtures/seeds/000_llama_server_line.txt, copied from the user's notes with the key
redacted) was written for an older llama-server. The generated line must mean the same with current
spellings; the only differences allowed are listed in EXPECTED_REWRITES and GENERATED_EXTRAS below.
"""
import json
import os
import shlex

import pytest
import yaml
from ansible_collections.llmops.serving.plugins.plugin_utils import llama_server_flags as lsf

from tests.roles.test_serving_unit import (
    ROOT,
    directive,
    exec_start_argv,
    render_plan,
    render_unit,
    role_vars,
)

INVENTORY = os.path.join(ROOT, "inventories", "l20")
SEED = os.path.join(ROOT, "tests", "fixtures", "seeds", "000_llama_server_line.txt")
TEST_KEY = "l20-inventory-test-key-3b9d"
TEST_VLLM_KEY = "l20-inventory-vllm-key-8e1c"
MODEL_PATH = "/home/models/qwen3-27b-mtp-gguf/Qwen3.6-27B-UD-Q5_K_XL.gguf"
L20_VLLM_IMAGE = "vllm/vllm-openai:v0.33.0"
L20_GPUS = {"present": True, "count": 4, "driver_version": "550.54.14",
            "gpus": [{"index": i, "uuid": "GPU-%08x-1111-2222-3333-444444444444" % i, "name": "NVIDIA L20",
                      "memory_total_mib": 46068, "compute_cap": "8.9"} for i in range(4)]}


def seed_flags():
    """The seed line as [(flag, value or None)], comments and section titles dropped."""
    tokens = []
    with open(SEED, encoding="utf-8") as handle:
        for line in handle:
            line = line.split(" #", 1)[0].strip()
            if not line.startswith("-"):
                continue
            tokens.extend(shlex.split(line))
    out = []
    i = 0
    while i < len(tokens):
        if i + 1 < len(tokens) and not tokens[i + 1].startswith("-"):
            out.append((tokens[i], tokens[i + 1]))
            i += 2
        else:
            out.append((tokens[i], None))
            i += 1
    return out


def canonical(flag):
    spellings = lsf.known_flag_spellings()
    if flag in spellings:
        return lsf.FLAGS[spellings[flag]]["flag"]
    return flag


def argv_pairs(argv):
    out = {}
    i = 0
    while i < len(argv):
        if i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            out[argv[i]] = argv[i + 1]
            i += 2
        else:
            out[argv[i]] = None
            i += 1
    return out


def l20_vars(**overrides):
    variables = {}
    variables.update(yaml.safe_load(open(os.path.join(INVENTORY, "group_vars", "l20", "main.yml"))))
    variables.update(yaml.safe_load(open(os.path.join(INVENTORY, "host_vars", "l20-node-01.yml"))))
    variables.update({
        "vault_serving_api_keys": {"qwen36-27b": TEST_KEY, "qwen36-27b-fp8": TEST_VLLM_KEY},
        "llmops_gpus": L20_GPUS,
        # What role model publishes: the GGUF file, and the vLLM instance's checkpoint (a snapshot: its
        # directory, the link /home/models/Qwen3.6-27B-FP8 to the snapshot of one commit).
        "llmops_models": {"qwen3.6-27b-ud-q5_k_xl": {"path": MODEL_PATH, "sha256": "0f" * 32},
                          "qwen3.6-27b-fp8": {"path": "/home/models/Qwen3.6-27B-FP8",
                                              "dir": "/home/models/Qwen3.6-27B-FP8", "snapshot": True,
                                              "commit": "c0" * 20, "sha256": "1e" * 32}},
        "llmops_llama_cpp": {"mode": "container", "image": "llmops/llama.cpp:0c1e570-cuda89",
                             "build_id": "b7", "binary": "/opt/llama.cpp/bin/llama-server",
                             "version": "0.5.0-dev",
                             "previous_build_id": "b6"},
        # what role vllm publishes on the L20 box (container runtime: the official image's entrypoint)
        "llmops_vllm": {"mode": "container", "image": L20_VLLM_IMAGE, "binary": "", "version": "0.33.0",
                        "entrypoint": ["vllm", "serve"], "extra_flags": [], "env": {}},
    })
    variables.update(overrides)
    return render_plan(role_vars(variables, os_family="RedHat"), systemctl_version="systemd 219\n+PAM +AUDIT")


# seed flag -> (generated flag, generated value) when the pinned llama-server spells it differently.
EXPECTED_REWRITES = {
    "--api-key": ("--api-key-file", "/run/secrets/llama-server-api-key"),   # key by file, never argv
    "--draft-p-min": ("--spec-draft-p-min", "0.85"),                       # legacy alias
    "--no-mmap": ("--load-mode", "mlock"),                                  # --no-mmap --mlock ==
    "--mlock": ("--load-mode", "mlock"),                                    #   --load-mode mlock
    "--chat-template-kwargs": ("--reasoning", "off"),                       # enable_thinking: deprecated
}
# generated flags the seed line does not have, and why.
GENERATED_EXTRAS = {
    "--spec-draft-type-k": "q8_0",   # the MTP draft cache follows the main q8_0 cache (pinned default: f16)
    "--spec-draft-type-v": "q8_0",
    "--metrics": None,               # role default: Prometheus endpoint for validate/gateway
    # the stable served name (the model's name in llmops_models), not the GGUF file name: clients keep it
    "--alias": "qwen3.6-27b-ud-q5_k_xl",
}


def same_value(seed, generated):
    if seed == generated:
        return True
    try:
        return float(seed) == float(generated)
    except (TypeError, ValueError):
        return False


def test_l20_unit_matches_seed_line_setting_by_setting():
    variables = l20_vars()
    text = render_unit(variables)
    argv = exec_start_argv(text)
    image_at = argv.index("llmops/llama.cpp:0c1e570-cuda89")
    generated = argv_pairs(argv[image_at + 1:])
    assert len(generated) == len(argv[image_at + 1:]) - sum(1 for v in generated.values() if v is not None), \
        "a flag is given twice"

    seen = set()
    for flag, value in seed_flags():
        if flag in EXPECTED_REWRITES:
            new_flag, new_value = EXPECTED_REWRITES[flag]
            assert generated.get(new_flag) == new_value, (flag, new_flag, generated.get(new_flag))
            assert flag not in generated, "legacy/secret flag %s must not be generated" % flag
            seen.add(new_flag)
            continue
        flag = canonical(flag)
        assert flag in generated, "seed flag %s missing from the generated line" % flag
        assert same_value(value, generated[flag]), (flag, value, generated[flag])
        seen.add(flag)
    extras = set(generated) - seen
    assert extras == set(GENERATED_EXTRAS), extras
    for flag, value in GENERATED_EXTRAS.items():
        assert generated[flag] == value
    # the seed ran from a container with the model dir mounted at /models, like mode container here
    assert generated["--model"] == "/models/Qwen3.6-27B-UD-Q5_K_XL.gguf"
    assert "-v" in argv and "/home/models/qwen3-27b-mtp-gguf:/models:ro" in argv
    assert argv[argv.index("--gpus") + 1] == '"device=2,3"'
    assert "--chat-template-kwargs" not in generated


def test_every_seed_setting_has_a_variable():
    group = yaml.safe_load(open(os.path.join(INVENTORY, "group_vars", "l20", "main.yml")))
    settings = group["l20_qwen_settings"]
    instance_fields = {"--model": "model", "--host": "l20_qwen_host", "--port": "l20_qwen_port",
                       "--api-key": "vault_serving_api_keys"}
    folded = {"--no-mmap": "mmap", "--mlock": "mlock", "--draft-p-min": "spec_draft_p_min"}
    for flag, _ in seed_flags():
        flag = flag if flag in folded else canonical(flag)
        if flag in instance_fields or flag in folded:
            key = folded.get(flag)
            assert key is None or key in settings, flag
            continue
        key = lsf.known_flag_spellings()[flag]
        assert key in settings, "seed flag %s has no setting %s in l20_qwen_settings" % (flag, key)


def test_l20_host_mode_maps_gpus_2_3_and_main_gpu_0():
    variables = l20_vars(serving_mode={"llama.cpp": "host"}, llmops_llama_cpp={
        "mode": "host", "binary": "/opt/llama.cpp/builds/b7/bin/llama-server", "build_id": "b7"})
    text = render_unit(variables)
    # the node's numbers (serving_gpu_isolation off: the unit may open NVIDIA's GPU nodes, no other device)
    assert '"CUDA_VISIBLE_DEVICES=2,3"' in directive(text, "Service", "Environment")
    assert directive(text, "Service", "DeviceAllow") == ["char-nvidia* rw"]
    argv = exec_start_argv(text)
    pairs = argv_pairs(argv[1:])
    assert pairs["--main-gpu"] == "0"            # physical GPU 2 is device 0 of CUDA_VISIBLE_DEVICES=2,3
    assert pairs["--model"] == MODEL_PATH
    assert pairs["--api-key-file"] == "/etc/llama-server/qwen36-27b.key"
    assert directive(text, "Service", "LimitMEMLOCK") == ["infinity"]
    assert directive(text, "Service", "ProtectHome") == ["read-only"]     # models live in /home
    assert directive(text, "Service", "StartLimitInterval") == ["600"]    # systemd 219 spelling


def test_l20_key_only_in_vault_never_in_unit_or_plan():
    variables = l20_vars()
    text = render_unit(variables)
    assert TEST_KEY not in text
    assert TEST_KEY not in json.dumps(variables["_serving_instance_plans"])
    assert variables["_serving_instance_plans"][0]["key_file"] == "/etc/llama-server/qwen36-27b.key"


def test_l20_without_vault_refuses_open_bind():
    from ansible.errors import AnsibleError

    with pytest.raises(AnsibleError, match=r"binds 0\.0\.0\.0 without an API key"):
        l20_vars(vault_serving_api_keys={})


def test_no_real_key_committed_in_inventory():
    seed_key_prefix = "7cd5" + "aace"   # split so that this file does not carry it either
    for folder, _, files in os.walk(INVENTORY):
        for name in files:
            with open(os.path.join(folder, name), encoding="utf-8") as handle:
                assert seed_key_prefix not in handle.read(), name
    assert not os.path.exists(os.path.join(INVENTORY, "group_vars", "l20", "vault.yml")) or \
        open(os.path.join(INVENTORY, "group_vars", "l20", "vault.yml")).read().startswith("$ANSIBLE_VAULT")


def test_l20_inventory_describes_host_and_model_source():
    group = yaml.safe_load(open(os.path.join(INVENTORY, "group_vars", "l20", "main.yml")))
    hosts = yaml.safe_load(open(os.path.join(INVENTORY, "hosts.yml")))
    assert "l20-node-01" in hosts["all"]["children"]["llm_nodes"]["children"]["l20"]["hosts"]
    assert group["llama_cpp_build_mode"] == "container"
    (model,) = group["l20_models"]
    assert group["model_models"] == "{{ l20_models + ([l20_vllm_model] if l20_vllm_enabled | bool else []) }}"
    assert model["repo"] == "unsloth/Qwen3.6-27B-MTP-GGUF"
    assert model["filename"] == "Qwen3.6-27B-UD-Q5_K_XL.gguf"
    assert group["l20_models_dir"] == "/home/models/qwen3-27b-mtp-gguf"
    assert group["l20_serving_instances"][0]["model"] == model["name"]
    # The opt-in vLLM instance names its checkpoint, a snapshot the models stage fetches (no stage fetched the
    # directory it named before).
    assert group["l20_vllm_instance"]["model"] == group["l20_vllm_model"]["name"]
    assert group["l20_vllm_model"]["snapshot"] is True
    assert group["l20_vllm_model"]["dest"] == "{{ l20_vllm_model_dir }}"
