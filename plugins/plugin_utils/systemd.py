# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""systemd spellings of a serving unit, for every engine: ExecStart= quoting, hardening, restart policy, all
chosen by the node's systemd version (219 on CentOS 7 up to 25x), and the LimitMEMLOCK= PID 1 can grant.
Tested by tests/unit/plugins/plugin_utils/test_systemd.py and tests/roles/test_serving_unit.py.
"""
from __future__ import absolute_import, division, print_function

import re
from collections import OrderedDict

from ansible_collections.llmops.serving.plugins.module_utils.validators import whole
from ansible_collections.llmops.serving.plugins.plugin_utils.container import docker_run_args
from ansible_collections.llmops.serving.plugins.plugin_utils.env_files import ENV_NAME_RE
from ansible_collections.llmops.serving.plugins.plugin_utils.serving_errors import ServingError

__metaclass__ = type

_SYSTEMD_SAFE = whole(r"[A-Za-z0-9_@%+=:,./-]+")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


# linux/capability.h: CAP_SYS_RESOURCE, which systemd needs to raise RLIMIT_MEMLOCK above PID 1's hard limit.
CAP_SYS_RESOURCE = 24


def memlock_limit(pid1_status, wanted):
    """LimitMEMLOCK= the node can grant: `wanted` (serving_memlock_limit) when PID 1 has CAP_SYS_RESOURCE in
    its effective set or its hard limit is unlimited, else that hard limit. `pid1_status`: the text of
    /proc/1/status and /proc/1/limits. Without CAP_SYS_RESOURCE (a node that is itself an unprivileged
    container) a LimitMEMLOCK above PID 1's hard limit stops the unit with 205/LIMITS."""
    text = str(pid1_status or "")
    capeff = re.search(r"CapEff:\s*([0-9a-f]+)", text)
    hard = re.search(r"Max locked memory\s+\S+\s+(\S+)", text)
    if not capeff or not hard:
        raise ServingError("cannot tell the locked-memory limit PID 1 allows: no %s in /proc/1/status and "
                           "/proc/1/limits" % ("CapEff line" if not capeff else "Max locked memory line"))
    can_raise = (int(capeff.group(1), 16) >> CAP_SYS_RESOURCE) & 1 == 1
    return wanted if can_raise or hard.group(1) == "unlimited" else hard.group(1)


def systemd_quote(arg):
    """Quote one argument for an ExecStart= line (systemd 219+ rules: "...", \\ escapes, %% and $$).
    A control character is refused: a newline would end the line and start a directive of its own (the
    planner names the setting first; this is the last guard)."""
    if _CONTROL.search(str(arg)):
        raise ServingError("an argument of the unit's command line contains a control character (a "
                           "newline?); the value is not shown here")
    arg = str(arg).replace("%", "%%").replace("$", "$$")
    if arg and _SYSTEMD_SAFE.match(arg):
        return arg
    return '"%s"' % arg.replace("\\", "\\\\").replace('"', '\\"')


def unit_value(value, setting):
    """`value` as the value of a unit's directive or comment (Description=, User=, WorkingDirectory=, ...):
    one line (a control character is refused, naming `setting`: a newline would start a directive of its
    own, which systemd applies while it skips the broken line), with % doubled (systemd's specifiers)."""
    text = str(value)
    if _CONTROL.search(text):
        raise ServingError("%s contains a control character (a newline?); it would become a line of its own "
                           "in the systemd unit. Remove it (the value is not shown here)" % setting)
    return text.replace("%", "%%")


def environment(env, setting, sort=False):
    """The Environment= values of a unit for the mapping `env` (`setting` names it in a refusal), in its
    order (`sort`: by name): each "NAME=value" in double quotes with systemd's escapes. A name is a shell
    variable name (the whole string), a value one line (no control character: a newline would end the
    quotes and the line, and what follows would be a directive of its own); no value is shown in a refusal."""
    if env is None:
        return []
    if not isinstance(env, dict):
        raise ServingError("%s must be a mapping NAME -> value" % setting)
    out = []
    for key in sorted(env, key=str) if sort else env:
        name, value = str(key), env[key]
        if not ENV_NAME_RE.match(name):
            raise ServingError("%s: %r is not a variable name (letters, digits and '_', not starting with a "
                               "digit)" % (setting, name))
        if value is None or isinstance(value, (dict, list, tuple)):
            raise ServingError("%s: %s must be a string or a number" % (setting, name))
        text = unit_value(value, "%s: %s" % (setting, name))
        out.append('"%s=%s"' % (name, text.replace("\\", "\\\\").replace('"', '\\"')))
    return out


# A systemd time span (systemd.time(7)): numbers with a unit, optionally space-separated ("1min 30s"); a bare
# number is seconds.
_TIMESPAN_UNIT = (r"(usec|us|msec|ms|seconds|second|sec|s|minutes|minute|min|m|hours|hour|hr|h|days|day|d|"
                  r"weeks|week|w|months|month|M|years|year|y)")
_TIMESPAN = whole(r"[0-9]+(\.[0-9]+)?( ?{u}( ?[0-9]+(\.[0-9]+)? ?{u})*)?".format(u=_TIMESPAN_UNIT))


def timespan(value, setting):
    """`value` when it is a systemd time span (15s, 1min 30s, 90), else ServingError naming `setting`."""
    text = str(value) if isinstance(value, (str, int)) and not isinstance(value, bool) else ""
    if not _TIMESPAN.match(text):
        raise ServingError("%s: %r is not a systemd time span (e.g. 15s, 1min, 1min 30s)" % (setting, value))
    return text


# `systemd-analyze verify` of a rendered unit, for a template task's validate: (Ansible runs it without a
# shell: the script is sh's argument; no '%' but the path's). The file is copied under the unit's own name
# (verify wants a unit suffix). A node without systemd-analyze, or where it cannot start its manager (some
# containers), skips the check: the checker is missing, not the unit wrong. Besides verify's own errors (an
# unknown executable, a bad section), a line it ignored as "Invalid syntax" or "Missing '='" fails: a
# rendered unit has none, and it is the trace of a value that broke its line. It runs nothing of the unit.
_VERIFY = ('command -v systemd-analyze >/dev/null 2>&1 || exit 0; d=$(mktemp -d) || exit 1; '
           'cp "$1" "$d/$2" && out=$(systemd-analyze verify "$d/$2" 2>&1); rc=$?; rm -rf "$d"; '
           'echo "$out" >&2; '
           'if echo "$out" | grep -E "Invalid syntax|Missing .=." >/dev/null; then exit 1; fi; '
           '[ "$rc" = 0 ] || echo "$out" | grep -E "(initialize|allocate|create) manager" >/dev/null')


def verify_command(unit_name):
    """The validate: command of a template task that writes unit `unit_name` (e.g. ray.service)."""
    name = unit_value(unit_name, "the unit's name")
    if not whole(r"[A-Za-z0-9:_.@-]+\.(service|timer|socket|path|mount|target)").match(name):
        raise ServingError("%r is not a unit file name" % unit_name)
    return "sh -c '%s' systemd-verify %%s %s" % (_VERIFY, name)


def systemd_command(argv):
    """One ExecStart= line from an argv."""
    return " ".join(systemd_quote(a) for a in argv)


def exec_start(plan, user=None, docker="/usr/bin/docker", entrypoint=None, home=None, memlock=None):
    """The ExecStart= command line of one planned instance: its binary, or `docker run` of its image."""
    if plan["mode"] == "container":
        return systemd_command(docker_run_args(plan, user=user, docker=docker, entrypoint=entrypoint,
                                               home=home, memlock=memlock))
    return systemd_command([plan["binary"]] + list(plan.get("subcommand") or ()) + list(plan["argv"]))


# (directive, value, first systemd version that knows it). NEVER PrivateDevices / DevicePolicy=closed:
# the GPUs (/dev/nvidia*) would vanish. No MemoryDenyWriteExecute: CUDA JIT needs W+X pages.
HARDENING = (
    ("NoNewPrivileges", "yes", 187),
    ("PrivateTmp", "yes", 1),
    ("ProtectSystem", "full", 214),
    ("ProtectSystem", "strict", 232),
    ("ProtectHome", "{home}", 214),
    ("RestrictAddressFamilies", "AF_UNIX AF_INET AF_INET6 AF_NETLINK", 211),
    ("SystemCallArchitectures", "native", 209),
    ("ProtectKernelTunables", "yes", 232),
    ("ProtectKernelModules", "yes", 232),
    ("ProtectControlGroups", "yes", 232),
    ("RestrictRealtime", "yes", 231),
    ("RestrictNamespaces", "yes", 233),
    ("LockPersonality", "yes", 235),
    ("RestrictSUIDSGID", "yes", 242),
    ("ProtectHostname", "yes", 242),
    ("ProtectKernelLogs", "yes", 244),
    ("ProtectClock", "yes", 245),
    ("ProtectProc", "invisible", 247),
)


def hardening(systemd_version, read_paths=(), mode="host"):
    """Hardening directives for a node's systemd version, as an ordered list of (directive, value).

    ProtectHome is read-only when a model or the binary lives under /home or /root (the L20 box keeps its
    models in /home/models), else yes. In container mode the unit only runs the docker client: the container
    is the sandbox, and namespace/address-family restrictions would break the client, so only the basics.
    """
    version = int(systemd_version or 0)
    under_home = any(str(p).startswith(("/home/", "/root/", "/run/user/")) for p in read_paths or ())
    chosen = OrderedDict()
    for directive, value, since in HARDENING:
        if version < since:
            continue
        if mode == "container" and directive not in ("PrivateTmp",):
            continue
        chosen[directive] = value.replace("{home}", "read-only" if under_home else "yes")
    return list(chosen.items())


def restart_policy(systemd_version, restart_sec=10, interval=600, burst=5, max_delay=300,
                   restart="on-failure"):
    """Bounded restart backoff, spelled for the node's systemd. Returns {"unit": [...], "service": [...]}.

    `restart`: the role's per-engine choice (llama.cpp: on-failure; vLLM: always, as the seed's production
    unit).

    systemd < 230 (CentOS 7: 219) only knows StartLimitInterval/StartLimitBurst in [Service]; newer ones
    want StartLimitIntervalSec/StartLimitBurst in [Unit]. systemd >= 254 also grows RestartSec
    exponentially up to RestartMaxDelaySec.
    """
    version = int(systemd_version or 0)
    unit, service = [], [("Restart", restart), ("RestartSec", str(restart_sec))]
    if version >= 230:
        unit += [("StartLimitIntervalSec", str(interval)), ("StartLimitBurst", str(burst))]
    else:
        service += [("StartLimitInterval", str(interval)), ("StartLimitBurst", str(burst))]
    if version >= 254:
        service += [("RestartSteps", "5"), ("RestartMaxDelaySec", str(max_delay))]
    return {"unit": unit, "service": service}


def parse_systemd_version(text):
    """`systemctl --version` output -> 219 / 252 (0 when unreadable)."""
    match = re.search(r"systemd\s+(\d+)", text or "")
    return int(match.group(1)) if match else 0
