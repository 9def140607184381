# -*- coding: utf-8 -*-
# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
# PRIVATE to llmops.serving: it can change at any time; do not import it from other collections.
"""Verified, resumable repository snapshots (logic of ``llmops.serving.model_snapshot``): a vLLM model
directory (safetensors shards, config.json, tokenizer files) fetched from Hugging Face or ModelScope at one
commit. A run is ``decide()`` (what to do, and why; writes nothing: check mode returns it) then
``apply()``.

Where each concern lives
------------------------
* ``snapshot_listing.py``: the commit and the file listing, bounded and checked (hostile listings).
* ``snapshot_store.py``: the layout on disk, the manifest, the atomic switch, what is removed when.
* ``snapshot_options.py``: the options (model_download's rules for the shared ones).
* Each file's bytes go through model_download's machinery unchanged: ``download_transfer.FileDownload``
  (``<file>.part`` + ranges in ``<file>.part.json``, parallel ranges, streaming sha256, retries, the token
  bound to the endpoint's origin), ``download_parts`` (resume rules, free space), ``safe_files`` (no links,
  no FIFOs, flock).

A run
-----
1. The revision resolves to a commit once (Hugging Face), every file is then fetched from
   ``/resolve/<commit>/``. A re-run pinned to the commit of the current snapshot makes no request.
2. The listing (at most 8 MiB and 30,000 files; paths checked) filtered by ``allow_patterns`` and
   ``ignore_patterns`` is the snapshot's content. Each file needs a size and a checksum: LFS files the
   listing's sha256, plain git files their git blob id (``sha1("blob <size>\\0" + bytes)``), ModelScope
   files their ``Sha256``.
3. The new snapshot is built in ``<store>/<id>.partial/`` beside the current one: files whose checksum
   equals a verified file of a snapshot already on the node are hard-linked (no bytes fetched), the others
   fetched in parallel within ``connections`` (a file of at least ``parallel_min_size`` takes them all, a
   smaller one takes one; admission is first come, first served), resuming any ``.part`` a killed run left.
   A file is renamed into the build only after its size and checksum match; a mismatch moves the bytes to
   ``<store>/corrupt/`` and fails the run (the current snapshot keeps serving).
4. The build must hold exactly the listed files (no link, FIFO or extra file), and every shard its
   safetensors index (``model.safetensors.index.json``) names: patterns that leave one out are refused,
   naming it and the pattern (vLLM would fail at load; ``check_shard_indexes``); the manifest
   ``.llmops-snapshot.json`` (repo, commit, per file size, sha256, git blob id and the stat identity) is
   written, everything fsync'ed, the build renamed to ``<store>/<id>`` and ``dest``'s symlink switched to it
   atomically. The previous snapshot is kept, older ones removed.

Fast path (the sidecar's rules and limits, per file, from the manifest)
---------------------------------------------------------------------
A re-run that keeps the current snapshot trusts each file whose size, mtime_ns, inode and ctime_ns still
equal the manifest's, without hashing; any other file is hashed (``force_verify`` hashes all). A file that
no longer matches its checksum makes the run build a repaired snapshot of the same commit (good files
linked, the damaged one fetched again) and switch to it; the damaged bytes go to ``<store>/corrupt/``.
The fast path cannot detect bit rot below the filesystem, nor a manifest forged by someone who can write
the store when no listing vouches for it (a pinned-commit re-run, an unreachable hub, a moved branch kept
with ``update: false``): ``force_verify`` re-hashes everything.

Plain Python 3.6, standard library only; importable without Ansible.
"""
from __future__ import absolute_import, division, print_function

import errno
import hashlib
import json
import os
import posixpath
import stat
import threading
import time

from ansible_collections.llmops.serving.plugins.module_utils._download.http import Session
from ansible_collections.llmops.serving.plugins.module_utils._download.messages import (
    DownloadError,
    human,
    redact_url,
    scrub,
)
from ansible_collections.llmops.serving.plugins.module_utils._download.parts import (
    drop_state,
    free_space_check,
    part_path,
    resumable_bytes,
    state_path,
)
from ansible_collections.llmops.serving.plugins.module_utils._download.progress import run_with_progress
from ansible_collections.llmops.serving.plugins.module_utils._download.source import (
    HEX40,
    Target,
    resolve_url,
)
from ansible_collections.llmops.serving.plugins.module_utils._download.transfer import FileDownload
from ansible_collections.llmops.serving.plugins.module_utils._files import identity as file_identity
from ansible_collections.llmops.serving.plugins.module_utils._files.safe import (
    DestLock,
    check_own_path,
    digest_fd,
    fsync_dir,
    open_regular,
)
from ansible_collections.llmops.serving.plugins.module_utils._snapshot import store
from ansible_collections.llmops.serving.plugins.module_utils._snapshot.listing import (
    SnapFile,
    content_id,
    excluded_by,
    list_files,
    resolve_commit,
    select,
)
from ansible_collections.llmops.serving.plugins.module_utils._snapshot.options import normalize

__metaclass__ = type

MIB = 1 << 20
JOURNAL_EVERY_S = 1.0
# A safetensors checkpoint's shard index (``model.safetensors.index.json``): checked against the snapshot's
# files before it is published.  A real one is a few MB (one line per tensor).
INDEX_SUFFIX = ".safetensors.index.json"
INDEX_MAX_BYTES = 64 << 20
LINK_FALLBACK = (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.EOPNOTSUPP, getattr(errno, "ENOTSUP", 95))

WOULD = {
    "keep": "verified (manifest), nothing to do",
    "hash": "would hash the snapshot's file",
    "built": "already fetched into the build (journal)",
    "hash_built": "would hash the file already in the build",
    "link": "would reuse the verified file of snapshot %s (hard link, nothing fetched)",
    "download": "would download %s",
}


class Step:
    def __init__(self, f, action, reason, source=None):
        self.f = f  # SnapFile
        self.action = action
        self.reason = reason
        self.source = source  # (snapshot dir, manifest entry) to link from
        self.resumable = 0


class Plan:
    """decide()'s answer: ``mode`` keep (the current snapshot stays) or build (a new one replaces it)."""

    def __init__(self, o, layout):
        self.o = o
        self.layout = layout
        self.current = None  # name of the snapshot dest points at
        self.manifest = None  # its manifest (None: none or unreadable)
        self.mode = "keep"
        self.ident = None
        self.commit = None
        self.fetch_rev = None
        self.files = []
        self.steps = []
        self.notes = []
        self.update_available = False
        self.checked = []  # keep mode: (manifest entry, "keep" | "hash")
        self.repair = set()  # paths damaged in the current snapshot (a repair build)
        self.current_readable = False  # the current snapshot has a valid manifest (of any repo)
        self.hashed = False
        self.before = ""  # the current snapshot as the diff shows it
        self.listed_paths = None  # every path of the repo's listing at the commit (before the patterns)


def run(params, check_mode=False, set_attributes=None):
    """Do it; return the result dict or raise DownloadError (its message says what to do).
    ``set_attributes(path, is_dir) -> bool`` applies the module's owner/group/mode/SELinux arguments to a
    file or folder of the new snapshot before its manifest is written (chmod/chown move ctime)."""
    t0 = time.time()
    o = normalize(params)
    return run_with_progress("model_snapshot", o, check_mode,
                             lambda progress: _run(o, check_mode, t0, progress, set_attributes))


def _run(o, check_mode, t0, progress, set_attributes):
    layout = store.Layout(o["dest"])
    progress.set(state="resolving")
    if check_mode:
        return check_mode_result(decide(o, layout), t0)
    if not os.path.isdir(layout.parent):  # the user's directory: a link to it (/home/models -> /data) is fine
        os.makedirs(layout.parent)
    lock = DestLock.acquire(layout.lock, o["lock_timeout"], layout.name, progress)
    try:
        plan = decide(o, layout)  # under the lock: another run may have switched meanwhile
        return apply(plan, progress, t0, set_attributes)
    finally:
        lock.release()


# ---------------------------------------------------------------------------------------------
# decide: what to do, and why (reads the snapshots, the build and the hub; writes nothing)
# ---------------------------------------------------------------------------------------------
def decide(o, layout):
    plan = Plan(o, layout)
    plan.current = store.current(layout)
    if plan.current:
        m = store.read_manifest(layout.snap(plan.current))
        plan.current_readable = m is not None
        plan.before = store.dumps_lines(m)
        if m and m.get("repo") == o["repo"] and m.get("source") == o["source"]:
            plan.manifest = m
        elif m is None:
            plan.notes.append("the current snapshot %s has no valid manifest; it is replaced" % plan.current)
    m = plan.manifest
    same_patterns = bool(m) and m.get("allow_patterns") == o["allow_patterns"] \
        and m.get("ignore_patterns") == o["ignore_patterns"]
    pinned = HEX40.match(o["revision"] or "")
    if m and same_patterns and pinned and m.get("commit") == o["revision"] and not o["force_verify"]:
        return _keep(plan, "commit %s pinned and verified" % o["revision"])
    session = Session(o["token"], o["timeout"], o["validate_certs"])
    try:
        try:
            plan.commit = resolve_commit(o, session)
            if m and same_patterns and plan.commit and m.get("commit") == plan.commit:
                return _keep(plan, "revision %s is still commit %s" % (o["revision"], plan.commit))
            if m and same_patterns and plan.commit and not o["update"]:
                return _moved(plan, plan.commit)
            if m and plan.commit and m.get("commit") and m["commit"] != plan.commit and not o["update"]:
                # new patterns, same commit: the moved branch waits for update: true
                plan.notes.append("the patterns changed; the snapshot is rebuilt at its commit %s (revision "
                                  "%s is now %s: set update: true to fetch it)"
                                  % (m["commit"], o["revision"], plan.commit))
                plan.update_available = True
                plan.commit = m["commit"]
            every = list_files(o, session, plan.commit)
            plan.listed_paths = set(f.path for f in every)
            listed = select(every, o["allow_patterns"], o["ignore_patterns"])
        except DownloadError as e:
            status = e.result.get("status")
            hostile = e.result.get("hostile_listing") or e.result.get("listing_too_large")
            if m and status not in (401, 403, 404) and not hostile:
                plan.notes.append("could not reach the hub (%s); kept the verified snapshot" % e.msg)
                return _keep(plan, "the hub could not be reached")
            raise
    finally:
        session.close()
    if not listed:
        raise DownloadError("no file of %s at %s matches allow_patterns %s / ignore_patterns %s: nothing to "
                            "serve; fix the patterns" % (o["repo"], plan.commit or o["revision"],
                                                         o["allow_patterns"], o["ignore_patterns"]))
    ident = plan.commit or content_id(listed)
    if m and same_patterns and m.get("id") == ident:
        return _keep(plan, "the listing is the current snapshot's")
    if m and same_patterns and not plan.commit and not o["update"]:
        return _moved(plan, ident)
    return _build(plan, ident, listed, plan.commit or None, plan.commit or o["revision"])


def _keep(plan, why):
    """Keep the current snapshot: check each of its files (fast path, else hash)."""
    o, m = plan.o, plan.manifest
    plan.mode = "keep"
    plan.ident, plan.commit = m.get("id"), m.get("commit")
    snap = plan.layout.snap(plan.current)
    store.scan(snap, [f["path"] for f in m["files"]])
    for entry in m["files"]:
        st = store.file_stat(snap, entry["path"])
        if st is None:  # removed by hand: repaired like a damaged file
            plan.checked.append((entry, "missing"))
            continue
        trusted = store.matches(entry, st) and not o["force_verify"]
        plan.checked.append((entry, "keep" if trusted else "hash"))
    plan.notes.insert(0, why)
    return plan


def _moved(plan, new_ident):
    plan.update_available = True
    plan.notes.append("revision %s is now %s, the snapshot is %s; kept it. Set update: true to fetch the new "
                      "one" % (plan.o["revision"], new_ident, plan.manifest.get("id")))
    return _keep(plan, "the hub moved and update is false")


def _sources(plan):
    """{checksum: (snapshot dir, manifest entry)} of the files of the snapshots on the node, current first."""
    layout = plan.layout
    names = []
    if plan.current:
        names.append(plan.current)
    if store.real_dir(layout.store, "the snapshot store") is not None:
        names += sorted(n for n in os.listdir(layout.store) if store.NAME_RE.match(n) and n != plan.current)
    out = {}
    for n in names:
        d = layout.snap(n)
        if store.real_dir(d, "a snapshot") is None:
            continue
        m = store.read_manifest(d)
        if not m or m.get("repo") != plan.o["repo"]:
            continue
        for e in m["files"]:
            for key in (e.get("sha256"), e.get("git_sha1")):
                if key and key not in out:
                    out[key] = (d, e)
    return out


def _build(plan, ident, files, commit, fetch_rev):
    o, layout = plan.o, plan.layout
    plan.mode, plan.ident, plan.commit, plan.fetch_rev, plan.files = "build", ident, commit, fetch_rev, files
    sources = _sources(plan)
    part_dir = layout.partial(ident)
    has_build = store.real_dir(part_dir, "the snapshot being built") is not None
    journal = store.journal_read(layout, ident) if has_build else {}
    if has_build:  # links, FIFOs... refused now; stray regular files are ours, removed by apply()
        store.scan(part_dir, [f.path for f in files], _part_names(files), extra="ignore")
    for f in files:
        t = _target(plan, f)
        st = store.file_stat(part_dir, f.path) if has_build else None
        if st is not None:
            entry = journal.get(f.path)
            if entry and store.matches(entry, st) and _same_sums(entry, f):
                plan.steps.append(Step(f, "built", "fetched and verified by an earlier run (journal)"))
            else:
                plan.steps.append(Step(f, "hash_built", "fetched by an earlier run that did not record it"))
            continue
        src = sources.get(f.sha256 or f.git_sha1)
        if src is not None and src[1].get("size") == f.size and _same_sums(src[1], f):
            step = Step(f, "link", "the same bytes are in snapshot %s" % os.path.basename(src[0]), src)
        else:
            step = Step(f, "download", "not on the node")
            if has_build and f.size:
                step.resumable = resumable_bytes(o, t)
                if step.resumable:
                    step.reason = "resumes the partial download of an earlier run"
        plan.steps.append(step)
    return plan


def _same_sums(entry, f):
    return ((not f.sha256 or entry.get("sha256") == f.sha256)
            and (not f.git_sha1 or entry.get("git_sha1") == f.git_sha1))


def _part_names(files):
    out = set()
    for f in files:
        out.add(f.path + ".part")
        out.add(f.path + ".part.json")
    return out


def _target(plan, f, build_dir=None):
    o = plan.o
    build_dir = build_dir or plan.layout.partial(plan.ident)
    t = Target(f.path, resolve_url(o, f.path, plan.fetch_rev), os.path.join(build_dir, *f.path.split("/")))
    t.size, t.sha256, t.commit = f.size, f.sha256, plan.commit
    t.source = {"endpoint": redact_url(o["endpoint"]), "repo": o["repo"], "filename": f.path,
                "revision": plan.fetch_rev}
    return t


# ---------------------------------------------------------------------------------------------
# apply
# ---------------------------------------------------------------------------------------------
def apply(plan, progress, t0, set_attributes=None):
    if plan.mode == "keep":
        damaged = _verify_current(plan, progress)
        if not damaged:
            changed = _attributes(plan.layout.snap(plan.current), plan.manifest, set_attributes)
            if changed:
                _restamp(plan.layout.snap(plan.current), plan.manifest)
            progress.set(state="done")
            return _result(plan, t0, changed=changed)
        _repair_plan(plan, damaged)
    return _apply_build(plan, progress, t0, set_attributes)


def hash_pair(path, progress=None):
    """(sha256, git blob sha1) of a regular file, read once (never through a link, never a FIFO)."""
    fd = open_regular(path, os.O_RDONLY)
    size = os.fstat(fd).st_size
    h = hashlib.sha256()
    g = hashlib.sha1(b"blob %d\0" % size)
    try:
        digest_fd(fd, (h, g), progress, 4 * MIB)
    except OSError as e:
        raise DownloadError("cannot read %s: %s" % (path, e)) from None
    return h.hexdigest(), g.hexdigest()


def _good(entry_or_file, sha, sha1, size):
    get = entry_or_file.get if isinstance(entry_or_file, dict) else (lambda k: getattr(entry_or_file, k))
    want_sha, want_sha1 = get("sha256"), get("git_sha1")
    return (size == get("size") and (not want_sha or want_sha == sha) and (not want_sha1 or want_sha1 == sha1)
            and bool(want_sha or want_sha1))


def _verify_current(plan, progress):
    """Hash the current snapshot's files the fast path does not vouch for; return the damaged entries."""
    snap = plan.layout.snap(plan.current)
    progress.total = sum(e["size"] for e, _a in plan.checked)
    damaged, rehashed = [], False
    for entry, action in plan.checked:
        if action == "keep":
            progress.add(entry["size"])
            continue
        if action == "missing":
            damaged.append((entry, "nothing (the file is missing)"))
            continue
        progress.set(state="hashing", file=entry["path"])
        path = os.path.join(snap, *entry["path"].split("/"))
        st = store.file_stat(snap, entry["path"])
        sha, sha1 = hash_pair(path, progress)
        if _good(entry, sha, sha1, st.st_size):
            entry.update(file_identity.identity(os.lstat(path)))
            rehashed = True
        else:
            damaged.append((entry, sha))
    plan.hashed = rehashed or any(a == "hash" for _e, a in plan.checked)
    if rehashed and not damaged:
        _restamp(snap, plan.manifest, stat_again=False)
    return damaged


def _restamp(snap, manifest, stat_again=True):
    """Write the manifest again with the files' stat identity as it is now (the caller verified them in this
    run: chmod/chown or an unlink of another name of the same inode moved ctime)."""
    if stat_again:
        for entry in manifest["files"]:
            st = store.file_stat(snap, entry["path"])
            if st is not None:
                entry.update(file_identity.identity(st))
    store.write_manifest(snap, manifest)


def _repair_plan(plan, damaged):
    """The current snapshot has damaged files: build the same commit again (good files linked, the damaged
    ones fetched) and switch to it."""
    m = plan.manifest
    bad = set(e["path"] for e, _s in damaged)
    for entry, got in damaged:
        plan.notes.append("%s in the current snapshot does not match its manifest (expected sha256 %s, got "
                          "%s): fetched again into a repaired snapshot"
                          % (entry["path"], entry.get("sha256"), got))
    # the manifest's sha256 was computed from verified bytes: the repair checks every file against it
    files = [SnapFile(e["path"], e["size"], e.get("sha256"), e.get("git_sha1"), e.get("lfs", False))
             for e in m["files"]]
    plan.repair = bad
    _build(plan, m["id"], files, m.get("commit"), m.get("fetch_revision") or m.get("commit"))
    for step in plan.steps:
        if step.f.path in bad and step.action == "link" and step.source[0] == plan.layout.snap(plan.current):
            step.action, step.reason, step.source = "download", "damaged in the current snapshot", None


def _apply_build(plan, progress, t0, set_attributes):
    o, layout, ident = plan.o, plan.layout, plan.ident
    store.ensure_dir(layout.store, "the snapshot store")
    build = layout.partial(ident)
    store.ensure_dir(build, "the snapshot being built")
    journal = store.journal_read(layout, ident)
    store.scan(build, [f.path for f in plan.files], _part_names(plan.files), extra="remove")
    for step in plan.steps:  # a partial download of a file that is not fetched now is not needed
        if step.action != "download":
            for p in (step.f.path + ".part", step.f.path + ".part.json"):
                if check_own_path(os.path.join(build, *p.split("/"))) is not None:
                    os.unlink(os.path.join(build, *p.split("/")))
    jlock = threading.Lock()
    progress.total = sum(s.f.size for s in plan.steps)
    stats = {"downloaded": 0, "resumed": 0, "linked": 0, "linked_bytes": 0, "hashed": 0, "fetched": []}
    todo = []
    for step in plan.steps:
        f = step.f
        if step.action == "built":
            stats["resumed"] += f.size
            progress.add(f.size)
        elif step.action == "hash_built":
            progress.set(state="hashing", file=f.path)
            path = os.path.join(build, *f.path.split("/"))
            st = store.file_stat(build, f.path)
            sha, sha1 = hash_pair(path, progress)
            stats["hashed"] += 1
            if _good(f, sha, sha1, st.st_size):
                journal[f.path] = dict(file_identity.identity(os.lstat(path)), sha256=sha,
                                       git_sha1=f.git_sha1)
                stats["resumed"] += f.size
            else:
                q = store.quarantine_into(layout, path, f.path)
                plan.notes.append("%s in the build did not match the listing (got sha256 %s); moved to %s "
                                  "and fetched again" % (f.path, sha, q))
                progress.add(-f.size)
                todo.append(step)
        elif step.action == "link":
            if _link(plan, step, build, journal, progress):
                stats["linked"] += 1
                stats["linked_bytes"] += f.size
            else:
                todo.append(step)
        else:
            todo.append(step)
    store.journal_write(layout, ident, journal)
    if todo:
        free_space_check(layout.store, [(s.f.size, part_path(_target(plan, s.f))) for s in todo],
                         o["free_space_margin"])
        fetcher = Fetcher(plan, todo, journal, jlock, progress)
        try:
            fetcher.run()
        finally:
            with jlock:
                store.journal_write(layout, ident, journal)
        stats["downloaded"] = fetcher.new_bytes
        stats["resumed"] += fetcher.resumed
        stats["fetched"] = sorted(fetcher.done)
    progress.set(state="verifying")
    store.scan(build, [f.path for f in plan.files])
    check_shard_indexes(plan, build)
    keep = set([os.path.basename(build), os.path.basename(layout.journal(ident))])
    if plan.current:
        keep.add(plan.current)
    removed = store.collect(layout, keep)
    manifest = _manifest(plan, build, journal)
    _attributes(build, manifest, set_attributes)
    for entry in manifest["files"]:
        entry.update(file_identity.identity(store.file_stat(build, entry["path"])))
    store.write_manifest(build, manifest)
    store.fsync_tree(build)
    name = store.final_name(layout, ident)
    os.rename(build, layout.snap(name))
    fsync_dir(layout.store)
    store.switch(layout, name)
    try:
        os.unlink(layout.journal(ident))
    except OSError:
        pass
    previous = plan.current
    if previous and (plan.repair or not plan.current_readable):
        _retire(plan, previous)
        _restamp(layout.snap(name), manifest)
    plan.current, plan.manifest = name, manifest
    progress.set(state="done")
    if removed:
        plan.notes.append("removed older snapshots: %s" % ", ".join(removed))
    return _result(plan, t0, changed=True, stats=stats, previous=previous)


def _retire(plan, name):
    """Take a replaced snapshot that is damaged (or unreadable) off the node: its damaged files to corrupt/,
    the rest removed."""
    layout = plan.layout
    d = layout.snap(name)
    for rel in sorted(plan.repair or ()):
        path = os.path.join(d, *rel.split("/"))
        if os.path.lexists(path):
            q = store.quarantine_into(layout, path, rel)
            plan.notes.append("the damaged %s was moved to %s" % (rel, q))
    store.remove_tree(d)


def _link(plan, step, build, journal, progress):
    """Hard-link a verified file of a snapshot on the node into the build; False when it must be fetched
    (the source no longer verifies, or the filesystem cannot link)."""
    f = step.f
    src_dir, entry = step.source
    src = os.path.join(src_dir, *entry["path"].split("/"))
    st = store.file_stat(src_dir, entry["path"])
    if st is None:
        return False
    if not store.matches(entry, st) or plan.o["force_verify"]:
        sha, sha1 = hash_pair(src)
        if not _good(f, sha, sha1, st.st_size):
            plan.notes.append("%s of snapshot %s no longer matches its manifest: fetched instead"
                              % (entry["path"], os.path.basename(src_dir)))
            return False
        plan.hashed = True
    dst = os.path.join(build, *f.path.split("/"))
    store.make_dirs(build, f.path)
    try:
        os.link(src, dst, follow_symlinks=False)  # a link swapped in meanwhile is linked, never followed
    except OSError as e:
        if e.errno in LINK_FALLBACK:
            plan.notes.append("cannot hard-link %s (%s): fetched instead" % (f.path, os.strerror(e.errno)))
            return False
        raise DownloadError("cannot link %s to %s: %s" % (src, dst, e)) from None
    lst = os.lstat(dst)
    if (lst.st_dev, lst.st_ino) != (st.st_dev, st.st_ino):
        raise DownloadError("%s is not the file linked from %s (replaced meanwhile); rerun" % (dst, src))
    journal[f.path] = dict(file_identity.identity(lst), sha256=entry.get("sha256"), git_sha1=f.git_sha1)
    progress.add(f.size)
    return True


def check_shard_indexes(plan, build):
    """Refuse to publish a build whose safetensors index (``model.safetensors.index.json``, any
    ``*.safetensors.index.json``) names a shard the build does not hold: vLLM loads every shard the index
    names and fails at start.  The message names each missing shard and why it is missing (the pattern
    that excluded it, or not in the repository); nothing is switched, the build stays for the next run."""
    have = set(f.path for f in plan.files)
    for f in sorted(plan.files, key=lambda x: x.path):
        if not f.path.endswith(INDEX_SUFFIX):
            continue
        missing = sorted(_index_shards(os.path.join(build, *f.path.split("/")), f.path) - have)
        if missing:
            o = plan.o
            raise DownloadError(
                "refused to publish the snapshot of %s at %s: %s names %d shard(s) that the snapshot would "
                "not hold: %s. vLLM loads every shard the index names and would fail to start. Fix "
                "allow_patterns / ignore_patterns so that they select every shard; the current snapshot "
                "keeps serving and the files fetched stay in the build for the next run"
                % (o["repo"], plan.commit or o["revision"], f.path, len(missing),
                   "; ".join("%s (%s)" % (p, _why_missing(plan, p)) for p in missing)),
                missing_shards=missing, index=f.path)


def _why_missing(plan, path):
    if plan.listed_paths is not None and path not in plan.listed_paths:
        return "the repository has no such file at %s" % (plan.commit or plan.o["revision"])
    return (excluded_by(path, plan.o["allow_patterns"], plan.o["ignore_patterns"])
            or "not in the snapshot's listing")


def _index_shards(path, rel):
    """The repo paths of the shards a safetensors index names (its ``weight_map`` values, relative to the
    index's folder); DownloadError when it is not such an index."""
    fd = open_regular(path, os.O_RDONLY)
    try:
        raw = os.read(fd, INDEX_MAX_BYTES + 1)
    finally:
        os.close(fd)
    try:
        doc = json.loads(raw.decode("utf-8")) if len(raw) <= INDEX_MAX_BYTES else None
    except (ValueError, RecursionError):
        doc = None
    wmap = doc.get("weight_map") if isinstance(doc, dict) else None
    folder = posixpath.dirname(rel)
    out = set()
    for name in (wmap.values() if isinstance(wmap, dict) else [None]):
        shard = posixpath.normpath(posixpath.join(folder, name)) if isinstance(name, str) and name else ""
        if not shard or name.startswith("/") or shard == ".." or shard.startswith("../"):
            raise DownloadError("refused to publish the snapshot: %s is not a safetensors index (a JSON "
                                "object whose weight_map maps tensor names to shard files in the repository, "
                                "at most %d bytes), so vLLM could not load the model; leave it out with "
                                "ignore_patterns or fix the repository" % (rel, INDEX_MAX_BYTES), index=rel)
        out.add(shard)
    return out


def _manifest(plan, build, journal):
    o = plan.o
    files = []
    for f in sorted(plan.files, key=lambda x: x.path):
        j = journal.get(f.path) or {}
        files.append({"path": f.path, "size": f.size, "sha256": j.get("sha256"), "git_sha1": f.git_sha1,
                      "lfs": f.lfs})
    return {"version": store.MANIFEST_VERSION, "repo": o["repo"], "source": o["source"],
            "endpoint": redact_url(o["endpoint"]), "revision": o["revision"], "commit": plan.commit,
            "id": plan.ident, "fetch_revision": plan.fetch_rev, "allow_patterns": o["allow_patterns"],
            "ignore_patterns": o["ignore_patterns"], "files": files,
            "total_size": sum(f["size"] for f in files), "content_sha256": store.content_sha256(files),
            "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def _attributes(snap, manifest, set_attributes):
    """Owner/group/mode/SELinux on every folder and file of a snapshot; True when anything changed."""
    if set_attributes is None:
        return False
    changed = False
    dirs = set()
    for entry in manifest["files"]:
        segs = entry["path"].split("/")
        for i in range(1, len(segs)):
            dirs.add("/".join(segs[:i]))
    changed = set_attributes(snap, True) or changed
    for rel in sorted(dirs):
        changed = set_attributes(os.path.join(snap, *rel.split("/")), True) or changed
    for entry in manifest["files"]:
        changed = set_attributes(os.path.join(snap, *entry["path"].split("/")), False) or changed
    return changed


# ---------------------------------------------------------------------------------------------
# fetching files in parallel within one connection budget
# ---------------------------------------------------------------------------------------------
class Fetcher:
    """Fetch the steps' files into the build: ``connections`` tokens shared by all files; a file of at least
    parallel_min_size takes all of them (its ranges run in parallel), a smaller one takes one. Files are
    admitted strictly in order (a large file waiting for every token is never overtaken by small ones)."""

    def __init__(self, plan, steps, journal, jlock, progress):
        self.plan = plan
        self.o = plan.o
        self.steps = list(steps)
        self.journal = journal
        self.jlock = jlock
        self.progress = progress
        self.budget = max(1, int(self.o["connections"]))
        self.free = self.budget
        self.cond = threading.Condition()
        self.next_ticket = 0
        self.serving = 0
        self.error = None
        self.active = set()
        self.new_bytes = 0
        self.resumed = 0
        self.done = []
        self._journal_at = 0.0

    def run(self):
        nthreads = max(1, min(self.budget, len(self.steps)))
        threads = [threading.Thread(target=self._worker, name="snap-%d" % i) for i in range(nthreads)]
        for th in threads:
            th.daemon = True
            th.start()
        for th in threads:
            while th.is_alive():
                th.join(1.0)
                self.progress.maybe_write()
        if self.error is not None:
            raise self.error

    def _need(self, f):
        return self.budget if f.size >= self.o["parallel_min_size"] else 1

    def _worker(self):
        while True:
            with self.cond:
                if self.error is not None or self.next_ticket >= len(self.steps):
                    return
                ticket = self.next_ticket
                self.next_ticket += 1
                step = self.steps[ticket]
                need = self._need(step.f)
                while self.error is None and (self.serving != ticket or self.free < need):
                    self.cond.wait(0.5)
                if self.error is not None:
                    self.serving += 1
                    self.cond.notify_all()
                    return
                self.free -= need
                self.serving += 1
                self.cond.notify_all()
            try:
                self._one(step.f, need)
            except BaseException as e:
                with self.cond:
                    if self.error is None:
                        self.error = e
                    for dl in list(self.active):
                        dl.stop = True
                    self.cond.notify_all()
            finally:
                with self.cond:
                    self.free += need
                    self.cond.notify_all()

    def _one(self, f, conns):
        plan, layout = self.plan, self.plan.layout
        t = _target(plan, f)
        store.make_dirs(layout.partial(plan.ident), f.path)
        o = dict(self.o, connections=conns)
        dl = FileDownload(o, t, self.progress)
        with self.cond:
            if self.error is not None:
                return
            self.active.add(dl)
        try:
            part = part_path(t)
            resumed = 0
            if f.size:
                self.progress.set(state="downloading", file=f.path)
                resumed = dl.load_state()
            got, new = dl.run()
        finally:
            with self.cond:
                self.active.discard(dl)
        pst = check_own_path(part, single_link=True)
        if pst is None or (pst.st_dev, pst.st_ino) != dl.part_id:
            raise DownloadError("%s was replaced while this run wrote it; remove it and rerun" % part)
        sha1 = hash_pair(part)[1] if f.git_sha1 else None
        if pst.st_size != f.size or (f.sha256 and got != f.sha256) or (f.git_sha1 and sha1 != f.git_sha1):
            q = store.quarantine_into(layout, part, f.path)
            drop_state(t)
            want = ("sha256 %s" % f.sha256) if f.sha256 else ("git blob id %s" % f.git_sha1)
            have = ("sha256 %s" % got) if f.sha256 else ("git blob id %s" % sha1)
            raise DownloadError(
                "checksum mismatch for %s of %s at %s: expected %s (%d bytes), got %s (%d bytes); the bytes "
                "were moved to %s, the snapshot was not switched (%s still serves the previous one). Rerun "
                "to fetch it again; if it repeats, the hub or a proxy corrupts data"
                % (f.path, self.o["repo"], plan.ident, want, f.size, have, pst.st_size, q, layout.dest),
                quarantined=q, expected=want, got=have)
        final = t.final_path
        if check_own_path(final) is not None:
            os.unlink(final)  # an unrecorded copy of an earlier run would have been hashed; this one is fresh
        os.rename(part, final)
        fsync_dir(os.path.dirname(final))
        if os.path.lexists(state_path(t)):
            drop_state(t)
        st = os.lstat(final)
        if (st.st_dev, st.st_ino) != dl.part_id or not stat.S_ISREG(st.st_mode):
            raise DownloadError("%s is not the file this run downloaded (replaced while renaming); rerun"
                                % final)
        with self.jlock:
            self.journal[f.path] = dict(file_identity.identity(st), sha256=got, git_sha1=f.git_sha1)
            now = time.time()
            if now - self._journal_at >= JOURNAL_EVERY_S:
                self._journal_at = now
                store.journal_write(layout, plan.ident, self.journal)
        with self.cond:
            self.new_bytes += new
            self.resumed += resumed
            self.done.append(f.path)


# ---------------------------------------------------------------------------------------------
# results
# ---------------------------------------------------------------------------------------------
def _result(plan, t0, changed, stats=None, previous=None):
    o, layout, m = plan.o, plan.layout, plan.manifest
    stats = stats or {}
    elapsed = round(time.time() - t0, 3)
    files = m["files"]
    if plan.mode == "build":
        verified = "download" if stats.get("downloaded") or stats.get("fetched") else (
            "hashed" if stats.get("hashed") or getattr(plan, "hashed", False) else "manifest")
        msg = ("snapshot %s of %s: %d files, %s (%s downloaded, %s resumed, %d files / %s reused from the "
               "node); verified and switched %s to it in %.1fs"
               % (plan.ident, o["repo"], len(files), human(m["total_size"]),
                  human(stats.get("downloaded", 0)), human(stats.get("resumed", 0)), stats.get("linked", 0),
                  human(stats.get("linked_bytes", 0)), layout.dest, elapsed))
    else:
        verified = "hashed" if getattr(plan, "hashed", False) else "manifest"
        msg = "snapshot %s of %s already present and verified (%s)" % (plan.ident, o["repo"], verified)
    if plan.notes:
        msg += "; " + "; ".join(plan.notes)
    return {
        "changed": changed, "path": layout.dest, "snapshot_dir": layout.snap(plan.current),
        "manifest": store.manifest_path(layout.snap(plan.current)), "repo": o["repo"], "source": o["source"],
        "revision": o["revision"], "commit": m.get("commit"), "id": m.get("id"),
        "sha256": m.get("content_sha256") or store.content_sha256(files), "total_size": m.get("total_size"),
        "file_count": len(files), "downloaded_bytes": stats.get("downloaded", 0),
        "resumed_from": stats.get("resumed", 0), "reused_bytes": stats.get("linked_bytes", 0),
        "fetched": stats.get("fetched", []), "verified": verified, "update_available": plan.update_available,
        "previous": previous if plan.mode == "build" else None, "elapsed_s": elapsed,
        "diff": {"before": plan.before, "after": store.dumps_lines(m),
                 "before_header": "%s (before)" % layout.dest, "after_header": "%s (after)" % layout.dest},
        "msg": scrub(msg, o.get("token")),
    }


def check_mode_result(plan, t0):
    """What a real run would do, as a result: nothing is written."""
    o, layout = plan.o, plan.layout
    before = store.dumps_lines(plan.manifest)
    lines = []
    if plan.mode == "keep":
        todo = [e for e, a in plan.checked if a == "hash"]
        lines.append(plan.notes[0] if plan.notes else "keep")
        if todo:
            lines.append("would hash %d file(s) the manifest does not vouch for (%s)"
                         % (len(todo), ", ".join(e["path"] for e in todo[:5])))
        missing = [e["path"] for e, a in plan.checked if a == "missing"]
        if missing:
            lines.append("would repair the snapshot: %d file(s) missing (%s)"
                         % (len(missing), ", ".join(missing[:5])))
        after = before
        files = plan.manifest["files"]
        changed = bool(missing)
        total = plan.manifest.get("total_size")
    else:
        fetch = 0
        for s in plan.steps:
            if s.action == "download":
                fetch += s.f.size - s.resumable
        counts = {}
        for s in plan.steps:
            counts[s.action] = counts.get(s.action, 0) + 1
        lines.append("would build snapshot %s of %s (%d files, %s): %s; would download %s and switch %s to it"
                     % (plan.ident, o["repo"], len(plan.files), human(sum(f.size for f in plan.files)),
                        ", ".join("%d %s" % (n, a) for a, n in sorted(counts.items())), human(fetch),
                        layout.dest))
        files = [dict(f.as_dict()) for f in plan.files]
        after = store.dumps_lines({"id": plan.ident, "repo": o["repo"], "files": files})
        changed = True
        total = sum(f.size for f in plan.files)
        if fetch and os.path.isdir(layout.parent):
            try:
                free_space_check(layout.parent, [(fetch, "")], o["free_space_margin"])
            except DownloadError as e:
                lines.append("would fail: " + e.msg)
    msg = "check mode: " + "; ".join(lines + plan.notes[1 if plan.mode == "keep" else 0:])
    return {
        "changed": changed, "path": layout.dest,
        "snapshot_dir": layout.snap(plan.current) if plan.current else None,
        "manifest": store.manifest_path(layout.snap(plan.current)) if plan.current else None,
        "repo": o["repo"], "source": o["source"], "revision": o["revision"], "commit": plan.commit,
        "id": plan.ident, "sha256": store.content_sha256(files) if plan.mode == "keep" else None,
        "total_size": total, "file_count": len(files), "downloaded_bytes": 0,
        "resumed_from": sum(s.resumable for s in plan.steps), "reused_bytes": 0, "fetched": [],
        "verified": ("manifest" if plan.mode == "keep" and all(a == "keep" for _e, a in plan.checked)
                     else None),
        "update_available": plan.update_available, "previous": None, "elapsed_s": round(time.time() - t0, 3),
        "actions": [{"path": s.f.path, "action": s.action, "reason": s.reason} for s in plan.steps],
        "diff": {"before": before, "after": after, "before_header": "%s (current)" % layout.dest,
                 "after_header": "%s (after)" % layout.dest},
        "msg": scrub(msg, o.get("token")),
    }
