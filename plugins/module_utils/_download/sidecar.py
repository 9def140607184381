# -*- coding: utf-8 -*-
# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
# PRIVATE to llmops.serving: it can change at any time; do not import it from other collections.
"""The sidecar record ``<dir>/.<file>.llmops.json`` of a verified model file.

model_download writes it (after a download, and when it verified a file already in place); gguf_info only
reads it, to skip hashing a file that has not changed since it was verified.  The record identifies the
content by size, mtime_ns, inode and ctime_ns: writing the file, ``touch``, ``utime`` (a restored mtime),
chmod/chown or replacing it all change ctime, which a user cannot set, so such a file no longer matches
and is hashed again.  The record belongs to the user the run is (root in production), whoever owns the
model file, and is trusted only when it is owned by that user or root, has one link and is writable by
nobody else: the service user can write the models directory, but cannot forge a record there (it cannot
create a root-owned file).  See download.py for what this fast path cannot detect.

Plain Python 3.6, standard library only; importable without Ansible (and without the downloader).
"""
from __future__ import absolute_import, division, print_function

import os
import time

from ansible_collections.llmops.serving.plugins.module_utils._files.identity import identity, same_file
from ansible_collections.llmops.serving.plugins.module_utils._files.safe import (
    hash_file,
    read_json,
    write_json_atomic,
)
from ansible_collections.llmops.serving.plugins.module_utils.validators import whole

__metaclass__ = type

SIDECAR_VERSION = 1
_HEX64 = whole(r"[0-9a-f]{64}")


def sidecar_path(final_path):
    d, b = os.path.split(final_path)
    return os.path.join(d, "." + b + ".llmops.json")


def read_sidecar_record(final_path):
    """The sidecar record of final_path, or None when it is absent, unreadable, of another version, or not
    written by this run's user or root (safe_files.trusted_owner)."""
    rec = read_json(sidecar_path(final_path), trusted=True)
    if not rec or rec.get("version") != SIDECAR_VERSION:
        return None
    return rec


def sidecar_matches_file(rec, path):
    """Whether the record describes the file at path as it is now: a digest, and the stat identity it was
    recorded with (file_identity.py: size, mtime_ns, inode, ctime_ns)."""
    try:
        st = os.stat(path)
    except OSError:
        return False
    return same_file(rec, st) and bool(rec.get("sha256"))


def recorded_sha256(path):
    """The sha256 the record vouches for while it matches the file at path as it is now; else None."""
    rec = read_sidecar_record(path)
    if rec and sidecar_matches_file(rec, path):
        digest = rec.get("sha256")
        if isinstance(digest, str) and _HEX64.match(digest):
            return digest
    return None


def sha256_cached(path, force=False):
    """(digest, cached): the file's sha256 from a matching sidecar record, else computed. gguf_info is an
    _info module: it reads the record to skip hashing an unchanged file and never writes it (model_download
    records what it verified)."""
    if not force:
        digest = recorded_sha256(path)
        if digest:
            return digest, True
    return hash_file(path), False


def write_sidecar_record(final_path, sha, _stat=None, **provenance):
    """Record that final_path (as it is now: size, mtime, inode, ctime) has sha256 `sha`, with its
    provenance (commit, etag, source, source_url).  Owned by this run's user (not the file's owner: see the
    module docstring), mode 0644, written to an unguessable temporary name and renamed (never through a
    planted link).
    ``_stat``: the file's stat when the caller already has it (else os.stat)."""
    st = _stat if _stat is not None else os.stat(final_path)
    rec = dict(provenance)
    rec.update(identity(st))
    rec.update({"version": SIDECAR_VERSION, "file": os.path.basename(final_path), "sha256": sha,
                "verified_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
    write_json_atomic(sidecar_path(final_path), rec)
    return rec
