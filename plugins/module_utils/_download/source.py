# -*- coding: utf-8 -*-
# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
# PRIVATE to llmops.serving: it can change at any time; do not import it from other collections.
"""Where a model file comes from: the targets of a run (every part of a split GGUF set) and their
metadata: from one HEAD (Hugging Face: the hub's sha256, size and commit; a plain URL's size and
validators) or from the repo's file listing (ModelScope: ``Sha256``, ``Size`` and ``Revision`` per file).

ModelScope layout (as its SDK, modelscope.hub, speaks it): the listing is
``<endpoint>/api/v1/models/<org>/<name>/repo/files?Revision=<rev>&Recursive=true``, JSON
``{"Code": 200, "Data": {"Files": [{"Path", "Type": "blob"|"tree", "Size", "Sha256", "Revision"}]}}``;
the bytes come from ``<endpoint>/models/<org>/<name>/resolve/<rev>/<file>``; the default revision is
``master``.

Plain Python 3.6, standard library only; importable without Ansible.
"""
from __future__ import absolute_import, division, print_function

import json
import os
from urllib.parse import quote, urlencode, urljoin, urlsplit

from ansible_collections.llmops.serving.plugins.module_utils._download.http import (
    drain,
    read_bounded,
    refuse_html,
    request_deadline,
    status_error,
    with_retries,
)
from ansible_collections.llmops.serving.plugins.module_utils._download.messages import (
    DownloadError,
    redact_url,
)
from ansible_collections.llmops.serving.plugins.module_utils.validators import whole

__metaclass__ = type

SPLIT_RE = whole(r"(?P<stem>.+)-(?P<idx>\d{5})-of-(?P<total>\d{5})\.gguf")
HEX40 = whole(r"[0-9a-f]{40}")
HEX64 = whole(r"[0-9a-f]{64}")
# The largest file size there can be (a file offset, off_t): a claim above it is not a file's size.
MAX_FILE_SIZE = (1 << 63) - 1
# A ModelScope listing is read and parsed within these limits (a real entry is ~400 bytes and ~14 JSON
# values: about 40,000 files).  The bytes are read into one buffer; only the entries of the files asked for
# are kept while parsing, so memory stays near twice the listing's size whatever its shape.
LISTING_MAX_BYTES = 16 << 20
LISTING_MAX_VALUES = 1000000


def split_parts(filename):
    """``x-00001-of-00003.gguf`` -> all three part names; anything else -> [filename]."""
    m = SPLIT_RE.match(filename)
    if not m:
        return [filename]
    total = int(m.group("total"))
    if total < 1 or int(m.group("idx")) < 1 or int(m.group("idx")) > total:
        raise DownloadError("split GGUF name %r has an impossible part number; name the first part, "
                            "e.g. model-00001-of-00003.gguf" % filename)
    return ["%s-%05d-of-%05d.gguf" % (m.group("stem"), i, total) for i in range(1, total + 1)]


class Target:
    """One file to get: where from, what it must be, where it goes."""

    def __init__(self, name, url, final_path):
        self.name = name
        self.url = url  # what is fetched (pinned to the commit once known)
        self.final_path = final_path
        self.size = None
        self.sha256 = None
        self.commit = None
        self.etag = None
        self.last_modified = None
        self.source = {}
        # set by download.apply() when the file at final_path did not verify: {"sha256", "size"} of that file,
        # which stays in place until verified bytes replace it (then it goes to the quarantine slot)
        self.replaces = None

    @property
    def source_url(self):
        return redact_url(self.url)


def build_targets(o):
    dest = os.path.abspath(o["dest"])
    if o["url"]:
        name = os.path.basename(urlsplit(o["url"]).path)
        if name in ("", ".", ".."):
            raise DownloadError("cannot take a file name from url %s: its path must end with the file's name "
                                "(e.g. https://host/models/model.gguf)" % redact_url(o["url"]))
        t = Target(name, o["url"], os.path.join(dest, name))
        t.source = {"url": redact_url(o["url"])}
        return [t]
    names = split_parts(o["filename"])
    if len(names) > 1 and (o["sha256"] or o["size"]):
        raise DownloadError("sha256/size describe one file; a split GGUF set (%d parts) is verified "
                            "from the hub's per-part metadata, so leave them unset" % len(names))
    out = []
    for n in names:
        t = Target(n, None, os.path.join(dest, os.path.basename(n)))
        t.source = {"endpoint": redact_url(o["endpoint"]), "repo": o["repo"], "filename": n,
                    "revision": o["revision"]}
        if o.get("source") == "modelscope":  # Hugging Face records stay as they were
            t.source["hub"] = "modelscope"
        out.append(t)
    return out


def is_modelscope(o):
    return bool(o["repo"]) and o.get("source") == "modelscope"


def resolve_url(o, name, revision):
    """Where the bytes of repo file ``name`` at ``revision`` are: the hub's resolve URL."""
    repo_path = ("models/" + o["repo"]) if is_modelscope(o) else o["repo"]
    return "%s/%s/resolve/%s/%s" % (o["endpoint"], repo_path, quote(revision, safe=""), quote(name))


def listing_url(o, revision):
    """ModelScope's recursive file listing of the repo at ``revision``."""
    return "%s/api/v1/models/%s/repo/files?%s" % (
        o["endpoint"], o["repo"], urlencode([("Revision", revision), ("Recursive", "true")]))


def fetch_metadata(o, t, session, revision=None):
    """Fill t.size/sha256/commit/etag/url from a HEAD (Hugging Face or plain url) or the file listing
    (ModelScope)."""
    if is_modelscope(o):
        return _modelscope_metadata(o, t, session, revision or o["revision"])
    if o["url"]:
        url = o["url"]

        def head():
            with session.deadline(request_deadline(o["timeout"]), "HEAD %s" % t.name):
                resp, final = session.request("HEAD", url, auth_origin=o.get("auth_origin"))
                if resp.status >= 400:
                    raise status_error(resp, url, "HEAD")
                if 200 <= resp.status < 300:
                    refuse_html(resp, t.name, final)
                drain(resp)
                return resp
        resp = with_retries(head, o["retries"], o["retry_delay"], "metadata for %s" % t.name)
        cl = resp.getheader("Content-Length")
        t.size = int(o["size"]) if o["size"] else claimed_size(cl, t, o)
        t.sha256 = o["sha256"]
        t.etag = resp.getheader("ETag")
        t.last_modified = resp.getheader("Last-Modified")
        t.url = url
        return t
    url = resolve_url(o, t.name, revision or o["revision"])

    def head_hub():
        u = url
        with session.deadline(request_deadline(o["timeout"]), "HEAD %s" % t.name):
            for _hop in range(5):
                resp, _final = session.request("HEAD", u, follow=False, auth_origin=o.get("auth_origin"))
                if resp.status in (301, 302, 303, 307, 308):
                    drain(resp)
                    if resp.getheader("X-Linked-Etag") or resp.getheader("X-Repo-Commit"):
                        return resp
                    u = urljoin(u, resp.getheader("Location"))
                    continue
                if resp.status >= 400:
                    raise status_error(resp, u, "HEAD %s" % t.name)
                refuse_html(resp, t.name, u)
                drain(resp)
                return resp
        raise DownloadError("too many redirects resolving %s" % redact_url(url))
    resp = with_retries(head_hub, o["retries"], o["retry_delay"], "metadata for %s" % t.name)
    commit = (resp.getheader("X-Repo-Commit") or "").strip().lower()
    linked_etag = (resp.getheader("X-Linked-Etag") or "").strip()
    linked_size = resp.getheader("X-Linked-Size")
    etag = (resp.getheader("ETag") or "").strip()
    sha = linked_etag.replace("W/", "").strip('"').lower()
    t.commit = commit if HEX40.match(commit) else None
    t.sha256 = sha if HEX64.match(sha) else None
    if linked_size and linked_size.strip().isdigit():
        t.size = claimed_size(linked_size, t, o)
    else:
        t.size = claimed_size(resp.getheader("Content-Length"), t, o) if resp.status == 200 else None
    t.etag = etag or None
    _check_given(o, t)
    t.url = resolve_url(o, t.name, t.commit or revision or o["revision"])
    return t


def claimed_size(value, t, o):
    """The size a source states (a header's digits, a listing's integer), or None when it states none;
    DownloadError for a size no file can have (never a preallocation that fails with EINVAL)."""
    if isinstance(value, str):
        value = value.strip()
        if not value.isdigit():
            return None
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        return None
    if value > MAX_FILE_SIZE:
        raise DownloadError("%s: %s states an impossible size (%d bytes, more than any file can have): the "
                            "source is broken; nothing was written. Use another endpoint or mirror"
                            % (t.name, redact_url(o.get("endpoint") or o.get("url")) or "the source", value))
    return value


def _check_given(o, t):
    """The sha256/size options pin the content: they must agree with the hub's, and then win."""
    if o["sha256"]:
        if t.sha256 and t.sha256 != o["sha256"]:
            raise DownloadError("sha256 given (%s) differs from the hub's for %s at commit %s (%s): fix "
                                "the sha256 option or pin revision"
                                % (o["sha256"], t.name, t.commit, t.sha256))
        t.sha256 = o["sha256"]
    if o["size"]:
        if t.size is not None and t.size != int(o["size"]):
            raise DownloadError("size given (%s) differs from the hub's for %s (%s)"
                                % (o["size"], t.name, t.size))
        t.size = int(o["size"])


def _modelscope_metadata(o, t, session, revision):
    """ModelScope: sha256, size and the file's last commit from the listing (one GET per run and
    revision); the bytes come from the resolve URL of the revision asked for (the listing's per-file
    ``Revision`` is the commit that last changed the file, recorded as its commit)."""
    entry = _modelscope_files(o, session, revision).get(t.name)
    if entry is None:
        raise DownloadError("%s is not in the file listing of %s at revision %s on %s: check repo, filename "
                            "and revision (ModelScope's default branch is master)"
                            % (t.name, o["repo"], revision, redact_url(o["endpoint"])), status=404)
    sha = str(entry.get("Sha256") or "").strip().lower()
    commit = str(entry.get("Revision") or "").strip().lower()
    t.sha256 = sha if HEX64.match(sha) else None
    t.size = claimed_size(entry.get("Size"), t, o)
    t.commit = commit if HEX40.match(commit) else None
    t.etag = None
    _check_given(o, t)
    t.url = resolve_url(o, t.name, revision)
    return t


def _modelscope_files(o, session, revision):
    """{path: listing entry} of the files of a run (every part of a split set) at revision, from one listing
    read within the deadline and the limits above, cached on the session."""
    url = listing_url(o, revision)
    cache = getattr(session, "listings", None)
    if cache is not None and url in cache:
        return cache[url]
    where = "file listing of %s" % o["repo"]

    def get():
        with session.deadline(request_deadline(o["timeout"]), where):
            resp, final = session.request("GET", url, headers={"Accept": "application/json"},
                                          auth_origin=o.get("auth_origin"))
            if resp.status >= 400:
                raise status_error(resp, url, where)
            refuse_html(resp, where, final)
            cl = (resp.getheader("Content-Length") or "").strip()
            if cl.isdigit() and int(cl) > LISTING_MAX_BYTES:
                drain(resp, 0)  # never read it
                return None
            return read_bounded(resp, LISTING_MAX_BYTES)
    body = with_retries(get, o["retries"], o["retry_delay"], where)
    files = parse_listing(body, o, revision)
    if cache is not None:
        cache[url] = files
    return files


def parse_listing(body, o, revision, wanted=None):
    """The listing's file entries {Path: entry}: those of ``wanted`` (default: every part of o's filename;
    every file when o names none).  ``body`` None or longer than LISTING_MAX_BYTES, more than
    LISTING_MAX_VALUES JSON values, nesting deeper than the parser allows: DownloadError (not a listing)."""
    where = "the file listing of %s at %s from %s" % (o["repo"], revision, redact_url(o["endpoint"]))
    if body is None or len(body) > LISTING_MAX_BYTES:
        raise DownloadError("%s is larger than %d bytes: not a file listing (check endpoint)"
                            % (where, LISTING_MAX_BYTES))
    # every JSON value but the first follows a ',' or opens a container: this counts them all (and more)
    if body.count(b",") + body.count(b"[") + body.count(b"{") > LISTING_MAX_VALUES:
        raise DownloadError("%s has more than %d JSON values: not a file listing of a model repo (check "
                            "endpoint)" % (where, LISTING_MAX_VALUES))
    if wanted is None and o.get("filename"):
        wanted = split_parts(o["filename"])
    wanted = None if wanted is None else set(wanted)
    outer = [0]

    def keep(obj):
        # entries of other files are dropped as they are parsed; the two outer objects are kept
        path = obj.get("Path")
        if isinstance(path, str) and path:
            return obj if wanted is None or path in wanted else None
        if outer[0] < 2 and ("Data" in obj or "Files" in obj or "Code" in obj):
            outer[0] += 1
            return obj
        return None
    try:
        doc = json.loads(bytes(body).decode("utf-8"), object_hook=keep)
    except ValueError:
        raise DownloadError("%s is not JSON: not a file listing; check endpoint (a ModelScope hub or mirror)"
                            % where) from None
    except RecursionError:
        raise DownloadError("%s nests deeper than a JSON parser allows: not a file listing; check endpoint"
                            % where) from None
    if not isinstance(doc, dict):
        raise DownloadError("%s is not a JSON object" % where)
    if doc.get("Code") not in (200, "200"):
        raise DownloadError("%s answered Code %s: %s" % (where, doc.get("Code"), doc.get("Message") or "-"))
    data = doc.get("Data")
    files = data.get("Files") if isinstance(data, dict) else None
    if not isinstance(files, list):
        raise DownloadError("%s has no Data.Files list" % where)
    out = {}
    for entry in files:
        if isinstance(entry, dict) and entry.get("Type", "blob") != "tree" and entry.get("Path"):
            out[str(entry["Path"])] = entry
    return out
