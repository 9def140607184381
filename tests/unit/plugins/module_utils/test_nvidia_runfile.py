# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""A driver installed with NVIDIA's .run installer (plugins/module_utils/_gpu/runfile.py), on fake node
roots (tests/fixtures/fake_pkg_owner): found, and never overwritten by packages (issue 35, point 1)."""

import pytest
from ansible_collections.llmops.serving.plugins.module_utils._gpu.runfile import (
    installer_log_version,
    package_owner,
    read_runfile_install,
    runfile_plan,
)

from tests.fixtures.fake_pkg_owner import EL7_KERNEL, EL7_OLD_KERNEL, driver_root, installer_log

WANTED = "550.54.14"
BROKEN = {"present": False, "error": "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA "
                                      "driver"}


def nobody(_path):
    return ""


def test_a_runfile_install_is_found_by_its_uninstaller_and_its_unowned_files(tmp_path):
    files = driver_root(tmp_path, WANTED)
    found = read_runfile_install(str(tmp_path), nobody)
    assert found["installed"] is True and found["version"] == WANTED and found["uninstaller"] is True
    assert found["unowned"] == files and found["module_kernels"] == [EL7_OLD_KERNEL]
    assert found["dkms"] is False
    assert found["evidence"][0].startswith("/usr/bin/nvidia-uninstall is there")
    assert "no package owns /usr/lib64/libcuda.so.550.54.14" in found["evidence"][1]


def test_a_packaged_driver_is_not_a_runfile_install(tmp_path):
    files = driver_root(tmp_path, WANTED, kernels=(), uninstaller=False, log=False)
    owned = dict((path, "nvidia-driver-latest-dkms-cuda-libs") for path in files)
    found = read_runfile_install(str(tmp_path), lambda path: owned.get(path, ""))
    assert found["installed"] is False and found["unowned"] == [] and found["evidence"] == []
    # no package manager to ask: the files count for nothing either way
    assert read_runfile_install(str(tmp_path), None)["installed"] is False
    # an installer log alone is what an uninstall leaves behind: not a runfile install
    driver_root(tmp_path / "uninstalled", "535.104.05", kernels=(), uninstaller=False)
    for path in ("usr/lib64/libcuda.so.535.104.05", "usr/lib64/libnvidia-ml.so.535.104.05",
                 "usr/bin/nvidia-smi", "usr/lib64/libcuda.so.1"):
        (tmp_path / "uninstalled" / path).unlink()
    gone = read_runfile_install(str(tmp_path / "uninstalled"), nobody)
    assert gone["installed"] is False and gone["version"] == "535.104.05"


def test_one_sign_is_enough_in_either_direction(tmp_path):
    """The uninstaller without unowned files (someone installed packages over it), and unowned files without
    the uninstaller (it was deleted): both are runfile installs."""
    files = driver_root(tmp_path / "a", WANTED, kernels=())
    owned = dict((path, "pkg") for path in files)
    only_uninstaller = read_runfile_install(str(tmp_path / "a"), lambda path: owned.get(path, ""))
    assert only_uninstaller["installed"] is True and only_uninstaller["unowned"] == []
    driver_root(tmp_path / "b", WANTED, uninstaller=False, log=False)
    only_files = read_runfile_install(str(tmp_path / "b"), nobody)
    assert only_files["installed"] is True and only_files["uninstaller"] is False
    assert only_files["version"] == WANTED


def test_an_unowned_nvidia_smi_alone_is_no_runfile_install(tmp_path):
    """A copied nvidia-smi (or a test double) with nothing else of a driver: not a runfile install; with the
    runfile's libraries beside it, it is named with them."""
    (tmp_path / "usr" / "bin").mkdir(parents=True)
    (tmp_path / "usr" / "bin" / "nvidia-smi").write_text("#!/bin/sh\n")
    alone = read_runfile_install(str(tmp_path), nobody)
    assert alone["installed"] is False and alone["evidence"] == []
    driver_root(tmp_path / "b", WANTED, uninstaller=False, log=False)
    both = read_runfile_install(str(tmp_path / "b"), nobody)
    assert both["installed"] is True and "/usr/bin/nvidia-smi" in both["evidence"][0]


def test_the_version_and_dkms_come_from_the_node(tmp_path):
    driver_root(tmp_path, "535.104.05", libdir="usr/lib/x86_64-linux-gnu", dkms=True, log=False)
    found = read_runfile_install(str(tmp_path), nobody)
    assert found["version"] == "535.104.05" and found["dkms"] is True
    (tmp_path / "var" / "log").mkdir(parents=True)
    (tmp_path / "var" / "log" / "nvidia-installer.log").write_text(installer_log("535.104.05"))
    assert installer_log_version(str(tmp_path)) == "535.104.05"
    assert installer_log_version(str(tmp_path / "none")) == ""


@pytest.mark.parametrize("rc, out, expected", [
    (0, "nvidia-driver-latest-dkms-cuda-libs-550.54.14-1.el7.x86_64\n",
     "nvidia-driver-latest-dkms-cuda-libs-550.54.14-1.el7.x86_64"),
    (1, "file /usr/lib64/libcuda.so.550.54.14 is not owned by any package\n", ""),
    (0, "libnvidia-compute-550:amd64: /usr/lib/x86_64-linux-gnu/libcuda.so.550.54.14\n",
     "libnvidia-compute-550:amd64"),
    (1, "", ""),
])
def test_package_owner_reads_rpm_and_dpkg(rc, out, expected):
    assert package_owner(rc, out) == expected


def runfile(tmp_path, **kwargs):
    driver_root(tmp_path, **kwargs)
    return read_runfile_install(str(tmp_path), nobody)


def test_packages_are_refused_over_a_runfile_driver_with_what_to_do(tmp_path):
    found = runfile(tmp_path, version="535.104.05", kernels=(EL7_KERNEL,))
    plan = runfile_plan(found, "repo", "refuse", WANTED, {"present": True, "driver_version": "535.104.05"},
                        EL7_KERNEL)
    assert plan["runfile_action"] == "refuse"
    message = plan["runfile_message"]
    assert message.startswith("An NVIDIA driver 535.104.05 installed with NVIDIA's .run installer is on this "
                              "node")
    assert "never over a runfile driver" in message and "nvidia_driver_install_method: repo" in message
    assert "NVIDIA-Linux-x86_64-550.54.14.run --dkms" in message
    assert "nvidia_driver_runfile_policy: uninstall" in message
    # nvidia-smi works: no kernel-update note
    assert "kernel update" not in message


def test_a_kernel_update_under_a_non_dkms_runfile_driver_is_explained(tmp_path):
    found = runfile(tmp_path, version=WANTED, kernels=(EL7_OLD_KERNEL,))
    message = runfile_plan(found, "repo", "refuse", WANTED, BROKEN, EL7_KERNEL)["runfile_message"]
    assert ("nvidia-smi fails (NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA "
            "driver) and the runfile driver was installed without --dkms (its module is built for kernel "
            "3.10.0-1160.el7.x86_64 only, the running kernel is 3.10.0-1160.119.1.el7.x86_64): after a "
            "kernel update the new kernel has no nvidia module. Re-run NVIDIA-Linux-x86_64-550.54.14.run "
            "with --dkms") in message
    # a DKMS runfile driver rebuilds its module itself: no such note
    dkms = runfile(tmp_path / "dkms", version=WANTED, kernels=(), dkms=True)
    quiet = runfile_plan(dkms, "repo", "refuse", WANTED, BROKEN, EL7_KERNEL)
    assert "kernel update" not in quiet["runfile_message"]


def test_the_uninstall_policy_uninstalls_only_what_it_can(tmp_path):
    found = runfile(tmp_path, version="535.104.05")
    plan = runfile_plan(found, "distro", "uninstall", WANTED, {}, EL7_KERNEL)
    assert plan["runfile_action"] == "uninstall"
    assert "the role runs /usr/bin/nvidia-uninstall --silent, then installs the driver 550.54.14" in \
        plan["runfile_message"]
    # no uninstaller left: refused, with the runfile's own --uninstall
    orphan = runfile(tmp_path / "orphan", version="535.104.05", uninstaller=False)
    refused = runfile_plan(orphan, "repo", "uninstall", WANTED, {}, EL7_KERNEL)
    assert refused["runfile_action"] == "refuse"
    assert "sh NVIDIA-Linux-x86_64-535.104.05.run --uninstall" in refused["runfile_message"]


def test_nothing_stands_in_the_way_without_a_runfile_or_with_the_runfile_method(tmp_path):
    found = runfile(tmp_path, version="535.104.05")
    assert runfile_plan(found, "runfile", "refuse", WANTED, {})["runfile_action"] == "none"
    assert runfile_plan({"installed": False}, "repo", "refuse", WANTED, {}) == dict(
        runfile_action="none", runfile_message="")
    assert runfile_plan({}, "repo", "uninstall", WANTED, {})["runfile_action"] == "none"
    with pytest.raises(ValueError, match="must be refuse or uninstall"):
        runfile_plan(found, "repo", "remove", WANTED, {})
