# -*- coding: utf-8 -*-
# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
# PRIVATE to llmops.serving: it can change at any time; do not import it from other collections.
"""What model_download tells the user: its errors and message helpers, never the token.

Plain Python 3.6, standard library only; importable without Ansible.
"""
from __future__ import absolute_import, division, print_function

import re
import sys
from urllib.parse import parse_qsl, unquote, urlsplit, urlunsplit

from ansible_collections.llmops.serving.plugins.module_utils import secrets

__metaclass__ = type

MASK = secrets.MASK


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
    try:
        p = urlsplit(url)
    except ValueError:  # an unbalanced [ in the host: it is not shown (it may hold a credential)
        return "(a URL that does not parse)"
    netloc = p.netloc.rsplit("@", 1)[-1]
    return urlunsplit((p.scheme, netloc, p.path, "", ""))


# Query keys of signed or authenticated URLs: S3 (X-Amz-Signature, X-Amz-Credential, X-Amz-Security-Token),
# GCS (X-Goog-Signature), CloudFront (Signature, Key-Pair-Id, Policy), Azure SAS (sig), generic token/key.
SIGNED_QUERY = re.compile(r"(?i)(signature|credential|security-token|sig\Z|token|key|secret|auth|password|"
                          r"session|policy)")


def url_secrets(url):
    """What of a URL must not be shown: its query string (raw and decoded) and the password of its
    userinfo.  The modules add these to Ansible's no_log values, so ``invocation.module_args`` and every
    result show ``********`` in their place; messages use redact_url()."""
    if not url or not isinstance(url, str):
        return []
    p = urlsplit(url)
    out = set()
    if p.query:
        out.update((p.query, unquote(p.query)))
    if p.password:
        out.update((p.password, unquote(p.password)))
    return sorted((x for x in out if x), key=len, reverse=True)


def looks_signed(url):
    """Whether a URL's query carries a credential (a signed URL, a token parameter): its keys say so."""
    try:
        keys = [k for k, _v in parse_qsl(urlsplit(url or "").query, keep_blank_values=True)]
    except ValueError:
        return True
    return any(SIGNED_QUERY.search(k) for k in keys)


def hide_url_query(module):
    """In a module (model_download, gguf_info): mask the ``url`` option's query string and userinfo password
    in everything the module returns, ``invocation.module_args`` included (AWX stores it), and warn when
    the query looks like a credential: Ansible logged the arguments on the node before the module ran, so
    such a query belongs in ``url_query`` (no_log)."""
    url = module.params.get("url")
    secrets = url_secrets(url)
    if not secrets:
        return
    module.no_log_values.update(secrets)
    if looks_signed(url):
        module.warn("url carries a query string that looks like a credential (a signed URL?). It is masked "
                    "in this result, but Ansible logged the module arguments on the node before the module "
                    "ran: pass the query string as url_query (never logged) instead")


def scrub(text, token):
    """``text`` without the token in any form: raw, stripped, escaped (repr, JSON, bytes repr) and
    URL-encoded (any case). The collection's one rule (module_utils/secrets.py)."""
    return secrets.scrub(text, token)


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


def run_in_module(module, what, run, options, set_attributes):
    """In a module (model_download, model_snapshot): ``run`` (download.run, snapshot.run) over the module's
    ``options``, with ``set_attributes`` outside check mode; its result, or the module fails with the
    DownloadError's message and result (less the HTTP status) or, for anything unexpected, one line naming
    ``what``: never the token."""
    params = dict((name, module.params[name]) for name in options)
    token = module.params["token"]
    try:
        return run(params, check_mode=module.check_mode,
                   set_attributes=None if module.check_mode else set_attributes)
    except DownloadError as e:
        extra = dict((k, v) for k, v in e.result.items() if k != "status")
        module.fail_json(msg=scrub(e.msg, token), **extra)
    except Exception as e:  # unexpected: still one clear line, never the token
        module.fail_json(msg=scrub("%s failed: %s: %s" % (what, type(e).__name__, e), token))
