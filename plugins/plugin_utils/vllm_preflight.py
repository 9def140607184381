# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""vLLM's checks of an instance against its GPUs and its Ray cluster, before anything starts.

preflight(settings, gpus, gpu_entries, running=, cluster=) is the vLLM engine's preflight (vllm_flags.py
exposes it to the instance planner, instance_plan.py): tensor_parallel_size x pipeline_parallel_size against
the instance's GPUs or the Ray cluster's nodes (tensor parallel within a node, pipeline parallel across
nodes), gpu_memory_utilization against each GPU's free memory, FP8 on GPUs without FP8 tensor cores. What
vLLM would fail on is raised (VllmArgsError); the rest are warnings. The command line itself is vllm_flags.py.

Controller-only (plugin_utils), unit-tested by tests/unit/plugins/plugin_utils/test_vllm_flags.py through
vllm_flags.preflight.
"""
from __future__ import absolute_import, division, print_function

from ansible_collections.llmops.serving.plugins.module_utils._memory_plan.vllm import (
    DEFAULT_GPU_MEMORY_UTILIZATION,
)
from ansible_collections.llmops.serving.plugins.plugin_utils.serving_errors import VllmArgsError, is_number

__metaclass__ = type

# The first compute capability with FP8 tensor cores (Ada).
FP8_NATIVE_COMPUTE_CAP = (8, 9)


def _compute_cap(entry):
    try:
        return tuple(int(part) for part in str(entry.get("compute_cap")).split(".")[:2])
    except ValueError:
        return None


def _parallel_size(settings, key):
    value = settings.get(key)
    if value is None:
        return 1
    if isinstance(value, bool) or not (is_number(value) or str(value).isdigit()) or int(value) < 1:
        raise VllmArgsError("setting %s must be a positive number, got %r" % (key, value))
    return int(value)


def _memory_findings(settings, gpu_entries, running):
    """gpu_memory_utilization x total memory against each GPU's free memory -> (refusals, warnings)."""
    utilization = settings.get("gpu_memory_utilization")
    utilization = DEFAULT_GPU_MEMORY_UTILIZATION if utilization is None else float(utilization)
    refusals, warnings = [], []
    for gpu in gpu_entries:
        total, free = gpu.get("memory_total_mib"), gpu.get("memory_free_mib")
        if total is None or free is None:
            continue
        wanted = int(utilization * total)
        if wanted <= free:
            continue
        text = ("GPU %s: gpu_memory_utilization %s x %d MiB = %d MiB, but only %d MiB are free"
                % (gpu.get("index"), utilization, total, wanted, free))
        (warnings if running else refusals).append(text)
    return refusals, warnings


def _fp8_warning(settings, gpu_entries):
    """FP8 weights or KV cache on GPUs without FP8 tensor cores (below sm_89): a warning, or None."""
    fp8 = [key for key in ("quantization", "kv_cache_dtype")
           if str(settings.get(key) or "").startswith("fp8")]
    old = [e for e in gpu_entries if _compute_cap(e) and _compute_cap(e) < FP8_NATIVE_COMPUTE_CAP]
    if not (fp8 and old):
        return None
    return ("%s FP8 on GPU(s) %s (compute capability %s, below 8.9): no FP8 tensor cores, so FP8 is "
            "weight-only/emulated there (dequantized to FP16): it saves memory (seed 003 on 2080 Ti: FP8 KV "
            "cache +79.5%% tokens) but does not make decoding faster"
            % ("/".join(fp8), ", ".join(str(e.get("index")) for e in old),
               ", ".join(sorted(set(str(e.get("compute_cap")) for e in old)))))


def _layout_hint(nodes):
    """What TP/PP to use on these nodes: TP the GPUs of a node, PP the nodes (when every node has as many)."""
    counts = set(n["num_gpus"] for n in nodes)
    if len(counts) == 1:
        return ("use tensor_parallel_size %d (the GPUs of one node) and pipeline_parallel_size %d (the nodes)"
                % (counts.pop(), len(nodes)))
    return ("the nodes declare different GPU counts (%s): make them equal (ray_cluster_num_gpus) so that one "
            "tensor-parallel group fills each node"
            % ", ".join("%s %d" % (n["host"], n["num_gpus"]) for n in nodes))


def _ray_cluster_findings(tp, pp, gpus, cluster):
    """A vLLM instance on a Ray cluster (issue's layout: tensor parallel within a node, pipeline parallel
    across nodes): TP x PP = the GPUs the nodes declare to Ray, TP <= each node's GPUs, PP <= the nodes.
    `cluster`: {"group", "nodes": [{"host", "num_gpus" (None: unknown)}] or None (not known here)}.
    Returns (refusals, warnings); what cannot be known is a warning, never a guess."""
    group, nodes = cluster.get("group"), cluster.get("nodes")
    refusals, warnings = [], []
    if nodes is None:
        warnings.append("ray_cluster %s: the cluster's nodes are not known here (no hostvars/groups given), "
                        "so tensor_parallel_size x pipeline_parallel_size = %d is not checked against its "
                        "GPUs"
                        % (group, tp * pp))
        if gpus and tp > len(gpus):
            refusals.append("tensor_parallel_size %d is more than the %d GPU(s) of the head: tensor "
                            "parallelism stays within a node (pipeline parallelism spans the nodes); lower "
                            "tensor_parallel_size to at most %d and raise pipeline_parallel_size"
                            % (tp, len(gpus), len(gpus)))
        return refusals, warnings
    known = [n for n in nodes if n.get("num_gpus") is not None]
    unknown = [n["host"] for n in nodes if n.get("num_gpus") is None]
    small = [n for n in known if tp > n["num_gpus"]]
    if small:
        least = min(n["num_gpus"] for n in small)
        refusals.append("tensor_parallel_size %d is more than the GPUs %s declare(s) to Ray (%s): tensor "
                        "parallelism stays within a node (pipeline parallelism spans the nodes of "
                        "ray_cluster %s); lower tensor_parallel_size to at most %d and raise "
                        "pipeline_parallel_size"
                        % (tp, ", ".join(n["host"] for n in small),
                           ", ".join("%s %d" % (n["host"], n["num_gpus"]) for n in small), group, least))
    if pp > len(nodes):
        refusals.append("pipeline_parallel_size %d is more than the %d node(s) of ray_cluster %s (%s): one "
                        "pipeline stage per node; lower pipeline_parallel_size to at most %d and raise "
                        "tensor_parallel_size" % (pp, len(nodes), group, ", ".join(n["host"] for n in nodes),
                                                  len(nodes)))
    if unknown:
        warnings.append("ray_cluster %s: the GPUs of %s are not known (no llmops_gpus, no "
                        "ray_cluster_num_gpus), so tensor_parallel_size x pipeline_parallel_size = %d is not "
                        "checked against the cluster's GPUs" % (group, ", ".join(unknown), tp * pp))
    else:
        total = sum(n["num_gpus"] for n in nodes)
        if tp * pp != total:
            refusals.append("tensor_parallel_size x pipeline_parallel_size = %d x %d = %d, but ray_cluster "
                            "%s declares %d GPU(s) to Ray (%s): they must be equal; %s"
                            % (tp, pp, tp * pp, group, total,
                               ", ".join("%s %d" % (n["host"], n["num_gpus"]) for n in nodes),
                               _layout_hint(nodes)))
    return refusals, warnings


def preflight(settings, gpus, gpu_entries, running=False, cluster=None):
    """Check the instance's settings against its GPUs (llmops_gpus entries). Raises what vLLM would fail
    on; returns warnings (FP8 emulated below sm_89; memory held by the instance's own running process).

    `cluster` (an instance with ray_cluster; see _ray_cluster_findings) checks the parallel sizes against
    the Ray cluster's nodes instead of the instance's own GPUs. Without it, distributed_executor_backend ray
    is a single-node Ray executor (legal in vLLM) and the instance's GPUs rule as for any instance."""
    tp = _parallel_size(settings, "tensor_parallel_size")
    pp = _parallel_size(settings, "pipeline_parallel_size")
    parallel = tp * pp
    if cluster is not None:
        refusals, warnings = _ray_cluster_findings(tp, pp, gpus, cluster)
        if refusals:
            raise VllmArgsError("ray_cluster %s: %s" % (cluster.get("group"), "; ".join(refusals)))
        return warnings + _gpu_findings(settings, gpu_entries, running)
    if gpus and parallel != len(gpus):
        raise VllmArgsError(
            "tensor_parallel_size x pipeline_parallel_size = %d, but the instance has %d GPU(s) (%s): they "
            "must be equal" % (parallel, len(gpus), ", ".join(str(g) for g in gpus)))
    if not gpus and parallel > 1:
        raise VllmArgsError("tensor_parallel_size x pipeline_parallel_size = %d needs that many GPUs: set "
                            "the instance's gpus" % parallel)
    return _gpu_findings(settings, gpu_entries, running)


def _gpu_findings(settings, gpu_entries, running):
    """FP8 and free-memory checks of the instance's GPUs on this node: raises refusals, returns warnings."""
    fp8 = _fp8_warning(settings, gpu_entries)
    warnings = [fp8] if fp8 else []
    refusals, memory_warnings = _memory_findings(settings, gpu_entries, running)
    if refusals:
        raise VllmArgsError("%s. Lower gpu_memory_utilization or free the GPU(s)" % "; ".join(refusals))
    return warnings + ["%s (the instance's own running process holds that memory now)" % w
                       for w in memory_warnings]
