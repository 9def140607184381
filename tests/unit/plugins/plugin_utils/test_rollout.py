# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""plugins/plugin_utils/rollout.py and plugins/filter/fleet.py: records, servers, rollback choice, summary."""

import os

import pytest
from ansible.errors import AnsibleFilterError
from ansible_collections.llmops.serving.plugins.filter.fleet import FilterModule
from ansible_collections.llmops.serving.plugins.plugin_utils import rollout

FILTERS = FilterModule().filters()


def plan(**over):
    item = {"name": "qwen", "engine": "vllm", "mode": "host", "unit": "vllm-qwen.service",
            "binary": "/opt/vllm/0.33.0/bin/vllm", "image": None, "build_id": "0.33.0",
            "model": "/models/qwen", "model_path": "/models/qwen", "model_sha256": None,
            "served_model_name": "qwen-fleet", "url": "http://127.0.0.1:18200", "port": 18200,
            "env_file": "/etc/llama-server/qwen.env", "key_file": None, "api_key_env": "VLLM_API_KEY",
            "settings": {"max_model_len": 4096}, "argv": ["--secret-free"], "env": {"A": "1"}}
    item.update(over)
    return item


def test_record_keeps_what_the_unit_runs_and_the_health_fields():
    record = rollout.deployment_record(plan(), unit_checksum="abc", time="2026-12-01T00:00:00Z",
                                       health_timeout="60")
    assert record["binary"] == "/opt/vllm/0.33.0/bin/vllm"
    assert record["build_id"] == "0.33.0" and record["model_path"] == "/models/qwen"
    assert record["unit_checksum"] == "abc" and record["time"] == "2026-12-01T00:00:00Z"
    assert record["health_timeout"] == 60 and record["recorded"] is True
    # the plan's env values (secrets possible) and argv are not in the record
    assert "env" not in record and "argv" not in record


def test_record_refuses_a_plan_without_unit():
    with pytest.raises(rollout.RolloutError, match="name and a unit"):
        rollout.deployment_record({"name": "x"})
    with pytest.raises(AnsibleFilterError, match="^fleet: "):
        FILTERS["fleet_deployment_record"]({"name": "x"})


def test_unrecorded_deployment_forgets_what_it_ran():
    record = rollout.unrecorded_deployment(plan(), unit_checksum="def")
    assert record["recorded"] is False and record["unit_checksum"] == "def"
    assert record["build_id"] is None and record["model_path"] is None and record["binary"] is None
    assert record["url"] == "http://127.0.0.1:18200" and record["unit"] == "vllm-qwen.service"


def test_host_servers_from_the_gateway_fact():
    fact = {"servers": [
        {"host": "n1", "instance": "a", "backend": "be_m", "server": "n1-a", "address": "x:1"},
        {"host": "n2", "instance": "a", "backend": "be_m", "server": "n2-a", "address": "y:1"}]}
    assert rollout.host_servers("n2", {}, fact) == [{"backend": "be_m", "server": "n2-a", "instance": "a"}]


def test_host_servers_by_the_gateway_naming_without_the_fact():
    hostvars = {"node.1": {"serving_instances": [{"name": "qwen", "served_model_name": "qwen fleet"},
                                                 {"name": "llama"}]}}
    assert FILTERS["fleet_host_servers"]("node.1", hostvars, None) == [
        {"backend": "be_qwen_fleet", "server": "node.1-qwen", "instance": "qwen"},
        {"backend": "be_llama", "server": "node.1-llama", "instance": "llama"}]
    assert rollout.host_servers("other", hostvars) == []
    # a rollback names the servers of its records (serving_instances may be elsewhere)
    records = [{"name": "qwen", "served_model_name": ["qwen-fleet", "alias"]}]
    assert FILTERS["fleet_host_servers"]("n2", {}, None, instances=records) == [
        {"backend": "be_qwen-fleet", "server": "n2-qwen", "instance": "qwen"}]


def test_rollback_selection():
    records = [{"name": "a", "previous": True}, {"name": "b", "previous": False}]
    assert rollout.rollback_selection(records, "a") == ["a"]
    assert rollout.rollback_selection(records) == ["a"]
    with pytest.raises(rollout.RolloutError, match="instance b has no previous deployment on n1"):
        rollout.rollback_selection(records, "b", host="n1")
    with pytest.raises(rollout.RolloutError, match="instance c has no deployment record"):
        rollout.rollback_selection(records, "c")
    # the refusal names where the records are (role serving's serving_deployments_dir)
    with pytest.raises(rollout.RolloutError, match=r"no deployment record on n1 \(/srv/deployments/c\)"):
        rollout.rollback_selection(records, "c", host="n1", directory="/srv/deployments")
    with pytest.raises(rollout.RolloutError, match="no instance on n1 has a previous deployment"):
        rollout.rollback_selection([{"name": "b", "previous": False}], host="n1")


def test_summary_names_updated_failed_and_untouched_hosts():
    hostvars = {"n1": {"fleet_result": {"status": "updated", "instances": ["qwen"]}},
                "n2": {"fleet_result": {"status": "failed", "instance": "qwen",
                                        "why": "did not become healthy\n--- journal ---\nexit 1"}},
                "n3": {}, "n4": {"fleet_result": {"status": "unchanged"}}}
    out = FILTERS["fleet_summary"](["n1", "n2", "n3", "n4"], hostvars)
    assert out["updated"] == ["n1"] and out["unchanged"] == ["n4"] and out["untouched"] == ["n3"]
    assert out["failed"] == [{"host": "n2", "instance": "qwen", "why": "did not become healthy"}]
    assert "FAILED: n2 (instance qwen): did not become healthy" in out["lines"]
    assert "untouched: n3" in out["lines"] and "updated: n1" in out["lines"]
    with pytest.raises(AnsibleFilterError, match="status 'weird'"):
        FILTERS["fleet_summary"](["n1"], {"n1": {"fleet_result": {"status": "weird"}}})


def test_health_wait_args_from_a_plan_and_from_its_record_are_the_same():
    """Role serving's health gate (a plan) and role fleet's after a rollback (a record): one command."""
    from ansible_collections.llmops.serving.plugins.plugin_utils.instance_plan import health_wait_args

    plan = {"name": "qwen", "unit": "vllm-qwen.service", "url": "http://127.0.0.1:8000",
            "served_model_name": ["qwen-fleet", "alias"], "key_file": None, "api_key_env": "VLLM_API_KEY",
            "env_file": "/etc/llama-server/qwen env", "engine": "vllm"}
    args = health_wait_args(plan, 60, 20)
    assert args == ("--url http://127.0.0.1:8000 --unit vllm-qwen.service --model qwen-fleet "
                    "--env-file '/etc/llama-server/qwen env' --key-env VLLM_API_KEY --timeout 60 "
                    "--journal-lines 20")
    record = rollout.deployment_record(plan, unit_checksum="ab", time="t", health_timeout=60)
    assert health_wait_args(record, record["health_timeout"], 20) == args
    llama = dict(plan, served_model_name="q", key_file="/etc/llama-server/q.key", api_key_env=None)
    assert health_wait_args(llama, 900).endswith("--model q --key-file /etc/llama-server/q.key --timeout 900 "
                                                 "--journal-lines 40")


# --- the deployment fingerprint (read by role validate) ----------------------------------------------------

def _real_plan(**instance):
    from tests.unit.plugins.plugin_utils.serving_helpers import plan as real_plan
    return real_plan([dict({"name": "qwen", "model": "tiny", "port": 18003, "settings": {"ctx_size": 4096}},
                           **instance)], gpus=None)[0]


def test_fingerprint_is_stable_and_short():
    assert rollout.deployment_fingerprint(plan()) == rollout.deployment_fingerprint(plan())
    assert len(rollout.deployment_fingerprint(plan())) == 16
    assert rollout.deployment_fingerprint(_real_plan()) == rollout.deployment_fingerprint(_real_plan())


@pytest.mark.parametrize("change", [
    {"settings": {"max_model_len": 8192}}, {"build_id": "0.34.0"}, {"model_sha256": "cd" * 32},
    {"model_path": "/models/other"}, {"binary": "/opt/vllm/0.34.0/bin/vllm"}, {"env": {"A": "2"}},
    {"env_names": ["HF_TOKEN"]}, {"gpus": [2, 3]}, {"argv": ["--other"]}, {"mode": "container"},
])
def test_fingerprint_changes_with_what_the_instance_runs(change):
    assert rollout.deployment_fingerprint(plan(**change)) != rollout.deployment_fingerprint(plan())


@pytest.mark.parametrize("change", [{"warnings": ["FP8 emulated"]}, {"timeout_start_sec": 900},
                                    {"url": "http://127.0.0.1:1"}, {"key_file": "/etc/k"}])
def test_fingerprint_ignores_the_plans_bookkeeping(change):
    assert rollout.deployment_fingerprint(plan(**change)) == rollout.deployment_fingerprint(plan())


def test_fingerprint_of_a_real_plan_follows_its_settings_and_is_in_the_instance_fact():
    from ansible_collections.llmops.serving.plugins.filter.serving import serving_instance_fact

    base = _real_plan()
    assert serving_instance_fact(base)["fingerprint"] == rollout.deployment_fingerprint(base)
    assert rollout.deployment_fingerprint(_real_plan(settings={"ctx_size": 8192})) \
        != rollout.deployment_fingerprint(base)
    with pytest.raises(rollout.RolloutError, match="needs an instance plan"):
        rollout.deployment_fingerprint(None)


def test_deployment_run_is_a_new_token_per_run_that_module_deployment_accepts():
    """The token and holder role serving passes to every step of the deployment lifecycle (tasks/run.yml):
    what the module checks them against (deployment.TOKEN_RE, HOLDER_RE), a new token on each call."""
    from ansible_collections.llmops.serving.plugins.module_utils._serving import deployment

    first = FILTERS["fleet_deployment_run"]("Serve the models", _now=1_800_000_000)
    second = FILTERS["fleet_deployment_run"]("Serve the models", _now=1_800_000_000)
    assert first["token"] != second["token"]
    assert first["token"].startswith("20270115T080000Z-")
    assert deployment.TOKEN_RE.fullmatch(first["token"])
    assert first["holder"].startswith("play 'Serve the models' started 2027-01-15T08:00:00Z by ")
    deployment.check_run(first["token"], first["holder"], 600)
    # a play name with line breaks or of any length is still one line the lock accepts
    odd = rollout.deployment_run("a\nb\x1b" + "x" * 400)
    assert "\n" not in odd["holder"] and len(odd["holder"]) <= 300
    deployment.check_run(odd["token"], odd["holder"], 600)


BOOT = "0f3c2a9e-5b1d-4c7e-9a2f-1d2e3f4a5b6c"
PIDNS = "4026531836"


def fake_proc(tmp_path, boot=BOOT, processes=()):
    """A /proc with the boot id and processes {pid: start ticks, or (start, state)} (the command name with a
    space and a ')')."""
    proc = tmp_path / "proc"
    (proc / "sys/kernel/random").mkdir(parents=True)
    (proc / "sys/kernel/random/boot_id").write_text(boot + "\n")
    (proc / "self/ns").mkdir(parents=True)
    os.symlink("pid:[%s]" % PIDNS, str(proc / "self/ns/pid"))
    for pid, start in dict(processes).items():
        start, state = start if isinstance(start, tuple) else (start, "S")
        (proc / str(pid)).mkdir()
        fields = [state] + ["0"] * 18 + [str(start)] + ["0"] * 10
        (proc / str(pid) / "stat").write_text("%d (ansible-playbook) x) %s\n" % (pid, " ".join(fields)))
    return str(proc)


def test_run_owner_names_this_process_as_module_deployment_accepts(tmp_path):
    """deployment_run's owner: host name, boot id, pid and start time, in the form the lock accepts; none
    where /proc cannot tell (no boot id, or the process is not listed)."""
    from ansible_collections.llmops.serving.plugins.module_utils._serving import deployment

    proc = fake_proc(tmp_path, processes={4242: 987654})
    owner = rollout.run_owner(_proc=proc, _pid=4242)
    assert owner.endswith(" boot=%s pidns=%s pid=4242 start=987654" % (BOOT, PIDNS))
    assert deployment.OWNER_RE.fullmatch(owner)
    assert rollout.run_owner(_proc=proc, _pid=4243) is None
    assert rollout.run_owner(_proc=str(tmp_path / "none"), _pid=4242) is None
    # the real one: this test's own process on this machine
    real = FILTERS["fleet_deployment_run"]("Serve the models")["owner"]
    assert real is None or (deployment.OWNER_RE.fullmatch(real) and " pid=%d " % os.getpid() in real)


THIS = "host=any boot=%s pidns=%s" % (BOOT, PIDNS)


@pytest.mark.parametrize("owner, gone", [
    (THIS + " pid=4242 start=987654", False),                                 # still runs
    (THIS + " pid=4243 start=987654", True),                                  # killed: no such process
    (THIS + " pid=4244 start=987654", True),                                  # killed, a zombie not reaped
    (THIS + " pid=4242 start=111111", True),                                  # its pid, another process now
    ("host=any boot=1f3c2a9e-5b1d-4c7e-9a2f-1d2e3f4a5b6c pidns=%s pid=4243 start=987654" % PIDNS,
     False),                                                                  # another kernel (or boot)
    ("host=any boot=%s pidns=4026532999 pid=4243 start=987654" % BOOT, False),  # another container's pids
    (THIS + " pid=4243 start=987654\n", False),                               # not an owner
    (None, False),                                                            # a lock of an older version
])
def test_lock_owner_gone_only_for_a_process_this_controller_sees_that_ended(tmp_path, owner, gone):
    proc = fake_proc(tmp_path, processes={4242: 987654, 4244: (987654, "Z")})
    assert rollout.lock_owner_gone({"token": "20261205T100000Z-aaaaaaaaaaaaaaaa", "owner": owner},
                                   _proc=proc) is gone
    assert FILTERS["fleet_lock_owner_gone"](None) is False
