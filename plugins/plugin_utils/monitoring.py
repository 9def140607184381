# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The monitoring roles' decisions, on the controller: what each node's Prometheus agent scrapes and where it
writes, what the monitoring host expects from the inventory, and Alertmanager's configuration.

    agent_plan(host, instances, options)           -> {"config", "credentials", "warnings"} (role monitoring)
    node_textfile(host, instances, models_mount)   -> Prometheus text of the instances' static facts
    models_mountpoint(paths, mounts)               -> the mount point that holds the models
    inventory_nodes(hosts, hostvars)               -> {host: {instance: {engine}}} of the monitored nodes
    inventory_rules(nodes, min_decode_tps, max_ttft_s, ...)  -> the rule groups rendered from the inventory
    server_config(options)                         -> the monitoring host's prometheus.yml
    prometheus_args(options)                       -> the flags of its Prometheus (ARGS of /etc/default)
    alertmanager_config(options)                   -> alertmanager.yml

How the figures leave a node (docs/monitoring.md): a Prometheus in agent mode on the node scrapes everything
on loopback (node_exporter with the GPU collector's textfile, each instance's /metrics, the gateway's and
Ray's exporters) and remote-writes to the monitoring host. No instance port is opened, vLLM's unguarded
/metrics never leaves the node, and llama-server's key stays in a file on the node (`authorization:
credentials_file`, a 0640 copy the agent's user can read), never in a label, a command line or the
controller's output.

Controller-only (plugin_utils), plain Python; unit-tested by
tests/unit/plugins/plugin_utils/test_monitoring.py.
"""
from __future__ import absolute_import, division, print_function

import posixpath

from ansible_collections.llmops.serving.plugins.module_utils import engines
from ansible_collections.llmops.serving.plugins.module_utils.validators import matches, whole
from ansible_collections.llmops.serving.plugins.plugin_utils.benchmark_report import threshold
from ansible_collections.llmops.serving.plugins.plugin_utils.gateway_config import check_address
from ansible_collections.llmops.serving.plugins.plugin_utils.instance_plan import is_loopback
from ansible_collections.llmops.serving.plugins.plugin_utils.serving_errors import (
    ServingError,
    get_var,
    is_number,
)

__metaclass__ = type

# Job names: the rules and dashboards select by them (roles/monitoring_server: templates/rules, files/).
JOB_NODE = "llmops_node"
JOB_INSTANCE = "llmops_instance"
JOB_GATEWAY = "llmops_gateway"
JOB_RAY = "llmops_ray"
JOB_DCGM = "llmops_dcgm"
JOB_AGENT = "llmops_agent"
# Alerts about an instance's figures: silenced while the instance is down (its figures are gone then).
INSTANCE_ALERTS = ("LlmopsRequestsStalled", "LlmopsDecodeBelowGate", "LlmopsTtftAboveGate")
_DURATION_RE = whole(r"([0-9]+(ms|s|m|h|d|w|y))+")
# A basic-auth user (Prometheus' web configuration, Grafana's data source): no ':' (basic auth's separator),
# no whitespace, quote or control character.
_USERNAME_RE = whole(r"[A-Za-z0-9._@+-]{1,64}")
# A path Prometheus' flags may hold as is (ARGS="..." is split at whitespace, quotes would be kept).
_FLAG_PATH_RE = whole(r"/[A-Za-z0-9._/-]*")


class MonitoringError(ServingError):
    """A monitoring input the roles cannot use; the message says what to change."""


def _duration(value, name):
    text = str(value or "")
    if not _DURATION_RE.match(text):
        raise MonitoringError("%s: %r is not a Prometheus duration (e.g. 15s, 1m, 2h)" % (name, value))
    return text


def check_username(value, setting):
    """`value` when it is a basic-auth user name, else MonitoringError naming `setting`."""
    if not isinstance(value, str) or not _USERNAME_RE.match(value):
        raise MonitoringError("%s: %r is not a user name (1 to 64 letters, digits and . _ @ + -)"
                              % (setting, value))
    return value


def _served(entry, name):
    served = entry.get("served_model_name") or name
    return ",".join(str(s) for s in served) if isinstance(served, (list, tuple)) else str(served)


def _host_port(url, what):
    match = matches(r"https?://(\[[^\]]+\]|[^/:]+)(?::([0-9]+))?(/.*)?", str(url or ""))
    if not match:
        raise MonitoringError("%s: %r is not an http(s) URL" % (what, url))
    port = match.group(2) or ("443" if str(url).startswith("https") else "80")
    return "%s:%s" % (match.group(1), port), match.group(3) or "/"


# --- the node's Prometheus agent ---------------------------------------------------------------------------

def credential_path(directory, instance):
    """Where the agent reads the key of a llama.cpp instance: a copy of its key file its user may read."""
    return posixpath.join(directory, "%s.key" % instance)


def agent_plan(host, instances, options):
    """The agent's prometheus.yml (a dict), the key files to copy ({instance, src, dest}) and warnings.

    `instances`: llmops_instances of the host (role serving). `options` (role monitoring's variables):
    remote_write_url, remote_write_username, remote_write_password_file, remote_write_ca_file (optional),
    scrape_interval, scrape_timeout, node_exporter (host:port), agent (host:port), credentials_dir,
    gateway_metrics_url, ray_metrics (host:port), dcgm (host:port), queue_config (dict, optional)."""
    opts = dict(options or {})
    url = opts.get("remote_write_url")
    if not url:
        raise MonitoringError("monitoring_remote_write_url is empty: set it to the monitoring host's "
                              "https://<host>:9090/api/v1/write (role monitoring_server publishes it as "
                              "llmops_monitoring.remote_write_url)")
    _host_port(url, "monitoring_remote_write_url")
    if not opts.get("remote_write_password_file"):
        raise MonitoringError("the agent needs the remote-write password (monitoring_remote_write_password, "
                              "from the vault): the monitoring host accepts no anonymous writes")
    interval = _duration(opts.get("scrape_interval") or "15s", "monitoring_scrape_interval")
    timeout = _duration(opts.get("scrape_timeout") or "10s", "monitoring_scrape_timeout")
    node = str(host)

    def job(name, target, labels=None, path=None, extra=None):
        # `instance` names the node (or node:instance), not the loopback address every node shares.
        config = {"job_name": name, "static_configs": [{
            "targets": [target], "labels": dict({"node": node, "instance": node}, **(labels or {}))}]}
        if path and path != "/metrics":
            config["metrics_path"] = path
        config.update(extra or {})
        return config

    scrape = [job(JOB_AGENT, opts.get("agent") or "127.0.0.1:9095"),
              job(JOB_NODE, opts.get("node_exporter") or "127.0.0.1:9100")]
    credentials, warnings = [], []
    for name in sorted(instances or {}):
        entry = instances[name] or {}
        engine = entry.get("engine") or engines.DEFAULT_ENGINE
        if engines.lookup(engine) is None:
            raise MonitoringError("instance %s: engine %r has no metrics mapping (known: %s)"
                                  % (name, engine, ", ".join(engines.names())))
        target, path = _host_port(entry.get("url"), "llmops_instances[%s].url" % name)
        if not is_loopback(target.rsplit(":", 1)[0].strip("[]")):
            warnings.append("instance %s binds %s: the agent scrapes it there, from the node itself"
                            % (name, target))
        labels = {"llm_instance": name, "llm_engine": engine, "served_model_name": _served(entry, name),
                  "instance": "%s:%s" % (node, name)}
        # One job per instance: a key is a setting of the scrape job, not of a target. They all get the job
        # label llmops_instance, which the rules and dashboards select.
        extra = {"relabel_configs": [{"target_label": "job", "replacement": JOB_INSTANCE}]}
        if entry.get("key_file"):
            dest = credential_path(opts.get("credentials_dir") or "/etc/llmops-monitoring/keys", name)
            credentials.append({"instance": name, "src": entry["key_file"], "dest": dest})
            extra["authorization"] = {"type": "Bearer", "credentials_file": dest}
        scrape.append(job("%s_%s" % (JOB_INSTANCE, name), target, labels, path.rstrip("/") + "/metrics",
                          extra))
    if opts.get("gateway_metrics_url"):
        target, path = _host_port(opts["gateway_metrics_url"], "llmops_gateway.metrics_url")
        scrape.append(job(JOB_GATEWAY, target, path=path))
    if opts.get("ray_metrics"):
        scrape.append(job(JOB_RAY, opts["ray_metrics"]))
    if opts.get("dcgm"):
        scrape.append(job(JOB_DCGM, opts["dcgm"]))
    remote = {"url": url, "basic_auth": {"username": opts.get("remote_write_username") or "llmops-agent",
                                         "password_file": opts["remote_write_password_file"]},
              "queue_config": dict(opts.get("queue_config") or {})}
    if opts.get("remote_write_ca_file"):
        remote["tls_config"] = {"ca_file": opts["remote_write_ca_file"]}
    if not remote["queue_config"]:
        del remote["queue_config"]
    config = {"global": {"scrape_interval": interval, "scrape_timeout": timeout,
                         "external_labels": {"node": node}},
              "scrape_configs": scrape, "remote_write": [remote]}
    return {"config": config, "credentials": credentials, "warnings": warnings}


def models_mountpoint(paths, mounts):
    """The mount point (of Ansible's ansible_mounts) holding the first of `paths`: the longest prefix."""
    best = None
    for path in paths or ():
        path = posixpath.normpath(str(path))
        for mount in mounts or ():
            point = str(mount.get("mount") or "")
            if point and (path == point or path.startswith(point.rstrip("/") + "/")):
                if best is None or len(point) > len(best):
                    best = point
        if best:
            return best
    return best


def _escape(value):
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def node_textfile(instances, models_dir=None, models_mount=None):
    """Prometheus text for node_exporter's textfile collector: what the inventory knows of each instance and
    cannot be scraped (slots, context, model, build), and where the models live."""
    lines = ["# HELP llmops_instance_info The instances role serving runs on this node.",
             "# TYPE llmops_instance_info gauge"]
    slots, context = [], []
    for name in sorted(instances or {}):
        entry = instances[name] or {}
        engine = entry.get("engine") or engines.DEFAULT_ENGINE
        descriptor = engines.lookup(engine)
        settings = entry.get("settings") or {}
        labels = 'llm_instance="%s",llm_engine="%s"' % (_escape(name), _escape(engine))
        lines.append('llmops_instance_info{%s,served_model_name="%s",model_sha256="%s",build_id="%s"} 1'
                     % (labels, _escape(_served(entry, name)), _escape(entry.get("model_sha256") or ""),
                        _escape(entry.get("build_id") or "")))
        if descriptor is None:  # agent_plan refuses it; nothing says which settings are its slots
            continue
        count = settings.get(descriptor.slots_setting)
        if is_number(count):
            slots.append("llmops_instance_slots{%s} %d" % (labels, count))
        tokens = settings.get(descriptor.context_setting)
        if is_number(tokens):
            context.append("llmops_instance_context_tokens{%s} %d" % (labels, tokens))
    lines += ["# HELP llmops_instance_slots Requests an instance runs at once (%s)."
              % _per_engine("slots_setting"), "# TYPE llmops_instance_slots gauge"] + slots
    lines += ["# HELP llmops_instance_context_tokens The context an instance was given (%s)."
              % _per_engine("context_setting"), "# TYPE llmops_instance_context_tokens gauge"] + context
    if models_mount:
        lines += ["# HELP llmops_models_filesystem The filesystem holding the models (its mount point).",
                  "# TYPE llmops_models_filesystem gauge",
                  'llmops_models_filesystem{mountpoint="%s",path="%s"} 1'
                  % (_escape(models_mount), _escape(models_dir or models_mount))]
    return "\n".join(lines) + "\n"


# --- the monitoring host -----------------------------------------------------------------------------------

def _per_engine(field):
    """'llama.cpp parallel, vLLM max_num_seqs': each engine's label and its descriptor's `field`."""
    return ", ".join("%s %s" % (engine.label, getattr(engine, field)) for engine in engines.ENGINES.values())


def inventory_nodes(hosts, hostvars, default_engine=engines.DEFAULT_ENGINE):
    """{host: {instance: {"engine": ...}}} of the monitored hosts: what role serving published
    (llmops_instances, from the fact cache) or, before it ran, what the inventory asks for
    (serving_instances)."""
    nodes = {}
    for host in hosts or ():
        node = get_var(hostvars, host, {})
        published = get_var(node, "llmops_instances")
        if published:
            nodes[str(host)] = {str(n): {"engine": get_var(e, "engine", default_engine)}
                                for n, e in published.items()}
            continue
        wanted = get_var(node, "serving_instances", []) or []
        engine = get_var(node, "serving_default_engine", default_engine)
        nodes[str(host)] = {str(i["name"]): {"engine": i.get("engine") or engine}
                            for i in wanted if isinstance(i, dict) and i.get("name")}
    return nodes


def inventory_rules(nodes, min_decode_tps=None, max_ttft_s=None):
    """The rule groups that depend on the inventory: the instances each node should report
    (llmops:expected_instance, for the alert on an instance whose figures stop arriving) and the validate
    gates per instance (llmops:gate:min_decode_tps, llmops:gate:max_ttft_seconds), a number for all or a
    mapping instance -> number as validate_min_decode_tps / validate_max_ttft_s take them (0 or empty: none).

    `nodes`: {inventory host: {instance name: llmops_instances entry or {"engine": ...}}}."""
    expected, gates = [], []
    names = set()
    for node in sorted(nodes or {}):
        for name in sorted(nodes[node] or {}):
            entry = nodes[node][name] or {}
            names.add(name)
            expected.append({"record": "llmops:expected_instance", "expr": "vector(1)",
                             "labels": {"node": str(node), "llm_instance": name,
                                        "llm_engine": entry.get("engine") or engines.DEFAULT_ENGINE}})
    settings = (("llmops:gate:min_decode_tps", min_decode_tps, "validate_min_decode_tps"),
                ("llmops:gate:max_ttft_seconds", max_ttft_s, "validate_max_ttft_s"))
    for name in sorted(names):
        for record, setting, variable in settings:
            value = threshold(setting, name, variable)
            # 0 is "no gate" also when it arrives as text ("{{ validate_max_ttft_s | default(0) }}").
            if value is not None and value > 0:
                gates.append({"record": record, "expr": "vector(%r)" % value,
                              "labels": {"llm_instance": name}})
    groups = [{"name": "llmops-inventory", "rules": expected}]
    if gates:
        groups.append({"name": "llmops-gates", "rules": gates})
    return {"groups": [g for g in groups if g["rules"]]}


def server_config(options):
    """The monitoring host's prometheus.yml: its own rules, Alertmanager, and itself and Alertmanager as
    targets (the nodes' figures arrive by remote write)."""
    opts = dict(options or {})
    config = {
        "global": {"scrape_interval": _duration(opts.get("scrape_interval") or "15s",
                                                "monitoring_server_scrape_interval"),
                   "evaluation_interval": _duration(opts.get("evaluation_interval") or "15s",
                                                    "monitoring_server_evaluation_interval")},
        "rule_files": [posixpath.join(opts.get("rules_dir") or "/etc/prometheus/llmops-rules", "*.yml")],
        "alerting": {"alertmanagers": [{"static_configs": [
            {"targets": [opts.get("alertmanager") or "127.0.0.1:9093"]}]}]},
        "scrape_configs": [],
    }
    prometheus = {"job_name": "llmops_prometheus",
                  "static_configs": [{"targets": [opts.get("prometheus") or "127.0.0.1:9090"]}]}
    if opts.get("self_password_file"):
        # The server's own endpoints need the same basic auth as everyone else's.
        prometheus["basic_auth"] = {"username": check_username(opts.get("self_username") or "llmops-grafana",
                                                               "monitoring_server_query_username"),
                                    "password_file": opts["self_password_file"]}
    config["scrape_configs"].append(prometheus)
    config["scrape_configs"].append({"job_name": "llmops_alertmanager",
                                     "static_configs": [{"targets": [opts.get("alertmanager")
                                                                     or "127.0.0.1:9093"]}]})
    return config


def prometheus_args(options):
    """The monitoring host's Prometheus flags, for Debian's /etc/default/prometheus (ARGS="...", which the
    unit splits at whitespace): every value checked over the whole string, so none can hold a space, a quote,
    a '$' or a newline that would add a flag (--web.enable-admin-api) or a variable (LD_PRELOAD=...).

    `options`: listen_address, port, retention, config_file, web_config."""
    opts = dict(options or {})
    address = str(check_address(opts.get("listen_address") or "0.0.0.0", "monitoring_server_listen_address"))
    port = opts.get("port", 9090)
    if isinstance(port, bool) or not (is_number(port) or matches(r"[0-9]{1,5}", port)) \
            or not 0 < int(port) < 65536 or int(port) != float(port):
        raise MonitoringError("monitoring_server_port: %r is not a port (1-65535)" % (port,))
    retention = _duration(opts.get("retention") or "30d", "monitoring_server_retention")
    paths = []
    for key in ("config_file", "web_config"):
        if not _FLAG_PATH_RE.match(str(opts.get(key) or "")):
            raise MonitoringError("Prometheus' %s %r is not an absolute path of letters, digits and . _ / -"
                                  % (key, opts.get(key)))
        paths.append(opts[key])
    return ["--config.file=%s" % paths[0],
            "--web.listen-address=%s:%d" % ("[%s]" % address if ":" in address else address, int(port)),
            "--web.config.file=%s" % paths[1],
            "--web.enable-remote-write-receiver",
            "--storage.tsdb.retention.time=%s" % retention]


def alertmanager_config(options):
    """alertmanager.yml: one route to the receivers given (Alertmanager's own receiver syntax), grouped by
    alert, node and instance; an instance that is down silences its other alerts."""
    opts = dict(options or {})
    receivers = list(opts.get("receivers") or [])
    if not receivers:
        raise MonitoringError("monitoring_server_alertmanager_receivers is empty: give at least one receiver "
                              "(Alertmanager syntax, e.g. {name: ops, webhook_configs: [{url: ...}]})")
    names = [r.get("name") for r in receivers if isinstance(r, dict)]
    if len(names) != len(receivers) or not all(names):
        raise MonitoringError("each Alertmanager receiver needs a name")
    default = opts.get("default_receiver") or names[0]
    if default not in names:
        raise MonitoringError("monitoring_server_alertmanager_default_receiver %r is not one of the "
                              "receivers (%s)" % (default, ", ".join(names)))
    for key in ("group_wait", "group_interval", "repeat_interval"):
        if opts.get(key):
            _duration(opts[key], "monitoring_server_alertmanager_%s" % key)
    route = {"receiver": default, "group_by": ["alertname", "node", "llm_instance"],
             "group_wait": opts.get("group_wait") or "30s",
             "group_interval": opts.get("group_interval") or "5m",
             "repeat_interval": opts.get("repeat_interval") or "4h"}
    if opts.get("routes"):
        route["routes"] = list(opts["routes"])
    return {
        "route": route,
        "receivers": receivers,
        "inhibit_rules": [
            {"source_matchers": ['alertname="LlmopsInstanceDown"'],
             "target_matchers": ['alertname=~"%s"' % "|".join(INSTANCE_ALERTS)],
             "equal": ["node", "llm_instance"]},
        ],
    }
