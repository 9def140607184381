# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The safetensors_info module as Ansible runs it: documentation equals the argument spec; a local model
directory and the same repo on the hub give the same vLLM summary; a bad shard fails with one message."""
import json
import os

import pytest
from ansible_collections.llmops.serving.plugins.modules import safetensors_info

from tests.fixtures.fake_hub import checkpoint
from tests.fixtures.fake_hub.server import FakeHub
from tests.helpers import assert_docs_match_argument_spec, run_module_file
from tests.unit.plugins.modules.test_gguf_module import capture_module_kwargs


def test_documentation_matches_argument_spec():
    kwargs = capture_module_kwargs(safetensors_info)
    assert_docs_match_argument_spec(safetensors_info, kwargs, {"vllm", "shards", "commit", "remote"})
    assert kwargs["argument_spec"]["token"]["no_log"] is True


@pytest.fixture
def hub(tmp_path):
    checkpoint.write_checkpoint(tmp_path / "hub" / "Qwen" / "Qwen3.6-27B-FP8")
    h = FakeHub(str(tmp_path / "hub")).start()
    yield h
    h.stop()


def test_local_and_remote_give_the_same_summary(tmp_path, hub):
    model_dir = tmp_path / "hub" / "Qwen" / "Qwen3.6-27B-FP8"
    local = run_module_file(tmp_path, "safetensors_info", {"path": str(model_dir)})
    remote = run_module_file(tmp_path, "safetensors_info", {"repo": checkpoint.REPO, "endpoint": hub.url},
                             check_mode=True)
    assert not local.get("failed") and not remote.get("failed"), (local, remote)
    assert dict(local["vllm"], model_dir=None) == dict(remote["vllm"], model_dir=None)
    assert local["vllm"]["num_hidden_layers"] == 4
    assert local["vllm"]["architectures"] == ["Qwen3_5ForConditionalGeneration"]
    assert remote["commit"] == hub.commit(checkpoint.REPO) and remote["remote"]["requests"] == 8
    assert not local["changed"] and not remote["changed"]


def test_a_bad_shard_fails_with_one_message(tmp_path, hub):
    d = tmp_path / "hub" / "Qwen" / "Qwen3.6-27B-FP8"
    shard = d / "model-00002-of-00002.safetensors"
    shard.write_bytes(shard.read_bytes()[:-1])
    token = "hf_InfoModuleToken0123456789"
    for args in ({"path": str(d)}, {"repo": checkpoint.REPO, "endpoint": hub.url, "token": token}):
        out = run_module_file(tmp_path, "safetensors_info", args)
        assert out["failed"] and "truncated or padded" in out["msg"] and token not in json.dumps(out), out


def test_a_fifo_config_json_fails_at_once_naming_it(tmp_path):
    d = tmp_path / "model"
    checkpoint.write_checkpoint(d)
    (d / "config.json").unlink()
    os.mkfifo(str(d / "config.json"))
    out = run_module_file(tmp_path, "safetensors_info", {"path": str(d)}, timeout=20)  # it hung before
    assert out["failed"] and "config.json %s is a FIFO (named pipe)" % (d / "config.json") in out["msg"], out


def test_thirty_million_layers_fail_fast_with_the_key_named(tmp_path):
    d = tmp_path / "model"
    checkpoint.write_checkpoint(d)
    config = checkpoint.config()
    config["text_config"]["num_hidden_layers"] = 30000000
    (d / "config.json").write_text(json.dumps(config))
    out = run_module_file(tmp_path, "safetensors_info", {"path": str(d)}, timeout=20)  # 26 s, 540 MB before
    assert out["failed"] and "num_hidden_layers must be from 0 to 4096, got 30000000" in out["msg"], out
