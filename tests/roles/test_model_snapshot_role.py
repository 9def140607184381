# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Role model with a snapshot item (issue 22), run by ansible-playbook on localhost against the fake hub: the
preflight reads the vLLM model from the hub (llmops_model_headers), the role fetches the snapshot and
publishes it in llmops_models like a file, and a vLLM instance that names the model resolves to the snapshot
directory's config.json; the memory plan gets the same model before and after the download."""
import json
import os
import sys

import pytest
import yaml
from ansible_collections.llmops.serving.plugins.module_utils._memory_plan import plan as mp
from ansible_collections.llmops.serving.plugins.plugin_utils.memory_plan_inputs import memory_plan_inputs
from ansible_collections.llmops.serving.plugins.plugin_utils.serving_errors import ServingError

from tests.fixtures.fake_hub import checkpoint
from tests.fixtures.fake_hub.server import FakeHub
from tests.helpers import run_local_playbook
from tests.unit.plugins.plugin_utils.serving_helpers import GPUS, plan

NAME = "qwen3.6-27b-fp8"
TOKEN = "hf_RoleSnapshotToken0123456789"


@pytest.fixture
def hub(tmp_path):
    checkpoint.write_checkpoint(tmp_path / "hub" / "Qwen" / "Qwen3.6-27B-FP8")
    h = FakeHub(str(tmp_path / "hub"), gated=(checkpoint.REPO,), tokens=(TOKEN,)).start()
    yield h
    h.stop()


def play(tmp_path, hub, item, tasks_from="main", check=False, name="out"):
    out = tmp_path / (name + ".json")
    path = tmp_path / (name + ".yml")
    path.write_text(yaml.safe_dump([{
        "hosts": "localhost", "connection": "local", "gather_facts": False,
        "vars": {"ansible_python_interpreter": sys.executable, "vault_hf_token": TOKEN,
                 "model_models": [item], "model_dir": str(tmp_path / "models"), "model_hf_endpoint": hub.url,
                 "model_hf_token": "{{ vault_hf_token }}", "model_selinux_setype": "",
                 "model_progress_interval": 1, "model_download_timeout": 120, "model_retries": 1},
        "tasks": [
            {"name": "The role", "ansible.builtin.include_role": {"name": "llmops.serving.model",
                                                                    "tasks_from": tasks_from}},
            {"name": "Keep the facts", "ansible.builtin.copy": {
                "content": "{{ {'models': llmops_models | default(none), "
                           "'headers': llmops_model_headers | default(none)} | to_json }}",
                "dest": str(out), "mode": "0600"}, "check_mode": False, "changed_when": False},
        ]}]))
    result, stats = run_local_playbook(path, os.path.dirname(sys.executable),
                                       extra_args=("--check",) if check else ())
    text = result.stdout + result.stderr
    assert TOKEN not in text
    return text, stats, (json.loads(out.read_text()) if out.exists() else None)


def test_snapshot_item_from_preflight_to_a_vllm_instance(tmp_path, hub):
    dest = tmp_path / "models" / "Qwen3.6-27B-FP8"
    item = {"name": NAME, "repo": checkpoint.REPO, "snapshot": True, "dest": str(dest),
            "ignore_patterns": ["README.md"]}
    # preflight: nothing on the node; the vLLM model comes from the hub
    text, stats, facts = play(tmp_path, hub, item, "headers", name="pre")
    assert stats.get("failed") == 0, text
    remote = facts["headers"][NAME]
    assert remote["commit"] == hub.commit(checkpoint.REPO) and remote["remote"]["requests"] == 8
    assert remote["vllm"]["num_hidden_layers"] == 4 and not os.path.lexists(str(dest))
    # check mode: would build, writes nothing
    text, stats, _f = play(tmp_path, hub, item, check=True, name="check")
    assert stats.get("failed") == 0 and not os.path.lexists(str(dest)), text
    # the models stage
    text, stats, facts = play(tmp_path, hub, item, name="models")
    assert stats.get("failed") == 0, text
    rec = facts["models"][NAME]
    assert rec["path"] == rec["dir"] == str(dest) and rec["snapshot"] is True and rec["files"] == 8
    assert rec["commit"] == remote["commit"] and len(rec["sha256"]) == 64 and rec["verified"] == "download"
    assert os.path.islink(str(dest)) and os.path.isfile(str(dest / "config.json"))
    assert not os.path.exists(str(dest / "README.md"))
    assert dict(rec["vllm"], model_dir=None) == dict(remote["vllm"], model_dir=None)
    # a second run: nothing changes, nothing hashed; the headers now come from the node
    text, stats, again = play(tmp_path, hub, item, name="again")
    assert stats.get("failed") == 0 and stats.get("changed") == 0, text
    assert again["models"][NAME]["verified"] == "manifest"
    assert again["models"][NAME]["sha256"] == rec["sha256"]
    text, stats, post = play(tmp_path, hub, item, "headers", name="post")
    assert post["headers"][NAME]["remote"] is None
    assert dict(post["headers"][NAME]["vllm"], model_dir=None) == dict(remote["vllm"], model_dir=None)

    # role serving: the vLLM instance names the model; it resolves to the snapshot directory
    vllm = {"mode": "host", "binary": "/opt/vllm/venv/bin/vllm", "version": "0.33.0"}
    inst = {"name": "q", "engine": "vllm", "model": NAME, "port": 8000, "gpus": [0]}
    p = plan([inst], vllm=vllm, models=facts["models"], gpus=GPUS)[0]
    assert p["argv"][0] == str(dest) and p["model_check"] == str(dest / "config.json")
    assert os.path.isfile(p["model_check"]) and p["model_sha256"] == rec["sha256"]
    assert p["argv"][p["argv"].index("--served-model-name") + 1] == NAME
    box = plan([dict(inst, mode="container")], vllm=dict(vllm, mode="container", image="vllm/vllm-openai:x"),
               models=facts["models"], gpus=GPUS)[0]
    # the container mounts the parent: the relative link resolves inside it
    assert box["model_dir"] == str(dest.parent) and box["argv"][0] == "/models/Qwen3.6-27B-FP8"
    assert os.readlink(str(dest)).startswith(".Qwen3.6-27B-FP8.snapshots/")
    # the memory plan: preflight (hub) and serve stage (directory) plan the same model
    l20 = {"index": 0, "name": "NVIDIA L20", "memory_total_mib": 46068, "memory_free_mib": 46000}
    gpus = {"present": True, "count": 1, "gpus": [l20]}
    before = memory_plan_inputs([inst], headers=pre_headers(tmp_path), gpus=gpus)["instances"]
    after = memory_plan_inputs([inst], models=facts["models"], headers=pre_headers(tmp_path), gpus=gpus)
    assert before[0]["model"]["weights_bytes"] == mp.vllm_model_summary(str(dest))["weights_bytes"]
    assert after["instances"][0]["model_dir"] == str(dest)
    plans = [mp.plan_instances(x, gpus)[0]["q"] for x in (before, after["instances"])]
    assert plans[0]["planned"] and plans[0]["message"] == plans[1]["message"]


def pre_headers(tmp_path):
    return json.loads((tmp_path / "pre.json").read_text())["headers"]


def test_vllm_instance_naming_a_gguf_model_and_llama_cpp_naming_a_snapshot_are_refused():
    models = {"gguf": {"path": "/home/models/q/q.gguf", "sha256": "ab" * 32},
              "snap": {"path": "/home/models/Q-FP8", "dir": "/home/models/Q-FP8", "snapshot": True}}
    vllm = {"mode": "host", "binary": "/opt/vllm/venv/bin/vllm", "version": "0.33.0"}
    with pytest.raises(ServingError, match="model_models item gguf is a GGUF file.*snapshot: true"):
        plan([{"name": "v", "engine": "vllm", "model": "gguf", "port": 8000}], vllm=vllm, models=models)
    with pytest.raises(ServingError, match="snap is a snapshot.*GGUF"):
        plan([{"name": "l", "model": "snap", "port": 8001}], models=models)


def test_validate_refuses_a_snapshot_item_that_cannot_work(tmp_path, hub):
    for bad in ({"name": "x", "snapshot": True, "url": "http://h/x"},
                {"name": "x", "repo": "a/b", "snapshot": True, "filename": "m.gguf"},
                {"name": "x", "repo": "a/b", "filename": "m.gguf", "allow_patterns": ["*"]}):
        text, stats, _f = play(tmp_path, hub, bad, "headers", name="bad")
        assert stats.get("failed") == 1 and "repo + snapshot: true" in " ".join(text.split()), text


def test_every_snapshot_task_that_can_carry_the_token_is_hidden():
    from tests.helpers import ROOT
    from tests.unit.plugins.module_utils.test_download_hostile import _tasks

    tasks = _tasks(os.path.join(ROOT, "roles", "model", "tasks", "snapshot.yml"))
    tasks += [t for t in _tasks(os.path.join(ROOT, "roles", "model", "tasks", "headers.yml"))
              if "llmops.serving.safetensors_info" in t]
    carrying = [t for t in tasks
                if any(k in t for k in ("ansible.builtin.async_status", "llmops.serving.model_snapshot",
                                        "llmops.serving.download_wait"))
                or "token" in (t.get("llmops.serving.safetensors_info") or {})
                or "_model_job_result" in str(t.get("ansible.builtin.set_fact", ""))]
    assert len(carrying) == 6, [t["name"] for t in carrying]
    for t in carrying:
        assert t.get("no_log") == "{{ _model_secret }}", t["name"]
