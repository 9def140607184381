# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""llama-server's flag table: settings -> argv, folded and deprecated settings, extra_args refusals."""
import json

import pytest
from ansible_collections.llmops.serving.plugins.plugin_utils import llama_server_flags as lsf
from ansible_collections.llmops.serving.plugins.plugin_utils.llama_server_flags import LlamaServerArgsError

from tests.unit.plugins.plugin_utils.serving_helpers import pairs


def test_every_setting_kind_renders():
    argv = lsf.build_argv({
        "ctx_size": 4096, "kv_unified": False, "cont_batching": True, "flash_attn": True, "reasoning": False,
        "tensor_split": [3, 1], "metrics": False, "temp": 0.7, "chat_template_kwargs": {"b": 1, "a": "x"},
        "spec_type": ["draft-mtp", "ngram-mod"],
    })
    got = pairs(argv)
    assert got["--ctx-size"] == "4096"
    assert got["--no-kv-unified"] is True and "--kv-unified" not in got
    assert got["--cont-batching"] is True
    assert got["--flash-attn"] == "on" and got["--reasoning"] == "off"
    assert got["--tensor-split"] == "3,1"
    assert "--metrics" not in got
    assert got["--temp"] == "0.7"
    assert json.loads(got["--chat-template-kwargs"]) == {"a": "x", "b": 1}
    assert got["--spec-type"] == "draft-mtp,ngram-mod"


@pytest.mark.parametrize("mmap,mlock,mode", [
    (False, True, "mlock"), (True, True, "mmap+mlock"), (False, False, "none"), (True, False, "mmap"),
    (None, True, "mmap+mlock"),
])
def test_mmap_mlock_fold_into_load_mode(mmap, mlock, mode):
    settings = {"mlock": mlock}
    if mmap is not None:
        settings["mmap"] = mmap
    got = pairs(lsf.build_argv(settings))
    assert got == {"--load-mode": mode}
    assert lsf.uses_mlock(settings) == mode.endswith("mlock")


def test_load_mode_and_mmap_together_is_refused():
    with pytest.raises(LlamaServerArgsError, match="both set"):
        lsf.build_argv({"mmap": False, "load_mode": "none"})


def test_enable_thinking_kwarg_becomes_reasoning_and_conflicts_are_refused():
    got = pairs(lsf.build_argv({"chat_template_kwargs": {"enable_thinking": False, "x": 1}}))
    assert got["--reasoning"] == "off"
    assert json.loads(got["--chat-template-kwargs"]) == {"x": 1}
    got = pairs(lsf.build_argv({"chat_template_kwargs": '{"enable_thinking": true}'}))
    assert got == {"--reasoning": "on"}
    with pytest.raises(LlamaServerArgsError, match="contradicts"):
        lsf.build_argv({"chat_template_kwargs": {"enable_thinking": True}, "reasoning": "off"})


def test_draft_cache_types_follow_main_unless_set():
    got = pairs(lsf.build_argv({"spec_type": "draft-mtp", "cache_type_k": "q8_0", "cache_type_v": "q4_0"}))
    assert got["--spec-draft-type-k"] == "q8_0" and got["--spec-draft-type-v"] == "q4_0"
    got = pairs(lsf.build_argv({"spec_type": "draft-mtp", "cache_type_k": "q8_0",
                                "spec_draft_cache_type_k": "f16"}))
    assert got["--spec-draft-type-k"] == "f16"
    got = pairs(lsf.build_argv({"spec_type": "ngram-mod", "cache_type_k": "q8_0"}))
    assert "--spec-draft-type-k" not in got


@pytest.mark.parametrize("settings,message", [
    ({"ctx": 4096}, "unknown llama-server setting 'ctx'"),
    ({"port": 1}, "instance field"),
    ({"cache_type_k": "q9_9"}, "must be one of"),
    ({"flash_attn": "maybe"}, "on, off, auto"),
    ({"kv_unified": "yes"}, "true or false"),
    ({"ctx_size": True}, "expected a number"),
    ({"split_mode": ""}, "empty"),
    ({"chat_template_kwargs": "{not json"}, "not valid JSON"),
])
def test_bad_settings_say_what_to_do(settings, message):
    with pytest.raises(LlamaServerArgsError, match=message):
        lsf.build_argv(settings)


@pytest.mark.parametrize("arg,message", [
    ("--api-key=abc", "secrets never go on a command line"),
    ("--api-key", "secrets never go on a command line"),
    ("--draft-max", "removed"),
    ("--draft", "removed"),
    ("--no-mmap", "legacy"),
    ("--draft-p-min", "legacy"),
    ("-c", "setting `ctx_size`"),
    ("--ctx-size=8", "setting `ctx_size`"),
])
def test_extra_args_refusals(arg, message):
    with pytest.raises(LlamaServerArgsError, match=message):
        lsf.build_argv({}, extra_args=[arg])


def test_extra_args_pass_through_last():
    argv = lsf.build_argv({"ctx_size": 8}, extra_args=["--no-warmup", "--cache-reuse", 256])
    assert argv[-3:] == ["--no-warmup", "--cache-reuse", "256"]
