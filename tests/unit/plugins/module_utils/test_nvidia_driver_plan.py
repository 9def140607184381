# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The driver plan of role nvidia_driver (plugins/module_utils/_gpu/driver.py), without Ansible."""

import pytest
from ansible_collections.llmops.serving.plugins.module_utils._gpu.driver import (
    driver_plan,
    read_loaded_module,
    read_nouveau_loaded,
    reboot_reasons,
    wanted_driver_loaded,
)

WANTED = "550.54.14"


@pytest.mark.parametrize(
    "gpus,expected",
    [
        ({"present": True, "driver_version": "550.54.14", "count": 4}, True),
        ({"present": True, "driver_version": "535.104.05", "count": 4}, False),
        ({"present": True, "driver_version": "550.54.15", "count": 4}, False),
        ({"present": False, "driver_version": None, "error": "nvidia-smi not found"}, False),
        (None, False),
    ],
)
def test_wanted_driver_loaded_decides_whether_anything_runs(gpus, expected):
    assert wanted_driver_loaded(WANTED, gpus) is expected
    plan = driver_plan(WANTED, "detect", gpus=gpus)
    assert plan["action"] == ("none" if expected else "install")
    assert plan["wanted_loaded"] is expected
    assert (plan["reasons"] == []) is expected


@pytest.mark.parametrize(
    "gpus,module,nouveau,expected",
    [
        ({"present": True, "driver_version": "550.54.14"}, "550.54.14", False, []),
        (
            {"present": False, "driver_version": None, "error": "Driver/library version mismatch"},
            "535.104.05",
            False,
            [
                "nvidia-smi reports no usable driver (Driver/library version mismatch)",
                "the loaded nvidia kernel module is 535.104.05, not 550.54.14",
            ],
        ),
        (
            {"present": False, "driver_version": None, "error": "No devices were found"},
            "",
            True,
            ["nvidia-smi reports no usable driver (No devices were found)", "the nouveau module is loaded"],
        ),
        (
            {"present": True, "driver_version": "535.104.05"},
            "535.104.05",
            False,
            ["nvidia-smi reports driver 535.104.05", "the loaded nvidia kernel module is 535.104.05"],
        ),
    ],
)
def test_reboot_reasons(gpus, module, nouveau, expected):
    reasons = reboot_reasons(WANTED, gpus, module, nouveau)
    assert len(reasons) == len(expected)
    for reason, start in zip(reasons, expected, strict=True):
        assert reason.startswith(start), reason
    final = driver_plan(WANTED, "final", gpus=gpus, loaded_module=module + "\n", nouveau_loaded=nouveau)
    assert final["reasons"] == reasons
    assert final["action"] == ("reboot" if reasons else "none")
    before = driver_plan(WANTED, "before_installer", gpus=gpus, loaded_module=module, nouveau_loaded=nouveau)
    assert len(before["reasons"]) == (1 if nouveau else 0)
    assert before["action"] == ("reboot" if nouveau else "install")


def test_reason_sentences_are_the_ones_the_role_prints():
    reasons = reboot_reasons(WANTED, {"present": False, "error": ""}, "535.104.05", True)
    assert reasons == [
        "nvidia-smi reports no usable driver (no output)",
        "the nouveau module is loaded (now blacklisted and the initramfs rebuilt, so it will not load after "
        "a reboot)",
        "the loaded nvidia kernel module is 535.104.05, not 550.54.14 (a loaded module cannot be replaced "
        "while in use)",
    ]
    assert driver_plan(WANTED, "before_installer", nouveau_loaded=True)["reasons"] == [
        "the nouveau module is loaded and the NVIDIA installer refuses to run next to it"
    ]


def test_runfile_installed_earlier_needs_neither_reboot_nor_installer():
    plan = driver_plan(WANTED, "before_installer", nouveau_loaded=True, installed_module="550.54.14\n")
    assert plan["action"] == "none" and plan["reasons"] == []
    other = driver_plan(WANTED, "before_installer", nouveau_loaded=False, installed_module="535.104.05")
    assert other["action"] == "install"


@pytest.mark.parametrize(
    "module,nouveau,load",
    [("", False, True), ("", True, False), ("535.104.05", False, False), ("550.54.14", False, False)],
)
def test_a_first_install_without_nouveau_only_loads_the_module(module, nouveau, load):
    plan = driver_plan(WANTED, "final", gpus={}, loaded_module=module, nouveau_loaded=nouveau)
    assert plan["load_module"] is load
    assert driver_plan(WANTED, "detect", loaded_module=module, nouveau_loaded=nouveau)["load_module"] is False


def test_unknown_stage_is_refused():
    with pytest.raises(ValueError, match="before_installer"):
        driver_plan(WANTED, "before-runfile")


def test_reads_the_loaded_module_and_nouveau_from_sysfs(tmp_path):
    assert read_loaded_module(str(tmp_path)) == ""
    assert read_nouveau_loaded(str(tmp_path)) is False
    (tmp_path / "nvidia").mkdir()
    (tmp_path / "nvidia" / "version").write_text("535.104.05\n")
    (tmp_path / "nouveau").mkdir()
    assert read_loaded_module(str(tmp_path)) == "535.104.05"
    assert read_nouveau_loaded(str(tmp_path)) is True


def test_a_wanted_version_with_a_trailing_newline_is_the_loaded_driver():
    """issue 23: '570.133.20\\n' from a file lookup asked to install the driver already loaded."""
    gpus = {"present": True, "count": 1, "driver_version": WANTED, "gpus": [{"index": 0}]}
    plan = driver_plan(WANTED + "\n", "detect", gpus=gpus, loaded_module=WANTED + "\n")
    assert plan["action"] == "none" and plan["wanted_version"] == WANTED
    with pytest.raises(ValueError, match="nvidia_driver_version must be a driver version"):
        driver_plan("570.133.20; rm -rf /", "detect")


# --- what preflight says the GPU host stage will do (playbooks/preflight.yml, driver_plan's detect) -------

@pytest.mark.parametrize("gpus, policy, managed, expected", [
    ({"present": True, "driver_version": "550.54.14"}, "auto", True,
     "Driver: the pinned 550.54.14 is loaded, nothing to change."),
    ({"present": True, "driver_version": "535.104.05"}, "auto", True,
     "Driver: the GPU host stage installs NVIDIA 550.54.14 (replacing 535.104.05); if the new driver needs a "
     "reboot (nouveau holds the GPUs, or an old module is loaded) the play reboots the node only when no "
     "process uses the GPUs and no serving unit runs (nvidia_driver_allow_reboot: auto), else it stops there "
     "and says how to resume."),
    ({"present": False, "error": "nvidia-smi not found"}, True, True,
     "Driver: the GPU host stage installs NVIDIA 550.54.14; the play reboots the node when the new driver "
     "needs it."),
    ({"present": False}, "no", "true",
     "Driver: the GPU host stage installs NVIDIA 550.54.14; if the new driver needs a reboot the run stops "
     "there and says how to resume (nvidia_driver_allow_reboot: true or auto lets the play reboot)."),
    ({"present": True, "driver_version": "535.104.05"}, "auto", "false",
     "Driver: not managed here (llmops_manage_driver is false); the GPU gates after the GPU host stage "
     "decide."),
])
def test_preflight_says_what_the_driver_plan_decides(gpus, policy, managed, expected):
    from ansible_collections.llmops.serving.plugins.module_utils._gpu.driver import preflight_summary
    assert preflight_summary(WANTED, gpus, policy, managed) == expected
    # the same decision as the stage's own detect plan
    if "not managed" not in expected:
        nothing = driver_plan(WANTED, "detect", gpus=gpus)["action"] == "none"
        assert ("nothing to change" in expected) is nothing


def test_preflight_without_a_pinned_version_names_the_role_default_and_refuses_a_bad_policy():
    from ansible_collections.llmops.serving.plugins.module_utils._gpu.driver import preflight_summary
    assert preflight_summary("", {"present": True, "driver_version": "550.54.14"}).startswith(
        "Driver: the GPU host stage installs NVIDIA driver (role default) (replacing 550.54.14)")
    with pytest.raises(ValueError, match="nvidia_driver_allow_reboot must be auto, true or false"):
        preflight_summary(WANTED, {"present": False}, "sometimes")
    with pytest.raises(ValueError, match="nvidia_driver_version must be a driver version"):
        preflight_summary("550", {"present": True, "driver_version": "550"})


def test_the_detect_plan_needs_no_node_only_when_the_wanted_driver_is_reported():
    from ansible_collections.llmops.serving.plugins.module_utils._gpu.driver import detect_plan_without_node
    loaded = {"present": True, "driver_version": WANTED}
    assert detect_plan_without_node(WANTED, loaded) == driver_plan(WANTED, "detect", gpus=loaded)
    assert detect_plan_without_node(WANTED, loaded)["action"] == "none"
    for gpus in ({"present": True, "driver_version": "535.104.05"}, {"present": False}, None):
        assert detect_plan_without_node(WANTED, gpus) is None
    with pytest.raises(ValueError):
        detect_plan_without_node("latest", loaded)
