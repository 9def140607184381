# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The PCI view of the GPUs (plugins/module_utils/_gpu/pci.py) on fake sysfs trees: which functions are NVIDIA
GPUs, the driver that holds them, and the inventory's expectation."""

import os
import subprocess
import sys

import pytest
from ansible_collections.llmops.serving.plugins.module_utils._gpu import pci as gpu_pci

from tests.helpers import FIXTURES

MAKE_TREE = os.path.join(FIXTURES, "fake_sysfs_pci", "make_tree.py")


def tree(tmp_path, *args):
    root = tmp_path / "sys"
    subprocess.run([sys.executable, MAKE_TREE, str(root)] + list(args), check=True, stdout=subprocess.PIPE)
    return str(root)


def test_the_l20_box_on_nouveau(tmp_path):
    gpus = gpu_pci.read_pci_gpus(tree(tmp_path))
    assert [g["address"] for g in gpus] == ["0000:18:00.0", "0000:3b:00.0", "0000:86:00.0", "0000:af:00.0"]
    assert {(g["vendor_id"], g["device_id"], g["class_id"], g["name"], g["driver"]) for g in gpus} == {
        ("10de", "26ba", "0302", "L20", "nouveau")}
    facts = gpu_pci.summary(gpus)
    assert facts["count"] == 4 and facts["names"] == {"L20": 4} and len(facts["nouveau"]) == 4
    assert gpu_pci.report(facts) == "PCI: 4x L20 (nouveau on 4)."


def test_the_bmc_vga_and_nvidia_bridge_functions_are_not_gpus(tmp_path):
    root = tree(tmp_path, "--gpus", "0")
    assert os.path.isdir(os.path.join(root, "bus", "pci", "devices", "0000:03:00.0"))
    assert gpu_pci.read_pci_gpus(root) == []
    assert gpu_pci.report(gpu_pci.summary([])) == "No NVIDIA GPU on the PCI bus."


def test_both_l20_device_ids_of_pci_ids_are_named():
    assert gpu_pci.product_name("26ba") == gpu_pci.product_name("26b7") == "L20"
    assert gpu_pci.product_name("2684") == "NVIDIA 10de:2684"


def test_a_driver_link_that_no_longer_resolves_is_no_driver(tmp_path):
    module_dir = tmp_path / "fake-sysfs-module"
    (module_dir / "nouveau").mkdir(parents=True)
    root = tree(tmp_path, "--drivers-dir", str(module_dir))
    assert {g["driver"] for g in gpu_pci.read_pci_gpus(root)} == {"nouveau"}
    (module_dir / "nouveau").rmdir()  # the stand-in nouveau is gone after the reboot
    facts = gpu_pci.summary(gpu_pci.read_pci_gpus(root))
    assert facts["unbound"] == [g["address"] for g in facts["gpus"]] and facts["nouveau"] == []
    assert gpu_pci.report(facts) == "PCI: 4x L20 (no driver on 4)."


def test_nvidia_bound_gpus(tmp_path):
    facts = gpu_pci.summary(gpu_pci.read_pci_gpus(tree(tmp_path, "--driver", "nvidia", "--gpus", "2")))
    assert facts["nvidia"] == ["0000:18:00.0", "0000:3b:00.0"] and facts["nouveau"] == []


def test_no_sysfs_is_an_error_that_says_so(tmp_path):
    with pytest.raises(gpu_pci.PciError, match="no PCI bus"):
        gpu_pci.read_pci_gpus(str(tmp_path / "nothing"))


L20X4 = {"count": 4, "names": ["L20"]}


@pytest.mark.parametrize("expected", [L20X4, {"count": 4, "names": ["NVIDIA L20"]},
                                      {"device_ids": ["10de:26ba"]}, {"count": 4}, {"names": ["l20"]}, {}])
def test_the_l20_box_meets_its_expectation(tmp_path, expected):
    gpus = gpu_pci.read_pci_gpus(tree(tmp_path))
    assert gpu_pci.check_expected(gpus, gpu_pci.normal_expected(expected)) == []


def test_a_missing_gpu_is_refused_naming_what_was_found(tmp_path):
    gpus = gpu_pci.read_pci_gpus(tree(tmp_path, "--gpus", "3"))
    (failure,) = gpu_pci.check_expected(gpus, gpu_pci.normal_expected(L20X4))
    assert failure.startswith("the inventory expects 4 NVIDIA GPU(s) L20 (llmops_gpu_expected), the PCI bus "
                              "shows 3: 0000:18:00.0 L20 [10de:26ba] (driver nouveau); ")


def test_another_product_is_refused(tmp_path):
    gpus = gpu_pci.read_pci_gpus(tree(tmp_path, "--device", "2684", "--class-id", "0x030000"))
    (failure,) = gpu_pci.check_expected(gpus, gpu_pci.normal_expected(L20X4))
    assert failure.startswith("4 GPU(s) are not L20 (llmops_gpu_expected): 0000:18:00.0 NVIDIA 10de:2684")


@pytest.mark.parametrize("expected,message", [
    ({"count": "four"}, "count must be a number"),
    ({"gpus": 4}, "unknown keys gpus"),
    ({"names": "L20"}, "are lists"),
    ({"device_ids": ["8086:2020"]}, "NVIDIA PCI device id"),
    (["L20"], "must be a mapping"),
])
def test_bad_expectations_say_what_to_write(expected, message):
    with pytest.raises(gpu_pci.PciError, match=message):
        gpu_pci.normal_expected(expected)


def test_more_gpus_than_expected_is_refused_too(tmp_path):
    # 8 L20s where the inventory says 4: the count check is "exactly", not "at least" (a `<` passed this)
    gpus = gpu_pci.read_pci_gpus(tree(tmp_path, "--gpus", "8"))
    (failure,) = gpu_pci.check_expected(gpus, gpu_pci.normal_expected(L20X4))
    assert failure.startswith("the inventory expects 4 NVIDIA GPU(s) L20 (llmops_gpu_expected), the PCI bus "
                              "shows 8: ")
    assert gpu_pci.check_expected(gpus, gpu_pci.normal_expected({"count": 8, "names": ["L20"]})) == []


@pytest.mark.parametrize("count", [float("inf"), float("nan"), 10 ** 400, 1e400, 4.5, True, -1, "4 GPUs",
                                   [4], 5000])
def test_a_count_that_is_not_a_number_of_gpus_is_refused(count):
    with pytest.raises(gpu_pci.PciError, match="count must be a number of GPUs .a whole number from 0 to"):
        gpu_pci.normal_expected({"count": count})


@pytest.mark.parametrize("count", [4, 4.0, "4", " 4 "])
def test_a_count_written_as_a_number_or_its_text_is_read(count):
    assert gpu_pci.normal_expected({"count": count})["count"] == 4


@pytest.mark.parametrize("expected", [{"names": 5}, {"device_ids": 5}, {"names": [{"L20": 1}]},
                                      {"device_ids": {"10de": "26ba"}}])
def test_names_and_ids_that_are_not_lists_are_refused(expected):
    with pytest.raises(gpu_pci.PciError, match="names and .device_ids are lists"):
        gpu_pci.normal_expected(expected)


def test_a_sysfs_attribute_that_is_not_text_or_not_a_file_is_named(tmp_path):
    from tests.unit.plugins.module_utils.test_local_read import within
    root = tree(tmp_path)
    vendor = os.path.join(root, "bus", "pci", "devices", "0000:3b:00.0", "vendor")
    with open(vendor, "wb") as f:
        f.write(b"0x10\xde\n")
    with pytest.raises(gpu_pci.PciError, match="attribute %s is not UTF-8 text" % vendor):
        gpu_pci.read_pci_gpus(root)
    for make, what in ((os.mkfifo, "a FIFO"), (lambda p: os.symlink("/dev/zero", p), "a symbolic link")):
        os.unlink(vendor)
        make(vendor)
        with within(10), pytest.raises(gpu_pci.PciError, match="%s is %s" % (vendor, what)):
            gpu_pci.read_pci_gpus(root)
    os.unlink(vendor)  # a function without the attribute is no NVIDIA GPU, as before
    assert len(gpu_pci.read_pci_gpus(root)) == 3
