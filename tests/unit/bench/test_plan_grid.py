# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""bench/plan/run.py without llama-server: the grid covers every value it promises, the comparison folds
the log's categories the planner does not name, and the seed settings come from the L20 inventory."""
from bench.plan import run


def test_grid_covers_every_value_with_unique_names():
    cases = run.grid()
    names = [name for name, _, _ in cases]
    assert len(names) == len(set(names)) == 28
    seen = {}
    for _, arch, s in cases:
        for key in ("ctx_size", "parallel", "cache_type_k", "kv_unified", "ubatch_size", "spec_draft_n_max"):
            seen.setdefault(key, set()).add(s.get(key))
        seen.setdefault("arch", set()).add(arch)
        assert arch == "qwen35" or not s.get("spec_type")  # only qwen35 has an MTP block
    assert seen["ctx_size"] == {4096, 16384, 65536}
    assert seen["parallel"] == {1, 2, 4}
    assert seen["cache_type_k"] == {"f16", "q8_0"}
    assert seen["kv_unified"] == {True, False}
    assert seen["ubatch_size"] == {128, 512}
    assert seen["spec_draft_n_max"] == {None, 1, 3}
    assert seen["arch"] == {"llama", "qwen35"}


def test_compare_folds_draft_output_only_when_the_plan_lacks_it():
    logged = {"weights": 10, "kv": 4, "output": 2, "draft_output": 1, "draft_recurrent": 0, "draft_kv": 3}
    rows = run.compare(logged, {"weights": 9, "kv": 4, "output": 3, "draft_kv": 3})
    assert rows["output"] == (3, 3) and rows["weights"] == (10, 9) and rows["draft_kv"] == (3, 3)
    rows = run.compare(logged, {"weights": 9, "output": 2, "draft_output": 1})
    assert rows["output"] == (2, 2) and rows["kv"] == (4, None)


def test_seed_settings_are_the_l20_profile():
    s = run.seed_settings()
    assert (s["ctx_size"], s["parallel"], s["kv_unified"], s["cache_type_k"], s["spec_type"],
            s["spec_draft_n_max"], s["tensor_split"], s["ubatch_size"]) == (
        262144, 2, True, "q8_0", "draft-mtp", 3, [0.5, 0.5], 128)
