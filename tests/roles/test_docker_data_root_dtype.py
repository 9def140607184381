# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Preflight refuses a Docker data-root on XFS without d_type (ftype=0), which overlay2 refuses in the build
stage (issue 35, point 6): role nvidia_container_toolkit's `disk` entry point, as playbooks/preflight.yml
includes it, run for real on localhost with a fake mount table and the fake xfs_info."""

import os
import sys

import yaml

from tests.helpers import FIXTURES, ROOT, load_yaml, run_local_playbook

PREFLIGHT = os.path.join(ROOT, "playbooks", "preflight.yml")


def run_disk_entry(tmp_path, fstype, xfs_info=None, **extra):
    (tmp_path / "home").mkdir()
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text("41 0 253:0 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n"
                         "43 41 253:2 / %s rw,relatime shared:29 - %s /dev/mapper/centos-home rw\n"
                         % (tmp_path / "home", fstype))
    play = [{"hosts": "localhost", "gather_facts": False, "connection": "local",
             "vars": dict({"nvidia_container_toolkit_docker_data_root": str(tmp_path / "home" / "docker"),
                           "nvidia_container_toolkit_disk_engines": ["vllm"],
                           "llmops_mountinfo_path": str(mountinfo)}, **extra),
             "tasks": [{"ansible.builtin.include_role": {"name": "llmops.serving.nvidia_container_toolkit",
                                                         "tasks_from": "disk"}}]}]
    path = tmp_path / "play.yml"
    path.write_text(yaml.safe_dump(play))
    env = {"FAKE_XFS_INFO": os.path.join(FIXTURES, "el7", "xfs_info", xfs_info) if xfs_info else ""}
    return run_local_playbook(path, os.path.join(FIXTURES, "fake_xfs_info"), extra_env=env,
                              extra_args=["-e", "ansible_python_interpreter=%s" % sys.executable])


def test_preflight_includes_the_entry_point_that_checks_d_type():
    tasks = load_yaml(PREFLIGHT)[0]["tasks"]
    entry = next(t for t in tasks if t.get("ansible.builtin.include_role", {}).get("name")
                 == "llmops.serving.nvidia_container_toolkit")
    assert entry["ansible.builtin.include_role"]["tasks_from"] == "disk"


def test_a_data_root_on_xfs_ftype0_is_refused_before_anything_is_installed(tmp_path):
    result, stats = run_disk_entry(tmp_path, "xfs", "home-ftype0.txt")
    assert result.returncode != 0 and stats["failed"] == 1, result.stdout
    out = " ".join(result.stdout.split())
    assert "(not created yet: %s holds it)" % (tmp_path / "home") in out
    assert "xfs_info %s shows ftype=0" % (tmp_path / "home") in out
    assert "set nvidia_container_toolkit_docker_data_root to a path on a file system with d_type" in out


def test_xfs_ftype1_and_ext4_pass_and_another_storage_driver_is_not_checked(tmp_path):
    for name, fstype, xfs_info, extra in (("ftype1", "xfs", "root-ftype1.txt", {}),
                                          ("ext4", "ext4", None, {}),
                                          ("devicemapper", "xfs", "home-ftype0.txt",
                                           {"nvidia_container_toolkit_daemon_options":
                                            {"storage-driver": "devicemapper"}})):
        (tmp_path / name).mkdir()
        result, stats = run_disk_entry(tmp_path / name, fstype, xfs_info, **extra)
        assert result.returncode == 0 and stats["failed"] == 0, (name, result.stdout)
