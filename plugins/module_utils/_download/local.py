# -*- coding: utf-8 -*-
# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
# PRIVATE to llmops.serving: it can change at any time; do not import it from other collections.
"""``file://`` URLs for model_download and gguf_info: a file on the node (an offline bundle's model, issue 33)
read through the same code as a download, so it gets the same verification (size, sha256, quarantine, the
sidecar record) and a verified model is never replaced by unverified bytes.

``LocalConnection`` answers like an HTTP server that honours ``Range``: HEAD and GET give ``Content-Length``
and ``Last-Modified`` (the file's mtime: a validator, so the download may resume), a ranged GET 206 with
``Content-Range``, a range past the end 416, a missing file 404, anything but a regular file (a link, a
directory, a FIFO) 403. No network is involved; the bytes are read in the caller's block size.

Plain Python 3.6, standard library only; importable without Ansible.
"""
from __future__ import absolute_import, division, print_function

import errno
import os
import re
import stat
from email.utils import formatdate
from urllib.parse import unquote, urlsplit

__metaclass__ = type

_RANGE = re.compile(r"bytes=(\d+)-(\d*)\Z")


class LocalResponse:
    """The subset of http.client.HTTPResponse the download code reads."""

    def __init__(self, status, headers, fd=None, pos=0, length=0):
        self.status = status
        self._headers = dict((k.lower(), v) for k, v in headers.items())
        self._fd = fd
        self._pos = pos
        self.length = length  # bytes left in the body

    def getheader(self, name, default=None):
        return self._headers.get(name.lower(), default)

    def readinto(self, buf):
        if self._fd is None or self.length <= 0:
            self.close()
            return 0
        want = min(len(buf), self.length)
        data = os.pread(self._fd, want, self._pos)  # os.preadv (no copy) is Python 3.7+
        n = len(data)
        buf[:n] = data
        self._pos += n
        self.length -= n
        if not n or self.length <= 0:
            self.close()
        return n

    def read(self, amt=None):
        want = self.length if amt is None else min(amt, self.length)
        buf = bytearray(max(want, 0))
        got = self.readinto(buf) if want > 0 else 0
        return bytes(buf[:got])

    def isclosed(self):
        return self._fd is None

    def close(self):
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class LocalConnection:
    """One ``file://`` "connection" (http.client.HTTPConnection's request/getresponse/close)."""

    sock = None

    def __init__(self):
        self._response = None

    def request(self, method, target, headers=None):
        self._response = answer(method, target, headers or {})

    def getresponse(self):
        resp, self._response = self._response, None
        return resp

    def close(self):
        if self._response is not None:
            self._response.close()
            self._response = None


def answer(method, target, headers):
    """The response to ``method`` on the local path of ``target`` (a URL's path, percent-encoded)."""
    path = unquote(urlsplit(target).path)
    if not os.path.isabs(path):
        return LocalResponse(404, {"Content-Length": "0"})
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        missing = e.errno in (errno.ENOENT, errno.ENOTDIR)
        return LocalResponse(404 if missing else 403, {"Content-Length": "0"})
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        return LocalResponse(403, {"Content-Length": "0"})
    size = st.st_size
    base = {"Content-Type": "application/octet-stream", "Accept-Ranges": "bytes",
            "Last-Modified": formatdate(st.st_mtime, usegmt=True)}
    m = _RANGE.match((headers.get("Range") or "").strip())
    if_range = headers.get("If-Range")
    if m and (if_range is None or if_range == base["Last-Modified"]):
        first = int(m.group(1))
        last = min(int(m.group(2)), size - 1) if m.group(2) else size - 1
        if first >= size or last < first:
            os.close(fd)
            return LocalResponse(416, dict(base, **{"Content-Range": "bytes */%d" % size,
                                                    "Content-Length": "0"}))
        length = last - first + 1
        hdrs = dict(base, **{"Content-Range": "bytes %d-%d/%d" % (first, last, size),
                             "Content-Length": str(length)})
        status, pos = 206, first
    else:
        length, pos, status = size, 0, 200
        hdrs = dict(base, **{"Content-Length": str(size)})
    if method == "HEAD":
        os.close(fd)
        return LocalResponse(status, hdrs)
    os.set_blocking(fd, True)
    return LocalResponse(status, hdrs, fd, pos, length)
