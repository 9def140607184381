# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Fixtures shared by the unit tests: model_download (test_download_*.py) and gpu_facts (test_gpu_*.py)."""
import stat

import pytest

from tests.fixtures.fake_hub.helpers import MODEL_SIZE, make_dest, start_hub


@pytest.fixture
def hub(tmp_path):
    """A fake hub on 127.0.0.1 with a random port, stopped after the test."""
    yield from start_hub(tmp_path)


@pytest.fixture
def dest(tmp_path):
    """An empty download directory."""
    return make_dest(tmp_path)


@pytest.fixture
def model(hub):
    """The hub's 2 MiB model file (test_download_faults.py uses a larger one of its own)."""
    return hub.add_file("org/m/model.gguf", MODEL_SIZE, seed=3)


@pytest.fixture
def smi(tmp_path):
    """An executable file called nvidia-smi (never executed: the runner is scripted)."""
    path = tmp_path / "nvidia-smi"
    path.write_text("#!/bin/sh\nexit 99\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)
