# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The unit session has a time limit per test (pyproject.toml, pytest-timeout): a hang fails by its name."""
import os
import subprocess
import sys
import time
import tomllib

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def test_the_project_sets_a_time_limit_per_test():
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as handle:
        options = tomllib.load(handle)["tool"]["pytest"]["ini_options"]
    assert 0 < int(options["timeout"]) <= 600


def _run(tmp_path, body):
    (tmp_path / "test_sample.py").write_text(body)
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "timeout=2",
                           str(tmp_path / "test_sample.py")], capture_output=True, text=True, timeout=120,
                          cwd=str(tmp_path))
    return done, time.monotonic() - start


def test_a_hanging_test_fails_by_name_within_the_limit(tmp_path):
    done, took = _run(tmp_path, "import time\n\ndef test_waits_forever():\n    time.sleep(3600)\n")
    assert done.returncode == 1, done.stdout
    assert "Timeout" in done.stdout and "test_waits_forever" in done.stdout
    assert took < 60


def test_a_quick_test_is_not_stopped(tmp_path):
    done, _ = _run(tmp_path, "def test_quick():\n    assert True\n")
    assert done.returncode == 0, done.stdout
