# -*- coding: utf-8 -*-
# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
# PRIVATE to llmops.serving: it can change at any time; do not import it from other collections.
"""A hub repository's files at one commit, as the hub lists them, checked before anything is written:
what ``model_snapshot`` fetches and ``safetensors_info`` reads remotely.

Hugging Face (as ``huggingface_hub`` speaks it)
-----------------------------------------------
* The revision resolves once: ``GET <endpoint>/api/models/<repo>/revision/<rev>`` (``HfApi.repo_info``)
  answers ``{"sha": <commit>, ...}``; a 40-hex revision is taken as the commit.
* The files: ``GET <endpoint>/api/models/<repo>/tree/<commit>?recursive=true`` (``HfApi.list_repo_tree``),
  a JSON list of ``{"type": "file", "path", "size", "oid": <git blob sha1>, "lfs": {"oid": <sha256>,
  "size", "pointerSize"}}`` (``lfs`` only for LFS files) and ``{"type": "directory", ...}``, in pages
  linked by ``Link: <next>; rel="next"``.
* An LFS file is verified by the listing's sha256 (``lfs.oid``); a plain git file by its git blob id,
  ``sha1(b"blob <size>\\0" + bytes)`` (``oid``).

ModelScope
----------
* The files: ``<endpoint>/api/v1/models/<org>/<name>/repo/files?Revision=<rev>&Recursive=true`` (one
  JSON document, ``Data.Files`` with ``Path``, ``Type`` blob/tree, ``Size``, ``Sha256``); every file is
  verified by its ``Sha256``.
* ModelScope has no API that resolves a branch to a commit (its SDK downloads from the branch): a
  40-hex revision pins the commit; a branch is pinned by content instead. The one listing read at the
  start gives every file's sha256 and every byte is checked against it, so a branch that moves during the
  download fails verification and is never published as a mix; the snapshot is then named by the
  listing's digest (``ms-<sha1 of the sorted path/size/sha256 lines>``), not a commit.

Bounds (a hostile or broken hub cannot make the node read or keep more)
----------------------------------------------------------------------
* All pages of a listing together: at most ``LISTING_MAX_BYTES`` (8 MiB; a repo of 30,000 files lists in
  about 6 MiB) and ``LISTING_MAX_PAGES`` (200) pages; at most ``MAX_FILES`` (30,000) files. A larger
  ``Content-Length`` is refused before the body is read; a body without one is read up to the bound plus
  one byte, then the connection is dropped (never read whole).
* Every path: at most ``MAX_PATH`` (1,024) characters of printable text; no absolute path, no ``..``,
  ``.`` or empty segment, no backslash; no duplicate; no file that is also a folder of another file; no
  name the snapshot itself uses (the manifest ``.llmops-snapshot.json`` and ``<a listed file>.part`` or
  ``.part.json``). Every file needs a size and a checksum (sha256, or a git blob id for a plain git file).

Plain Python 3.6, standard library only; importable without Ansible.
"""
from __future__ import absolute_import, division, print_function

import fnmatch
import hashlib
import json
import re
from urllib.parse import quote, urljoin

from ansible_collections.llmops.serving.plugins.module_utils._download.http import (
    refuse_html,
    status_error,
    with_retries,
)
from ansible_collections.llmops.serving.plugins.module_utils._download.messages import (
    DownloadError,
    human,
    redact_url,
)
from ansible_collections.llmops.serving.plugins.module_utils._download.source import (
    HEX40,
    HEX64,
    is_modelscope,
    listing_url,
)

__metaclass__ = type

MIB = 1 << 20
LISTING_MAX_BYTES = 8 * MIB
LISTING_MAX_PAGES = 200
MAX_FILES = 30000
MAX_PATH = 1024
MAX_FILE_SIZE = 1 << 42  # 4 TiB: a size beyond it is not a model file
MANIFEST_NAME = ".llmops-snapshot.json"
CONTROL = re.compile(r"[\x00-\x1f\x7f]")
LINK_NEXT = re.compile(r'<([^>]+)>\s*;\s*rel="?next"?')


class SnapFile:
    """One file of a snapshot: repo path, size and what verifies it (sha256 and/or git blob sha1)."""

    __slots__ = ("path", "size", "sha256", "git_sha1", "lfs")

    def __init__(self, path, size, sha256=None, git_sha1=None, lfs=False):
        self.path = path
        self.size = size
        self.sha256 = sha256
        self.git_sha1 = git_sha1
        self.lfs = lfs

    def as_dict(self):
        return {"path": self.path, "size": self.size, "sha256": self.sha256, "git_sha1": self.git_sha1,
                "lfs": self.lfs}


class Budget:
    """What is left of the listing bounds over all its pages."""

    def __init__(self, max_bytes=LISTING_MAX_BYTES, max_pages=LISTING_MAX_PAGES):
        self.bytes_left = max_bytes
        self.max_bytes = max_bytes
        self.pages_left = max_pages


def read_capped(resp, budget, session, where):
    """The body of resp, refused (with the connection dropped, the rest never read) when it would take
    the listing past budget.bytes_left."""
    cl = (resp.getheader("Content-Length") or "").strip()
    if cl.isdigit() and int(cl) > budget.bytes_left:
        session.close()
        raise DownloadError("%s: %s says %s bytes, more than the %s a listing may take (all pages together): "
                            "refused without reading it; not a model repository's listing, or a hub that "
                            "lists far more than a model (use allow/ignore patterns on a smaller repo)"
                            % (where, "Content-Length", cl, human(budget.max_bytes)), listing_too_large=True)
    parts = []
    got = 0
    while got <= budget.bytes_left:
        chunk = resp.read(min(MIB, budget.bytes_left + 1 - got))
        if not chunk:
            break
        parts.append(chunk)
        got += len(chunk)
    if got > budget.bytes_left:
        session.close()  # never read the rest: it may be endless
        raise DownloadError("%s is larger than the %s a listing may take (all pages together): refused after "
                            "reading %s; not a model repository's listing"
                            % (where, human(budget.max_bytes), human(got)), listing_too_large=True)
    budget.bytes_left -= got
    return b"".join(parts)


def _json(body, where):
    try:
        return json.loads(body.decode("utf-8"))
    except (ValueError, RecursionError, UnicodeDecodeError):
        raise DownloadError("%s is not JSON (nested too deep, or not text): check endpoint (a hub or a "
                            "mirror of it)" % where) from None


def _get_json(o, session, url, where, budget):
    def get():
        if budget.pages_left <= 0:
            raise DownloadError("%s: more than %d pages: refused (not a model repository's listing)"
                                % (where, LISTING_MAX_PAGES), listing_too_large=True)
        budget.pages_left -= 1
        resp, final = session.request("GET", url, headers={"Accept": "application/json"},
                                      auth_origin=o.get("auth_origin"))
        if resp.status >= 400:
            raise status_error(resp, url, where)
        if resp.status != 200:
            raise status_error(resp, url, where)
        refuse_html(resp, where, final)
        return _json(read_capped(resp, budget, session, where), where), resp.getheader("Link"), final
    return with_retries(get, o["retries"], o["retry_delay"], where)


def hf_revision_url(o, revision):
    return "%s/api/models/%s/revision/%s" % (o["endpoint"], o["repo"], quote(revision, safe=""))


def hf_tree_url(o, commit):
    return "%s/api/models/%s/tree/%s?recursive=true" % (o["endpoint"], o["repo"], quote(commit, safe=""))


def resolve_commit(o, session, budget=None):
    """The commit the revision names now (one request on Hugging Face; a 40-hex revision is the commit), or
    None where the hub cannot say (a ModelScope branch: pinned by content, see the module docstring)."""
    revision = o["revision"]
    if HEX40.match(revision or ""):
        return revision
    if is_modelscope(o):
        return None
    where = "revision %s of %s on %s" % (revision, o["repo"], redact_url(o["endpoint"]))
    doc, _link, _final = _get_json(o, session, hf_revision_url(o, revision), where, budget or Budget())
    sha = str(doc.get("sha") or "").strip().lower() if isinstance(doc, dict) else ""
    if not HEX40.match(sha):
        raise DownloadError("%s: the hub's answer has no commit id (sha): check endpoint (a Hugging Face hub "
                            "or mirror)" % where)
    return sha


def list_files(o, session, commit):
    """[SnapFile] of the whole repo at commit (Hugging Face) or at the revision (ModelScope, commit None),
    every path and checksum checked (check_listing)."""
    budget = Budget()
    if is_modelscope(o):
        rev = commit or o["revision"]
        where = "the file listing of %s at %s from %s" % (o["repo"], rev, redact_url(o["endpoint"]))
        doc, _link, _final = _get_json(o, session, listing_url(o, rev), where, budget)
        return check_listing(_modelscope_entries(doc, where), where)
    where = "the file listing of %s at %s from %s" % (o["repo"], commit, redact_url(o["endpoint"]))
    url = hf_tree_url(o, commit)
    entries = []
    while url:
        doc, link, final = _get_json(o, session, url, where, budget)
        if not isinstance(doc, list):
            raise _refuse(where, "the listing is not a JSON list (is endpoint a Hugging Face hub or mirror?)")
        entries.extend(_hf_entry(e, where) for e in doc)
        if len(entries) > MAX_FILES * 2:
            raise DownloadError("%s lists more than %d entries: refused" % (where, MAX_FILES * 2),
                                listing_too_large=True)
        m = LINK_NEXT.search(link or "")
        url = urljoin(final, m.group(1)) if m else None
    return check_listing([e for e in entries if e is not None], where)


def _refuse(where, what):
    return DownloadError("%s: refused: %s. A hub never lists this; check endpoint (a mirror or proxy that "
                         "rewrites listings?)" % (where, what), hostile_listing=True)


def _hf_entry(e, where):
    """(path, size, sha256, git sha1, lfs) of a tree entry; None for a folder."""
    if not isinstance(e, dict):
        raise _refuse(where, "an entry is not an object: %s" % _short(e))
    kind = e.get("type")
    if kind == "directory":
        return None
    if kind != "file":
        raise _refuse(where, "entry %s has type %s (not a file or directory)"
                      % (_short(e.get("path")), _short(kind)))
    lfs = e.get("lfs")
    sha = None
    if lfs is not None:
        if not isinstance(lfs, dict):
            raise _refuse(where, "entry %s has a malformed lfs field" % _short(e.get("path")))
        sha = str(lfs.get("oid") or "").lower()
        if lfs.get("size") != e.get("size"):
            raise _refuse(where, "entry %s: lfs size %s differs from size %s"
                          % (_short(e.get("path")), _short(lfs.get("size"), 40), _short(e.get("size"), 40)))
    oid = str(e.get("oid") or "").lower() or None
    return (e.get("path"), e.get("size"), sha or None, None if lfs is not None else oid, lfs is not None)


def _modelscope_entries(doc, where):
    if not isinstance(doc, dict):
        raise _refuse(where, "the listing is not a JSON object")
    if doc.get("Code") not in (200, "200"):
        raise DownloadError("%s answered Code %s: %s" % (where, doc.get("Code"), _short(doc.get("Message"))))
    data = doc.get("Data")
    files = data.get("Files") if isinstance(data, dict) else None
    if not isinstance(files, list):
        raise _refuse(where, "the listing has no Data.Files list")
    out = []
    for e in files:
        if not isinstance(e, dict):
            raise _refuse(where, "an entry is not an object: %s" % _short(e))
        kind = e.get("Type", "blob")
        if kind == "tree":
            continue
        if kind != "blob":
            raise _refuse(where, "entry %s has Type %s (not a blob or tree)"
                          % (_short(e.get("Path")), _short(kind)))
        out.append((e.get("Path"), e.get("Size"), str(e.get("Sha256") or "").lower() or None, None,
                    bool(e.get("IsLFS"))))
    return out


def _short(value, n=120):
    text = repr(value)
    return text if len(text) <= n else text[:n] + "..."


def path_problem(path):
    """Why a listed path cannot be a file of the snapshot directory, or None."""
    if not isinstance(path, str) or not path:
        return "not a non-empty string"
    if len(path) > MAX_PATH:
        return "longer than %d characters" % MAX_PATH
    if CONTROL.search(path):
        return "contains control characters"
    if "\\" in path:
        return "contains a backslash"
    if path.startswith("/"):
        return "is absolute"
    segs = path.split("/")
    if any(s in ("", ".", "..") for s in segs):
        return "has an empty, '.' or '..' segment"
    if any(len(s.encode("utf-8", "surrogateescape")) > 255 for s in segs):
        return "has a name longer than 255 bytes"
    if path == MANIFEST_NAME:
        return "is the snapshot's own manifest name"
    return None


def check_listing(entries, where):
    """[SnapFile] from (path, size, sha256, git sha1, lfs) tuples; refuses the listing (naming the first bad
    entry and why) on a path that cannot be a file of the snapshot, a duplicate, a file that is also a folder,
    a name the snapshot uses, a bad size or no usable checksum."""
    if len(entries) > MAX_FILES:
        raise DownloadError("%s lists %d files, more than %d: refused (not a model repository, or use a "
                            "smaller repo)" % (where, len(entries), MAX_FILES), listing_too_large=True)
    seen = set()
    out = []
    for path, size, sha, sha1, lfs in entries:
        why = path_problem(path)
        if why is None and path in seen:
            why = "is listed twice"
        if why is None and (not isinstance(size, int) or isinstance(size, bool)
                            or not 0 <= size <= MAX_FILE_SIZE):
            why = "has no valid size (%s)" % _short(size, 40)
        if why is None and sha is not None and not HEX64.match(sha):
            why = "has a malformed sha256 %s" % _short(sha, 80)
        if why is None and sha1 is not None and not HEX40.match(sha1):
            why = "has a malformed git blob id %s" % _short(sha1, 80)
        if why is None and not sha and not sha1:
            why = "has no checksum (no sha256, no git blob id): it cannot be verified"
        if why:
            raise _refuse(where, "path %s %s" % (_short(path), why))
        seen.add(path)
        out.append(SnapFile(path, size, sha or None, sha1 or None, bool(lfs)))
    for f in out:
        segs = f.path.split("/")
        for i in range(1, len(segs)):
            if "/".join(segs[:i]) in seen:
                raise _refuse(where, "%s is listed as a file and as a folder of %s"
                              % ("/".join(segs[:i]), f.path))
        for suffix in (".part", ".part.json"):
            if f.path.endswith(suffix) and f.path[:-len(suffix)] in seen:
                raise _refuse(where, "%s collides with the partial download of %s (the snapshot writes "
                                     "<file>%s while it fetches)" % (f.path, f.path[:-len(suffix)], suffix))
    return out


def _pattern(p):
    return p + "*" if p.endswith("/") else p


def excluded_by(path, allow=None, ignore=None):
    """Why the patterns leave repo path out, in words, or None when they select it: it matches no allow
    pattern (when any is given), or it matches an ignore pattern.  Shell globs matched against the whole
    repo path with fnmatch (``*`` also crosses ``/``), a pattern ending in ``/`` meaning everything under
    that folder, as huggingface_hub's allow_patterns/ignore_patterns."""
    if allow and not any(fnmatch.fnmatchcase(path, _pattern(p)) for p in allow):
        return "it matches none of allow_patterns %s" % list(allow)
    for p in ignore or ():
        if fnmatch.fnmatchcase(path, _pattern(p)):
            return "ignore_patterns excludes it (%r)" % p
    return None


def select(files, allow=None, ignore=None):
    """The files the patterns select (excluded_by)."""
    return [f for f in files if excluded_by(f.path, allow, ignore) is None]


def content_id(files):
    """A ModelScope branch snapshot's name: ``ms-`` + sha1 over the sorted path, size and sha256 lines."""
    h = hashlib.sha1()
    for f in sorted(files, key=lambda x: x.path):
        line = "%s\0%d\0%s\n" % (f.path, f.size, f.sha256 or f.git_sha1)
        h.update(line.encode("utf-8", "surrogateescape"))
    return "ms-" + h.hexdigest()
