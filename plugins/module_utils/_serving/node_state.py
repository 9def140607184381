# -*- coding: utf-8 -*-
# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
# PRIVATE to llmops.serving: it can change at any time; do not import it from other collections.
"""What node_state_info reads: paths (as ansible.builtin.stat sees them, links not followed), users and
groups (as getent sees them), in one call.

A run that changes nothing asks the node once whether the accounts, directories and files a role manages are
as the role would leave them (plugins/plugin_utils/node_state.py decides that on the controller), instead of
one stat, group, user or file call each. Read-only.

Plain Python 3.6, standard library only (and file_identity.py).
"""
from __future__ import absolute_import, division, print_function

import grp
import hashlib
import os
import pwd
import stat

from ansible_collections.llmops.serving.plugins.module_utils._files import identity as file_identity

__metaclass__ = type

# More names than this in one call is not what the module is for (a role's handful of paths).
MAX_NAMES = 1000
# Checksums are for small files a role writes whole (key files, configuration): a larger one is not read.
MAX_CHECKSUM_BYTES = 16 * 1024 * 1024


class NodeStateError(Exception):
    """An input the module cannot read: says what to give instead."""


def _name_of(lookup, number):
    try:
        return lookup(number)[0]
    except (KeyError, OverflowError):
        return None


def path_state(path):
    """{"exists": False} or exists, type (file, directory, link, other), mode ("0750"), uid, gid, owner,
    group (None where no account has that id), executable (a file, or a link to one, the caller may
    execute, as ansible.builtin.stat's `executable`), for a file its identity (file_identity.py), for a
    link whether its target exists (as os.path.exists sees the link)."""
    try:
        st = os.lstat(path)
    except (OSError, ValueError):
        return {"exists": False}
    if stat.S_ISLNK(st.st_mode):
        kind = "link"
    elif stat.S_ISDIR(st.st_mode):
        kind = "directory"
    elif stat.S_ISREG(st.st_mode):
        kind = "file"
    else:
        kind = "other"
    found = {"exists": True, "type": kind, "mode": "%04o" % stat.S_IMODE(st.st_mode), "uid": st.st_uid,
             "gid": st.st_gid, "owner": _name_of(pwd.getpwuid, st.st_uid),
             "group": _name_of(grp.getgrgid, st.st_gid),
             "executable": os.access(path, os.X_OK) and os.path.isfile(path)}
    if kind == "file":
        found["identity"] = file_identity.identity(st)
    elif kind == "link":
        found["target_exists"] = os.path.exists(path)
    return found


def file_checksum(path):
    """The SHA-1 of a regular file's content, as ansible.builtin.copy compares it; None for anything else
    (a link is not followed) or a file over MAX_CHECKSUM_BYTES."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except (OSError, ValueError):
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_CHECKSUM_BYTES:
            return None
        digest = hashlib.sha1()
        while True:
            chunk = os.read(fd, 1024 * 1024)
            if not chunk:
                return digest.hexdigest()
            digest.update(chunk)
    except OSError:
        return None
    finally:
        os.close(fd)


def user_state(name):
    """None (no such user) or uid, gid, group (its primary group's name), home, shell."""
    try:
        entry = pwd.getpwnam(name)
    except (KeyError, ValueError):
        return None
    return {"uid": entry.pw_uid, "gid": entry.pw_gid, "group": _name_of(grp.getgrgid, entry.pw_gid),
            "home": entry.pw_dir, "shell": entry.pw_shell}


def group_state(name):
    """None (no such group) or gid."""
    try:
        return {"gid": grp.getgrnam(name).gr_gid}
    except (KeyError, ValueError):
        return None


def _names(value, option):
    names = [str(v) for v in value or []]
    if len(names) > MAX_NAMES:
        raise NodeStateError("%s: at most %d names per call, got %d" % (option, MAX_NAMES, len(names)))
    for name in names:
        if not name or "\0" in name:
            raise NodeStateError("%s: an empty name or one with a NUL byte: %r" % (option, name))
    return names


def read_state(paths=(), users=(), groups=(), checksums=()):
    """{"paths": {path: path_state}, "users": {name: user_state}, "groups": {name: group_state}}; the paths
    named in `checksums` (read too) carry "checksum" (file_checksum)."""
    paths, checksums = _names(paths, "paths"), _names(checksums, "checksums")
    found = {p: path_state(p) for p in paths + checksums}
    for path in checksums:
        if found[path].get("exists"):
            found[path]["checksum"] = file_checksum(path)
    return {"paths": found,
            "users": {u: user_state(u) for u in _names(users, "users")},
            "groups": {g: group_state(g) for g in _names(groups, "groups")}}
