# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The deployment lifecycle (plugins/module_utils/deployment.py) on real files in a temporary directory:
deploy, the health gate's restore, commit, the fleet's swap, query; check mode; a failed write; the lock of
one run from deploy to commit or restore; the checks before a swap; modes repaired; no linked directory."""

import json
import os
import stat

import pytest
from ansible_collections.llmops.serving.plugins.module_utils import deployment
from ansible_collections.llmops.serving.plugins.module_utils.deployment import DeploymentError, run

UNIT_V1 = "[Service]\nEnvironmentFile=/etc/q.env\nExecStart=/opt/llama-server --port 8003\n"
UNIT_V2 = "[Service]\nEnvironmentFile=/etc/q.env\nExecStart=/opt/llama-server --port 8003 --ctx-size 8192\n"
ENV_V1 = "HF_TOKEN=hf-secret-v1\n"
ENV_V2 = "HF_TOKEN=hf-secret-v2\n"
# two runs of a play (module deployment's lock_token: role serving's fleet_deployment_run)
RUN_A, RUN_B = "20261205T100000Z-aaaaaaaaaaaaaaaa", "20261205T100500Z-bbbbbbbbbbbbbbbb"


def record(version):
    return {"name": "q", "unit": "llama-server-q.service", "settings": {"version": version}}


@pytest.fixture
def node(tmp_path):
    (tmp_path / "systemd").mkdir()
    (tmp_path / "etc").mkdir()

    class Node(object):
        root = str(tmp_path / "deployments")
        unit = str(tmp_path / "systemd" / "llama-server-q.service")
        env = str(tmp_path / "etc" / "q.env")
        failed = str(tmp_path / "etc" / "llama-server-q.service.failed")
        inst = str(tmp_path / "deployments" / "q")

        def step(self, state, **kwargs):
            kwargs.setdefault("name", "q")
            kwargs.setdefault("lock_token", RUN_A)
            return run(state, self.root, unit_file=self.unit, env_file=self.env, **kwargs)

        def deploy(self, unit, env, **kwargs):
            return self.step("deploy", unit_content=unit, env_content=env, **kwargs)

        def commit(self, deployed, version, **kwargs):
            return self.step("commit", record=record(version), unit_changed=deployed["unit_changed"],
                             env_changed=deployed["env_changed"], **kwargs)

        def read(self, path):
            path = path if os.path.isabs(path) else os.path.join(self.inst, path)
            if not os.path.exists(path):
                return None
            with open(path) as handle:
                return handle.read()

        def snapshot(self):
            """Every file of the node and its content."""
            out = {}
            for top in (os.path.dirname(self.unit), os.path.dirname(self.env), self.root):
                for base, _dirs, files in os.walk(top):
                    for name in files:
                        out[os.path.join(base, name)] = self.read(os.path.join(base, name))
            return out

    return Node()


def healthy_v1_then_v2(node):
    """v1 deployed and healthy, then v2 deployed and healthy: v2 current, v1 previous."""
    node.commit(node.deploy(UNIT_V1, ENV_V1), 1)
    node.commit(node.deploy(UNIT_V2, ENV_V2), 2)


# --- deploy + commit: the health gate passed ----------------------------------------------------------------

def test_first_deploy_writes_the_files_then_commit_records_it_without_a_previous(node):
    first = node.deploy(UNIT_V1, ENV_V1)
    assert first["changed"] and first["unit_changed"] and first["env_changed"]
    assert first["rollback"] == []                    # nothing to put back: a first deployment
    assert node.read(node.unit) == UNIT_V1 and node.read(node.env) == ENV_V1
    assert stat.S_IMODE(os.stat(node.env).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(node.unit).st_mode) == 0o644
    committed = node.commit(first, 1)
    assert committed["changed"] and committed["previous"] is False
    current = json.loads(node.read("current.json"))
    assert current["settings"] == {"version": 1}
    assert current["unit_checksum"] == deployment.checksum(UNIT_V1.encode())
    assert node.read("previous.service") is None
    assert stat.S_IMODE(os.stat(node.inst).st_mode) == 0o700


def test_an_unchanged_run_writes_nothing(node):
    node.commit(node.deploy(UNIT_V1, ENV_V1), 1)
    before = node.snapshot()
    again = node.deploy(UNIT_V1, ENV_V1)
    assert again["changed"] is False and again["files"] == [] and again["rollback"] == []
    # nothing for commit to do (the role skips it): no change, nothing pending, a record there
    assert again["commit_needed"] is False and again["previous"] is False
    assert node.commit(again, 1)["changed"] is False
    assert node.snapshot() == before


def test_commit_is_needed_after_a_change_an_interrupted_gate_or_without_a_record(node):
    first = node.deploy(UNIT_V1, ENV_V1)
    assert first["commit_needed"] is True                     # a change
    node.commit(first, 1)
    changed = node.deploy(UNIT_V2, ENV_V2)                    # ... and the run stops before its gate
    assert changed["commit_needed"] is True
    rerun = node.deploy(UNIT_V2, ENV_V2)                      # no write now, but before.* are pending:
    assert rerun["changed"] is False and rerun["commit_needed"] is True
    # the unproven change is this run's: restarted and gated (the role restarts on unit/env changed),
    # rolled back to v1 if it fails, and v1 becomes previous when it passes
    assert rerun["unit_changed"] and rerun["env_changed"]
    assert rerun["rollback"] == ["unit", "environment file"]
    assert node.commit(rerun, 2)["previous"] is True
    assert node.read("previous.service") == UNIT_V1 and node.read("previous.env") == ENV_V1
    settled = node.deploy(UNIT_V2, ENV_V2)
    assert settled["commit_needed"] is False and settled["previous"] is True
    os.remove(os.path.join(node.inst, "current.json"))        # a deployment made before records
    assert node.deploy(UNIT_V2, ENV_V2)["commit_needed"] is True


def test_a_healthy_change_makes_the_replaced_deployment_previous(node):
    node.commit(node.deploy(UNIT_V1, ENV_V1), 1)
    deployed = node.deploy(UNIT_V2, ENV_V2)
    assert deployed["rollback"] == ["unit", "environment file"]
    assert node.read("before.service") == UNIT_V1 and node.read("before.env") == ENV_V1
    committed = node.commit(deployed, 2)
    assert committed["previous"] is True
    assert node.read("previous.service") == UNIT_V1 and node.read("previous.env") == ENV_V1
    assert json.loads(node.read("previous.json"))["settings"] == {"version": 1}
    assert json.loads(node.read("current.json"))["settings"] == {"version": 2}
    assert node.read("before.service") is None and node.read("before.env") is None
    assert stat.S_IMODE(os.stat(os.path.join(node.inst, "previous.env")).st_mode) == 0o600


def test_an_env_only_change_keeps_the_unchanged_unit_as_previous(node):
    node.commit(node.deploy(UNIT_V1, ENV_V1), 1)
    deployed = node.deploy(UNIT_V1, ENV_V2)
    assert (deployed["unit_changed"], deployed["env_changed"]) == (False, True)
    assert deployed["rollback"] == ["environment file"]
    node.commit(deployed, 2)
    assert node.read("previous.service") == UNIT_V1 and node.read("previous.env") == ENV_V1


def test_a_deployment_made_before_records_gets_an_unrecorded_previous(node):
    with open(node.unit, "w") as handle:
        handle.write(UNIT_V1)
    deployed = node.deploy(UNIT_V2, ENV_V1)
    node.step("commit", record=record(2), unrecorded_record=dict(record(None), recorded=False),
              unit_changed=True)
    previous = json.loads(node.read("previous.json"))
    assert previous["recorded"] is False
    assert previous["unit_checksum"] == deployment.checksum(UNIT_V1.encode())
    assert deployed["rollback"] == ["unit"]


# --- restore: the health gate failed ------------------------------------------------------------------------

def test_a_failed_change_is_restored_and_its_unit_kept_for_inspection(node):
    healthy_v1_then_v2(node)
    before = node.snapshot()
    deployed = node.deploy(UNIT_V2 + "ExecStartPre=/bin/false\n", ENV_V1)
    assert deployed["rollback"] == ["unit", "environment file"]
    restored = node.step("restore", keep_failed_unit=node.failed)
    assert restored["restored"] == ["unit", "environment file"] and restored["failed_unit"] == node.failed
    assert "/bin/false" in node.read(node.failed)
    after = node.snapshot()
    assert after.pop(node.failed) is not None
    assert after == before                     # live files, previous and record exactly as before the change


def test_a_failed_env_only_change_restores_the_env_file_alone(node):
    node.commit(node.deploy(UNIT_V1, ENV_V1), 1)
    node.deploy(UNIT_V1, ENV_V2)
    restored = node.step("restore", keep_failed_unit=node.failed)
    assert restored["restored"] == ["environment file"]
    assert node.read(node.env) == ENV_V1 and node.read(node.unit) == UNIT_V1


def test_restore_without_a_change_does_nothing(node):
    node.commit(node.deploy(UNIT_V1, ENV_V1), 1)
    restored = node.step("restore", keep_failed_unit=node.failed)
    assert restored["changed"] is False and restored["restored"] == [] and restored["failed_unit"] is None
    assert node.read(node.failed) is None


def test_an_unfinished_change_keeps_the_deployment_before_it(node):
    """A run that stopped during the health gate left before.*: the next change must not overwrite them
    with the unverified files, so that a failed gate still returns to the last deployment that ran."""
    node.commit(node.deploy(UNIT_V1, ENV_V1), 1)
    node.deploy(UNIT_V2, ENV_V2)              # never committed nor restored
    node.deploy(UNIT_V2 + "# v3\n", ENV_V2)
    assert node.read("before.service") == UNIT_V1 and node.read("before.env") == ENV_V1
    node.step("restore", keep_failed_unit=node.failed)
    assert node.read(node.unit) == UNIT_V1 and node.read(node.env) == ENV_V1


# --- swap: the fleet ---------------------------------------------------------------------------------------

def test_swap_puts_the_previous_deployment_back_and_twice_returns(node):
    healthy_v1_then_v2(node)
    start = node.snapshot()
    swapped = node.step("swap")
    assert swapped["changed"] and swapped["record"]["settings"] == {"version": 1}
    assert swapped["previous_record"]["settings"] == {"version": 2}
    assert node.read(node.unit) == UNIT_V1 and node.read(node.env) == ENV_V1
    assert node.read("previous.service") == UNIT_V2 and node.read("previous.env") == ENV_V2
    assert json.loads(node.read("current.json"))["settings"] == {"version": 1}
    assert stat.S_IMODE(os.stat(node.env).st_mode) == 0o600
    assert swapped["locked"] is True and json.loads(node.read("lock.json"))["step"] == "swap"
    node.step("swap")
    assert node.step("release")["locked"] is False
    assert node.snapshot() == start


def test_swap_refuses_without_a_previous_deployment_and_touches_nothing(node):
    node.commit(node.deploy(UNIT_V1, ENV_V1), 1)
    start = node.snapshot()
    with pytest.raises(DeploymentError, match="instance q has no previous deployment"):
        node.step("swap")
    with pytest.raises(DeploymentError, match="instance x has no deployment record"):
        run("swap", node.root, name="x", unit_file=node.unit, env_file=node.env, lock_token=RUN_A)
    assert node.snapshot() == start


# --- check mode and diff ---------------------------------------------------------------------------------

def test_check_mode_reports_every_step_and_writes_nothing(node):
    assert node.deploy(UNIT_V1, ENV_V1, check_mode=True)["files"] == sorted([node.unit, node.env])
    assert not os.path.exists(node.unit) and not os.path.exists(node.root)
    healthy_v1_then_v2(node)
    start = node.snapshot()
    deployed = node.deploy(UNIT_V1, ENV_V2, check_mode=True)
    assert deployed["changed"] and deployed["unit_changed"] and not deployed["env_changed"]
    assert deployed["diff"]["before"] == UNIT_V2 and deployed["diff"]["after"] == UNIT_V1
    swapped = node.step("swap", check_mode=True)
    assert swapped["changed"] and node.unit in swapped["files"]
    assert swapped["record"]["settings"]["version"] == 1
    assert node.snapshot() == start


def test_no_result_shows_an_env_files_content(node):
    healthy_v1_then_v2(node)
    results = [node.deploy(UNIT_V1, ENV_V1), node.step("restore", keep_failed_unit=node.failed),
               node.step("swap"), run("query", node.root)]
    text = json.dumps(results)
    assert "hf-secret" not in text


def test_no_diff_when_the_replaced_unit_held_env_values_inline(node):
    with open(node.unit, "w") as handle:
        handle.write("[Service]\nEnvironment=HF_TOKEN=hf-inline\nExecStart=/x\n")
    deployed = node.deploy(UNIT_V1, ENV_V1, check_mode=True)
    assert deployed["changed"] and "diff" not in deployed


# --- one mechanism: a step that cannot be written leaves everything as it was -------------------------------

def test_a_failed_restore_leaves_the_current_deployment_intact(node, monkeypatch):
    healthy_v1_then_v2(node)
    start = node.snapshot()
    real = deployment._stage
    calls = []

    def full_disk(path, data, mode):
        calls.append(path)
        if len(calls) == 2:
            raise OSError(28, "No space left on device", path)
        return real(path, data, mode)

    monkeypatch.setattr(deployment, "_stage", full_disk)
    with pytest.raises(DeploymentError, match="nothing was changed.*No space left"):
        node.step("swap")
    assert node.snapshot() == start
    assert not [n for n in os.listdir(node.inst) if n.endswith(".tmp")]


def test_a_rename_that_fails_half_way_puts_the_replaced_files_back(node):
    healthy_v1_then_v2(node)
    start = node.snapshot()
    plan = deployment.plan_swap(deployment.Paths(node.root, "q", node.unit, node.env))
    renamed = []

    def flaky(src, dst):
        if len(renamed) == 2:
            raise OSError(5, "Input/output error")
        os.rename(src, dst)
        renamed.append(dst)

    with pytest.raises(DeploymentError, match="files it had replaced are back"):
        deployment.apply(plan["writes"], _rename=flaky)
    assert node.snapshot() == start


def test_a_link_planted_in_place_of_a_slot_is_refused(node, tmp_path):
    healthy_v1_then_v2(node)
    os.unlink(os.path.join(node.inst, "previous.env"))
    os.symlink(str(tmp_path / "elsewhere"), os.path.join(node.inst, "previous.env"))
    with pytest.raises(DeploymentError, match="not a regular file"):
        node.step("swap")
    assert not (tmp_path / "elsewhere").exists()


@pytest.mark.parametrize("name", ["../etc", "", "a/b", ".hidden", "x" * 64])
def test_instance_names_are_one_path_component(node, name):
    with pytest.raises(DeploymentError, match="instance name"):
        node.step("deploy", unit_content=UNIT_V1, env_content=ENV_V1, name=name)


def test_relative_paths_are_refused(node):
    with pytest.raises(DeploymentError, match="absolute"):
        run("swap", "deployments", name="q", unit_file=node.unit, env_file=node.env, lock_token=RUN_A)


# --- query ------------------------------------------------------------------------------------------------

def test_query_lists_the_records_with_their_previous(node):
    assert run("query", node.root)["records"] == []
    node.commit(node.deploy(UNIT_V1, ENV_V1), 1)
    other = run("deploy", node.root, name="r", unit_file=node.unit + "-r", env_file=node.env + "-r",
                unit_content=UNIT_V1, env_content=ENV_V1, lock_token=RUN_B)
    run("commit", node.root, name="r", unit_file=node.unit + "-r", env_file=node.env + "-r",
        record=dict(record(1), name="r"), unit_changed=other["unit_changed"], lock_token=RUN_B)
    node.commit(node.deploy(UNIT_V2, ENV_V2), 2)
    records = run("query", node.root)["records"]
    assert [(r["name"], r["previous"]) for r in records] == [("q", True), ("r", False)]
    assert records[0]["previous_record"]["settings"] == {"version": 1}
    assert [r["name"] for r in run("query", node.root, name="r")["records"]] == ["r"]
    assert run("query", node.root, name="nope")["records"] == []
