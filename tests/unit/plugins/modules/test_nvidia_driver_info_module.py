# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""llmops.serving.nvidia_driver_info end to end: the module file run as Ansible runs it, on a fake sysfs."""

import json
import os
import subprocess
import sys

from tests.helpers import ROOT

MODULE = os.path.join(ROOT, "plugins", "modules", "nvidia_driver_info.py")
COLLECTIONS = os.path.join(ROOT, "collections")


def run_module(tmp_path, args):
    args_file = tmp_path / "args.json"
    args_file.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": args}))
    env = dict(os.environ, PYTHONPATH=COLLECTIONS)
    proc = subprocess.run([sys.executable, MODULE, str(args_file)], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, env=env, timeout=60, universal_newlines=True)
    result = json.loads(proc.stdout)
    result["_rc"] = proc.returncode
    return result


def test_old_module_loaded_means_a_reboot_with_its_reasons(tmp_path):
    sysfs = tmp_path / "sys-module"
    (sysfs / "nvidia").mkdir(parents=True)
    (sysfs / "nvidia" / "version").write_text("535.104.05\n")
    result = run_module(tmp_path, {
        "wanted_version": "550.54.14",
        "gpus": {"present": False, "driver_version": None, "error": "Driver/library version mismatch"},
        "sysfs_module_dir": str(sysfs),
    })
    assert result["_rc"] == 0 and result["changed"] is False
    assert result["stage"] == "final" and result["action"] == "reboot"
    assert result["loaded_module"] == "535.104.05" and result["nouveau_loaded"] is False
    assert result["reasons"][0] == "nvidia-smi reports no usable driver (Driver/library version mismatch)"


def test_wanted_driver_reported_means_nothing_to_do(tmp_path):
    result = run_module(tmp_path, {
        "wanted_version": "550.54.14",
        "stage": "detect",
        "gpus": {"present": True, "driver_version": "550.54.14"},
        "sysfs_module_dir": str(tmp_path / "absent"),
    })
    assert result["action"] == "none" and result["reasons"] == [] and result["wanted_loaded"] is True


def test_unknown_stage_is_refused_by_the_argument_spec(tmp_path):
    result = run_module(tmp_path, {"wanted_version": "550.54.14", "stage": "before-runfile"})
    assert result["_rc"] != 0 and "before_installer" in result["msg"]


def test_auto_reboots_a_bare_node_and_stops_one_that_serves(tmp_path):
    sysfs = tmp_path / "sys-module"
    (sysfs / "nouveau").mkdir(parents=True)
    proc = tmp_path / "proc"
    (proc / "77" / "fd").mkdir(parents=True)
    (proc / "77" / "comm").write_text("nvidia-persistenced\n")
    os.symlink("/dev/nvidiactl", str(proc / "77" / "fd" / "3"))
    args = {"wanted_version": "550.54.14", "gpus": {"present": False, "error": "nvidia-smi not found"},
            "sysfs_module_dir": str(sysfs), "reboot_policy": "auto", "proc_root": str(proc),
            "ignore_processes": ["nvidia-persistenced"], "busy_units": ["llama-server-*.service"],
            "running_units": ["sshd.service"]}
    bare = run_module(tmp_path, args)
    assert bare["action"] == "reboot" and bare["reboot"] is True and bare["reboot_blockers"] == []
    assert bare["reboot_policy"] == "auto" and bare["gpu_processes"] == []
    serving = run_module(tmp_path, dict(args, running_units=["sshd.service", "llama-server-qwen.service"]))
    assert serving["reboot"] is False
    assert serving["reboot_blockers"] == ["serving units run: llama-server-qwen.service"]
    # The module's own default never reboots (the role passes its policy).
    plain = run_module(tmp_path, {k: v for k, v in args.items() if k != "reboot_policy"})
    assert plain["reboot"] is False and plain["reboot_blockers"] == ["nvidia_driver_allow_reboot is false"]
    bad = run_module(tmp_path, dict(args, reboot_policy="sometimes"))
    assert bad["_rc"] != 0 and "must be auto, true or false" in bad["msg"]
