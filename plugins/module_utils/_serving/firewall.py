# -*- coding: utf-8 -*-
# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
# PRIVATE to llmops.serving: it can change at any time; do not import it from other collections.
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

Which zone (issue 35.5): an explicit zone wins. Without one, a port whose listen address is known
(``listen``: the instance's bind address) goes into the zone of the interface that carries that address
(``ip -o addr show up``, then ``firewall-cmd --get-zone-of-interface=<if>``; an interface in no zone is in
the default zone), a wildcard address (0.0.0.0, ::) into the zones of every active interface: a port opened
only in the default zone stays closed to clients that reach a NIC in another zone, while the health gate,
which calls from the node itself, passes. Every placement comes with the reason, for the result.

Every external command runs with a deadline (bounded_run): a hung firewall-cmd (firewalld or D-Bus stuck)
fails the task naming the command instead of holding the play.

Plain Python 3.6, standard library only, importable without Ansible.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import ipaddress
import json
import os
import re

from ansible_collections.llmops.serving.plugins.module_utils._files import local_read
from ansible_collections.llmops.serving.plugins.module_utils.bounded_run import run_bounded
from ansible_collections.llmops.serving.plugins.module_utils.module_guard import brief
from ansible_collections.llmops.serving.plugins.module_utils.validators import whole

PROTOCOLS = ("tcp", "udp", "sctp", "dccp")
_PORT_RE = whole(r"([0-9]{1,5})(?:-([0-9]{1,5}))?(?:/([a-z]+))?")
_ATTR_RE = re.compile(r'([a-z]+)="([^"]*)"')
# An owner names its record file <owner>.json: a plain name, never a path (no "/", no "..", no newline).
OWNER_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
# firewalld's zone names (at most 17 characters in firewalld 0.6; letters, digits, _ - + .).
ZONE_RE = re.compile(r"[A-Za-z0-9_+.-]{1,17}")
WILDCARDS = ("0.0.0.0", "::", "", "*")
# What one firewall-cmd or ip call may print: a zone's listing is a few KiB.
MAX_OUTPUT_BYTES = 4 * 1024 * 1024
FORGOTTEN = ("the rules recorded there are forgotten, so rules added before and no longer wanted stay "
             "open: check firewall-cmd --list-all --zone=<zone> by hand; the unusable record is kept as "
             "<record>.bad and written anew")


class FirewallError(Exception):
    """Bad input, with what to write instead."""


def normal_port(spec):
    """8003, '8003', '8003/tcp', '10002-10999' -> '8003/tcp', '10002-10999/tcp'."""
    text = str(spec).strip().lower()
    match = _PORT_RE.match(text)
    if not match:
        raise FirewallError("port %s: write a port (8003), a range (10002-10999) or either with a protocol "
                            "(8003/tcp)" % brief(spec))
    low, high, proto = int(match.group(1)), match.group(2), match.group(3) or "tcp"
    high = int(high) if high is not None else None
    if not 1 <= low <= 65535 or (high is not None and not low < high <= 65535):
        raise FirewallError("port %s is out of range 1-65535 (or the range is backwards)" % brief(spec))
    if proto not in PROTOCOLS:
        raise FirewallError("port %s: protocol must be one of %s" % (brief(spec), ", ".join(PROTOCOLS)))
    return "%d%s/%s" % (low, "-%d" % high if high else "", proto)


def normal_source(source):
    """An address or network (10.0.0.5, 10.0.0.0/24, fd00::/64), as firewalld lists it."""
    text = str(source).strip()
    try:
        if "/" in text:
            return str(ipaddress.ip_network(text, strict=False))
        return str(ipaddress.ip_address(text))
    except ValueError:
        raise FirewallError("source %s is not an IP address or network (firewalld takes no host names)"
                            % brief(source)) from None


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


def describe(rule, zone=None):
    kind, port, source = rule
    text = "%s from %s" % (port, source) if kind == "rich" else "%s from the whole zone" % port
    return text if zone is None else "%s in zone %s" % (text, zone)


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


def record_path(record_dir, owner):
    """<record_dir>/<owner>.json, for an owner that is a plain name (checked over the whole string) and a path
    that stays inside record_dir (a symbolic link out of it is refused)."""
    owner = owner if isinstance(owner, str) else ""
    if not OWNER_RE.fullmatch(owner):
        raise FirewallError("owner %s must be a plain name (letters, digits, '_', '-', '.'; starting with a "
                            "letter or digit; at most 64 characters), e.g. serving: it names the record file "
                            "in %s" % (brief(owner), brief(record_dir)))
    directory = os.path.realpath(record_dir)
    path = os.path.join(record_dir, "%s.json" % owner)
    if os.path.dirname(os.path.realpath(path)) != directory:
        raise FirewallError("the record %s leads out of %s (a symbolic link?): remove it, the module writes "
                            "it again" % (path, record_dir))
    return path


def load_record_file(path):
    """The parsed JSON of a record file; None when there is none. (IOError, OSError, ValueError) otherwise."""
    if not os.path.lexists(path):
        return None
    return local_read.read_json(path, local_read.MIB)  # never blocks on a FIFO nor reads /dev/zero


def _record_rule(item):
    """A recorded rule key, normalised; None for anything else."""
    if not isinstance(item, list) or len(item) != 3 or not all(isinstance(x, str) for x in item):
        return None
    kind, port, source = item
    try:
        if kind == "port" and not source:
            return ("port", normal_port(port), "")
        if kind == "rich":
            return ("rich", normal_port(port), normal_source(source))
    except FirewallError:
        return None
    return None


def parse_record(data, path):
    """({zone: [rule keys]}, problem or None) of a record's JSON. This release writes {"zones": {zone:
    [[kind, port, source], ...]}}; 1.x wrote {"zone": zone, "rules": [...]}. What does not fit is dropped
    and said: the module then cannot remove the rules it lost track of (it never removes what it did not
    record)."""
    if data is None:
        return {}, None
    note = FORGOTTEN
    if not isinstance(data, dict):
        return {}, "%s holds a JSON %s, not the record's object: %s" % (path, type(data).__name__, note)
    if "zones" in data:
        zones = data["zones"]
    else:  # the 1.x record: one zone
        zones = {data.get("zone") or "": data.get("rules", [])}
    if not isinstance(zones, dict):
        return {}, "%s: \"zones\" is not an object: %s" % (path, note)
    out, bad = {}, 0
    for zone, rules in zones.items():
        if not isinstance(zone, str) or not ZONE_RE.fullmatch(zone) or not isinstance(rules, list):
            bad += 1
            continue
        keys = [_record_rule(r) for r in rules]
        bad += keys.count(None)
        if any(keys):
            out[zone] = sorted(set(k for k in keys if k))
    return out, ("%s: %d entries are not rules this module writes: %s" % (path, bad, note) if bad else None)


def read_record(path):
    """({zone: [rule keys]} the owner added, problem or None); {} when there is no record. A record that
    cannot be read or parsed is a problem (said, kept aside by the module), never a traceback."""
    try:
        data = load_record_file(path)
    except (IOError, OSError, ValueError) as exc:
        return {}, "%s cannot be read as JSON (%s): %s" % (path, exc, FORGOTTEN)
    return parse_record(data, path)


def write_record(path, zones):
    """Write {zone: [rule keys]} (zones without rules left out), atomically, root only."""
    directory = os.path.dirname(path)
    if not os.path.isdir(directory):
        os.makedirs(directory, 0o700)
    data = dict(zones=dict((z, [list(r) for r in sorted(rules)]) for z, rules in zones.items() if rules))
    tmp = path + ".tmp"
    with open(tmp, "w") as handle:
        json.dump(data, handle, indent=1, sort_keys=True)
        handle.write("\n")
    os.chmod(tmp, 0o600)
    os.rename(tmp, path)


def keep_aside(path):
    """Rename an unusable record to <path>.bad (nothing is lost: the admin can read what it held)."""
    if os.path.lexists(path):
        os.rename(path, path + ".bad")


def check_zone(zone):
    """A zone name given by the user ('' = none): firewalld's spelling, over the whole string."""
    zone = zone if isinstance(zone, str) else ""
    if zone and not ZONE_RE.fullmatch(zone):
        raise FirewallError("zone %s is not a firewalld zone name (letters, digits, '_', '-', '+', '.'; at "
                            "most 17 characters): see firewall-cmd --get-zones" % brief(zone))
    return zone


def call(argv, timeout):
    """(rc, stdout text, stderr text) of argv, run with a deadline and a read limit. FirewallError naming the
    command when it cannot start, passes the deadline (its process group is killed) or writes too much."""
    shown = " ".join(argv)
    try:
        rc, out, err, timed_out, overflowed = run_bounded(argv, timeout, max_bytes=MAX_OUTPUT_BYTES)
    except OSError as exc:
        raise FirewallError("cannot run `%s`: %s" % (shown, exc)) from None
    if timed_out:
        raise FirewallError("`%s` did not answer within %s s and was stopped: is firewalld (or D-Bus) "
                            "hung? Check `systemctl status firewalld dbus`, restart it, and run again (the "
                            "deadline is the module's timeout)" % (shown, timeout))
    if overflowed:
        raise FirewallError("`%s` wrote more than %d bytes and was stopped" % (shown, MAX_OUTPUT_BYTES))
    return rc, out.decode("utf-8", "replace"), err.decode("utf-8", "replace")


class FirewallCmd(object):
    """firewall-cmd, every call bounded by `timeout` seconds; `calls` counts them."""

    def __init__(self, program, timeout):
        self.program = program
        self.timeout = timeout
        self.calls = 0

    def run(self, args, ok=(0,)):
        """(rc, stdout); FirewallError naming the call when rc is not in `ok`."""
        self.calls += 1
        rc, out, err = call([self.program] + list(args), self.timeout)
        if rc not in ok:
            said = (err or out).strip()[:500] or "no output"
            raise FirewallError("`%s %s` failed (rc %s): %s" % (self.program, " ".join(args), rc, said))
        return rc, out

    def running(self):
        return self.run(["--state"], ok=range(256))[0] == 0

    def default_zone(self):
        return self.run(["--get-default-zone"])[1].strip()

    def zone_of_interface(self, interface):
        """The zone firewalld put the interface in; None when in none (then the default zone applies)."""
        rc, out = self.run(["--get-zone-of-interface=%s" % interface], ok=range(256))
        zone = out.strip()
        return zone if rc == 0 and ZONE_RE.fullmatch(zone) else None

    def layer(self, zone, permanent):
        """The rule keys a zone has in one layer (permanent or runtime)."""
        prefix = ["--permanent"] if permanent else []
        return current_rules(self.run(prefix + ["--zone=%s" % zone, "--list-ports"])[1],
                             self.run(prefix + ["--zone=%s" % zone, "--list-rich-rules"])[1])


def parse_ip_addr(text):
    """[(interface, address)] of `ip -o addr show` output (one address a line: 'N: eth0    inet 10.0.0.5/24
    ...'); the interface name without its '@peer' part."""
    found = []
    for line in (text or "").splitlines():
        fields = line.split()
        if len(fields) < 4 or fields[2] not in ("inet", "inet6"):
            continue
        try:
            address = str(ipaddress.ip_interface(fields[3]).ip)
        except ValueError:
            continue
        found.append((fields[1].split("@", 1)[0], address))
    return found


def read_interfaces(ip_program, timeout):
    """[(interface, address)] of the node's interfaces that are up (`ip -o addr show up`, bounded)."""
    argv = [ip_program, "-o", "addr", "show", "up"]
    rc, out, err = call(argv, timeout)
    if rc != 0:
        raise FirewallError("`%s` failed (rc %s): %s" % (" ".join(argv), rc, (err or out).strip()[:500]))
    return parse_ip_addr(out)


def normal_listeners(listen):
    """[(port, [addresses])] of the listen option ({port, host}: host as an instance's, "0.0.0.0" or a comma
    list "127.0.0.1,10.0.0.5"); loopback addresses dropped (nothing outside reaches them), names kept."""
    out = []
    for item in listen or ():
        if not isinstance(item, dict):
            raise FirewallError("listen entry %s: write {port: 8003, host: 0.0.0.0}" % brief(item))
        port = normal_port(item.get("port"))
        addresses = []
        for part in str(item.get("host") or "").split(","):
            text = part.strip().strip("[]")
            if text in WILDCARDS:
                addresses.append("::" if text == "::" else "0.0.0.0")
                continue
            try:
                address = ipaddress.ip_address(text.split("%", 1)[0])
            except ValueError:  # a host name: listener_zones says it goes to the default zone
                if text.lower() != "localhost":
                    addresses.append(text)
                continue
            if not address.is_loopback:
                addresses.append(str(address))
        if addresses:
            out.append((port, sorted(set(addresses))))
    return out


def listener_zones(address, interfaces, zone_of, default_zone):
    """[(zone, reason)] a port bound to `address` must be open in. interfaces: [(interface, address)];
    zone_of(interface) -> zone or None (no zone: the default zone)."""
    def zone_and_why(interface):
        zone = zone_of(interface)
        return (zone, "%s is in zone %s" % (interface, zone)) if zone else \
            (default_zone, "%s is in no zone, so in the default zone %s" % (interface, default_zone))

    if address in ("0.0.0.0", "::"):
        families = (4, 6) if address == "::" else (4,)
        names = sorted(set(i for i, a in interfaces if ipaddress.ip_address(a).version in families
                           and not ipaddress.ip_address(a).is_loopback))
        if not names:
            return [(default_zone, "%s: no active interface besides loopback, so the default zone %s"
                     % (address, default_zone))]
        placed = {}
        for name in names:
            zone, why = zone_and_why(name)
            placed.setdefault(zone, []).append(why)
        return [(zone, "%s listens on every interface: %s" % (address, "; ".join(whys)))
                for zone, whys in sorted(placed.items())]
    try:
        ipaddress.ip_address(address)
    except ValueError:
        return [(default_zone, "%s is a name, not an address: the default zone %s (give the zone to choose "
                 "another)" % (address, default_zone))]
    names = sorted(set(i for i, a in interfaces if a == address))
    if not names:
        return [(default_zone, "%s is on no active interface of this node (ip -o addr show up), so the "
                 "default zone %s" % (address, default_zone))]
    out = []
    for name in names:
        zone, why = zone_and_why(name)
        out.append((zone, "%s is on %s; %s" % (address, name, why)))
    return out


def placement(rules, listeners, sources, zone, default_zone, interfaces, zone_of):
    """({zone: set(rule keys)}, [reasons]) - where each wanted rule goes.

    rules: wanted_rules() of the ports without a listen address; listeners: normal_listeners(). An explicit
    zone takes everything; else a listener's port goes to the zones of its addresses, the rest to the default
    zone."""
    wanted, reasons = {}, []
    target = zone or default_zone
    if rules:
        wanted.setdefault(target, set()).update(rules)
        ports = ", ".join(sorted(set(r[1] for r in rules)))
        why = "given" if zone else "the default zone; no listen address"
        reasons.append("%s: zone %s (%s)" % (ports, target, why))
    for port, addresses in listeners:
        port_rules = wanted_rules([port], sources)
        if zone:
            wanted.setdefault(zone, set()).update(port_rules)
            reasons.append("%s: zone %s (given)" % (port, zone))
            continue
        for address in addresses:
            for where, why in listener_zones(address, interfaces, zone_of, default_zone):
                wanted.setdefault(where, set()).update(port_rules)
                reasons.append("%s: zone %s (%s)" % (port, where, why))
    return wanted, sorted(set(reasons))


def plan_zones(wanted, recorded, read_layer, prune=True):
    """The changes in every zone concerned: those wanted and those the record names.

    wanted, recorded: {zone: rule keys}; read_layer(zone, permanent) -> rule keys. Returns dict(steps
    (firewall-cmd argument lists), added/removed ([(zone, rule)]), record ({zone: [rules]}), before/after
    ([(zone, rule)] of the runtime layer), warnings)."""
    out = dict(steps=[], added=set(), removed=set(), record={}, before=set(), after=set(), warnings=[])
    # Zones only recorded go first: their rules are removed before the same ports open elsewhere.
    order = sorted(set(recorded) - set(wanted)) + sorted(wanted)
    for zone in order:
        want, had = sorted(wanted.get(zone, ())), recorded.get(zone, [])
        if not want and (not prune or not had):
            if had:
                out["record"][zone] = list(had)
            continue
        permanent, runtime = read_layer(zone, True), read_layer(zone, False)
        changes = plan(want, permanent, runtime, had, prune=prune)
        out["steps"].extend(commands(zone, changes))
        out["added"].update((zone, r) for r in changes["add_permanent"] + changes["add_runtime"])
        removed = changes["remove_permanent"] + changes["remove_runtime"]
        out["removed"].update((zone, r) for r in removed)
        out["before"].update((zone, r) for r in runtime)
        out["after"].update((zone, r) for r in (set(runtime) - set(removed)) | set(want))
        out["warnings"].extend(shadowing_warnings(want, runtime, had))
        if changes["record"]:
            out["record"][zone] = changes["record"]
    out["warnings"] = sorted(set(out["warnings"]))
    return out
