# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""memory_plan_info's inputs out of range or of the wrong shape (issue 23): each is refused with a PlanError
that names the instance and the setting (never a traceback, never a plan that "fits" what the engine refuses);
llama.cpp's own limits (256 slots) and warnings (context above the trained context) are the planner's."""
import pytest
from ansible_collections.llmops.serving.plugins.module_utils._memory_plan import plan as mp

from tests.unit.plugins.module_utils.test_memory_plan import l20, llama_8b, qwen36_27b_hf


def _llama(settings, gpus=None, model=None, inst_gpus=(0,)):
    inst = {"name": "a", "gpus": list(inst_gpus), "model": model or llama_8b(), "settings": settings}
    return mp.plan_instances([inst], gpus if gpus is not None else [l20(0), l20(1)])


def _vllm(settings, gpus=None):
    inst = {"name": "v", "engine": "vllm", "gpus": [0], "model": qwen36_27b_hf(18 * 2 ** 30),
            "settings": settings}
    return mp.plan_instances([inst], gpus if gpus is not None else [l20(0)])


@pytest.mark.parametrize("settings, words", [
    ({"tensor_parallel_size": 0}, "tensor_parallel_size"),
    ({"tensor_parallel_size": -1}, "tensor_parallel_size"),
    ({"pipeline_parallel_size": 0}, "pipeline_parallel_size"),
    ({"gpu_memory_utilization": "most"}, "gpu_memory_utilization"),
    ({"gpu_memory_utilization": float("nan")}, "gpu_memory_utilization"),
    ({"gpu_memory_utilization": 1.5}, "gpu_memory_utilization"),
    ({"gpu_memory_utilization": -0.5}, "gpu_memory_utilization"),
    ({"max_model_len": float("inf")}, "max_model_len"),
    ({"max_num_seqs": 0}, "max_num_seqs"),
])
def test_vllm_settings_out_of_range_are_refused_by_name(settings, words):
    with pytest.raises(mp.PlanError, match="instance v: setting %s" % words):
        _vllm(settings)


@pytest.mark.parametrize("settings, words", [
    ({"parallel": 10 ** 9}, "parallel"),
    ({"parallel": 257}, "parallel"),
    ({"parallel": 0}, "parallel"),
    ({"parallel": float("nan")}, "parallel"),
    ({"batch_size": 0}, "batch_size"),
    ({"ubatch_size": -4}, "ubatch_size"),
    ({"main_gpu": "first"}, "main_gpu"),
    ({"ctx_size": "lots"}, "ctx_size"),
    ({"ctx_size": -1}, "ctx_size"),
    ({"tensor_split": [float("nan"), 1]}, "tensor_split"),
    ({"tensor_split": ["inf", 1]}, "tensor_split"),
    ({"n_gpu_layers": "many"}, "n_gpu_layers"),
    ({"cache_type_k": {"q8_0": 1}}, "cache_type_k"),
])
def test_llama_settings_out_of_range_are_refused_by_name(settings, words):
    with pytest.raises(mp.PlanError, match="instance a: setting %s" % words):
        _llama(settings)


@pytest.mark.parametrize("gpus, words", [
    ("0,1", "gpus must be gpu_facts' llmops_gpus"),
    (-1, "gpus must be gpu_facts' llmops_gpus"),
    (["0"], r"gpus\[0\] must be a mapping"),
    ([dict(l20(0), memory_total_mib="lots")], r"gpus\[0\].memory_total_mib must be a number"),
    ([dict(l20(0), memory_free_mib=float("nan"))], r"gpus\[0\].memory_free_mib must be a finite number"),
    ({"gpus": {"index": 0}}, r"gpus.gpus must be"),
])
def test_gpu_entries_of_the_wrong_shape_are_refused(gpus, words):
    with pytest.raises(mp.PlanError, match=words):
        _llama({"ctx_size": 4096}, gpus=gpus)


def test_instance_shapes_and_model_numbers_are_refused_by_name():
    with pytest.raises(mp.PlanError, match=r"instances\[0\] must be a mapping"):
        mp.plan_instances(["a"], [l20(0)])
    with pytest.raises(mp.PlanError, match="instance a: settings must be a mapping"):
        mp.plan_instances([{"name": "a", "gpus": [0], "model": llama_8b(), "settings": [1]}], [l20(0)])
    with pytest.raises(mp.PlanError, match="instance a: gpus must be a list of GPU indexes"):
        mp.plan_instances([{"name": "a", "gpus": [{"index": 0}], "model": llama_8b()}], [l20(0)])
    with pytest.raises(mp.PlanError, match="instance a: the model's context_length must be a number"):
        _llama({}, model=dict(llama_8b(), context_length="long"))
    with pytest.raises(mp.PlanError, match="instance a: cannot plan with the model"):
        _llama({"ctx_size": 4096}, model=dict(llama_8b(), layer_bytes="big"))
    with pytest.raises(mp.PlanError, match="overhead_mib must be from 0"):
        mp.plan_instances([], [l20(0)], overhead_mib=-5)


def test_parallel_at_llamas_limit_is_planned_and_max_parallel_is_not_capped_at_64():
    plan = _llama({"ctx_size": 16384, "parallel": 256}, inst_gpus=(0,))[0]["a"]  # accepted: the limit itself
    assert plan["parallel"] == 256
    plan = _llama({"ctx_size": 16384, "parallel": 2}, inst_gpus=(0,))[0]["a"]
    assert plan["fits"] and plan["max_parallel"] > 64  # one L20 holds far more than 64 slots of 16K in all


def test_context_above_the_trained_context_warns_as_llama_cpp_does():
    plan = _llama({"ctx_size": 262144, "parallel": 1, "cache_type_k": "q8_0", "cache_type_v": "q8_0"},
                  inst_gpus=(0, 1))[0]["a"]
    assert any("above the model's trained context (131072)" in w for w in plan["warnings"]), plan["warnings"]
    plan = _llama({"ctx_size": 262144, "parallel": 2}, inst_gpus=(0, 1))[0]["a"]  # 131072 per sequence
    assert plan["warnings"] == []
