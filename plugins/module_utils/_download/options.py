# -*- coding: utf-8 -*-
# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
# PRIVATE to llmops.serving: it can change at any time; do not import it from other collections.
"""The options of model_download, written once: the module's argument spec and the defaults of the logic
both come from OPTIONS (the module's DOCUMENTATION must agree; a unit test compares them), then
normalize() checks what the argument spec cannot.

Plain Python 3.6, standard library only; importable without Ansible.
"""
from __future__ import absolute_import, division, print_function

import math
import os
import re
from urllib.parse import urlsplit

from ansible_collections.llmops.serving.plugins.module_utils._download.http import url_origin
from ansible_collections.llmops.serving.plugins.module_utils._download.messages import (
    DownloadError,
    redact_url,
)
from ansible_collections.llmops.serving.plugins.module_utils._download.source import HEX64, MAX_FILE_SIZE
from ansible_collections.llmops.serving.plugins.module_utils.secrets import BAD_SECRET_CHARS

__metaclass__ = type

MIB = 1 << 20
DEFAULT_ENDPOINT = "https://huggingface.co"
# Per hub: default endpoint, default revision, and the node's environment variables for endpoint and token
# (the ModelScope SDK reads MODELSCOPE_DOMAIN, a host name or URL, and MODELSCOPE_API_TOKEN).
HUBS = {
    "huggingface": {"endpoint": DEFAULT_ENDPOINT, "revision": "main", "endpoint_env": "HF_ENDPOINT",
                    "token_env": "HF_TOKEN"},
    "modelscope": {"endpoint": "https://www.modelscope.cn", "revision": "master",
                   "endpoint_env": "MODELSCOPE_DOMAIN", "token_env": "MODELSCOPE_API_TOKEN"},
}
# ModelScope's SDK authenticates repository downloads with this cookie (its value is the access token).
MODELSCOPE_COOKIE = "m_session_id"
BAD_TOKEN_CHARS = BAD_SECRET_CHARS  # the collection's one rule (module_utils/secrets.py)
CONTROL_CHARS = re.compile(r"[\x00-\x1f\x7f]")
# The options that name things (never a secret): a control character (a newline from a template, a NUL) is
# refused naming the option.  url is refused without echoing it (a signed URL carries a credential).
NAMES = ("repo", "filename", "revision", "endpoint", "url", "dest", "progress_file", "sha256")
# Numeric options: (lowest, highest, integer).  Sizes are file offsets (off_t); the others are bounds a
# human would set (a day of stall timeout, a week of waiting for the lock, 1000 retries, an hour of backoff).
RANGES = {
    "size": (0, MAX_FILE_SIZE, True),
    "connections": (1, None, True),
    "parallel_min_size": (0, MAX_FILE_SIZE, True),
    "timeout": (1, 86400, True),
    "retries": (0, 1000, True),
    "retry_delay": (0, 3600, False),
    "free_space_margin": (0, MAX_FILE_SIZE, True),
    "lock_timeout": (0, 7 * 86400, False),
}

# name -> Ansible argument spec entry (type, default, required, choices, no_log)
OPTIONS = {
    "repo": {"type": "str"},
    "filename": {"type": "str"},
    "source": {"type": "str", "default": "huggingface", "choices": ["huggingface", "modelscope"]},
    "revision": {"type": "str"},
    "endpoint": {"type": "str"},
    "token": {"type": "str", "no_log": True},
    "url": {"type": "str"},
    "url_query": {"type": "str", "no_log": True},
    "dest": {"type": "path", "required": True},
    "sha256": {"type": "str"},
    "size": {"type": "int"},
    "connections": {"type": "int", "default": 8},
    "parallel_min_size": {"type": "int", "default": 64 * MIB},
    "update": {"type": "bool", "default": False},
    "force_verify": {"type": "bool", "default": False},
    "progress_file": {"type": "path"},
    "timeout": {"type": "int", "default": 30},
    "retries": {"type": "int", "default": 8},
    "retry_delay": {"type": "float", "default": 2.0},
    "validate_certs": {"type": "bool", "default": True},
    "free_space_margin": {"type": "int", "default": 256 * MIB},
    "lock_timeout": {"type": "int", "default": 600},
}

# How the options combine (AnsibleModule keyword arguments).
OPTION_RULES = {
    "mutually_exclusive": [("url", "repo")],
    "required_one_of": [("url", "repo")],
    "required_together": [("repo", "filename")],
    "required_by": {"url_query": ("url",)},
}

DEFAULTS = dict((name, spec.get("default")) for name, spec in OPTIONS.items())


# The options that name a hub and how to reach it, the same in every module that reads one (model_download,
# model_snapshot, gguf_info, safetensors_info; documented once, doc fragment llmops.serving.download).
HUB_OPTIONS = ("source", "revision", "endpoint", "token", "validate_certs")
# A header read (gguf_info, safetensors_info: a few MB before anything is downloaded) rather than a transfer:
# fewer retries and a shorter first backoff than a 19 GB download's (8 retries, 2 s).
HEADER_READ_DEFAULTS = {"retries": 2, "retry_delay": 1.0}


def argument_spec():
    """A fresh copy of OPTIONS for AnsibleModule(argument_spec=...)."""
    return dict((name, dict(spec)) for name, spec in OPTIONS.items())


def header_read_argument_spec(names, **own):
    """The argument spec of a module that reads headers from a hub (gguf_info, safetensors_info): the
    HUB_OPTIONS, timeout and retries (HEADER_READ_DEFAULTS) and the options that name the remote source
    (`names`: url, repo, filename...) as OPTIONS declares them, then the module's `own` options."""
    spec = dict((name, dict(OPTIONS[name])) for name in HUB_OPTIONS + ("timeout", "retries") + tuple(names))
    spec["retries"]["default"] = HEADER_READ_DEFAULTS["retries"]
    spec.update(own)
    return spec


class HubToken(str):
    """The token as a string, plus the cookie name the hub also expects it in (ModelScope: m_session_id);
    download_http.Session sends both only to the token's origin."""

    cookie_name = None

    def __new__(cls, value, cookie_name=None):
        token = str.__new__(cls, value)
        token.cookie_name = cookie_name
        return token


def _hub_defaults(o, params):
    """Endpoint, revision and token of a repo source from the options, else the node's environment for
    that hub (never another hub's token), else the hub's defaults."""
    hub = HUBS[o["source"]]
    endpoint = params.get("endpoint") or os.environ.get(hub["endpoint_env"]) or hub["endpoint"]
    if "://" not in endpoint:  # MODELSCOPE_DOMAIN is usually a bare host name
        endpoint = "https://" + endpoint
    o["endpoint"] = endpoint.rstrip("/")
    o["revision"] = o["revision"] or hub["revision"]
    if not o["token"]:
        o["token"] = os.environ.get(hub["token_env"]) or None
        if o["token"] and BAD_TOKEN_CHARS.search(o["token"]):
            raise DownloadError("%s in the node's environment contains whitespace or control characters (a "
                                "trailing newline?): strip it (e.g. with trim) or pass the token option; the "
                                "token is not shown here" % hub["token_env"])


def _number(o, name):
    """o[name] as a number within RANGES[name]; else DownloadError naming the option (NaN, inf, a string)."""
    lo, hi, integer = RANGES[name]
    value = o[name]
    try:
        if isinstance(value, bool) or value is None:
            raise TypeError
        number = float(value)
        if not math.isfinite(number) or (integer and number != int(number)):
            raise ValueError
        number = int(value) if integer else number
    except (TypeError, ValueError, OverflowError):
        kind = "whole number" if integer else "number"
        raise DownloadError("%s must be a %s, got %r" % (name, kind, value)) from None
    if number < lo or (hi is not None and number > hi):
        bounds = "at least %s" % lo if hi is None else "between %s and %s" % (lo, hi)
        raise DownloadError("%s must be %s, got %s" % (name, bounds, value))
    return number


def _check_filename(filename):
    """A repo file: a path of names, none of them empty, '.' or '..' (a name like 'sub/' or '.' names a
    folder, and the file would land on the destination directory itself)."""
    parts = filename.split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise DownloadError("filename %r does not name a file in the repo: give the file's path, e.g. "
                            "model.gguf or folder/model-00001-of-00003.gguf (no empty, '.' or '..' part, no "
                            "leading or trailing /)" % filename)


def _check_url(name, url, pinned=False):
    """An http(s) URL with a host (a port, when given, a number), or for ``url`` with a pinned sha256 or for a
    reader (``pinned``) a ``file:///`` URL of an absolute path on the node (an offline bundle's file:
    download_local.py): else DownloadError naming the option (the URL is shown without its query and
    userinfo). The sha256 is required for a file: the module runs as root, and copying a file of the node
    that the caller could not name the digest of (/etc/shadow) into the models directory would disclose it."""
    try:
        p = urlsplit(url)
        ok = p.scheme in ("http", "https") and bool(p.hostname)
        p.port  # noqa: B018 - raises ValueError for a port that is not a number
        if name == "url" and p.scheme == "file":
            ok = pinned and not p.netloc and p.path.startswith("/") and not p.query and not p.fragment
    except ValueError:
        ok = False
    if not ok:
        raise DownloadError("%s must be an http(s) URL with a host, such as https://hf-mirror.com%s, got %r"
                            % (name, " (or file:///absolute/path/model.gguf with its sha256)"
                               if name == "url" else "",
                               redact_url(url)))


def _join_query(o):
    """url_query (a signed URL's query string, kept out of logs) appended to url."""
    query = o.get("url_query")
    if not query:
        return
    if not o["url"]:
        raise DownloadError("url_query is the query string of url: give url too")
    if BAD_TOKEN_CHARS.search(query):
        raise DownloadError("url_query contains whitespace or control characters (a trailing newline from a "
                            "vault or file lookup?): strip it; the value is not shown here")
    query = query[1:] if query.startswith("?") else query
    o["url"] = o["url"] + ("&" if "?" in o["url"] else "?") + query


def normalize(params, reads_only=False):
    """The options, checked and completed. ``reads_only``: the caller writes nothing of the file (gguf_info
    reads a header, as it reads any ``path``), so a ``file://`` url needs no sha256."""
    o = dict(DEFAULTS)
    o.update(dict((k, v) for k, v in params.items() if v is not None))
    for name in NAMES:
        value = o.get(name)
        if not isinstance(value, str):
            continue
        shown = redact_url(value) if name in ("url", "endpoint") else value
        if CONTROL_CHARS.search(value):
            raise DownloadError("%s contains a control character (a newline or NUL, often from a template or "
                                "a file lookup): remove it (%s: %r)" % (name, name, shown))
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise DownloadError("%s is not valid UTF-8 text (%s: %r): give it as UTF-8"
                                % (name, name, shown)) from None
    for name in RANGES:
        if o.get(name) is not None:
            o[name] = _number(o, name)
    if not o["dest"]:
        raise DownloadError("dest is required: the directory that receives the model file(s)")
    if os.path.isfile(o["dest"]) or o["dest"].endswith(".gguf"):
        raise DownloadError("dest must be the directory that receives the file(s), got %r; the file name "
                            "comes from filename (or url)" % o["dest"])
    if bool(o["url"]) == bool(o["repo"]):
        raise DownloadError("give either url, or repo and filename (a Hugging Face style source)")
    if o["source"] not in HUBS:
        raise DownloadError("source must be one of %s, got %r" % (", ".join(sorted(HUBS)), o["source"]))
    if o["url"] and o["source"] != "huggingface":
        raise DownloadError("source: %s names a hub for repo/filename; a plain url has no hub (leave source "
                            "unset)" % o["source"])
    if o["repo"]:
        if not o["filename"]:
            raise DownloadError("filename is required with repo (e.g. Qwen3.6-27B-UD-Q5_K_XL.gguf)")
        if o["repo"].count("/") != 1 or o["repo"].startswith("/") or o["repo"].endswith("/"):
            raise DownloadError("repo must look like 'org/name', got %r" % o["repo"])
        _check_filename(o["filename"])
        _hub_defaults(o, params)
    _check_url("endpoint" if o["repo"] else "url", o["endpoint"] if o["repo"] else o["url"],
               pinned=reads_only or bool((o["sha256"] or "").strip()))
    _join_query(o)
    if o["token"] and BAD_TOKEN_CHARS.search(o["token"]):
        raise DownloadError("token contains whitespace or control characters (often a trailing newline from "
                            "a vault or file lookup): strip it, e.g. token: \"{{ vault_hf_token | trim }}\"; "
                            "the token is not shown here")
    o["token"] = o["token"] or None
    if o["token"] and o["repo"] and o["source"] == "modelscope":
        o["token"] = HubToken(o["token"], MODELSCOPE_COOKIE)
    o["auth_origin"] = url_origin(o["endpoint"] if o["repo"] else o["url"])
    if o["sha256"]:
        o["sha256"] = o["sha256"].strip().lower()
        if o["sha256"].startswith("sha256:"):
            o["sha256"] = o["sha256"][7:]
        if not HEX64.match(o["sha256"]):
            raise DownloadError("sha256 must be 64 hex digits, got %r" % params.get("sha256"))
    o["connections"] = min(o["connections"], 64)
    o["lock_timeout"] = float(o["lock_timeout"])
    return o
