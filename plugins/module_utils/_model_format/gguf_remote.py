# -*- coding: utf-8 -*-
# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
# PRIVATE to llmops.serving: it can change at any time; do not import it from other collections.
"""gguf_info for a GGUF that is not downloaded yet: its header (key/values and tensor table) read from a hub
or a plain URL with HTTP Range requests, so a plan can run before 19 GB are fetched.

The source options mean what they mean for model_download (repo/filename/revision/endpoint or url, token,
validate_certs, timeout, retries) and go through its code: download_options.normalize() (HF_ENDPOINT,
HF_TOKEN, token checks), download_source.fetch_metadata() (the hub's HEAD: size, sha256, commit pin) and
download_http.Session (the token only ever goes to the origin of endpoint/url, never to a redirect target
on another host). The header is parsed by gguf.read_structure_from() with the local reader's limits; the
bytes come in windows that start at 1 MiB and double as the parser needs more, so a header of H bytes costs
about log2(H) requests and at most 2H + 1 MiB, and the tensor data is never requested. A server that
ignores Range (200 with the whole body) is refused without reading past the first window. Each request
(the HEAD, the ModelScope listing, each window) must end within download_http.DEADLINE_FACTOR times
``timeout`` in all, body included: a server sending one byte per second meets that deadline, not only the
idle timeout.

Plain Python 3.6, standard library only; importable without Ansible.
"""
from __future__ import absolute_import, division, print_function

import os
import posixpath
import tempfile
from http import client as http_client
from urllib.parse import unquote, urlsplit, urlunsplit

from ansible_collections.llmops.serving.plugins.module_utils._download.http import (
    CountingSession,
    describe_error,
    drain,
    refuse_html,
    request_deadline,
    status_error,
    with_retries,
)
from ansible_collections.llmops.serving.plugins.module_utils._download.messages import (
    DownloadError,
    Retryable,
    redact_url,
    scrub,
)
from ansible_collections.llmops.serving.plugins.module_utils._download.options import (
    HEADER_READ_DEFAULTS,
    normalize,
)
from ansible_collections.llmops.serving.plugins.module_utils._download.source import (
    Target,
    fetch_metadata,
    is_modelscope,
    resolve_url,
)
from ansible_collections.llmops.serving.plugins.module_utils._model_format import gguf
from ansible_collections.llmops.serving.plugins.module_utils.validators import matches, whole

__metaclass__ = type

MIB = 1 << 20
FIRST_WINDOW = MIB
MAX_WINDOW = 64 * MIB

# The options of a remote source, with model_download's names (download_options.HEADER_READ_DEFAULTS: the
# defaults of a read of a few MB rather than model_download's).
REMOTE_OPTIONS = ("url", "url_query", "source", "repo", "filename", "revision", "endpoint", "token",
                  "validate_certs", "timeout", "retries", "retry_delay")

# normalize() validates a download destination; gguf_info writes nothing, this is never created or read.
NO_DEST = os.path.join(tempfile.gettempdir(), "llmops-gguf-info-writes-nothing")

CONTENT_RANGE = whole(r"bytes\s+(\d+)-(\d+)/(\d+|\*)")
NO_RANGES = ("%s answered a Range request with the whole file (HTTP 200, %s): the server does not support "
             "range requests; download the model first (model_download, then gguf_info on the local file) "
             "or use a mirror that does")
TOKEN_HINTS = {
    True: "The token was sent and refused, or its account lacks access: check the token (the model role "
          "passes model_hf_token, or the vault variable the model's token_var names) and accept the model's "
          "terms on the hub with that account.",
    False: "No token was sent: the repo is gated or private. Pass token (the model role: set model_hf_token, "
           "or token_var naming a vault variable) with read access, after accepting the model's terms.",
}


def is_remote(params):
    """Whether gguf_info's parameters name a remote source (url or repo) rather than a local path."""
    return bool(params.get("url") or params.get("repo"))


class RemoteGGUF(object):
    """A remote GGUF and the other parts of its split set, read header-only over one keep-alive session.

    read_structure() -> gguf.read_structure_from()'s result for the named file, its "path" being the URL
    without secrets; read_part(name) is the same for another part (check_split_set's read_part);
    report() -> {"url", "bytes_read", "requests", "size", "sha256", "commit"}. Raises DownloadError (HTTP,
    with what to do) or gguf.GGUFError (structure); neither ever contains the token. Call close()."""

    def __init__(self, params, first_window=FIRST_WINDOW, max_window=MAX_WINDOW):
        given = dict(HEADER_READ_DEFAULTS)
        given.update((k, params[k]) for k in REMOTE_OPTIONS if params.get(k) is not None)
        self.options = normalize(dict(given, dest=NO_DEST), reads_only=True)
        o = self.options
        self.token = o["token"]
        self.session = CountingSession(token=o["token"], timeout=o["timeout"],
                                       validate_certs=o["validate_certs"])
        self.first_window = first_window
        self.max_window = max(max_window, first_window)
        self.bytes_read = 0
        self.commit = None
        self.first = None
        self.limits = None

    def close(self):
        self.session.close()

    # -- naming ------------------------------------------------------------------------------------------
    def _file_url(self, filename):
        """The URL of filename as the user named it (revision as given): the name results and errors use."""
        o = self.options
        if o["url"]:
            p = urlsplit(o["url"])
            path = posixpath.join(posixpath.dirname(p.path), filename) if filename else p.path
            return urlunsplit((p.scheme, p.netloc, path, p.query, ""))
        return resolve_url(o, filename, o["revision"])

    def name_of(self, filename=None):
        return redact_url(self._file_url(filename or self._filename()))

    def _filename(self):
        o = self.options
        if o["url"]:
            return posixpath.basename(urlsplit(o["url"]).path)
        return o["filename"]

    # -- reading -----------------------------------------------------------------------------------------
    def _target(self, filename):
        """fetch_metadata() for filename: size, sha256 and (hub) the commit; other parts use that commit."""
        o = self.options
        t = Target(filename, None, None)
        if o["url"]:
            return fetch_metadata(dict(o, url=self._file_url(filename)), t, self.session)
        # ModelScope's listing gives each file's last commit, not the branch head: parts are read at the
        # revision as given there (their sha256 still comes from one listing).
        return fetch_metadata(o, t, self.session, revision=None if is_modelscope(o) else self.commit)

    def _read(self, filename, limits):
        name = self.name_of(filename)
        try:
            t = self._target(filename)
            source = _RangeFile(self, t, name, gguf._check_limits(limits)["max_metadata_bytes"])
            return t, gguf.read_structure_from(source, source.size, name, limits)
        except DownloadError as exc:
            raise self._explained(exc) from None

    def read_structure(self, limits=None):
        self.limits = limits
        t, structure = self._read(self._filename(), limits)
        self.first = t
        self.commit = t.commit
        return structure

    def read_part(self, name):
        """check_split_set's read_part: name is a part's URL as split_parts() derives it from the first's."""
        filename = posixpath.basename(urlsplit(name).path)
        if not self.options["url"]:  # resolve_url() quoted the hub file name
            filename = posixpath.join(posixpath.dirname(self.options["filename"]), unquote(filename))
        return self._read(filename, self.limits)[1]

    def report(self):
        t = self.first
        return {"url": self.name_of(), "bytes_read": self.bytes_read, "requests": self.session.requests,
                "size": t.size if t else None, "sha256": t.sha256 if t else None, "commit": self.commit}

    def _explained(self, exc):
        status = exc.result.get("status")
        msg = exc.msg
        if status in (401, 403):
            msg = "%s %s" % (msg, TOKEN_HINTS[bool(self.token)])
        elif status is None and "giving up" in msg:
            msg = ("%s (check the network, proxy and endpoint from this node, or raise timeout, now %d s)"
                   % (msg, self.options["timeout"]))
        return DownloadError(scrub(msg, self.token), **exc.result)

    def inspect(self, limits=None, include_kv=False, check_split=True):
        """Like gguf_info on a local file: summarize() of the named file; for a split set, every part's header
        read, split_set added and the tensor figures made the whole set's (gguf.add_split_set()); plus
        "remote": report()."""
        structure = self.read_structure(limits)
        result = gguf.summarize(structure, include_kv=include_kv)
        if check_split and result["split"]:
            gguf.add_split_set(result, structure, limits, read_part=self.read_part)
        result["remote"] = self.report()
        return result


def inspect_remote(params, limits=None, include_kv=False, check_split=True, first_window=FIRST_WINDOW,
                   max_window=MAX_WINDOW):
    """gguf_info's result for a remote GGUF: params are gguf_info's remote options (url, or repo + filename
    [+ revision, endpoint]; token, validate_certs, timeout, retries). Raises DownloadError or GGUFError
    (ValueError for bad limits); messages and results never contain the token."""
    remote = RemoteGGUF(params, first_window=first_window, max_window=max_window)
    try:
        return remote.inspect(limits, include_kv=include_kv, check_split=check_split)
    except gguf.GGUFError as exc:
        raise gguf.GGUFError(scrub(exc.message, remote.token), exc.offset, scrub(exc.path, remote.token)) \
            from None
    finally:
        remote.close()


class _RangeFile(object):
    """The seek()/read() source gguf.read_structure_from() reads: one cached block of the file, refilled
    with a Range request when a read leaves it. Each request asks for the next window (doubling from
    first_window to max_window, never past the metadata limit unless the parser needs it)."""

    def __init__(self, remote, target, name, limit_end):
        self.remote = remote
        self.url = target.url
        self.name = name
        self.limit_end = limit_end
        self.window = remote.first_window
        self.size = None
        self.pos = 0
        self.block = b""
        self.block_start = 0
        self._fill(0, 0)
        if self.size is None:
            self.size = target.size
        if self.size is None:
            raise DownloadError("%s: the server states no file size (no Content-Range total, no "
                                "Content-Length on HEAD), so the file cannot be checked; download it first"
                                % name)

    def seek(self, pos):
        self.pos = pos

    def read(self, n):
        end = min(self.pos + n, self.size)
        if self.pos < self.block_start or end > self.block_start + len(self.block):
            self._fill(self.pos, end)
        rel = self.pos - self.block_start
        data = self.block[rel:rel + end - self.pos]
        self.pos += len(data)
        return data

    def _fill(self, start, need_end):
        block_end = self.block_start + len(self.block)
        keep = self.block[start - self.block_start:] if self.block_start <= start < block_end else b""
        fetch_from = start + len(keep)
        end = max(need_end, min(fetch_from + self.window, self.limit_end))
        if self.size is not None:
            end = min(end, self.size)
        end = max(end, fetch_from + 1)
        data = with_retries(lambda: self._get(fetch_from, end), self.remote.options["retries"],
                            self.remote.options["retry_delay"], "reading the header of %s" % self.name)
        self.block = keep + data
        self.block_start = start
        self.window = min(self.window * 2, self.remote.max_window)

    def _get(self, start, end):
        """Bytes [start, end) (fewer only at the end of the file) from one ranged GET."""
        session = self.remote.session
        with session.deadline(request_deadline(self.remote.options["timeout"]), "GET %s" % self.name):
            resp, final = session.request("GET", self.url,
                                          headers={"Range": "bytes=%d-%d" % (start, end - 1)},
                                          auth_origin=self.remote.options["auth_origin"])
            try:
                data = self._body(resp, start, end)
            except (http_client.HTTPException, OSError) as exc:
                session.close()
                raise Retryable("GET %s: %s" % (self.name, describe_error(exc))) from None
        self.url = final  # later windows go straight to where the hub redirected (its CDN), one hop each
        return data

    def _body(self, resp, start, end):
        if resp.status == 416 and start == 0:
            m = matches(r"bytes\s+\*/(\d+)", resp.getheader("Content-Range") or "")
            drain(resp)
            if m:
                self.size = int(m.group(1))
                return b""
        if resp.status >= 400:
            raise status_error(resp, self.name, "GET %s" % self.name)
        if resp.status not in (200, 206):
            raise status_error(resp, self.name, "GET %s" % self.name)
        refuse_html(resp, self.name, self.name)
        if resp.status == 200:
            return self._whole_body(resp, start, end)
        m = CONTENT_RANGE.match((resp.getheader("Content-Range") or "").strip())
        if not m or int(m.group(1)) != start:
            self.remote.session.close()
            raise DownloadError("%s answered bytes=%d-%d with Content-Range %r: not the range asked for; use "
                                "a mirror with working Range support or download the model first"
                                % (self.name, start, end - 1, resp.getheader("Content-Range")))
        total = None if m.group(3) == "*" else int(m.group(3))
        if self.size is None:
            self.size = total
        elif total is not None and total != self.size:
            self.remote.session.close()
            raise DownloadError("%s changed while its header was read (size %d, now %d): run again"
                                % (self.name, self.size, total))
        want = min(end, self.size) - start if self.size is not None else end - start
        data = self._take(resp, want)
        if len(data) < want:
            raise Retryable("GET %s: the answer ended after %d of %d bytes" % (self.name, len(data), want))
        return data

    def _whole_body(self, resp, start, end):
        """A 200 to a ranged GET: accepted only when the whole file fits in the window asked for."""
        length = resp.getheader("Content-Length")
        window = end - start
        if start > 0 or (length and length.isdigit() and int(length) > window):
            self.remote.session.close()  # never read the body: it may be 19 GB
            raise DownloadError(NO_RANGES % (self.name, "Content-Length %s" % length))
        data = self._take(resp, window + 1)
        if len(data) > window:
            self.remote.session.close()
            raise DownloadError(NO_RANGES % (self.name, "more than %d bytes" % window))
        self.size = len(data)
        return data

    def _take(self, resp, n):
        """At most n bytes of the body; a longer body is left unread and its connection dropped."""
        parts = []
        got = 0
        while got < n:
            chunk = resp.read(min(n - got, MIB))
            if not chunk:
                break
            parts.append(chunk)
            got += len(chunk)
        self.remote.bytes_read += got
        if got >= n and not resp.isclosed():
            self.remote.session.close()
        return b"".join(parts)
