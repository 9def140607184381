# -*- coding: utf-8 -*-
# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The gateway's configuration structure: the serving instances of the upstream hosts -> HAProxy backends,
servers and map files, with the refusals a gateway in front of them needs.

    build(hosts, hostvars, gateway_host=, api_keys=, rate_limit=) -> {
        "backends": [{"name", "model", "api_key", "servers": [{"host", "instance", "server", "address",
                      "port", "engine"}]}],                  # first backend = default (first model seen)
        "default_backend": "be_<model>",
        "models_map": "<model> <backend>\\n...",             # body's "model" -> backend
        "keys_map": "<sha256 hex of key> <key name>\\n...",  # no plaintext key on the gateway's disk
        "limits_map": "<key name> <requests per minute>\\n...",
    }
    public_fact(config, url=, admin_socket=) -> the llmops_gateway fact (no key, no digest)

A backend's ``api_key`` is the key its instances share (serving_api_keys[instance] on the node): a secret,
only for the no_log task that writes haproxy.cfg. Controller-only (plugin_utils), plain Python, unit-tested by
tests/unit/plugins/plugin_utils/test_gateway_config.py; the role reaches it through plugins/filter/gateway.py.
"""
from __future__ import absolute_import, division, print_function

import hashlib
import re

from ansible_collections.llmops.serving.plugins.plugin_utils.instance_plan import is_loopback
from ansible_collections.llmops.serving.plugins.plugin_utils.serving_errors import (
    ServingError,
    get_var,
    is_number,
)

__metaclass__ = type

WILDCARDS = ("", "0.0.0.0", "::", "[::]", "*")
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")
_KEY_NAME_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


class GatewayError(ServingError):
    """The upstream instances or the gateway's variables cannot make a safe gateway; the message says why."""


def sanitize(name):
    """A name HAProxy accepts as a backend or server name and the runtime API can address."""
    return _UNSAFE.sub("_", str(name))


def key_digest(key):
    """SHA-256 hex digest (lower case) of a client key: what HAProxy's `sha2(256),hex,lower` computes."""
    return hashlib.sha256(str(key).encode("utf-8")).hexdigest()


def _bind_addresses(bind):
    return [part.strip() for part in str(bind or "").split(",")]


def server_address(host, instance, fact, node_address, gateway_host):
    """Where the gateway reaches `instance` of `host`: the node's address when the instance binds a wildcard,
    the address it binds otherwise; loopback only from the same node (or when the node address itself is
    loopback: every node on one host's network, as in the Molecule scenarios)."""
    binds = _bind_addresses(fact.get("host", "127.0.0.1"))
    if any(b in WILDCARDS for b in binds):
        return str(node_address)
    specific = [b for b in binds if not is_loopback(b)]
    if specific:
        return specific[0].strip("[]")
    if is_loopback(node_address):
        return str(node_address).strip("[]")
    if host == gateway_host:
        return binds[0].strip("[]")
    raise GatewayError(
        "instance %s of %s binds %s (loopback): only a gateway on %s itself can reach it. Bind it to "
        "the node's address or 0.0.0.0 (serving_instances[].host, with serving_fronted_by_proxy: true and "
        "its key in serving_api_keys), or run the gateway on %s"
        % (instance, host, fact.get("host"), host, host))


def _client_keys(api_keys, rate_limit):
    if not is_number(rate_limit) or int(rate_limit) < 1:
        raise GatewayError("gateway_rate_limit must be a number of requests per minute >= 1, got %r"
                           % (rate_limit,))
    if not api_keys:
        raise GatewayError("gateway_api_keys is empty: the gateway would refuse every request. Give a "
                           "list of {name, key, rate_limit} (keys from Ansible Vault or an AWX credential)")
    names, digests, keys_lines, limit_lines = set(), set(), [], []
    for index, entry in enumerate(api_keys):
        if not isinstance(entry, dict) or not entry.get("name") or not entry.get("key"):
            raise GatewayError("gateway_api_keys[%d] needs a name and a key" % index)
        name = str(entry["name"])
        if not _KEY_NAME_RE.match(name):
            raise GatewayError("gateway_api_keys[%d]: name %r: use 1-64 letters, digits, '.', '_' or '-' (it "
                               "is logged and keys the rate limit)" % (index, name))
        if name in names:
            raise GatewayError("gateway_api_keys: name %s is used twice" % name)
        key = str(entry["key"])
        if re.search(r"\s", key):
            raise GatewayError("gateway_api_keys[%s]: the key contains whitespace; a bearer token cannot"
                               % name)
        digest = key_digest(key)
        if digest in digests:
            raise GatewayError("gateway_api_keys[%s]: the same key is given to two names" % name)
        limit = entry.get("rate_limit", rate_limit)
        if limit is None:
            limit = rate_limit
        if not is_number(limit) or int(limit) < 1:
            raise GatewayError("gateway_api_keys[%s]: rate_limit must be requests per minute >= 1, got %r"
                               % (name, limit))
        names.add(name)
        digests.add(digest)
        keys_lines.append("%s %s\n" % (digest, name))
        limit_lines.append("%s %d\n" % (name, int(limit)))
    return "".join(keys_lines), "".join(limit_lines)


def build(hosts, hostvars, gateway_host=None, api_keys=(), rate_limit=60):
    """The gateway's backends, servers and maps from the llmops_instances of `hosts` (see module doc)."""
    if not hosts:
        raise GatewayError("gateway_upstream_hosts is empty: no serving host to put the gateway in front of "
                           "(default: the hosts of group llm_nodes)")
    backends, by_model, server_names = [], {}, {}
    for host in hosts:
        host = str(host)
        node = get_var(hostvars, host)
        if node is None:
            raise GatewayError("upstream host %s is not in the inventory" % host)
        instances = get_var(node, "llmops_instances", {})
        if not instances:
            raise GatewayError(
                "upstream host %s publishes no llmops_instances: run role serving on it first (in the same "
                "play run, or with fact caching since llmops_instances is cacheable)" % host)
        node_address = get_var(node, "llmops_node_address") or get_var(node, "ansible_host") or host
        node_keys = get_var(node, "serving_api_keys", {})
        for instance in sorted(instances):
            fact = instances[instance] or {}
            model = str(fact.get("served_model_name") or instance)
            if re.search(r"\s", model):
                raise GatewayError("instance %s of %s: served model name %r contains whitespace; the gateway "
                                   "routes by it (set served_model_name)" % (instance, host, model))
            port = fact.get("port")
            if not (is_number(port) or str(port).isdigit()):
                raise GatewayError("instance %s of %s has no port in llmops_instances" % (instance, host))
            address = server_address(host, instance, fact, node_address, gateway_host)
            server = sanitize("%s-%s" % (host, instance))
            if server in server_names:
                raise GatewayError("instances %s and %s/%s have the same server name %s once sanitized; "
                                   "rename one" % (server_names[server], host, instance, server))
            server_names[server] = "%s/%s" % (host, instance)
            key = get_var(node_keys, instance)
            key = str(key) if key else None
            if model not in by_model:
                name = "be_" + sanitize(model)
                clash = [b for b in backends if b["name"] == name]
                if clash:
                    raise GatewayError("models %s and %s have the same backend name %s once sanitized"
                                       % (clash[0]["model"], model, name))
                by_model[model] = {"name": name, "model": model, "api_key": key, "servers": [],
                                   "_key_from": "%s/%s" % (host, instance)}
                backends.append(by_model[model])
            backend = by_model[model]
            if backend["api_key"] != key:
                raise GatewayError(
                    "instances %s and %s/%s serve model %s (one backend) with different API keys "
                    "(serving_api_keys): the gateway sends one key per backend; give them the same key"
                    % (backend["_key_from"], host, instance, model))
            backend["servers"].append({"host": host, "instance": str(instance), "server": server,
                                       "address": address, "port": int(port),
                                       "engine": fact.get("engine")})
    keys_map, limits_map = _client_keys(api_keys, rate_limit)
    for backend in backends:
        backend.pop("_key_from")
    return {
        "backends": backends,
        "default_backend": backends[0]["name"],
        "models_map": "".join("%s %s\n" % (b["model"], b["name"]) for b in backends),
        "keys_map": keys_map,
        "limits_map": limits_map,
    }


def haproxy_address(address, port):
    """`address:port` as a HAProxy server line spells it (IPv6 with the ipv6@ prefix)."""
    address = str(address).strip("[]")
    if ":" in address:
        return "ipv6@%s:%d" % (address, int(port))
    return "%s:%d" % (address, int(port))


def public_fact(config, url, admin_socket):
    """The llmops_gateway fact: what the rolling update needs to drain a host's servers (no secrets)."""
    return {
        "url": url,
        "admin_socket": admin_socket,
        "default_backend": config["default_backend"],
        "backends": dict((b["name"], [s["server"] for s in b["servers"]]) for b in config["backends"]),
        "servers": [{"host": s["host"], "instance": s["instance"], "backend": b["name"],
                     "server": s["server"], "address": haproxy_address(s["address"], s["port"])}
                    for b in config["backends"] for s in b["servers"]],
    }


def parse_version(text):
    """'HAProxy version 2.6.12-1+deb12u4 ...' (haproxy -v) -> [2, 6, 12]."""
    match = re.search(r"(?:HA-?Proxy version|^)\s*(\d+)\.(\d+)(?:\.(\d+))?", str(text or ""), re.I | re.M)
    if not match:
        raise GatewayError("cannot read the HAProxy version from %r" % (str(text)[:200],))
    return [int(match.group(1)), int(match.group(2)), int(match.group(3) or 0)]
