# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""One run for a bare node: role nvidia_driver's reboot policy defaults to auto (reboot on its own only a node
that serves nothing), the role acts on the module's decision, the stop message says what kept it from
rebooting, and inventories/l20 states its choice."""

import os

from ansible_collections.llmops.serving.plugins.module_utils._gpu.driver import driver_plan, reboot_decision

from tests.helpers import ROOT, load_yaml
from tests.roles.test_nvidia_driver import el7, flat_tasks

L20 = os.path.join(ROOT, "inventories", "l20", "group_vars", "l20", "main.yml")
BARE = {"present": False, "error": "nvidia-smi not found"}


def decide_task(r, tasks_file):
    return next(t for t in flat_tasks(r.tasks(tasks_file))
                if "llmops.serving.nvidia_driver_info" in t and t.get("register") == "_nvidia_driver_plan")


def test_the_default_is_auto_and_the_module_gets_the_policy_and_what_runs():
    r = el7()
    assert r.var("nvidia_driver_allow_reboot") == "auto"
    assert r.expr("{{ nvidia_driver_reboot_busy_units }}") == [
        "llama-server-*.service", "vllm-*.service", "ray.service"]
    assert "nvidia-persistenced" in r.var("nvidia_driver_reboot_ignore_processes")
    for tasks_file in ("activate.yml", "runfile.yml"):
        tasks = list(flat_tasks(r.tasks(tasks_file)))
        decide = decide_task(r, tasks_file)
        args = decide["llmops.serving.nvidia_driver_info"]
        assert args["reboot_policy"] == "{{ nvidia_driver_allow_reboot }}"
        assert args["busy_units"] == "{{ nvidia_driver_reboot_busy_units }}"
        assert args["ignore_processes"] == "{{ nvidia_driver_reboot_ignore_processes }}"
        assert args["running_units"] == "{{ _nvidia_driver_running_units }}"
        facts_at = next(i for i, t in enumerate(tasks) if "llmops.serving.systemd_info" in t)
        assert tasks[facts_at]["register"] == "_nvidia_driver_systemd"
        assert facts_at < tasks.index(decide)


def test_running_units_come_from_systemd_info():
    read = {"running_units": ["llama-server-q.service", "sshd.service"]}
    r = el7(_nvidia_driver_systemd=read)
    assert sorted(r.var("_nvidia_driver_running_units")) == ["llama-server-q.service", "sshd.service"]
    # policy not auto: the read was skipped, nothing counts as running
    assert el7(_nvidia_driver_systemd={"skipped": True}).var("_nvidia_driver_running_units") == []


def test_the_role_reboots_and_stops_by_the_decision_not_by_the_raw_variable():
    tasks = el7().tasks("reboot.yml")
    fail = next(t for t in tasks if "ansible.builtin.fail" in t)
    reboot = next(t for t in tasks if "ansible.builtin.reboot" in t)
    assert "_nvidia_driver_plan.reboot | bool" in reboot["when"]
    assert "not (_nvidia_driver_plan.reboot | bool)" in fail["when"]
    assert not any("nvidia_driver_allow_reboot" in str(c) for c in reboot["when"] + fail["when"])


def stop_message(decision):
    mismatch = {"present": False, "error": "Driver/library version mismatch"}
    pending = driver_plan("550.54.14", "final", gpus=mismatch, loaded_module="535.104.05")
    pending.update(decision)
    r = el7(_nvidia_driver_plan=pending, _nvidia_driver_packages={"changed": True},
            ansible_inventory_sources=["/srv/ansible/inventories/l20"])
    fail = next(t for t in r.tasks("reboot.yml") if "ansible.builtin.fail" in t)
    return " ".join(r.expr(fail["ansible.builtin.fail"]["msg"]).split())


def test_auto_on_a_box_that_serves_stops_naming_what_runs_and_how_to_resume():
    processes = [{"pid": 4242, "name": "llama-server", "device": "/dev/nvidia2"}]
    msg = stop_message(reboot_decision("reboot", "auto", processes, ["llama-server-qwen36-27b.service"],
                                       ["llama-server-*.service"]))
    assert msg.startswith("REBOOT PENDING on gpu1: NVIDIA driver 550.54.14 was installed in this run")
    assert ("The play did not reboot it on its own (nvidia_driver_allow_reboot: auto reboots only a node "
            "that serves nothing) because 1 process(es) use the GPUs: llama-server (pid 4242, /dev/nvidia2); "
            "serving units run: llama-server-qwen36-27b.service.") in msg
    assert "--limit gpu1" in msg and "-e nvidia_driver_allow_reboot=true" in msg


def test_false_keeps_the_message_molecule_default_checks():
    msg = stop_message(reboot_decision("reboot", "false"))
    assert "did not reboot it on its own" not in msg
    assert "nvidia_driver_allow_reboot=true" in msg and "the loaded nvidia kernel module is 535.104.05" in msg


def test_the_l20_inventory_states_auto_with_its_reason():
    assert load_yaml(L20)["nvidia_driver_allow_reboot"] == "auto"
    with open(L20) as handle:
        text = handle.read()
    before = text.split("nvidia_driver_allow_reboot: auto")[0].rsplit("\n\n", 1)[-1]
    assert "nouveau" in before and "serves nothing" in before


def test_preflight_says_what_auto_will_do():
    with open(os.path.join(ROOT, "playbooks", "preflight.yml")) as handle:
        text = " ".join(handle.read().split())
    # the sentence comes from driver_plan()'s detect decision (module_utils/nvidia_driver.preflight_summary),
    # with the policy the inventory sets, auto by default
    assert "llmops.serving.nvidia_driver_preflight_summary(" in text
    assert "nvidia_driver_allow_reboot | default('auto')" in text
    from ansible_collections.llmops.serving.plugins.module_utils._gpu.driver import preflight_summary
    said = preflight_summary("550.54.14", {"present": False}, "auto")
    assert "reboots the node only when no process uses the GPUs and no serving unit runs" in said
