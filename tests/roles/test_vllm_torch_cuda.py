# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""roles/vllm/files/torch_cuda.py: the CUDA release of a virtualenv's torch, read without importing torch (the
fake torch's __init__ raises ImportError, so an import would show), from torch/version.py, else from torch's
METADATA (local version, Requires-Dist pins of the CUDA runtime)."""
import importlib.util
import json
import os
import subprocess
import sys
import zipfile

import pytest

from tests.fixtures.fake_vllm import build_wheel
from tests.helpers import ROOT

PROBE = os.path.join(ROOT, "roles", "vllm", "files", "torch_cuda.py")


def load_probe():
    spec = importlib.util.spec_from_file_location("torch_cuda_probe", PROBE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def site(tmp_path, cuda="13.0", version_py=True, version=None):
    """A site-packages directory with the fake torch built for `cuda`, unpacked as pip would."""
    wheel = build_wheel.build_torch(str(tmp_path), cuda)
    target = tmp_path / "site-packages"
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(str(target))
    if not version_py:
        (target / "torch" / "version.py").write_text("cuda = None\n")
    if version:
        metadata = target / "torch-2.14.0.dist-info" / "METADATA"
        metadata.write_text(metadata.read_text().replace("Version: 2.14.0", "Version: " + version))
    return target


def run(directory):
    result = subprocess.run([sys.executable, PROBE, str(directory)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, universal_newlines=True, timeout=30, check=True)
    return json.loads(result.stdout)


def test_cuda_from_torch_version_py_without_importing_torch(tmp_path):
    assert run(site(tmp_path, "13.0")) == {"torch": "2.14.0", "cuda": "13.0",
                                            "source": "torch/version.py cuda = '13.0'"}


@pytest.mark.parametrize("cuda,pin", [("13.0", "cuda-toolkit[cudart]==13.0.3"),
                                      ("12.9", "nvidia-cuda-runtime-cu12==12.9.79")])
def test_cuda_from_the_requires_dist_pins_when_version_py_says_nothing(tmp_path, cuda, pin):
    answer = run(site(tmp_path, cuda, version_py=False))
    assert answer["cuda"] == cuda
    assert answer["source"] == "torch Requires-Dist %s" % pin


def test_cuda_from_a_local_version(tmp_path):
    answer = run(site(tmp_path, None, version_py=False, version="2.14.0+cu126"))
    assert answer == {"torch": "2.14.0", "cuda": "12.6", "source": "torch local version 2.14.0+cu126"}


def test_a_cpu_torch_or_no_torch_says_nothing(tmp_path):
    assert run(site(tmp_path, None)) == {"torch": "2.14.0", "cuda": None, "source": None}
    empty = tmp_path / "empty"
    empty.mkdir()
    assert run(empty) == {"torch": None, "cuda": None, "source": None}


def test_metadata_parsing():
    probe = load_probe()
    assert probe.metadata_cuda("2.13.0+cu129", []) == ("12.9", "torch local version 2.13.0+cu129")
    pins = ['cuda-toolkit[cublas,cudart]==13.0.3; platform_system == "Linux"']
    assert probe.metadata_cuda("2.14.0", pins)[0] == "13.0"
    assert probe.metadata_cuda("2.14.0+cpu", ["filelock"]) == (None, None)
