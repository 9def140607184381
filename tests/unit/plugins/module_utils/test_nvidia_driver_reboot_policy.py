# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The reboot policy of role nvidia_driver (reboot_decision and what it reads), without Ansible: auto reboots
a node that serves nothing (a bare node's one run) and stops a box in production, naming what runs."""

import os

import pytest
from ansible_collections.llmops.serving.plugins.module_utils._gpu.driver import (
    busy_units,
    normal_reboot_policy,
    read_gpu_processes,
    reboot_decision,
)

PATTERNS = ["llama-server-*.service", "vllm-*.service", "ray.service"]


def fake_proc(tmp_path, processes):
    """<tmp>/proc/<pid>/{comm,fd/<n>} with fd links to the given paths (the targets need not exist)."""
    root = tmp_path / "proc"
    for pid, name, targets in processes:
        fd = root / str(pid) / "fd"
        fd.mkdir(parents=True)
        (root / str(pid) / "comm").write_text(name + "\n")
        for number, target in enumerate(targets):
            os.symlink(target, str(fd / str(number)))
    (root / "self").mkdir(parents=True, exist_ok=True)  # not a pid
    return str(root)


@pytest.mark.parametrize("value,policy", [
    ("auto", "auto"), ("AUTO", "auto"), (True, "true"), ("true", "true"), ("True", "true"), ("yes", "true"),
    (False, "false"), ("false", "false"), ("False", "false"), ("no", "false")])
def test_policy_spellings(value, policy):
    assert normal_reboot_policy(value) == policy


def test_an_unknown_policy_says_the_three_values():
    with pytest.raises(ValueError, match="must be auto, true or false, got 'sometimes'"):
        normal_reboot_policy("sometimes")


def test_gpu_processes_are_read_from_open_device_nodes_whatever_the_driver(tmp_path):
    proc = fake_proc(tmp_path, [
        (1, "systemd", ["/dev/null", "/run/systemd/notify"]),
        (812, "nvidia-persistenced", ["/dev/nvidiactl", "/dev/nvidia0"]),
        (4242, "llama-server", ["/dev/null", "/dev/nvidiactl", "/dev/nvidia2", "/dev/nvidia-uvm"]),
        (5150, "python3", ["/dev/nvidia-uvm"]),
        (6000, "Xorg", ["/dev/dri/card0"]),  # nouveau's DRM node is not an NVIDIA driver node
        (6001, "bash", ["/dev/nvidia-caps/nvidia-cap1"]),
    ])
    found = read_gpu_processes(proc, ignore=["nvidia-persistenced"])
    assert found == [{"pid": 4242, "name": "llama-server", "device": "/dev/nvidiactl"},
                     {"pid": 5150, "name": "python3", "device": "/dev/nvidia-uvm"}]
    assert read_gpu_processes(str(tmp_path / "absent")) == []


def test_busy_units_are_ours_among_the_running_ones():
    running = ["sshd.service", "llama-server-qwen36-27b.service", "ray.service", "docker.service"]
    assert busy_units(running, PATTERNS) == ["llama-server-qwen36-27b.service", "ray.service"]
    assert busy_units(running, []) == []


def test_auto_reboots_a_node_that_serves_nothing():
    decision = reboot_decision("reboot", "auto", [], ["sshd.service", "docker.service"], PATTERNS)
    assert decision == {"reboot": True, "reboot_policy": "auto", "reboot_blockers": [], "busy_units": []}


def test_auto_stops_a_box_in_production_naming_what_runs():
    processes = [{"pid": 4242, "name": "llama-server", "device": "/dev/nvidia2"}]
    decision = reboot_decision("reboot", "auto", processes, ["llama-server-qwen36-27b.service"], PATTERNS)
    assert decision["reboot"] is False
    assert decision["reboot_blockers"] == [
        "1 process(es) use the GPUs: llama-server (pid 4242, /dev/nvidia2)",
        "serving units run: llama-server-qwen36-27b.service"]
    # A unit alone (a CPU instance, or one still loading) is enough to stop.
    assert reboot_decision("reboot", "auto", [], ["vllm-fp8.service"], PATTERNS)["reboot"] is False


@pytest.mark.parametrize("policy,busy,reboot", [
    ("true", True, True), ("true", False, True), ("false", False, False), ("false", True, False),
    ("auto", False, True), ("auto", True, False)])
def test_the_three_policies(policy, busy, reboot):
    processes = [{"pid": 1, "name": "python3", "device": "/dev/nvidia0"}] if busy else []
    assert reboot_decision("reboot", policy, processes, [], PATTERNS)["reboot"] is reboot


@pytest.mark.parametrize("action", ["none", "install"])
def test_nothing_to_decide_without_a_pending_reboot(action):
    busy = [{"pid": 1, "name": "x", "device": "/dev/nvidia0"}]
    decision = reboot_decision(action, "auto", busy, [], PATTERNS)
    assert decision["reboot"] is False and decision["reboot_blockers"] == []
