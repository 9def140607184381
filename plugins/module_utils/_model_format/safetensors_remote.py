# -*- coding: utf-8 -*-
# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
# PRIVATE to llmops.serving: it can change at any time; do not import it from other collections.
"""safetensors_info for a model that is not downloaded yet: what the vLLM memory planner reads from a model
directory (config.json and the *.safetensors sizes, memory_plan_vllm.vllm_model_summary), taken from the hub
before anything is fetched, as gguf_remote does for a GGUF.

* The commit and the file listing come from snapshot_listing (model_snapshot's own: the same commit
  resolution, bounds and hostile-path refusals), filtered by the same allow/ignore patterns, so the plan is
  made for exactly the files model_snapshot will fetch.
* ``config.json`` is fetched from ``/resolve/<commit>/`` (at most 4 MiB) and checked against the listing's
  checksum (git blob id or sha256) before it is parsed; so is ``model.safetensors.index.json`` when the
  listing has one (at most 64 MiB): then only the shards it names are read and counted, as vLLM loads only
  those (safetensors.select_weights), and a shard it names that the listing lacks is refused.
* Each top-level ``*.safetensors`` shard: two HTTP Range requests, the 8-byte header length, then the
  header (at most ``safetensors.MAX_HEADER_BYTES``), read through gguf_remote's range reader (a server that
  ignores Range is refused without reading the body; the size comes from Content-Range and must equal the
  listing's). The header is checked as the safetensors library does (its tensors must end exactly at the
  listed size). The tensor data is never requested.
* The token rules are model_download's: sent only to the endpoint's origin, never in a message.

Plain Python 3.6, standard library only; importable without Ansible.
"""
from __future__ import absolute_import, division, print_function

import hashlib
import json
import os
import tempfile

from ansible_collections.llmops.serving.plugins.module_utils._download.http import (
    CountingSession,
    refuse_html,
    status_error,
    with_retries,
)
from ansible_collections.llmops.serving.plugins.module_utils._download.messages import (
    DownloadError,
    redact_url,
)
from ansible_collections.llmops.serving.plugins.module_utils._download.options import (
    HEADER_READ_DEFAULTS,
    normalize,
)
from ansible_collections.llmops.serving.plugins.module_utils._download.source import Target, resolve_url
from ansible_collections.llmops.serving.plugins.module_utils._memory_plan.vllm import vllm_summary
from ansible_collections.llmops.serving.plugins.module_utils._model_format import safetensors
from ansible_collections.llmops.serving.plugins.module_utils._model_format.gguf_remote import _RangeFile
from ansible_collections.llmops.serving.plugins.module_utils._snapshot.listing import (
    MANIFEST_NAME,
    Budget,
    list_files,
    read_capped,
    resolve_commit,
    select,
)

__metaclass__ = type

REMOTE_OPTIONS = ("source", "repo", "revision", "endpoint", "token", "validate_certs", "timeout", "retries",
                  "retry_delay")
# download_options.normalize() checks a destination; this module writes nothing, the path is never used.
NO_DEST = os.path.join(tempfile.gettempdir(), "llmops-safetensors-info-writes-nothing")


class _Reader:
    """What gguf_remote's range reader needs of its owner: the session, the options, the window sizes (8
    bytes first: the header length; then exactly the header) and the bytes read."""

    def __init__(self, options, session):
        self.options = options
        self.session = session
        self.first_window = 8
        self.max_window = safetensors.MAX_HEADER_BYTES
        self.bytes_read = 0


def _options(params):
    given = dict(HEADER_READ_DEFAULTS)
    given.update((k, params[k]) for k in REMOTE_OPTIONS if params.get(k) is not None)
    # model_download's rules want a file name with a repo; the manifest's name stands in (never requested)
    return normalize(dict(given, filename=MANIFEST_NAME, dest=NO_DEST))


def _small_json(o, session, rev, entry, name, max_bytes):
    """The JSON document of a small file of the listing (config.json, the shard index): one GET of at most
    ``max_bytes``, checked against the listing's size and checksum before it is parsed."""
    label = "%s of %s" % (entry.path, name)
    url = resolve_url(o, entry.path, rev)

    def get():
        resp, final = session.request("GET", url, auth_origin=o["auth_origin"])
        if resp.status != 200:
            raise status_error(resp, url, "GET %s of %s" % (entry.path, o["repo"]))
        refuse_html(resp, entry.path, final)
        return read_capped(resp, Budget(max_bytes, 1), session, label)
    body = with_retries(get, o["retries"], o["retry_delay"], label)
    if len(body) != entry.size:
        raise DownloadError("%s: %d bytes, the listing says %d" % (label, len(body), entry.size))
    if entry.sha256 and hashlib.sha256(body).hexdigest() != entry.sha256:
        raise DownloadError("%s does not match the listing's sha256: refused" % label)
    if entry.git_sha1 and hashlib.sha1(b"blob %d\0" % len(body) + body).hexdigest() != entry.git_sha1:
        raise DownloadError("%s does not match the listing's git blob id: refused" % label)
    try:
        return json.loads(body.decode("utf-8"))
    except (ValueError, RecursionError, UnicodeDecodeError):
        raise DownloadError("%s is not JSON" % label) from None


def _shard(o, reader, rev, f, name):
    """parse_header() of one remote shard: 8 bytes, then the header, with Range requests."""
    t = Target(f.path, resolve_url(o, f.path, rev), None)
    t.size = f.size
    label = "%s %s" % (name, f.path)
    source = _RangeFile(reader, t, label, 8 + safetensors.MAX_HEADER_BYTES)
    if source.size != f.size:
        raise DownloadError("%s: the hub serves %s bytes, the listing says %d" % (label, source.size, f.size))
    source.seek(0)
    n = safetensors.header_length(source.read(8), f.size, label)
    source.seek(8)
    raw = source.read(n)
    info = safetensors.parse_header(raw, f.size, label)
    info.update(name=f.path, size=f.size)
    return info


def remote_summary(params, allow=None, ignore=None, model_dir=None):
    """{"vllm": the planner's summary, "shards": [...], "commit", "id", "remote": {url, bytes_read, requests}}
    of a hub repo's model files (allow/ignore as model_snapshot's patterns). Raises DownloadError or
    safetensors.SafetensorsError; neither contains the token."""
    o = _options(params)
    session = CountingSession(o["token"], o["timeout"], o["validate_certs"])
    reader = _Reader(o, session)
    name = "%s@%s" % (o["repo"], o["revision"])
    try:
        commit = resolve_commit(o, session)
        rev = commit or o["revision"]
        files = select(list_files(o, session, commit), allow, ignore)
        by_path = dict((f.path, f) for f in files)
        if "config.json" not in by_path:
            raise DownloadError("%s at %s has no config.json (among the files the patterns select): not a "
                                "model vLLM can load" % (o["repo"], rev))
        config = _small_json(o, session, rev, by_path["config.json"], name, safetensors.CONFIG_MAX_BYTES)
        index = None
        if safetensors.INDEX_NAME in by_path:
            index = _small_json(o, session, rev, by_path[safetensors.INDEX_NAME], name,
                                safetensors.INDEX_MAX_BYTES)
            index = {} if index is None else index
        weights, note = safetensors.select_weights(list(by_path), index, "%s of %s" % (safetensors.INDEX_NAME,
                                                                                       name))
        shards = [_shard(o, reader, rev, by_path[w], name) for w in weights]
    finally:
        session.close()
    where = model_dir or "%s/%s at %s" % (redact_url(o["endpoint"]), o["repo"], rev)
    summary = vllm_summary(config, sum(s["size"] for s in shards), where, "config.json of %s" % name, note)
    return {"vllm": summary, "shards": shards, "commit": commit,
            "remote": {"url": "%s/%s" % (redact_url(o["endpoint"]), o["repo"]), "revision": rev,
                       "bytes_read": reader.bytes_read, "requests": session.requests}}
