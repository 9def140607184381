# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The deployment lifecycle (plugins/module_utils/_serving/deployment.py) on real files in a temporary
directory:
deploy, the health gate's restore, commit, the fleet's swap, query; check mode; a failed write; the lock of
one run from deploy to commit or restore; the checks before a swap; modes repaired; no linked directory."""

import json
import os
import stat

import pytest
from ansible_collections.llmops.serving.plugins.module_utils._serving import deployment
from ansible_collections.llmops.serving.plugins.module_utils._serving.deployment import (
    DeploymentError,
    LockHeld,
    run,
)

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


# --- the lock: one run holds the instance from deploy to commit or restore (issue 34) -----------------------

def test_a_second_run_is_refused_while_the_first_holds_the_instance_and_proceeds_after_its_commit(node):
    """Play A deploys U2 and health-gates it; play B's deploy of U3 meanwhile would have replaced A's unit,
    and A's commit would have recorded A's record with B's unit. B is refused, changing nothing, until A
    commits."""
    node.commit(node.deploy(UNIT_V1, ENV_V1), 1)
    a = node.deploy(UNIT_V2, ENV_V2, lock_holder="play 'serve' by alice on ctl-a")
    assert a["locked"] is True
    held = node.snapshot()
    for state, extra in (("deploy", {"unit_content": UNIT_V2 + "# v3\n", "env_content": ENV_V1}),
                         ("swap", {}), ("restore", {"keep_failed_unit": node.failed}),
                         ("commit", {"record": record(3), "unit_changed": True})):
        with pytest.raises(DeploymentError) as refused:
            node.step(state, lock_token=RUN_B, **extra)
        message = str(refused.value)
        assert "instance q is locked by play 'serve' by alice on ctl-a (run %s)" % RUN_A in message
        assert "Nothing was changed by this %s" % state in message
        assert os.path.join(node.inst, "lock.json") in message          # how to clear it if really stale
        assert node.snapshot() == held
    # check mode says the same: the run would be refused
    with pytest.raises(DeploymentError, match="is locked by"):
        node.deploy(UNIT_V2 + "# v3\n", ENV_V1, lock_token=RUN_B, check_mode=True)
    committed = node.commit(a, 2)
    assert committed["locked"] is False and node.read("lock.json") is None
    assert json.loads(node.read("current.json"))["unit_checksum"] == deployment.checksum(UNIT_V2.encode())
    b = node.deploy(UNIT_V2 + "# v3\n", ENV_V2, lock_token=RUN_B)
    assert b["changed"] and b["locked"] is True
    assert json.loads(node.read("lock.json"))["token"] == RUN_B


def test_restore_gives_the_lock_back_and_an_unchanged_deploy_takes_none(node):
    node.commit(node.deploy(UNIT_V1, ENV_V1), 1)
    assert node.read("lock.json") is None
    unchanged = node.deploy(UNIT_V1, ENV_V1)            # nothing to gate: no lock, nothing for commit to do
    assert unchanged["locked"] is False and node.read("lock.json") is None
    assert node.deploy(UNIT_V2, ENV_V2)["locked"] is True
    restored = node.step("restore", keep_failed_unit=node.failed)
    assert restored["restored"] == ["unit", "environment file"] and restored["locked"] is False
    assert node.read("lock.json") is None
    assert node.deploy(UNIT_V2, ENV_V2, lock_token=RUN_B)["locked"] is True


def test_commit_without_the_lock_changes_nothing(node):
    """The lock was removed by hand (or taken over and given back by another run) while this run gated its
    change: the files may be another run's, so its commit refuses and the change stays pending."""
    node.commit(node.deploy(UNIT_V1, ENV_V1), 1)
    deployed = node.deploy(UNIT_V2, ENV_V2)
    os.unlink(os.path.join(node.inst, "lock.json"))
    pending = node.snapshot()
    with pytest.raises(DeploymentError, match="does not hold the deployment lock of instance q.*it is free"):
        node.commit(deployed, 2)
    with pytest.raises(DeploymentError, match="Nothing was changed; the change stays pending"):
        node.step("restore", keep_failed_unit=node.failed)
    assert node.snapshot() == pending
    # with nothing to change, no lock is needed (the role skips such a commit anyway)
    node.deploy(UNIT_V2, ENV_V2)
    node.commit(deployed, 2)
    assert node.step("restore", keep_failed_unit=node.failed)["changed"] is False


def test_a_stale_lock_is_taken_over_with_a_note_and_a_live_one_is_not(node):
    """A lock past its deadline (lock_timeout after it was taken) is a run that is gone: taken over, noted."""
    node.commit(node.deploy(UNIT_V1, ENV_V1), 1)
    taken = 1_800_000_000.0
    node.deploy(UNIT_V2, ENV_V2, lock_holder="play 'serve' by alice", lock_timeout=600, _now=lambda: taken)
    lock = json.loads(node.read("lock.json"))
    assert (lock["token"], lock["taken"], lock["expires"]) == (RUN_A, taken, taken + 600)
    with pytest.raises(DeploymentError, match=r"locked by .* or wait until 2027-01-15 08:10:00 UTC"):
        node.deploy(UNIT_V2, ENV_V1, lock_token=RUN_B, _now=lambda: taken + 599)
    b = node.deploy(UNIT_V2, ENV_V1, lock_token=RUN_B, _now=lambda: taken + 600)
    assert b["locked"] is True and json.loads(node.read("lock.json"))["token"] == RUN_B
    (note,) = b["notes"]
    assert note.startswith("took over the stale deployment lock of instance q: play 'serve' by alice (run %s)"
                           % RUN_A)
    # the run that was taken over cannot commit what is now the other run's
    with pytest.raises(DeploymentError, match="is locked by"):
        node.commit({"unit_changed": True, "env_changed": True}, 2, _now=lambda: taken + 601)


OWNER_A = "host=ctl-a boot=0f3c2a9e-5b1d-4c7e-9a2f-1d2e3f4a5b6c pidns=4026531836 pid=4242 start=987654"


def test_a_killed_runs_lock_is_taken_over_at_once_only_with_its_token(node):
    """A run killed between deploy and commit leaves its lock for lock_timeout (43 min for llama.cpp). The
    refusal returns the lock with its owner (LockHeld.lock); the controller passes its token back as
    lock_takeover when that process is gone: taken over at once, with a note. Any other token changes
    nothing: the live lock of another run is still refused."""
    node.commit(node.deploy(UNIT_V1, ENV_V1), 1)
    taken = 1_800_000_000.0
    node.deploy(UNIT_V2, ENV_V2, lock_holder="play 'serve' by alice", lock_owner=OWNER_A, lock_timeout=2580,
                _now=lambda: taken)
    assert json.loads(node.read("lock.json"))["owner"] == OWNER_A
    before = node.snapshot()
    with pytest.raises(LockHeld) as refused:
        node.deploy(UNIT_V2, ENV_V1, lock_token=RUN_B, _now=lambda: taken + 5)
    assert refused.value.lock == {"token": RUN_A, "holder": "play 'serve' by alice", "owner": OWNER_A,
                                  "step": "deploy", "taken": taken, "expires": taken + 2580}
    # the token of another run (or this run's own) is no licence to take this lock
    for other in (RUN_B, "20261205T090000Z-cccccccccccccccc"):
        with pytest.raises(LockHeld):
            node.deploy(UNIT_V2, ENV_V1, lock_token=RUN_B, lock_takeover=other, _now=lambda: taken + 5)
    assert node.snapshot() == before
    b = node.deploy(UNIT_V2, ENV_V1, lock_token=RUN_B, lock_takeover=RUN_A, _now=lambda: taken + 5)
    assert b["locked"] is True and json.loads(node.read("lock.json"))["token"] == RUN_B
    (note,) = b["notes"]
    assert note.startswith("took over the stale deployment lock of instance q: play 'serve' by alice (run %s)"
                           % RUN_A)
    assert note.endswith("its process %s is gone (killed, or it ended without giving the lock back)"
                         % OWNER_A)
    # the killed run's change (v2's unit, never gated) is this run's change now: restarted and gated
    assert b["unit_changed"] is True and b["rollback"] == ["unit", "environment file"]


@pytest.mark.parametrize("field, value, message", [
    ("lock_owner", "host=ctl-a pid=1", "lock_owner must read"),
    ("lock_owner", OWNER_A + "\n", "lock_owner must read"),
    ("lock_takeover", "short", "lock_takeover must be the token"),
    ("lock_takeover", RUN_A + "\n", "lock_takeover must be the token"),
])
def test_a_malformed_owner_or_takeover_is_refused(node, field, value, message):
    with pytest.raises(DeploymentError, match=message):
        node.deploy(UNIT_V1, ENV_V1, **{field: value})
    assert node.read("lock.json") is None


def test_release_gives_back_only_this_runs_lock(node):
    node.commit(node.deploy(UNIT_V1, ENV_V1), 1)
    assert node.step("release")["notes"] == []                     # nothing held: nothing to do
    node.deploy(UNIT_V2, ENV_V2)
    other = node.step("release", lock_token=RUN_B)
    assert other["changed"] is False and "not by this run: left alone" in other["notes"][0]
    assert json.loads(node.read("lock.json"))["token"] == RUN_A
    released = run("release", node.root, name="q", lock_token=RUN_A)   # release needs no unit or env file
    assert released["locked"] is False and node.read("lock.json") is None


@pytest.mark.parametrize("token", [None, "", "short", "has space-aaaaaaaa", "nl\n-aaaaaaaaaaa", "x" * 129])
def test_a_step_without_a_valid_run_token_is_refused(node, token):
    with pytest.raises(DeploymentError, match="lock_token must be"):
        node.deploy(UNIT_V1, ENV_V1, lock_token=token)
    assert not os.path.exists(node.unit)


def test_a_lock_file_that_is_not_a_lock_is_refused_with_what_to_do(node):
    node.commit(node.deploy(UNIT_V1, ENV_V1), 1)
    with open(os.path.join(node.inst, "lock.json"), "w") as handle:
        handle.write("{}")
    with pytest.raises(DeploymentError, match="is not one this module wrote: if no play .* remove it"):
        node.deploy(UNIT_V2, ENV_V2)


def test_two_steps_on_one_instance_never_interleave(node, monkeypatch):
    """Each step holds flock on the instance directory while it reads and writes (the lock record itself
    is read and replaced under it)."""
    import fcntl
    node.commit(node.deploy(UNIT_V1, ENV_V1), 1)
    monkeypatch.setattr(deployment, "GUARD_WAIT", 0.2)
    fd = os.open(node.inst, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        with pytest.raises(DeploymentError, match="another step of the deployment lifecycle on instance q"):
            node.deploy(UNIT_V2, ENV_V2)
    finally:
        os.close(fd)
    assert node.read(node.unit) == UNIT_V1
    assert node.deploy(UNIT_V2, ENV_V2)["changed"] is True


# --- a swap puts back only the unit that was kept, over the unit that was recorded (issue 34) ---------------

@pytest.mark.parametrize("kept", ["", UNIT_V1.replace("8003", "9999")], ids=["empty", "altered"])
def test_swap_refuses_a_previous_unit_that_is_not_the_recorded_one(node, kept):
    healthy_v1_then_v2(node)
    with open(os.path.join(node.inst, "previous.service"), "w") as handle:
        handle.write(kept)
    start = node.snapshot()
    with pytest.raises(DeploymentError) as refused:
        node.step("swap")
    message = str(refused.value)
    assert "the previous unit %s of instance q" % os.path.join(node.inst, "previous.service") in message
    assert ("is empty (0 bytes)" if not kept else "previous.json records %s"
            % deployment.checksum(UNIT_V1.encode())) in message
    assert "Nothing was swapped, the current unit stays live" in message
    assert node.snapshot() == start and node.read(node.unit) == UNIT_V2
    assert node.read("lock.json") is None


def test_swap_refuses_a_live_unit_edited_by_hand_or_a_change_still_pending(node):
    healthy_v1_then_v2(node)
    with open(node.unit, "a") as handle:
        handle.write("# edited\n")
    start = node.snapshot()
    with pytest.raises(DeploymentError,
                       match="the live unit %s of instance q has SHA-256 .*current.json records" % node.unit):
        node.step("swap")
    assert node.snapshot() == start
    with open(node.unit, "w") as handle:
        handle.write(UNIT_V2)
    node.deploy(UNIT_V2, ENV_V1)                        # an env change waiting for its gate
    start = node.snapshot()
    with pytest.raises(DeploymentError,
                       match=r"has a change that has not passed its health gate \(before.env"):
        node.step("swap")
    assert node.snapshot() == start
    node.step("restore", keep_failed_unit=node.failed)
    assert node.step("swap")["record"]["settings"] == {"version": 1}       # consistent again: swapped


# --- modes and owners repaired, whatever the content (issue 34) -------------------------------------------

def test_an_env_file_left_0644_is_repaired_to_0600_with_the_same_content(node):
    node.commit(node.deploy(UNIT_V1, ENV_V1), 1)
    os.chmod(node.env, 0o644)
    os.chmod(os.path.join(node.inst, "current.json"), 0o644)
    repaired = node.deploy(UNIT_V1, ENV_V1)
    assert repaired["changed"] is True
    assert repaired["files"] == sorted([node.env, os.path.join(node.inst, "current.json")])
    assert stat.S_IMODE(os.stat(node.env).st_mode) == 0o600 and node.read(node.env) == ENV_V1
    assert stat.S_IMODE(os.stat(os.path.join(node.inst, "current.json")).st_mode) == 0o600
    # the content did not change: no restart, nothing to gate or commit, no lock
    assert not (repaired["unit_changed"] or repaired["env_changed"] or repaired["commit_needed"])
    assert repaired["locked"] is False and "diff" not in repaired
    assert node.deploy(UNIT_V1, ENV_V1)["changed"] is False


def test_a_check_mode_run_reports_a_mode_repair_and_makes_none(node):
    node.commit(node.deploy(UNIT_V1, ENV_V1), 1)
    os.chmod(node.unit, 0o600)
    os.chmod(node.inst, 0o755)
    checked = node.deploy(UNIT_V1, ENV_V1, check_mode=True)
    assert checked["changed"] is True and checked["files"] == sorted([node.unit, node.inst])
    assert stat.S_IMODE(os.stat(node.unit).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(node.inst).st_mode) == 0o755
    node.deploy(UNIT_V1, ENV_V1)
    assert stat.S_IMODE(os.stat(node.unit).st_mode) == 0o644
    assert stat.S_IMODE(os.stat(node.inst).st_mode) == 0o700


@pytest.mark.skipif(os.geteuid() != 0, reason="only root changes a file's owner")
def test_a_kept_env_file_owned_by_another_user_is_given_back_to_root(node):
    healthy_v1_then_v2(node)
    previous_env = os.path.join(node.inst, "previous.env")
    os.chown(previous_env, 1000, 1000)
    os.chown(node.env, 1000, 1000)
    repaired = node.deploy(UNIT_V2, ENV_V2)
    assert repaired["files"] == sorted([node.env, previous_env])
    for path in (node.env, previous_env):
        assert (os.stat(path).st_uid, os.stat(path).st_gid) == (0, 0)


# --- the instance directory is never a link (issue 34) -----------------------------------------------------

def test_a_linked_instance_directory_is_refused_and_not_followed(node, tmp_path):
    healthy_v1_then_v2(node)
    elsewhere = str(tmp_path / "elsewhere")
    os.rename(node.inst, elsewhere)
    os.symlink(elsewhere, node.inst)
    start = node.snapshot()
    inside = sorted(os.listdir(elsewhere))
    for state, extra in (("deploy", {"unit_content": UNIT_V1, "env_content": ENV_V1}), ("swap", {}),
                         ("commit", {"record": record(3)}), ("restore", {}), ("release", {})):
        with pytest.raises(DeploymentError, match="deployment directory of instance q, %s, is a symbolic link"
                           % node.inst):
            node.step(state, **extra)
    with pytest.raises(DeploymentError, match="is a symbolic link"):
        run("query", node.root)
    assert node.snapshot() == start and sorted(os.listdir(elsewhere)) == inside
    # a directory again: the lifecycle goes on
    os.unlink(node.inst)
    os.rename(elsewhere, node.inst)
    assert [r["name"] for r in run("query", node.root)["records"]] == ["q"]
