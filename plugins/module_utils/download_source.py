# -*- coding: utf-8 -*-
# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Where a model file comes from: the targets of a run (every part of a split GGUF set) and their
metadata from one HEAD (the hub's sha256, size and commit, or a plain URL's size and validators).

Plain Python 3.6, standard library only; importable without Ansible.
"""
from __future__ import absolute_import, division, print_function

import os
import re
from urllib.parse import quote, urljoin, urlsplit

from ansible_collections.llmops.serving.plugins.module_utils.download_http import (
    refuse_html,
    status_error,
    with_retries,
)
from ansible_collections.llmops.serving.plugins.module_utils.download_messages import (
    DownloadError,
    redact_url,
)

__metaclass__ = type

SPLIT_RE = re.compile(r"^(?P<stem>.+)-(?P<idx>\d{5})-of-(?P<total>\d{5})\.gguf$")
HEX40 = re.compile(r"^[0-9a-f]{40}$")
HEX64 = re.compile(r"^[0-9a-f]{64}$")


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

    @property
    def source_url(self):
        return redact_url(self.url)


def build_targets(o):
    dest = os.path.abspath(o["dest"])
    if o["url"]:
        name = os.path.basename(urlsplit(o["url"]).path)
        if not name:
            raise DownloadError("cannot take a file name from url %s" % redact_url(o["url"]))
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
        out.append(t)
    return out


def resolve_url(o, name, revision):
    return "%s/%s/resolve/%s/%s" % (o["endpoint"], o["repo"], quote(revision, safe=""), quote(name))


def fetch_metadata(o, t, session, revision=None):
    """Fill t.size/sha256/commit/etag/url from a HEAD (hub or plain url)."""
    if o["url"]:
        url = o["url"]

        def head():
            resp, final = session.request("HEAD", url, auth_origin=o.get("auth_origin"))
            if resp.status >= 400:
                raise status_error(resp, url, "HEAD")
            if 200 <= resp.status < 300:
                refuse_html(resp, t.name, final)
            resp.read()
            return resp
        resp = with_retries(head, o["retries"], o["retry_delay"], "metadata for %s" % t.name)
        cl = resp.getheader("Content-Length")
        t.size = int(o["size"]) if o["size"] else (int(cl) if cl and cl.isdigit() else None)
        t.sha256 = o["sha256"]
        t.etag = resp.getheader("ETag")
        t.last_modified = resp.getheader("Last-Modified")
        t.url = url
        return t
    url = resolve_url(o, t.name, revision or o["revision"])

    def head_hub():
        u = url
        for _hop in range(5):
            resp, _final = session.request("HEAD", u, follow=False, auth_origin=o.get("auth_origin"))
            if resp.status in (301, 302, 303, 307, 308):
                resp.read()
                if resp.getheader("X-Linked-Etag") or resp.getheader("X-Repo-Commit"):
                    return resp
                u = urljoin(u, resp.getheader("Location"))
                continue
            if resp.status >= 400:
                raise status_error(resp, u, "HEAD %s" % t.name)
            refuse_html(resp, t.name, u)
            resp.read()
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
    if linked_size and linked_size.isdigit():
        t.size = int(linked_size)
    else:
        cl = resp.getheader("Content-Length")
        t.size = int(cl) if cl and cl.isdigit() and resp.status == 200 else None
    t.etag = etag or None
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
    t.url = resolve_url(o, t.name, t.commit or revision or o["revision"])
    return t
