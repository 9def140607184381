# -*- coding: utf-8 -*-
# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
# PRIVATE to llmops.serving: it can change at any time; do not import it from other collections.
"""Files in a directory other users may write to: never follow a link, never open a FIFO, socket or
device, write JSON to unguessable temporary names then rename, hash without blocking, and one run per
destination file (flock).  Shared by model_download and the sidecar record store.

Plain Python 3.6, standard library only; importable without Ansible.
"""
from __future__ import absolute_import, division, print_function

import errno
import fcntl
import hashlib
import json
import os
import stat
import tempfile
import time
from contextlib import contextmanager

from ansible_collections.llmops.serving.plugins.module_utils._download.messages import DownloadError
from ansible_collections.llmops.serving.plugins.module_utils._files.local_read import describe_path

__metaclass__ = type

MIB = 1 << 20
MAX_JSON = 16 * MIB
O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


def foreign_error(path, st):
    return DownloadError(
        "%s is %s, not a file model_download wrote: refusing to follow, open or replace it (a link or "
        "pipe planted there could make root write elsewhere or hang). Remove it (after checking who put it "
        "there) and rerun" % (path, describe_path(path, st)), foreign_path=path)


def check_own_path(path, single_link=False):
    """lstat ``path``: None when absent, its stat when a regular file; else raise DownloadError.
    ``single_link``: a file written in place (``.part``, lock) must not be a hard link either."""
    try:
        st = os.lstat(path)
    except OSError as e:
        if e.errno in (errno.ENOENT, errno.ENOTDIR):
            return None
        raise DownloadError("cannot inspect %s: %s" % (path, e)) from None
    if not stat.S_ISREG(st.st_mode) or (single_link and st.st_nlink != 1):
        raise foreign_error(path, st)
    return st


def clear_nonblock(fd):
    flags = fcntl.fcntl(fd, fcntl.F_GETFL)
    fcntl.fcntl(fd, fcntl.F_SETFL, flags & ~os.O_NONBLOCK)


def open_regular(path, flags, mode=0o644, single_link=False):
    """os.open without following a symlink (O_NOFOLLOW) and without blocking on a FIFO (O_NONBLOCK);
    anything but a regular file (and a hard link, with ``single_link``) raises DownloadError."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | O_CLOEXEC, mode)
    except OSError as e:
        check_own_path(path, single_link)  # a link, FIFO, socket...: the clear message
        raise DownloadError("cannot open %s: %s" % (path, e), errno=e.errno) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or (single_link and st.st_nlink != 1):
            raise foreign_error(path, st)
        clear_nonblock(fd)
    except BaseException:
        os.close(fd)
        raise
    return fd


def write_atomic(path, text, mode=0o644, owner=None):
    """Write ``text`` to a fresh, unguessable file next to ``path`` (mkstemp: O_EXCL, never through a
    link), set its mode (and owner), then rename it over ``path`` (a rename replaces a link, never
    follows it)."""
    d, b = os.path.split(path)
    fd, tmp = tempfile.mkstemp(prefix="." + b.lstrip(".") + ".", suffix=".tmp", dir=d or ".")
    with discarded_on_failure(tmp):
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fchmod(f.fileno(), mode)
            if owner is not None:
                try:
                    os.fchown(f.fileno(), owner[0], owner[1])
                except OSError:
                    pass
        os.rename(tmp, path)


@contextmanager
def discarded_on_failure(tmp):
    """Inside: the work that ends with the temporary name ``tmp`` renamed into place. Any failure, an
    interrupt too, removes ``tmp`` (nothing half-made stays behind) and goes on."""
    try:
        yield
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def write_json_atomic(path, data, mode=0o644, owner=None):
    write_atomic(path, json.dumps(data, sort_keys=True), mode, owner)


def trusted_owner(st):
    """Whether a file the module trusts without checking its content (a sidecar record, a partial download's
    state) can only have been written by the user this run is (root in production) or by root: owned by one
    of them, with one link, and writable by nobody else.  The models directory is writable by the service
    user, who can create files there but not files owned by root."""
    return st.st_uid in (0, os.geteuid()) and st.st_nlink == 1 and not st.st_mode & 0o022


def read_json(path, trusted=False):
    """The JSON object in ``path``; None when absent, unreadable, not a regular file (never follows a
    link, never blocks on a FIFO), not an object, nested too deep, or (with ``trusted``) written by someone
    else than this run's user or root (trusted_owner)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | O_CLOEXEC)
    except (OSError, ValueError):
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_JSON or (trusted and not trusted_owner(st)):
            return None
        clear_nonblock(fd)
        raw = os.read(fd, MAX_JSON + 1)
        data = json.loads(raw.decode("utf-8"))
        return data if isinstance(data, dict) else None
    except (OSError, ValueError, RecursionError):
        return None
    finally:
        os.close(fd)


def fsync_dir(path):
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


QUARANTINE = ".corrupt-"


def quarantined_copies(final_path):
    """The quarantined copies of final_path there are: ``<file>.corrupt-*`` (and ``<file>.part.corrupt-*``,
    which earlier versions wrote), regular files only."""
    d, b = os.path.split(final_path)
    out = []
    try:
        names = os.listdir(d or ".")
    except OSError:
        return out
    for name in sorted(names):
        if name.startswith(b + QUARANTINE) or name.startswith(b + ".part" + QUARANTINE):
            p = os.path.join(d, name)
            try:
                if stat.S_ISREG(os.lstat(p).st_mode):
                    out.append(p)
            except OSError:
                pass
    return out


def quarantine(path, final_path=None, keep=False):
    """Move ``path`` (bytes that failed verification, or a file at the final path that did not match) to the
    one quarantine slot of ``final_path`` (default ``path``): ``<file>.corrupt-<UTC time>``.  Older copies
    of that file are removed first, so there is at most one per file (a retried job that fails the same way
    does not fill the disk).  ``keep``: hard-link instead of moving, so ``path`` keeps its file until the
    caller renames the replacement over it (falls back to moving where links are not possible).
    Returns (the quarantined copy, the older copies removed)."""
    final_path = final_path or path
    removed = []
    for old in quarantined_copies(final_path):
        try:
            os.unlink(old)
            removed.append(old)
        except OSError:
            pass
    q = "%s%s%s" % (final_path, QUARANTINE, time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()))
    n = 1
    while os.path.lexists(q):
        q = "%s%s%s-%d" % (final_path, QUARANTINE, time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()), n)
        n += 1
    if keep:
        try:
            os.link(path, q)
            return q, removed
        except OSError:
            pass
    os.rename(path, q)
    return q, removed


def hash_file(path, progress=None, bufsize=8 * MIB, nofollow=False):
    """sha256 hex of the regular file at path.  A FIFO, socket or device raises OSError (it would block
    or never end); with ``nofollow`` a symlink does too."""
    flags = os.O_RDONLY | os.O_NONBLOCK | O_CLOEXEC | (os.O_NOFOLLOW if nofollow else 0)
    fd = os.open(path, flags)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file (a FIFO, socket or device): refusing to read it",
                          path)
        clear_nonblock(fd)
    except BaseException:
        os.close(fd)
        raise
    h = hashlib.sha256()
    digest_fd(fd, (h,), progress, bufsize)
    return h.hexdigest()


def digest_fd(fd, hashes, progress=None, bufsize=8 * MIB):
    """Read the open file ``fd`` to its end and close it: every byte goes to each of ``hashes`` once, its
    count to ``progress``. Reading errors are the caller's (OSError)."""
    buf = bytearray(bufsize)
    mv = memoryview(buf)
    with os.fdopen(fd, "rb", buffering=0) as f:
        while True:
            n = f.readinto(buf)
            if not n:
                break
            for h in hashes:
                h.update(mv[:n])
            if progress is not None:
                progress.add(n)


def lock_path(final_path):
    d, b = os.path.split(final_path)
    return os.path.join(d, "." + b + ".llmops.lock")


class DestLock:
    """One run per destination file: ``fcntl.flock`` on ``.<file>.llmops.lock`` (opened O_NOFOLLOW, a
    regular file with one link), the holder's pid inside.  The holder removes the file before it lets
    go; a waiter that then gets the lock on the removed file notices (inode changed) and takes the new
    one, so the lock always lives on the file at the path."""

    def __init__(self, path, fd):
        self.path = path
        self.fd = fd

    @classmethod
    def acquire(cls, path, timeout, what, progress=None, deadline=None):
        deadline = time.monotonic() + timeout if deadline is None else deadline
        waiting = False
        while True:
            check_own_path(path, single_link=True)
            fd = open_regular(path, os.O_RDWR | os.O_CREAT, 0o644, single_link=True)
            try:
                while True:
                    try:
                        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                        break
                    except OSError as e:
                        if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                            raise
                    if time.monotonic() >= deadline:
                        raise DownloadError(
                            "another model_download run (pid %s) holds %s: it is fetching %s into the same "
                            "place (two plays, or a retried job). Waited %s s (lock_timeout); let it finish "
                            "and rerun (this run then finds the verified file), or raise lock_timeout"
                            % (lock_holder(fd), path, what, timeout), lock=path)
                    if progress is not None and not waiting:
                        waiting = True
                        progress.set(state="waiting", file=what)
                    time.sleep(0.1)
                try:
                    now = os.lstat(path)
                except OSError:
                    now = None
                mine = os.fstat(fd)
                if now is None or (now.st_dev, now.st_ino) != (mine.st_dev, mine.st_ino):
                    os.close(fd)  # the previous holder removed it while letting go: lock the new one
                    continue
                os.ftruncate(fd, 0)
                os.write(fd, ("%d\n" % os.getpid()).encode())  # offset 0: never written before
                return cls(path, fd)
            except BaseException:
                try:
                    os.close(fd)
                except OSError:
                    pass
                raise

    def release(self):
        if self.fd is None:
            return
        try:
            now = os.lstat(self.path)
            mine = os.fstat(self.fd)
            if (now.st_dev, now.st_ino) == (mine.st_dev, mine.st_ino):
                os.unlink(self.path)
        except OSError:
            pass
        os.close(self.fd)
        self.fd = None


def lock_holder(fd):
    try:
        text = os.pread(fd, 64, 0).decode("ascii", "replace").strip()
    except OSError:
        return "unknown"
    return text if text.isdigit() else "unknown"
