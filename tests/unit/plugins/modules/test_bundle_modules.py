# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""bundle_manifest and bundle_verify as Ansible runs them: check mode writes nothing, a second run changes
nothing, a tampered bundle fails naming the entry (logic: tests/unit/plugins/module_utils/test_bundle.py)."""
import json
import os

from tests.helpers import run_module_file

ENTRIES = [{"name": "models/tiny", "version": "a" * 40}, {"name": "git/llama.cpp", "version": "b" * 40}]


def _bundle(tmp_path):
    root = tmp_path / "bundle"
    (root / "models" / "tiny").mkdir(parents=True)
    (root / "models" / "tiny" / "tiny.gguf").write_bytes(b"GGUF" + b"\1" * 4096)
    (root / "git" / "llama.cpp").mkdir(parents=True)
    from tests.unit.plugins.module_utils.test_bundle import git_archive_bytes
    (root / "git" / "llama.cpp" / "llama.cpp-x.tar.gz").write_bytes(git_archive_bytes("b" * 40))
    return root


def test_manifest_check_mode_writes_nothing_and_a_second_run_changes_nothing(tmp_path):
    root = _bundle(tmp_path)
    args = {"path": str(root), "entries": ENTRIES}
    r = run_module_file(tmp_path, "bundle_manifest", args, check_mode=True)
    assert r["changed"] and not (root / "manifest.json").exists()
    r = run_module_file(tmp_path, "bundle_manifest", args)
    assert r["changed"] and sorted(e["name"] for e in r["entries"]) == ["git/llama.cpp", "models/tiny"]
    assert json.loads((root / "manifest.json").read_text())["format"] == 1
    assert not run_module_file(tmp_path, "bundle_manifest", args)["changed"]


def test_verify_returns_the_sources_and_refuses_a_changed_byte(tmp_path):
    root = _bundle(tmp_path)
    run_module_file(tmp_path, "bundle_manifest", {"path": str(root), "entries": ENTRIES})
    models = [{"name": "tiny", "repo": "org/tiny", "filename": "tiny.gguf"}]
    r = run_module_file(tmp_path, "bundle_verify", {"path": str(root), "models": models, "git_ref": "b" * 40},
                        check_mode=True)
    assert not r.get("failed") and not r["changed"], r
    assert r["sources"]["model_models"][0]["url"] == "file://%s" % (root / "models" / "tiny" / "tiny.gguf")
    assert r["sources"]["entries"] == ["git/llama.cpp", "models/tiny"]
    path = root / "models" / "tiny" / "tiny.gguf"
    data = bytearray(path.read_bytes())
    data[100] ^= 1
    path.write_bytes(bytes(data))
    r = run_module_file(tmp_path, "bundle_verify", {"path": str(root), "models": models})
    assert r["failed"] and "models/tiny: models/tiny/tiny.gguf has sha256" in r["msg"], r
    assert "Traceback" not in json.dumps(r) and os.path.exists(str(path))


def test_the_source_probe_leaves_out_what_the_bundle_stages_and_probes_the_rest(tmp_path):
    from tests.fixtures.source_servers import closed_port
    dead = "http://127.0.0.1:%d" % closed_port()
    sources = [{"name": "nvidia-cuda", "kind": "apt", "url": dead + "/cuda", "key": "nvidia_cuda",
                "why": "driver"},
               {"name": "model qwen", "kind": "hf", "url": dead, "repo": "org/qwen", "key": "hf",
                "bundle": "qwen", "why": "model"}]
    bundle = {"entries": ["models/qwen", "packages/debian12"], "images": [],
              "packages": [{"name": "packages/debian12", "format": "deb"}]}
    r = run_module_file(tmp_path, "source_probe", {"sources": sources, "bundle": bundle, "timeout": 5})
    assert not r.get("failed"), r
    assert [s["state"] for s in r["sources"]] == ["in the bundle (packages/debian12)",
                                                  "in the bundle (models/qwen)"]
    # the same sources without the bundle: both probed, both refused
    r = run_module_file(tmp_path, "source_probe", {"sources": sources, "timeout": 5})
    assert r["failed"] and r["unreachable"] == ["nvidia-cuda", "model qwen"], r
    # a bundle without the model: only the model is probed
    r = run_module_file(tmp_path, "source_probe", {"sources": sources, "timeout": 5,
                                                   "bundle": dict(bundle, entries=["packages/debian12"])})
    assert r["failed"] and r["unreachable"] == ["model qwen"], r
