# -*- coding: utf-8 -*-
# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
# PRIVATE to llmops.serving: it can change at any time; do not import it from other collections.
"""Where a download resumes: the partial file ``<file>.part`` and its state ``<file>.part.json``.

The state lists the byte ranges already written and what they belong to (size, sha256, source, the
plain URL's ETag/Last-Modified, the CDN's ETag for If-Range).  A run resumes those ranges only when the
state describes the same file version as the source does now, the ``.part`` has the expected size, and
something ties the ranges together (a hub commit, a strong ETag or Last-Modified); otherwise the part
and its state are discarded and the download starts from zero.  The state is saved about once a second,
each time after an fdatasync of the ``.part``, so every range it claims is on disk even after a power
loss (the final sha256 check catches the rest).  Check mode reports the same resumable bytes a real run
would resume (``resumable_bytes``).

Plain Python 3.6, standard library only; importable without Ansible.
"""
from __future__ import absolute_import, division, print_function

import errno
import json
import os
import stat

from ansible_collections.llmops.serving.plugins.module_utils._download.messages import DownloadError, human
from ansible_collections.llmops.serving.plugins.module_utils._download.ranges import Ranges
from ansible_collections.llmops.serving.plugins.module_utils._download.sidecar import sidecar_path
from ansible_collections.llmops.serving.plugins.module_utils._files.disk_plan import (
    existing_ancestor,
    mount_point,
)
from ansible_collections.llmops.serving.plugins.module_utils._files.safe import (
    lock_path,
    read_json,
    trusted_owner,
    write_json_atomic,
)

__metaclass__ = type

STATE_VERSION = 1


def part_path(t):
    return t.final_path + ".part"


def state_path(t):
    return t.final_path + ".part.json"


def owned_paths(t):
    """(path, written in place) of every file the run may touch for target t."""
    return ((t.final_path, False), (part_path(t), True), (state_path(t), False),
            (sidecar_path(t.final_path), False), (lock_path(t.final_path), True))


def part_identity(t):
    """What the ranges of a ``.part`` belong to: a state with another identity is another file version."""
    ident = {"size": t.size, "sha256": t.sha256, "source": t.source_url,
             "etag": t.etag if not t.sha256 else None}
    if t.last_modified and not t.sha256:
        ident["last_modified"] = t.last_modified
    return ident


def validator(o, t):
    """What ties bytes fetched at different times to one version: a strong ETag or Last-Modified
    (plain URL).  Hub downloads are pinned to a commit's resolve URL and need none."""
    if not o.get("url"):
        return "commit"
    etag = t.etag or ""
    if etag and not etag.startswith("W/"):
        return etag
    return t.last_modified


def ranges_safe(o, t):
    """Ranges (parallel, or resuming after a drop) cannot mix two versions of the file: there is a
    validator for If-Range, or the sha256 is known and the final check catches a mix."""
    return bool(validator(o, t) or t.sha256)


def trusted_state(o, t):
    """(ranges written, CDN ETag) of an earlier run's ``.part`` that this run may resume, or None.  The part
    and its state must have been written by this run's user or root (safe_files.trusted_owner): ranges a
    service user planted are not resumed."""
    st = read_json(state_path(t), trusted=True)
    try:
        pst = os.lstat(part_path(t))
    except OSError:
        pst = None
    if st and pst and st.get("version") == STATE_VERSION and st.get("identity") == part_identity(t) \
            and stat.S_ISREG(pst.st_mode) and trusted_owner(pst) and pst.st_size == t.size \
            and validator(o, t):
        return Ranges(st.get("done") or []).clip(t.size), st.get("cdn_etag")
    return None


def resumable_bytes(o, t):
    """Bytes of t a download would not fetch again."""
    state = trusted_state(o, t) if t.size else None
    return state[0].total() if state else 0


def resume(o, t):
    """(ranges to keep, CDN ETag): the trusted state, else nothing (the stale part and state are removed)."""
    state = trusted_state(o, t)
    if state is not None:
        return state
    for p in (part_path(t), state_path(t)):
        try:
            os.unlink(p)
        except OSError:
            pass
    return Ranges(), None


def save_state(t, done, cdn_etag, fd=None):
    """Persist the ranges written so far.  With ``fd`` (the open part), fdatasync it first, so every
    range the state claims is on disk (and the final fsync has little left to flush)."""
    data = json.loads(json.dumps({"version": STATE_VERSION, "identity": part_identity(t), "done": done,
                                  "cdn_etag": cdn_etag}))
    try:
        if fd is not None:
            os.fdatasync(fd)
        write_json_atomic(state_path(t), data, 0o600)
    except OSError:
        pass


def drop_state(t):
    if os.path.lexists(state_path(t)):
        os.unlink(state_path(t))


DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


def no_room(path, need, margin=0):
    """Where the room is missing and what to do, for every disk-full message of a download: the filesystem
    that holds ``path`` by its mount point, its free space, and the ``need`` bytes (+ ``margin``) wanted."""
    try:
        mount = mount_point(path)
        vfs = os.statvfs(existing_ancestor(path))
        where, free = "the filesystem mounted at %s" % mount, human(vfs.f_bavail * vfs.f_frsize)
    except OSError:
        where, free, mount = "the filesystem of %s" % path, "unknown", "it"
    extra = " (+%s margin)" % human(margin) if margin else ""
    return ("%s has %s free, %s needed%s. Free space on %s, or set dest to a directory on another "
            "filesystem, and rerun" % (where, free, human(need), extra, mount))


def disk_error(e, path, remaining=None):
    """The DownloadError of a failed write into the part: disk full (the filesystem does not reserve the
    preallocated blocks: ZFS, NFS, thin volumes) says where and how much; the part is kept for the rerun."""
    if e.errno in DISK_FULL:
        return DownloadError("disk full while writing %s (%s): %s; the partial download is kept and resumes"
                             % (path, os.strerror(e.errno), no_room(path, remaining or 0)), disk_full=True)
    return DownloadError("cannot write %s: %s" % (path, e))


def preallocate(fd, size, path):
    """Give the (empty) part its full size before any byte arrives.  DownloadError when the filesystem
    refuses: disk full, or a size it cannot hold (EFBIG, EINVAL); the caller removes the empty part."""
    if size == 0:
        return
    fallocate = getattr(os, "posix_fallocate", None)
    try:
        if fallocate is not None:
            try:
                fallocate(fd, 0, size)
                return
            except OSError as e:
                unsupported = (errno.EOPNOTSUPP, errno.EINVAL, getattr(errno, "ENOTSUP", errno.EOPNOTSUPP))
                if e.errno not in unsupported:
                    raise
        os.ftruncate(fd, size)
    except OSError as e:
        if e.errno in DISK_FULL:
            raise DownloadError("disk full: cannot make room for %s (%s): %s" % (
                path, os.strerror(e.errno), no_room(path, size)), disk_full=True) from None
        raise DownloadError("cannot make %s %d bytes long (%s): too large for the filesystem of dest, or a "
                            "wrong size; nothing was downloaded" % (path, size, os.strerror(e.errno)
                                                                    if e.errno else e)) from None


def free_space_check(dest, plans, margin):
    """``plans``: list of (size, part_path).  Raise DownloadError when dest lacks room."""
    need = 0
    for size, part in plans:
        have = 0
        try:
            st = os.lstat(part)
            if st.st_size == size:
                have = min(size, getattr(st, "st_blocks", 0) * 512)
        except OSError:
            pass
        need += max(0, size - have)
    if need == 0:
        return
    vfs = os.statvfs(dest)
    avail = vfs.f_bavail * vfs.f_frsize
    if avail < need + margin:
        raise DownloadError("not enough free space for %s: %s; any partial download is kept and resumes"
                            % (dest, no_room(dest, need, margin)), disk_full=True)
