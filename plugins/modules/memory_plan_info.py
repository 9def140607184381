#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: (c) 2026, llmops.serving contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: memory_plan_info
short_description: Plan the GPU memory of serving instances before they start, and refuse what cannot fit
author:
  - llmops.serving developers (@llmops)
version_added: "1.0.0"
description:
  - Planning only; read-only (formerly C(serving_plan), a name that redirects here until 1.0.0). For each
    instance it computes what the engine will allocate on each of the instance's GPUs - weights, KV cache,
    recurrent state, compute buffers, CUDA context overhead - and the headroom left, from the model's
    metadata (no model data is read) and the instance settings.
  - A llama.cpp instance's C(model) is a M(llmops.serving.gguf_info) result (which can read a remote GGUF's
    header, so the plan can run before a download). The rules are the pinned llama.cpp's own (hybrid Gated
    DeltaNet layouts, MTP draft context, unified KV, split-mode layer placement with the input embedding in
    host memory and the output head on the last GPU); on the CPU build they match its logged buffers within
    2 %.
  - A vLLM instance's C(model_dir) is read on the node (C(config.json) and the sizes of C(*.safetensors));
    the plan gives the weights per tensor-parallel rank, the KV tokens that fit under
    C(gpu_memory_utilization) and the concurrency at C(max_model_len).
  - A plan that does not fit names the GPU, the shortfall and what would fit (the largest context, a q8_0 KV
    cache, fewer slots, another GPU); with O(fail_on_refusal) the task fails with every refusal.
  - Returns the same result in check mode; never changes the node (C(changed) is always false). The logic is
    in C(plugins/module_utils/_memory_plan/plan.py) and its engines C(memory_plan_llama_cpp.py) and
    C(memory_plan_vllm.py).
options:
  instances:
    description:
      - The instances to plan. Each is a dict with C(name), C(engine) (V(llama.cpp), the default, or V(vllm)),
        C(gpus) (the physical GPU indexes, in the order the instance uses them; all GPUs when left out),
        C(settings) (the instance settings, the keys of the engine's flag table) and C(model) (a
        M(llmops.serving.gguf_info) result) or C(model_path) (a GGUF on the node, whose header the module
        reads, never its data) or, for vLLM, C(model_dir) (the model directory on the node).
      - A llama.cpp instance with no GPUs (C(gpus) empty on a host without GPUs, or C(n_gpu_layers) 0) is
        planned in host memory against O(host_memory_mib).
      - A vLLM instance that spans a Ray cluster also has C(ray_cluster) (the inventory group) and C(nodes), a
        list of C(host), C(gpus) (the C(llmops_gpus) entries of that node that Ray uses, null while the node's
        C(llmops_gpus) is unknown) and optionally C(num_gpus) (what the node declares to Ray, the first that
        many of C(gpus)), the head first. It is planned on every GPU of every node (one rank each of
        C(tensor_parallel_size) x C(pipeline_parallel_size), which must equal their count), not on C(gpus)
        and O(gpus); its model is read on this node (the head). A node with unknown GPUs makes the plan
        C(planned) false, saying which.
    type: list
    elements: dict
    required: true
  gpus:
    description:
      - The C(llmops_gpus) fact of M(llmops.serving.gpu_facts) (a dict whose C(gpus) is the list) or that
        list (C(index), C(name), C(memory_total_mib), C(memory_free_mib) per GPU). Empty on a host without
        GPUs.
    type: raw
    required: true
  host_memory_mib:
    description:
      - The node's RAM in MiB (the roles pass C(ansible_memtotal_mb)), for instances planned in host memory.
        Empty means such plans report the memory they need without a fits decision (C(fits) null).
    type: int
  overhead_mib:
    description:
      - CUDA context, cuBLAS workspace and runtime memory per GPU and process that no engine log counts.
        Empty means the engine's documented default (512 for llama.cpp, 1700 for vLLM, which plans it
        inside C(gpu_memory_utilization)).
    type: int
  min_headroom_mib:
    description:
      - Memory that must stay free on each GPU for a llama.cpp plan to fit (fragmentation, other users).
        Empty means 1024 for llama.cpp and 0 for vLLM (whose C(gpu_memory_utilization) already leaves room).
    type: int
  memory_basis:
    description:
      - Plan against the GPUs' free memory (V(free)) or their total memory (V(total), for when the instances
        being planned already run and hold the memory that is re-planned).
    type: str
    choices: [free, total]
    default: free
  fail_on_refusal:
    description:
      - Fail the task when any instance does not fit, with every refusal (each names its instance).
    type: bool
    default: true
extends_documentation_fragment:
  - llmops.serving.attributes
  - llmops.serving.attributes.info_module
seealso:
  - module: llmops.serving.gguf_info
    description: The model metadata a llama.cpp plan needs (local file or remote header).
  - module: llmops.serving.gpu_facts
    description: The GPUs and their free memory.
"""

EXAMPLES = r"""
- name: Describe the model from its header
  llmops.serving.gguf_info:
    path: /home/models/Qwen3.6-27B-UD-Q5_K_XL.gguf
  register: qwen_gguf

- name: Plan the L20 instance before anything restarts
  llmops.serving.memory_plan_info:
    gpus: "{{ llmops_gpus }}"
    instances:
      - name: qwen36-27b
        gpus: [2, 3]
        model: "{{ qwen_gguf }}"
        settings: "{{ l20_qwen_settings }}"
      - name: qwen36-27b-fp8
        engine: vllm
        gpus: [0, 1]
        model_dir: /home/models/Qwen3.6-27B-FP8
        settings: "{{ l20_vllm_settings }}"
  register: plan

- name: Plan a model larger than one node on Ray cluster ray_cluster (TP 4 within each node, PP 2)
  llmops.serving.memory_plan_info:
    gpus: "{{ llmops_gpus }}"
    instances:
      - name: big-fp8
        engine: vllm
        model_dir: /home/models/Big-FP8
        settings: {tensor_parallel_size: 4, pipeline_parallel_size: 2, distributed_executor_backend: ray}
        ray_cluster: ray_cluster
        nodes:
          - host: gpu-head
            gpus: "{{ hostvars['gpu-head'].llmops_gpus.gpus }}"
          - host: gpu-worker1
            gpus: "{{ hostvars['gpu-worker1'].llmops_gpus.gpus }}"
            num_gpus: 4

- name: Show the per-GPU figures
  ansible.builtin.debug:
    msg: "{{ plan.messages }}"
"""

RETURN = r"""
plans:
  description:
    - One plan per instance name. llama.cpp plans have C(fits), C(ctx_size), C(parallel), C(tensor_split)
      (given, or derived from free memory), C(tensor_split_derived), C(host) (bytes kept in host memory),
      C(gpus) (per GPU C(index), C(name), C(layers) [first, last], C(weights), C(kv), C(draft_kv),
      C(recurrent), C(compute), C(draft_compute), C(pipeline_copies) (the graph-input copies of pipeline
      parallelism), C(overhead), C(total) in bytes and C(headroom_mib)), C(pipeline_parallel),
      C(total_bytes), C(max_ctx_size) (the largest context that fits at this parallel), C(max_parallel)
      (searched up to llama.cpp's limit of 256 slots), C(message), C(refusal) (null when it fits),
      C(suggestions) and C(warnings) (a context per sequence above the model's trained context, as llama.cpp
      warns; each is also a task warning).
    - Inputs are checked before planning - C(parallel) -1 (auto) or 1 to 256, C(batch_size) and
      C(ubatch_size) at least 1, C(tensor_split) shares finite and not negative, C(tensor_parallel_size)
      and C(pipeline_parallel_size) at least 1, C(gpu_memory_utilization) above 0 and at most 1, GPU
      memory and context lengths finite whole numbers - and a refusal names the instance and the setting.
    - C(planned) is false (and C(fits) null) when the model cannot be read on the node yet (a check-mode first
      run, a model directory without C(config.json) layer counts or weights); C(message) says why.
    - Host-memory llama.cpp plans (no GPUs) have C(device) V(host), C(gpus) empty, C(host) with the
      breakdown, C(host_memory_mib), C(host_headroom_mib) and C(fits) null when O(host_memory_mib) is not
      given.
    - vLLM plans also have C(tensor_parallel_size), C(weights_per_rank), C(kv_bytes_per_token), C(kv_tokens)
      and C(max_concurrency).
    - vLLM plans on a Ray cluster also have C(ray_cluster), C(nodes) (the hosts, head first) and
      C(pipeline_parallel_size) (C(tensor_parallel_size) is then the TP size alone); each of their C(gpus)
      rows has C(host), and a refusal names the host and GPU that is short. Weights and KV per rank are
      the model's / (TP x PP), an even split of the layers over the pipeline stages.
  returned: always
  type: dict
  sample: {"qwen36-27b": {"fits": true, "ctx_size": 262144, "parallel": 2, "tensor_split": [0.5, 0.5],
           "max_ctx_size": 262144, "refusal": null}}
messages:
  description: One line per instance, per GPU the memory used and the headroom.
  returned: always
  type: list
  elements: str
  sample: ["qwen36-27b: GPU 2 14,776 MiB used, 31,292 MiB headroom, GPU 3 16,033 MiB used,
           30,035 MiB headroom; host 960 MiB"]
refusals:
  description: The refusal of every instance that does not fit (empty when all fit).
  returned: always
  type: list
  elements: str
  sample: []
"""

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.llmops.serving.plugins.module_utils._memory_plan import plan as memory_plan  # noqa: E402
from ansible_collections.llmops.serving.plugins.module_utils._model_format import gguf  # noqa: E402
from ansible_collections.llmops.serving.plugins.module_utils.module_guard import run_module  # noqa: E402

ARGUMENT_SPEC = dict(
    instances=dict(type="list", elements="dict", required=True),
    gpus=dict(type="raw", required=True),
    host_memory_mib=dict(type="int"),
    overhead_mib=dict(type="int"),
    min_headroom_mib=dict(type="int"),
    memory_basis=dict(type="str", choices=["free", "total"], default="free"),
    fail_on_refusal=dict(type="bool", default=True),
)


def main():
    run_module(AnsibleModule, "memory_plan_info", _run, argument_spec=ARGUMENT_SPEC)


def _run(module):
    result, warnings, error = memory_plan.plan_result(module.params, read_gguf=gguf.inspect)
    for warning in warnings:
        module.warn(warning)
    if error:
        module.fail_json(msg=error, **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
