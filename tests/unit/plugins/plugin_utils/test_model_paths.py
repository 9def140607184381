# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Where role model keeps each model (plugin_utils/model_paths.py): the role's _model_dest/_model_final_path
and preflight's one read of the node use the same rule."""
import os

import pytest

from plugins.module_utils._model_format.gguf import SUMMARY_VERSION
from plugins.plugin_utils.model_paths import model_paths, unchanged_headers
from tests.helpers import ROOT, load_yaml, role_templar


@pytest.mark.parametrize("item, dest, final", [
    ({"name": "q", "repo": "o/r", "filename": "Q5.gguf"}, "/home/models/q", "/home/models/q/Q5.gguf"),
    ({"name": "q", "repo": "o/r", "filename": "sub/Q5-00001-of-00002.gguf", "dest": "qwen"},
     "/home/models/qwen", "/home/models/qwen/Q5-00001-of-00002.gguf"),
    ({"name": "q", "url": "https://h/p/m.gguf?x=1", "dest": "/srv/m"}, "/srv/m", "/srv/m/m.gguf"),
    ({"name": "s", "repo": "o/r", "snapshot": True}, "/home/models/s", "/home/models/s/config.json"),
])
def test_where_each_model_goes(item, dest, final):
    assert model_paths([item], "/home/models") == [{"name": item["name"], "dest": dest, "final": final}]
    # the role's per-model variables say the same
    variables = load_yaml(os.path.join(ROOT, "roles", "model", "vars", "main.yml"))
    variables.update({"_model_item": item, "model_dir": "/home/models"})
    templar = role_templar(os.path.join(ROOT, "roles", "model"), variables)
    assert templar.template("{{ _model_dest }}") == dest
    assert templar.template("{{ _model_final_path }}") == final


# --- which headers preflight need not read again (unchanged_headers) ----------------------------------------

IDENTITY = {"size": 4096, "mtime_ns": 1, "ctime_ns": 2, "inode": 3}
KEYS = ["architecture", "block_count", "identity"]
Q = {"name": "q", "repo": "o/r", "filename": "q.gguf"}
FINAL = "/m/q/q.gguf"
HEADER = {"architecture": "qwen35", "block_count": 4, "split": None, "identity": IDENTITY,
          "summary_version": SUMMARY_VERSION}


def _node(entry):
    return {"paths": {FINAL: entry}}


@pytest.mark.parametrize("models, node, recorded, reused", [
    ([Q], _node({"exists": True, "type": "file", "identity": IDENTITY}),
     {"q": {"path": FINAL, "gguf": HEADER}}, True),
    # the file changed (any field of its identity), is gone, or is a link now
    ([Q], _node({"exists": True, "type": "file", "identity": dict(IDENTITY, ctime_ns=9)}),
     {"q": {"path": FINAL, "gguf": HEADER}}, False),
    ([Q], _node({"exists": False}), {"q": {"path": FINAL, "gguf": HEADER}}, False),
    ([Q], _node({"exists": True, "type": "link"}), {"q": {"path": FINAL, "gguf": HEADER}}, False),
    ([Q], {}, {"q": {"path": FINAL, "gguf": HEADER}}, False),                         # no read in this run
    # nothing recorded (no fact cache, a first run), or a record of another file or from an older release
    ([Q], _node({"exists": True, "type": "file", "identity": IDENTITY}), {}, False),
    ([Q], _node({"exists": True, "type": "file", "identity": IDENTITY}),
     {"q": {"path": "/m/q/old.gguf", "gguf": HEADER}}, False),
    ([Q], _node({"exists": True, "type": "file", "identity": IDENTITY}),
     {"q": {"path": FINAL, "gguf": {k: v for k, v in HEADER.items() if k != "identity"}}}, False),
    ([Q], _node({"exists": True, "type": "file", "identity": IDENTITY}),
     {"q": {"path": FINAL, "gguf": {k: v for k, v in HEADER.items() if k != "block_count"}}}, False),
    ([Q], _node({"exists": True, "type": "file", "identity": IDENTITY}), {"q": {"path": FINAL, "gguf": {}}},
     False),
    ([Q], _node({"exists": True, "type": "file", "identity": IDENTITY}), {"q": "garbage"}, False),
    ([Q], _node({"exists": True, "type": "file", "identity": IDENTITY}), "garbage", False),
    # made by another release's reader (a newer chat-template scan, layer layout): read again
    ([Q], _node({"exists": True, "type": "file", "identity": IDENTITY}),
     {"q": {"path": FINAL, "gguf": dict(HEADER, summary_version=SUMMARY_VERSION - 1)}}, False),
    ([Q], _node({"exists": True, "type": "file", "identity": IDENTITY}),
     {"q": {"path": FINAL, "gguf": {k: v for k, v in HEADER.items() if k != "summary_version"}}}, False),
    # a split set (its other parts are not read here), a header from the hub, a snapshot
    ([Q], _node({"exists": True, "type": "file", "identity": IDENTITY}),
     {"q": {"path": FINAL, "gguf": dict(HEADER, split={"count": 2})}}, False),
    ([Q], _node({"exists": True, "type": "file", "identity": IDENTITY}),
     {"q": {"path": FINAL, "gguf": dict(HEADER, remote={"url": "http://hub"})}}, False),
    ([dict(Q, snapshot=True)], {"paths": {"/m/q/config.json": {"exists": True, "type": "file",
                                                               "identity": IDENTITY}}},
     {"q": {"path": "/m/q/config.json", "gguf": HEADER}}, False),
])
def test_a_header_is_reused_only_for_the_same_unchanged_file(models, node, recorded, reused):
    assert unchanged_headers(models, "/m", node, recorded, KEYS) == ({"q": HEADER} if reused else {})


def test_model_dir_with_a_trailing_slash_names_the_same_files():
    """model_download names its file with os.path.abspath: the record's path and this rule agree."""
    expected = [{"name": "q", "dest": "/m/q", "final": FINAL}]
    assert model_paths([Q], "/m/") == model_paths([Q], "/m") == expected
    node = _node({"exists": True, "type": "file", "identity": IDENTITY})
    assert unchanged_headers([Q], "/m/", node, {"q": {"path": FINAL, "gguf": HEADER}}, KEYS) == {"q": HEADER}


def test_each_model_is_decided_on_its_own():
    other = {"name": "o", "url": "https://h/o.gguf"}
    node = {"paths": {FINAL: {"exists": True, "type": "file", "identity": IDENTITY},
                      "/m/o/o.gguf": {"exists": True, "type": "file", "identity": dict(IDENTITY, inode=4)}}}
    recorded = {"q": {"path": FINAL, "gguf": HEADER}, "o": {"path": "/m/o/o.gguf", "gguf": HEADER}}
    assert unchanged_headers([Q, other], "/m", node, recorded, KEYS) == {"q": HEADER}
