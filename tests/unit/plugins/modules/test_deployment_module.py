# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""llmops.serving.deployment run as Ansible runs it: check mode and diff, the env file never shown, a
refusal as one clear failure, another run's lock, a stale lock taken over as a warning."""

import json

import yaml
from ansible_collections.llmops.serving.plugins.modules import deployment

from tests.helpers import module_doc, run_module_file

SECRET = "hf-module-secret-2c9e"
RUN_A, RUN_B = "20261205T100000Z-aaaaaaaaaaaaaaaa", "20261205T100500Z-bbbbbbbbbbbbbbbb"


def args(tmp_path, **over):
    (tmp_path / "systemd").mkdir(exist_ok=True)
    out = {"state": "deploy", "dir": str(tmp_path / "deployments"), "name": "q",
           "unit_file": str(tmp_path / "systemd" / "q.service"), "env_file": str(tmp_path / "q.env"),
           "unit_content": "[Service]\nEnvironmentFile=/q.env\nExecStart=/bin/true\n",
           "env_content": "HF_TOKEN=%s\n" % SECRET, "lock_token": RUN_A}
    out.update(over)
    return out


def test_check_mode_with_diff_shows_the_unit_and_writes_nothing(tmp_path):
    result = run_module_file(tmp_path, "deployment", dict(args(tmp_path), _ansible_diff=True),
                             check_mode=True)
    assert result["changed"] is True and result["unit_changed"] and result["env_changed"]
    assert "ExecStart=/bin/true" in result["diff"]["after"]
    assert not (tmp_path / "q.env").exists() and not (tmp_path / "systemd" / "q.service").exists()
    assert SECRET not in json.dumps(result)


def test_deploy_then_commit_then_nothing_changes(tmp_path):
    deployed = run_module_file(tmp_path, "deployment", args(tmp_path))
    assert deployed["changed"] is True and (tmp_path / "q.env").read_text() == "HF_TOKEN=%s\n" % SECRET
    assert SECRET not in json.dumps(deployed)
    record = {"name": "q", "unit": "q.service"}
    committed = run_module_file(tmp_path, "deployment", args(tmp_path, state="commit", record=record,
                                                             unit_changed=True, env_changed=True))
    assert committed["locked"] is False
    assert committed["changed"] is True and committed["previous"] is False
    assert run_module_file(tmp_path, "deployment", args(tmp_path))["changed"] is False
    records = run_module_file(tmp_path, "deployment",
                              {"state": "query", "dir": str(tmp_path / "deployments")})
    assert [r["name"] for r in records["records"]] == ["q"] and records["changed"] is False


def test_swap_without_a_previous_deployment_fails_clearly(tmp_path):
    result = run_module_file(tmp_path, "deployment", args(tmp_path, state="swap"))
    assert result["failed"] is True and "instance q has no deployment record" in result["msg"]


def test_another_runs_deploy_is_refused_until_the_first_commits_and_a_stale_lock_is_a_warning(tmp_path):
    deployed = run_module_file(tmp_path, "deployment",
                               dict(args(tmp_path), lock_holder="play 'serve' by alice"))
    assert deployed["locked"] is True
    refused = run_module_file(tmp_path, "deployment", args(tmp_path, lock_token=RUN_B, env_content="X=1\n"))
    assert refused["failed"] is True
    assert "instance q is locked by play 'serve' by alice (run %s)" % RUN_A in refused["msg"]
    assert (tmp_path / "q.env").read_text() == "HF_TOKEN=%s\n" % SECRET
    # the lock without a deadline left: stale, taken over with a warning
    lock = tmp_path / "deployments" / "q" / "lock.json"
    record = json.loads(lock.read_text())
    lock.write_text(json.dumps(dict(record, expires=record["taken"])))
    taken = run_module_file(tmp_path, "deployment", args(tmp_path, lock_token=RUN_B, env_content="X=1\n"))
    assert taken["changed"] is True and taken["locked"] is True
    assert any("took over the stale deployment lock of instance q" in w for w in taken["warnings"])
    released = run_module_file(tmp_path, "deployment", {"state": "release", "name": "q", "lock_token": RUN_B,
                                                         "dir": str(tmp_path / "deployments")})
    assert released["locked"] is False and not lock.exists()


def test_a_refusal_returns_the_lock_and_its_token_takes_a_killed_runs_lock_over(tmp_path):
    """The refused step's result carries the lock (its owner: the killed run's process); passed back as
    lock_takeover, that token takes the lock over at once, with a warning."""
    owner = "host=ctl-a boot=0f3c2a9e-5b1d-4c7e-9a2f-1d2e3f4a5b6c pidns=4026531836 pid=4242 start=987654"
    run_module_file(tmp_path, "deployment", dict(args(tmp_path), lock_holder="play 'serve' by alice",
                                                 lock_owner=owner))
    refused = run_module_file(tmp_path, "deployment", args(tmp_path, lock_token=RUN_B, env_content="X=1\n"))
    assert refused["failed"] is True
    lock = refused["lock"]
    assert (lock["token"], lock["owner"], lock["step"]) == (RUN_A, owner, "deploy")
    assert lock["expires"] > lock["taken"]
    taken = run_module_file(tmp_path, "deployment", args(tmp_path, lock_token=RUN_B, env_content="X=1\n",
                                                         lock_takeover=lock["token"]))
    assert taken["changed"] is True and taken["locked"] is True
    assert any("its process %s is gone" % owner in w for w in taken["warnings"])


def test_a_step_without_the_runs_token_fails_clearly(tmp_path):
    result = run_module_file(tmp_path, "deployment", dict(args(tmp_path), lock_token=None))
    assert result["failed"] is True and "lock_token" in result["msg"]
    assert not (tmp_path / "q.env").exists()


def test_documentation_matches_the_argument_spec():
    doc = module_doc(deployment)
    spec = deployment.ARGUMENT_SPEC
    assert sorted(doc["options"]) == sorted(spec)
    for name, option in doc["options"].items():
        assert option["type"] == spec[name]["type"], name
        assert option.get("default") == spec[name].get("default"), name
        assert option.get("choices") == spec[name].get("choices"), name
    assert doc["options"]["state"]["choices"] == list(deployment.deployment.STATES)
    assert {"locked", "notes"} <= set(yaml.safe_load(deployment.RETURN))
    examples = yaml.safe_load(deployment.EXAMPLES)
    assert examples[0]["ansible.builtin.set_fact"]["qwen_run"].endswith("fleet_deployment_run }}")
