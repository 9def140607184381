# -*- coding: utf-8 -*-
# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The options of model_download, written once: the module's argument spec and the defaults of the logic
both come from OPTIONS (the module's DOCUMENTATION must agree; a unit test compares them), then
normalize() checks what the argument spec cannot.

Plain Python 3.6, standard library only; importable without Ansible.
"""
from __future__ import absolute_import, division, print_function

import os
import re

from ansible_collections.llmops.serving.plugins.module_utils.download_http import url_origin
from ansible_collections.llmops.serving.plugins.module_utils.download_messages import DownloadError
from ansible_collections.llmops.serving.plugins.module_utils.download_source import HEX64

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
BAD_TOKEN_CHARS = re.compile(r"[\s\x00-\x1f\x7f]")

# name -> Ansible argument spec entry (type, default, required, choices, no_log)
OPTIONS = {
    "repo": {"type": "str"},
    "filename": {"type": "str"},
    "source": {"type": "str", "default": "huggingface", "choices": ["huggingface", "modelscope"]},
    "revision": {"type": "str"},
    "endpoint": {"type": "str"},
    "token": {"type": "str", "no_log": True},
    "url": {"type": "str"},
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
}

DEFAULTS = dict((name, spec.get("default")) for name, spec in OPTIONS.items())


def argument_spec():
    """A fresh copy of OPTIONS for AnsibleModule(argument_spec=...)."""
    return dict((name, dict(spec)) for name, spec in OPTIONS.items())


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
        if ".." in o["filename"].split("/"):
            raise DownloadError("filename must not contain '..'")
        _hub_defaults(o, params)
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
    for k in ("connections", "retries", "timeout"):
        if int(o[k]) < (0 if k == "retries" else 1):
            raise DownloadError("%s must be at least %d" % (k, 0 if k == "retries" else 1))
    o["connections"] = min(int(o["connections"]), 64)
    o["lock_timeout"] = float(o["lock_timeout"])
    if o["lock_timeout"] < 0:
        raise DownloadError("lock_timeout must be at least 0 (seconds to wait for another run)")
    return o
