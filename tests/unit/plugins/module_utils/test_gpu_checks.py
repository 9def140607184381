# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""gpu_facts checks (evaluate), version helpers and the compute-capability / CUDA tables."""

import pytest
from ansible_collections.llmops.serving.plugins.module_utils._gpu import checks, cuda_compat
from ansible_collections.llmops.serving.plugins.module_utils._gpu import smi as gpu

from tests.helpers import GPU_FACT_KEYS


def make_gpu(
    index=0, name="NVIDIA L20", cap="8.9", total=46068, used=1, free=45596, driver="550.54.14", uuid=None
):
    return {
        "index": index,
        "uuid": uuid or "GPU-0000000%d-aaaa-bbbb-cccc-dddddddddddd" % index,
        "name": name,
        "pci_bus_id": "00000000:%02X:00.0" % (0x18 + index),
        "compute_cap": cap,
        "cuda_arch": cap.replace(".", "") if cap else None,
        "memory_total_mib": total,
        "memory_used_mib": used,
        "memory_free_mib": free,
        "driver_version": driver,
        "persistence_mode": True,
        "mig_mode": None,
        "power_limit_w": 350.0,
        "temperature_c": 30,
    }


def l20x4(driver="550.54.14", cuda="12.4"):
    return gpu.build_facts([make_gpu(i, driver=driver) for i in range(4)], driver, cuda)


# --------------------------------------------------------------------------- helpers and tables


def test_version_compare_is_numeric():
    assert cuda_compat.compare_versions("550.54.14", "550.54.14") == 0
    assert cuda_compat.compare_versions("550.127.05", "550.54.14") == 1
    assert cuda_compat.compare_versions("570.26", "570.124.06") == -1
    assert cuda_compat.compare_versions("12.10", "12.9") == 1
    assert cuda_compat.compare_versions("12.4", "12.4.0") == 0
    with pytest.raises(ValueError):
        cuda_compat.version_tuple("550.54.14-1")


def test_cuda_table_is_the_documented_minimum_linux_driver_of_each_release():
    assert dict(cuda_compat.CUDA_MIN_DRIVER) == {
        "11.8": "520.61.05",
        "12.0": "525.60.13",
        "12.1": "530.30.02",
        "12.2": "535.54.03",
        "12.3": "545.23.06",
        "12.4": "550.54.14",
        "12.5": "555.42.02",
        "12.6": "560.28.03",
        "12.8": "570.26",
        "12.9": "575.51.03",
        "13.0": "580.65.06",
    }
    # Ordered, and each release needs a newer driver than the one before.
    drivers = [d for _c, d in cuda_compat.CUDA_MIN_DRIVER]
    assert all(cuda_compat.compare_versions(a, b) < 0 for a, b in zip(drivers, drivers[1:]))  # noqa: B905


@pytest.mark.parametrize(
    "driver,cuda",
    [
        ("550.54.14", "12.4"),
        ("550.54.13", "12.3"),
        ("535.161.08", "12.2"),
        ("570.172.08", "12.8"),
        ("580.65.06", "13.0"),
        ("520.61.05", "11.8"),
        ("515.105.01", None),
    ],
)
def test_max_cuda_for_driver(driver, cuda):
    assert cuda_compat.max_cuda_for_driver(driver) == cuda


@pytest.mark.parametrize(
    "name,cap",
    [
        ("NVIDIA L20", "8.9"),
        ("NVIDIA L40S", "8.9"),
        ("NVIDIA L40", "8.9"),
        ("NVIDIA A100-SXM4-80GB", "8.0"),
        ("NVIDIA A100 80GB PCIe", "8.0"),
        ("NVIDIA A10", "8.6"),
        ("NVIDIA A30", "8.0"),
        ("NVIDIA H100 80GB HBM3", "9.0"),
        ("NVIDIA H100 PCIe", "9.0"),
        ("NVIDIA H200", "9.0"),
        ("NVIDIA H20", "9.0"),
        ("NVIDIA GeForce RTX 4090", "8.9"),
        ("NVIDIA GeForce RTX 3090", "8.6"),
        ("GeForce RTX 2080 Ti", "7.5"),
        ("NVIDIA GeForce RTX 2080 Ti", "7.5"),
        ("Tesla T4", "7.5"),
        ("Tesla V100-SXM2-32GB", "7.0"),
        ("Tesla V100-PCIE-16GB", "7.0"),
        ("NVIDIA RTX A6000", "8.6"),
        ("NVIDIA RTX 6000 Ada Generation", "8.9"),
        ("Some Future GPU", None),
    ],
)
def test_compute_cap_by_name(name, cap):
    assert gpu.compute_cap_fallback(name) == cap


@pytest.mark.parametrize(
    "device_id,cap",
    [
        ("0x26BA10DE", "8.9"),
        ("0x26B910DE", "8.9"),
        ("0x26B510DE", "8.9"),
        ("0x20B510DE", "8.0"),
        ("0x223610DE", "8.6"),
        ("0x20B710DE", "8.0"),
        ("0x233010DE", "9.0"),
        ("0x233510DE", "9.0"),
        ("0x232910DE", "9.0"),
        ("0x268410DE", "8.9"),
        ("0x220410DE", "8.6"),
        ("0x1E0410DE", "7.5"),
        ("0x1EB810DE", "7.5"),
        ("0x1DB510DE", "7.0"),
        ("0x223010DE", "8.6"),
        ("0x26B110DE", "8.9"),
    ],
)
def test_compute_cap_by_pci_device_id_wins_over_the_name(device_id, cap):
    assert gpu.compute_cap_fallback("Unbranded board", device_id) == cap


def test_arch_specs():
    assert checks.parse_arch_requirement("8.9") == ("==", (8, 9))
    assert checks.parse_arch_requirement(">=8.0") == (">=", (8, 0))
    assert checks.parse_arch_requirement(">= 9.0") == (">=", (9, 0))
    assert checks.parse_arch_requirement("sm_89") == ("==", (8, 9))
    assert checks.parse_arch_requirement("120") == ("==", (12, 0))
    with pytest.raises(ValueError, match="'8.9' \\(exact\\)"):
        checks.parse_arch_requirement("ada")


def test_facts_have_exactly_the_contract_keys():
    facts = l20x4()
    assert set(facts) == GPU_FACT_KEYS
    assert set(gpu.empty_facts("x")) == set(facts)


def test_archs_sort_numerically_and_homogeneous_needs_identical_gpus():
    facts = gpu.build_facts(
        [make_gpu(0, "NVIDIA B200", "10.0"), make_gpu(1, "Tesla T4", "7.5"), make_gpu(2, "NVIDIA L20", "8.9")]
    )
    assert facts["archs"] == ["75", "89", "100"]
    assert facts["compute_caps"] == ["7.5", "8.9", "10.0"]
    assert facts["homogeneous"] is False
    assert gpu.build_facts([])["homogeneous"] is False
    assert l20x4()["homogeneous"] is True


# --------------------------------------------------------------------------- evaluate


def test_no_checks_pass_and_select_every_gpu():
    selected, failures = checks.evaluate(l20x4())
    assert failures == []
    assert [g["index"] for g in selected] == [0, 1, 2, 3]


def test_require_arch_exact_pass_and_fail():
    assert checks.evaluate(l20x4(), require_arch=["8.9"])[1] == []
    _sel, failures = checks.evaluate(l20x4(), require_arch=["9.0"])
    assert len(failures) == 4
    msg = failures[0]
    assert "GPU 0 (NVIDIA L20, GPU-00000000-aaaa-bbbb-cccc-dddddddddddd)" in msg
    assert "compute capability 8.9 (sm_89) found, 9.0 wanted" in msg
    assert "change require_arch" in msg


def test_require_arch_minimum_and_any_of():
    assert checks.evaluate(l20x4(), require_arch=[">=8.0"])[1] == []
    facts = gpu.build_facts([make_gpu(0, "Tesla T4", "7.5")])
    failures = checks.evaluate(facts, require_arch=[">=8.0"])[1]
    assert failures and "7.5 (sm_75) found, >=8.0 wanted" in failures[0]
    assert checks.evaluate(facts, require_arch=["7.5", "8.9"])[1] == []
    assert checks.evaluate(l20x4(), require_arch=["sm_89"])[1] == []


def test_require_arch_with_unknown_compute_cap_says_to_upgrade_the_driver():
    facts = gpu.build_facts([make_gpu(0, "Mystery GPU", None, driver="470.182.03")])
    failures = checks.evaluate(facts, require_arch=["8.9"])[1]
    assert len(failures) == 1
    assert "compute capability unknown" in failures[0] and ">= 510" in failures[0]


def test_invalid_requirement_is_a_clear_error():
    assert "not a compute capability" in checks.evaluate(l20x4(), require_arch=["ada"])[1][0]
    assert "invalid version" in checks.evaluate(l20x4(), require_cuda="twelve")[1][0]
    assert "invalid version" in checks.evaluate(l20x4(), min_driver_version="550.x")[1][0]


def test_min_driver_version():
    assert checks.evaluate(l20x4(), min_driver_version="550.54.14")[1] == []
    assert checks.evaluate(l20x4(), min_driver_version="535")[1] == []
    failures = checks.evaluate(l20x4(), min_driver_version="570.86.15")[1]
    assert len(failures) == 4
    assert "driver 550.54.14 found, >= 570.86.15 wanted" in failures[0]
    assert "Install NVIDIA driver >= 570.86.15 (R570 or newer)" in failures[0]


def test_require_cuda_follows_cuda_compatibility_rules():
    assert checks.evaluate(l20x4(), require_cuda="12.4")[1] == []
    assert checks.evaluate(l20x4(), require_cuda="12.2")[1] == []
    # minor-version compatibility: any 12.x program runs on a driver >= 525.60.13, newer toolkit or not
    assert checks.evaluate(l20x4(), require_cuda="12.9")[1] == []
    assert checks.evaluate(l20x4(driver="535.161.08", cuda="12.2"), require_cuda="12.4")[1] == []
    facts = l20x4(driver="520.61.05", cuda="11.8")
    failures = checks.evaluate(facts, require_cuda="12.4")[1]
    assert len(failures) == 4
    assert "driver 520.61.05 found (supports CUDA 11.8), CUDA 12.4 wanted" in failures[0]
    assert "Install driver >= 525.60.13 (R525 or newer)" in failures[0]
    failures = checks.evaluate(l20x4(), require_cuda="13.0")[1]
    assert "580.65.06 (R580" in failures[0]
    assert "CUDA minor-version compatibility" in failures[0]


def test_require_cuda_of_an_unknown_major_uses_the_reported_version():
    facts = gpu.build_facts([make_gpu(0, driver="590.44.01")], "590.44.01", "13.1")
    assert checks.evaluate(facts, require_cuda="13.2")[1] == []          # 13.x: >= 580.65.06
    failures = checks.evaluate(facts, require_cuda="14.0")[1]
    assert "supports CUDA 13.1, CUDA 14.0 wanted" in failures[0]
    newer = gpu.build_facts([make_gpu(0, driver="700.1.2")], "700.1.2", "14.1")
    assert checks.evaluate(newer, require_cuda="14.0")[1] == []
    unknown = gpu.build_facts([make_gpu(0, driver="590.44.01")], "590.44.01", "")
    assert "cannot tell" in checks.evaluate(unknown, require_cuda="14.0")[1][0]


def test_memory_checks():
    facts = gpu.build_facts([make_gpu(0), make_gpu(1, used=30000, free=15596)], "550.54.14", "12.4")
    assert checks.evaluate(facts, min_memory_mib=46000, min_free_memory_mib=15000)[1] == []
    failures = checks.evaluate(facts, min_memory_mib=48000)[1]
    assert len(failures) == 2 and "46068 MiB memory found, >= 48000 MiB wanted" in failures[0]
    failures = checks.evaluate(facts, min_free_memory_mib=40960)[1]
    assert len(failures) == 1
    assert failures[0].startswith("GPU 1 (NVIDIA L20")
    assert "15596 MiB free memory found, >= 40960 MiB wanted (30000 MiB used)" in failures[0]
    assert "--query-compute-apps" in failures[0] and "-i 1" in failures[0]
    assert failures[0].endswith(
        ": 15596 MiB free memory found, >= 40960 MiB wanted (30000 MiB used). Stop the processes using this "
        "GPU (nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv -i 1) or choose "
        "another device.")
    assert checks.evaluate(facts, min_memory_mib=48000)[1][1].endswith(
        ": 46068 MiB memory found, >= 48000 MiB wanted. Use GPUs with more memory, spread the model over "
        "more GPUs, or pick a smaller model/quantisation.")


def test_memory_not_reported_fails_the_memory_check():
    facts = gpu.build_facts([make_gpu(0, total=None, free=None)])
    failures = checks.evaluate(facts, min_memory_mib=1, min_free_memory_mib=1)[1]
    assert len(failures) == 2 and all("unknown MiB" in f for f in failures)


def test_devices_restrict_checks_and_selection():
    facts = gpu.build_facts([make_gpu(0), make_gpu(1, used=30000, free=15596)], "550.54.14", "12.4")
    selected, failures = checks.evaluate(facts, devices=["0"], min_free_memory_mib=40960)
    assert failures == [] and [g["index"] for g in selected] == [0]
    uuid = facts["gpus"][1]["uuid"]
    selected, failures = checks.evaluate(facts, devices=[uuid.upper(), "1"], min_free_memory_mib=10000)
    assert failures == [] and [g["index"] for g in selected] == [1]


def test_unknown_device_is_an_error_that_lists_the_gpus():
    selected, failures = checks.evaluate(l20x4(), devices=["0", "7", "GPU-nope"])
    assert [g["index"] for g in selected] == [0]
    assert len(failures) == 2
    assert "device '7' not found" in failures[0]
    assert "0 (NVIDIA L20, GPU-0" in failures[0] and "3 (NVIDIA L20" in failures[0]
    assert "device 'GPU-nope' not found" in failures[1]


def test_no_gpu_fails_checks_but_not_a_plain_read():
    facts = gpu.empty_facts("nvidia-smi not found")
    assert checks.evaluate(facts) == ([], [])
    selected, failures = checks.evaluate(facts, require_arch=["8.9"])
    assert selected == [] and failures == ["no usable NVIDIA GPU to check: nvidia-smi not found"]


def test_a_lost_gpu_fails_requested_checks():
    facts = gpu.build_facts(
        [make_gpu(0)], "550.54.14", "12.4", error="GPU at PCI 0000:86:00.0 has fallen off"
    )
    assert checks.evaluate(facts)[1] == []
    failures = checks.evaluate(facts, require_arch=["8.9"])[1]
    assert failures == ["not every GPU is healthy: GPU at PCI 0000:86:00.0 has fallen off"]
