# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""vLLM's command line, in one table, for the pinned vLLM version.

This file is the ONLY place in the collection that knows how `vllm serve` spells an option. Instance settings
(a dict such as ``{"tensor_parallel_size": 2, "speculative_config": {"method": "mtp"}}``) are turned into the
arguments after ``vllm serve`` by :func:`build_argv`; extra_args are checked (secrets, removed and renamed
options, options the table manages, options the pinned vLLM does not have); the mechanics shared with
llama-server's table are flag_table.py; the engine's checks against its GPUs and Ray cluster (preflight) are
vllm_preflight.py. Controller-only (plugin_utils), unit-tested without Ansible by
tests/unit/plugins/plugin_utils/test_vllm_flags.py.

Pinned engine: vLLM 0.33.0 (the seed unit ran a 0.24.0 fork); :data:`CHECKED_VERSIONS` names the versions
the table was checked against, and a runtime of another version is planned with a warning
(:func:`version_warning`). :data:`RELEASE_CUDA` holds the CUDA each release's default build states in its
wheel, which preflight compares with the node's driver before anything is pulled (:func:`planned_runtime`).
Checked against the option set that
tests/fixtures/vllm/vllm_cli.py extracts from the vllm-0.33.0 wheel's own argparse definitions
(EngineArgs.add_cli_args, FrontendArgs, make_arg_parser), read with `ast`, never imported. Every option of the
seed unit exists in 0.33.0 under the same spelling, ``--device-ids`` included (upstream since the fork); the
table absorbs these differences from older command lines:

* ``python -m vllm.entrypoints.openai.api_server --model M`` is deprecated: the argv here is for
  ``vllm serve M`` (the model is the positional argument, ``--model`` is refused).
* JSON options (``--speculative-config``, ``--compilation-config``, ...) come from YAML mappings, dumped
  with sorted keys and no spaces, never hand-quoted.
* Options of older vLLM that are gone or only warn are refused with their replacement (:data:`RENAMED_FLAGS`,
  :data:`REMOVED_FLAGS`, :data:`DEPRECATED_FLAGS`).
"""
from __future__ import absolute_import, division, print_function

import re
from collections import OrderedDict

from ansible_collections.llmops.serving.plugins.plugin_utils.flag_table import (
    FlagTable,
    compact_json,
    entry,
    without_none,
)
from ansible_collections.llmops.serving.plugins.plugin_utils.serving_errors import VllmArgsError, is_number
from ansible_collections.llmops.serving.plugins.plugin_utils.vllm_preflight import (  # noqa: F401  pylint: disable=unused-import
    preflight,  # the engine's GPU and Ray layout checks, which instance_plan calls
)

__metaclass__ = type

PINNED_VLLM = {
    "version": "0.33.0",
    "wheel": "vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl",
}
# The vLLM releases this table (FLAGS, PINNED_VLLM_OPTIONS, PINNED_VLLM_CONFIGS) was checked against, option
# by option, in their wheels (tests/fixtures/vllm/vllm_cli.py). Another version is rendered with it but
# warned about (flag_table.FlagTable.version_warning): an option it lacks stops vLLM at start.
CHECKED_VERSIONS = (PINNED_VLLM["version"],)
# The CUDA release of vLLM's default (unsuffixed) build, per release, as read in that release's wheel
# (tests/unit/plugins/plugin_utils/test_vllm_runtime.py reads them again from the wheel): what preflight
# compares with the node's driver before the image is pulled. A release not listed here is not guessed: its
# CUDA is read from the image or the virtualenv after the build stage (llmops_vllm.cuda_version).
RELEASE_CUDA = {
    "0.33.0": {
        "cuda": "13.0",
        "evidence": "the vllm-0.33.0 wheel's vllm/_C_stable_libtorch.abi3.so links libcudart.so.13, its "
                    "METADATA pins torch==2.14.0 and nvidia-cutlass-dsl[cu13], and vllm/envs.py defaults "
                    "VLLM_MAIN_CUDA_VERSION to 13.0",
    },
}
# vLLM names each CUDA build it publishes beside the default one by its CUDA release: cu129 is CUDA 12.9
# (wheel <version>+cu129 on https://wheels.vllm.ai/<version>/cu129, image vllm/vllm-openai:v<version>-cu129;
# vLLM PR #39878 made CUDA 13.0 the default build and 12.9 the cu129 variant). Whether a release has a variant
# is not checked here: no index or registry is read.
VARIANT_RE = re.compile(r"cu([0-9]{3})\Z")
# The vLLM the L20 seed notes ran on that box's driver (550.54.14, R550): a CUDA 12.x vLLM runs on R550.
SEED_CUDA12_RELEASE = "0.20.1"
# vLLM 0.33.0 (vllm/env_override.py) puts a CUDA forward-compatibility libcuda first on LD_LIBRARY_PATH before
# torch loads when VLLM_ENABLE_CUDA_COMPATIBILITY=1: VLLM_CUDA_COMPATIBILITY_PATH, else
# /usr/local/cuda-<torch's CUDA>/compat when it exists.
FORWARD_COMPAT_ENV = {"VLLM_ENABLE_CUDA_COMPATIBILITY": "1"}
# What the engine-neutral planner (instance_plan.py) needs to know of this engine's command line (see its
# docstring); the rest is the engine's descriptor, plugins/module_utils/engines.py.
PROGRAM = "vllm"
ROLE = "serving"
# Loading, torch.compile and CUDA graph capture of a 27B model on two GPUs take many minutes.
TIMEOUT_START_SEC = 1800
# Host mode runs `<llmops_vllm.binary> serve ...`; the official vllm-openai image's entrypoint is
# `vllm serve` already.
SUBCOMMAND = ("serve",)
# Tensor-parallel workers share tensors through /dev/shm: the container needs the host's IPC namespace.
CONTAINER_ARGS = ("--ipc", "host")
# vLLM reads its key from the environment (0600 env file: engines.VLLM.key_variable), and guards only these
# paths with it.
KEY_GUARDED_PATHS = "/v1, /v2 and /inference"
OPEN_PATHS = "/metrics, /invocations, /pause, /update_weights and the other paths"
# vLLM's own wait for its engine core (vllm/envs.py of the pinned wheel, default 600 s): the unit sets it to
# TimeoutStartSec so a long CUDA graph capture is not cut short by vLLM before systemd gives up.
READY_TIMEOUT_ENV = "VLLM_ENGINE_READY_TIMEOUT_S"


# Rows are flag_table.entry (kinds documented there); a "bool" of vLLM is argparse.BooleanOptionalAction,
# whose negative is always --no-<flag>.
def _f(flag, kind="value", choices=None, help_text=""):
    negative = "--no-" + flag[2:] if kind == "bool" else None
    return entry(flag, kind, negative=negative, choices=choices, help_text=help_text)


# Grouped as vLLM's own --help groups them; the argv follows this order.
FLAGS = OrderedDict([
    # --- managed by the serving layer (instance fields, not settings) --------------------------------
    ("host", _f("--host", help_text="bind address (instance field `host`), always rendered")),
    ("port", _f("--port", help_text="TCP port (instance field `port`)")),
    ("served_model_name", _f("--served-model-name", "nargs",
                             help_text="stable name(s) for clients (instance field, default: model name)")),
    # --- ModelConfig ---------------------------------------------------------------------------------
    ("tokenizer", _f("--tokenizer")),
    ("tokenizer_mode", _f("--tokenizer-mode")),
    ("revision", _f("--revision")),
    ("dtype", _f("--dtype", "choice", choices=("auto", "bfloat16", "float", "float16", "float32", "half"))),
    ("seed", _f("--seed")),
    ("trust_remote_code", _f("--trust-remote-code", "bool")),
    ("max_model_len", _f("--max-model-len")),
    ("quantization", _f("--quantization", help_text="fp8, awq, gptq, ... (plugins may add methods)")),
    ("enforce_eager", _f("--enforce-eager", "bool")),
    ("max_logprobs", _f("--max-logprobs")),
    ("hf_overrides", _f("--hf-overrides", "json", help_text="e.g. rope_scaling, rope_theta")),
    ("generation_config", _f("--generation-config")),
    ("override_generation_config", _f("--override-generation-config", "json")),
    # --- LoadConfig ----------------------------------------------------------------------------------
    ("load_format", _f("--load-format")),
    ("download_dir", _f("--download-dir")),
    ("safetensors_load_strategy", _f("--safetensors-load-strategy")),
    # --- StructuredOutputsConfig ---------------------------------------------------------------------
    ("reasoning_parser", _f("--reasoning-parser")),
    # --- ParallelConfig ------------------------------------------------------------------------------
    ("distributed_executor_backend", _f("--distributed-executor-backend")),
    ("pipeline_parallel_size", _f("--pipeline-parallel-size")),
    ("tensor_parallel_size", _f("--tensor-parallel-size")),
    ("data_parallel_size", _f("--data-parallel-size")),
    ("enable_expert_parallel", _f("--enable-expert-parallel", "bool")),
    ("disable_custom_all_reduce", _f("--disable-custom-all-reduce", "bool")),
    # --- CacheConfig ---------------------------------------------------------------------------------
    ("block_size", _f("--block-size")),
    ("gpu_memory_utilization", _f("--gpu-memory-utilization")),
    ("kv_cache_memory_bytes", _f("--kv-cache-memory-bytes")),
    ("kv_cache_dtype", _f("--kv-cache-dtype", help_text="auto, fp8, fp8_e4m3, fp8_e5m2, ...")),
    ("enable_prefix_caching", _f("--enable-prefix-caching", "bool")),
    ("kv_offloading_size", _f("--kv-offloading-size")),
    # --- OffloadConfig -------------------------------------------------------------------------------
    ("cpu_offload_gb", _f("--cpu-offload-gb")),
    # --- MultiModalConfig ----------------------------------------------------------------------------
    ("language_model_only", _f("--language-model-only", "bool")),
    ("limit_mm_per_prompt", _f("--limit-mm-per-prompt", "json")),
    ("mm_processor_cache_gb", _f("--mm-processor-cache-gb")),
    ("skip_mm_profiling", _f("--skip-mm-profiling", "bool")),
    # --- SchedulerConfig -----------------------------------------------------------------------------
    ("max_num_batched_tokens", _f("--max-num-batched-tokens")),
    ("max_num_seqs", _f("--max-num-seqs")),
    ("long_prefill_token_threshold", _f("--long-prefill-token-threshold")),
    ("enable_chunked_prefill", _f("--enable-chunked-prefill", "bool")),
    ("async_scheduling", _f("--async-scheduling", "bool")),
    # --- CompilationConfig ---------------------------------------------------------------------------
    ("cudagraph_capture_sizes", _f("--cudagraph-capture-sizes", "nargs")),
    ("max_cudagraph_capture_size", _f("--max-cudagraph-capture-size")),
    # --- VllmConfig (JSON) ---------------------------------------------------------------------------
    ("speculative_config", _f("--speculative-config", "json")),
    ("kv_transfer_config", _f("--kv-transfer-config", "json")),
    ("compilation_config", _f("--compilation-config", "json")),
    ("attention_config", _f("--attention-config", "json")),
    ("reasoning_config", _f("--reasoning-config", "json")),
    ("additional_config", _f("--additional-config", "json")),
    ("structured_outputs_config", _f("--structured-outputs-config", "json")),
    ("optimization_level", _f("--optimization-level")),
    # --- Frontend ------------------------------------------------------------------------------------
    ("chat_template", _f("--chat-template")),
    ("chat_template_content_format", _f("--chat-template-content-format", "choice",
                                        choices=("auto", "openai", "string"))),
    ("default_chat_template_kwargs", _f("--default-chat-template-kwargs", "json")),
    ("enable_auto_tool_choice", _f("--enable-auto-tool-choice", "bool")),
    ("tool_call_parser", _f("--tool-call-parser")),
    ("uvicorn_log_level", _f("--uvicorn-log-level", "choice",
                             choices=("critical", "debug", "error", "info", "trace", "warning"))),
    ("disable_uvicorn_access_log", _f("--disable-uvicorn-access-log", "bool")),
    ("disable_access_log_for_endpoints", _f("--disable-access-log-for-endpoints", "csv")),
    ("disable_fastapi_docs", _f("--disable-fastapi-docs", "bool")),
    ("enable_request_id_headers", _f("--enable-request-id-headers", "bool")),
    ("max_log_len", _f("--max-log-len")),
    # --- logging and metrics -------------------------------------------------------------------------
    ("log_level", _f("--log-level", "choice", choices=("CRITICAL", "DEBUG", "ERROR", "INFO", "WARNING"))),
    ("enable_log_requests", _f("--enable-log-requests", "bool")),
    ("disable_log_stats", _f("--disable-log-stats", "switch")),
    ("shutdown_timeout", _f("--shutdown-timeout")),
])

# Instance fields the serving layer fills; they may not appear in `settings`.
MANAGED_KEYS = ("host", "port", "served_model_name")

# Options of older vLLM (the seed ran 0.24) that the pinned one no longer has, and what replaces them.
RENAMED_FLAGS = {
    "--disable-log-requests": "--no-enable-log-requests (setting enable_log_requests: false, the default)",
    "--enable-reasoning": "--reasoning-parser (setting reasoning_parser)",
    "--speculative-model": "speculative_config.model (setting speculative_config)",
    "--num-speculative-tokens": "speculative_config.num_speculative_tokens (setting speculative_config)",
    "--guided-decoding-backend": "structured_outputs_config.backend (setting structured_outputs_config)",
    "--task": "--runner / --convert (extra_args)",
    "--rope-scaling": "hf_overrides.rope_scaling (setting hf_overrides)",
    "--rope-theta": "hf_overrides.rope_theta (setting hf_overrides)",
    "--max-seq-len-to-capture": "--max-cudagraph-capture-size (setting max_cudagraph_capture_size)",
    "--cuda-graph-sizes": "--cudagraph-capture-sizes (setting cudagraph_capture_sizes)",
    "--disable-mm-preprocessor-cache": "--mm-processor-cache-gb 0 (setting mm_processor_cache_gb: 0)",
    "--override-pooler-config": "--pooler-config (extra_args)",
    "--worker-use-ray": "--distributed-executor-backend ray (setting distributed_executor_backend)",
}
REMOVED_FLAGS = {
    "--num-scheduler-steps": "nothing (multi-step scheduling was removed)",
    "--multi-step-stream-outputs": "nothing (multi-step scheduling was removed)",
    "--swap-space": "nothing (the V1 engine has no CPU swap space; see kv_offloading_size)",
    "--preemption-mode": "nothing (the V1 engine always recomputes)",
    "--use-v2-block-manager": "nothing (the only block manager)",
    "--disable-async-output-proc": "nothing (removed with the V0 engine)",
    "--enable-prompt-adapter": "nothing (prompt adapters were removed)",
    "--tokenizer-pool-size": "nothing (removed with the V0 engine)",
    "--scheduler-delay-factor": "nothing (removed with the V0 engine)",
    "--disable-frontend-multiprocessing": "nothing (removed)",
    "--max-num-partial-prefills": "nothing (removed with the V0 engine)",
    "--calculate-kv-scales": "nothing (removed; FP8 KV scales come from the checkpoint)",
    "--device": "nothing (the platform is detected)",
}
# Still parsed by the pinned vLLM but deprecated and without effect: refused so they do not linger.
DEPRECATED_FLAGS = {
    "--mamba-cache-mode": "nothing (Mamba prefix caching follows --enable-prefix-caching)",
    "--log-config-file": "--logging-config '{\"pylogging_config_file\": ...}' (extra_args)",
    "--disable-cascade-attn": "nothing (cascade attention was removed)",
    "--model": "the positional model argument of `vllm serve` (instance field `model`)",
}
# Never on a command line: visible in ps, /proc and the unit. The key comes from VLLM_API_KEY (0600 env file).
# Options the serving layer owns through an instance field.
INSTANCE_OWNED_FLAGS = {
    "--device-ids": "set the instance's gpus (the process sees only them, through CUDA_VISIBLE_DEVICES)",
}
SECRET_FLAGS = {
    "--api-key": "the API key goes to VLLM_API_KEY in the instance's 0600 environment file (Vault/AWX)",
    "--hf-token": "the hub token goes to HF_TOKEN in the instance's 0600 environment file",
}

# Every option spelling of `vllm serve` in the pinned vLLM, as tests/fixtures/vllm/vllm_cli.py extracts it
# from the wheel (test_vllm_flags.py checks this list against the wheel; regenerate with
# `python -m tests.fixtures.vllm.vllm_cli --names`). extra_args may only name these, or a fork's own options
# listed in the instance's allowed extra flags.
PINNED_VLLM_OPTIONS = frozenset("""
--additional-config --aggregate-engine-logging --all2all-backend --allow-credentials
--allow-deprecated-quantization --allowed-headers --allowed-local-media-path --allowed-media-domains
--allowed-methods --allowed-origins --anthropic-disabled-thinking-effort --api-key --api-server-count
--async-scheduling --attention-backend --attention-config --aux-output-config --block-size
--chat-template --chat-template-content-format --code-revision --cohere-format
--cohere-is-reasoning-model --collect-detailed-traces --compilation-config --config --config-format
--convert --cp-kv-cache-interleave-size --cpu-distributed-timeout-seconds --cpu-offload-gb
--cpu-offload-params --cudagraph-capture-sizes --cudagraph-metrics --custom-histogram-buckets
--data-parallel-address --data-parallel-backend --data-parallel-external-lb --data-parallel-hybrid-lb
--data-parallel-multi-port-external-lb --data-parallel-rank --data-parallel-rpc-port
--data-parallel-size --data-parallel-size-local --data-parallel-start-rank
--data-parallel-supervisor-port --dbo-decode-token-threshold --dbo-prefill-token-threshold
--dcp-comm-backend --dcp-kv-cache-interleave-size --dcp-q-replicate --decode-context-parallel-size
--default-chat-template-kwargs --default-mm-loras --device-ids --device-memory-utilization
--diffusion-config --disable-access-log-for-endpoints --disable-cascade-attn --disable-chunked-mm-input
--disable-custom-all-reduce --disable-fastapi-docs --disable-hybrid-kv-cache-manager --disable-log-stats
--disable-nccl-for-dp-synchronization --disable-sliding-window --disable-uvicorn-access-log
--distributed-executor-backend --distributed-timeout-seconds --download-dir
--dp-supervisor-probe-failure-threshold --dp-supervisor-probe-interval-s --dp-supervisor-probe-timeout-s
--dp-sync-interval --dtype --ec-manager-config --ec-transfer-config --elastic-ep-max-dp-size
--enable-auto-tool-choice --enable-batch-sharded-sampling --enable-chunked-prefill
--enable-cumem-allocator --enable-dbo --enable-elastic-ep --enable-ep-weight-filter --enable-eplb
--enable-expert-parallel --enable-fault-tolerance --enable-flash-late-interaction
--enable-flashinfer-autotune --enable-force-include-usage --enable-hc-sp --enable-layerwise-nvtx-tracing
--enable-log-deltas --enable-log-outputs --enable-log-requests --enable-logging-iteration-details
--enable-lora --enable-mamba-cache-stochastic-rounding --enable-mamba-shared-prefix-checkpoint
--enable-mfu-metrics --enable-mixed-moe-lora-format --enable-mm-embeds --enable-moe-shared-loras
--enable-nccl-comm-suspend --enable-offline-docs --enable-per-request-metrics --enable-prefix-caching
--enable-prompt-embeds --enable-prompt-tokens-details --enable-request-id-headers
--enable-return-routed-experts --enable-scale-out --enable-server-load-tracking
--enable-shm-tensor-arena --enable-sleep-mode --enable-ssl-refresh --enable-tokenizer-info-endpoint
--enable-tower-connector-lora --enable-trace-replay --enforce-eager --engram-config --eplb-config
--exclude-tools-when-tool-choice-none --expert-placement-strategy --fail-on-environ-validation
--fault-tolerance-config --fingerprint-mode --fingerprint-value --fully-sharded-loras
--gdn-prefill-backend --generation-config --gpu-memory-utilization --grpc --grpc-port
--h11-max-header-count --h11-max-incomplete-event-size --headless --help --hf-config-path --hf-overrides
--hf-token --host --ignore-patterns --interleave-mm-strings --io-processor-plugin --ir-op-priority
--jit-monitor-mode --jit-monitor-verbose --kda-decode-backend --kda-prefill-backend --kernel-config
--kv-cache-dtype --kv-cache-dtype-skip-layers --kv-cache-memory-bytes --kv-cache-metrics
--kv-cache-metrics-sample --kv-events-config --kv-offloading-backend --kv-offloading-size
--kv-sharing-fast-prefill --kv-transfer-config --language-model-only --limit-mm-per-prompt
--linear-backend --load-format --log-config-file --log-error-stack --log-level --logging-config
--logits-processors --logprobs-mode --long-prefill-token-threshold
--long-prefill-token-threshold-adaptive --lora-dtype --lora-modules --lora-target-modules
--mamba-backend --mamba-block-size --mamba-cache-dtype --mamba-cache-mode --mamba-cache-philox-rounds
--mamba-ssm-cache-dtype --mamba-ssu-algorithm --master-addr --master-port --max-cpu-loras
--max-cudagraph-capture-size --max-log-len --max-logprobs --max-lora-cls-labels --max-lora-rank
--max-loras --max-model-len --max-num-active-seqs --max-num-batched-tokens --max-num-queued-reqs
--max-num-queued-tokens --max-num-scheduled-tokens --max-num-seqs --max-parallel-loading-workers
--media-io-kwargs --middleware --mm-device-do-normalize --mm-encoder-attn-backend
--mm-encoder-attn-dtype --mm-encoder-fp8-scale-path --mm-encoder-fp8-scale-save-margin
--mm-encoder-fp8-scale-save-path --mm-encoder-only --mm-encoder-tp-mode --mm-hasher-algorithm
--mm-ipc-gpu-memory-gb --mm-processor-cache-gb --mm-processor-cache-type --mm-processor-device
--mm-processor-kwargs --mm-shm-cache-max-object-size-mb --mm-tensor-ipc --model --model-class-overrides
--model-impl --model-loader-extra-config --moe-backend --monokernel --nnodes --no-allow-credentials
--no-allow-deprecated-quantization --no-async-scheduling --no-cohere-is-reasoning-model
--no-cudagraph-metrics --no-data-parallel-external-lb --no-data-parallel-hybrid-lb --no-dcp-q-replicate
--no-disable-cascade-attn --no-disable-chunked-mm-input --no-disable-custom-all-reduce
--no-disable-fastapi-docs --no-disable-hybrid-kv-cache-manager --no-disable-nccl-for-dp-synchronization
--no-disable-sliding-window --no-disable-uvicorn-access-log --no-enable-auto-tool-choice
--no-enable-batch-sharded-sampling --no-enable-chunked-prefill --no-enable-cumem-allocator
--no-enable-dbo --no-enable-elastic-ep --no-enable-ep-weight-filter --no-enable-eplb
--no-enable-expert-parallel --no-enable-fault-tolerance --no-enable-flash-late-interaction
--no-enable-flashinfer-autotune --no-enable-force-include-usage --no-enable-hc-sp
--no-enable-layerwise-nvtx-tracing --no-enable-log-deltas --no-enable-log-outputs
--no-enable-log-requests --no-enable-logging-iteration-details --no-enable-lora
--no-enable-mamba-cache-stochastic-rounding --no-enable-mamba-shared-prefix-checkpoint
--no-enable-mfu-metrics --no-enable-mixed-moe-lora-format --no-enable-mm-embeds
--no-enable-moe-shared-loras --no-enable-nccl-comm-suspend --no-enable-offline-docs
--no-enable-per-request-metrics --no-enable-prefix-caching --no-enable-prompt-embeds
--no-enable-prompt-tokens-details --no-enable-request-id-headers --no-enable-return-routed-experts
--no-enable-scale-out --no-enable-server-load-tracking --no-enable-shm-tensor-arena
--no-enable-sleep-mode --no-enable-ssl-refresh --no-enable-tokenizer-info-endpoint
--no-enable-tower-connector-lora --no-enable-trace-replay --no-enforce-eager
--no-exclude-tools-when-tool-choice-none --no-fail-on-environ-validation --no-fully-sharded-loras
--no-interleave-mm-strings --no-jit-monitor-verbose --no-kv-cache-metrics --no-kv-sharing-fast-prefill
--no-language-model-only --no-log-error-stack --no-long-prefill-token-threshold-adaptive
--no-mm-device-do-normalize --no-mm-encoder-only --no-monokernel --no-numa-bind
--no-ray-workers-use-nsight --no-return-sampling-mask --no-return-tokens-as-token-ids
--no-scheduler-reserve-full-isl --no-skip-mm-profiling --no-skip-tokenizer-init
--no-sleep-mode-offload-cudagraph --no-specialize-active-lora --no-swa-bounded-replay --no-tokens-only
--no-trust-remote-code --no-trust-request-chat-template --no-trust-request-mm-kwargs
--no-use-fp64-gumbel --no-use-replayssm --no-use-tqdm-on-load --node-rank --num-gpu-blocks-override
--numa-bind --numa-bind-cpus --numa-bind-nodes --offload-backend --offload-group-size
--offload-num-in-group --offload-params --offload-prefetch-step --optimization-level
--otlp-traces-endpoint --override-generation-config --per-request-spec-decode-metrics --performance-mode
--pipeline-parallel-size --pooler-config --port --prefill-context-parallel-size
--prefill-schedule-interval --prefix-cache-retention-interval --prefix-caching-hash-algo
--prefix-match-unit --profiler-config --pt-load-map-location --quantization --quantization-config
--ray-workers-use-nsight --reasoning-config --reasoning-effort-map --reasoning-parser
--reasoning-parser-plugin --renderer-num-workers --replayssm-buffer-len --response-role
--return-sampling-mask --return-tokens-as-token-ids --revision --root-path --runner
--safetensors-load-strategy --safetensors-prefetch-block-size --safetensors-prefetch-num-threads
--scheduler-cls --scheduler-reserve-full-isl --scheduling-policy --seed --served-model-name
--show-hidden-metrics-for-version --shutdown-timeout --skip-mm-profiling --skip-tokenizer-init
--sleep-mode-backend --sleep-mode-offload-cudagraph --sleep-preserve-parameter-names
--sparse-indexer-topk-backend --spec-method --spec-model --spec-tokens --specialize-active-lora
--speculative-config --sse-keep-alive-interval --ssl-ca-certs --ssl-cert-reqs --ssl-certfile
--ssl-ciphers --ssl-keyfile --stream-interval --structured-outputs-config --swa-bounded-replay
--tensor-parallel-size --tokenizer --tokenizer-mode --tokenizer-revision --tokens-only
--tool-call-parser --tool-parser-plugin --tool-server --tool-strict-level --trust-remote-code
--trust-request-chat-template --trust-request-mm-kwargs --ubatch-size --uds --use-fp64-gumbel
--use-replayssm --use-tqdm-on-load --uvicorn-log-level --video-pruning-method --video-pruning-rate
--watchdog-config --watermark --watermark-config --weight-transfer-config --worker-cls
--worker-extension-cls -ac -asc -cc -dc -dcp -dp -dpa -dpb -dpe -dph -dpl -dpm -dpn -dpp -dpr -ep -h -n
-pcp -pp -q -r -sc -tp
""".split())

# The config classes behind the table's JSON settings, as tests/fixtures/vllm/vllm_cli.py extracts them from
# the pinned wheel with `ast` (test_vllm_flags.py checks this literal against the wheel; regenerate with
# `python -m tests.fixtures.vllm.vllm_cli --configs`). vLLM builds each class from the option's JSON
# (CompilationConfig(**value), SpeculativeConfig(**value), ...); a class is (extra, its plain fields, its
# fields that hold another config class). extra "forbid" (vllm/config/utils.py: the `config` decorator's
# ConfigDict(extra="forbid")) means an unknown key stops vLLM at start, so the plan refuses it first.
PINNED_VLLM_CONFIGS = {
    "options": {
        "--attention-config": "AttentionConfig",
        "--compilation-config": "CompilationConfig",
        "--kv-transfer-config": "KVTransferConfig",
        "--reasoning-config": "ReasoningConfig",
        "--speculative-config": "SpeculativeConfig",
        "--structured-outputs-config": "StructuredOutputsConfig",
    },
    "classes": {
        "AttentionConfig": ("forbid", """
backend backend_per_kind disable_flashinfer_q_quantization
flash_attn_max_num_splits_for_cuda_graph flash_attn_version flex_attn_block_m flex_attn_block_n
flex_attn_kv_block_size flex_attn_q_block_size indexer_kv_dtype indexer_sparse_logits
indexer_tp_shard_min_rows minimax_m3_indexer_cp minimax_m3_msa_decode_backend
mla_prefill_backend sparse_mla_force_mqa sparse_mla_prefill_workspace_factor
tokenspeed_mla_min_split_kv tq_max_kv_splits_for_cuda_graph trtllm_ragged_backend use_non_causal
use_prefill_query_quantization use_trtllm_attention
""", {"hisparse_config": "HiSparseConfig"}),
        "CompilationConfig": ("forbid", """
backend cache_dir compile_cache_save_format compile_mm_encoder compile_ranges_endpoints
compile_sizes cudagraph_capture_sizes cudagraph_copy_inputs cudagraph_decoder_replay
cudagraph_mm_encoder cudagraph_mode cudagraph_num_of_warmups cudagraph_specialize_lora
custom_ops debug_dump_path decoder_replay_cudagraph_capture_sizes decoder_replay_trim_threshold
encoder_cudagraph_max_frames_per_batch encoder_cudagraph_max_vision_items_per_batch
encoder_cudagraph_token_budgets fast_moe_cold_start inductor_compile_config inductor_passes
ir_enable_torch_wrap max_cudagraph_capture_size mode splitting_ops use_inductor_graph_partition
""", {"dynamic_shapes_config": "DynamicShapesConfig", "pass_config": "PassConfig"}),
        "DynamicShapesConfig": ("forbid", """
assume_32_bit_indexing evaluate_guards type
""", {}),
        "HiSparseConfig": ("forbid", """
device_buffer_size eager_host_mirror
""", {}),
        "KVTransferConfig": ("forbid", """
enable_permute_local_kv engine_id kv_buffer_device kv_connector kv_connector_extra_config
kv_connector_module_path kv_load_failure_policy kv_port kv_role
""", {}),
        "LoadConfig": ("forbid", """
device download_dir ignore_patterns load_format model_loader_extra_config pt_load_map_location
safetensors_load_strategy safetensors_prefetch_block_size safetensors_prefetch_num_threads
use_tqdm_on_load
""", {}),
        "PassConfig": ("forbid", """
eliminate_noops enable_qk_norm_rope_fusion fi_allreduce_fusion_max_size_mb fuse_act_padding
fuse_act_quant fuse_allreduce_rms fuse_attn_quant fuse_mla_dual_rms_norm fuse_norm_quant
fuse_qk_norm_rope_kvcache fuse_rope_kvcache fuse_rope_kvcache_cat_mla
rope_kvcache_fusion_max_token_num
""", {}),
        "ReasoningConfig": ("forbid", """
reasoning_end_str reasoning_parser reasoning_start_str
""", {}),
        "SpeculativeConfig": ("forbid", """
attention_backend code_revision disable_eagle_block_drop disable_lookahead_block_hashes
disable_padded_drafter_batch draft_lm_head_quantization draft_model_config draft_parallel_config
draft_sample_method draft_tensor_parallel_size dspark_draft_topk enable_adaptive_verification
enforce_eager fly_entropy_threshold fly_entropy_top_k fly_window_size
index_share_for_mtp_iteration kv_cache_dtype max_model_len method model moe_backend
num_speculative_tokens num_speculative_tokens_per_batch_size parallel_drafting prompt_lookup_max
prompt_lookup_min quantization rejection_sample_method revision
suffix_decoding_max_cached_requests suffix_decoding_max_spec_factor
suffix_decoding_max_tree_depth suffix_decoding_min_token_prob synthetic_acceptance_length
synthetic_acceptance_rates target_model_config target_parallel_config tensor_parallel_size
use_heterogeneous_vocab use_local_argmax_reduction xpress_topc
""", {"draft_load_config": "LoadConfig"}),
        "StructuredOutputsConfig": ("forbid", """
backend disable_additional_properties disable_any_whitespace enable_in_reasoning
reasoning_parser reasoning_parser_plugin
""", {}),
    },
}
# Keys of older vLLM (or of a fork) that the pinned classes do not have, and what replaces them.
CONFIG_KEY_HINTS = {
    ("ReasoningConfig", "default_thinking_token_budget"): (
        "vLLM %s has no server-wide thinking budget: clients send thinking_token_budget in each request "
        "(chat/completions), which vLLM accepts once reasoning is configured (reasoning_parser, or "
        "reasoning_start_str and reasoning_end_str here; vllm/v1/engine/input_processor.py)"
        % PINNED_VLLM["version"]),
}


def _config_fields(name):
    extra, plain, nested = PINNED_VLLM_CONFIGS["classes"][name]
    fields = dict((field, None) for field in plain.split())
    fields.update(nested)
    return extra, fields


def check_config_keys(key, value, class_name, path=None):
    """Refuse keys of a JSON setting that the pinned vLLM's config class `class_name` does not have (when it
    forbids unknown keys), recursively into the fields that hold another config class."""
    extra, fields = _config_fields(class_name)
    path = path or key
    for item in sorted(value, key=str):
        name = str(item)
        if class_name == "SpeculativeConfig" and path == key:
            name = name.replace("-", "_")       # vLLM's create_speculative_config does the same
        if name in fields:
            nested = fields[name]
            if nested and isinstance(value[item], dict):
                check_config_keys(key, value[item], nested, "%s.%s" % (path, name))
            continue
        if extra != "forbid":
            continue
        hint = CONFIG_KEY_HINTS.get((class_name, name))
        raise VllmArgsError(
            "setting %s: %s is not a field of vLLM %s's %s, which refuses unknown keys at start (it would "
            "not come up)%s. Its fields: %s"
            % (key, "%s.%s" % (path, name), PINNED_VLLM["version"], class_name,
               "; %s" % hint if hint else "", ", ".join(sorted(fields))))


def _json_text(key, value):
    if isinstance(value, str):
        raise VllmArgsError(
            "setting %s must be a YAML mapping, not a string: the role writes the JSON (a hand-quoted string "
            "breaks on the first quote)" % key)
    if not isinstance(value, (dict, list)):
        raise VllmArgsError("setting %s must be a YAML mapping, got %s" % (key, type(value).__name__))
    class_name = PINNED_VLLM_CONFIGS["options"].get(FLAGS[key]["flag"]) if key in FLAGS else None
    if class_name and isinstance(value, dict):
        check_config_keys(key, value, class_name)
    try:
        return compact_json(value)
    except (TypeError, ValueError) as exc:
        raise VllmArgsError("setting %s cannot be written as JSON: %s" % (key, exc)) from exc


def release_of(version):
    """'0.24.0+cu128' (a fork's or a variant's local version) -> '0.24.0'; None when empty."""
    text = str(version or "").strip().split("+", 1)[0]
    return text or None


TABLE = FlagTable(FLAGS, VllmArgsError, "vLLM", managed_keys=MANAGED_KEYS, json_text=_json_text,
                  checked_versions=CHECKED_VERSIONS, version_key=release_of)


def version_warning(version, argv):
    """None when `version` (llmops_vllm.version) is one the flag table was checked against, else why the
    command line is unchecked (see flag_table.FlagTable.version_warning)."""
    return TABLE.version_warning(version, argv)


def variant_cuda(variant):
    """'cu129' -> '12.9', 'cu130' -> '13.0': the CUDA release a vLLM variant's name states."""
    match = VARIANT_RE.match(str(variant or ""))
    if not match:
        raise VllmArgsError("vllm_cuda_variant %r is not a CUDA variant name such as cu129 (CUDA 12.9) or "
                            "cu130 (CUDA 13.0)" % (variant,))
    digits = match.group(1)
    return "%d.%d" % (int(digits[:-1]), int(digits[-1]))


def planned_runtime(version, variant="", wheel="", source_dir="", mode="container"):
    """What role vllm will install, as the build fact llmops_vllm will describe it, before anything is pulled
    or downloaded: {mode, version, cuda_version, cuda_source}. cuda_version is what a name or the table of
    wheels read (RELEASE_CUDA) states, else None (never guessed; the serve stage reads it after the build)."""
    local = ""
    if wheel:
        parts = str(wheel).rsplit("/", 1)[-1].split("-")
        version = parts[1] if len(parts) > 2 else version
        local = version.split("+", 1)[1] if "+" in version else ""
    release = release_of(version)
    runtime = {"mode": "container" if mode == "container" else "host", "version": str(version or ""),
               "cuda_version": None, "cuda_source": None}
    if source_dir and not wheel:
        runtime["cuda_source"] = ("a source tree (vllm_source_dir) states its CUDA only once built: read "
                                  "from its torch after the build stage")
        return runtime
    variant = variant or (local if VARIANT_RE.match(local) else "")
    if variant:
        runtime["cuda_version"] = variant_cuda(variant)
        runtime["cuda_source"] = ("the variant name %s (vLLM names its CUDA %s build so)"
                                  % (variant, runtime["cuda_version"]))
        return runtime
    known = RELEASE_CUDA.get(release or "")
    if known:
        runtime["cuda_version"] = known["cuda"]
        runtime["cuda_source"] = known["evidence"]
    else:
        runtime["cuda_source"] = (
            "vLLM %s's default build is not in the table of builds read from their wheels (%s): its CUDA is "
            "read from the image or the virtualenv after the build stage"
            % (release or "(no version)", ", ".join(sorted(RELEASE_CUDA))))
    return runtime


def cuda_ways_out(version):
    """The ways round a driver too old for the CUDA of vLLM `version` (its build fact's version), listed by
    the CUDA refusal before the driver upgrade and forward compatibility."""
    release = release_of(version) or "(the configured version)"
    return (
        "a CUDA 12.x build of vLLM %s (role vllm: vllm_cuda_variant: cu129, the image "
        "vllm/vllm-openai:v%s-cu129 or the wheels of https://wheels.vllm.ai/%s/cu129), if vLLM publishes one "
        "for %s: not checked here (no registry or index is read); `docker manifest inspect "
        "vllm/vllm-openai:v%s-cu129` tells" % (release, release, release, release, release),
        "a vLLM release built for CUDA 12.x (vllm_version, with vllm_cuda_variant: cu129 where the release's "
        "default build is CUDA 13): a CUDA 12.x build runs on any driver >= 525.60.13; the L20 seed notes "
        "ran vLLM %s on driver 550.54.14 (R550). The flag table is checked against vLLM %s only: the plan "
        "warns about another version" % (SEED_CUDA12_RELEASE, ", ".join(CHECKED_VERSIONS)),
    )


def flag_args(key, value):
    """The argv fragment for one setting (may be empty)."""
    return TABLE.flag_args(key, value)


def _setting_refusal(key):
    if key == "api_key":
        return "setting api_key: %s" % SECRET_FLAGS["--api-key"]
    flag = "--" + str(key).replace("_", "-")
    if flag in INSTANCE_OWNED_FLAGS:
        return "setting %s: %s" % (key, INSTANCE_OWNED_FLAGS[flag])
    if flag in RENAMED_FLAGS or flag in REMOVED_FLAGS or flag in DEPRECATED_FLAGS:
        return ("setting %s is not an option of vLLM %s; use %s"
                % (key, PINNED_VLLM["version"], _replacement(flag)))
    return None


def normalize_settings(settings):
    """Validate setting keys. Returns a new dict without None values."""
    return without_none(TABLE.check_setting_names(settings, _setting_refusal))


def _replacement(flag):
    for table in (RENAMED_FLAGS, REMOVED_FLAGS, DEPRECATED_FLAGS, SECRET_FLAGS):
        if flag in table:
            return table[flag]
    return None


def managed_flag_spellings():
    """Every spelling the table generates, with the setting that owns it."""
    return TABLE.spellings()


def emitted_flags():
    """The flags :func:`build_argv` can put on a command line (canonical spellings and negatives)."""
    return TABLE.emitted_flags()


def option_name(arg):
    """`--max_num_seqs=4` / `--compilation-config.mode` -> `--max-num-seqs` / `--compilation-config`.

    vLLM's FlexibleArgumentParser accepts underscores for dashes and dotted keys of JSON options.
    """
    name = arg.split("=", 1)[0]
    if name.startswith("--"):
        name = "--" + name[2:].split(".", 1)[0].replace("_", "-")
    return name


def _option_or_none(arg):
    """The option an extra_args item names, or None for a value of the previous option."""
    if arg.startswith("--") or (len(arg) > 1 and arg[0] == "-" and arg[1].isalpha()):
        return option_name(arg)
    return None


def _extra_arg_refusal(name, allowed):
    if name in SECRET_FLAGS:
        return "extra_args contains %s: secrets never go on a command line (ps, the unit); %s" % (
            name, SECRET_FLAGS[name])
    if name in INSTANCE_OWNED_FLAGS:
        return "extra_args contains %s: %s" % (name, INSTANCE_OWNED_FLAGS[name])
    if name in allowed:
        return None
    if name in RENAMED_FLAGS or name in REMOVED_FLAGS or name in DEPRECATED_FLAGS:
        return ("extra_args contains %s, which vLLM %s no longer has (or only warns about); use %s"
                % (name, PINNED_VLLM["version"], _replacement(name)))
    managed = TABLE.managed_refusal(name)
    if managed or name in PINNED_VLLM_OPTIONS:
        return managed
    return ("extra_args contains %s, which is not an option of vLLM %s. If your build (a fork) has it, "
            "name it in the allowed extra flags (llmops_vllm.extra_flags, from role vllm)"
            % (name, PINNED_VLLM["version"]))


def check_extra_args(extra_args, allowed_extra_flags=()):
    """Refuse secrets, renamed/removed/deprecated options, options the table manages, and options that the
    pinned vLLM does not have unless named in `allowed_extra_flags` (a fork's own options)."""
    allowed = set(option_name(str(f)) for f in allowed_extra_flags or ())

    def refusal(name):
        return _extra_arg_refusal(name, allowed)

    return TABLE.check_extra_args(extra_args, "--enforce-eager", refusal, option_name=_option_or_none)


def build_argv(settings, model=None, host=None, port=None, api_key_file=None, extra_args=None, gpus=None,
               served_model_name=None, allowed_extra_flags=()):
    """Return the arguments after ``vllm serve`` for one instance: the model, then the options.

    `host` is always rendered (vLLM binds every interface without it); `port` and `served_model_name` (a
    name or a list of names, never a file path) come from the instance. `gpus` are the instance's (vLLM
    sees them through CUDA_VISIBLE_DEVICES or docker --gpus; nothing on the command line). There is no key
    file: vLLM reads VLLM_API_KEY from the instance's 0600 environment file.
    """
    if api_key_file:
        raise VllmArgsError("vLLM has no key file option: the key goes to VLLM_API_KEY in the instance's "
                            "env file")
    if not model:
        raise VllmArgsError("the instance has no model (path or hub id)")
    if not host:
        raise VllmArgsError("the instance has no host: vLLM would bind every interface")
    if not is_number(port) and not str(port).isdigit():
        raise VllmArgsError("port must be a number, got %r" % (port,))
    if not served_model_name:
        raise VllmArgsError("the instance has no served model name")
    settings = normalize_settings(settings)
    managed = {"host": host, "port": int(port), "served_model_name": served_model_name}
    return [str(model)] + TABLE.argv(settings, managed) + check_extra_args(extra_args, allowed_extra_flags)


def model_check_path(model_path):
    """The file that must exist on the node: a model directory's config.json (safetensors checkpoint)."""
    return model_path.rstrip("/") + "/config.json"


def unit_env(timeout_start_sec):
    """Variables the unit sets (not secret): vLLM's own ready timeout, as long as systemd's."""
    return {READY_TIMEOUT_ENV: str(int(timeout_start_sec))}


def uses_mlock(settings):
    """vLLM does not lock its weights in RAM: no LimitMEMLOCK."""
    return False
