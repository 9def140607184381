# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""llmops.serving.gpu_facts end to end: the module file run as Ansible runs it, against the fake."""

import json
import os
import subprocess
import sys
import time

import pytest

from tests.fixtures.fake_nvidia_smi import FAKE_DIR, fake_env
from tests.helpers import (
    GPU_FACT_KEYS,
    ROOT,  # noqa: E402
)

MODULE = os.path.join(ROOT, "plugins", "modules", "gpu_facts.py")
COLLECTIONS = os.path.join(ROOT, "collections")
PY36 = os.path.expanduser("~/.pyenv/versions/3.6.15/bin/python3.6")

GPU_KEYS = {
    "index",
    "uuid",
    "name",
    "pci_bus_id",
    "compute_cap",
    "cuda_arch",
    "memory_total_mib",
    "memory_used_mib",
    "memory_free_mib",
    "driver_version",
    "persistence_mode",
    "mig_mode",
    "power_limit_w",
    "temperature_c",
    "state",
    "error",
}


def run_module(tmp_path, args, profile="l20x4", state=None, fake=True, python=None, pythonpath=None):
    args_file = tmp_path / "args.json"
    args_file.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": args}))
    env = fake_env(tmp_path / "etc", profile=profile, state=state)
    if not fake:
        env["PATH"] = os.pathsep.join(p for p in env["PATH"].split(os.pathsep) if p != FAKE_DIR)
    env["PYTHONPATH"] = pythonpath or COLLECTIONS
    start = time.time()
    proc = subprocess.run(
        [python or sys.executable, MODULE, str(args_file)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        timeout=60,
        universal_newlines=True,
    )
    result = json.loads(proc.stdout)
    result["_rc"] = proc.returncode
    result["_seconds"] = time.time() - start
    return result


def facts(result):
    return result["ansible_facts"]["llmops_gpus"]


def test_l20x4_passes_the_l20_requirements_and_returns_the_contract(tmp_path):
    r = run_module(
        tmp_path,
        {
            "require_arch": ["8.9"],
            "require_cuda": "12.4",
            "min_driver_version": "550.54.14",
            "min_memory_mib": 46000,
            "min_free_memory_mib": 40000,
        },
    )
    assert r["_rc"] == 0 and not r.get("failed") and r["changed"] is False
    f = facts(r)
    assert set(f) == GPU_FACT_KEYS
    assert all(set(g) == GPU_KEYS for g in f["gpus"])
    assert (f["present"], f["count"], f["driver_version"], f["cuda_version"]) == (
        True,
        4,
        "550.54.14",
        "12.4",
    )
    assert (f["archs"], f["compute_caps"], f["homogeneous"], f["error"]) == (["89"], ["8.9"], True, None)
    assert [g["index"] for g in r["selected"]] == [0, 1, 2, 3]
    assert r["failures"] == [] and r["error_kind"] is None


def test_check_mode_gives_the_same_facts(tmp_path):
    normal = run_module(tmp_path, {})
    checked = run_module(tmp_path, {"_ansible_check_mode": True})
    assert checked["_rc"] == 0 and facts(checked) == facts(normal)


def test_devices_select_by_index_and_uuid(tmp_path):
    r = run_module(tmp_path, {"devices": ["2", "GPU-5b3f0c1e-8a4d-7e21-c9b6-2f0d41a7e3c8"]})
    assert r["_rc"] == 0 and [g["index"] for g in r["selected"]] == [2, 0]
    r = run_module(tmp_path, {"devices": ["4"]})
    assert r["_rc"] == 1 and r["failed"] is True
    assert "device '4' not found" in r["msg"] and "3 (NVIDIA L20, GPU-7c2e5d18" in r["msg"]


def test_h200_fails_an_ada_requirement_with_a_clear_message(tmp_path):
    r = run_module(tmp_path, {"require_arch": ["8.9"], "require_cuda": "12.4"}, profile="h200")
    assert r["_rc"] == 1 and r["failed"] is True
    assert r["msg"].startswith("1 GPU check(s) failed:")
    assert (
        "GPU 0 (NVIDIA H200, GPU-3d9f1a27-6be0-4c85-92d7-e1f04a8b6c53): compute capability 9.0 (sm_90) "
        "found, "
        "8.9 wanted" in r["msg"]
    )
    assert r["llmops_gpus"]["gpus"][0]["memory_total_mib"] == 143771
    r = run_module(tmp_path, {"require_arch": [">=8.0"], "require_cuda": "12.8"}, profile="h200")
    assert r["_rc"] == 0 and facts(r)["cuda_version"] == "12.8"


def test_require_cuda_follows_minor_version_compatibility(tmp_path):
    # 535.161.08 is CUDA 12.2's driver, yet it runs CUDA 12.4 programs (12.x needs >= 525.60.13) ...
    r = run_module(
        tmp_path, {"require_cuda": "12.4"}, state={"driver_version": "535.161.08", "cuda_version": "12.2"}
    )
    assert r["_rc"] == 0, r.get("msg")
    # ... but not CUDA 13.0 ones (13.x needs >= 580.65.06).
    r = run_module(
        tmp_path, {"require_cuda": "13.0"}, state={"driver_version": "535.161.08", "cuda_version": "12.2"}
    )
    assert r["_rc"] == 1
    assert (
        "driver 535.161.08 found (supports CUDA 12.2), CUDA 13.0 wanted. Install driver >= 580.65.06 (R580"
        in r["msg"]
    )
    assert len(r["failures"]) == 4


@pytest.mark.parametrize(
    "profile,kind,needle",
    [
        ("mismatch", "mismatch", "Reboot the node"),
        ("nodevices", "no_devices", "lspci"),
    ],
)
def test_broken_driver_is_reported_or_fails_when_required(tmp_path, profile, kind, needle):
    r = run_module(tmp_path, {}, profile=profile)
    assert r["_rc"] == 0 and r["error_kind"] == kind
    f = facts(r)
    assert f["present"] is False and f["count"] == 0 and needle in f["error"]
    r = run_module(tmp_path, {"required": True}, profile=profile)
    assert r["_rc"] == 1 and r["error_kind"] == kind and needle in r["msg"]
    r = run_module(tmp_path, {"require_arch": ["8.9"]}, profile=profile)
    assert r["_rc"] == 1 and r["msg"].startswith("1 GPU check(s) failed:\n- no usable NVIDIA GPU to check")


def test_fallen_gpu(tmp_path):
    r = run_module(tmp_path, {}, profile="fallen")
    assert r["_rc"] == 0 and r["error_kind"] == "lost"
    f = facts(r)
    assert f["count"] == 3 and [g["index"] for g in f["gpus"]] == [0, 1, 3]
    assert "0000:86:00.0" in f["error"] and "Xid 79" in f["error"]
    assert run_module(tmp_path, {"required": True}, profile="fallen")["_rc"] == 1
    r = run_module(tmp_path, {"require_arch": ["8.9"]}, profile="fallen")
    assert r["_rc"] == 1 and "not every GPU is healthy" in r["msg"]


def test_hanging_nvidia_smi_times_out_and_is_killed(tmp_path):
    r = run_module(tmp_path, {"timeout": 1}, profile="hang")
    assert r["_rc"] == 0 and r["error_kind"] == "timeout"
    assert "did not answer within 1 s and was killed" in facts(r)["error"]
    assert r["_seconds"] < 10
    r = run_module(tmp_path, {"timeout": 1, "required": True}, profile="hang")
    assert r["_rc"] == 1 and r["error_kind"] == "timeout"
    # Nothing of the fake is left running.
    marker = str(tmp_path / "etc")
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open("/proc/%s/environ" % pid, "rb") as fh:
                    assert marker.encode() not in fh.read(), "a killed nvidia-smi (pid %s) survived" % pid
            except OSError:
                pass


def test_old_driver_falls_back_to_the_table(tmp_path):
    r = run_module(tmp_path, {"require_arch": ["7.0"]}, profile="old_driver")
    assert r["_rc"] == 0
    f = facts(r)
    assert f["compute_caps"] == ["7.0"] and f["archs"] == ["70"]
    assert (f["driver_version"], f["cuda_version"]) == ("470.182.03", "11.4")
    r = run_module(tmp_path, {"require_cuda": "12.4"}, profile="old_driver")
    assert r["_rc"] == 1 and "Install driver >= 525.60.13 (R525 or newer)" in r["msg"]


@pytest.mark.skipif(
    os.path.exists("/usr/bin/nvidia-smi") or os.path.exists("/usr/local/bin/nvidia-smi"),
    reason="a real nvidia-smi is installed",
)
def test_driver_absent(tmp_path):
    r = run_module(tmp_path, {}, fake=False)
    assert r["_rc"] == 0 and r["error_kind"] == "absent" and facts(r)["present"] is False
    r = run_module(tmp_path, {"required": True}, fake=False)
    assert r["_rc"] == 1 and "nvidia-smi not found" in r["msg"]


def test_bad_options_are_clear_errors(tmp_path):
    r = run_module(tmp_path, {"nvidia_smi_path": str(tmp_path / "nope")})
    assert r["_rc"] == 1 and "is not an executable file" in r["msg"]
    r = run_module(tmp_path, {"timeout": 0})
    assert r["_rc"] == 1 and "timeout must be at least 1" in r["msg"]
    r = run_module(tmp_path, {"require_arch": ["ampere"]})
    assert r["_rc"] == 1 and "'>=8.0' (minimum)" in r["msg"]
    r = run_module(tmp_path, {"bogus": 1})
    assert r["_rc"] == 1 and "bogus" in r["msg"]


def test_explicit_nvidia_smi_path(tmp_path):
    r = run_module(tmp_path, {"nvidia_smi_path": os.path.join(FAKE_DIR, "nvidia-smi")}, fake=False)
    assert r["_rc"] == 0 and facts(r)["count"] == 4


@pytest.mark.skipif(not os.path.exists(PY36), reason="python3.6 not installed")
def test_module_runs_under_python36(tmp_path):
    """The managed node (CentOS 7.9) runs Python 3.6: run the module there with ansible-core module_utils."""
    import ansible

    path = tmp_path / "py36path"
    path.mkdir()
    os.symlink(os.path.dirname(ansible.__file__), str(path / "ansible"))
    os.symlink(os.path.join(COLLECTIONS, "ansible_collections"), str(path / "ansible_collections"))
    r = run_module(
        tmp_path, {"require_arch": ["8.9"], "require_cuda": "12.4"}, python=PY36, pythonpath=str(path)
    )
    assert r["_rc"] == 0 and facts(r)["count"] == 4 and facts(r)["cuda_version"] == "12.4"
    r = run_module(tmp_path, {"timeout": 1}, profile="hang", python=PY36, pythonpath=str(path))
    assert r["_rc"] == 0 and r["error_kind"] == "timeout"


def test_defer_checks_checks_what_the_driver_shows_and_waits_without_one(tmp_path):
    """preflight's one call: refuse what no driver can change when the driver shows it, wait without one."""
    wanted = {"require_arch": ["8.9"], "min_memory_mib": 46000, "defer_checks": True}
    ok = run_module(tmp_path, wanted)
    assert ok["_rc"] == 0 and ok["checks_deferred"] is False and len(ok["selected"]) == 4
    wrong = run_module(tmp_path, wanted, profile="h200")
    assert wrong["_rc"] == 1 and wrong["checks_deferred"] is False and "sm_90" in wrong["msg"]
    # a driver/library mismatch (a reboot pending): no GPU to check yet, the facts say why
    pending = run_module(tmp_path, wanted, profile="mismatch")
    assert pending["_rc"] == 0 and pending["checks_deferred"] is True and pending["failures"] == []
    assert facts(pending)["present"] is False and pending["error_kind"] == "mismatch"
    # without defer_checks the same node fails the checks
    assert run_module(tmp_path, dict(wanted, defer_checks=False), profile="mismatch")["_rc"] == 1


def test_later_checks_say_whether_the_gpu_host_stage_would_pass_without_failing_preflight(tmp_path):
    """preflight evaluates the GPU host stage's checks too (later_checks): never fatal there, and the stage
    reads the GPUs again only when they would not pass (or the driver stage changed the driver)."""
    later = {"required": True, "require_cuda": "12.4"}
    wanted = {"require_arch": ["8.9"], "min_memory_mib": 46000, "defer_checks": True, "later_checks": later}
    ok = run_module(tmp_path, wanted, state={"driver_version": "550.54.14", "cuda_version": "12.4"})
    assert ok["_rc"] == 0 and ok["later_checks_pass"] is True
    # the same call as the GPU host stage makes it, on this node: passes too
    stage = run_module(tmp_path, {"require_arch": ["8.9"], "min_memory_mib": 46000, "required": True,
                                  "require_cuda": "12.4"},
                       state={"driver_version": "550.54.14", "cuda_version": "12.4"})
    assert stage["_rc"] == 0
    # an old driver: preflight passes (the driver stage may fix it), the later checks do not
    old = run_module(tmp_path, dict(wanted, later_checks=dict(later, require_cuda="13.0")),
                     state={"driver_version": "535.161.08", "cuda_version": "12.2"})
    assert old["_rc"] == 0 and old["later_checks_pass"] is False and old["failures"] == []
    # no usable GPU (a reboot pending): required would fail later
    pending = run_module(tmp_path, wanted, profile="mismatch")
    assert pending["_rc"] == 0 and pending["later_checks_pass"] is False
    bare = run_module(tmp_path, dict(wanted, later_checks={}), profile="mismatch")
    assert bare["later_checks_pass"] is False
    # without defer_checks nothing is said of later checks
    assert "later_checks_pass" not in run_module(tmp_path, {"require_arch": ["8.9"]})
