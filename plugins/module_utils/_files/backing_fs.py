# -*- coding: utf-8 -*-
# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
# PRIVATE to llmops.serving: it can change at any time; do not import it from other collections.
"""Whether a filesystem can hold Docker's overlay2 storage: d_type, read by llmops.serving.backing_fs_info.

overlay2 needs a filesystem that reports each directory entry's type (d_type). XFS has it only when it was
made with ``-n ftype=1``: the default of xfsprogs 3.2.3 and later, but CentOS/RHEL 7.0 to 7.2's installers
made / and /home with ftype=0, and such a filesystem keeps it for life. Docker refuses to start overlay2 on
it ("the backing xfs filesystem is formatted without d_type support"), so the image pull or build of the
build stage fails, long after the driver install. Preflight (role nvidia_container_toolkit, entry point
``disk``) asks here first, for Docker's data-root:

1. the path, or while it does not exist yet (Docker not installed, a data-root not created) the nearest
   existing directory above it, which is what will hold it;
2. its mount, from ``/proc/self/mountinfo`` (the longest mount point above it; the last of several mounts
   on the same point, since that one is on top): file system type and source device;
3. XFS only: ``xfs_info <mount>``'s ``naming`` line, ``ftype=0`` or ``ftype=1``. Other file systems
   (ext4, btrfs, ...) report d_type.

``ftype=0`` is refused with the fix: a data-root on a file system with d_type, or the XFS made again with
``mkfs.xfs -n ftype=1`` (after a backup: it erases the file system). An ``xfs_info`` that cannot be run or
read leaves d_type unknown: a warning, not a refusal.

Plain Python 3.6, standard library only, importable without Ansible.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import re

from ansible_collections.llmops.serving.plugins.module_utils._files.disk_plan import existing_ancestor

FTYPE_RE = re.compile(r"^naming\s*=.*\bftype=([01])\b", re.M)
_OCTAL_RE = re.compile(r"\\([0-7]{3})")


def _unescape(field):
    """A mountinfo field with the kernel's octal escapes (\\040 for a space) decoded."""
    return _OCTAL_RE.sub(lambda m: chr(int(m.group(1), 8)), field)


def parse_mountinfo(text):
    """[{mount, fstype, source}] in the order of /proc/self/mountinfo (proc(5): the fields after ' - ' are
    the file system type and the source)."""
    mounts = []
    for line in (text or "").splitlines():
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if not sep or len(fields) < 5 or len(tail) < 2:
            continue
        mounts.append(dict(mount=_unescape(fields[4]), fstype=tail[0], source=_unescape(tail[1])))
    return mounts


# A mount table of a few thousand mounts is a few hundred KiB; nothing real comes near this.
MOUNTINFO_MAX_BYTES = 16 * 1024 * 1024


def read_mountinfo(path="/proc/self/mountinfo"):
    """parse_mountinfo() of the file; ValueError when it is no regular file (a FIFO would block) or cannot be
    read."""
    if not os.path.isfile(path):
        raise ValueError("the mount table %s is not a readable file" % path)
    try:
        with open(path, "rb") as handle:
            data = handle.read(MOUNTINFO_MAX_BYTES)
    except (IOError, OSError) as exc:
        raise ValueError("cannot read the mount table %s: %s" % (path, exc)) from exc
    return parse_mountinfo(data.decode("utf-8", "replace"))


def mount_of(path, mounts):
    """The mount (of parse_mountinfo) holding an absolute path: the longest mount point above it, the last
    one listed when several are mounted on it. None when no mount point covers it."""
    best = None
    for entry in mounts:
        point = entry["mount"].rstrip("/") or "/"
        if point == "/" or path == point or path.startswith(point + "/"):
            if best is None or len(point) >= len(best["mount"].rstrip("/") or "/"):
                best = entry
    return best


def xfs_ftype(text):
    """ftype of xfs_info's output (0 or 1), None when it says nothing of it."""
    match = FTYPE_RE.search(text or "")
    return int(match.group(1)) if match else None


def d_type_check(path, mounts, xfs_info, what="Docker's data-root", variable=""):
    """The d_type verdict for the file system that holds (or will hold) path.

    mounts: parse_mountinfo(); xfs_info: a callable, mount point -> (rc, stdout, stderr) of ``xfs_info``
    (None when the tool is missing). Returns path, anchor (the existing directory read), mount, fstype,
    source, ftype (0, 1 or None), d_type (True, False, or None when unknown), and message: why it is refused
    (d_type False) or cannot be told (None); empty when d_type is True."""
    anchor = os.path.realpath(existing_ancestor(path))
    entry = mount_of(anchor, mounts) or dict(mount="/", fstype="", source="")
    out = dict(path=path, anchor=anchor, mount=entry["mount"], fstype=entry["fstype"], source=entry["source"],
               ftype=None, d_type=True, message="")
    if entry["fstype"] != "xfs":
        return out
    where = "%s %s%s is on %s (xfs on %s)" % (
        what, path, "" if anchor == path else " (not created yet: %s holds it)" % anchor, entry["mount"],
        entry["source"])
    result = xfs_info(entry["mount"]) if xfs_info is not None else None
    if result is None or result[0] != 0:
        detail = "xfs_info is not installed" if result is None else "xfs_info %s failed: %s" % (
            entry["mount"], (result[2] or result[1] or "rc %d" % result[0]).strip())
        out.update(d_type=None, message="%s, and whether it has d_type cannot be told (%s): Docker's "
                                        "overlay2 needs ftype=1." % (where, detail))
        return out
    out["ftype"] = xfs_ftype(result[1])
    if out["ftype"] is None:
        out.update(d_type=None, message="%s, and xfs_info %s says nothing of ftype: Docker's overlay2 needs "
                                        "ftype=1." % (where, entry["mount"]))
    elif out["ftype"] == 0:
        move = ("set %s to a path on a file system with d_type (ext4, or XFS with ftype=1)" % variable
                if variable else "move it to a file system with d_type (ext4, or XFS with ftype=1)")
        out.update(d_type=False, message=(
            "%s, an XFS made without d_type (xfs_info %s shows ftype=0; CentOS/RHEL 7.0-7.2 installers "
            "made them so): Docker's overlay2 storage driver refuses it and the build stage would fail. "
            "Either %s, or back up %s and make the file system again with mkfs.xfs -n ftype=1 %s "
            "(it erases it)." % (
                where, entry["mount"], move, entry["mount"], entry["source"])))
    return out
