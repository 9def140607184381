# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The stand-in driver stack of the first-run scenario: fake nvidia-smi profile `driver` and the stand-in
driver packages of tests/fixtures/apt_repo/build-repo.sh (what molecule/default installs and reboots)."""

import os
import shutil
import subprocess

import pytest
from ansible_collections.llmops.serving.plugins.module_utils._gpu import smi as gpu

from tests.fixtures.fake_nvidia_smi import fake_env
from tests.helpers import FIXTURES

BUILD_REPO = os.path.join(FIXTURES, "apt_repo", "build-repo.sh")


def smi(tmp_path, installed, loaded, *args):
    cfg, sysfs = tmp_path / "cfg", tmp_path / "sysfs"
    cfg.mkdir(exist_ok=True)
    (cfg / "userspace-version").write_text(installed + "\n")
    shutil.rmtree(str(sysfs), ignore_errors=True)
    if loaded:
        (sysfs / "nvidia").mkdir(parents=True)
        (sysfs / "nvidia" / "version").write_text(loaded + "\n")
    env = fake_env(cfg, profile="driver")
    env["FAKE_NVIDIA_SMI_SYSFS"] = str(sysfs)
    return subprocess.run(["nvidia-smi"] + list(args), env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, universal_newlines=True, check=False)


def test_no_module_loaded_is_the_real_no_driver_answer(tmp_path):
    out = smi(tmp_path, "550.54.14", None)
    assert out.returncode == 9
    corpus = os.path.join(FIXTURES, "nvidia_smi_corpus")
    with open(os.path.join(corpus, "error_no_driver.txt")) as fh:
        assert out.stdout.strip() == fh.read().strip()


def test_old_module_with_new_user_space_is_a_version_mismatch(tmp_path):
    out = smi(tmp_path, "550.54.14", "535.104.05", "--query-gpu=driver_version", "--format=csv")
    assert out.returncode == 18
    assert out.stdout.splitlines() == ["Failed to initialize NVML: Driver/library version mismatch",
                                       "NVML library version: 550.54.14"]


@pytest.mark.parametrize("version,cuda", [("550.54.14", "12.4"), ("535.104.05", "12.2")])
def test_matching_module_reports_that_driver_and_its_cuda(tmp_path, version, cuda):
    out = smi(tmp_path, version, version)
    assert out.returncode == 0
    assert "Driver Version: %s" % version in out.stdout and "CUDA Version: %s" % cuda in out.stdout


def test_gpu_facts_reads_each_state_of_the_stack(tmp_path):
    """What the driver role decides from: no driver, mismatch (reboot), the pinned driver."""
    states = {}
    for name, loaded in (("none", None), ("old", "535.104.05"), ("new", "550.54.14")):
        cfg, sysfs = tmp_path / name / "cfg", tmp_path / name / "sysfs"
        cfg.mkdir(parents=True)
        (cfg / "userspace-version").write_text("550.54.14\n")
        if loaded:
            (sysfs / "nvidia").mkdir(parents=True)
            (sysfs / "nvidia" / "version").write_text(loaded + "\n")
        env = fake_env(cfg, profile="driver")
        env["FAKE_NVIDIA_SMI_SYSFS"] = str(sysfs)
        old = dict(os.environ)
        os.environ.clear()
        os.environ.update(env)
        try:
            states[name], _ = gpu.collect(timeout=20)
        finally:
            os.environ.clear()
            os.environ.update(old)
    assert not states["none"]["present"] and "not loaded" in states["none"]["error"]
    assert not states["old"]["present"] and "mismatch" in states["old"]["error"]
    assert states["new"]["present"] and states["new"]["driver_version"] == "550.54.14"
    assert states["new"]["count"] == 4


@pytest.mark.skipif(shutil.which("dpkg-deb") is None, reason="needs dpkg-deb (Debian/Ubuntu)")
def test_stand_in_driver_package_installs_the_stack_and_loads_on_modprobe(tmp_path):
    subprocess.run(["bash", BUILD_REPO, str(tmp_path / "repo"), "--driver-version", "535.104.05",
                    "--driver-version", "550.54.14"], check=True, stdout=subprocess.DEVNULL)
    cuda = tmp_path / "repo" / "cuda" / "debian12" / "x86_64"
    debs = sorted(p.name for p in cuda.glob("*.deb"))
    assert debs == ["cuda-drivers-535_535.104.05-1_all.deb", "cuda-drivers-550_550.54.14-1_all.deb",
                    "nvidia-driver_535.104.05-1_all.deb", "nvidia-driver_550.54.14-1_all.deb"]
    root = tmp_path / "root"
    subprocess.run(["dpkg-deb", "-x", str(cuda / "nvidia-driver_550.54.14-1_all.deb"), str(root)], check=True)
    assert (root / "etc/fake-nvidia-smi/userspace-version").read_text() == "550.54.14\n"
    assert os.access(str(root / "usr/bin/nvidia-smi"), os.X_OK)
    modprobe = (root / "etc/modprobe.d/llmops-fake-nvidia.conf").read_text()
    # `modprobe nvidia` publishes the on-disk version unless a module is loaded already (never replaced).
    install = next(line for line in modprobe.splitlines() if line.startswith("install nvidia "))
    assert "test -e /run/fake-sysfs-module/nvidia/version ||" in install
    postinst = subprocess.run(["dpkg-deb", "-I", str(cuda / "nvidia-driver_550.54.14-1_all.deb"), "postinst"],
                              stdout=subprocess.PIPE, universal_newlines=True, check=True).stdout
    assert "systemctl enable fake-nvidia-module-load.service" in postinst
    meta = cuda / "cuda-drivers-550_550.54.14-1_all.deb"
    control = subprocess.run(["dpkg-deb", "-f", str(meta), "Depends"],
                             stdout=subprocess.PIPE, universal_newlines=True, check=True).stdout
    assert control.strip() == "nvidia-driver (>= 550.54.14)"
