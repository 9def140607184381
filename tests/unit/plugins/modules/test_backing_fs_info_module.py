# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""llmops.serving.backing_fs_info end to end: the module file run as Ansible runs it, on a fake mount table
with the fake xfs_info (tests/fixtures/fake_xfs_info) first on PATH."""

import json
import os
import subprocess
import sys

from tests.helpers import FIXTURES, ROOT

MODULE = os.path.join(ROOT, "plugins", "modules", "backing_fs_info.py")
COLLECTIONS = os.path.join(ROOT, "collections")


def run_module(tmp_path, args, xfs_info=None):
    args_file = tmp_path / "args.json"
    args_file.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": args}))
    env = dict(os.environ, PYTHONPATH=COLLECTIONS,
               PATH="%s:%s" % (os.path.join(FIXTURES, "fake_xfs_info"), os.environ["PATH"]),
               FAKE_XFS_INFO=os.path.join(FIXTURES, "el7", "xfs_info", xfs_info) if xfs_info else "")
    proc = subprocess.run([sys.executable, MODULE, str(args_file)], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, env=env, timeout=60, universal_newlines=True)
    result = json.loads(proc.stdout)
    result["_rc"] = proc.returncode
    return result


def mountinfo(tmp_path, fstype):
    path = tmp_path / "mountinfo"
    path.write_text("41 0 253:0 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n"
                    "43 41 253:2 / %s rw,relatime shared:29 - %s /dev/mapper/centos-home rw\n"
                    % (tmp_path, fstype))
    return str(path)


def test_ftype0_fails_and_ftype1_passes(tmp_path):
    args = {"path": str(tmp_path / "docker"), "mountinfo": mountinfo(tmp_path, "xfs"),
            "variable": "nvidia_container_toolkit_docker_data_root"}
    refused = run_module(tmp_path, args, "home-ftype0.txt")
    assert refused["_rc"] != 0 and refused["failed"] is True and refused["d_type"] is False
    assert "xfs_info %s shows ftype=0" % tmp_path in refused["msg"]
    assert "set nvidia_container_toolkit_docker_data_root to a path" in refused["msg"]
    assert "mkfs.xfs -n ftype=1 /dev/mapper/centos-home" in refused["msg"]
    warned = run_module(tmp_path, dict(args, fail_without_d_type=False), "home-ftype0.txt")
    assert warned["_rc"] == 0 and warned["d_type"] is False and "ftype=0" in warned["warnings"][0]
    accepted = run_module(tmp_path, args, "root-ftype1.txt")
    assert accepted["_rc"] == 0 and accepted["d_type"] is True and accepted["ftype"] == 1
    assert accepted["anchor"] == str(tmp_path) and "warnings" not in accepted


def test_ext4_passes_without_xfs_info_and_an_unreadable_xfs_warns(tmp_path):
    ext4 = run_module(tmp_path, {"path": str(tmp_path), "mountinfo": mountinfo(tmp_path, "ext4")})
    assert ext4["_rc"] == 0 and ext4["d_type"] is True and ext4["fstype"] == "ext4"
    unknown = run_module(tmp_path, {"path": str(tmp_path), "mountinfo": mountinfo(tmp_path, "xfs")})
    assert unknown["_rc"] == 0 and unknown["d_type"] is None
    assert "is not a mounted XFS filesystem" in unknown["warnings"][0]
    relative = run_module(tmp_path, {"path": "docker", "mountinfo": mountinfo(tmp_path, "ext4")})
    assert relative["_rc"] != 0
    gone = run_module(tmp_path, {"path": str(tmp_path), "mountinfo": str(tmp_path / "none")})
    assert gone["_rc"] != 0 and "is not a readable file" in gone["msg"]
    os.mkfifo(str(tmp_path / "fifo"))  # would block a plain open(): refused before
    fifo = run_module(tmp_path, {"path": str(tmp_path), "mountinfo": str(tmp_path / "fifo")})
    assert fifo["_rc"] != 0 and "is not a readable file" in fifo["msg"]
