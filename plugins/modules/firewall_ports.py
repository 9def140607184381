#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: firewall_ports
short_description: Open ports in firewalld with firewall-cmd, to the whole zone or to source addresses
author:
  - llmops.serving developers (@llmops)
version_added: "1.0.0"
description:
  - When firewalld runs (C(firewall-cmd --state)), opens each of O(ports) and O(listen) in its zone,
    permanently and in the running configuration - to the whole zone when O(sources) is empty, else to each
    source through a rich rule. When it does not run (or firewall-cmd is missing) nothing changes and
    RV(running) is false.
  - Which zone - O(zone) when given, for every port. Else a port of O(listen) goes into the zone of the
    interface that carries its address (C(ip -o addr show up), C(firewall-cmd --get-zone-of-interface)), a
    wildcard address (V(0.0.0.0), V(::)) into the zones of all active interfaces; an interface in no zone,
    an address on no interface and the ports of O(ports) go to firewalld's default zone. RV(reasons) says
    why each zone was used.
  - Every firewall-cmd and ip call has a deadline (O(timeout)); a hung firewall-cmd fails the task naming
    the call.
  - Reads each layer once (C(--list-ports), C(--list-rich-rules); permanent and runtime) and runs
    firewall-cmd only for what is missing, so a second run changes nothing.
  - Uses the firewall-cmd program, not python bindings - CentOS 7 has no python3 firewalld bindings, so
    C(ansible.posix.firewalld) fails there under /usr/bin/python3.
  - Records the rules it added per O(owner) in C(<record_dir>/<owner>.json). With O(prune), a recorded rule
    that is no longer wanted (a removed instance, a dropped source, another zone) is removed; rules it did not
    add are never touched. A record that cannot be used (not JSON, not an object) is kept as
    C(<owner>.json.bad), written anew, and a warning says that the rules it listed are no longer tracked.
  - The logic is in C(plugins/module_utils/_serving/firewall.py).
options:
  owner:
    description:
      - Who the rules are for (V(serving), V(ray_cluster), V(gateway)); names the record.
      - A plain name - letters, digits, V(_), V(-), V(.), starting with a letter or digit, at most 64
        characters; never a path.
    type: str
    required: true
  ports:
    description:
      - Ports to open - V(8003), V(8003/tcp), a range V(10002-10999/tcp). TCP when no protocol is given.
    type: list
    elements: str
    default: []
  listen:
    description:
      - Ports with the address their service binds (an instance's C(host) - V(0.0.0.0), V(10.0.0.5),
        V(::), a comma list V(127.0.0.1,10.0.0.5)); loopback addresses need no opening and are skipped.
      - Without O(zone), each port goes into the zone of the interface(s) carrying its address.
    type: list
    elements: dict
    default: []
    suboptions:
      port:
        description: The port, as in O(ports).
        type: str
        required: true
      host:
        description: The bind address(es).
        type: str
        default: 0.0.0.0
  sources:
    description:
      - Addresses or networks (V(10.0.0.0/24), V(192.0.2.7), V(fd00::/64)) the ports are open to. Empty - to
        the whole zone (whoever the zone admits; by default the zone of the interface).
    type: list
    elements: str
    default: []
  zone:
    description:
      - The firewalld zone, for every port; empty - the zone of the interface carrying each O(listen)
        address, and firewalld's default zone (C(firewall-cmd --get-default-zone)) for O(ports).
    type: str
    default: ""
  prune:
    description:
      - Remove the rules this owner added before and no longer wants.
    type: bool
    default: true
  record_dir:
    description:
      - Where the record of the rules each owner added is kept (root only).
    type: path
    default: /var/lib/llmops/firewall
  firewall_cmd:
    description:
      - The firewall-cmd program; unset - looked up in E(PATH), C(/usr/bin) and C(/usr/sbin).
    type: path
  ip_cmd:
    description:
      - The ip program (iproute), to find the interface of a O(listen) address; unset - looked up in E(PATH),
        C(/usr/sbin) and C(/sbin).
    type: path
  timeout:
    description:
      - Seconds each firewall-cmd or ip call may take before it is stopped and the task fails naming it.
    type: int
    default: 60
attributes:
  check_mode:
    support: full
    details: Reads the firewall and reports what it would change, without changing it.
  diff_mode:
    support: full
extends_documentation_fragment:
  - llmops.serving.attributes
"""

EXAMPLES = r"""
- name: Open the serving ports to the office network only
  llmops.serving.firewall_ports:
    owner: serving
    ports: ["8003/tcp"]
    sources: ["10.20.0.0/16"]

- name: Open the gateway's port to the whole zone of each interface it listens on
  llmops.serving.firewall_ports:
    owner: gateway
    listen:
      - port: "8080"
        host: 0.0.0.0
"""

RETURN = r"""
running:
  description: Whether firewalld runs (false - nothing was read or changed).
  returned: always
  type: bool
zone:
  description: The zones the rules are in, comma-separated (empty when firewalld does not run).
  returned: always
  type: str
  sample: internal
zones:
  description: The rules wanted in each zone.
  returned: always
  type: dict
  sample: {"internal": ["8003/tcp from the whole zone in zone internal"]}
reasons:
  description: Why each zone was used, one sentence a port and zone.
  returned: always
  type: list
  elements: str
  sample: ["8003/tcp: zone internal (10.0.0.5 is on eth1; eth1 is in zone internal)"]
wanted:
  description: The rules wanted, one sentence each.
  returned: always
  type: list
  elements: str
  sample: ["8003/tcp from 10.20.0.0/16 in zone public"]
added:
  description: Rules added (in either layer).
  returned: always
  type: list
  elements: str
removed:
  description: Rules removed (in either layer), recorded earlier and no longer wanted.
  returned: always
  type: list
  elements: str
commands:
  description: The firewall-cmd calls that changed (or, in check mode, would change) the firewall.
  returned: always
  type: list
  elements: list
"""

import os  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.llmops.serving.plugins.module_utils._serving.firewall import (  # noqa: E402
    FirewallCmd,
    FirewallError,
    check_zone,
    describe,
    keep_aside,
    normal_listeners,
    placement,
    plan_zones,
    read_interfaces,
    read_record,
    record_path,
    wanted_rules,
    write_record,
)
from ansible_collections.llmops.serving.plugins.module_utils.module_guard import run_module  # noqa: E402

ARGUMENT_SPEC = dict(
    owner=dict(type="str", required=True),
    ports=dict(type="list", elements="str", default=[]),
    listen=dict(type="list", elements="dict", default=[],
                options=dict(port=dict(type="str", required=True), host=dict(type="str", default="0.0.0.0"))),
    sources=dict(type="list", elements="str", default=[]),
    zone=dict(type="str", default=""),
    prune=dict(type="bool", default=True),
    record_dir=dict(type="path", default="/var/lib/llmops/firewall"),
    firewall_cmd=dict(type="path"),
    ip_cmd=dict(type="path"),
    timeout=dict(type="int", default=60),
)


def main():
    run_module(AnsibleModule, "firewall_ports", _run, argument_spec=ARGUMENT_SPEC)


def _run(module):
    result = dict(changed=False, running=False, zone="", zones={}, reasons=[], wanted=[], added=[],
                  removed=[], commands=[])
    try:
        _firewall(module, module.params, result)
    except FirewallError as exc:
        module.fail_json(msg=str(exc), **result)
    module.exit_json(**result)


def _firewall(module, p, result):
    """Fill result in; FirewallError on bad input or a firewall-cmd/ip call that failed or hung."""
    if not 1 <= p["timeout"] <= 3600:
        raise FirewallError("timeout %r: write the seconds each firewall-cmd call may take, 1-3600"
                            % p["timeout"])
    path = record_path(p["record_dir"], p["owner"])
    zone = check_zone(p["zone"])
    rules = wanted_rules(p["ports"], p["sources"])
    listeners = normal_listeners(p["listen"])
    cmd = p["firewall_cmd"] or module.get_bin_path("firewall-cmd", opt_dirs=["/usr/bin", "/usr/sbin"])
    if not cmd or not os.access(cmd, os.X_OK):
        return
    fw = FirewallCmd(cmd, p["timeout"])
    if not fw.running():
        return
    default_zone = fw.default_zone() if not zone else ""
    interfaces = []
    if listeners and not zone:
        ip = p["ip_cmd"] or module.get_bin_path("ip", opt_dirs=["/usr/sbin", "/sbin"])
        if not ip:
            raise FirewallError("the ip program (iproute) is missing: it finds the interface of each listen "
                                "address; install iproute or give zone")
        interfaces = read_interfaces(ip, p["timeout"])
    wanted, reasons = placement(rules, listeners, p["sources"], zone, default_zone, interfaces,
                                fw.zone_of_interface)
    recorded, problem = read_record(path)
    if problem:
        module.warn(problem)
    outcome = plan_zones(wanted, recorded, fw.layer, prune=p["prune"])
    for warning in outcome["warnings"]:
        module.warn(warning)
    steps = outcome["steps"]
    result.update(running=True, zone=", ".join(sorted(wanted)), reasons=reasons, changed=bool(steps),
                  zones=dict((z, [describe(r, z) for r in sorted(rs)]) for z, rs in wanted.items()),
                  wanted=sorted(describe(r, z) for z, rs in wanted.items() for r in rs),
                  commands=[[cmd] + s for s in steps],
                  added=[describe(r, z) for z, r in sorted(outcome["added"])],
                  removed=[describe(r, z) for z, r in sorted(outcome["removed"])])
    if module._diff:
        result["diff"] = dict(before="".join(describe(r, z) + "\n" for z, r in sorted(outcome["before"])),
                              after="".join(describe(r, z) + "\n" for z, r in sorted(outcome["after"])))
    if module.check_mode:
        return
    for step in steps:
        fw.run(step)
    if problem or steps or outcome["record"] != recorded:
        if problem:
            keep_aside(path)
        write_record(path, outcome["record"])


if __name__ == "__main__":
    main()
