# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""gguf_info with a remote source (url, or repo + filename): the module run as Ansible runs it (its file with
an arguments file, in a child Python) against the fake hub; same facts as for the local file, option rules,
failures that say what to do and never show the token."""
import json
import os
import subprocess
import sys

import pytest
from ansible_collections.llmops.serving.plugins.module_utils._model_format import gguf

from tests.fixtures.fake_hub.server import FakeHub
from tests.fixtures.gguf.builder import tiny_qwen35
from tests.helpers import ROOT  # noqa: E402

MODULE = os.path.join(ROOT, "plugins", "modules", "gguf_info.py")
TOKEN = "hf_ModuleRemoteToken0123456789"


@pytest.fixture
def hub(tmp_path):
    root = tmp_path / "hub"
    (root / "org" / "gated").mkdir(parents=True)
    h = FakeHub(str(root), gated=("org/gated",), tokens=(TOKEN,)).start()
    h.model = str(root / "org" / "gated" / "model.gguf")
    with open(h.model, "wb") as f:
        f.write(tiny_qwen35().build().data)
    yield h
    h.stop()


def run_module(tmp_path, **args):
    """(rc, result) of gguf_info run in a child Python with args, like Ansible runs a module."""
    path = tmp_path / "args.json"
    path.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": args}))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.join(ROOT, "collections"), ROOT]))
    env.pop("HF_TOKEN", None)
    env.pop("HF_ENDPOINT", None)
    proc = subprocess.run([sys.executable, MODULE, str(path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          universal_newlines=True, env=env, timeout=60)
    return proc.returncode, json.loads(proc.stdout), proc.stdout + proc.stderr


def test_remote_hub_file_gives_the_local_facts_plus_remote(tmp_path, hub):
    rc, result, raw = run_module(tmp_path, repo="org/gated", filename="model.gguf", endpoint=hub.url,
                                 token=TOKEN)
    assert rc == 0, raw
    local = gguf.inspect(hub.model)
    for key, value in local.items():
        if key not in ("path", "identity"):  # the identity is a local file's (stat), never a remote one's
            assert result[key] == value, key
    assert "identity" not in result
    assert result["path"] == hub.url + "/org/gated/resolve/main/model.gguf"
    assert result["changed"] is False and result["verified"] is False
    remote = result["remote"]
    assert remote["url"] == result["path"] and remote["size"] == os.path.getsize(hub.model)
    assert remote["bytes_read"] == os.path.getsize(hub.model) and remote["requests"] == 2
    assert TOKEN not in raw
    assert result["invocation"]["module_args"]["token"] == "VALUE_SPECIFIED_IN_NO_LOG_PARAMETER"


def test_remote_url(tmp_path, hub):
    os.makedirs(os.path.join(hub.state.root, "org", "m"))
    os.link(hub.model, os.path.join(hub.state.root, "org", "m", "m.gguf"))
    rc, result, raw = run_module(tmp_path, url=hub.url + "/org/m/resolve/main/m.gguf?x=1", check_split=False)
    assert rc == 0, raw
    assert result["architecture"] == "qwen35" and result["remote"]["url"].endswith("/m.gguf")


SIGNATURE = "5e1f5e1f5e1f5e1f5e1f5e1f5e1f5e1f5e1f5e1f"


@pytest.mark.parametrize("how", ["url", "url_query"])
def test_a_signed_urls_query_never_shows(tmp_path, hub, how):
    os.makedirs(os.path.join(hub.state.root, "org", "m"))
    os.link(hub.model, os.path.join(hub.state.root, "org", "m", "m.gguf"))
    url = hub.url + "/cdn/org/m/m.gguf"
    query = "X-Amz-Signature=" + SIGNATURE
    args = dict(url=url + "?" + query) if how == "url" else dict(url=url, url_query=query)
    rc, result, raw = run_module(tmp_path, check_split=False, **args)
    assert rc == 0, raw
    assert result["architecture"] == "qwen35" and SIGNATURE not in raw
    assert bool(result.get("warnings")) == (how == "url")
    assert [e["path"] for e in hub.requests() if e["method"] == "GET"][0].endswith("?" + query)


def test_gated_repo_failures_name_the_token_variables(tmp_path, hub):
    rc, result, raw = run_module(tmp_path, repo="org/gated", filename="model.gguf", endpoint=hub.url)
    assert rc == 1 and result["failed"]
    assert "401" in result["msg"] and "No token was sent" in result["msg"]
    assert "model_hf_token" in result["msg"] and "token_var" in result["msg"]
    wrong = "hf_NotTheRightToken55555"
    rc, result, raw = run_module(tmp_path, repo="org/gated", filename="model.gguf", endpoint=hub.url,
                                 token=wrong)
    assert rc == 1 and "token was sent and refused" in result["msg"]
    assert wrong not in raw


def test_not_found_and_not_gguf(tmp_path, hub):
    rc, result, _ = run_module(tmp_path, repo="org/gated", filename="other.gguf", endpoint=hub.url,
                               token=TOKEN)
    assert rc == 1 and "check repo, filename and revision" in result["msg"]
    with open(hub.model, "wb") as f:
        f.write(b"version https://git-lfs.github.com/spec/v1\noid sha256:0\nsize 1\n")
    rc, result, _ = run_module(tmp_path, repo="org/gated", filename="model.gguf", endpoint=hub.url,
                               token=TOKEN)
    assert rc == 1 and "GGUF check failed" in result["msg"] and "not a GGUF file" in result["msg"]
    assert result["offset"] == 0


@pytest.mark.parametrize("args, message", [
    ({"path": "/x.gguf", "url": "http://127.0.0.1:1/x.gguf"}, "mutually exclusive"),
    ({"repo": "org/m"}, "filename"),
    ({}, "one of the following is required"),
    ({"url": "http://127.0.0.1:1/x.gguf", "compute_sha256": True}, "compute_sha256 check a local file"),
])
def test_option_rules(tmp_path, args, message):
    rc, result, _ = run_module(tmp_path, **args)
    assert rc == 1 and message in result["msg"], result["msg"]


def test_unreachable_host_fails_with_advice(tmp_path):
    rc, result, _ = run_module(tmp_path, url="http://127.0.0.1:9/x.gguf", timeout=1, retries=0)
    assert rc == 1 and "giving up" in result["msg"] and "raise timeout" in result["msg"]


def test_split_set_gives_whole_model_figures_locally_and_remotely(tmp_path, hub):
    """The module on the first part of the tiny model split in 3, by path and through the hub: the figures
    the memory planner reads (layer_bytes, non_layer_tensors, tensor_bytes...) are the unsplit model's."""
    pytest.importorskip("numpy")
    from tests.fixtures.gguf import make_tiny_model as mtm
    from tests.fixtures.gguf.split_model import cached_split_tiny_model
    paths = cached_split_tiny_model("qwen35", parts=3)
    os.makedirs(os.path.join(hub.state.root, "org", "m"))
    for path in paths:
        os.symlink(path, os.path.join(hub.state.root, "org", "m", os.path.basename(path)))
    whole = gguf.inspect(mtm.cached_tiny_model("qwen35"))
    for args in ({"path": paths[0]}, {"repo": "org/m", "filename": os.path.basename(paths[0]),
                                     "endpoint": hub.url}):
        rc, result, raw = run_module(tmp_path, **args)
        assert rc == 0, raw
        for key in gguf.TENSOR_FIELDS:
            assert result[key] == whole[key], (args, key)
        parts = result["split_set"]["parts"]
        assert len(parts) == 3 and sum(p["tensor_bytes"] for p in parts) == whole["tensor_bytes"]
        assert parts[0]["layer_bytes"] != whole["layer_bytes"]
