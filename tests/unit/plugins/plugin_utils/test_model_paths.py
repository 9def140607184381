# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Where role model keeps each model (plugin_utils/model_paths.py): the role's _model_dest/_model_final_path
and preflight's one read of the node use the same rule."""
import os

import pytest

from plugins.plugin_utils.model_paths import model_paths
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
