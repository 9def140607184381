# -*- coding: utf-8 -*-
# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The gateway's configuration structure: the serving instances of the upstream hosts -> HAProxy backends,
servers and map files, with the refusals a gateway in front of them needs.

    build(hosts, hostvars, gateway_host=, api_keys=, rate_limit=, settings=) -> {
        "backends": [{"name", "model", "models", "api_key", "auth_header", "timeout_server", "timeout_reason",
                      "servers": [{"host", "instance", "server", "address", "port", "engine", "context"}]}],
        "default_backend": "be_<model>",                     # first backend (first model seen)
        "single_model": bool,                                # one backend: requests naming no model go there
        "models": "a, b",                                    # the served names, for the gateway's messages
        "settings": {...},                                   # the role's variables, checked (see SETTINGS)
        "models_map": "<model> <backend>\\n...",             # the requested model -> backend
        "keys_map": "<sha256 hex of key> <key name>\\n...",  # no plaintext key on the gateway's disk
        "limits_map": "<key name> <generations per minute>\\n...",
        "request_limits_map": "<key name> <requests per minute>\\n...",  # never below its generations
    }
    public_fact(config, url=, admin_socket=) -> the llmops_gateway fact (no key, no digest)

Nothing user-given becomes configuration syntax: every value that haproxy.cfg or a map file receives is
checked or escaped here, at plan time, and a refusal names the setting (never a key's value). A backend's
``api_key`` is the key its instances share (serving_api_keys[instance] on the node): a secret, only for the
no_log task that writes haproxy.cfg, which gets it as ``auth_header`` (escaped for a double-quoted HAProxy
log-format string). Controller-only (plugin_utils), plain Python, unit-tested by
tests/unit/plugins/plugin_utils/test_gateway_config.py; the role reaches it through plugins/filter/gateway.py.
"""
from __future__ import absolute_import, division, print_function

import hashlib
import ipaddress
import math
import re
import unicodedata

from ansible_collections.llmops.serving.plugins.module_utils import engines
from ansible_collections.llmops.serving.plugins.module_utils.secrets import secret_problem
from ansible_collections.llmops.serving.plugins.module_utils.validators import matches, whole
from ansible_collections.llmops.serving.plugins.plugin_utils.instance_plan import is_loopback
from ansible_collections.llmops.serving.plugins.plugin_utils.serving_errors import (
    ServingError,
    get_var,
    is_number,
)

__metaclass__ = type

WILDCARDS = ("", "0.0.0.0", "::", "[::]", "*")
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")
_KEY_NAME_RE = whole(r"[A-Za-z0-9_.-]{1,64}")
# A host name HAProxy resolves at start (letters, digits, '-', '_' and dots; 253 characters at most).
_HOSTNAME_RE = whole(r"(?=.{1,253}\Z)[A-Za-z0-9_][A-Za-z0-9_-]{0,62}"
                     r"(\.[A-Za-z0-9_][A-Za-z0-9_-]{0,62})*\.?")
# HAProxy's time format: a number and an optional unit (milliseconds without one).
_TIME_RE = whole(r"([0-9]{1,12})(us|ms|s|m|h|d)?")
_TIME_UNIT_MS = {"us": 0.001, "ms": 1, None: 1, "s": 1000, "m": 60000, "h": 3600000, "d": 86400000}
# HAProxy refuses a timer of 2^31 ms or more ("timer overflow").
_TIME_MAX_MS = 2 ** 31 - 1
# Unquoted words of haproxy.cfg: none of the characters its parser gives a meaning (quotes, backslash, '#'
# comments, '$' variables, '%' log-format) nor whitespace.
_WORD_RE = whole(r"[A-Za-z0-9._~:/@,;=+!*()\[\]?&-]+")
_PATH_RE = whole(r"/[A-Za-z0-9._/-]*")
_URI_RE = whole(r"/[A-Za-z0-9._~/?&=+,;:@!*()-]*")
# What haproxy.cfg's double-quoted, log-format header value may hold as is (the space is ours: 'Bearer <key>',
# a key has none); anything else is written \xNN.
_HEADER_SAFE = frozenset(" ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
                         "-._~+/=:,;@!*()[]{}^|<>?&")
# Characters a served model name may not hold: they mean something to HAProxy's parser, its log-format, the
# JSON of the gateway's messages or a map file's syntax.
_MODEL_FORBIDDEN = frozenset("\"'\\`$%#{}")
INT_MAX = 2 ** 31 - 1

# The role's variables (gateway_<name>) that reach haproxy.cfg, with their check: see _check_settings.
SETTINGS = ("bind_address", "port", "tls", "log_target", "admin_socket", "maxconn", "bufsize", "health_path",
            "health_inter", "health_fall", "health_rise", "retries", "timeout_connect", "timeout_client",
            "timeout_server", "timeout_queue", "timeout_body", "request_rate_limit",
            "slowest_tokens_per_second", "assumed_context")
DEFAULT_SETTINGS = {
    "bind_address": "0.0.0.0", "port": 8443, "tls": True, "log_target": "stdout format raw local0 info",
    "admin_socket": "/run/haproxy/llmops-admin.sock", "maxconn": 4096, "bufsize": 65536,
    "health_path": "/health", "health_inter": "2s", "health_fall": 3, "health_rise": 2, "retries": 3,
    "timeout_connect": "5s",
    "timeout_client": "10m", "timeout_server": "10m", "timeout_queue": "60s", "timeout_body": "60s",
    "request_rate_limit": 600, "slowest_tokens_per_second": 20, "assumed_context": 131072,
}


class GatewayError(ServingError):
    """The upstream instances or the gateway's variables cannot make a safe gateway; the message says why."""


def sanitize(name):
    """A name HAProxy accepts as a backend or server name and the runtime API can address."""
    return _UNSAFE.sub("_", str(name))


def gateway_names(host, instance, model):
    """(backend, server): the gateway's names of `instance` of `host` serving `model` (its first served model
    name): backend be_<model>, server <host>-<instance>, both sanitized. The fleet finds a host's servers by
    them (rollout.host_servers)."""
    return "be_" + sanitize(model), sanitize("%s-%s" % (host, instance))


def key_digest(key):
    """SHA-256 hex digest (lower case) of a client key: what HAProxy's `sha2(256),hex,lower` computes."""
    return hashlib.sha256(str(key).encode("utf-8")).hexdigest()


def _bind_addresses(bind):
    return [part.strip() for part in str(bind or "").split(",")]


def _is_ip(text):
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def check_address(value, setting):
    """An IP address or a host name, as a server or bind line may hold it; else GatewayError naming the
    setting (an address is no secret: the message shows it, escaped)."""
    text = str(value).strip("[]") if isinstance(value, str) else value
    if isinstance(text, str) and (_is_ip(text) or _HOSTNAME_RE.match(text)):
        return text
    raise GatewayError("%s: %r is not an IP address or a host name (letters, digits, '-', '_' and dots)"
                       % (setting, value))


def bind_address(address, port, setting):
    """(address, "address:port" of a bind line): a wildcard as given, else a checked IP address or host name
    (GatewayError naming `setting`); `port` an int."""
    if address in ("*", "::", "0.0.0.0"):
        return address, "%s:%d" % (address, port)
    checked = check_address(address, setting)
    return checked, haproxy_address(checked, port)


def bind_line(address, port, setting):
    """The "address:port" of a bind line (the metrics frontend's): see bind_address; '' is every address."""
    return bind_address(address or "*", _int(port, setting.replace("address", "port"), 1, 65535), setting)[1]


def check_key(value, setting):
    """A bearer token the gateway can handle: printable ASCII, no whitespace or control character. The
    message names the setting and never shows the value."""
    if not isinstance(value, str) or not value:
        raise GatewayError("%s: the key must be a non-empty string" % setting)
    # the collection's one rule (module_utils/secrets.py), narrowed to what a bearer header carries
    if secret_problem(value, setting) or any(not ("!" <= char <= "~") for char in value):
        raise GatewayError("%s: the key contains whitespace, a control character or a non-ASCII character; a "
                           "bearer token cannot (the key is not shown)" % setting)
    return value


def header_value(text):
    """`text` (a checked key: printable ASCII) as the content of a double-quoted HAProxy log-format string:
    '%' doubled (log-format), anything outside a plain set written \\xNN (the parser's escape), so that '"',
    '\\', '$' (an environment variable in double quotes), '#' and quotes stay data."""
    out = []
    for char in text:
        if char == "%":
            out.append("%%")
        elif char in _HEADER_SAFE:
            out.append(char)
        else:
            out.append("\\x%02x" % ord(char))
    return "".join(out)


def check_model_name(value, setting):
    """A served model name the gateway can route by (map file key, X-Model header, its own messages)."""
    if not isinstance(value, str) or not value:
        raise GatewayError("%s: a served model name must be a non-empty string, got %r" % (setting, value))
    bad = [c for c in value
           if c.isspace() or c in _MODEL_FORBIDDEN or unicodedata.category(c).startswith("C")]
    if bad or len(value) > 256:
        raise GatewayError("%s: served model name %r: the gateway routes by it, so it may not hold "
                           "whitespace, control characters nor any of %s, and has 256 characters at most "
                           "(set served_model_name)" % (setting, value, " ".join(sorted(_MODEL_FORBIDDEN))))
    return value


def _int(value, setting, low, high):
    if is_number(value) and math.isfinite(value) and value == int(value):
        number = int(value)
    elif isinstance(value, str) and matches(r"[0-9]{1,18}", value.strip()):
        number = int(value.strip())
    else:
        raise GatewayError("%s must be a whole number from %d to %d, got %r" % (setting, low, high, value))
    if not low <= number <= high:
        raise GatewayError("%s must be a whole number from %d to %d, got %r" % (setting, low, high, value))
    return number


def _number(value, setting, low, high):
    number = value
    if isinstance(value, str):
        try:
            number = float(value.strip())
        except ValueError:
            number = None
    if not is_number(number) or not (math.isfinite(number) and low < number <= high):
        raise GatewayError("%s must be a number above %g and at most %g, got %r"
                           % (setting, low, high, value))
    return number


def time_ms(value, setting):
    """HAProxy's time format ('10m', '500ms', '30') -> milliseconds; else GatewayError naming the setting."""
    match = _TIME_RE.match(str(value).strip()) if isinstance(value, (str, int)) and not isinstance(
        value, bool) else None
    if not match:
        raise GatewayError("%s: %r is not an HAProxy time (a number and a unit: us, ms, s, m, h or d, "
                           "e.g. 10m)" % (setting, value))
    ms = int(match.group(1)) * _TIME_UNIT_MS[match.group(2)]
    if not 1 <= ms <= _TIME_MAX_MS:
        raise GatewayError("%s: %r is out of HAProxy's range (1 ms to 24 days)" % (setting, value))
    return int(ms)


def _check_settings(raw):
    """The role's variables that reach haproxy.cfg, checked and normalised ('gateway_' + name in messages)."""
    given = dict(DEFAULT_SETTINGS)
    given.update(dict((k, v) for k, v in (raw or {}).items() if v is not None))
    unknown = sorted(set(given) - set(SETTINGS))
    if unknown:
        raise GatewayError("unknown gateway settings: %s" % ", ".join(unknown))

    def name(key):
        return "gateway_" + key

    out = {}
    out["port"] = _int(given["port"], name("port"), 1, 65535)
    out["bind_address"], out["bind"] = bind_address(given["bind_address"], out["port"], name("bind_address"))
    tls = given["tls"]
    if isinstance(tls, str) and tls.strip().lower() in ("true", "false"):
        tls = tls.strip().lower() == "true"  # Ansible may template a boolean to its text
    if not isinstance(tls, bool):
        raise GatewayError("gateway_tls must be true or false, got %r" % (given["tls"],))
    out["tls"] = tls
    log = given["log_target"]
    if not isinstance(log, str) or not all(_WORD_RE.match(word) for word in log.split(" ")):
        raise GatewayError("gateway_log_target: %r: give HAProxy log target words (e.g. 'stdout format raw "
                           "local0 info', '/dev/log local0'), separated by single spaces, without quotes, "
                           "'#', '$' or '%%'" % (log,))
    out["log_target"] = log
    socket = given["admin_socket"]
    if not isinstance(socket, str) or not _PATH_RE.match(socket) or len(socket) > 100:
        raise GatewayError("gateway_admin_socket: %r: give an absolute path of letters, digits, '.', '_', "
                           "'-' and '/' (100 characters at most: a Unix socket path)" % (socket,))
    out["admin_socket"] = socket
    out["maxconn"] = _int(given["maxconn"], name("maxconn"), 1, 1000000)
    out["bufsize"] = _int(given["bufsize"], name("bufsize"), 16384, 16 << 20)
    health = given["health_path"]
    if not isinstance(health, str) or not _URI_RE.match(health):
        raise GatewayError("gateway_health_path: %r: give a path starting with '/' without spaces, quotes, "
                           "'#', '$' or '%%'" % (health,))
    out["health_path"] = health
    for key in ("health_fall", "health_rise"):
        out[key] = _int(given[key], name(key), 1, 1000)
    out["retries"] = _int(given["retries"], name("retries"), 0, 100)
    for key in ("health_inter", "timeout_connect", "timeout_client", "timeout_server", "timeout_queue",
                "timeout_body"):
        time_ms(given[key], name(key))
        out[key] = str(given[key]).strip()
    out["request_rate_limit"] = _int(given["request_rate_limit"], name("request_rate_limit"), 1, INT_MAX)
    out["slowest_tokens_per_second"] = _number(given["slowest_tokens_per_second"],
                                               name("slowest_tokens_per_second"), 0, 1e6)
    out["assumed_context"] = _int(given["assumed_context"], name("assumed_context"), 1, 1 << 30)
    return out


def instance_context(fact, assumed):
    """The longest context (tokens) an instance serves, from its settings: its engine's context_setting
    (engines.py: llama.cpp's ctx_size, 0: the model's own, unknown here; vLLM's max_model_len); `assumed`
    when the settings do not say. Returns (tokens, where it comes from)."""
    settings = fact.get("settings") if isinstance(fact.get("settings"), dict) else {}
    key = engines.or_default(fact.get("engine")).context_setting
    value = settings.get(key)
    if isinstance(value, str) and matches(r"[0-9]{1,12}", value.strip()):
        value = int(value.strip())
    if is_number(value) and value >= 1 and value == int(value):
        return int(value), key
    return assumed, "gateway_assumed_context (%s not set)" % key


def server_timeout(servers, settings):
    """A backend's `timeout server` and the reason: the longest context any of its instances serves, at the
    slowest rate the gateway waits for (gateway_slowest_tokens_per_second), at least gateway_timeout_server.

    `timeout server` is how long an engine may send nothing. It sends nothing while it reads the prompt
    (prefill: minutes for a long context) and, for a request that does not stream, until the whole answer is
    generated. Cutting it there loses the generation (the gateway never sends a POST twice), so the
    timeout covers the longest context at the slowest rate; a host that vanished is found by TCP keepalive
    and the health checks instead."""
    floor_ms = time_ms(settings["timeout_server"], "gateway_timeout_server")
    longest = max(servers, key=lambda s: s["context"])
    needed_s = int(math.ceil(longest["context"] / float(settings["slowest_tokens_per_second"])))
    if needed_s * 1000 <= floor_ms:
        return settings["timeout_server"], (
            "gateway_timeout_server: the longest context, %d tokens (server %s, %s), takes %ds at %g tokens/s"
            % (longest["context"], longest["server"], longest["context_from"], needed_s,
               settings["slowest_tokens_per_second"]))
    needed_s = min(needed_s, _TIME_MAX_MS // 1000)
    return "%ds" % needed_s, (
        "the longest context, %d tokens (server %s, %s), at %g tokens/s (gateway_slowest_tokens_per_second)"
        % (longest["context"], longest["server"], longest["context_from"],
           settings["slowest_tokens_per_second"]))


def server_address(host, instance, fact, node_address, gateway_host):
    """Where the gateway reaches `instance` of `host`: the node's address when the instance binds a wildcard,
    the address it binds otherwise; loopback only from the same node (or when the node address itself is
    loopback: every node on one host's network, as in the Molecule scenarios). Checked: an IP address or a
    host name, nothing a server line could take for syntax."""
    address = _server_address(host, instance, fact, node_address, gateway_host)
    return check_address(address, "instance %s of %s: its address (the instance's host, else the node's "
                                  "llmops_node_address / ansible_host / inventory name)" % (instance, host))


def _server_address(host, instance, fact, node_address, gateway_host):
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


def _client_keys(api_keys, rate_limit, request_rate_limit):
    """keys.map, ratelimits.map and requestlimits.map contents, and the default generation limit. A key's
    limit on all requests is gateway_request_rate_limit, or its own generation limit when that is higher:
    a key allowed N generations a minute can always make them."""
    rate_limit = _int(rate_limit, "gateway_rate_limit", 1, INT_MAX)
    if api_keys and not isinstance(api_keys, (list, tuple)):
        raise GatewayError("gateway_api_keys must be a list of {name, key, rate_limit}, got %s"
                           % type(api_keys).__name__)
    if not api_keys:
        raise GatewayError("gateway_api_keys is empty: the gateway would refuse every request. Give a "
                           "list of {name, key, rate_limit} (keys from Ansible Vault or an AWX credential)")
    names, digests, keys_lines, limit_lines, request_lines = set(), set(), [], [], []
    for index, entry in enumerate(api_keys):
        if not isinstance(entry, dict) or not entry.get("name") or not entry.get("key"):
            raise GatewayError("gateway_api_keys[%d] needs a name and a key" % index)
        name = entry["name"]
        if not isinstance(name, str) or not _KEY_NAME_RE.match(name):
            raise GatewayError("gateway_api_keys[%d]: name %r: use 1-64 letters, digits, '.', '_' or '-' (it "
                               "is logged and keys the rate limit)" % (index, name))
        if name in names:
            raise GatewayError("gateway_api_keys: name %s is used twice" % name)
        key = entry["key"]
        key = check_key(str(key) if is_number(key) else key, "gateway_api_keys[%s].key" % name)
        digest = key_digest(key)
        if digest in digests:
            raise GatewayError("gateway_api_keys[%s]: the same key is given to two names" % name)
        limit = entry.get("rate_limit")
        limit = rate_limit if limit is None else _int(limit, "gateway_api_keys[%s].rate_limit" % name, 1,
                                                      INT_MAX)
        names.add(name)
        digests.add(digest)
        keys_lines.append("%s %s\n" % (digest, name))
        limit_lines.append("%s %d\n" % (name, limit))
        request_lines.append("%s %d\n" % (name, max(limit, request_rate_limit)))
    return "".join(keys_lines), "".join(limit_lines), "".join(request_lines), rate_limit


def _served_names(fact, instance, host):
    value = fact.get("served_model_name") or instance
    names = list(value) if isinstance(value, (list, tuple)) else [value]
    setting = "instance %s of %s: served_model_name" % (instance, host)
    if not names:
        raise GatewayError("%s is empty" % setting)
    return [check_model_name(name, setting) for name in names]


def build(hosts, hostvars, gateway_host=None, api_keys=(), rate_limit=60, settings=None):
    """The gateway's backends, servers and maps from the llmops_instances of `hosts` (see module doc)."""
    settings = _check_settings(settings)
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
        if not instances or not isinstance(instances, dict):
            raise GatewayError(
                "upstream host %s publishes no llmops_instances: run role serving on it first (in the same "
                "play run, or with fact caching since llmops_instances is cacheable)" % host)
        node_address = get_var(node, "llmops_node_address") or get_var(node, "ansible_host") or host
        node_keys = get_var(node, "serving_api_keys", {})
        for instance in sorted(instances, key=str):
            fact = instances[instance] or {}
            if not isinstance(fact, dict):
                raise GatewayError("instance %s of %s: its llmops_instances entry is not a mapping"
                                   % (instance, host))
            names = _served_names(fact, instance, host)
            model = names[0]
            port = fact.get("port")
            if isinstance(port, str) and port.strip().isdigit():
                port = int(port.strip())
            if not is_number(port):
                raise GatewayError("instance %s of %s has no port in llmops_instances" % (instance, host))
            port = _int(port, "instance %s of %s: port" % (instance, host), 1, 65535)
            address = server_address(host, instance, fact, node_address, gateway_host)
            backend_name, server = gateway_names(host, instance, model)
            if server in server_names:
                raise GatewayError("instances %s and %s/%s have the same server name %s once sanitized; "
                                   "rename one" % (server_names[server], host, instance, server))
            server_names[server] = "%s/%s" % (host, instance)
            key = get_var(node_keys, instance)
            key = check_key(str(key) if is_number(key) else key,
                            "serving_api_keys[%s] of host %s" % (instance, host)) if key else None
            if model not in by_model:
                name = backend_name
                clash = [b for b in backends if b["name"] == name]
                if clash:
                    raise GatewayError("models %s and %s have the same backend name %s once sanitized"
                                       % (clash[0]["model"], model, name))
                by_model[model] = {"name": name, "model": model, "models": names, "api_key": key,
                                   "servers": [], "_key_from": "%s/%s" % (host, instance)}
                backends.append(by_model[model])
            backend = by_model[model]
            if backend["models"] != names:
                raise GatewayError(
                    "instances %s and %s/%s serve model %s (one backend) under different names (%s and %s): "
                    "give them the same served_model_name" % (backend["_key_from"], host, instance, model,
                                                              ", ".join(backend["models"]), ", ".join(names)))
            if backend["api_key"] != key:
                raise GatewayError(
                    "instances %s and %s/%s serve model %s (one backend) with different API keys "
                    "(serving_api_keys): the gateway sends one key per backend; give them the same key"
                    % (backend["_key_from"], host, instance, model))
            context, context_from = instance_context(fact, settings["assumed_context"])
            backend["servers"].append({"host": host, "instance": str(instance), "server": server,
                                       "address": address, "port": port, "engine": fact.get("engine"),
                                       "context": context, "context_from": context_from})
    routes = {}
    for backend in backends:
        for model in backend["models"]:
            if model in routes and routes[model] != backend["name"]:
                raise GatewayError("served model name %s is given to two backends (%s and %s): give each "
                                   "model its own name" % (model, routes[model], backend["name"]))
            routes[model] = backend["name"]
    keys_map, limits_map, request_limits_map, rate_limit = _client_keys(api_keys, rate_limit,
                                                                        settings["request_rate_limit"])
    for backend in backends:
        backend.pop("_key_from")
        backend["auth_header"] = header_value("Bearer " + backend["api_key"]) if backend["api_key"] else None
        backend["timeout_server"], backend["timeout_reason"] = server_timeout(backend["servers"], settings)
    settings["rate_limit"] = rate_limit
    return {
        "backends": backends,
        "default_backend": backends[0]["name"],
        "single_model": len(backends) == 1,
        "models": ", ".join(sorted(routes)),
        "settings": settings,
        "models_map": "".join("%s %s\n" % (model, routes[model]) for model in sorted(routes)),
        "keys_map": keys_map,
        "limits_map": limits_map,
        "request_limits_map": request_limits_map,
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
