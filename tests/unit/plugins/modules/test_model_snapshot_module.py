# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The model_snapshot module as Ansible runs it: its documentation agrees with its option schema, check
mode and diff, file attributes on every file, the manifest fast path after chmod, failures without the
token."""
import json
import os
import stat

import pytest
import yaml
from ansible_collections.llmops.serving.plugins.module_utils._snapshot import options as snapshot_options
from ansible_collections.llmops.serving.plugins.modules import model_snapshot

from tests.fixtures.fake_hub import checkpoint
from tests.fixtures.fake_hub.helpers import snapshot_params
from tests.fixtures.fake_hub.server import FakeHub
from tests.helpers import assert_docs_match_argument_spec, run_module_file
from tests.unit.plugins.modules.test_gguf_module import capture_module_kwargs

RETURNS = {"path", "snapshot_dir", "manifest", "repo", "source", "revision", "commit", "id", "sha256",
           "total_size", "file_count", "downloaded_bytes", "resumed_from", "reused_bytes", "fetched",
           "verified", "update_available", "previous", "actions", "elapsed_s", "msg"}


def test_documentation_equals_the_option_schema():
    kwargs = capture_module_kwargs(model_snapshot)
    assert_docs_match_argument_spec(model_snapshot, kwargs, RETURNS)
    assert kwargs["argument_spec"] == snapshot_options.OPTIONS and kwargs["add_file_common_args"]
    assert snapshot_options.OPTIONS["token"]["no_log"] is True
    doc = yaml.safe_load(model_snapshot.DOCUMENTATION)
    assert doc["attributes"]["check_mode"]["support"] == "full" == doc["attributes"]["diff_mode"]["support"]


@pytest.fixture
def qhub(tmp_path):
    root = tmp_path / "hub"
    root.mkdir()
    checkpoint.write_checkpoint(root / "Qwen" / "Qwen3.6-27B-FP8")
    hub = FakeHub(str(root)).start()
    yield hub
    hub.stop()


def run(tmp_path, args, check_mode=False, diff=False):
    return run_module_file(tmp_path, "model_snapshot", dict(args, _ansible_diff=diff), check_mode=check_mode)


def test_module_check_mode_diff_attributes_and_fast_path(tmp_path, qhub):
    dest = tmp_path / "models" / "Qwen3.6-27B-FP8"
    args = dict(snapshot_params(qhub, dest), mode="0640")
    checked = run(tmp_path, args, check_mode=True, diff=True)
    assert checked["changed"] and "would build snapshot" in checked["msg"] and not os.path.exists(str(dest))
    assert "config.json" in checked["diff"]["after"] and checked["diff"]["before"] == ""
    done = run(tmp_path, args, diff=True)
    assert done["changed"] and done["verified"] == "download" and done["path"] == str(dest), done
    assert "model-00001-of-00002.safetensors" in done["diff"]["after"]
    snap = done["snapshot_dir"]
    for dirpath, _dirs, files in os.walk(snap):
        for name in files:
            if name != ".llmops-snapshot.json":
                assert stat.S_IMODE(os.lstat(os.path.join(dirpath, name)).st_mode) == 0o640, name
    # chmod moved every ctime, and the manifest was written after it: the re-run hashes nothing
    again = run(tmp_path, args)
    assert not again["changed"] and again["verified"] == "manifest", again
    # another mode: applied, manifest re-stamped, still nothing hashed on the next run
    changed = run(tmp_path, dict(args, mode="0644"))
    assert changed["changed"] and changed["verified"] == "manifest"
    assert run(tmp_path, dict(args, mode="0644"))["verified"] == "manifest"
    manifest = json.load(open(done["manifest"]))
    assert manifest["commit"] == done["commit"] and len(manifest["files"]) == done["file_count"] == 9


def test_module_failure_is_one_message_without_the_token(tmp_path, qhub):
    token = "hf_ModuleToken0123456789"
    result = run(tmp_path, snapshot_params(qhub, tmp_path / "m" / "x", repo="Qwen/absent", token=token))
    assert result["failed"] and "HTTP 404" in result["msg"] and token not in json.dumps(result)
