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
  - When firewalld runs (C(firewall-cmd --state)), opens each of O(ports) in O(zone), permanently and in the
    running configuration - to the whole zone when O(sources) is empty, else to each source through a rich
    rule. When it does not run (or firewall-cmd is missing) nothing changes and RV(running) is false.
  - Reads each layer once (C(--list-ports), C(--list-rich-rules); permanent and runtime) and runs
    firewall-cmd only for what is missing, so a second run changes nothing.
  - Uses the firewall-cmd program, not python bindings - CentOS 7 has no python3 firewalld bindings, so
    C(ansible.posix.firewalld) fails there under /usr/bin/python3.
  - Records the rules it added per O(owner) in C(<record_dir>/<owner>.json). With O(prune), a recorded rule
    that is no longer wanted (a removed instance, a dropped source, another zone) is removed; rules it did not
    add are never touched.
  - The logic is in C(plugins/module_utils/firewall.py).
options:
  owner:
    description:
      - Who the rules are for (V(serving), V(ray_cluster), V(gateway)); names the record.
    type: str
    required: true
  ports:
    description:
      - Ports to open - V(8003), V(8003/tcp), a range V(10002-10999/tcp). TCP when no protocol is given.
    type: list
    elements: str
    default: []
  sources:
    description:
      - Addresses or networks (V(10.0.0.0/24), V(192.0.2.7), V(fd00::/64)) the ports are open to. Empty - to
        the whole zone (whoever the zone admits; by default the zone of the interface).
    type: list
    elements: str
    default: []
  zone:
    description:
      - The firewalld zone; empty - firewalld's default zone (C(firewall-cmd --get-default-zone)).
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

- name: Open the gateway's port to the whole zone
  llmops.serving.firewall_ports:
    owner: gateway
    ports: [8080]
"""

RETURN = r"""
running:
  description: Whether firewalld runs (false - nothing was read or changed).
  returned: always
  type: bool
zone:
  description: The zone the rules are in (empty when firewalld does not run).
  returned: always
  type: str
  sample: public
wanted:
  description: The rules wanted, one sentence each.
  returned: always
  type: list
  elements: str
  sample: ["8003/tcp from 10.20.0.0/16"]
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
from ansible_collections.llmops.serving.plugins.module_utils.firewall import (  # noqa: E402
    FirewallError,
    commands,
    current_rules,
    describe,
    plan,
    read_record,
    shadowing_warnings,
    wanted_rules,
    write_record,
)
from ansible_collections.llmops.serving.plugins.module_utils.module_guard import run_module  # noqa: E402


def run(module, cmd, args):
    rc, out, err = module.run_command([cmd] + args)
    if rc != 0:
        module.fail_json(msg="`firewall-cmd %s` failed (rc %d): %s"
                         % (" ".join(args), rc, (err or out).strip()))
    return out


def layer(module, cmd, zone, permanent):
    prefix = ["--permanent"] if permanent else []
    zone_arg = ["--zone=%s" % zone]
    return current_rules(run(module, cmd, prefix + zone_arg + ["--list-ports"]),
                         run(module, cmd, prefix + zone_arg + ["--list-rich-rules"]))


ARGUMENT_SPEC = dict(
    owner=dict(type="str", required=True),
    ports=dict(type="list", elements="str", default=[]),
    sources=dict(type="list", elements="str", default=[]),
    zone=dict(type="str", default=""),
    prune=dict(type="bool", default=True),
    record_dir=dict(type="path", default="/var/lib/llmops/firewall"),
    firewall_cmd=dict(type="path"),
)


def main():
    run_module(AnsibleModule, "firewall_ports", _run, argument_spec=ARGUMENT_SPEC)


def _run(module):
    p = module.params
    result = dict(changed=False, running=False, zone="", wanted=[], added=[], removed=[], commands=[])
    try:
        wanted = wanted_rules(p["ports"], p["sources"])
    except FirewallError as exc:
        module.fail_json(msg=str(exc), **result)
    result["wanted"] = [describe(r) for r in wanted]
    cmd = p["firewall_cmd"] or module.get_bin_path("firewall-cmd", opt_dirs=["/usr/bin", "/usr/sbin"])
    if not cmd or not os.access(cmd, os.X_OK) or module.run_command([cmd, "--state"])[0] != 0:
        module.exit_json(**result)
    zone = p["zone"] or run(module, cmd, ["--get-default-zone"]).strip()
    record_path = os.path.join(p["record_dir"], "%s.json" % p["owner"])
    record = read_record(record_path)
    steps = []
    changes_all = dict(added=set(), removed=set())
    # Rules recorded in another zone (the zone changed): removed there first.
    if p["prune"] and record["zone"] and record["zone"] != zone and record["rules"]:
        old = plan([], layer(module, cmd, record["zone"], True), layer(module, cmd, record["zone"], False),
                   record["rules"])
        steps.extend(commands(record["zone"], old))
        changes_all["removed"].update(old["remove_permanent"] + old["remove_runtime"])
        record = dict(zone=zone, rules=[])
    permanent, runtime = layer(module, cmd, zone, True), layer(module, cmd, zone, False)
    changes = plan(wanted, permanent, runtime, record["rules"] if record["zone"] in ("", zone) else [],
                   prune=p["prune"])
    steps.extend(commands(zone, changes))
    changes_all["added"].update(changes["add_permanent"] + changes["add_runtime"])
    changes_all["removed"].update(changes["remove_permanent"] + changes["remove_runtime"])
    for warning in shadowing_warnings(wanted, runtime, record["rules"]):
        module.warn(warning)
    result.update(running=True, zone=zone, commands=[[cmd] + s for s in steps], changed=bool(steps),
                  added=[describe(r) for r in sorted(changes_all["added"])],
                  removed=[describe(r) for r in sorted(changes_all["removed"])])
    if module._diff:
        result["diff"] = dict(before="\n".join(describe(r) for r in sorted(runtime)) + "\n",
                              after="\n".join(describe(r) for r in sorted(
                                  (runtime - changes_all["removed"]) | set(wanted))) + "\n")
    if module.check_mode:
        module.exit_json(**result)
    for step in steps:
        run(module, cmd, step)
    if steps or set(changes["record"]) != set(record["rules"]) or record["zone"] != zone:
        write_record(record_path, zone, changes["record"])
    module.exit_json(**result)


if __name__ == "__main__":
    main()
