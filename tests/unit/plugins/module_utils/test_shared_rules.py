# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Rules the controller and the node share (each written once in module_utils): how a GPU is named
(gpu_names.py) and which KV cache types a llama.cpp draft context gets (llama_cpp_spec.py), checked on both
sides that use them."""
import pytest
from ansible_collections.llmops.serving.plugins.module_utils._gpu import checks
from ansible_collections.llmops.serving.plugins.module_utils._gpu import names as gpu_names
from ansible_collections.llmops.serving.plugins.module_utils._memory_plan import llama_cpp_spec
from ansible_collections.llmops.serving.plugins.module_utils._memory_plan import plan as mp
from ansible_collections.llmops.serving.plugins.plugin_utils import gpu_assignment, llama_server_flags

from tests.unit.plugins.module_utils.test_memory_plan import SEED_SETTINGS, qwen36_27b

ENTRY = {"index": 2, "uuid": "GPU-4f0a2b1c-aaaa-bbbb-cccc-0123456789ab"}


@pytest.mark.parametrize("name, matches", [
    (2, True), ("2", True), (" 2 ", True), ("02", True), (3, False), ("3", False),
    ("GPU-4f0a2b1c-aaaa-bbbb-cccc-0123456789ab", True), ("gpu-4F0A2B1C-AAAA-BBBB-CCCC-0123456789AB", True),
    ("GPU-4f0a2b1c-aaaa-bbbb-cccc-000000000000", False), ("", False),
])
def test_a_gpu_is_named_by_index_or_uuid(name, matches):
    assert gpu_names.matches_gpu(name, ENTRY) is matches
    # gpu_facts' devices (node) and an instance's gpus (controller) follow the same rule
    assert checks.is_wanted(ENTRY, [name]) is matches
    facts = {"present": True, "gpus": [ENTRY]}
    assert gpu_assignment.gpu_entries([name], facts) == ([ENTRY] if matches else [])


def test_an_entry_without_uuid_or_index_matches_no_such_name():
    assert not gpu_names.matches_gpu("GPU-x", {"index": 0, "uuid": None})
    assert not gpu_names.matches_gpu(0, {"index": None, "uuid": "GPU-x"})


@pytest.mark.parametrize("settings, rendered", [
    # no draft context: nothing added
    ({"cache_type_k": "q8_0"}, {}),
    ({"spec_type": "ngram-simple", "cache_type_k": "q8_0"}, {}),
    # a draft context follows the main types unless its own are set
    ({"spec_type": "draft-mtp", "cache_type_k": "q8_0", "cache_type_v": "q4_0"},
     {"spec_draft_cache_type_k": "q8_0", "spec_draft_cache_type_v": "q4_0"}),
    ({"spec_type": ["draft-simple"], "cache_type_k": "q8_0", "spec_draft_cache_type_k": "f16"}, {}),
    # nothing set: llama.cpp's own default (f16), no flag
    ({"spec_type": "draft-mtp"}, {}),
])
def test_draft_cache_settings(settings, rendered):
    assert llama_cpp_spec.draft_cache_settings(settings) == rendered


def test_the_plan_counts_the_draft_cache_the_command_line_gives():
    """The MTP draft's KV cache in the plan is of the types on the llama-server command line."""
    settings = dict(SEED_SETTINGS, cache_type_k="q8_0", cache_type_v="q8_0")
    argv = llama_server_flags.build_argv(settings, model="/m.gguf", host="127.0.0.1", port=8080, gpus=[2, 3])
    flags = dict(zip(argv, argv[1:], strict=False))
    assert llama_cpp_spec.draft_cache_types(settings) == (flags["--spec-draft-type-k"],
                                                          flags["--spec-draft-type-v"]) == ("q8_0", "q8_0")
    s = mp.llama_settings(qwen36_27b(), settings)
    assert (s["draft_type_k"], s["draft_type_v"]) == ("q8_0", "q8_0")
    f16 = mp.llama_cpp_breakdown(qwen36_27b(), dict(settings, spec_draft_cache_type_k="f16",
                                                    spec_draft_cache_type_v="f16"))
    assert mp.llama_cpp_breakdown(qwen36_27b(), settings)["draft_kv"] < f16["draft_kv"]
