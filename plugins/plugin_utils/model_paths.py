# -*- coding: utf-8 -*-
# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Where role model keeps each entry of model_models on the node (plugins/filter/model.py).

    dest   the model's directory: `dest` when absolute, else <model_dir>/<dest or name>
    final  the file that says the model is there: the GGUF file (`filename`, or the last part of `url`'s path)
           in dest, or dest/config.json for a snapshot

The role's per-model variables (_model_dest, _model_final_path) and preflight's one read of the node (every
model's directory and file in one node_state_info call) both come from here.
"""
from __future__ import absolute_import, division, print_function

import posixpath

from ansible.module_utils.six.moves.urllib.parse import urlsplit

__metaclass__ = type


def model_paths(models, model_dir):
    """[{"name", "dest", "final"}] for each entry of model_models, in order."""
    out = []
    for item in models or []:
        dest = item.get("dest")
        if not (isinstance(dest, str) and posixpath.isabs(dest)):
            dest = "%s/%s" % (model_dir, dest if "dest" in item else item.get("name"))
        if item.get("snapshot") is True:
            final = dest + "/config.json"
        else:
            name = item["filename"] if "filename" in item else urlsplit(str(item.get("url") or "")).path
            final = "%s/%s" % (dest, posixpath.basename(str(name)))
        out.append({"name": item.get("name"), "dest": dest, "final": final})
    return out
