# -*- coding: utf-8 -*-
# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
# PRIVATE to llmops.serving: it can change at any time; do not import it from other collections.
"""Where a repository snapshot lives on the node, and how one replaces another atomically.

Layout for ``dest = <parent>/<name>`` (for example /home/models/Qwen3.6-27B-FP8)::

    <parent>/<name>                     -> .<name>.snapshots/<id>      (a relative symlink: what vLLM reads)
    <parent>/.<name>.snapshots/<id>/    one complete snapshot: the repo's files and .llmops-snapshot.json
    <parent>/.<name>.snapshots/<id>.partial/       the next snapshot while it is fetched (resumable)
    <parent>/.<name>.snapshots/<id>.partial.json   which files of it are verified (the build journal)
    <parent>/.<name>.snapshots/corrupt/            bytes that failed verification, kept for inspection
    <parent>/.<name>.llmops.lock                   flock: one run per dest

``<id>`` is the commit (or, for a ModelScope branch, the listing's content id); a rebuild of the same
commit (a damaged file repaired) gets ``<id>.1``, ``<id>.2``... The link is relative, so a container that
mounts ``<parent>`` sees the same tree. ``<name>`` is only ever replaced by ``rename(2)`` of a new
symlink over it (atomic), after the new snapshot is complete, verified and fsync'ed; until then it
points at the previous snapshot, which nothing writes into. A ``kill -9`` at any moment leaves either
the old or the new snapshot behind ``<name>``, never a mix and never a dangling link; what it
interrupts is resumed or removed by the next run. The snapshot before the current one is kept (a process
started from it may still open files; re-pointing the link is a rollback); older ones are removed.

Plain Python 3.6, standard library only; importable without Ansible.
"""
from __future__ import absolute_import, division, print_function

import errno
import hashlib
import os
import shutil
import stat
import tempfile
import time

from ansible_collections.llmops.serving.plugins.module_utils._download.messages import DownloadError
from ansible_collections.llmops.serving.plugins.module_utils._files.identity import same_file
from ansible_collections.llmops.serving.plugins.module_utils._files.safe import (
    discarded_on_failure,
    foreign_error,
    fsync_dir,
    lock_path,
    read_json,
    write_json_atomic,
)
from ansible_collections.llmops.serving.plugins.module_utils._snapshot.listing import (
    MANIFEST_NAME,
    path_problem,
)
from ansible_collections.llmops.serving.plugins.module_utils.validators import whole

__metaclass__ = type

MANIFEST_VERSION = 1
NAME_RE = whole(r"(?:[0-9a-f]{40}|ms-[0-9a-f]{40})(?:\.[0-9]{1,6})?")
LINK_TMP_PREFIX = ".llmops-link-"


class Layout:
    """The paths of one dest."""

    def __init__(self, dest):
        self.dest = os.path.normpath(dest)
        self.parent, self.name = os.path.split(self.dest)
        self.store_rel = "." + self.name + ".snapshots"
        self.store = os.path.join(self.parent, self.store_rel)
        self.corrupt = os.path.join(self.store, "corrupt")
        self.lock = lock_path(self.dest)

    def snap(self, name):
        return os.path.join(self.store, name)

    def partial(self, ident):
        return os.path.join(self.store, ident + ".partial")

    def journal(self, ident):
        return os.path.join(self.store, ident + ".partial.json")

    def link_target(self, name):
        return self.store_rel + "/" + name


def manifest_path(snap_dir):
    return os.path.join(snap_dir, MANIFEST_NAME)


def _lstat(path):
    try:
        return os.lstat(path)
    except OSError as e:
        if e.errno in (errno.ENOENT, errno.ENOTDIR):
            return None
        raise DownloadError("cannot inspect %s: %s" % (path, e)) from None


def real_dir(path, what):
    """lstat path: None when absent, its stat when a real directory; a link or anything else is refused."""
    st = _lstat(path)
    if st is not None and not stat.S_ISDIR(st.st_mode):
        err = foreign_error(path, st)
        raise DownloadError("%s (%s)" % (err.msg, what), foreign_path=path)
    return st


def current(layout):
    """The name of the snapshot ``dest`` points at, or None when dest does not exist. Anything at dest
    that this module did not make (a directory, a file, a link elsewhere) is refused, naming it."""
    st = _lstat(layout.dest)
    if st is None:
        return None
    if stat.S_ISDIR(st.st_mode):
        raise DownloadError(
            "%s is a directory that model_snapshot did not create (a model copied or downloaded by hand?): "
            "it is never replaced or merged. Move it aside (mv %s %s.manual) and rerun, or choose another "
            "dest; the files are then fetched and verified into %s/"
            % (layout.dest, layout.dest, layout.dest, layout.store), foreign_path=layout.dest)
    if not stat.S_ISLNK(st.st_mode):
        raise foreign_error(layout.dest, st)
    target = os.readlink(layout.dest)
    prefix = layout.store_rel + "/"
    name = target[len(prefix):] if target.startswith(prefix) else None
    if not name or not NAME_RE.match(name):
        raise DownloadError(
            "%s is a symbolic link to %s, not to a snapshot of %s/: model_snapshot did not make it and does "
            "not follow it. Remove it (after checking who put it there) and rerun"
            % (layout.dest, target, layout.store), foreign_path=layout.dest)
    real_dir(layout.store, "the snapshot store")
    if real_dir(layout.snap(name), "the current snapshot") is None:
        raise DownloadError("%s points at %s, which is missing: the snapshot was removed by hand. Remove the "
                            "link and rerun to fetch the snapshot again" % (layout.dest, target),
                            foreign_path=layout.dest)
    return name


def read_manifest(snap_dir):
    """The manifest of a snapshot, or None when it is absent, unreadable, of another version, or names a path
    that could not be a file of the snapshot (a forged ``../``: never used to read or write anything)."""
    m = read_json(manifest_path(snap_dir), trusted=True)
    if not m or m.get("version") != MANIFEST_VERSION or not isinstance(m.get("files"), list):
        return None
    for f in m["files"]:
        if not (isinstance(f, dict) and isinstance(f.get("path"), str) and isinstance(f.get("size"), int)):
            return None
        if path_problem(f["path"]):
            return None
    return m


def content_sha256(manifest_files):
    """What a snapshot holds, as one digest: sha256 over the sorted ``path size sha256 git_sha1`` lines.
    The same files give the same digest on every node (no inode or time in it)."""
    h = hashlib.sha256()
    for f in sorted(manifest_files, key=lambda x: x["path"]):
        h.update(("%s\0%d\0%s\0%s\n" % (f["path"], f["size"], f.get("sha256") or "", f.get("git_sha1") or ""))
                 .encode("utf-8", "surrogateescape"))
    return h.hexdigest()


def matches(entry, st):
    """The manifest's fast path: a file with a digest whose stat identity is unchanged (file_identity.py)."""
    return same_file(entry, st) and bool(entry.get("sha256"))


def file_stat(snap_dir, rel):
    """lstat of a snapshot file (None when absent); a link, FIFO, device or directory there, or a link or
    non-directory in one of its folders, is refused, naming the path."""
    path = snap_dir
    segs = rel.split("/")
    for seg in segs[:-1]:
        path = os.path.join(path, seg)
        if real_dir(path, "a folder of %s" % rel) is None:
            return None
    path = os.path.join(path, segs[-1])
    st = _lstat(path)
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise foreign_error(path, st)
    return st


def scan(snap_dir, expected, allowed=(), extra="refuse"):
    """Every entry below snap_dir (never following a link): refuse a link, FIFO, socket or device anywhere,
    and any file or folder that is not an expected repo path (or a folder of one), the manifest or in
    ``allowed`` (names a build may hold). ``extra``: what to do with such a regular file or folder instead of
    refusing it: "ignore" it or "remove" it (a build folder of this module, never a served snapshot).
    Returns the set of regular files found (relative paths)."""
    found = set()
    expected = set(expected)
    dirs = set()
    for p in expected:
        segs = p.split("/")
        for i in range(1, len(segs)):
            dirs.add("/".join(segs[:i]))
    stack = [""]
    while stack:
        rel_dir = stack.pop()
        here = os.path.join(snap_dir, rel_dir) if rel_dir else snap_dir
        try:
            names = os.listdir(here)
        except OSError as e:
            raise DownloadError("cannot list %s: %s" % (here, e)) from None
        for n in names:
            rel = rel_dir + "/" + n if rel_dir else n
            path = os.path.join(here, n)
            st = _lstat(path)
            if st is None:
                continue
            if stat.S_ISDIR(st.st_mode) and rel in dirs:
                stack.append(rel)
                continue
            if stat.S_ISREG(st.st_mode) and (rel in expected or rel == MANIFEST_NAME or rel in allowed):
                found.add(rel)
                continue
            if (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)) and extra != "refuse":
                if stat.S_ISDIR(st.st_mode) and extra == "ignore":
                    stack.append(rel)  # look inside for links and FIFOs all the same
                elif extra == "remove" and stat.S_ISDIR(st.st_mode):
                    scan(path, (), extra="remove")
                    os.rmdir(path)
                elif extra == "remove":
                    os.unlink(path)
                continue
            if stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode):
                raise DownloadError(
                    "%s is %s that is not part of the snapshot (not in the repo's listing or the manifest): "
                    "vLLM would read it with the model (an extra *.safetensors changes the weights). Remove "
                    "it (after checking who put it there) and rerun"
                    % (path, "a directory" if stat.S_ISDIR(st.st_mode) else "a file"), foreign_path=path)
            raise foreign_error(path, st)
    return found


def make_dirs(root, rel_file, mode=0o755):
    """Create the folders of rel_file below root (each a real directory, never through a link)."""
    path = root
    for seg in rel_file.split("/")[:-1]:
        path = os.path.join(path, seg)
        if real_dir(path, "a folder of %s" % rel_file) is None:
            os.mkdir(path, mode)


def ensure_dir(path, what, mode=0o755):
    if real_dir(path, what) is None:
        os.mkdir(path, mode)
        fsync_dir(os.path.dirname(path))


def write_manifest(snap_dir, manifest):
    write_json_atomic(manifest_path(snap_dir), manifest)
    fsync_dir(snap_dir)


def fsync_tree(root):
    """fsync every directory of a snapshot (the files are fsync'ed when written)."""
    for dirpath, _dirs, _files in os.walk(root):
        fsync_dir(dirpath)


def final_name(layout, ident):
    """``<id>``, or ``<id>.<n>`` when that name is taken (a rebuild of the same commit)."""
    if _lstat(layout.snap(ident)) is None:
        return ident
    for n in range(1, 1000000):
        name = "%s.%d" % (ident, n)
        if _lstat(layout.snap(name)) is None:
            return name
    raise DownloadError("%s: no free snapshot name for %s" % (layout.store, ident))


def switch(layout, name):
    """Point dest at snapshot ``name``: a new relative symlink under an unguessable name, renamed over dest
    (atomic: dest is the old link or the new one at every moment), then the parent fsync'ed."""
    tmp_dir = layout.parent
    fd, tmp = tempfile.mkstemp(prefix=LINK_TMP_PREFIX, dir=tmp_dir)
    os.close(fd)
    os.unlink(tmp)  # the name stays unguessable; symlink() refuses to replace anything planted meanwhile
    os.symlink(layout.link_target(name), tmp)
    with discarded_on_failure(tmp):
        os.rename(tmp, layout.dest)
    fsync_dir(layout.parent)


def stale_links(layout):
    """Temporary links a killed switch left in the parent (ours: our prefix, pointing into our store)."""
    out = []
    try:
        names = os.listdir(layout.parent)
    except OSError:
        return out
    for n in names:
        if not n.startswith(LINK_TMP_PREFIX):
            continue
        path = os.path.join(layout.parent, n)
        st = _lstat(path)
        if st is not None and stat.S_ISLNK(st.st_mode) \
                and os.readlink(path).startswith(layout.store_rel + "/"):
            out.append(path)
    return out


def remove_tree(path):
    """Remove a directory of the store (never following a link inside: rmtree does not)."""
    st = _lstat(path)
    if st is None:
        return
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(path)
    else:
        os.unlink(path)


def collect(layout, keep):
    """Remove every entry of the store but the names in ``keep`` and ``corrupt``; and stale switch links."""
    removed = []
    for n in sorted(os.listdir(layout.store)):
        if n in keep or n == "corrupt":
            continue
        remove_tree(layout.snap(n))
        removed.append(n)
    for p in stale_links(layout):
        os.unlink(p)
    return removed


def quarantine_into(layout, path, rel):
    """Move bytes that failed verification to ``<store>/corrupt/<rel with / as %2F>.corrupt-<UTC time>``."""
    ensure_dir(layout.corrupt, "the quarantine folder", 0o700)  # bytes nobody vouches for: root only
    base = rel.replace("%", "%25").replace("/", "%2F")
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    q = os.path.join(layout.corrupt, "%s.corrupt-%s" % (base, stamp))
    n = 1
    while os.path.lexists(q):
        q = os.path.join(layout.corrupt, "%s.corrupt-%s-%d" % (base, stamp, n))
        n += 1
    os.rename(path, q)
    return q


def journal_read(layout, ident):
    j = read_json(layout.journal(ident), trusted=True)
    if not j or j.get("version") != MANIFEST_VERSION or j.get("id") != ident \
            or not isinstance(j.get("files"), dict):
        return {}
    return j["files"]


def journal_write(layout, ident, files):
    write_json_atomic(layout.journal(ident), {"version": MANIFEST_VERSION, "id": ident, "files": files},
                      0o600)


def dumps_lines(manifest):
    """The diff view of a manifest: its id and one line per file."""
    if not manifest:
        return ""
    lines = ["snapshot %s of %s" % (manifest.get("id"), manifest.get("repo"))]
    for f in sorted(manifest.get("files") or [], key=lambda x: x["path"]):
        lines.append("%s %d %s" % (f["path"], f["size"], f.get("sha256") or f.get("git_sha1")))
    return "\n".join(lines) + "\n"
