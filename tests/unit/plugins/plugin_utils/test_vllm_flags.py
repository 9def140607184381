# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""vLLM's flag table (plugins/plugin_utils/vllm_flags.py) against the pinned wheel and the seed 003 unit."""
import json
import os
import shlex

import pytest
from ansible_collections.llmops.serving.plugins.plugin_utils import vllm_flags
from ansible_collections.llmops.serving.plugins.plugin_utils.vllm_flags import VllmArgsError, build_argv

from tests.fixtures.vllm import vllm_cli
from tests.helpers import FIXTURES

SEED_UNIT = os.path.join(FIXTURES, "seeds", "003_vllm_unit.service")
JSON_FLAGS = ("--reasoning-config", "--default-chat-template-kwargs", "--additional-config",
              "--speculative-config", "--compilation-config", "--override-generation-config")

# The seed 003 unit (vLLM 0.24 fork) as instance settings. --device-ids is an option of 0.33.0 as well, but
# the serving layer owns the GPUs: the instance's gpus [0, 1] become CUDA_VISIBLE_DEVICES instead.
SEED_SETTINGS = {
    "dtype": "half",
    "tensor_parallel_size": 2,
    "quantization": "fp8",
    "kv_cache_dtype": "fp8_e4m3",
    "max_model_len": 100000,
    "enable_prefix_caching": True,
    "max_num_seqs": 1,
    "max_num_batched_tokens": 4096,
    "enable_chunked_prefill": True,
    "async_scheduling": False,
    "skip_mm_profiling": True,
    "reasoning_parser": "qwen3",
    # the seed's default_thinking_token_budget: 4000 is not a key of vLLM 0.33.0's ReasoningConfig (see
    # SEED_REASONING_CONFIG); the budget is a per-request parameter there
    "reasoning_config": {"reasoning_start_str": "<think>", "reasoning_end_str": "</think>"},
    "default_chat_template_kwargs": {"enable_thinking": True},
    "enable_auto_tool_choice": True,
    "tool_call_parser": "qwen3_coder",
    "chat_template_content_format": "string",
    "gpu_memory_utilization": 0.92,
    "additional_config": {"gdn_prefill_backend": "flashqla_legacy"},
    "speculative_config": {"method": "mtp", "num_speculative_tokens": 3},
    "compilation_config": {"cudagraph_mode": "PIECEWISE", "cudagraph_capture_sizes": [4],
                           "max_cudagraph_capture_size": 4},
    "override_generation_config": {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "min_p": 0.0,
                                   "presence_penalty": 0.0, "repetition_penalty": 1.06},
    "cpu_offload_gb": 0,
    "disable_uvicorn_access_log": True,
}
SEED_MODEL = "/home/zyyuc/models/Qwen3.6-27B-DSV4Pro-Thinking-FP8"
# The seed's --reasoning-config as it stands in the unit: refused by vLLM 0.33.0 (and so by the plan).
SEED_REASONING_CONFIG = {"reasoning_start_str": "<think>", "reasoning_end_str": "</think>",
                         "default_thinking_token_budget": 4000}


def argv_for(settings, **kwargs):
    """build_argv with a plain instance (model m on 127.0.0.1:8000, served as m) unless `kwargs` say."""
    for key, value in (("model", "m"), ("host", "127.0.0.1"), ("port", 8000), ("served_model_name", "m")):
        kwargs.setdefault(key, value)
    return build_argv(settings, **kwargs)


def seed_exec_start():
    """The seed unit's ExecStart as an argv (continuation lines joined, shell-style quoting)."""
    with open(SEED_UNIT) as handle:
        text = handle.read().replace("\\\n", " ")
    line = next(line for line in text.splitlines() if line.startswith("ExecStart="))
    return shlex.split(line[len("ExecStart="):])


def options_of(argv):
    """argv -> [(flag, [values])] in order; the positional model is returned as ("<model>", [path])."""
    out = []
    for arg in argv:
        if arg.startswith("--"):
            out.append((arg, []))
        elif out:
            out[-1][1].append(arg)
        else:
            out.append(("<model>", [arg]))
    return out


def comparable(flag, values):
    if flag in JSON_FLAGS:
        return [json.loads(v) for v in values]
    return values


def seed_flags():
    argv = seed_exec_start()
    start = argv.index("vllm.entrypoints.openai.api_server") + 1
    return [flag for flag, _ in options_of(argv[start:])]


@pytest.fixture(scope="module")
def pinned_options():
    try:
        return vllm_cli.cached_options()["options"]
    except vllm_cli.WheelUnavailable as exc:
        pytest.skip("the pinned vLLM wheel cannot be obtained here (%s); CI fetches it" % exc)


def test_seed_flags_all_exist_in_the_pinned_vllm(pinned_options):
    # --model is the one seed spelling that `vllm serve` deprecates: it becomes the positional argument.
    missing = [f for f in seed_flags() if f not in pinned_options]
    assert missing == []
    assert "--model" in vllm_flags.DEPRECATED_FLAGS


def test_emitted_flags_are_options_of_the_pinned_vllm(pinned_options):
    assert sorted(set(vllm_flags.emitted_flags()) - set(pinned_options)) == []


def test_booleans_and_choices_match_the_pinned_vllm(pinned_options):
    for key, spec in vllm_flags.FLAGS.items():
        extracted = pinned_options[spec["flag"]]
        if spec["kind"] == "bool":
            assert extracted["kind"] == "bool", key
        elif spec["kind"] == "switch":
            assert extracted["kind"] == "switch", key
        else:
            assert extracted["kind"] == "value", key
        if spec["choices"]:
            assert set(spec["choices"]) <= set(extracted["choices"] or ()), key


def test_embedded_option_list_is_the_pinned_wheels(pinned_options):
    """PINNED_VLLM_OPTIONS (used to check extra_args) is regenerated with `vllm_cli --names`."""
    assert vllm_flags.PINNED_VLLM_OPTIONS == frozenset(pinned_options)


def test_refused_old_options_are_gone_from_the_pinned_vllm(pinned_options):
    for flag in list(vllm_flags.RENAMED_FLAGS) + list(vllm_flags.REMOVED_FLAGS):
        assert flag not in pinned_options, flag
    for flag in vllm_flags.DEPRECATED_FLAGS:
        assert flag in pinned_options, flag     # still parsed, but refused with the replacement


def test_seed_unit_renders_option_by_option():
    seed = seed_exec_start()
    seed_options = options_of(seed[seed.index("vllm.entrypoints.openai.api_server") + 1:])
    argv = argv_for(SEED_SETTINGS, model=SEED_MODEL, host="0.0.0.0", served_model_name="qwen-local")
    ours = dict((f, comparable(f, v)) for f, v in options_of(argv))
    assert ours.pop("<model>") == [SEED_MODEL]
    theirs = dict((f, comparable(f, v)) for f, v in seed_options)
    assert theirs.pop("--model") == [SEED_MODEL]          # the positional of `vllm serve` now
    assert theirs.pop("--device-ids") == ["0,1"]          # the instance's gpus -> CUDA_VISIBLE_DEVICES
    # the one key vLLM 0.33.0 would refuse at start (test_seed_reasoning_config_is_refused_at_plan_time)
    assert theirs["--reasoning-config"] == [SEED_REASONING_CONFIG]
    theirs["--reasoning-config"][0].pop("default_thinking_token_budget")
    assert ours == theirs


def test_seed_reasoning_config_is_refused_at_plan_time():
    settings = dict(SEED_SETTINGS, reasoning_config=SEED_REASONING_CONFIG)
    with pytest.raises(VllmArgsError) as info:
        argv_for(settings)
    message = str(info.value)
    assert ("setting reasoning_config: reasoning_config.default_thinking_token_budget is not a field of "
            "vLLM 0.33.0's ReasoningConfig, which refuses unknown keys at start") in message
    assert "clients send thinking_token_budget in each request" in message
    assert message.endswith("Its fields: reasoning_end_str, reasoning_parser, reasoning_start_str")


# --- JSON settings against vLLM's own config classes --------------------------------------------------------

@pytest.fixture(scope="module")
def pinned_configs():
    try:
        return vllm_cli.cached_options()["configs"]
    except vllm_cli.WheelUnavailable as exc:
        pytest.skip("the pinned vLLM wheel cannot be obtained here (%s); CI fetches it" % exc)


def _embedded_classes():
    out = {}
    for name, (extra, plain, nested) in vllm_flags.PINNED_VLLM_CONFIGS["classes"].items():
        fields = dict((field, None) for field in plain.split())
        fields.update(nested)
        out[name] = {"extra": extra, "fields": fields}
    return out


def test_embedded_config_table_is_the_pinned_wheels(pinned_configs):
    """PINNED_VLLM_CONFIGS (used to check JSON settings) is regenerated with `vllm_cli --configs`."""
    json_flags = [spec["flag"] for spec in vllm_flags.FLAGS.values() if spec["kind"] == "json"]
    wheel_options = dict((f, c) for f, c in pinned_configs["options"].items() if f in json_flags)
    assert vllm_flags.PINNED_VLLM_CONFIGS["options"] == wheel_options
    embedded = _embedded_classes()
    for name, entry in embedded.items():
        wheel = pinned_configs["classes"][name]
        assert entry == {"extra": wheel["extra"], "fields": wheel["fields"]}, name
    # every class a field of an embedded class holds is embedded too
    assert set(n for e in embedded.values() for n in e["fields"].values() if n) <= set(embedded)


def test_json_settings_without_a_config_class_are_free_form_in_the_wheel(pinned_configs):
    for key, spec in vllm_flags.FLAGS.items():
        if spec["kind"] == "json" and spec["flag"] not in vllm_flags.PINNED_VLLM_CONFIGS["options"]:
            assert spec["flag"] not in pinned_configs["options"], key      # a dict: any key goes


def test_the_wheels_config_classes_forbid_unknown_keys(pinned_configs):
    # vllm/config/utils.py: the `config` decorator merges ConfigDict(extra="forbid") first
    for flag in ("--reasoning-config", "--compilation-config", "--speculative-config"):
        assert pinned_configs["classes"][pinned_configs["options"][flag]]["extra"] == "forbid"
    assert sorted(pinned_configs["classes"]["ReasoningConfig"]["fields"]) == [
        "reasoning_end_str", "reasoning_parser", "reasoning_start_str"]
    # a field(init=False) cannot be passed: not listed
    assert "local_cache_dir" not in pinned_configs["classes"]["CompilationConfig"]["fields"]
    assert "cudagraph_mode" in pinned_configs["classes"]["CompilationConfig"]["fields"]


def test_unknown_keys_of_json_settings_are_refused_with_the_allowed_keys():
    with pytest.raises(VllmArgsError, match=r"compilation_config\.cudagraph_modes is not a field of vLLM "
                                            r"0\.33\.0's CompilationConfig.*Its fields: backend, "):
        argv_for({"compilation_config": {"cudagraph_modes": "PIECEWISE"}})
    with pytest.raises(VllmArgsError, match=r"compilation_config\.pass_config\.fuse_everything is not a "
                                            r"field of vLLM 0\.33\.0's PassConfig"):
        argv_for({"compilation_config": {"pass_config": {"fuse_everything": True}}})
    with pytest.raises(VllmArgsError, match=r"speculative_config\.num_tokens is not a field"):
        argv_for({"speculative_config": {"method": "mtp", "num_tokens": 3}})
    # vLLM turns '-' into '_' in speculative_config's keys; free-form settings take any key
    argv = argv_for({"speculative_config": {"method": "mtp", "num-speculative-tokens": 3},
                     "additional_config": {"anything": 1}, "hf_overrides": {"rope_theta": 1e6},
                     "compilation_config": {"cudagraph_mode": "PIECEWISE",
                                            "pass_config": {"fuse_norm_quant": True}}})
    assert "--additional-config" in argv and "--compilation-config" in argv


def test_device_ids_are_the_instances_gpus():
    with pytest.raises(VllmArgsError, match="set the instance's gpus"):
        argv_for({"device_ids": [0, 1]})
    with pytest.raises(VllmArgsError, match="set the instance's gpus"):
        vllm_flags.check_extra_args(["--device-ids", "0,1"])
    with pytest.raises(VllmArgsError, match="VLLM_API_KEY"):
        argv_for({}, api_key_file="/k")


def test_json_options_are_compact_sorted_json():
    argv = argv_for({"speculative_config": {"num_speculative_tokens": 3, "method": "mtp"}})
    assert argv[argv.index("--speculative-config") + 1] == '{"method":"mtp","num_speculative_tokens":3}'
    with pytest.raises(VllmArgsError, match="YAML mapping"):
        argv_for({"compilation_config": '{"cudagraph_mode": "PIECEWISE"}'})


def test_booleans_render_the_flag_or_its_negative():
    argv = argv_for({"async_scheduling": False, "enable_prefix_caching": True, "disable_log_stats": False})
    assert "--no-async-scheduling" in argv and "--enable-prefix-caching" in argv
    assert "--disable-log-stats" not in argv
    with pytest.raises(VllmArgsError, match="true or false"):
        argv_for({"trust_remote_code": "yes"})


def test_host_port_and_names_come_from_the_instance():
    argv = argv_for({}, model="/models/q", port=8001, served_model_name=["qwen", "qwen-alias"])
    assert argv == ["/models/q", "--host", "127.0.0.1", "--port", "8001",
                    "--served-model-name", "qwen", "qwen-alias"]
    for key in ("host", "port", "served_model_name"):
        with pytest.raises(VllmArgsError, match="instance field"):
            argv_for({key: "x"})
    with pytest.raises(VllmArgsError, match="bind every interface"):
        argv_for({}, host="")


@pytest.mark.parametrize("extra", [["--api-key", "sk-1"], ["--api-key=sk-1"], ["--hf-token", "hf_x"]])
def test_secrets_are_refused(extra):
    with pytest.raises(VllmArgsError, match="never go on a command line"):
        argv_for({}, extra_args=extra)
    with pytest.raises(VllmArgsError, match="VLLM_API_KEY"):
        argv_for({"api_key": "sk-1"})


@pytest.mark.parametrize("flag,hint", [
    ("--disable-log-requests", "--no-enable-log-requests"),
    ("--num-speculative-tokens", "speculative_config"),
    ("--swap-space", "nothing"),
    ("--mamba-cache-mode", "enable-prefix-caching"),
    ("--model", "positional"),
])
def test_old_options_are_refused_with_the_replacement(flag, hint):
    with pytest.raises(VllmArgsError, match=hint):
        vllm_flags.check_extra_args([flag, "1"])


def test_settings_named_after_old_options_get_the_replacement():
    with pytest.raises(VllmArgsError, match="max-cudagraph-capture-size"):
        argv_for({"max_seq_len_to_capture": 4})


def test_extra_args_of_the_pinned_vllm_pass_and_managed_ones_are_refused():
    extra = ["--disable-sliding-window", "--otlp_traces_endpoint=http://127.0.0.1:4317"]
    assert vllm_flags.check_extra_args(extra) == extra
    with pytest.raises(VllmArgsError, match="setting `compilation_config`"):
        vllm_flags.check_extra_args(["--compilation-config.cudagraph_mode", "PIECEWISE"])
    with pytest.raises(VllmArgsError, match="setting `tensor_parallel_size`"):
        vllm_flags.check_extra_args(["--tensor_parallel_size", "2"])


def test_a_forks_own_flags_need_the_allow_list():
    with pytest.raises(VllmArgsError, match="llmops_vllm.extra_flags"):
        vllm_flags.check_extra_args(["--flashqla-mode", "legacy"])
    extra = ["--flashqla-mode", "legacy"]
    assert vllm_flags.check_extra_args(extra, allowed_extra_flags=["--flashqla-mode"]) == extra


# --- preflight on a Ray cluster ---------------------------------------------------------------------------

def _cluster(*counts):
    return {"group": "ray_cluster",
            "nodes": [{"host": "n%d" % i, "num_gpus": c} for i, c in enumerate(counts)]}


def test_ray_cluster_tp_times_pp_is_the_clusters_gpus_not_the_instances():
    settings = {"tensor_parallel_size": 4, "pipeline_parallel_size": 2, "distributed_executor_backend": "ray"}
    assert vllm_flags.preflight(settings, [0, 1, 2, 3], [], cluster=_cluster(4, 4)) == []
    with pytest.raises(vllm_flags.VllmArgsError,
                       match=r"ray_cluster ray_cluster: tensor_parallel_size x pipeline_parallel_size = "
                             r"4 x 2 = 8, but ray_cluster ray_cluster declares 12 GPU\(s\) to Ray "
                             r"\(n0 4, n1 4, n2 4\): they must be equal; use tensor_parallel_size 4 "
                             r"\(the GPUs of one node\) and "
                             r"pipeline_parallel_size 3 \(the nodes\)"):
        vllm_flags.preflight(settings, [0, 1, 2, 3], [], cluster=_cluster(4, 4, 4))


def test_ray_cluster_keeps_tensor_parallel_within_a_node_and_one_stage_per_node():
    with pytest.raises(vllm_flags.VllmArgsError,
                       match=r"tensor_parallel_size 8 is more than the GPUs n0, n1 declare\(s\) to Ray "
                             r"\(n0 4, n1 4\): tensor parallelism stays within a node .*lower "
                             r"tensor_parallel_size to at most 4 and raise pipeline_parallel_size"):
        vllm_flags.preflight({"tensor_parallel_size": 8}, [0, 1, 2, 3], [], cluster=_cluster(4, 4))
    with pytest.raises(vllm_flags.VllmArgsError,
                       match=r"pipeline_parallel_size 4 is more than the 2 node\(s\) of ray_cluster "
                             r"ray_cluster \(n0, n1\): one pipeline stage per node"):
        vllm_flags.preflight({"tensor_parallel_size": 2, "pipeline_parallel_size": 4}, [0, 1, 2, 3], [],
                             cluster=_cluster(4, 4))
    with pytest.raises(vllm_flags.VllmArgsError, match=r"different GPU counts \(n0 4, n1 2\)"):
        vllm_flags.preflight({"tensor_parallel_size": 2, "pipeline_parallel_size": 2}, [0, 1], [],
                             cluster=_cluster(4, 2))


def test_ray_cluster_with_unknown_gpus_is_a_warning_never_a_guess():
    cluster = {"group": "rc", "nodes": [{"host": "head", "num_gpus": 4}, {"host": "w1", "num_gpus": None}]}
    (warning,) = vllm_flags.preflight({"tensor_parallel_size": 4, "pipeline_parallel_size": 2}, [0, 1, 2, 3],
                                      [], cluster=cluster)
    assert "GPUs of w1 are not known" in warning and "= 8 is not checked" in warning
    (warning,) = vllm_flags.preflight({"tensor_parallel_size": 4, "pipeline_parallel_size": 2}, [0, 1, 2, 3],
                                      [], cluster={"group": "rc", "nodes": None})
    assert "nodes are not known here" in warning
    with pytest.raises(vllm_flags.VllmArgsError, match="more than the 4 GPU"):
        vllm_flags.preflight({"tensor_parallel_size": 8}, [0, 1, 2, 3], [],
                             cluster={"group": "rc", "nodes": None})


def test_single_node_ray_backend_keeps_the_instances_gpu_rule():
    settings = {"tensor_parallel_size": 2, "distributed_executor_backend": "ray"}
    assert vllm_flags.preflight(settings, [0, 1], []) == []
    with pytest.raises(vllm_flags.VllmArgsError, match=r"= 2, but the instance has 4 GPU"):
        vllm_flags.preflight(settings, [0, 1, 2, 3], [])
    argv = vllm_flags.build_argv(settings, model="/m", host="127.0.0.1", port=8000, served_model_name="m")
    assert argv[argv.index("--distributed-executor-backend") + 1] == "ray"
