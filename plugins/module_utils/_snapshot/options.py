# -*- coding: utf-8 -*-
# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
# PRIVATE to llmops.serving: it can change at any time; do not import it from other collections.
"""The options of model_snapshot, written once (the module's argument spec and the logic's defaults; a unit
test compares them with the module's DOCUMENTATION), and normalize().

The options a snapshot shares with model_download (hub, endpoint, revision, token, tuning) mean the same and
go through model_download's own rules: download_options.normalize() sets the endpoint, revision and token
from the node's environment per hub, refuses a token with whitespace, binds the token to the endpoint's
origin and caps the connections, exactly as for a single file.

Plain Python 3.6, standard library only; importable without Ansible.
"""
from __future__ import absolute_import, division, print_function

import os

from ansible_collections.llmops.serving.plugins.module_utils._download import options as download_options
from ansible_collections.llmops.serving.plugins.module_utils._download.messages import DownloadError
from ansible_collections.llmops.serving.plugins.module_utils._snapshot.listing import MANIFEST_NAME

__metaclass__ = type

# What download_options.normalize() checks for a snapshot as it does for a file.
SHARED = ("repo", "source", "revision", "endpoint", "token", "connections", "parallel_min_size", "update",
          "force_verify", "progress_file", "timeout", "retries", "retry_delay", "validate_certs",
          "free_space_margin", "lock_timeout")

# name -> Ansible argument spec entry: the shared options as model_download declares them (one spec for
# both modules), then a snapshot's own; a snapshot always comes from a hub repo.
OPTIONS = dict((name, dict(download_options.OPTIONS[name])) for name in SHARED)
OPTIONS.update({
    "repo": {"type": "str", "required": True},
    "dest": {"type": "path", "required": True},
    "allow_patterns": {"type": "list", "elements": "str", "default": []},
    "ignore_patterns": {"type": "list", "elements": "str", "default": []},
})

DEFAULTS = dict((name, spec.get("default")) for name, spec in OPTIONS.items())


def argument_spec():
    """A fresh copy of OPTIONS for AnsibleModule(argument_spec=...)."""
    return dict((name, dict(spec)) for name, spec in OPTIONS.items())


def normalize(params):
    o = dict(DEFAULTS)
    o.update(dict((k, v) for k, v in params.items() if v is not None))
    if not o.get("repo"):
        raise DownloadError("repo is required: the hub repository, org/name (e.g. Qwen/Qwen3.6-27B-FP8)")
    dest = o.get("dest")
    if not dest or not os.path.isabs(dest):
        raise DownloadError("dest must be an absolute path: the model directory vLLM reads (e.g. "
                            "/home/models/Qwen3.6-27B-FP8), got %r" % (dest,))
    dest = os.path.normpath(dest)
    if dest == "/" or os.path.basename(dest) in ("", ".", ".."):
        raise DownloadError("dest must name a directory below another one, got %r" % (o["dest"],))
    shared = dict((k, o[k]) for k in SHARED if o.get(k) is not None)
    # model_download's rules want a file name with a repo; a snapshot has none (its files come from the
    # listing), so the manifest's name stands in: it is never requested.
    base = download_options.normalize(dict(shared, filename=MANIFEST_NAME, dest=os.path.dirname(dest)))
    for k in ("endpoint", "revision", "token", "auth_origin", "connections", "lock_timeout"):
        o[k] = base[k]
    o["dest"] = dest
    # FileDownload and download_parts read these as model_download sets them for a hub file
    o.update(url=None, filename=None, sha256=None, size=None)
    for k in ("allow_patterns", "ignore_patterns"):
        pats = o.get(k) or []
        if not isinstance(pats, list) or not all(isinstance(p, str) and p for p in pats):
            raise DownloadError("%s must be a list of non-empty glob patterns (e.g. ['*.safetensors', "
                                "'*.json']), got %r" % (k, pats))
        o[k] = list(pats)
    if int(o["parallel_min_size"]) < 1:
        raise DownloadError("parallel_min_size must be at least 1")
    return o
