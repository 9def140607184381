# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""tests/fixtures/fake_vllm/docker-gpus: the stand-in for the NVIDIA container runtime (molecule/vllm)."""
import importlib.machinery
import importlib.util
import json
import os
import subprocess
import sys

from tests.helpers import FIXTURES

SHIM = os.path.join(FIXTURES, "fake_vllm", "docker-gpus")


def load_shim():
    loader = importlib.machinery.SourceFileLoader("docker_gpus", SHIM)
    spec = importlib.util.spec_from_loader("docker_gpus", loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def test_gpus_become_nvidia_visible_devices():
    args = ["run", "--rm", "--gpus", '"device=2,3"', "--env-file", "/e", "img", "--port", "1"]
    assert load_shim().translate(args) == [
        "run", "--rm", "-e", "NVIDIA_VISIBLE_DEVICES=2,3", "--env-file", "/e", "img", "--port", "1"]


def test_runs_are_logged_and_passed_on(tmp_path):
    real = tmp_path / "docker"
    real.write_text("#!/bin/sh\nprintf '%s\\n' \"$@\"\n")
    real.chmod(0o755)
    log = tmp_path / "runs.jsonl"
    env = dict(os.environ, DOCKER_GPUS_REAL=str(real), DOCKER_GPUS_LOG=str(log))
    out = subprocess.check_output([sys.executable, SHIM, "run", "--gpus", '"device=0"', "img"], env=env)
    assert out.decode().split() == ["run", "-e", "NVIDIA_VISIBLE_DEVICES=0", "img"]
    assert json.loads(log.read_text()) == ["run", "--gpus", '"device=0"', "img"]
    out = subprocess.check_output([sys.executable, SHIM, "rm", "-f", "c"], env=env)
    assert out.decode().split() == ["rm", "-f", "c"]
    assert len(log.read_text().splitlines()) == 1
