# -*- coding: utf-8 -*-
# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
# PRIVATE to llmops.serving: it can change at any time; do not import it from other collections.
"""Free space per filesystem against what a run will write: llmops.serving.disk_space_info.

CentOS 7 puts 50 GB on / by default and the rest of the disk on /home; the collection's defaults (Docker's
/var/lib/docker, the build root and ccache under /var/cache) all land on /. Preflight lists what the run will
write and where (models from their GGUF header sizes, images and the build from the roles' documented
estimates), this file groups the writes by the filesystem of each target path (the nearest existing
ancestor's, as `df` would show once the directory exists), and refuses a filesystem that cannot take them
with the numbers and the variable that moves each write elsewhere, before a 20 GB download starts.

Plain Python 3.6, standard library only, importable without Ansible.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import math
import os
import re

from ansible_collections.llmops.serving.plugins.module_utils.module_guard import brief
from ansible_collections.llmops.serving.plugins.module_utils.validators import whole

GIB = 1024 ** 3
MAX_SIZE = 2 ** 63 - 1    # the largest file size (off_t)
_SIZE_RE = whole(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([KMGT]?)(i?)B?\s*", re.I)


class DiskError(Exception):
    """Bad input, with what to write instead."""


def parse_size(value):
    """Bytes of 123, '10G' (ccache: G = 1e9), '10GiB', '3.5 GiB', '500M'; DiskError for anything else,
    NaN, infinity and sizes over MAX_SIZE included (they ended in a traceback: issue 34)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        size = value
    else:
        match = _SIZE_RE.match(str(value))
        if not match:
            raise DiskError("size %s: write bytes or a number with K, M, G, T (decimal) or Ki, Mi, Gi, Ti"
                            % brief(value))
        number, unit, binary = float(match.group(1)), match.group(2).upper(), match.group(3)
        power = "KMGT".index(unit) + 1 if unit else 0
        size = number * ((1024 if binary else 1000) ** power)
    if isinstance(value, float) and not math.isfinite(value):
        raise DiskError("size %s is not a number of bytes: write bytes or a number with K, M, G, T"
                        % brief(value))
    if size > MAX_SIZE:
        raise DiskError("size %s is over 8 EiB, more than any file or disk holds: write the size in bytes "
                        "(or with K, M, G, T)" % brief(value))
    return int(size)


def human(size):
    """1.5 GiB, 2.4 TiB, 512 MiB."""
    size = float(size)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(size) < 1024 or unit == "PiB":
            return ("%d %s" % (size, unit)) if unit == "B" else ("%.1f %s" % (size, unit))
        size /= 1024.0
    return "%.1f PiB" % size


def existing_ancestor(path):
    """The path itself or its nearest existing parent (what will hold it once created)."""
    path = os.path.abspath(path)
    while not os.path.exists(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return path


def mount_point(path):
    """The mount point of the filesystem holding path (where st_dev changes going up)."""
    path = os.path.realpath(existing_ancestor(path))
    dev = os.stat(path).st_dev
    while path != "/":
        parent = os.path.dirname(path)
        if os.stat(parent).st_dev != dev:
            return path
        path = parent
    return path


def filesystem(path):
    """{mount, free, total} of the filesystem path is (or will be) on; free as a non-root user sees it
    minus nothing (root may use the reserved blocks, but they are no room to plan on)."""
    anchor = existing_ancestor(path)
    stat = os.statvfs(anchor)
    return dict(mount=mount_point(anchor), free=stat.f_bavail * stat.f_frsize,
                total=stat.f_blocks * stat.f_frsize, device=os.stat(anchor).st_dev)


def normal_writes(writes):
    """Check the writes: each {path (absolute), bytes or size, what, variable, unless_exists (an absolute
    path: the write is not counted when it exists on the node, e.g. a build already installed)}."""
    out = []
    for item in writes or ():
        if not isinstance(item, dict) or not item.get("path") or not item.get("what"):
            raise DiskError("each write needs path, what and bytes (or size), got %r" % (item,))
        if not str(item["path"]).startswith("/"):
            raise DiskError("write %s: path %r must be absolute" % (item["what"], item["path"]))
        size = parse_size(item.get("bytes", item.get("size", 0)))
        if size < 0:
            raise DiskError("write %s: size must not be negative" % item["what"])
        unless = str(item.get("unless_exists") or "")
        if unless and not unless.startswith("/"):
            raise DiskError("write %s: unless_exists %r must be absolute" % (item["what"], unless))
        out.append(dict(path=str(item["path"]), bytes=size, what=str(item["what"]),
                        variable=str(item.get("variable") or ""), unless_exists=unless))
    return out


def split_present(writes, exists=os.path.exists):
    """(writes to count, whats left out because their unless_exists path is there): what the node has
    already (a build, a ccache) adds nothing, read in the same module call as the free space."""
    counted, present = [], []
    for write in writes:
        if write.get("unless_exists") and exists(write["unless_exists"]):
            present.append(write["what"])
        else:
            counted.append(write)
    return counted, present


def plan(writes, filesystems, reserve=0, candidates=()):
    """Group writes by filesystem and find the short ones.

    writes: normal_writes(); filesystems: {path: filesystem(path)} for every write path and candidate;
    reserve: bytes that must stay free on each filesystem. Returns {filesystems: [...], short: [...],
    messages: [...]}; each filesystem entry: mount, free, needs, writes (what, bytes, path, variable)."""
    groups = {}
    for write in writes:
        fs = filesystems[write["path"]]
        empty = dict(mount=fs["mount"], free=fs["free"], total=fs["total"], needs=0, writes=[])
        group = groups.setdefault(fs["device"], empty)
        group["needs"] += write["bytes"]
        group["writes"].append(write)
    ordered = sorted(groups.values(), key=lambda g: g["mount"])
    short = [g for g in ordered if g["needs"] + reserve > g["free"]]
    messages = []
    for group in short:
        parts = ", ".join("%s ~%s (%s)" % (w["what"], human(w["bytes"]), w["path"])
                          for w in sorted(group["writes"], key=lambda w: -w["bytes"]) if w["bytes"])
        movable = sorted(set(w["variable"] for w in group["writes"] if w["variable"] and w["bytes"]))
        better = best_elsewhere(group, filesystems, candidates, reserve)
        advice = ""
        if movable and better:
            advice = "; set %s to a path on %s (%s free)" % (", ".join(movable), better["mount"],
                                                             human(better["free"]))
        elif movable:
            advice = "; free space on %s, or set %s to a path on a larger filesystem" % (
                group["mount"], ", ".join(movable))
        messages.append("%s has %s free, the run writes ~%s there: %s%s%s" % (
            group["mount"], human(group["free"]), human(group["needs"]), parts,
            " (and %s must stay free)" % human(reserve) if reserve else "", advice))
    return dict(filesystems=ordered, short=short, messages=messages)


def best_elsewhere(group, filesystems, candidates, reserve):
    """The candidate filesystem (not the group's) with the most free space that takes the group's writes."""
    best = None
    for path in candidates or ():
        fs = filesystems.get(path)
        if not fs or fs["mount"] == group["mount"] or fs["free"] < group["needs"] + reserve:
            continue
        if best is None or fs["free"] > best["free"]:
            best = fs
    return best


def report(result):
    """One line per filesystem: '/home: 2.4 TiB free, writes ~19.0 GiB (models)'."""
    lines = []
    for group in result["filesystems"]:
        whats = sorted(set(w["what"].split(" ")[0] for w in group["writes"] if w["bytes"]))
        lines.append("%s: %s free, the run writes ~%s%s" % (group["mount"], human(group["free"]),
                                                            human(group["needs"]),
                                                            " (%s)" % ", ".join(whats) if whats else ""))
    return lines
