# -*- coding: utf-8 -*-
# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The one rule for every key and token the collection takes (issue 23): hub tokens (model_download,
model_snapshot, gguf_info, safetensors_info), the API key of llm_benchmark, the instance keys of llama-server
and vLLM in serving plans and env files, the gateway's backend and client keys, a signed URL's query string.

- A secret with whitespace or a control character is refused, naming the setting and never the value: it
  is nearly always a trailing newline from a vault or file lookup, and it would either break the header it
  goes into (``Invalid header value b'Bearer ...\\n'``, with the key in the message) or be written into a
  file that its reader splits differently.
- Every message the collection returns is scrubbed of the secret in every form it can take there: raw,
  stripped, repr- and JSON-escaped, bytes-escaped (``b'Bearer sk-...\\n'``), URL-encoded (any case).

Plain Python 3.6, standard library only; importable without Ansible (the planners on the controller and
the modules on the node use it alike).
"""
from __future__ import absolute_import, division, print_function

import json
import re
from urllib.parse import quote, quote_plus

__metaclass__ = type

MASK = "********"
# whitespace (any Unicode space, as str.split sees it) and the C0 controls and DEL
BAD_SECRET_CHARS = re.compile(r"[\s\x00-\x1f\x7f]")
# a secret longer than this is not a key (a file read by mistake?)
MAX_SECRET_LENGTH = 4096


class SecretError(ValueError):
    """A secret that cannot be used as given; the message names the setting, never the value."""


def secret_problem(value, setting):
    """Why `value` cannot be the secret of `setting` (None when it can). Never includes the value."""
    if not isinstance(value, str):
        return "%s must be a string, got a %s; the value is not shown here" % (setting, type(value).__name__)
    if not value:
        return "%s is empty" % setting
    if BAD_SECRET_CHARS.search(value):
        return ("%s contains whitespace or a control character (often a trailing newline from a vault or "
                "file lookup): strip it, e.g. \"{{ my_key | trim }}\"; the value is not shown here" % setting)
    if len(value) > MAX_SECRET_LENGTH:
        return "%s is longer than %d characters: not a key; the value is not shown here" % (
            setting, MAX_SECRET_LENGTH)
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return "%s is not valid UTF-8 text; the value is not shown here" % setting
    return None


def check_secret(value, setting):
    """`value` when it is a usable secret; else SecretError naming `setting` (never the value)."""
    problem = secret_problem(value, setting)
    if problem:
        raise SecretError(problem)
    return value


def secret_forms(secret):
    """Every spelling of `secret` a message can carry, longest first."""
    if not isinstance(secret, str) or not secret:
        return []
    forms = set()
    for text in (secret, secret.strip()):
        if len(text) < 3:  # masking one or two characters everywhere would make every message unreadable
            continue
        forms.update((text, repr(text)[1:-1], json.dumps(text)[1:-1],
                      json.dumps(text, ensure_ascii=False)[1:-1], quote(text, safe=""), quote(text),
                      quote_plus(text),
                      repr(text.encode("utf-8", "surrogateescape"))[2:-1],
                      repr(text.encode("utf-8", "surrogatepass"))[2:-1],
                      repr(text.encode("latin-1", "replace"))[2:-1]))
    return sorted((form for form in forms if form), key=len, reverse=True)


def scrub(text, *secrets, **options):
    """`text` without any of `secrets` in any form (raw, stripped, escaped, URL-encoded, any case), each
    replaced by options["mask"] (default MASK)."""
    mask = options.get("mask", MASK)
    if not text or not isinstance(text, str):
        return text
    for secret in secrets:
        for form in secret_forms(secret):
            text = re.sub(re.escape(form), lambda _m: mask, text, flags=re.IGNORECASE)
    return text


def scrub_all(obj, *secrets, **_depth):
    """scrub() every string in a result (dicts, lists, tuples; keys too)."""
    secrets = [s for s in secrets if isinstance(s, str) and s]
    if not secrets:
        return obj
    depth = _depth.get("depth", 0)
    if depth > 64:  # results are shallow; a deeper one is not ours to walk
        return obj
    if isinstance(obj, str):
        return scrub(obj, *secrets)
    if isinstance(obj, dict):
        return dict((scrub(k, *secrets) if isinstance(k, str) else k, scrub_all(v, *secrets, depth=depth + 1))
                    for k, v in obj.items())
    if isinstance(obj, (list, tuple)):
        return [scrub_all(v, *secrets, depth=depth + 1) for v in obj]
    return obj
