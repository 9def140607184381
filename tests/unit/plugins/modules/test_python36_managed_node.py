# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""CentOS 7.9's python3 is 3.6: run the shipped modules end to end under a real Python 3.6 interpreter,
with ansible-core 2.16's module_utils, the way Ansible runs them on such a node (vermin checks the syntax
statically; this checks what actually runs). Skipped only where no Python 3.6 is installed."""
import glob
import json
import os
import subprocess

import ansible
import pytest

from tests.fixtures import llama_cpp_source
from tests.fixtures.fake_hub.server import FakeHub
from tests.helpers import ROOT  # noqa: E402

COLLECTIONS = os.path.join(ROOT, "collections")
PY36 = os.path.expanduser("~/.pyenv/versions/3.6.15/bin/python3.6")
pytestmark = pytest.mark.skipif(not os.path.exists(PY36), reason="no Python 3.6 interpreter at %s" % PY36)


@pytest.fixture
def py36path(tmp_path):
    path = tmp_path / "py36path"
    path.mkdir()
    os.symlink(os.path.dirname(ansible.__file__), str(path / "ansible"))
    os.symlink(os.path.join(COLLECTIONS, "ansible_collections"), str(path / "ansible_collections"))
    return str(path)


def run36(tmp_path, py36path, module, args):
    args_file = tmp_path / ("%s-args.json" % module)
    args_file.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": args}))
    proc = subprocess.run(
        [PY36, os.path.join(ROOT, "plugins", "modules", module + ".py"), str(args_file)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=dict(os.environ, PYTHONPATH=py36path),
        timeout=120, check=False)
    assert proc.stdout, proc.stderr.decode()
    return json.loads(proc.stdout.decode().strip().splitlines()[-1])


def test_every_module_util_imports_under_python36(py36path):
    base = os.path.join(ROOT, "plugins", "module_utils")
    files = glob.glob(os.path.join(base, "**", "*.py"), recursive=True)
    names = sorted(os.path.relpath(p, base)[:-3].replace(os.sep, ".")
                   for p in files if not p.endswith("__init__.py"))
    assert "_gpu.smi" in names and "validators" in names  # the packages and the top level
    code = "; ".join("import ansible_collections.llmops.serving.plugins.module_utils.%s" % n for n in names)
    proc = subprocess.run([PY36, "-c", code], env=dict(os.environ, PYTHONPATH=py36path),
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr.decode()


def test_model_download_runs_under_python36(tmp_path, py36path):
    hub = FakeHub(str(tmp_path / "hub")).start()
    try:
        sha = hub.add_file("org/m/model.gguf", 3 * 1024 * 1024 + 5, seed=11)
        dest = tmp_path / "models"
        args = dict(repo="org/m", filename="model.gguf", endpoint=hub.url, dest=str(dest),
                    connections=4, parallel_min_size=1024 * 1024, free_space_margin=0)
        first = run36(tmp_path, py36path, "model_download", args)
        assert not first.get("failed"), first
        assert first["changed"] and first["sha256"] == sha and first["verified"] == "download"
        again = run36(tmp_path, py36path, "model_download", args)
        assert not again["changed"] and again["verified"] == "sidecar"
    finally:
        hub.stop()


def test_model_snapshot_and_safetensors_info_run_under_python36(tmp_path, py36path):
    from tests.fixtures.fake_hub import checkpoint

    digests = checkpoint.write_checkpoint(tmp_path / "hub" / "Qwen" / "Qwen3.6-27B-FP8")
    hub = FakeHub(str(tmp_path / "hub")).start()
    try:
        dest = tmp_path / "models" / "Qwen3.6-27B-FP8"
        args = dict(repo=checkpoint.REPO, endpoint=hub.url, dest=str(dest), connections=3,
                    free_space_margin=0)
        first = run36(tmp_path, py36path, "model_snapshot", args)
        assert not first.get("failed"), first
        assert first["changed"] and first["file_count"] == len(digests) and first["verified"] == "download"
        again = run36(tmp_path, py36path, "model_snapshot", args)
        assert not again["changed"] and again["verified"] == "manifest"
        remote = run36(tmp_path, py36path, "safetensors_info", dict(repo=checkpoint.REPO, endpoint=hub.url))
        local = run36(tmp_path, py36path, "safetensors_info", dict(path=str(dest)))
        assert not remote.get("failed") and not local.get("failed"), (remote, local)
        assert remote["vllm"]["weights_bytes"] == local["vllm"]["weights_bytes"] > 0
    finally:
        hub.stop()


def test_gguf_info_runs_under_python36(tmp_path, py36path):
    vocab = [p for p in llama_cpp_source.vocab_models() if p.endswith("ggml-vocab-qwen35.gguf")][0]
    result = run36(tmp_path, py36path, "gguf_info", {"path": vocab})
    assert not result.get("failed"), result
    # the vocab-only files carry the base architecture of their tokenizer family
    assert result["architecture"] == "qwen2" and result["tokenizer_model"] == "gpt2", result
