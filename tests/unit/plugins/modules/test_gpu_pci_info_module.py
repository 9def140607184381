# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""llmops.serving.gpu_pci_info run as Ansible runs it, on fake sysfs trees."""

import os
import subprocess
import sys

from tests.helpers import FIXTURES, run_module_file

MAKE_TREE = os.path.join(FIXTURES, "fake_sysfs_pci", "make_tree.py")


def tree(tmp_path, *args):
    root = tmp_path / "sys"
    subprocess.run([sys.executable, MAKE_TREE, str(root)] + list(args), check=True, stdout=subprocess.PIPE)
    return str(root)


def test_publishes_the_pci_gpus(tmp_path):
    result = run_module_file(tmp_path, "gpu_pci_info", {"sysfs_root": tree(tmp_path),
                                                        "expected": {"count": 4, "names": ["L20"]}})
    assert result.get("failed") is not True, result
    facts = result["ansible_facts"]["llmops_pci_gpus"]
    assert facts["count"] == 4 and facts["names"] == {"L20": 4}
    assert result["report"] == "PCI: 4x L20 (nouveau on 4)." and result["changed"] is False


def test_refuses_a_box_without_the_expected_gpus(tmp_path):
    result = run_module_file(tmp_path, "gpu_pci_info", {"sysfs_root": tree(tmp_path, "--gpus", "2"),
                                                        "expected": {"count": 4, "names": ["L20"]}},
                             check_mode=True)
    assert result["failed"] is True
    assert ("This is not the box the inventory describes: the inventory expects 4 NVIDIA GPU(s) L20"
            in result["msg"])
    assert "shows 2" in result["msg"] and "before the driver is installed" in result["msg"]


def test_bad_expectation_fails_with_what_to_write(tmp_path):
    result = run_module_file(tmp_path, "gpu_pci_info",
                             {"sysfs_root": tree(tmp_path), "expected": {"cards": 4}})
    assert result["failed"] is True and "use count, names and device_ids" in result["msg"]


def test_an_unreadable_bus_fails_only_with_an_expectation(tmp_path):
    absent = str(tmp_path / "no-sysfs")
    plain = run_module_file(tmp_path, "gpu_pci_info", {"sysfs_root": absent})
    assert plain.get("failed") is not True and plain["ansible_facts"]["llmops_pci_gpus"]["count"] == 0
    assert plain["report"].startswith("PCI bus not readable: cannot list ")
    strict = run_module_file(tmp_path, "gpu_pci_info", {"sysfs_root": absent, "expected": {"count": 4}})
    assert strict["failed"] is True
    assert strict["msg"].startswith("Cannot check llmops_gpu_expected: cannot list")


def test_bad_counts_names_and_sysfs_fail_with_a_message_not_a_traceback(tmp_path):
    root = tree(tmp_path)
    for expected in ({"count": float("inf")}, {"names": 5}):
        out = run_module_file(tmp_path, "gpu_pci_info", {"sysfs_root": root, "expected": expected})
        assert out["failed"] is True and out["msg"].startswith("llmops_gpu_expected."), out
    with open(os.path.join(root, "bus", "pci", "devices", "0000:18:00.0", "class"), "wb") as f:
        f.write(b"\xff\xfe")
    out = run_module_file(tmp_path, "gpu_pci_info", {"sysfs_root": root, "expected": {"count": 4}},
                          timeout=20)
    assert out["failed"] is True and out["msg"].startswith("Cannot check llmops_gpu_expected: ") \
        and "is not UTF-8 text" in out["msg"], out
    plain = run_module_file(tmp_path, "gpu_pci_info", {"sysfs_root": root}, timeout=20)
    assert plain.get("failed") is not True and "is not UTF-8 text" in plain["report"], plain


def test_eight_gpus_against_a_count_of_four_fail(tmp_path):
    result = run_module_file(tmp_path, "gpu_pci_info", {"sysfs_root": tree(tmp_path, "--gpus", "8"),
                                                        "expected": {"count": 4, "names": ["L20"]}})
    assert result["failed"] is True and "expects 4 NVIDIA GPU(s) L20" in result["msg"]
    assert "shows 8" in result["msg"]
