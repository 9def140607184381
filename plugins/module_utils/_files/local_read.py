# -*- coding: utf-8 -*-
# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
# PRIVATE to llmops.serving: it can change at any time; do not import it from other collections.
"""Bounded reads of small local files: a model's config.json and shard index, sysfs and /proc attributes, a
module's own record file (issue 34).

A plain ``open(path).read()`` of a path a user or another process can place something at hangs on a FIFO
(the open blocks until a writer comes), never ends on a link to ``/dev/zero`` and takes all memory on a huge
file. Here every read: opens with ``O_NONBLOCK`` (a FIFO's open returns at once) and, unless the caller
follows links on purpose, ``O_NOFOLLOW`` (the last component may not be a symbolic link); ``fstat``s the open
file and refuses anything but a regular file, naming what it is; refuses a file whose size is over the
caller's cap before reading a byte; and reads at most cap + 1 bytes, so a file that reports a small size and
holds more (sysfs reports 4096 for every attribute, /proc 0) is refused too instead of read to its end.

Plain Python 3.6, standard library only; importable without Ansible.
"""
from __future__ import absolute_import, division, print_function

import errno
import fcntl
import json
import os
import stat

__metaclass__ = type

KIB = 1 << 10
MIB = 1 << 20
O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


class LocalReadError(OSError):
    """A local file refused or unreadable: the message names the path, what it is and what to do. An OSError
    (``errno`` set where the system gave one), so callers that handle an unreadable file handle this too."""

    def __init__(self, message, errno_=None):
        super(LocalReadError, self).__init__(message)
        self.errno = errno_
        self.message = message

    def __str__(self):
        return self.message


def describe_inode(st):
    """What a non-regular (or multiply linked) inode is, in words."""
    m = st.st_mode
    for test, words in ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                        (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                        (stat.S_ISBLK, "a block device"), (stat.S_ISDIR, "a directory")):
        if test(m):
            return words
    if stat.S_ISREG(m) and st.st_nlink > 1:
        return "a hard link (one of %d names of a file)" % st.st_nlink
    return "not a regular file"


def _named(what, path):
    return "%s %s" % (what, path) if what else path


def describe_path(path, st):
    """describe_inode(), with a symbolic link's target: "a symbolic link (to /dev/zero)"."""
    target = ""
    if stat.S_ISLNK(st.st_mode):
        try:
            target = " (to %s)" % os.readlink(path)
        except OSError:
            pass
    return describe_inode(st) + target


def _refusal(path, st, what):
    return LocalReadError("%s is %s, not a regular file: refusing to read it (a link, pipe or device there "
                          "could make the read hang or never end). Put the real file there"
                          % (_named(what, path), describe_path(path, st)), errno.EINVAL)


def read_bytes(path, max_bytes, what="", follow=False):
    """The bytes of the regular file ``path``, at most ``max_bytes`` of them; LocalReadError otherwise.
    ``what`` names the file in messages ("config.json of the model"); ``follow``: a symbolic link as last
    component is followed (its target must still be a regular file)."""
    flags = os.O_RDONLY | os.O_NONBLOCK | O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except (OSError, ValueError) as exc:  # ValueError: a NUL byte in the path
        try:
            st = os.lstat(path)
        except (OSError, ValueError):
            st = None
        if st is not None and not follow and stat.S_ISLNK(st.st_mode):
            raise _refusal(path, st, what) from None
        reason = getattr(exc, "strerror", None) or exc
        raise LocalReadError("cannot read %s: %s" % (_named(what, path), reason),
                             getattr(exc, "errno", None)) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _refusal(path, st, what)
        if st.st_size > max_bytes:
            raise _too_large(path, what, max_bytes, "is %d bytes" % st.st_size)
        flags = fcntl.fcntl(fd, fcntl.F_GETFL)
        fcntl.fcntl(fd, fcntl.F_SETFL, flags & ~os.O_NONBLOCK)
        chunks, total = [], 0
        while total <= max_bytes:
            chunk = os.read(fd, min(max_bytes + 1 - total, MIB))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
    except OSError as exc:
        if isinstance(exc, LocalReadError):
            raise
        raise LocalReadError("cannot read %s: %s" % (_named(what, path), exc.strerror or exc), exc.errno) \
            from None
    finally:
        os.close(fd)
    if total > max_bytes:
        raise _too_large(path, what, max_bytes, "holds more than that")
    return b"".join(chunks)


def _too_large(path, what, max_bytes, how):
    return LocalReadError("%s %s, over the limit of %d bytes for it: not the file it should be (remove or "
                          "replace it)" % (_named(what, path), how, max_bytes), errno.EFBIG)


def read_text(path, max_bytes, what="", follow=False):
    """read_bytes() as UTF-8 text; bytes that are not UTF-8 are refused (LocalReadError naming the file)."""
    raw = read_bytes(path, max_bytes, what, follow)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise LocalReadError("%s is not UTF-8 text (byte %d is 0x%02x): not the file it should be"
                             % (_named(what, path), exc.start, raw[exc.start]), errno.EILSEQ) from None


def read_json(path, max_bytes, what="", follow=False):
    """The JSON document in ``path`` (read_text()); LocalReadError when it is not JSON."""
    text = read_text(path, max_bytes, what, follow)
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:
        detail = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)[:200]
        raise LocalReadError("%s is not JSON (%s)" % (_named(what, path), detail), errno.EINVAL) from None
