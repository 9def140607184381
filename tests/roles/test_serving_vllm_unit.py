# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The serving role's unit for a vLLM instance, rendered for the seed 003 settings and compared, option by
option, with the seed's production unit (tests/fixtures/seeds/003_vllm_unit.service).

Paths and the user may differ; every other line of the seed must match, or be listed in DIFFERENCES with
the reason it is different.
"""
import os
import shlex

from tests.helpers import FIXTURES
from tests.roles.test_serving_env_secrets import parse_systemd_env_file, render_env_file
from tests.roles.test_serving_unit import directive, exec_start_argv, render_plan, render_unit, role_vars
from tests.unit.plugins.plugin_utils.test_vllm_flags import (
    SEED_MODEL,
    SEED_REASONING_CONFIG,
    SEED_SETTINGS,
    comparable,
    options_of,
)

SEED_UNIT = os.path.join(FIXTURES, "seeds", "003_vllm_unit.service")
VLLM = {"mode": "host", "binary": "/opt/vllm/venv/bin/vllm", "version": "0.33.0"}
GPUS_2080TI = {"present": True, "gpus": [{"index": i, "uuid": "GPU-%d" % i, "compute_cap": "7.5",
                                          "memory_total_mib": 11264, "memory_free_mib": 11000}
                                         for i in range(2)]}
KEY = "vllm-unit-test-key-51d0"

# Seed line -> why the generated unit differs (anything not listed must be identical).
DIFFERENCES = {
    "--host": "loopback by default: vLLM's key leaves /metrics, /pause, ... open (0.0.0.0 needs "
              "serving_fronted_by_proxy or accept_exposure)",
    "--model": "positional argument of `vllm serve` (--model is deprecated)",
    "python -m vllm.entrypoints.openai.api_server": "`<llmops_vllm.binary> serve` (that entrypoint is "
                                                    "deprecated)",
    "--device-ids": "the instance's gpus -> CUDA_VISIBLE_DEVICES=0,1 (one way for both engines)",
    "--reasoning-config": "without default_thinking_token_budget: vLLM 0.33.0's ReasoningConfig has no such "
                          "key and refuses unknown keys at start (the plan refuses it first); clients send "
                          "thinking_token_budget per request",
    "StandardOutput": "the journal (the health gate prints this start's lines from it)",
    "StandardError": "the journal",
    "ExecStartPre": "the role's GPU check (nvidia-smi -i 0,1); the seed's fork-specific flashinfer check "
                    "script is the operator's to add",
    "Description": "names the engine, instance, model and port",
    "Environment": "the seed's variables are the instance's env (0600 env file); the unit sets only "
                   "CUDA_VISIBLE_DEVICES, VLLM_ENGINE_READY_TIMEOUT_S and the LLMOPS_* markers",
}


def seed_unit():
    with open(SEED_UNIT) as handle:
        text = handle.read().replace("\\\n", " ")
    lines = [line.strip() for line in text.splitlines() if "=" in line and not line.startswith("#")]
    return [tuple(line.split("=", 1)) for line in lines]


def seed_env():
    return dict(v.split("=", 1) for k, v in seed_unit() if k == "Environment")


def seed_vars(**extra):
    instance = {"name": "qwen-local", "engine": "vllm", "model": SEED_MODEL,
                "served_model_name": "qwen-local", "gpus": [0, 1], "port": 8000, "settings": SEED_SETTINGS,
                "env": seed_env()}
    variables = {"serving_instances": [instance], "llmops_vllm": VLLM, "llmops_gpus": GPUS_2080TI,
                 "serving_api_keys": {"qwen-local": KEY}, "llmops_models": {},
                 "serving_timeout_start_sec": {"llama.cpp": 900, "vllm": 900}}
    variables.update(extra)
    return render_plan(role_vars(variables))


def test_seed_unit_option_by_option():
    variables = seed_vars()
    text = render_unit(variables)
    seed = dict((k, v) for k, v in seed_unit() if k != "Environment")
    for key in ("Restart", "RestartSec", "TimeoutStartSec", "Type", "WantedBy"):
        assert directive(text, "Service" if key != "WantedBy" else "Install", key) == [seed[key]], key
    assert "network-online.target" in directive(text, "Unit", "After")[0]
    assert directive(text, "Unit", "Wants") == [seed["Wants"]]
    (check,) = directive(text, "Service", "ExecStartPre")
    assert check.endswith("nvidia-smi -i 0,1 --query-gpu=index --format=csv,noheader")
    for key in ("StandardOutput", "StandardError"):
        assert directive(text, "Service", key) == [], DIFFERENCES[key]

    argv = exec_start_argv(text)
    assert argv[:3] == [VLLM["binary"], "serve", SEED_MODEL], DIFFERENCES["--model"]
    seed_argv = shlex.split(seed["ExecStart"])
    seed_opts = dict((f, comparable(f, v)) for f, v in options_of(seed_argv[3:]))
    ours = dict((f, comparable(f, v)) for f, v in options_of(argv[2:]))
    assert ours.pop("<model>") == seed_opts.pop("--model")
    assert seed_opts.pop("--host") == ["0.0.0.0"]
    assert ours.pop("--host") == ["127.0.0.1"], DIFFERENCES["--host"]
    assert seed_opts.pop("--device-ids") == ["0,1"]
    env = directive(text, "Service", "Environment")
    assert '"CUDA_VISIBLE_DEVICES=0,1"' in env, DIFFERENCES["--device-ids"]
    assert '"VLLM_ENGINE_READY_TIMEOUT_S=900"' in env          # vLLM waits as long as systemd does
    assert seed_opts.pop("--reasoning-config") == [SEED_REASONING_CONFIG]
    budgetless = dict(SEED_REASONING_CONFIG)
    budgetless.pop("default_thinking_token_budget")
    assert ours.pop("--reasoning-config") == [budgetless], DIFFERENCES["--reasoning-config"]
    assert ours == seed_opts

    # the seed's Environment= lines: every one reaches vLLM, from the 0600 env file
    env_file = parse_systemd_env_file(render_env_file(variables))
    for name, value in seed_env().items():
        assert env_file[name] == value, name
    assert env_file["VLLM_API_KEY"] == KEY
    assert KEY not in text and "--api-key" not in argv


def test_fp8_on_the_seeds_2080ti_is_reported():
    (plan,) = seed_vars()["_serving_instance_plans"]
    assert plan["warnings"] and "weight-only/emulated" in plan["warnings"][0]


def test_vllm_defaults_are_long_starts_and_restart_always():
    variables = seed_vars(serving_timeout_start_sec={"llama.cpp": 900, "vllm": 1800})
    text = render_unit(variables)
    assert directive(text, "Service", "TimeoutStartSec") == ["1800"]
    assert '"VLLM_ENGINE_READY_TIMEOUT_S=1800"' in directive(text, "Service", "Environment")
    assert directive(text, "Service", "Restart") == ["always"]
    assert directive(text, "Service", "LimitMEMLOCK") == []
