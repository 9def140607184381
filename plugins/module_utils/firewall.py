# -*- coding: utf-8 -*-
# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Ports opened in firewalld with firewall-cmd: what llmops.serving.firewall_ports wants, reads and changes.

Why the CLI: CentOS 7 has no python3 firewalld bindings, and ansible.posix.firewalld imports them into the
module's interpreter (/usr/bin/python3 under ansible-core 2.16) and fails; firewall-cmd is a python2 program
that brings its own. Why not one --query per rule: each firewall-cmd call costs about half a second there, so
the module lists each layer once (--list-ports, --list-rich-rules; permanent and runtime) and changes only
what is missing, in one call per layer and kind (firewall-cmd takes --add-port/--add-rich-rule many times).

A wanted rule is a port (``8003/tcp``, a range ``10002-10999/tcp``) open either to the whole zone (no sources:
whoever the zone admits, by default the zone of the interface, ``public`` on CentOS 7) or to each source
address through a rich rule ``rule family="ipv4" source address="<src>" port port="<p>" protocol="<proto>"
accept``. Rules the module added are recorded per owner (``<record_dir>/<owner>.json``): a recorded rule that
is no longer wanted (the instance was removed, a source dropped) is removed; a rule it did not add is never
touched, even when it matches.

Plain Python 3.6, standard library only, importable without Ansible.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import ipaddress
import json
import os
import re

from ansible_collections.llmops.serving.plugins.module_utils import local_read

PROTOCOLS = ("tcp", "udp", "sctp", "dccp")
_PORT_RE = re.compile(r"^([0-9]{1,5})(?:-([0-9]{1,5}))?(?:/([a-z]+))?$")
_ATTR_RE = re.compile(r'([a-z]+)="([^"]*)"')


class FirewallError(Exception):
    """Bad input, with what to write instead."""


def normal_port(spec):
    """8003, '8003', '8003/tcp', '10002-10999' -> '8003/tcp', '10002-10999/tcp'."""
    text = str(spec).strip().lower()
    match = _PORT_RE.match(text)
    if not match:
        raise FirewallError("port %r: write a port (8003), a range (10002-10999) or either with a protocol "
                            "(8003/tcp)" % (spec,))
    low, high, proto = int(match.group(1)), match.group(2), match.group(3) or "tcp"
    high = int(high) if high is not None else None
    if not 1 <= low <= 65535 or (high is not None and not low < high <= 65535):
        raise FirewallError("port %r is out of range 1-65535 (or the range is backwards)" % (spec,))
    if proto not in PROTOCOLS:
        raise FirewallError("port %r: protocol must be one of %s" % (spec, ", ".join(PROTOCOLS)))
    return "%d%s/%s" % (low, "-%d" % high if high else "", proto)


def normal_source(source):
    """An address or network (10.0.0.5, 10.0.0.0/24, fd00::/64), as firewalld lists it."""
    text = str(source).strip()
    try:
        if "/" in text:
            return str(ipaddress.ip_network(text, strict=False))
        return str(ipaddress.ip_address(text))
    except ValueError:
        raise FirewallError("source %r is not an IP address or network (firewalld takes no host names)"
                            % (source,)) from None


def family(source):
    return "ipv6" if ":" in source else "ipv4"


def rich_rule(port, source):
    """The rich rule that opens port ('8003/tcp') to source, spelled as firewalld lists it."""
    number, proto = port.split("/")
    return 'rule family="%s" source address="%s" port port="%s" protocol="%s" accept' % (
        family(source), source, number, proto)


def parse_rich_rule(line):
    """(port, source) of a rich rule of the shape rich_rule() writes; None for any other rule."""
    line = line.strip()
    if not line.startswith("rule ") or not line.endswith(" accept"):
        return None
    attrs = _ATTR_RE.findall(line)
    keys = [pair[0] for pair in attrs]
    if keys != ["family", "address", "port", "protocol"] or " source address=" not in line \
            or " port port=" not in line or " not " in line or "invert" in line:
        return None
    values = dict(attrs)
    try:
        return normal_port("%s/%s" % (values["port"], values["protocol"])), normal_source(values["address"])
    except FirewallError:
        return None


def wanted_rules(ports, sources):
    """Sorted rule keys: ('port', '8003/tcp', '') for the whole zone, ('rich', '8003/tcp', src) per source."""
    ports = sorted(set(normal_port(p) for p in ports or ()))
    sources = sorted(set(normal_source(s) for s in sources or ()))
    if not sources:
        return [("port", p, "") for p in ports]
    return sorted(("rich", p, s) for p in ports for s in sources)


def current_rules(list_ports, list_rich_rules):
    """The rule keys a layer has, from the output of --list-ports and --list-rich-rules."""
    rules = set()
    for word in (list_ports or "").split():
        try:
            rules.add(("port", normal_port(word), ""))
        except FirewallError:
            continue
    for line in (list_rich_rules or "").splitlines():
        parsed = parse_rich_rule(line)
        if parsed:
            rules.add(("rich",) + parsed)
    return rules


def describe(rule):
    kind, port, source = rule
    return "%s from %s" % (port, source) if kind == "rich" else "%s from the whole zone" % port


def plan(wanted, permanent, runtime, recorded, prune=True):
    """What to add and remove in each layer, and the new record.

    wanted: rule keys; permanent/runtime: the keys each layer has now; recorded: the keys this owner added
    before (in the zone the changes go to). Removed: recorded, no longer wanted, still there."""
    wanted = set(wanted)
    recorded = set(recorded)
    stale = (recorded - wanted) if prune else set()
    out = dict(
        add_permanent=sorted(wanted - set(permanent)),
        add_runtime=sorted(wanted - set(runtime)),
        remove_permanent=sorted(stale & set(permanent)),
        remove_runtime=sorted(stale & set(runtime)),
    )
    added = set(out["add_permanent"]) | set(out["add_runtime"])
    out["record"] = sorted((recorded & wanted) | added | (recorded - wanted if not prune else set()))
    layers = ("add_permanent", "add_runtime", "remove_permanent", "remove_runtime")
    out["changed"] = any(out[k] for k in layers)
    return out


def commands(zone, changes):
    """firewall-cmd argument lists (without the program) that carry out plan()'s changes."""
    argv = []
    for layer, prefix in (("permanent", ["--permanent"]), ("runtime", [])):
        for action in ("remove", "add"):
            rules = changes["%s_%s" % (action, layer)]
            ports = [r for r in rules if r[0] == "port"]
            riches = [r for r in rules if r[0] == "rich"]
            if ports:
                argv.append(prefix + ["--zone=%s" % zone] + ["--%s-port=%s" % (action, r[1]) for r in ports])
            if riches:
                argv.append(prefix + ["--zone=%s" % zone]
                            + ["--%s-rich-rule=%s" % (action, rich_rule(r[1], r[2])) for r in riches])
    return argv


def shadowing_warnings(wanted, runtime, recorded):
    """A port open to the whole zone by a rule not ours makes a source restriction moot: say so."""
    warnings = []
    for kind, port, _source in sorted(set(wanted)):
        key = ("port", port, "")
        if kind == "rich" and key in runtime and key not in recorded:
            warnings.append("%s is open to the whole zone by a rule llmops.serving did not add, so the "
                            "sources restriction does not hold: remove it with firewall-cmd --permanent "
                            "--remove-port=%s and firewall-cmd --remove-port=%s" % (port, port, port))
    return sorted(set(warnings))


def read_record(path):
    """{'zone': str, 'rules': [keys]} of the owner's record; an empty one when there is none."""
    try:
        data = local_read.read_json(path, local_read.MIB)  # never blocks on a FIFO nor reads /dev/zero
    except (IOError, OSError, ValueError):
        return dict(zone="", rules=[])
    rules = [tuple(r) for r in data.get("rules", []) if isinstance(r, list) and len(r) == 3]
    return dict(zone=str(data.get("zone") or ""), rules=rules)


def write_record(path, zone, rules):
    directory = os.path.dirname(path)
    if not os.path.isdir(directory):
        os.makedirs(directory, 0o700)
    tmp = path + ".tmp"
    with open(tmp, "w") as handle:
        json.dump(dict(zone=zone, rules=[list(r) for r in sorted(rules)]), handle, indent=1, sort_keys=True)
        handle.write("\n")
    os.chmod(tmp, 0o600)
    os.rename(tmp, path)
