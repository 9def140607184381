# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Docker's data-root needs d_type (overlay2): plugins/module_utils/_files/backing_fs.py with CentOS 7's
mount table
and real xfs_info outputs (tests/fixtures/el7), issue 35 point 6."""

import os

import pytest
from ansible_collections.llmops.serving.plugins.module_utils._files.backing_fs import (
    d_type_check,
    mount_of,
    parse_mountinfo,
    xfs_ftype,
)

from tests.helpers import FIXTURES

EL7 = os.path.join(FIXTURES, "el7")


def fixture(*parts):
    with open(os.path.join(EL7, *parts)) as handle:
        return handle.read()


def xfs_info_of(name):
    calls = []

    def xfs_info(mount):
        calls.append(mount)
        return 0, fixture("xfs_info", name), ""
    xfs_info.calls = calls
    return xfs_info


def mounts_with(tmp_path, fstype, source="/dev/mapper/centos-home"):
    """The CentOS 7 mount table with tmp_path mounted as fstype (the test's stand-in for /home)."""
    return parse_mountinfo(fixture("mountinfo") + "45 41 253:3 / %s rw,relatime shared:31 - %s %s rw\n" % (
        str(tmp_path).replace(" ", "\\040"), fstype, source))


def test_the_centos7_mount_table_is_read():
    mounts = parse_mountinfo(fixture("mountinfo"))
    assert [m["mount"] for m in mounts] == ["/sys", "/proc", "/dev", "/", "/boot", "/home", "/data disk"]
    assert mount_of("/home/docker", mounts) == dict(mount="/home", fstype="xfs",
                                                    source="/dev/mapper/centos-home")
    assert mount_of("/homes/x", mounts)["mount"] == "/"
    assert mount_of("/data disk/docker", mounts)["fstype"] == "ext4"
    assert mount_of("/var/lib/docker", mounts)["source"] == "/dev/mapper/centos-root"
    # a second mount on the same point is on top: it counts
    over = mounts + parse_mountinfo("50 43 0:40 / /home rw - tmpfs tmpfs rw\n")
    assert mount_of("/home/docker", over)["fstype"] == "tmpfs"


@pytest.mark.parametrize("name, ftype", [("home-ftype0.txt", 0), ("root-ftype1.txt", 1),
                                         ("xfsprogs5-ftype1.txt", 1)])
def test_xfs_info_ftype(name, ftype):
    assert xfs_ftype(fixture("xfs_info", name)) == ftype
    assert xfs_ftype("meta-data=/dev/sda1 isize=256\n") is None


def test_xfs_without_d_type_is_refused_with_the_fix(tmp_path):
    (tmp_path / "docker").mkdir()
    xfs_info = xfs_info_of("home-ftype0.txt")
    result = d_type_check(str(tmp_path / "docker"), mounts_with(tmp_path, "xfs"), xfs_info,
                          variable="nvidia_container_toolkit_docker_data_root")
    assert result["d_type"] is False and result["ftype"] == 0 and result["mount"] == str(tmp_path)
    assert xfs_info.calls == [str(tmp_path)]
    assert result["message"] == (
        "Docker's data-root %s/docker is on %s (xfs on /dev/mapper/centos-home), an XFS made without d_type "
        "(xfs_info %s shows ftype=0; CentOS/RHEL 7.0-7.2 installers made them so): Docker's overlay2 storage "
        "driver refuses it and the build stage would fail. Either set "
        "nvidia_container_toolkit_docker_data_root to a path on a file system with d_type (ext4, or XFS "
        "with ftype=1), or back up %s and make the file "
        "system again with mkfs.xfs -n ftype=1 /dev/mapper/centos-home (it erases it)."
        % (tmp_path, tmp_path, tmp_path, tmp_path))


@pytest.mark.parametrize("fstype, xfs_output", [("xfs", "root-ftype1.txt"), ("xfs", "xfsprogs5-ftype1.txt"),
                                                ("ext4", None)])
def test_xfs_with_d_type_and_ext4_are_accepted(tmp_path, fstype, xfs_output):
    xfs_info = xfs_info_of(xfs_output) if xfs_output else None
    result = d_type_check(str(tmp_path), mounts_with(tmp_path, fstype), xfs_info)
    assert result["d_type"] is True and result["message"] == "" and result["fstype"] == fstype
    assert result["ftype"] == (1 if xfs_output else None)


def test_a_data_root_not_created_yet_is_judged_by_the_directory_that_will_hold_it(tmp_path):
    """Docker not installed: /home/docker does not exist; /home's file system is the one overlay2 will get."""
    missing = str(tmp_path / "docker" / "root")
    refused = d_type_check(missing, mounts_with(tmp_path, "xfs"), xfs_info_of("home-ftype0.txt"))
    assert refused["d_type"] is False and refused["anchor"] == str(tmp_path)
    assert "%s (not created yet: %s holds it) is on %s" % (missing, tmp_path, tmp_path) in refused["message"]
    # the same path on an ext4 parent, or the parent on XFS with ftype=1: accepted
    assert d_type_check(missing, mounts_with(tmp_path, "ext4"), None)["d_type"] is True
    with_d_type = d_type_check(missing, mounts_with(tmp_path, "xfs"), xfs_info_of("root-ftype1.txt"))
    assert with_d_type["d_type"] is True


def test_an_xfs_that_cannot_be_read_is_a_warning_not_a_refusal(tmp_path):
    mounts = mounts_with(tmp_path, "xfs")
    missing_tool = d_type_check(str(tmp_path), mounts, None)
    assert missing_tool["d_type"] is None and "xfs_info is not installed" in missing_tool["message"]
    failed = d_type_check(str(tmp_path), mounts, lambda mount: (1, "", "xfs_info: /x is not a mounted XFS\n"))
    assert failed["d_type"] is None and "failed: xfs_info: /x is not a mounted XFS" in failed["message"]
    silent = d_type_check(str(tmp_path), mounts, lambda mount: (0, "meta-data=/dev/sda1\n", ""))
    assert silent["d_type"] is None and "says nothing of ftype" in silent["message"]
