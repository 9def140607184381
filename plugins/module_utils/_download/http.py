# -*- coding: utf-8 -*-
# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
# PRIVATE to llmops.serving: it can change at any time; do not import it from other collections.
"""HTTP for model_download: keep-alive connections per thread, redirects, proxies, the token bound to
one origin, status codes turned into messages that say what to do, and retries with backoff.

Two bounds besides the idle ``timeout`` (which only limits the silence between two bytes):

* A total deadline per metadata request (``Session.deadline``): a HEAD, the ModelScope listing, a window of
  gguf_info's remote header read must end, headers and body included, within ``DEADLINE_FACTOR`` times
  ``timeout`` (120 s with the default 30 s).  A watchdog shuts the session's sockets down when it passes, so
  a server sending one byte per second cannot hold a run (and the destination lock) for days.  It counts
  as a stall: retried, then a clear error.  The body of a model file has no such deadline (its size varies
  by 10^4): the async job's limit (the role's ``model_download_timeout``) bounds it.
* Bodies that are not the file (an error page, a redirect's) are read up to ``ERROR_BODY_MAX`` bytes; a
  longer one is not read on: its connection is closed instead.

Plain Python 3.6, standard library only; importable without Ansible.
"""
from __future__ import absolute_import, division, print_function

import calendar
import ipaddress
import socket
import ssl
import threading
import time
from email.utils import parsedate
from http import client as http_client
from urllib.parse import urljoin, urlsplit, urlunsplit
from urllib.request import getproxies, proxy_bypass

from ansible_collections.llmops.serving.plugins.module_utils._download.local import LocalConnection
from ansible_collections.llmops.serving.plugins.module_utils._download.messages import (
    DownloadError,
    Retryable,
    redact_url,
)

__metaclass__ = type

USER_AGENT = "llmops.serving-model_download/1"
RETRY_STATUSES = (429, 500, 502, 503, 504)
_LOOPBACK_NAMES = ("localhost", "localhost.localdomain", "ip6-localhost")
HTML_TYPES = ("text/html", "application/xhtml+xml")
HTML_NAMES = (".html", ".htm", ".xhtml")
# A metadata request may take this many times the idle timeout in all (connect, headers, body).
DEADLINE_FACTOR = 4
# Bytes read of a body that is not the file (an error page, a redirect's); more is not read.
ERROR_BODY_MAX = 64 * 1024


def is_loopback(host):
    """Whether a request to host stays on this machine (127.0.0.0/8, ::1, the localhost names): such a request
    never goes through a proxy variable (the one rule for this collection's HTTP clients)."""
    host = (host or "").lower().strip("[]")
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host in _LOOPBACK_NAMES


def request_deadline(timeout):
    """Seconds one metadata request may take in all: DEADLINE_FACTOR x the idle timeout."""
    return DEADLINE_FACTOR * float(timeout)


class Deadline:
    """``with session.deadline(seconds, what):`` bounds everything inside (connect, TLS, headers, body reads)
    by a total time.  When it passes, a watchdog thread shuts the session's sockets down, which ends any
    blocked read; leaving the block then raises Retryable (a stall), whatever the read returned."""

    def __init__(self, session, seconds, what):
        self.session = session
        self.seconds = seconds
        self.what = what
        self.fired = False
        self._active = False
        self._lock = threading.Lock()
        self._timer = None

    def __enter__(self):
        self._active = True
        self.session._deadline = self
        self._timer = threading.Timer(self.seconds, self._fire)
        self._timer.daemon = True
        self._timer.start()
        return self

    def _fire(self):
        with self._lock:
            if not self._active:
                return
            self.fired = True
        self.session.interrupt()

    def exceeded(self):
        return Retryable("%s: no complete answer within %g s (the server sends too slowly; a request may "
                         "take %d x timeout in all)" % (self.what, self.seconds, DEADLINE_FACTOR))

    def __exit__(self, exc_type, exc, tb):
        with self._lock:
            self._active = False
        self._timer.cancel()
        self.session._deadline = None
        if self.fired:
            self.session.close()
            raise self.exceeded() from None
        return False


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


class Session:
    """One thread's keep-alive connections; follows redirects, drops Authorization off-origin."""

    def __init__(self, token=None, timeout=30, validate_certs=True):
        self.token = token
        self.timeout = timeout
        self.validate_certs = validate_certs
        self._conns = {}
        self._deadline = None  # the Deadline of the request in progress (Session.deadline)
        self.listings = {}  # a hub's file listing per URL, fetched once per run (download_source)

    def deadline(self, seconds, what):
        """A Deadline for the requests and reads inside a ``with`` block (see Deadline)."""
        return Deadline(self, seconds, what)

    def interrupt(self):
        """Shut every socket of this session down (from the watchdog thread): a blocked read returns."""
        for c in list(self._conns.values()):
            sock = getattr(c, "sock", None)
            if sock is not None:
                try:
                    socket.socket.shutdown(sock, socket.SHUT_RDWR)  # the plain socket's, also under TLS
                except (OSError, ValueError):
                    pass

    def _check_deadline(self):
        d = self._deadline
        if d is not None and d.fired:
            raise d.exceeded()

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
        if not is_loopback(hostname) and not proxy_bypass(hostname):
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
        elif scheme == "file":
            c = LocalConnection()  # a file on the node (an offline bundle's model): no network, no proxy
        elif scheme == "http":
            if proxy:
                p = urlsplit(proxy)
                c = http_client.HTTPConnection(p.hostname, p.port or 8080, timeout=self.timeout)
                c._llmops_proxy = True
            else:
                c = http_client.HTTPConnection(host, timeout=self.timeout)
        else:
            raise DownloadError("unsupported URL scheme %r: use http, https or file" % scheme)
        self._conns[key] = c
        return c, False

    def request(self, method, url, headers=None, auth_origin=None, follow=True):
        """Return (response, final_url).  The caller reads or closes the response.

        The token (and its cookie, for a hub that wants one) goes only to ``auth_origin`` (scheme, host,
        port; default: the URL's own origin), on every hop: never to a redirect target on another host
        (a CDN), another port, or plain http after https."""
        origin = auth_origin or url_origin(url)
        for _hop in range(10):
            self._check_deadline()
            p = urlsplit(url)
            hdrs = {"User-Agent": USER_AGENT, "Accept-Encoding": "identity"}
            hdrs.update(headers or {})
            if self.token and url_origin(url) == origin:
                hdrs["Authorization"] = "Bearer " + self.token
                cookie_name = getattr(self.token, "cookie_name", None)  # download_options.HubToken
                if cookie_name:
                    hdrs["Cookie"] = "%s=%s" % (cookie_name, self.token)
            path = urlunsplit(("", "", p.path or "/", p.query, ""))
            resp = None
            for attempt in (0, 1):
                self._check_deadline()
                conn, reused = self._conn(p.scheme, p.netloc, fresh=attempt > 0)
                target = url if getattr(conn, "_llmops_proxy", False) else path
                try:
                    conn.request(method, target, headers=hdrs)
                    resp = conn.getresponse()
                    resp._llmops_conn = conn  # abandon() closes it when the body is left unread
                    break
                except (http_client.HTTPException, OSError) as e:
                    conn.close()
                    self._conns.pop((p.scheme, p.netloc), None)
                    if reused and attempt == 0:
                        continue  # a stale keep-alive connection: one fresh try
                    raise Retryable("%s %s: %s" % (method, redact_url(url), describe_error(e))) from None
            if follow and resp.status in (301, 302, 303, 307, 308) and resp.getheader("Location"):
                drain(resp)
                url = urljoin(url, resp.getheader("Location"))
                continue
            return resp, url
        raise DownloadError("too many redirects from %s" % redact_url(url))


class CountingSession(Session):
    """A Session that counts its requests (a redirect it follows counts once): what gguf_info and
    safetensors_info report as ``requests``."""

    def __init__(self, *args, **kwargs):
        Session.__init__(self, *args, **kwargs)
        self.requests = 0

    def request(self, *args, **kwargs):
        self.requests += 1
        return Session.request(self, *args, **kwargs)


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


def abandon(resp):
    """Close a response whose body is left unread, and its connection: the unread bytes would otherwise be
    read as the next answer on that keep-alive connection."""
    for thing in (resp, getattr(resp, "_llmops_conn", None)):
        if thing is not None:
            try:
                thing.close()
            except Exception:
                pass


def drain(resp, limit=ERROR_BODY_MAX):
    """Read and drop a body that is not the file (an error page, a redirect's): at most ``limit`` bytes; a
    longer (or endless) body is not read on, its connection is closed instead.  Returns what was read."""
    try:
        data = resp.read(limit + 1)
    except (http_client.HTTPException, OSError):
        data = None
    if data is None or len(data) > limit or not resp.isclosed():
        abandon(resp)
    return (data or b"")[:limit]


def read_bounded(resp, limit):
    """The body, up to ``limit + 1`` bytes (a caller that gets more than ``limit`` refuses it), read into one
    buffer (a bytearray, sized by Content-Length when there is one: no second copy of a large body)."""
    cl = (resp.getheader("Content-Length") or "").strip()
    cap = min(int(cl), limit + 1) if cl.isdigit() else limit + 1
    buf = bytearray(cap if cl.isdigit() else min(cap, 1 << 20))
    got = 0
    while got < cap:
        if got == len(buf):
            buf.extend(bytearray(min(len(buf), cap - got)))
        view = memoryview(buf)[got:]
        try:
            n = resp.readinto(view)
        finally:
            view.release()
        if not n:
            break
        got += n
    del buf[got:]
    if got > limit or not resp.isclosed():
        abandon(resp)
    return buf


def refuse_html(resp, name, url):
    """A 2xx text/html answer for a file that is not HTML: the mirror's login or error page."""
    ctype = (resp.getheader("Content-Type") or "").split(";")[0].strip().lower()
    if ctype in HTML_TYPES and not name.lower().endswith(HTML_NAMES):
        abandon(resp)
        raise DownloadError(
            "%s: %s answered %d with an HTML page (Content-Type %s) instead of the file: most likely the "
            "mirror's login, captcha or error page. Check endpoint/url, the token and that the mirror "
            "serves this repo; nothing was written to the final path"
            % (name, redact_url(url), resp.status, ctype), status=resp.status)


def describe_error(e):
    if isinstance(e, socket.timeout):
        return "timed out (no data within the timeout)"
    return "%s: %s" % (type(e).__name__, e) if str(e) else type(e).__name__


def status_error(resp, url, what):
    code = resp.status
    ra = parse_retry_after(resp.getheader("Retry-After"))
    drain(resp)
    if code in RETRY_STATUSES:
        return Retryable("%s: HTTP %d from %s" % (what, code, redact_url(url)), retry_after=ra)
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
        except Retryable as e:
            failures += 1
            if failures > retries:
                raise DownloadError("%s: giving up after %d retries: %s" % (what, retries, e)) from None
            sleep(backoff(failures, delay, e.retry_after))


def backoff(failures, delay, retry_after=None):
    if retry_after is not None:
        return min(float(retry_after), 300.0)
    return min(delay * (2 ** (failures - 1)), 60.0)
