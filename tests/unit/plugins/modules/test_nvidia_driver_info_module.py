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


# --- a driver installed with NVIDIA's .run installer (issue 35, point 1) ------------------------------------

def runfile_node(tmp_path, owned_by_packages, tool="dpkg"):
    """A fake node whose driver 535.104.05 came from the runfile (or from packages), with fake rpm/dpkg first
    on PATH; returns the module arguments and the environment."""
    from tests.fixtures.fake_pkg_owner import EL7_KERNEL, HERE, driver_root, owner_db

    root = tmp_path / "node"
    files = driver_root(root, "535.104.05", uninstaller=not owned_by_packages, log=not owned_by_packages)
    db = owner_db(tmp_path / "owners", dict((p, "nvidia-driver-latest-dkms-cuda-libs") for p in files)
                  if owned_by_packages else {})
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    os.symlink(os.path.join(HERE, "rpm"), str(bin_dir / tool))
    (root / "proc" / "sys" / "kernel").mkdir(parents=True)
    (root / "proc" / "sys" / "kernel" / "osrelease").write_text(EL7_KERNEL + "\n")
    env = dict(PATH="%s:%s" % (bin_dir, os.environ["PATH"]), FAKE_PKG_DB=db, FAKE_PKG_ROOT=str(root))
    args = {"wanted_version": "550.54.14", "stage": "detect", "root": str(root),
            "proc_root": str(root / "proc"), "sysfs_module_dir": str(root / "sys-module"),
            "gpus": {"present": False, "error": "NVIDIA-SMI has failed because it couldn't communicate with "
                                                "the NVIDIA driver"}}
    return args, env


def run_with_env(tmp_path, args, env):
    args_file = tmp_path / "args.json"
    args_file.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": args}))
    proc = subprocess.run([sys.executable, MODULE, str(args_file)], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, env=dict(os.environ, PYTHONPATH=COLLECTIONS, **env),
                          timeout=60, universal_newlines=True)
    result = json.loads(proc.stdout)
    result["_rc"] = proc.returncode
    return result


def test_a_runfile_driver_is_refused_and_a_packaged_one_is_not(tmp_path):
    # dpkg is looked for first (a Debian node may also carry rpm): the fake answers as dpkg there
    args, env = runfile_node(tmp_path / "runfile", owned_by_packages=False, tool="dpkg")
    result = run_with_env(tmp_path, args, env)
    assert result["_rc"] == 0 and result["action"] == "install", result
    assert result["runfile"]["installed"] is True and result["runfile"]["version"] == "535.104.05"
    assert result["runfile_action"] == "refuse"
    assert "installed without --dkms" in result["runfile_message"]
    assert "the running kernel is 3.10.0-1160.119.1.el7.x86_64" in result["runfile_message"]
    uninstall = run_with_env(tmp_path, dict(args, runfile_policy="uninstall"), env)
    assert uninstall["runfile_action"] == "uninstall"
    own = run_with_env(tmp_path, dict(args, install_method="runfile"), env)
    assert own["runfile_action"] == "none" and own["runfile"]["installed"] is True

    args, env = runfile_node(tmp_path / "packages", owned_by_packages=True, tool="dpkg")
    packaged = run_with_env(tmp_path, args, env)
    assert packaged["action"] == "install" and packaged["runfile"]["installed"] is False, packaged
    assert packaged["runfile_action"] == "none" and packaged["runfile_message"] == ""


def test_the_runfile_is_not_read_when_the_wanted_driver_works(tmp_path):
    args, env = runfile_node(tmp_path, owned_by_packages=False, tool="dpkg")
    result = run_with_env(tmp_path, dict(args, gpus={"present": True, "driver_version": "550.54.14"}), env)
    assert result["action"] == "none" and result["runfile"] == {} and result["runfile_action"] == "none"
    bad = run_with_env(tmp_path, dict(args, runfile_policy="remove"), env)
    assert bad["_rc"] != 0 and "refuse, uninstall" in bad["msg"]
