# -*- coding: utf-8 -*-
# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Verified, resumable, parallel model downloads (logic of ``llmops.serving.model_download``).

Plain Python 3.6, standard library only; importable and testable without Ansible.

How a file gets to its final path
---------------------------------
* Metadata first: a HEAD on the hub's resolve URL gives the sha256 (``X-Linked-Etag``), the size
  (``X-Linked-Size``) and the commit the revision resolved to (``X-Repo-Commit``).  Every byte is then
  fetched from ``/resolve/<commit>/`` so a moving branch cannot change the model mid-way.
* Bytes go to ``<file>.part`` (preallocated), progress to ``<file>.part.json`` (the byte ranges already
  written, the CDN's ETag for If-Range).  An interrupted download (drop, kill, disk full) resumes by
  asking only for the missing ranges.
* Parallel ranges: the file is cut into chunks; ``connections`` threads fetch chunks with ``Range`` and
  ``os.pwrite`` them into the ``.part``.  The sha256 is computed while data arrives: the thread writing
  at the hashed frontier feeds its buffer straight into the hash; a hasher thread reads back (from the
  page cache, just written) the ranges that other threads finished ahead of the frontier, in order.
  So every byte is hashed exactly once and the hash is final the moment the last byte lands.  On
  resume the hash state is rebuilt by re-reading the already-present prefix once (hashlib state
  cannot be persisted portably); this runs in the hasher thread while the missing ranges download.
* A server that ignores Range (200) or refuses it (416) makes the download restart from zero on one
  connection, honestly (``downloaded_bytes`` counts every byte received).
* Verification: size and sha256 must match, else the bytes move to ``<file>.corrupt-<UTC time>`` and
  the run fails loudly (expected vs got).  Only then: fsync, atomic rename to the final path, fsync
  of the directory, and a sidecar record ``.<file>.llmops.json`` (size, mtime_ns, inode, sha256,
  commit, source) that lets the next run skip hashing when size/mtime/inode still match.
* The ``.part.json`` ranges are written about once a second, each time after an ``fdatasync`` of the
  ``.part``: the ranges it claims are on disk even after a power loss (and the flush is spread over
  the download instead of piling up in the final fsync).  Whatever slips through is caught by the
  final sha256 check (quarantine, then a clean re-download).

Hostile surroundings (the module runs as root in a directory other users may write to)
------------------------------------------------------------------------------------
* The token goes only to the exact origin (scheme, host and port) of the endpoint (of ``url`` for a
  plain URL), on every hop of every phase: never to a CDN, another port of the same host, or plain
  http after an https start.  A token with whitespace or control characters (a vault file's trailing
  newline) is refused before any request, without echoing it; every message and result is scrubbed of
  the token in raw, escaped (repr/JSON) and URL-encoded form.
* Paths the module owns: the final path, ``<file>.part``, ``<file>.part.json``, the sidecar
  ``.<file>.llmops.json`` and the lock ``.<file>.llmops.lock``.  Anything there that is not a regular
  file (a symlink, FIFO, socket, device, directory; for files written in place also a hard link) is
  refused with a message naming the path ("remove it"); files are opened with ``O_NOFOLLOW`` and
  ``O_NONBLOCK`` and checked with ``fstat`` before use, so nothing follows a planted link or blocks
  on a FIFO.  JSON records are written to ``tempfile.mkstemp`` names in the same directory, then
  renamed.
* One run per destination file: ``fcntl.flock`` on ``.<file>.llmops.lock`` (holder's pid inside).
  A second run waits up to ``lock_timeout`` seconds, then finds the finished file through the sidecar.
* Content that is not what it claims fails: an HTML page (a mirror's login or error page) for a
  non-HTML file, a body whose length differs from the expected size, and, for a plain URL without a
  validator (no strong ETag, no Last-Modified), bytes of two versions (no resume, no ranges without a
  sha256; it restarts from zero).

What the sidecar fast path can and cannot detect
-------------------------------------------------
The record identifies the content by size, mtime_ns, inode and ctime_ns.  Writing the file, ``touch``,
``utime`` (a restored mtime), chmod/chown or replacing it all change ctime, which a user cannot set:
such a file is hashed again.  When the hub's HEAD gives a sha256, a record that disagrees with it is
not trusted either (the file is hashed).  It cannot detect: silent corruption below the filesystem
(bit rot), changes by someone who can reset the clock or write the block device, and a record forged
by someone who can write the directory in the cases where no HEAD vouches for it (a pinned commit
re-run, which makes no request; an unreachable hub; a moved branch kept with update=false; a file
the hub gives no sha256 for).  ``force_verify`` re-hashes; passing ``sha256`` pins the content.
"""
from __future__ import absolute_import, division, print_function

import calendar
import errno
import fcntl
import hashlib
import json
import os
import re
import socket
import ssl
import stat
import sys
import tempfile
import threading
import time
from email.utils import parsedate
from http import client as http_client
from urllib.parse import quote, quote_plus, urljoin, urlsplit, urlunsplit
from urllib.request import getproxies, proxy_bypass

__metaclass__ = type

MIB = 1 << 20
DEFAULT_ENDPOINT = "https://huggingface.co"
SPLIT_RE = re.compile(r"^(?P<stem>.+)-(?P<idx>\d{5})-of-(?P<total>\d{5})\.gguf$")
HEX40 = re.compile(r"^[0-9a-f]{40}$")
HEX64 = re.compile(r"^[0-9a-f]{64}$")
SIDECAR_VERSION = 1
STATE_VERSION = 1
BUF_SIZE = 256 * 1024
USER_AGENT = "llmops.serving-model_download/1"
RETRY_STATUSES = (429, 500, 502, 503, 504)
LOOPBACK = ("127.0.0.1", "localhost", "::1")
BAD_TOKEN_CHARS = re.compile(r"[\s\x00-\x1f\x7f]")
HTML_TYPES = ("text/html", "application/xhtml+xml")
HTML_NAMES = (".html", ".htm", ".xhtml")
MASK = "********"
MAX_JSON = 16 * MIB

DEFAULTS = {
    "repo": None, "filename": None, "revision": "main", "endpoint": None, "token": None, "url": None,
    "dest": None, "sha256": None, "size": None, "connections": 8, "parallel_min_size": 64 * MIB,
    "update": False, "force_verify": False, "progress_file": None, "timeout": 30, "retries": 8,
    "retry_delay": 2.0, "validate_certs": True, "free_space_margin": 256 * MIB, "lock_timeout": 600,
}


class DownloadError(Exception):
    """A failure with a message that says what to do; ``result`` holds extra return values."""

    def __init__(self, msg, **result):
        Exception.__init__(self, msg)
        self.msg = msg
        self.result = result


class _Retryable(Exception):
    def __init__(self, msg, retry_after=None):
        Exception.__init__(self, msg)
        self.retry_after = retry_after


class _Restart(Exception):
    """The server will not do ranges (200 to a ranged GET, or 416): start over on one connection."""


def human(n):
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return ("%d %s" % (n, unit)) if unit == "B" else ("%.1f %s" % (n, unit))
        n /= 1024.0


def redact_url(url):
    """The URL without userinfo and query string (signed CDN URLs carry credentials there)."""
    if not url:
        return url
    p = urlsplit(url)
    netloc = p.netloc.rsplit("@", 1)[-1]
    return urlunsplit((p.scheme, netloc, p.path, "", ""))


def parse_retry_after(value):
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    t = parsedate(value)
    if t is None:
        return None
    return max(0.0, calendar.timegm(t) - time.time())


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


def sidecar_path(final_path):
    d, b = os.path.split(final_path)
    return os.path.join(d, "." + b + ".llmops.json")


def lock_path(final_path):
    d, b = os.path.split(final_path)
    return os.path.join(d, "." + b + ".llmops.lock")


# ---------------------------------------------------------------------------------------------
# Files: never follow a link, never open a FIFO/socket/device, temporary names nobody can guess
# ---------------------------------------------------------------------------------------------
O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


def describe_inode(st):
    """What a non-regular (or multiply linked) inode is, in words."""
    m = st.st_mode
    for test, words in ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                        (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                        (stat.S_ISBLK, "a block device"), (stat.S_ISDIR, "a directory")):
        if test(m):
            return words
    if stat.S_ISREG(m) and st.st_nlink > 1:
        return "a hard link (one of %d names of a file)" % st.st_nlink
    return "not a regular file"


def foreign_error(path, st):
    target = ""
    if stat.S_ISLNK(st.st_mode):
        try:
            target = " (to %s)" % os.readlink(path)
        except OSError:
            pass
    return DownloadError(
        "%s is %s%s, not a file model_download wrote: refusing to follow, open or replace it (a link or "
        "pipe planted there could make root write elsewhere or hang). Remove it (after checking who put it "
        "there) and rerun" % (path, describe_inode(st), target), foreign_path=path)


def check_own_path(path, single_link=False):
    """lstat ``path``: None when absent, its stat when a regular file; else raise DownloadError.
    ``single_link``: a file written in place (``.part``, lock) must not be a hard link either."""
    try:
        st = os.lstat(path)
    except OSError as e:
        if e.errno in (errno.ENOENT, errno.ENOTDIR):
            return None
        raise DownloadError("cannot inspect %s: %s" % (path, e)) from None
    if not stat.S_ISREG(st.st_mode) or (single_link and st.st_nlink != 1):
        raise foreign_error(path, st)
    return st


def _clear_nonblock(fd):
    flags = fcntl.fcntl(fd, fcntl.F_GETFL)
    fcntl.fcntl(fd, fcntl.F_SETFL, flags & ~os.O_NONBLOCK)


def open_regular(path, flags, mode=0o644, single_link=False):
    """os.open without following a symlink (O_NOFOLLOW) and without blocking on a FIFO (O_NONBLOCK);
    anything but a regular file (and a hard link, with ``single_link``) raises DownloadError."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | O_CLOEXEC, mode)
    except OSError as e:
        check_own_path(path, single_link)  # a link, FIFO, socket...: the clear message
        raise DownloadError("cannot open %s: %s" % (path, e), errno=e.errno) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or (single_link and st.st_nlink != 1):
            raise foreign_error(path, st)
        _clear_nonblock(fd)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _write_atomic(path, text, mode=0o644, owner=None):
    """Write ``text`` to a fresh, unguessable file next to ``path`` (mkstemp: O_EXCL, never through a
    link), set its mode (and owner), then rename it over ``path`` (a rename replaces a link, never
    follows it)."""
    d, b = os.path.split(path)
    fd, tmp = tempfile.mkstemp(prefix="." + b.lstrip(".") + ".", suffix=".tmp", dir=d or ".")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fchmod(f.fileno(), mode)
            if owner is not None:
                try:
                    os.fchown(f.fileno(), owner[0], owner[1])
                except OSError:
                    pass
        os.rename(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _write_json_atomic(path, data, mode=0o644, owner=None):
    _write_atomic(path, json.dumps(data, sort_keys=True), mode, owner)


def _read_json(path):
    """The JSON object in ``path``; None when absent, unreadable, not a regular file (never follows a
    link, never blocks on a FIFO) or not an object."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_JSON:
            return None
        _clear_nonblock(fd)
        raw = os.read(fd, MAX_JSON + 1)
        data = json.loads(raw.decode("utf-8"))
        return data if isinstance(data, dict) else None
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)


def fsync_dir(path):
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def quarantine(path):
    q = "%s.corrupt-%s" % (path, time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()))
    n = 1
    while os.path.lexists(q):
        q = "%s.corrupt-%s-%d" % (path, time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()), n)
        n += 1
    os.rename(path, q)
    return q


def hash_file(path, progress=None, bufsize=8 * MIB, nofollow=False):
    """sha256 hex of the regular file at path.  A FIFO, socket or device raises OSError (it would block
    or never end); with ``nofollow`` a symlink does too."""
    flags = os.O_RDONLY | os.O_NONBLOCK | O_CLOEXEC | (os.O_NOFOLLOW if nofollow else 0)
    fd = os.open(path, flags)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file (a FIFO, socket or device): refusing to read it",
                          path)
        _clear_nonblock(fd)
    except BaseException:
        os.close(fd)
        raise
    h = hashlib.sha256()
    buf = bytearray(bufsize)
    mv = memoryview(buf)
    with os.fdopen(fd, "rb", buffering=0) as f:
        while True:
            n = f.readinto(buf)
            if not n:
                break
            h.update(mv[:n])
            if progress is not None:
                progress.add(n)
    return h.hexdigest()


class DestLock:
    """One run per destination file: ``fcntl.flock`` on ``.<file>.llmops.lock`` (opened O_NOFOLLOW, a
    regular file with one link), the holder's pid inside.  The holder removes the file before it lets
    go; a waiter that then gets the lock on the removed file notices (inode changed) and takes the new
    one, so the lock always lives on the file at the path."""

    def __init__(self, path, fd):
        self.path = path
        self.fd = fd

    @classmethod
    def acquire(cls, path, timeout, what, progress=None, deadline=None):
        deadline = time.monotonic() + timeout if deadline is None else deadline
        waiting = False
        while True:
            check_own_path(path, single_link=True)
            fd = open_regular(path, os.O_RDWR | os.O_CREAT, 0o644, single_link=True)
            try:
                while True:
                    try:
                        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                        break
                    except OSError as e:
                        if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                            raise
                    if time.monotonic() >= deadline:
                        raise DownloadError(
                            "another model_download run (pid %s) holds %s: it is fetching %s into the same "
                            "place (two plays, or a retried job). Waited %s s (lock_timeout); let it finish "
                            "and rerun (this run then finds the verified file), or raise lock_timeout"
                            % (_lock_holder(fd), path, what, timeout), lock=path)
                    if progress is not None and not waiting:
                        waiting = True
                        progress.set(state="waiting", file=what)
                    time.sleep(0.1)
                try:
                    now = os.lstat(path)
                except OSError:
                    now = None
                mine = os.fstat(fd)
                if now is None or (now.st_dev, now.st_ino) != (mine.st_dev, mine.st_ino):
                    os.close(fd)  # the previous holder removed it while letting go: lock the new one
                    continue
                os.ftruncate(fd, 0)
                os.write(fd, ("%d\n" % os.getpid()).encode())  # offset 0: never written before
                return cls(path, fd)
            except BaseException:
                try:
                    os.close(fd)
                except OSError:
                    pass
                raise

    def release(self):
        if self.fd is None:
            return
        try:
            now = os.lstat(self.path)
            mine = os.fstat(self.fd)
            if (now.st_dev, now.st_ino) == (mine.st_dev, mine.st_ino):
                os.unlink(self.path)
        except OSError:
            pass
        os.close(self.fd)
        self.fd = None


def _lock_holder(fd):
    try:
        text = os.pread(fd, 64, 0).decode("ascii", "replace").strip()
    except OSError:
        return "unknown"
    return text if text.isdigit() else "unknown"


# ---------------------------------------------------------------------------------------------
# Byte ranges
# ---------------------------------------------------------------------------------------------
class Ranges:
    """A set of half-open byte intervals [a, b), kept merged and sorted."""

    def __init__(self, items=()):
        self.items = []
        for a, b in items:
            self.add(int(a), int(b))

    def add(self, a, b):
        if b <= a:
            return
        out = []
        placed = False
        for x, y in self.items:
            if y < a:
                out.append([x, y])
            elif b < x:
                if not placed:
                    out.append([a, b])
                    placed = True
                out.append([x, y])
            else:
                a, b = min(a, x), max(b, y)
        if not placed:
            out.append([a, b])
        out.sort()
        self.items = out

    def prefix_end(self):
        if self.items and self.items[0][0] == 0:
            return self.items[0][1]
        return 0

    def total(self):
        return sum(b - a for a, b in self.items)

    def missing(self, size):
        gaps, pos = [], 0
        for a, b in self.items:
            if a > pos:
                gaps.append((pos, min(a, size)))
            pos = max(pos, b)
        if pos < size:
            gaps.append((pos, size))
        return [(a, b) for a, b in gaps if b > a]

    def clip(self, size):
        return Ranges([(a, min(b, size)) for a, b in self.items if a < size])


# ---------------------------------------------------------------------------------------------
# HTTP
# ---------------------------------------------------------------------------------------------
class Session:
    """One thread's keep-alive connections; follows redirects, drops Authorization off-origin."""

    def __init__(self, token=None, timeout=30, validate_certs=True):
        self.token = token
        self.timeout = timeout
        self.validate_certs = validate_certs
        self._conns = {}

    def close(self):
        for c in self._conns.values():
            try:
                c.close()
            except Exception:
                pass
        self._conns = {}

    def _conn(self, scheme, netloc, fresh=False):
        key = (scheme, netloc)
        c = self._conns.get(key)
        if c is not None and not fresh:
            return c, True
        if c is not None:
            c.close()
        host = netloc.rsplit("@", 1)[-1]
        hostname = urlsplit("%s://%s" % (scheme, host)).hostname or ""
        proxy = None
        if hostname not in LOOPBACK and not proxy_bypass(hostname):
            proxy = getproxies().get(scheme)
        if scheme == "https":
            ctx = ssl.create_default_context()
            if not self.validate_certs:
                ctx.check_hostname = False
                ctx.verify_mode = ssl.CERT_NONE
            if proxy:
                p = urlsplit(proxy)
                c = http_client.HTTPSConnection(p.hostname, p.port or 8080, timeout=self.timeout, context=ctx)
                c.set_tunnel(host)
            else:
                c = http_client.HTTPSConnection(host, timeout=self.timeout, context=ctx)
        elif scheme == "http":
            if proxy:
                p = urlsplit(proxy)
                c = http_client.HTTPConnection(p.hostname, p.port or 8080, timeout=self.timeout)
                c._llmops_proxy = True
            else:
                c = http_client.HTTPConnection(host, timeout=self.timeout)
        else:
            raise DownloadError("unsupported URL scheme %r: use http or https" % scheme)
        self._conns[key] = c
        return c, False

    def request(self, method, url, headers=None, auth_origin=None, follow=True):
        """Return (response, final_url).  The caller reads or closes the response.

        The token goes only to ``auth_origin`` (scheme, host, port; default: the URL's own origin),
        on every hop: never to a redirect target on another host (a CDN), another port, or plain http
        after https."""
        origin = auth_origin or url_origin(url)
        for _hop in range(10):
            p = urlsplit(url)
            hdrs = {"User-Agent": USER_AGENT, "Accept-Encoding": "identity"}
            hdrs.update(headers or {})
            if self.token and url_origin(url) == origin:
                hdrs["Authorization"] = "Bearer " + self.token
            path = urlunsplit(("", "", p.path or "/", p.query, ""))
            resp = None
            for attempt in (0, 1):
                conn, reused = self._conn(p.scheme, p.netloc, fresh=attempt > 0)
                target = url if getattr(conn, "_llmops_proxy", False) else path
                try:
                    conn.request(method, target, headers=hdrs)
                    resp = conn.getresponse()
                    break
                except (http_client.HTTPException, OSError) as e:
                    conn.close()
                    self._conns.pop((p.scheme, p.netloc), None)
                    if reused and attempt == 0:
                        continue  # a stale keep-alive connection: one fresh try
                    raise _Retryable("%s %s: %s" % (method, redact_url(url), _err(e))) from None
            if follow and resp.status in (301, 302, 303, 307, 308) and resp.getheader("Location"):
                resp.read()
                url = urljoin(url, resp.getheader("Location"))
                continue
            return resp, url
        raise DownloadError("too many redirects from %s" % redact_url(url))


def url_origin(url):
    """(scheme, host, port) of a URL, the port made explicit: what the token is bound to."""
    p = urlsplit(url or "")
    scheme = (p.scheme or "").lower()
    try:
        port = p.port
    except ValueError:
        port = None
    if port is None:
        port = {"http": 80, "https": 443}.get(scheme)
    return (scheme, (p.hostname or "").lower(), port)


def refuse_html(resp, name, url):
    """A 2xx text/html answer for a file that is not HTML: the mirror's login or error page."""
    ctype = (resp.getheader("Content-Type") or "").split(";")[0].strip().lower()
    if ctype in HTML_TYPES and not name.lower().endswith(HTML_NAMES):
        try:
            resp.close()
        except Exception:
            pass
        raise DownloadError(
            "%s: %s answered %d with an HTML page (Content-Type %s) instead of the file: most likely the "
            "mirror's login, captcha or error page. Check endpoint/url, the token and that the mirror "
            "serves this repo; nothing was written to the final path"
            % (name, redact_url(url), resp.status, ctype), status=resp.status)


def _err(e):
    if isinstance(e, socket.timeout):
        return "timed out (no data within the timeout)"
    return "%s: %s" % (type(e).__name__, e) if str(e) else type(e).__name__


def _status_error(resp, url, what):
    code = resp.status
    ra = parse_retry_after(resp.getheader("Retry-After"))
    try:
        resp.read()
    except Exception:
        pass
    if code in RETRY_STATUSES:
        return _Retryable("%s: HTTP %d from %s" % (what, code, redact_url(url)), retry_after=ra)
    if code in (401, 403):
        return DownloadError(
            "%s: HTTP %d from %s: the repo is gated or private, or the token lacks access. Accept the "
            "model's terms on the hub and pass a token with read access (option token, from Vault)."
            % (what, code, redact_url(url)), status=code)
    if code == 404:
        kind = resp.getheader("X-Error-Code") or "not found"
        return DownloadError("%s: HTTP 404 (%s) from %s: check repo, filename and revision (and endpoint)"
                             % (what, kind, redact_url(url)), status=code)
    return DownloadError("%s: unexpected HTTP %d from %s" % (what, code, redact_url(url)), status=code)


def with_retries(fn, retries, delay, what, sleep=time.sleep):
    failures = 0
    while True:
        try:
            return fn()
        except _Retryable as e:
            failures += 1
            if failures > retries:
                raise DownloadError("%s: giving up after %d retries: %s" % (what, retries, e)) from None
            sleep(backoff(failures, delay, e.retry_after))


def backoff(failures, delay, retry_after=None):
    if retry_after is not None:
        return min(float(retry_after), 300.0)
    return min(delay * (2 ** (failures - 1)), 60.0)


# ---------------------------------------------------------------------------------------------
# Targets
# ---------------------------------------------------------------------------------------------
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


def normalize(params):
    o = dict(DEFAULTS)
    o.update(dict((k, v) for k, v in params.items() if v is not None))
    if not o["dest"]:
        raise DownloadError("dest is required: the directory that receives the model file(s)")
    if os.path.isfile(o["dest"]) or o["dest"].endswith(".gguf"):
        raise DownloadError("dest must be the directory that receives the file(s), got %r; the file name "
                            "comes from filename (or url)" % o["dest"])
    if bool(o["url"]) == bool(o["repo"]):
        raise DownloadError("give either url, or repo and filename (a Hugging Face style source)")
    if o["repo"]:
        if not o["filename"]:
            raise DownloadError("filename is required with repo (e.g. Qwen3.6-27B-UD-Q5_K_XL.gguf)")
        if o["repo"].count("/") != 1 or o["repo"].startswith("/") or o["repo"].endswith("/"):
            raise DownloadError("repo must look like 'org/name', got %r" % o["repo"])
        if ".." in o["filename"].split("/"):
            raise DownloadError("filename must not contain '..'")
        endpoint = params.get("endpoint") or os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT
        o["endpoint"] = endpoint.rstrip("/")
        if not o["token"]:
            o["token"] = os.environ.get("HF_TOKEN") or None
            if o["token"] and BAD_TOKEN_CHARS.search(o["token"]):
                raise DownloadError("HF_TOKEN in the node's environment contains whitespace or control "
                                    "characters (a trailing newline?): strip it (e.g. with trim) or pass the "
                                    "token option; the token is not shown here")
    if o["token"] and BAD_TOKEN_CHARS.search(o["token"]):
        raise DownloadError("token contains whitespace or control characters (often a trailing newline from "
                            "a vault or file lookup): strip it, e.g. token: \"{{ vault_hf_token | trim }}\"; "
                            "the token is not shown here")
    o["token"] = o["token"] or None
    o["auth_origin"] = url_origin(o["endpoint"] if o["repo"] else o["url"])
    if o["sha256"]:
        o["sha256"] = o["sha256"].strip().lower()
        if o["sha256"].startswith("sha256:"):
            o["sha256"] = o["sha256"][7:]
        if not HEX64.match(o["sha256"]):
            raise DownloadError("sha256 must be 64 hex digits, got %r" % params.get("sha256"))
    for k in ("connections", "retries", "timeout"):
        if int(o[k]) < (0 if k == "retries" else 1):
            raise DownloadError("%s must be at least %d" % (k, 0 if k == "retries" else 1))
    o["connections"] = min(int(o["connections"]), 64)
    o["lock_timeout"] = float(o["lock_timeout"])
    if o["lock_timeout"] < 0:
        raise DownloadError("lock_timeout must be at least 0 (seconds to wait for another run)")
    return o


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
                raise _status_error(resp, url, "HEAD")
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
                raise _status_error(resp, u, "HEAD %s" % t.name)
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


# ---------------------------------------------------------------------------------------------
# Progress
# ---------------------------------------------------------------------------------------------
class Progress:
    def __init__(self, path, total=0, token=None):
        self.path = path
        self.token = token
        self.total = total
        self.done = 0
        self.state = "resolving"
        self.file = None
        self.lock = threading.Lock()
        self.samples = [(time.time(), 0)]
        self.new = 0
        self._last = 0.0
        self.error = None
        self._wlock = threading.Lock()

    def add(self, n):
        with self.lock:
            self.done += n
            self.new += n
        self.maybe_write()

    def set(self, state=None, file=None):
        with self.lock:
            if state:
                self.state = state
            if file:
                self.file = file
        self.write()

    def snapshot(self):
        now = time.time()
        with self.lock:
            self.samples.append((now, self.new))
            self.samples = [s for s in self.samples if now - s[0] <= 5.0] or [(now, self.new)]
            t0, n0 = self.samples[0]
            rate = (self.new - n0) / (now - t0) if now > t0 else 0.0
            left = max(0, self.total - self.done)
            return {"bytes_done": self.done, "bytes_total": self.total,
                    "percent": round(100.0 * self.done / self.total, 1) if self.total else 0.0,
                    "rate_mbs": round(rate / 1e6, 2), "eta_s": int(left / rate) if rate > 0 else None,
                    "state": self.state, "file": self.file, "updated": int(now), "error": self.error}

    def maybe_write(self):
        if self.path and time.time() - self._last >= 1.0:
            self.write()

    def write(self):
        if not self.path or not self._wlock.acquire(False):
            return
        try:
            self._last = time.time()
            _write_atomic(self.path, scrub(json.dumps(self.snapshot(), sort_keys=True), self.token))
        except OSError:
            pass
        finally:
            self._wlock.release()


# ---------------------------------------------------------------------------------------------
# One file: parallel ranged download with streaming sha256
# ---------------------------------------------------------------------------------------------
class FileDownload:
    def __init__(self, o, target, progress):
        self.o = o
        self.t = target
        self.progress = progress
        self.part = target.final_path + ".part"
        self.state_path = self.part + ".json"
        self.size = target.size
        self.lock = threading.Condition()
        self.done = Ranges()
        self.hashed = 0
        self.h = hashlib.sha256()
        self.gen = 0
        self.new_bytes = 0
        self.stop = False
        self.error = None
        self.cdn_url = None
        self.cdn_etag = None
        self.restart_owner = None
        self.queue = []
        self.fd = None
        self.part_id = None
        self.resumed_from = 0
        self.workers_done = False
        self.restart_reason = None

    # state ---------------------------------------------------------------------------------
    def _identity(self):
        ident = {"size": self.size, "sha256": self.t.sha256, "source": self.t.source_url,
                 "etag": self.t.etag if not self.t.sha256 else None}
        if self.t.last_modified and not self.t.sha256:
            ident["last_modified"] = self.t.last_modified
        return ident

    def _validator(self):
        """What ties bytes fetched at different times to one version: a strong ETag or Last-Modified
        (plain URL).  Hub downloads are pinned to a commit's resolve URL and need none."""
        if not self.o.get("url"):
            return "commit"
        etag = self.t.etag or ""
        if etag and not etag.startswith("W/"):
            return etag
        return self.t.last_modified

    def _ranges_safe(self):
        """Ranges (parallel, or resuming after a drop) cannot mix two versions of the file: there is a
        validator for If-Range, or the sha256 is known and the final check catches a mix."""
        return bool(self._validator() or self.t.sha256)

    def load_state(self):
        st = _read_json(self.state_path)
        try:
            pst = os.lstat(self.part)
        except OSError:
            pst = None
        if st and pst and st.get("version") == STATE_VERSION and st.get("identity") == self._identity() \
                and stat.S_ISREG(pst.st_mode) and pst.st_size == self.size and self._validator():
            self.done = Ranges(st.get("done") or []).clip(self.size)
            self.cdn_etag = st.get("cdn_etag")
        else:
            self.done = Ranges()
            for p in (self.part, self.state_path):
                try:
                    os.unlink(p)
                except OSError:
                    pass
        self.resumed_from = self.done.total()
        return self.resumed_from

    def save_state(self, sync=False):
        """Persist the ranges written so far.  With ``sync``, fdatasync the part first, so every range
        the state claims is on disk (and the final fsync has little left to flush)."""
        with self.lock:
            data = {"version": STATE_VERSION, "identity": self._identity(), "done": self.done.items,
                    "cdn_etag": self.cdn_etag}
            data = json.loads(json.dumps(data))
        try:
            if sync and self.fd is not None:
                os.fdatasync(self.fd)
            _write_json_atomic(self.state_path, data, 0o600)
        except OSError:
            pass

    # writing & hashing ------------------------------------------------------------------------
    def _write(self, pos, data, gen):
        n = len(data)
        off = 0
        while off < n:
            try:
                off += os.pwrite(self.fd, data[off:], pos + off)
            except OSError as e:
                raise _disk_error(e, self.part) from None
        with self.lock:
            if gen != self.gen:
                return
            self.done.add(pos, pos + n)
            self.new_bytes += n
            if pos <= self.hashed < pos + n:
                self.h.update(data[self.hashed - pos:])
                self.hashed = pos + n
            elif self.done.prefix_end() > self.hashed:
                self.lock.notify_all()
        self.progress.add(n)

    def _hasher(self):
        try:
            while True:
                with self.lock:
                    while not self.stop and self.done.prefix_end() <= self.hashed and not self._all_in():
                        self.lock.wait(0.5)
                    if self.stop or self.done.prefix_end() <= self.hashed:
                        return
                    start, gen = self.hashed, self.gen
                    end = min(self.done.prefix_end(), start + 4 * MIB)
                data = os.pread(self.fd, end - start, start)
                with self.lock:
                    if gen == self.gen and start <= self.hashed < start + len(data):
                        self.h.update(memoryview(data)[self.hashed - start:])
                        self.hashed = start + len(data)
                        self.lock.notify_all()
        except Exception as e:  # pragma: no cover - surfaced by run()
            with self.lock:
                self.error = self.error or DownloadError("hashing %s failed: %s" % (self.part, e))
                self.stop = True

    def _all_in(self):
        return self.workers_done and self.done.prefix_end() <= self.hashed

    # network -----------------------------------------------------------------------------
    def _get(self, session, pos, end, ranged):
        headers = {}
        if ranged:
            headers["Range"] = "bytes=%d-%d" % (pos, end - 1)
            if self.cdn_etag and not self.cdn_etag.startswith("W/"):
                headers["If-Range"] = self.cdn_etag
            elif self.o.get("url") and self.t.last_modified:
                headers["If-Range"] = self.t.last_modified
        url = self.cdn_url or self.t.url
        resp, final = session.request("GET", url, headers=headers, auth_origin=self.o.get("auth_origin"))
        if resp.status in (401, 403, 404, 410) and self.cdn_url:
            resp.read()
            self.cdn_url = None  # signed CDN URL expired: resolve again
            raise _Retryable("CDN answered %d; resolving the URL again" % resp.status)
        if resp.status in (200, 206):
            refuse_html(resp, self.t.name, final)
        if final != url and resp.status in (200, 206, 416):
            self.cdn_url = final  # reuse the (signed) CDN URL for the next ranges
        return resp

    def _check_length(self, resp, want):
        """A whole-file (200) answer must be exactly the expected size: a longer or shorter body is
        another version of the file (or something else), never the file."""
        cl = (resp.getheader("Content-Length") or "").strip()
        if cl.isdigit() and int(cl) != want:
            resp.close()
            raise DownloadError(
                "%s: %s sends %s bytes, expected %d (the size from the metadata): the file changed at the "
                "source, or the server sends something else; nothing reached the final path. Rerun to fetch "
                "the current file (pass size/sha256 to pin it)"
                % (self.t.name, redact_url(self.cdn_url or self.t.url), cl, want),
                expected_size=want, got_size=int(cl))

    def _check_end(self, resp):
        """After the expected bytes of a body of unknown length: nothing may follow."""
        if getattr(resp, "length", 0) is None and not resp.isclosed():
            try:
                extra = resp.read(1)
            except (http_client.HTTPException, OSError):
                extra = b""
            if extra:
                resp.close()
                raise DownloadError("%s: %s sends more than the expected %d bytes: the file changed at the "
                                    "source, or the server sends something else; nothing reached the final "
                                    "path" % (self.t.name, redact_url(self.cdn_url or self.t.url), self.size))

    def _fetch(self, session, pos, end, gen):
        """Fetch [pos, end) into the part; return the new position (== end when complete)."""
        resp = self._get(session, pos, end, True)
        if resp.status == 416:
            cr = resp.getheader("Content-Range") or ""
            resp.read()
            m = re.match(r"bytes \*/(\d+)", cr)
            if m and int(m.group(1)) != self.size:
                raise DownloadError("%s: the server now reports %s bytes, expected %d: the file changed "
                                    "upstream; rerun (set update: true for a moved branch)"
                                    % (self.t.name, m.group(1), self.size))
            raise _Restart("416 to a range request")
        if resp.status == 200 and pos == 0 and end == self.size:
            self._check_length(resp, self.size)  # the whole file was asked for anyway
            done = self._stream(resp, 0, self.size, gen)
            if done >= self.size:
                self._check_end(resp)
            return done
        if resp.status == 200:
            resp.close()
            raise _Restart("server ignored Range (200)")
        if resp.status != 206:
            raise _status_error(resp, self.cdn_url or self.t.url, "GET %s" % self.t.name)
        m = re.match(r"bytes (\d+)-(\d+)/(\d+|\*)", resp.getheader("Content-Range") or "")
        if not m or int(m.group(1)) != pos or (m.group(3) != "*" and int(m.group(3)) != self.size):
            resp.close()
            raise _Retryable("bad Content-Range %r for bytes=%d-%d"
                             % (resp.getheader("Content-Range"), pos, end - 1))
        cl = (resp.getheader("Content-Length") or "").strip()
        if cl.isdigit() and int(cl) != int(m.group(2)) - int(m.group(1)) + 1:
            resp.close()
            raise _Retryable("Content-Length %s does not match Content-Range %r"
                             % (cl, resp.getheader("Content-Range")))
        etag = resp.getheader("ETag")
        with self.lock:
            if etag and self.cdn_etag is None:
                self.cdn_etag = etag
            elif etag and etag != self.cdn_etag and not self.t.sha256:
                # without a known sha256 the ETag is all that ties the ranges together; with one, the
                # final hash check catches mixed content, and CDN edges may spell ETags differently
                resp.close()
                raise _Restart("ETag changed (%s -> %s)" % (self.cdn_etag, etag))
        return self._stream(resp, pos, min(end, int(m.group(2)) + 1), gen)

    def _stream(self, resp, pos, end, gen):
        buf = bytearray(BUF_SIZE)
        mv = memoryview(buf)
        try:
            while pos < end:
                if self.stop or gen != self.gen or self.restart_owner is not None:
                    resp.close()
                    return pos
                try:
                    n = resp.readinto(mv[:min(BUF_SIZE, end - pos)])
                except (http_client.HTTPException, OSError) as e:
                    raise _Retryable("%s: connection broke at byte %d: %s"
                                     % (self.t.name, pos, _err(e))) from None
                if not n:
                    raise _Retryable("%s: connection closed at byte %d" % (self.t.name, pos))
                self._write(pos, mv[:n], gen)
                pos += n
        except _Retryable:
            resp.close()
            raise _Progressed(pos)  # noqa: B904 (the cause is kept in .cause)
        return pos

    def _worker(self):
        session = Session(self.o["token"], self.o["timeout"], self.o["validate_certs"])
        try:
            while True:
                with self.lock:
                    if self.stop or not self.queue or self.restart_owner is not None:
                        return
                    pos, end = self.queue.pop(0)
                    gen = self.gen
                failures = 0
                while pos < end:
                    if self.stop or gen != self.gen or self.restart_owner is not None:
                        return
                    err, retry_after = None, None
                    try:
                        pos = self._fetch(session, pos, end, gen)
                        continue
                    except _Progressed as p:
                        if p.pos > pos:
                            failures = 0
                        pos = p.pos
                        err = p.cause
                    except _Retryable as e:
                        err, retry_after = e, e.retry_after
                    session.close()
                    failures += 1
                    if failures > self.o["retries"]:
                        raise DownloadError("%s: giving up after %d retries at byte %d: %s; the partial "
                                            "download is kept, rerun to resume"
                                            % (self.t.name, self.o["retries"], pos, err))
                    self._sleep(backoff(failures, self.o["retry_delay"], retry_after))
        except _Restart as r:
            with self.lock:
                if self.restart_owner is None:
                    self.restart_owner = threading.current_thread()
                    self.restart_reason = str(r)
                    self.lock.notify_all()
        except BaseException as e:
            with self.lock:
                self.error = self.error or e
                self.stop = True
                self.lock.notify_all()
        finally:
            session.close()

    def _sleep(self, s):
        end = time.time() + s
        while time.time() < end and not self.stop:
            time.sleep(min(0.2, end - time.time()))

    def _run_workers(self, gaps, nconn):
        chunk = max(4 * MIB, min(128 * MIB, self.size // max(1, nconn * 4)))
        if nconn <= 1:
            self.queue = list(gaps)
        else:
            self.queue = []
            for a, b in gaps:
                while a < b:
                    self.queue.append((a, min(b, a + chunk)))
                    a += chunk
        nconn = max(1, min(nconn, len(self.queue)))
        threads = [threading.Thread(target=self._worker, name="dl-%d" % i) for i in range(nconn)]
        for th in threads:
            th.daemon = True
            th.start()
        self._wait(threads)

    def _wait(self, threads):
        while True:
            alive = [th for th in threads if th.is_alive()]
            if not alive:
                return
            alive[0].join(1.0)
            self.save_state(sync=True)
            self.progress.maybe_write()

    def _full_body(self):
        """Start over from byte 0 on one connection without Range (server will not do ranges)."""
        with self.lock:
            self.restart_owner = None  # every range worker has ended
            self.gen += 1
            gen = self.gen
            self.done = Ranges()
            self.hashed = 0
            self.h = hashlib.sha256()
            self.cdn_etag = None
            self.lock.notify_all()
        self.save_state()
        session = Session(self.o["token"], self.o["timeout"], self.o["validate_certs"])
        failures = 0
        try:
            while True:
                pos = 0
                err, ra = None, None
                try:
                    resp = self._get(session, 0, self.size, False)
                    if resp.status != 200:
                        raise _status_error(resp, self.t.url, "GET %s" % self.t.name)
                    self._check_length(resp, self.size)
                    pos = self._stream(resp, 0, self.size, gen)
                    if pos >= self.size:
                        self._check_end(resp)
                        return
                except _Progressed as p:
                    err = p.cause
                except _Retryable as e:
                    err, ra = e, e.retry_after
                if self.stop:
                    return
                if err is None:
                    err = "connection ended at byte %d" % pos
                failures += 1
                if failures > self.o["retries"]:
                    raise DownloadError("%s: the download kept failing (%s); it restarts from byte 0 each "
                                        "time (%s)" % (self.t.name, err, self.restart_reason))
                with self.lock:  # a non-ranged retry must start from zero again
                    self.gen += 1
                    gen = self.gen
                    self.done = Ranges()
                    self.hashed = 0
                    self.h = hashlib.sha256()
                self._sleep(backoff(failures, self.o["retry_delay"], ra))
        finally:
            session.close()

    def run(self):
        """Download/finish the part; return (sha256 hex, downloaded bytes)."""
        self.fd = open_regular(self.part, os.O_RDWR | os.O_CREAT, 0o644, single_link=True)
        pst = os.fstat(self.fd)
        self.part_id = (pst.st_dev, pst.st_ino)
        self.workers_done = False
        hasher = None
        try:
            st = os.fstat(self.fd)
            if st.st_size != self.size:
                self.done = Ranges()
                os.ftruncate(self.fd, 0)
                _preallocate(self.fd, self.size, self.part)
            self.save_state()
            self.progress.add(0)
            with self.progress.lock:
                self.progress.done += self.done.total()
            hasher = threading.Thread(target=self._hasher, name="dl-hash")
            hasher.daemon = True
            hasher.start()
            gaps = self.done.missing(self.size)
            nconn = self.o["connections"] if self.size >= self.o["parallel_min_size"] else 1
            self.restart_owner = None
            if gaps and not self._ranges_safe():
                # no ETag/Last-Modified and no sha256: a range could splice two versions of the file
                self.restart_owner = "no validator"
                self.restart_reason = ("the server gives no ETag or Last-Modified, so bytes fetched in "
                                       "pieces could mix two versions of the file")
            elif gaps:
                self._run_workers(gaps, nconn)
            if self.error is None and self.restart_owner is not None:
                self.restarted = self.restart_reason
                self._full_body()
            with self.lock:
                self.workers_done = True
                self.lock.notify_all()
            if self.error is None:
                self.progress.set(state="verifying")
            hasher.join()
            if self.error is not None:
                raise self.error
            if self.hashed != self.size or self.done.prefix_end() != self.size:
                raise DownloadError("%s: download ended with %d of %d bytes hashed; rerun to resume"
                                    % (self.t.name, self.hashed, self.size))
            os.fsync(self.fd)
            return self.h.hexdigest(), self.new_bytes
        finally:
            with self.lock:
                self.stop = True
                self.lock.notify_all()
            if hasher is not None:
                hasher.join(5)
            if self.fd is not None:
                os.close(self.fd)
            if os.path.exists(self.part) and os.path.exists(self.state_path):
                self.save_state()


class _Progressed(Exception):
    def __init__(self, pos):
        Exception.__init__(self, "at %d" % pos)
        self.pos = pos
        self.cause = sys.exc_info()[1]


def _disk_error(e, path):
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return DownloadError("disk full while writing %s (%s): free space (or choose another dest) and "
                             "rerun; the partial download is kept and resumes" % (path, os.strerror(e.errno)),
                             disk_full=True)
    return DownloadError("cannot write %s: %s" % (path, e))


def _preallocate(fd, size, path):
    if size == 0:
        return
    fallocate = getattr(os, "posix_fallocate", None)
    if fallocate is not None:
        try:
            fallocate(fd, 0, size)
            return
        except OSError as e:
            if e.errno in (errno.ENOSPC, errno.EDQUOT):
                raise _disk_error(e, path) from None
            if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL, getattr(errno, "ENOTSUP", errno.EOPNOTSUPP)):
                raise _disk_error(e, path) from None
    os.ftruncate(fd, size)


def free_space_check(dest, plans, margin):
    """``plans``: list of (size, part_path).  Raise DownloadError when dest lacks room."""
    need = 0
    for size, part in plans:
        have = 0
        try:
            st = os.lstat(part)
            if st.st_size == size:
                have = min(size, getattr(st, "st_blocks", 0) * 512)
        except OSError:
            pass
        need += max(0, size - have)
    if need == 0:
        return
    vfs = os.statvfs(dest)
    avail = vfs.f_bavail * vfs.f_frsize
    if avail < need + margin:
        raise DownloadError("not enough free space in %s: %s more needed (+%s margin), %s available; free "
                            "space or choose another dest (any partial download is kept)"
                            % (dest, human(need), human(margin), human(avail)), disk_full=True)


# ---------------------------------------------------------------------------------------------
# Top level
# ---------------------------------------------------------------------------------------------
def read_sidecar_record(final_path):
    """The sidecar record of final_path, or None when it is absent, unreadable or of another version."""
    rec = _read_json(sidecar_path(final_path))
    if not rec or rec.get("version") != SIDECAR_VERSION:
        return None
    return rec


def read_sidecar(t):
    return read_sidecar_record(t.final_path)


def sidecar_matches_file(rec, path):
    """Whether the record describes the file at path as it is now: size, mtime_ns, inode and ctime_ns
    (ctime cannot be set by utime, so a rewritten file with a restored mtime does not match)."""
    try:
        st = os.stat(path)
    except OSError:
        return False
    return (rec.get("size") == st.st_size and rec.get("mtime_ns") == st.st_mtime_ns
            and rec.get("inode") == st.st_ino and rec.get("ctime_ns") == st.st_ctime_ns
            and bool(rec.get("sha256")))


# Where a verified file came from; kept by writers that re-verify unchanged content (gguf_info).
SIDECAR_PROVENANCE = ("commit", "etag", "source", "source_url")


def write_sidecar_record(final_path, sha, _stat=None, **provenance):
    """Record that final_path (as it is now: size, mtime, inode, ctime) has sha256 `sha`, with its
    provenance.  The one writer of the record that model_download and gguf_info share; owned like the
    file, written to an unguessable temporary name and renamed (never through a planted link).
    ``_stat``: the file's stat when the caller already has it (else os.stat)."""
    st = _stat if _stat is not None else os.stat(final_path)
    rec = dict(provenance)
    rec.update({"version": SIDECAR_VERSION, "file": os.path.basename(final_path), "size": st.st_size,
                "mtime_ns": st.st_mtime_ns, "ctime_ns": st.st_ctime_ns, "inode": st.st_ino, "sha256": sha,
                "verified_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
    _write_json_atomic(sidecar_path(final_path), rec, owner=(st.st_uid, st.st_gid))
    return rec


def write_sidecar(t, sha, _stat=None):
    if _stat is None:
        _stat = check_own_path(t.final_path)
        if _stat is None:
            raise DownloadError("%s vanished before its record was written; rerun" % t.final_path)
    return write_sidecar_record(t.final_path, sha, _stat=_stat, commit=t.commit, etag=t.etag, source=t.source,
                                source_url=t.source_url)


def _same_source(rec, t, o):
    src = rec.get("source") or {}
    if o["url"]:
        return src.get("url") == t.source.get("url")
    return src.get("repo") == o["repo"] and src.get("filename") == t.name


def run(params, check_mode=False, set_attributes=None):
    """Do it.  Return the result dict; raise DownloadError on failure (message says what to do).

    ``set_attributes(path) -> bool``: applies owner/group/mode (the module's file arguments) to a final
    file while the run still holds its lock, returns whether it changed anything; the sidecar record is
    then re-stamped (chmod/chown change ctime)."""
    t0 = time.time()
    o = normalize(params)
    token = o.get("token")
    progress = Progress(o["progress_file"] if not check_mode else None, token=token)
    try:
        return scrub_all(_run(o, check_mode, t0, progress, set_attributes), token)
    except DownloadError as e:
        e.msg = scrub(e.msg, token)
        e.args = (e.msg,)
        e.result = scrub_all(e.result, token)
        progress.error = e.msg
        progress.set(state="failed")
        raise
    except Exception as e:  # unexpected: one scrubbed line (the token may sit in any exception text)
        msg = scrub("model_download failed: %s: %s" % (type(e).__name__, e), token)
        progress.error = msg
        progress.set(state="failed")
        raise DownloadError(msg) from None
    except BaseException:
        progress.set(state="failed")
        raise


def _token_forms(token):
    forms = set()
    for t in (token, token.strip()):
        if not t:
            continue
        forms.update((t, repr(t)[1:-1], json.dumps(t)[1:-1], json.dumps(t, ensure_ascii=False)[1:-1],
                      quote(t, safe=""), quote(t), quote_plus(t),
                      repr(t.encode("utf-8", "surrogateescape"))[2:-1]))
    return sorted((f for f in forms if f), key=len, reverse=True)


def scrub(text, token):
    """``text`` without the token in any form: raw, stripped, escaped (repr, JSON, bytes repr) and
    URL-encoded (any case)."""
    if not token or not text or not isinstance(text, str):
        return text
    for form in _token_forms(token):
        text = re.sub(re.escape(form), MASK, text, flags=re.IGNORECASE)
    return text


def scrub_all(obj, token):
    """scrub() every string in a result (dicts, lists)."""
    if not token:
        return obj
    if isinstance(obj, str):
        return scrub(obj, token)
    if isinstance(obj, dict):
        return dict((k, scrub_all(v, token)) for k, v in obj.items())
    if isinstance(obj, (list, tuple)):
        return [scrub_all(v, token) for v in obj]
    return obj


def owned_paths(t):
    """(path, written in place) of every file the run may touch for target t."""
    return ((t.final_path, False), (t.final_path + ".part", True), (t.final_path + ".part.json", False),
            (sidecar_path(t.final_path), False), (lock_path(t.final_path), True))


def _run(o, check_mode, t0, progress, set_attributes=None):
    targets = build_targets(o)
    dest = os.path.abspath(o["dest"])
    progress.set(state="resolving")
    for t in targets:
        for path, single in owned_paths(t):
            check_own_path(path, single)
    locks = []
    try:
        if not check_mode:
            if not os.path.isdir(dest):
                os.makedirs(dest)
            deadline = time.monotonic() + o["lock_timeout"]
            for t in targets:
                try:
                    locks.append(DestLock.acquire(lock_path(t.final_path), o["lock_timeout"], t.name,
                                                  progress, deadline))
                except DownloadError as e:
                    # a read-only dest (verified files on a read-only mount): no run can write there either
                    if e.result.get("errno") not in (errno.EROFS, errno.EACCES, errno.EPERM):
                        raise
            progress.set(state="resolving")
            for t in targets:  # again: another run may have worked here while we waited
                for path, single in owned_paths(t)[:4]:
                    check_own_path(path, single)
        return _run_locked(o, check_mode, t0, progress, set_attributes, targets, dest)
    finally:
        for lk in reversed(locks):
            lk.release()


def _run_locked(o, check_mode, t0, progress, set_attributes, targets, dest):
    notes = []
    # 1. local knowledge
    recs = {}
    for t in targets:
        rec = read_sidecar(t)
        if rec and sidecar_matches_file(rec, t.final_path) and _same_source(rec, t, o):
            if o["sha256"] and rec["sha256"] != o["sha256"]:
                rec = None
            elif o["size"] and rec["size"] != int(o["size"]):
                rec = None
        else:
            rec = None
        recs[t.name] = rec
    # 2. remote metadata
    session = Session(o["token"], o["timeout"], o["validate_certs"])
    pinned = bool(o["repo"]) and bool(HEX40.match(o["revision"] or ""))
    try:
        for t in targets:
            rec = recs[t.name]
            if rec and pinned and rec.get("commit") == o["revision"] and not o["force_verify"]:
                _fill_from_record(t, rec, o)  # commit pinned and file verified: nothing to ask
                continue
            fetch_metadata(o, t, session)
    except DownloadError as e:
        status = getattr(e, "result", {}).get("status")
        if all(recs[t.name] for t in targets) and status not in (401, 403, 404):
            for t in targets:
                _fill_from_record(t, recs[t.name], o)
            notes.append("could not reach the source (%s); kept the verified file(s)" % e.msg)
        else:
            raise
    finally:
        session.close()

    # 3. decide per target
    actions = []  # (target, action, rec)
    update_available = False
    for t in targets:
        rec = recs[t.name]
        if rec:
            moved = _moved(rec, t, o)
            if moved and not o["update"]:
                update_available = True
                notes.append("%s: the source moved (%s); kept the verified file from %s. Set update: true "
                             "to fetch the new one"
                             % (t.name, moved, rec.get("commit") or rec.get("source_url")))
                _fill_from_record(t, rec, o)
                actions.append((t, "force_verify" if o["force_verify"] else "keep", rec))
                continue
            if moved and t.sha256 and t.sha256 == rec.get("sha256"):
                actions.append((t, "recommit", rec))
                continue
            if moved:
                actions.append((t, "download", rec))
                continue
            if t.size is not None and t.size != rec.get("size"):
                actions.append((t, "download", rec))
                continue
            if t.sha256 and rec.get("sha256") != t.sha256:
                # the hub vouches for another sha256 than the record: the record is not trusted
                notes.append("%s: the sidecar record's sha256 %s disagrees with the source's %s; not "
                             "trusted, the file was hashed" % (t.name, rec.get("sha256"), t.sha256))
                actions.append((t, "hash_existing", None))
                continue
            actions.append((t, "force_verify" if o["force_verify"] else "keep", rec))
        elif os.path.lexists(t.final_path):
            actions.append((t, "hash_existing", None))
        else:
            actions.append((t, "download", None))
    for t, action, _rec in actions:
        if t.size is None and action in ("download", "hash_existing"):
            raise DownloadError("%s: the source does not tell the file size (no Content-Length); pass size "
                                "(and sha256)" % t.name)
    for t in targets:
        if o["repo"] and not t.sha256:
            notes.append("%s: the hub sent no sha256 (X-Linked-Etag); recorded the sha256 computed while "
                         "downloading (pass sha256 to check it)" % t.name)
    if check_mode:
        todo = [t for t, action, _rec in actions if action == "download"]
        if todo and os.path.isdir(dest):
            try:
                free_space_check(dest, [(t.size, t.final_path + ".part") for t in todo],
                                 o["free_space_margin"])
            except DownloadError as e:
                notes.append("would fail: " + e.msg)
        return _check_mode_result(o, targets, actions, notes, update_available, t0)

    # 4. act
    progress.total = sum(t.size or 0 for t in targets)
    results = []
    pending = []
    for t, action, rec in actions:
        if action == "keep":
            results.append(_part_result(t, rec["sha256"], "sidecar", 0, 0, False))
            progress.add(t.size or rec["size"])
        elif action == "recommit":
            rec = write_sidecar(t, rec["sha256"])
            notes.append("%s: same bytes at commit %s; record updated" % (t.name, t.commit))
            results.append(_part_result(t, rec["sha256"], "sidecar", 0, 0, False))
            progress.add(t.size)
        elif action in ("force_verify", "hash_existing"):
            progress.set(state="hashing", file=t.name)
            st = check_own_path(t.final_path)
            try:
                got = hash_file(t.final_path, progress, nofollow=True)
            except OSError as e:
                check_own_path(t.final_path)
                raise DownloadError("cannot read %s: %s" % (t.final_path, e)) from None
            want = t.sha256 or (rec or {}).get("sha256")
            size_ok = t.size is None or st.st_size == t.size
            if (want and got == want and size_ok) or (not want and size_ok and t.size is not None):
                if not want:
                    notes.append("%s: no reference sha256 (pass sha256); recorded the existing file's"
                                 % t.name)
                write_sidecar(t, got)
                results.append(_part_result(t, got, "hashed", 0, 0, False))
            else:
                q = quarantine(t.final_path)
                side = sidecar_path(t.final_path)
                if os.path.lexists(side):
                    os.unlink(side)
                notes.append("%s: the existing file did not match (expected %s, got %s); moved it to %s and "
                             "downloaded again" % (t.name, want or ("%s bytes" % t.size), got, q))
                pending.append(t)
                results.append(None)
                progress.add(-os.lstat(q).st_size)  # it is counted again while downloading
        else:
            pending.append(t)
            results.append(None)
    if pending:
        free_space_check(dest, [(t.size, t.final_path + ".part") for t in pending], o["free_space_margin"])
    idx = 0
    for i, r in enumerate(results):
        if r is not None:
            continue
        t = pending[idx]
        idx += 1
        progress.set(state="downloading", file=t.name)
        results[i] = _download_one(o, t, progress)
    attrs_changed = False
    if set_attributes is not None:
        for i, t in enumerate(targets):
            if set_attributes(t.final_path):
                attrs_changed = True
                write_sidecar(t, results[i]["sha256"])  # verified in this run; chmod/chown moved ctime
    progress.set(state="done")
    return _final_result(o, targets, results, notes, update_available, t0, attrs_changed)


def _moved(rec, t, o):
    if o["repo"]:
        if rec.get("commit") and t.commit and rec["commit"] != t.commit:
            return ("revision %s is now commit %s, the file is from %s"
                    % (o["revision"], t.commit, rec["commit"]))
        return None
    if t.size is not None and t.size != rec.get("size"):
        return "size %s -> %s" % (rec.get("size"), t.size)
    if t.etag and rec.get("etag") and t.etag != rec["etag"]:
        return "ETag %s -> %s" % (rec["etag"], t.etag)
    return None


def _fill_from_record(t, rec, o):
    t.sha256 = rec.get("sha256")
    t.size = rec.get("size")
    t.commit = rec.get("commit")
    t.etag = rec.get("etag")
    if o["repo"] and t.commit:
        t.url = resolve_url(o, t.name, t.commit)


def _download_one(o, t, progress):
    started = time.time()
    part = t.final_path + ".part"
    dl = FileDownload(o, t, progress)
    if t.size == 0:
        fd = open_regular(part, os.O_WRONLY | os.O_CREAT, 0o644, single_link=True)
        try:
            os.ftruncate(fd, 0)
            st = os.fstat(fd)
            dl.part_id = (st.st_dev, st.st_ino)
        finally:
            os.close(fd)
    resumed = dl.load_state() if t.size else 0
    if t.size:
        got, new = dl.run()
    else:
        got, new = hashlib.sha256().hexdigest(), 0
    pst = check_own_path(part, single_link=True)
    if pst is None or (pst.st_dev, pst.st_ino) != dl.part_id:
        raise DownloadError("%s was replaced while this run wrote it; remove it and rerun" % part)
    actual = pst.st_size
    want = t.sha256
    if actual != t.size or (want and got != want):
        q = quarantine(part)
        if os.path.lexists(dl.state_path):
            os.unlink(dl.state_path)
        raise DownloadError(
            "checksum mismatch for %s: expected sha256 %s (%d bytes), got %s (%d bytes); the bytes were "
            "moved to %s and the final path was left untouched. Rerun to download again; if it repeats, the "
            "source or a proxy corrupts data" % (t.name, want or "-", t.size, got, actual, q),
            quarantined=q, expected_sha256=want, got_sha256=got)
    check_own_path(t.final_path)  # a file (or nothing): never rename over a planted directory
    os.rename(part, t.final_path)
    fst = os.lstat(t.final_path)
    if (fst.st_dev, fst.st_ino) != dl.part_id or not stat.S_ISREG(fst.st_mode):
        raise DownloadError("%s is not the file this run downloaded (replaced while renaming); remove it and "
                            "rerun" % t.final_path)
    fsync_dir(os.path.dirname(t.final_path))
    if os.path.lexists(dl.state_path):
        os.unlink(dl.state_path)
    write_sidecar(t, got, fst)
    fsync_dir(os.path.dirname(t.final_path))
    r = _part_result(t, got, "download", new, resumed, True)
    r["elapsed_s"] = round(time.time() - started, 3)
    return r


def _part_result(t, sha, verified, new, resumed, changed):
    return {"path": t.final_path, "name": t.name, "size": t.size, "sha256": sha, "commit": t.commit,
            "source_url": t.source_url, "verified": verified, "downloaded_bytes": new,
            "resumed_from": resumed, "changed": changed}


_VERIFIED_ORDER = {"sidecar": 0, "hashed": 1, "download": 2}


def _final_result(o, targets, parts, notes, update_available, t0, attrs_changed=False):
    first = parts[0]
    changed = any(p["changed"] for p in parts) or attrs_changed
    verified = max((p["verified"] for p in parts), key=lambda v: _VERIFIED_ORDER[v])
    dl = sum(p["downloaded_bytes"] for p in parts)
    elapsed = round(time.time() - t0, 3)
    if changed:
        msg = "downloaded %s (%s new, %s resumed) and verified sha256 in %.1fs" % (
            ", ".join(p["name"] for p in parts if p["changed"]), human(dl),
            human(sum(p["resumed_from"] for p in parts)), elapsed)
    else:
        msg = "%s already present and verified (%s)" % (
            ", ".join(p["name"] for p in parts), verified)
    if notes:
        msg += "; " + "; ".join(notes)
    return {
        "changed": changed, "path": first["path"], "paths": [p["path"] for p in parts],
        "size": sum(p["size"] or 0 for p in parts), "total_size": sum(p["size"] or 0 for p in parts),
        "sha256": first["sha256"], "commit": first["commit"],
        "source_url": first["source_url"], "downloaded_bytes": dl,
        "resumed_from": sum(p["resumed_from"] for p in parts), "verified": verified, "elapsed_s": elapsed,
        "update_available": update_available, "parts": parts, "msg": scrub(msg, o.get("token")),
    }


def _check_mode_result(o, targets, actions, notes, update_available, t0):
    would = []
    parts = []
    for t, action, rec in actions:
        sha = t.sha256 or (rec or {}).get("sha256")
        part = t.final_path + ".part"
        resumed = 0
        if action == "download" and os.path.lexists(part):
            st = _read_json(part + ".json")
            if st:
                resumed = Ranges(st.get("done") or []).clip(t.size or 0).total()
        would.append("%s: %s" % (t.name, {"keep": "verified (sidecar), nothing to do",
                                          "recommit": "same bytes at new commit, would update the record",
                                          "force_verify": "would re-hash",
                                          "hash_existing": "would hash the existing file",
                                          "download": "would download %s"
                                          % human((t.size or 0) - resumed)}[action]))
        parts.append({"path": t.final_path, "name": t.name, "size": t.size, "sha256": sha, "commit": t.commit,
                      "source_url": t.source_url, "verified": "sidecar" if action == "keep" else None,
                      "downloaded_bytes": 0, "resumed_from": resumed, "changed": action == "download",
                      "action": action})
    msg = "check mode: " + "; ".join(would + notes)
    return {
        "changed": any(p["changed"] for p in parts), "path": parts[0]["path"],
        "paths": [p["path"] for p in parts], "size": sum(p["size"] or 0 for p in parts),
        "total_size": sum(p["size"] or 0 for p in parts),
        "sha256": parts[0]["sha256"], "commit": parts[0]["commit"],
        "source_url": parts[0]["source_url"], "downloaded_bytes": 0,
        "resumed_from": sum(p["resumed_from"] for p in parts),
        "verified": "sidecar" if all(p["verified"] == "sidecar" for p in parts) else None,
        "elapsed_s": round(time.time() - t0, 3), "update_available": update_available, "parts": parts,
        "msg": scrub(msg, o.get("token")),
    }
