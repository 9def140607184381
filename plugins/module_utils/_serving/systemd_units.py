# -*- coding: utf-8 -*-
# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
# PRIVATE to llmops.serving: it can change at any time; do not import it from other collections.
"""What the stages read from systemd on the node, in one module call (llmops.serving.systemd_info).

    LIST_ARGV                     -> the arguments after systemctl that list the running services
    running_units(text)           -> sorted unit names (foo.service) of systemctl's plain, legend-less listing
    read_running_units(systemctl, timeout) -> (units, error message or None)
    read_version(systemctl, timeout)       -> (`systemctl --version` output, error message or None)
    read_pid1(proc_root)          -> (/proc/1/status then /proc/1/limits, error message or None)

Why not ansible.builtin.service_facts: it also lists every unit file and, where /etc/init.d holds scripts
(Debian, EL7 with network and netconsole), runs `service --status-all`, which calls each script's status.
The stages only need the names of the running services (the reboot policy auto, the memory planner's
"a running instance's GPUs count as free"): one call, a fraction of a second, where service_facts took 79 s
on the L20 twin's first run under load.

Plain Python 3.6, standard library only.
"""
from __future__ import absolute_import, division, print_function

import re

from ansible_collections.llmops.serving.plugins.module_utils._files.local_read import read_bytes
from ansible_collections.llmops.serving.plugins.module_utils.bounded_run import run_bounded

__metaclass__ = type

# --plain: no tree glyphs; --no-legend: no header and footer; --full: names never ellipsized.
LIST_ARGV = ["list-units", "--type=service", "--state=running", "--no-legend", "--plain", "--no-pager",
             "--full"]
# Whether named units' files are enabled at boot: `show` reads just those units (list-unit-files would scan
# every unit file, half a second on a small node). systemd 219 (CentOS 7) prints the same Id=/UnitFileState=.
# "--": what follows are unit names, never options (a unit named --help would be taken as one).
SHOW_ENABLED_ARGV = ["show", "--property=Id", "--property=UnitFileState", "--no-pager", "--"]
# systemd's unit names (unit_name_is_valid): letters, digits and ":-_.\\", one "@" before an instance, a type
# suffix, at most 255 characters.
UNIT_NAME_RE = re.compile(r"[A-Za-z0-9:_.\\-]+(@[A-Za-z0-9:_.\\-]*)?"
                          r"\.(service|socket|device|mount|automount|swap|target|path|timer|slice|scope)\Z")
UNIT_NAME_MAX = 255
# /proc/1/status and /proc/1/limits are 1-2 KB, /proc/meminfo 1.5 KB (proc reports size 0: read with a cap).
PROC_MAX_BYTES = 1024 * 1024


def running_units(text):
    """The unit names of `systemctl list-units --plain --no-legend` output (first field of each line).
    Lines that do not name a service (a stray message) are ignored; a failed unit's leading marker (a bullet
    some systemd versions print even with --plain) is dropped."""
    units = set()
    for line in (text or "").splitlines():
        fields = line.replace(u"\u25cf", " ").replace("*", " ").split()
        if fields and fields[0].endswith(".service"):
            units.add(fields[0])
    return sorted(units)


def enabled_units(text):
    """The units of `systemctl show --property=Id --property=UnitFileState` output (blocks of Id= and
    UnitFileState= lines) whose unit file is `enabled`; a unit systemd does not know has an empty state."""
    units, unit = set(), None
    for line in (text or "").splitlines():
        key, _sep, value = line.strip().partition("=")
        if key == "Id":
            unit = value
        elif key == "UnitFileState" and unit and value == "enabled":
            units.add(unit)
    return sorted(units)


def _systemctl(systemctl, args, what, timeout, max_bytes):
    """(stdout text, None) or ("", what went wrong and what to do) of one bounded systemctl call."""
    try:
        rc, out, err, timed_out, overflowed = run_bounded([systemctl] + args, timeout, max_bytes=max_bytes)
    except OSError as exc:
        return "", "cannot run %s (%s): the node needs systemd's systemctl" % (systemctl, exc)
    if timed_out:
        return "", "%s %s did not answer within %s s: is systemd (PID 1) hung?" % (systemctl, what, timeout)
    if overflowed:
        return "", "%s %s printed more than the read limit" % (systemctl, what)
    if rc != 0:
        detail = (err or out).decode("utf-8", "replace").strip()[:500]
        return "", "%s %s failed (rc %s): %s; the node must run systemd as PID 1" % (
            systemctl, what, rc, detail or "no output")
    return out.decode("utf-8", "replace"), None


def read_running_units(systemctl, timeout=30):
    """(units, None) or ([], what went wrong and what to do)."""
    text, error = _systemctl(systemctl, LIST_ARGV, "list-units", timeout, 8 * 1024 * 1024)
    return ([], error) if error else (running_units(text), None)


def read_enabled_units(systemctl, units, timeout=30):
    """(those of `units` whose unit files are enabled at boot, None) or ([], what went wrong). No units, no
    call."""
    if not units:
        return [], None
    bad = [u for u in units if not isinstance(u, str) or len(u) > UNIT_NAME_MAX or not UNIT_NAME_RE.match(u)]
    if bad:
        return [], ("units: %s %s not a systemd unit name (letters, digits, ':', '-', '_', '.', '\\', an '@' "
                    "before an instance and a type suffix such as .service): name the units as systemctl "
                    "lists them" % (", ".join(repr(u)[:80] for u in bad[:5]), "are" if bad[1:] else "is"))
    text, error = _systemctl(systemctl, SHOW_ENABLED_ARGV + list(units), "show", timeout, 1024 * 1024)
    return ([], error) if error else (enabled_units(text), None)


def read_version(systemctl, timeout=30):
    """(`systemctl --version` output, None) or ("", what went wrong). The unit spellings that depend on the
    version are decided on the controller (plugin_utils/systemd.py parse_systemd_version)."""
    text, error = _systemctl(systemctl, ["--version"], "--version", timeout, 65536)
    return ("", error) if error else (text.strip(), None)


def read_pid1(proc_root="/proc"):
    """(the text of /proc/1/status followed by /proc/1/limits, None) or ("", what went wrong): what
    systemd may grant as locked memory is decided from it on the controller (plugin_utils/systemd.py
    memlock_limit)."""
    parts = []
    for name in ("status", "limits"):
        path = "%s/1/%s" % (proc_root.rstrip("/"), name)
        try:
            parts.append(read_bytes(path, PROC_MAX_BYTES).decode("utf-8", "replace"))
        except OSError as exc:
            return "", str(exc)
    return "".join(parts).strip(), None


def read_memtotal_mib(proc_root="/proc"):
    """The node's RAM in MiB (MemTotal of /proc/meminfo, as Ansible's memtotal_mb fact), or None where it
    cannot be read: the memory planner's host memory, read here so that a run gathers no hardware facts."""
    try:
        text = read_bytes("%s/meminfo" % proc_root.rstrip("/"), PROC_MAX_BYTES).decode("utf-8", "replace")
    except OSError:
        return None
    for line in text.splitlines():
        fields = line.split()
        if len(fields) >= 2 and fields[0] == "MemTotal:" and fields[1].isdigit():
            return int(fields[1]) // 1024
    return None
