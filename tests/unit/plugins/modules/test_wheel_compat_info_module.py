# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""llmops.serving.wheel_compat_info end to end: the module file run as Ansible runs it, on this node, also
under a real Python 3.6 (CentOS 7's python3) when one is installed."""

import json
import os
import subprocess
import sys

import ansible
import pytest

from tests.fixtures.fake_vllm import build_wheel
from tests.helpers import ROOT

MODULE = os.path.join(ROOT, "plugins", "modules", "wheel_compat_info.py")
COLLECTIONS = os.path.join(ROOT, "collections")
PYENV = os.path.expanduser("~/.pyenv/versions")
PY36 = os.path.join(PYENV, "3.6.15", "bin", "python3.6")
PINNED = {"tags": ["cp38-abi3-manylinux_2_28_x86_64"], "requires_python": ">=3.11,<3.15"}
X86_64 = os.uname()[4] == "x86_64"


def run_module(tmp_path, args, interpreter=sys.executable, pythonpath=COLLECTIONS):
    args_file = tmp_path / "args.json"
    args_file.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": args}))
    proc = subprocess.run(
        [interpreter, MODULE, str(args_file)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=dict(os.environ, PYTHONPATH=pythonpath),
        timeout=60,
        universal_newlines=True,
    )
    result = json.loads(proc.stdout)
    result["_rc"] = proc.returncode
    return result


@pytest.mark.skipif(not X86_64, reason="the pinned tag is x86_64")
def test_this_node_fits_the_pinned_wheel_with_its_python(tmp_path):
    result = run_module(tmp_path, dict(PINNED, python=sys.executable))
    assert result["_rc"] == 0 and result["changed"] is False
    if sys.version_info[:2] >= (3, 11):
        assert result["compatible"] is True and result["reasons"] == []
    assert result["python"]["version"] == list(sys.version_info[:3])
    assert result["machine"] == "x86_64" and result["glibc"].startswith("2.")


@pytest.mark.skipif(not os.path.exists(os.path.join(PYENV, "3.9.18")), reason="no Python 3.9 in ~/.pyenv")
def test_python39_is_refused_by_requires_python(tmp_path):
    result = run_module(tmp_path, dict(PINNED, python=os.path.join(PYENV, "3.9.18", "bin", "python3.9")))
    assert result["compatible"] is False and "requires_python" in result["failed_checks"]
    assert "(Python 3.9.18): >=3.11" in result["reasons"][0]


def test_a_wheel_file_on_the_node_gives_tags_and_requires_python(tmp_path):
    wheel = build_wheel.build(str(tmp_path))
    result = run_module(tmp_path, {"python": "python3", "wheel": wheel, "requires_python": ">=3.99"})
    assert result["compatible"] is True, result
    assert result["tags"] == ["py3-none-any"] and result["requires_python"] == ">=3.6"


def test_wheel_and_tags_exclude_each_other_and_bad_names_fail(tmp_path):
    assert run_module(tmp_path, {"wheel": "a-1-py3-none-any.whl", "tags": ["py3-none-any"]})["failed"] is True
    bad = run_module(tmp_path, {"wheel": "vllm.tar.gz"})
    assert bad["failed"] is True and "not a wheel file name" in bad["msg"]


def test_a_missing_interpreter_is_a_reason_not_a_crash(tmp_path):
    result = run_module(tmp_path, dict(PINNED, python="python3.99"))
    assert result["_rc"] == 0 and result["compatible"] is False and result["failed_checks"] == ["python"]


@pytest.mark.skipif(not os.path.exists(PY36), reason="no Python 3.6 interpreter at %s" % PY36)
def test_runs_under_python36_and_refuses_it(tmp_path):
    path = tmp_path / "py36path"
    path.mkdir()
    os.symlink(os.path.dirname(ansible.__file__), str(path / "ansible"))
    os.symlink(os.path.join(COLLECTIONS, "ansible_collections"), str(path / "ansible_collections"))
    result = run_module(tmp_path, dict(PINNED, python=PY36), interpreter=PY36, pythonpath=str(path))
    assert result["_rc"] == 0, result
    assert result["compatible"] is False and result["python"]["version"][:2] == [3, 6]
    assert result["failed_checks"][:2] == ["requires_python", "python"]
