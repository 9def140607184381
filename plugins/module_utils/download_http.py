# -*- coding: utf-8 -*-
# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""HTTP for model_download: keep-alive connections per thread, redirects, proxies, the token bound to
one origin, status codes turned into messages that say what to do, and retries with backoff.

Plain Python 3.6, standard library only; importable without Ansible.
"""
from __future__ import absolute_import, division, print_function

import calendar
import socket
import ssl
import time
from email.utils import parsedate
from http import client as http_client
from urllib.parse import urljoin, urlsplit, urlunsplit
from urllib.request import getproxies, proxy_bypass

from ansible_collections.llmops.serving.plugins.module_utils.download_messages import (
    DownloadError,
    Retryable,
    redact_url,
)

__metaclass__ = type

USER_AGENT = "llmops.serving-model_download/1"
RETRY_STATUSES = (429, 500, 502, 503, 504)
LOOPBACK = ("127.0.0.1", "localhost", "::1")
HTML_TYPES = ("text/html", "application/xhtml+xml")
HTML_NAMES = (".html", ".htm", ".xhtml")


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
        self.listings = {}  # a hub's file listing per URL, fetched once per run (download_source)

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

        The token (and its cookie, for a hub that wants one) goes only to ``auth_origin`` (scheme, host,
        port; default: the URL's own origin), on every hop: never to a redirect target on another host
        (a CDN), another port, or plain http after https."""
        origin = auth_origin or url_origin(url)
        for _hop in range(10):
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
                    raise Retryable("%s %s: %s" % (method, redact_url(url), describe_error(e))) from None
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


def describe_error(e):
    if isinstance(e, socket.timeout):
        return "timed out (no data within the timeout)"
    return "%s: %s" % (type(e).__name__, e) if str(e) else type(e).__name__


def status_error(resp, url, what):
    code = resp.status
    ra = parse_retry_after(resp.getheader("Retry-After"))
    try:
        resp.read()
    except Exception:
        pass
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
