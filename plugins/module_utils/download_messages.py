# -*- coding: utf-8 -*-
# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""What model_download tells the user: its errors and message helpers, never the token.

Plain Python 3.6, standard library only; importable without Ansible.
"""
from __future__ import absolute_import, division, print_function

import json
import re
import sys
from urllib.parse import quote, quote_plus, urlsplit, urlunsplit

__metaclass__ = type

MASK = "********"


class DownloadError(Exception):
    """A failure with a message that says what to do; ``result`` holds extra return values."""

    def __init__(self, msg, **result):
        Exception.__init__(self, msg)
        self.msg = msg
        self.result = result


class Retryable(Exception):
    """A transient failure (drop, stall, 429/5xx): the caller backs off and tries again."""

    def __init__(self, msg, retry_after=None):
        Exception.__init__(self, msg)
        self.retry_after = retry_after


class RangesRefused(Exception):
    """The server will not do ranges (200 to a ranged GET, or 416): start over on one connection."""


class Progressed(Exception):
    """A Retryable failure after some bytes of a body were written: ``pos`` is where they end."""

    def __init__(self, pos):
        Exception.__init__(self, "at %d" % pos)
        self.pos = pos
        self.cause = sys.exc_info()[1]


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
