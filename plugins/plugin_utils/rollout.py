# -*- coding: utf-8 -*-
# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The fleet's rolling update and rollback: deployment records, a host's servers at the gateway, what to roll
back, and the summary of a rolling update.

    deployment_record(plan, unit_checksum=, time=, health_timeout=) -> current.json of an instance
    deployment_fingerprint(plan)                   -> what an instance runs, as 16 hex digits (validate)
    unrecorded_deployment(plan, unit_checksum=)   -> previous.json of a deployment made before records
    host_servers(host, hostvars, gateway_fact=)    -> [{backend, server, instance}] of `host` at the gateway
    rollback_selection(records, instance=, host=, directory=) -> the instances to put back (or a refusal)
    summary(hosts, hostvars)                       -> {updated, unchanged, failed, untouched, lines}
    deployment_run(play_name)                      -> {token, holder, owner} of this run, for the locks
    lock_owner_gone(lock)                          -> whether the run holding a lock was killed (process gone)

Controller-only (plugin_utils), plain Python, unit-tested by tests/unit/plugins/plugin_utils/test_rollout.py;
roles serving and fleet reach it through plugins/filter/fleet.py.
"""
from __future__ import absolute_import, division, print_function

import getpass
import hashlib
import json
import multiprocessing
import os
import re
import socket
import time
import uuid

from ansible_collections.llmops.serving.plugins.plugin_utils.gateway_config import gateway_names
from ansible_collections.llmops.serving.plugins.plugin_utils.instance_plan import served_name
from ansible_collections.llmops.serving.plugins.plugin_utils.serving_errors import ServingError, get_var

__metaclass__ = type

RECORD_VERSION = 1
# What a record keeps of the instance plan (no secret: keys are passed by file path or in the env file).
PLAN_FIELDS = ("name", "engine", "mode", "unit", "binary", "image", "build_id", "model", "model_path",
               "model_sha256", "served_model_name", "url", "port", "env_file", "key_file", "api_key_env",
               "settings")
STATUSES = ("updated", "unchanged", "failed")
# What a deployment fingerprint covers: everything of the plan that decides what the server does and how fast
# (program, build, model, settings, the command line and the unit's environment, GPUs), not its bookkeeping
# (warnings, timeouts, file paths of the key). The secret env values are in the env file, not the plan: a
# change of them is seen by role serving in the run that makes it (llmops_deployments[name].changed).
FINGERPRINT_FIELDS = ("engine", "mode", "binary", "image", "container_entrypoint", "container_args",
                      "build_id", "model_path", "model_sha256", "served_model_name", "gpus", "settings",
                      "subcommand", "argv", "env", "env_names", "ray_cluster")


class RolloutError(ServingError):
    """A rollback or rolling update cannot go on; the message says why."""


def deployment_run(play_name=None, _now=None):
    """{token, holder} of this run of a play: the token every step of the deployment lifecycle of this run
    passes (module deployment's lock_token: the lock of an instance is this run's from deploy to commit or
    restore), and who the run is, for the message that refuses another run (lock_holder). Made once per run
    (role serving keeps it in a fact): each call is a new run."""
    now = time.time() if _now is None else _now
    try:
        user = getpass.getuser()
    except (KeyError, OSError):     # no name for this uid (a container)
        user = "uid %d" % os.getuid() if hasattr(os, "getuid") else "?"
    holder = "play '%s' started %s by %s on controller %s" % (
        str(play_name or "?")[:120], time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now)), user,
        socket.gethostname())
    # one line of at most 300 characters: what module deployment writes into the lock (lock_holder)
    return {"token": "%s-%s" % (time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now)), uuid.uuid4().hex[:16]),
            "holder": re.sub(r"[\x00-\x1f\x7f]+", " ", holder)[:300], "owner": run_owner()}


# The lock's owner (module deployment's OWNER_RE): which process, in which pid namespace of which boot of a
# kernel (the host name is for people: two controllers may share one).
_OWNER_RE = re.compile(r"host=(?P<host>[A-Za-z0-9._-]{1,253}) boot=(?P<boot>[0-9a-f-]{36}) "
                       r"pidns=(?P<pidns>[0-9]{1,20}) pid=(?P<pid>[0-9]{1,10}) "
                       r"start=(?P<start>[0-9]{1,20})\Z")


def _controller(proc):
    """(host name as the owner spells it, boot id, pid namespace inode) of this controller's processes; the
    boot id or namespace None where /proc does not tell."""
    host = re.sub(r"[^A-Za-z0-9._-]", "_", socket.gethostname() or "?")[:253]
    try:
        with open(os.path.join(proc, "sys/kernel/random/boot_id")) as handle:
            boot = handle.read().strip()
    except (IOError, OSError):
        boot = None
    try:
        pidns = re.match(r"pid:\[([0-9]{1,20})\]\Z", os.readlink(os.path.join(proc, "self/ns/pid")))
    except (IOError, OSError):
        pidns = None
    return (host, boot if boot and re.match(r"[0-9a-f-]{36}\Z", boot) else None,
            pidns.group(1) if pidns else None)


def _start_ticks(proc, pid):
    """When process `pid` started (clock ticks after boot, /proc/<pid>/stat field 22), None when it is gone:
    no such process, or a zombie (killed, not yet reaped by its parent)."""
    try:
        with open(os.path.join(proc, str(pid), "stat")) as handle:
            stat = handle.read()
    except (IOError, OSError):
        return None
    fields = stat.rsplit(")", 1)[-1].split()     # after the command name, which may hold spaces and ')'
    if len(fields) < 20 or fields[0] in ("Z", "X") or not fields[19].isdigit():
        return None
    return fields[19]


def _playbook_pid():
    """The ansible-playbook process: a filter runs in a task's worker process (a fork of it) or in it."""
    parent = multiprocessing.parent_process()
    return parent.pid if parent is not None else os.getpid()


def run_owner(_proc="/proc", _pid=None):
    """This run's process, as module deployment records it in a lock (lock_owner): host name, boot id, pid
    namespace, ansible-playbook's pid and its start time; None where /proc cannot tell (then a killed run's
    lock waits for its deadline, as before)."""
    host, boot, pidns = _controller(_proc)
    pid = _playbook_pid() if _pid is None else _pid
    start = _start_ticks(_proc, pid)
    if boot is None or pidns is None or start is None:
        return None
    return "host=%s boot=%s pidns=%s pid=%d start=%s" % (host, boot, pidns, pid, start)


def lock_owner_gone(lock, _proc="/proc"):
    """Whether the run holding `lock` (module deployment's refusal: {token, owner, ...}) is gone: its owner is
    a process this controller can see - the same boot of the same kernel and the same pid namespace - and no
    process has that pid and start time now (killed, or ended; a zombie counts as gone). False for a lock of
    another controller (or container, or of this one before it rebooted: /proc cannot tell), without an
    owner, or of a process that still runs: those locks wait for their deadline."""
    match = _OWNER_RE.match(str((lock or {}).get("owner") or ""))
    if not match:
        return False
    _host, boot, pidns = _controller(_proc)
    if boot is None or (match.group("boot"), match.group("pidns")) != (boot, pidns):
        return False
    return _start_ticks(_proc, int(match.group("pid"))) != match.group("start")


def deployment_record(plan, unit_checksum=None, time=None, health_timeout=None):
    """The record of what instance `plan` (an item of the serving role's plan) runs now: what the unit starts
    (binary or image, build id, model path), its unit's SHA-256 and when it became healthy, plus what a
    rollback needs to health-check it (url, served name, key file or env variable, timeout)."""
    if not isinstance(plan, dict) or not plan.get("name") or not plan.get("unit"):
        raise RolloutError("deployment_record needs an instance plan with a name and a unit, got %r"
                           % (plan,))
    record = dict((field, plan.get(field)) for field in PLAN_FIELDS)
    record.update({
        "version": RECORD_VERSION,
        "recorded": True,
        "time": time,
        "unit_checksum": unit_checksum,
        "health_timeout": int(health_timeout) if health_timeout is not None else None,
    })
    return record


def deployment_fingerprint(plan):
    """16 hex digits that change when what the instance runs changes (FINGERPRINT_FIELDS of its plan).

    Role serving publishes it in llmops_instances; role validate records it beside each measurement and
    measures again only when it differs (or the deployment changed in this run, or it is asked to)."""
    if not isinstance(plan, dict):
        raise RolloutError("deployment_fingerprint needs an instance plan, got %r" % (plan,))
    described = dict((field, plan.get(field)) for field in FINGERPRINT_FIELDS)
    text = json.dumps(described, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def unrecorded_deployment(plan, unit_checksum=None):
    """previous.json of a deployment that predates records: its unit's checksum is known, what it ran is not
    (the health fields are the current plan's: the same instance, url and key)."""
    record = deployment_record(plan, unit_checksum=unit_checksum)
    for field in ("binary", "image", "build_id", "model", "model_path", "model_sha256", "settings"):
        record[field] = None
    record["recorded"] = False
    return record


def host_servers(host, hostvars, gateway_fact=None, instances=None):
    """The servers of `host`'s instances at the gateway: [{backend, server, instance}].

    From the gateway's llmops_gateway fact when this run has it (role gateway ran, or fact caching); else by
    the gateway's naming (gateway_config.gateway_names), for `instances` ([{name, served_model_name}]: the
    deployment records, for a rollback) or else the host's serving_instances."""
    host = str(host)
    servers = get_var(gateway_fact, "servers") if gateway_fact else None
    if servers is not None:
        return [{"backend": s["backend"], "server": s["server"], "instance": s["instance"]}
                for s in servers if str(s.get("host")) == host]
    node = get_var(hostvars, host, {})
    models = get_var(node, "llmops_models", {})
    out = []
    for raw in (instances if instances is not None else get_var(node, "serving_instances", [])) or []:
        if not isinstance(raw, dict) or not raw.get("name"):
            continue
        name = str(raw["name"])
        served = served_name(raw, name, models)
        if isinstance(served, (list, tuple)):
            served = served[0]
        backend, server = gateway_names(host, name, served)
        out.append({"backend": backend, "server": server, "instance": name})
    return out


def rollback_selection(records, instance=None, host=None, directory=None):
    """Which instances of a host to put back on their previous deployment.

    `records`: [{name, previous (bool: previous.service exists)}], one per deployment directory of the host.
    `instance`: the one named by rollback_instance, or None for all of the host's instances. Refuses (with
    the reason) when the named instance, or every instance of the host, has no previous deployment.
    `directory`: where the records are (role serving's serving_deployments_dir), named in the refusal."""
    where = " on %s" % host if host else ""
    by_name = dict((str(r["name"]), r) for r in records or ())
    if instance is not None:
        instance = str(instance)
        if instance not in by_name:
            raise RolloutError("instance %s has no deployment record%s (%s/%s): it was never deployed by "
                               "role serving here" % (instance, where, directory or "serving_deployments_dir",
                                                      instance))
        if not by_name[instance].get("previous"):
            raise RolloutError("instance %s has no previous deployment%s to roll back to: it was deployed "
                               "once, or never changed since records exist" % (instance, where))
        return [instance]
    names = sorted(name for name, record in by_name.items() if record.get("previous"))
    if not names:
        raise RolloutError("no instance%s has a previous deployment to roll back to (%s)"
                           % (where, ", ".join(sorted(by_name)) or "no deployment records"))
    return names


def summary(hosts, hostvars):
    """The rolling update's outcome from each host's fleet_result fact ({status, instances, why}); a host
    without one was never reached (the play stopped first, or it was not in the batches)."""
    out = {"updated": [], "unchanged": [], "failed": [], "untouched": []}
    for host in hosts or ():
        host = str(host)
        result = get_var(get_var(hostvars, host, {}), "fleet_result")
        if not result:
            out["untouched"].append(host)
            continue
        status = result.get("status")
        if status not in STATUSES:
            raise RolloutError("host %s: fleet_result status %r is not one of %s"
                               % (host, status, ", ".join(STATUSES)))
        if status == "failed":
            # the first line says why; the rest (journal lines) is in the host's failure message
            why = (str(result.get("why") or "").strip().splitlines() or [None])[0]
            out["failed"].append({"host": host, "instance": result.get("instance"), "why": why})
        else:
            out[status].append(host)
    lines = ["updated: %s" % (", ".join(out["updated"]) or "none"),
             "unchanged: %s" % (", ".join(out["unchanged"]) or "none")]
    for failed in out["failed"]:
        lines.append("FAILED: %s (instance %s): %s" % (failed["host"], failed["instance"] or "-",
                                                       failed["why"] or "unknown"))
    if not out["failed"]:
        lines.append("failed: none")
    lines.append("untouched: %s" % (", ".join(out["untouched"]) or "none"))
    out["lines"] = lines
    return out
