# -*- coding: utf-8 -*-
# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Where role model keeps each entry of model_models on the node (plugins/filter/model.py).

    dest   the model's directory: `dest` when absolute, else <model_dir>/<dest or name>
    final  the file that says the model is there: the GGUF file (`filename`, or the last part of `url`'s path)
           in dest, or dest/config.json for a snapshot

The role's per-model variables (_model_dest, _model_final_path) and preflight's one read of the node (every
model's directory and file in one node_state_info call) both come from here; so does which models' GGUF
headers preflight need not read again (unchanged_headers).
"""
from __future__ import absolute_import, division, print_function

import posixpath

from ansible.module_utils.six.moves.urllib.parse import urlsplit
from ansible_collections.llmops.serving.plugins.module_utils._files.identity import same_identity
from ansible_collections.llmops.serving.plugins.module_utils._model_format.gguf import SUMMARY_VERSION
from ansible_collections.llmops.serving.plugins.plugin_utils.node_state import path_state

__metaclass__ = type


def model_paths(models, model_dir):
    """[{"name", "dest", "final"}] for each entry of model_models, in order."""
    out = []
    for item in models or []:
        dest = item.get("dest")
        if not (isinstance(dest, str) and posixpath.isabs(dest)):
            dest = "%s/%s" % (model_dir, dest if "dest" in item else item.get("name"))
        # as model_download names them (os.path.abspath): model_dir "/srv/models/" is the same directory
        dest = posixpath.normpath(dest)
        if item.get("snapshot") is True:
            final = dest + "/config.json"
        else:
            name = item["filename"] if "filename" in item else urlsplit(str(item.get("url") or "")).path
            final = "%s/%s" % (dest, posixpath.basename(str(name)))
        out.append({"name": item.get("name"), "dest": dest, "final": final})
    return out


def unchanged_headers(models, model_dir, state, recorded, keys):
    """{name: header} of each single-file GGUF model whose header a past run recorded and whose file is the
    same file now: what preflight would read from it again.

    `state` is preflight's node_state_info read of the models' files (each file's stat identity), `recorded`
    the llmops_models fact a past run of role model published (the fact cache: name -> {path, gguf}), `keys`
    the header keys the stages read. A model counts when its record names the same file, the header was
    computed by this release's reader (gguf.SUMMARY_VERSION: a newer chat-template scan or layer layout reads
    the file again) and carries every key and the identity of the file it was read from (gguf_info
    `identity`), and the node's file has that identity now (file_identity.py: size, mtime_ns, ctime_ns,
    inode - writing, touching, chmod/chown or replacing the file changes it). Snapshots, split sets (the
    other parts are not read here) and headers read from the hub never count."""
    out = {}
    recorded = recorded if isinstance(recorded, dict) else {}
    for item, where in zip(models or [], model_paths(models, model_dir), strict=True):
        record = recorded.get(where["name"])
        header = record.get("gguf") if isinstance(record, dict) else None
        if item.get("snapshot") is True or not isinstance(header, dict):
            continue
        if record.get("path") != where["final"]:
            continue
        if header.get("split") or "remote" in header or header.get("summary_version") != SUMMARY_VERSION:
            continue
        if any(key not in header for key in keys or []):
            continue
        seen = path_state(state, where["final"])
        if seen.get("type") == "file" and same_identity(header.get("identity"), seen.get("identity")):
            out[where["name"]] = header
    return out
