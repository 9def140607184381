#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: (c) 2026, llmops.serving contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: llm_benchmark
short_description: Measure an OpenAI-compatible LLM endpoint (llama-server or vLLM)
author:
  - llmops.serving developers (@llmops)
description:
  - Benchmarks a chat completions endpoint the way an operator does by hand. Every prompt is unique (a
    64-character random id and random words) so no prefix cache helps, and the server's cached prompt
    tokens are reported to prove it (llama-server C(timings.cache_n), vLLM
    C(usage.prompt_tokens_details.cached_tokens)).
  - Sends O(warmup_requests) warm-up requests first, which are not measured; the first two, of two small
    lengths, calibrate how many words make a token from the server's usage figures. Then does each of
    O(runs) - a prompt length in tokens, an output length, a concurrency level and a number of requests -
    all streaming, with C(ignore_eos) so the output really is O(runs[].max_tokens) long.
  - Per request it measures the time to the first content or reasoning token (TTFT), prefill tokens/s
    (prompt tokens / TTFT) and decode tokens/s ((completion tokens - 1) / time from the first to the last
    token), and reads the server's own figures where it gives them - llama-server's final-chunk C(timings)
    (C(prompt_per_second), C(predicted_per_second), C(draft_n), C(draft_n_accepted)); for vLLM, the
    speculative decoding counters on C(/metrics) before and after each run.
  - Failed requests (HTTP errors, timeouts, broken streams) are counted and reported per run, not raised;
    RV(failed) is then true, which fails the task unless the caller sets C(failed_when). The task fails
    with a message when the benchmark cannot start (no model list, wrong key, no warm-up answered).
  - Before the first request it reads the load the server carries (llama-server C(/slots), else its
    C(/metrics) C(llamacpp:requests_processing) and C(llamacpp:requests_deferred); vLLM C(/metrics)
    C(vllm:num_requests_running) and C(vllm:num_requests_waiting)), with the key, and applies
    O(busy_policy). RV(load) records what it saw; when it does not measure, RV(measured) is false and
    RV(msg) says why.
  - Changes nothing. It runs in check mode too; a caller that wants no load in check mode skips it.
version_added: "0.1.0"
options:
  url:
    description: Base URL of the server, without C(/v1).
    type: str
    required: true
  engine:
    description: The engine behind O(url); decides where speculative decoding figures come from.
    type: str
    choices: [llama.cpp, vllm]
    default: llama.cpp
  model:
    description: Served model name. Default is the first model C(GET /v1/models) lists.
    type: str
  api_key:
    description: The API key, sent as a bearer token. Never returned.
    type: str
  api_key_file:
    description: A file on the node holding the key, as llama-server's C(--api-key-file) reads it (the first
      line that is neither empty nor a C(#) comment).
    type: path
  env_file:
    description: A systemd environment file on the node (C(KEY=VALUE) lines, quoting as systemd reads it)
      holding the key in the variable O(api_key_env).
    type: path
  api_key_env:
    description: The variable of O(env_file) holding the key. Default C(VLLM_API_KEY) for O(engine=vllm),
      C(LLAMA_API_KEY) for O(engine=llama.cpp).
    type: str
  runs:
    description: The measured runs, in order. Default one run at concurrency 1 (3 requests) and one at
      concurrency 2 (4 requests), both with 1024 prompt tokens and 256 output tokens.
    type: list
    elements: dict
    suboptions:
      prompt_tokens:
        description: Prompt length in tokens (reached within a few tokens by the calibration).
        type: int
        required: true
      max_tokens:
        description: Output length in tokens. Default 256.
        type: int
      concurrency:
        description: Requests in flight at once. Default 1.
        type: int
      requests:
        description: Requests in the run. Default the larger of 3 and O(runs[].concurrency).
        type: int
  warmup_requests:
    description: Warm-up requests before the runs (not measured). Beyond the first two, they use the runs'
      prompt lengths, largest first, to warm kernels for those shapes. Two calibration requests are sent
      even when this is 0.
    type: int
    default: 2
  timeout:
    description: Seconds one request may take (and wait for data) before it counts as an error.
    type: float
    default: 300
  seed:
    description: Seed of the random word choice, for reproducible prompt lengths; the random id of every
      prompt stays unique.
    type: int
  busy_policy:
    description:
      - What to do when users' requests are in flight or queued on the server before the benchmark starts.
      - V(measure) records the load and measures anyway (the figures then include that load).
      - V(skip) does not measure a busy server.
      - V(wait) reads the load again every O(busy_poll) seconds until the server is idle, for at most
        O(busy_wait) seconds, then does not measure.
      - A server whose load cannot be read (no C(/slots) or C(/metrics)) is measured, with RV(load) saying so.
    type: str
    choices: [wait, skip, measure]
    default: measure
  busy_wait:
    description: Most seconds O(busy_policy=wait) waits for the server to become idle.
    type: float
    default: 120
  busy_poll:
    description: Seconds between two reads of the load while waiting.
    type: float
    default: 5
notes:
  - Supports check mode; it never changes anything, in check mode or not.
  - Runs on the managed node with Python 3.6 or later and the standard library only.
seealso:
  - module: llmops.serving.gguf_info
"""

EXAMPLES = r"""
- name: Measure the llama-server instance as seed 003 does (20K and 60K prompts)
  llmops.serving.llm_benchmark:
    url: http://127.0.0.1:8003
    api_key_file: /etc/llama-server/qwen.key
    warmup_requests: 4
    runs:
      - {prompt_tokens: 20000, max_tokens: 256, concurrency: 1, requests: 3}
      - {prompt_tokens: 60000, max_tokens: 128, concurrency: 1, requests: 2}
  register: bench

- name: Measure vLLM at rising concurrency, the key read from its unit's environment file
  llmops.serving.llm_benchmark:
    url: http://127.0.0.1:8000
    engine: vllm
    env_file: /etc/vllm/qwen.env
    runs:
      - {prompt_tokens: 2048, max_tokens: 256, concurrency: 1}
      - {prompt_tokens: 2048, max_tokens: 256, concurrency: 4}
      - {prompt_tokens: 2048, max_tokens: 256, concurrency: 8, requests: 16}
  register: bench
  failed_when: false

- name: Measure a production llama-server only when its users leave it idle (wait at most 5 minutes)
  llmops.serving.llm_benchmark:
    url: http://127.0.0.1:8003
    api_key_file: /etc/llama-server/qwen.key
    busy_policy: wait
    busy_wait: 300
  register: bench

- name: Say why it was not measured
  ansible.builtin.debug:
    msg: "{{ bench.msg }}"
  when: not bench.measured

- name: Decode speed is what the profile promises
  ansible.builtin.assert:
    that: bench.summary.decode_tps >= 80
  when: bench.measured
"""

RETURN = r"""
url:
  description: The URL benchmarked.
  returned: success
  type: str
engine:
  description: The engine named in O(engine).
  returned: success
  type: str
model:
  description: The model name sent in the requests.
  returned: success
  type: str
calibration:
  description: The words -> tokens fit from the warm-ups, C(tokens_per_word) and C(overhead_tokens) (chat
    template and prompt frame).
  returned: success
  type: dict
runs:
  description:
    - One item per run. Means are over the run's successful requests; C(null) where nothing was measured.
    - C(prompt_tokens_target), C(max_tokens), C(concurrency), C(requests) - the run's settings.
    - C(ok), C(errors), C(error_messages) (distinct, at most 10), C(wall_s) (the run's wall time).
    - C(prompt_tokens), C(completion_tokens), C(cached_prompt_tokens) - means from the server's usage
      (cached should be 0).
    - C(ttft_s) - C(mean), C(p50), C(p90), C(max) of the time to the first token (from the start of the
      request, connecting and queueing included).
    - C(connect_s), C(queue_s), C(tail_s) - C(mean) and C(max), apart, of connecting (TCP, TLS); waiting at
      the server before the work began (request written to first token less llama-server's own prompt
      time; without it, to the response headers); the stream's end after its last token.
    - C(unexplained_s) - wall time outside every request's start to last token; C(idle_s) - wall time with
      no request in flight; C(stall) - null, or where the time went when C(unexplained_s) is over 1 s and
      10% of the wall time, or a request spent over 1 s connecting or, at concurrency 1, queued (also a
      warning).
    - C(prefill_tps), C(decode_tps) - client means per request; C(decode_tps_total) - completion tokens of
      the run / its wall time (the throughput at that concurrency).
    - C(server_prefill_tps), C(server_decode_tps) - means of llama-server's timings, null when not given.
    - C(draft_acceptance) - accepted / drafted tokens (llama-server timings, or vLLM's /metrics counters over
      the run), null when no speculation; C(draft_tokens), C(draft_accepted_tokens) - the sums.
  returned: success
  type: list
  elements: dict
summary:
  description:
    - C(decode_tps), C(ttft_s), C(prefill_tps), C(server_decode_tps) - means of the runs at the lowest
      concurrency; C(draft_acceptance) over all runs; C(decode_tps_agreement) - client / server decode
      tokens/s where both exist (close to 1 when the client measures what the server does).
  returned: success
  type: dict
errors:
  description: Failed requests over all runs.
  returned: success
  type: int
failed:
  description: Whether any measured request failed.
  returned: success
  type: bool
load:
  description:
    - The load read before the benchmark. C(source) (C(/slots), C(/metrics), or null when unknown),
      C(processing) and C(waiting) (requests; null when the endpoint does not say), C(slots) (llama-server's
      slot count), C(busy), C(waited_s), C(checks) (reads made), C(checked_at) (UTC), C(measure) (the
      decision) and C(message) (what was seen and done).
  returned: success
  type: dict
measured:
  description: Whether the benchmark ran; false when O(busy_policy) kept it from a busy server (then RV(runs)
    is empty and RV(msg) says why).
  returned: success
  type: bool
msg:
  description: Why the server was not measured (RV(measured) false), or the first message of each run with
    failed requests (RV(failed) true).
  returned: when not measured, or when requests failed
  type: str
"""

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.llmops.serving.plugins.module_utils import engines  # noqa: E402
from ansible_collections.llmops.serving.plugins.module_utils._benchmark import client as llm_benchmark  # noqa: E402
from ansible_collections.llmops.serving.plugins.module_utils._benchmark import load as llm_load  # noqa: E402
from ansible_collections.llmops.serving.plugins.module_utils.module_guard import run_module  # noqa: E402

ARGUMENT_SPEC = dict(
    url=dict(type="str", required=True),
    engine=dict(type="str", default=engines.DEFAULT_ENGINE, choices=list(engines.names())),
    model=dict(type="str"),
    api_key=dict(type="str", no_log=True),
    api_key_file=dict(type="path"),
    env_file=dict(type="path"),
    api_key_env=dict(type="str", no_log=False),
    runs=dict(type="list", elements="dict", options=dict(
        prompt_tokens=dict(type="int", required=True, no_log=False),
        max_tokens=dict(type="int", no_log=False),
        concurrency=dict(type="int"),
        requests=dict(type="int"),
    )),
    warmup_requests=dict(type="int", default=2),
    timeout=dict(type="float", default=300),
    seed=dict(type="int"),
    busy_policy=dict(type="str", default="measure", choices=list(llm_load.POLICIES)),
    busy_wait=dict(type="float", default=120),
    busy_poll=dict(type="float", default=5),
)


def main():
    run_module(AnsibleModule, "llm_benchmark", _run, argument_spec=ARGUMENT_SPEC,
               mutually_exclusive=[("api_key", "api_key_file", "env_file")],
               required_by={"api_key_env": "env_file"})


def _run(module):
    p = module.params
    try:
        key = llm_benchmark.read_api_key(p["api_key"], p["api_key_file"], p["env_file"], p["api_key_env"],
                                         p["engine"])
        if key:
            module.no_log_values.add(key)
        load = llm_load.check_load(llm_load.load_endpoint(p["url"], key, p["timeout"]), p["engine"],
                                   p["busy_policy"], p["busy_wait"], p["busy_poll"])
        if not load["measure"]:
            module.exit_json(changed=False, measured=False, load=load, msg=load["message"], url=p["url"],
                             engine=p["engine"], model=p["model"], runs=[], summary={}, errors=0,
                             failed=False)
        result = llm_benchmark.benchmark(p["url"], p["engine"], p["model"], key, p["runs"],
                                         p["warmup_requests"], p["timeout"], p["seed"])
    except llm_benchmark.BenchmarkError as exc:
        module.fail_json(msg="benchmark of %s failed: %s" % (p["url"], exc))
    result.update(load=load, measured=True)
    for run in result["runs"]:
        if run.get("stall"):
            module.warn("benchmark of %s, run at concurrency %d: %s"
                        % (p["url"], run["concurrency"], run["stall"]))
    if result["failed"]:
        result["msg"] = "%d benchmark requests failed: %s" % (
            result["errors"], "; ".join(m for run in result["runs"] for m in run["error_messages"][:1]))
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
