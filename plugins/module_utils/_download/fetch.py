# -*- coding: utf-8 -*-
# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
# PRIVATE to llmops.serving: it can change at any time; do not import it from other collections.
"""Verified, resumable, parallel model downloads (logic of ``llmops.serving.model_download``): one run
is ``decide()`` (what to do per file, and why) then ``apply()`` (do it); check mode returns the decision.

Plain Python 3.6, standard library only; importable and testable without Ansible.

Where each concern lives
------------------------
* ``download_options.py``: the options, once (argument spec and defaults), and their checks.
* ``download_source.py``: the files of a run (split GGUF sets) and their metadata (one HEAD each).
* ``download_http.py``: connections, redirects, proxies, the token's origin, status codes, retries.
* ``download_parts.py``: where a download resumes: ``<file>.part`` and the ranges in ``<file>.part.json``.
* ``download_ranges.py``: byte interval sets.  ``download_transfer.py``: parallel ranges, streaming sha256.
* ``model_sidecar.py``: the sidecar record of a verified file (shared with gguf_info, which only reads it).
* ``safe_files.py``: no links, no FIFOs, atomic JSON, the per-file lock.  ``download_progress.py``: progress.
* ``download_messages.py``: errors and messages, scrubbed of the token.

How a file gets to its final path
---------------------------------
* Metadata first: a HEAD on the hub's resolve URL gives the sha256 (``X-Linked-Etag``), the size
  (``X-Linked-Size``) and the commit the revision resolved to (``X-Repo-Commit``).  Every byte is then
  fetched from ``/resolve/<commit>/`` so a moving branch cannot change the model mid-way.
* Bytes go to ``<file>.part`` (preallocated), progress to ``<file>.part.json`` (the byte ranges already
  written, the CDN's ETag for If-Range).  An interrupted download (drop, kill, disk full) resumes by
  asking only for the missing ranges.
* Parallel ranges: the file is cut into chunks; ``connections`` threads fetch chunks with ``Range`` and
  ``os.pwrite`` them into the ``.part``; the sha256 is computed while data arrives, every byte hashed
  exactly once (download_transfer.py).
* A server that ignores Range (200) or refuses it (416) makes the download restart from zero on one
  connection, honestly (``downloaded_bytes`` counts every byte received).
* Verification: size and sha256 must match, else the bytes move to ``<file>.corrupt-<UTC time>`` (one
  quarantined copy per file: a new one replaces the older) and the run fails loudly (expected vs got,
  where each file went).  Only then: fsync, atomic rename to the final path, fsync of the directory, and
  a sidecar record ``.<file>.llmops.json`` (size, mtime_ns, inode, sha256, commit, source) that lets the
  next run skip hashing when size/mtime/inode still match.
* Every part of a Hugging Face split set comes from one commit, and the result's ``commit`` is it: the
  commit the first part's HEAD gave (a branch moving between two HEADs cannot mix commits) or, while
  ``update`` is false and parts are verified here already, their commit (the rest of a half-fetched set is
  fetched at the kept parts' commit, never at the new one).  With ``update: true`` the whole set moves to
  the new commit; when a part cannot (its new claim vouches for nothing) every part stays at its commit.
  A plan that would still mix commits fails before anything is written.  ModelScope gives every part's
  sha256 from one listing.
* The ``.part.json`` ranges are written about once a second, each time after an ``fdatasync`` of the
  ``.part``: the ranges it claims are on disk even after a power loss.  Whatever slips through is
  caught by the final sha256 check (quarantine, then a clean re-download).

Hostile surroundings (the module runs as root in a directory other users may write to)
------------------------------------------------------------------------------------
* The token goes only to the exact origin (scheme, host and port) of the endpoint (of ``url`` for a
  plain URL), on every hop of every phase: never to a CDN, another port of the same host, or plain
  http after an https start.  A token with whitespace or control characters (a vault file's trailing
  newline) is refused before any request, without echoing it; every message and result is scrubbed of
  the token in raw, escaped (repr/JSON) and URL-encoded form.
* Paths the module owns: the final path, ``<file>.part``, ``<file>.part.json``, the sidecar
  ``.<file>.llmops.json`` and the lock ``.<file>.llmops.lock``.  Anything there that is not a regular
  file (a symlink, FIFO, socket, device, directory; for files written in place also a hard link) is
  refused with a message naming the path ("remove it"); files are opened with ``O_NOFOLLOW`` and
  ``O_NONBLOCK`` and checked with ``fstat`` before use, so nothing follows a planted link or blocks
  on a FIFO.  JSON records are written to ``tempfile.mkstemp`` names in the same directory, then
  renamed.
* One run per destination file: ``fcntl.flock`` on ``.<file>.llmops.lock`` (holder's pid inside).
  A second run waits up to ``lock_timeout`` seconds, then finds the finished file through the sidecar.
* Deadlines and read limits (download_http.py, download_source.py): every metadata request (a HEAD, the
  ModelScope listing) ends within 4 x ``timeout`` in all, so a server dripping one byte per second cannot
  hold the lock; the listing is at most 16 MiB and 1,000,000 JSON values, parsed keeping only the entries
  of the files asked for; error and redirect bodies are read up to 64 KiB.
* Content that is not what it claims fails: an HTML page (a mirror's login or error page) for a
  non-HTML file, a body whose length differs from the expected size, and, for a plain URL without a
  validator (no strong ETag, no Last-Modified), bytes of two versions (no resume, no ranges without a
  sha256; it restarts from zero).

Never lose a verified model
---------------------------
* The final path keeps its file until verified bytes replace it (a rename over it).  A file there that
  does not match the source's sha256 stays while the download runs; once the replacement is verified it is
  linked to the quarantine slot first, so the final path is never empty.  A failed download leaves the
  final path as it was, and the message says what it holds.
* A matching sha256 wins over a size claim (kept, and the size claim named in the message).
* A claim that cannot be verified never replaces a file (``_unverifiable``): size 0 and no sha256 (a
  mirror's empty 200, a ModelScope entry of size 0), no size and no sha256, or a plain URL's new version
  without sha256, ETag or Last-Modified.  A verified file is kept with a warning; a file placed by hand that
  nothing can check (no sha256 from the source, another size) is left untouched and the run fails.
* A record the hub contradicts (another sha256, even for the very commit the record names) is not
  trusted: whoever can write the models directory may have written the file and the record.  The file
  is hashed and judged by that alone: kept when it has the hub's sha256, else downloaded again; the new
  bytes replace it only when they have the hub's sha256 (a hub whose bytes contradict its own claim
  fails verification and leaves the file in place).
* A size the source states above 2^63 - 1, or a size the filesystem cannot hold, fails with a message and
  leaves no empty ``.part``; a metadata size that the server's Content-Range contradicts fails at once
  (retrying gets the same answer).

What the sidecar fast path can and cannot detect
-------------------------------------------------
The record identifies the content by size, mtime_ns, inode and ctime_ns.  Writing the file, ``touch``,
``utime`` (a restored mtime), chmod/chown or replacing it all change ctime, which a user cannot set:
such a file is hashed again.  When the hub's HEAD gives a sha256, a record that disagrees with it is
not trusted either (the file is hashed).  The record (and a partial download's state) is trusted only
when the run's own user (root) or root wrote it: owned by one of them, one link, writable by nobody else
(safe_files.trusted_owner).  The service user can write the directory but cannot create a root-owned
file, so a record it forges, with the hub's sha256 copied in, is not trusted: the file is hashed.  It
cannot detect: silent corruption below the filesystem (bit rot), and changes by root or by someone who
can reset the clock or write the block device; nor a forged record when the module itself runs as the
user who forged it.  ``force_verify`` re-hashes; passing ``sha256`` pins the content.
"""
from __future__ import absolute_import, division, print_function

import errno
import os
import stat
import time

from ansible_collections.llmops.serving.plugins.module_utils._download.http import Session
from ansible_collections.llmops.serving.plugins.module_utils._download.messages import (
    DownloadError,
    human,
    scrub,
)
from ansible_collections.llmops.serving.plugins.module_utils._download.options import normalize
from ansible_collections.llmops.serving.plugins.module_utils._download.parts import (
    DISK_FULL,
    drop_state,
    free_space_check,
    no_room,
    owned_paths,
    part_path,
    resumable_bytes,
    state_path,
)
from ansible_collections.llmops.serving.plugins.module_utils._download.progress import run_with_progress
from ansible_collections.llmops.serving.plugins.module_utils._download.sidecar import (
    read_sidecar_record,
    sidecar_matches_file,
    sidecar_path,
    write_sidecar_record,
)
from ansible_collections.llmops.serving.plugins.module_utils._download.source import (
    HEX40,
    build_targets,
    fetch_metadata,
    is_modelscope,
    resolve_url,
)
from ansible_collections.llmops.serving.plugins.module_utils._download.transfer import FileDownload
from ansible_collections.llmops.serving.plugins.module_utils._files.safe import (
    DestLock,
    check_own_path,
    fsync_dir,
    hash_file,
    lock_path,
    quarantine,
)

__metaclass__ = type

# What each action means, as check mode reports it.
WOULD = {
    "keep": "verified (sidecar), nothing to do",
    "recommit": "same bytes at new commit, would update the record",
    "force_verify": "would re-hash",
    "hash_existing": "would hash the existing file",
    "download": "would download %s",
}


class Step:
    """What decide() chose for one target: ``action`` (a key of WOULD), ``reason`` (why, in words), the
    trusted sidecar ``record`` (or None) and, for a download, the ``resumable`` bytes already in its part."""

    def __init__(self, target, action, reason, record=None):
        self.target = target
        self.action = action
        self.reason = reason
        self.record = record
        self.resumable = 0


class Plan:
    """decide()'s answer for one run: a Step per target, notes for the message, update_available."""

    def __init__(self, o, targets):
        self.o = o
        self.targets = targets
        self.dest = os.path.abspath(o["dest"])
        self.steps = []
        self.notes = []
        self.warnings = []
        self.update_available = False
        # a Hugging Face split set comes from one commit (plan.set_commit, once resolved)
        self.one_commit = bool(o["repo"]) and not is_modelscope(o) and len(targets) > 1
        self.set_commit = None


def run(params, check_mode=False, set_attributes=None):
    """Do it.  Return the result dict; raise DownloadError on failure (message says what to do).

    ``set_attributes(path) -> bool``: applies owner/group/mode (the module's file arguments) to a final
    file while the run still holds its lock, returns whether it changed anything; the sidecar record is
    then re-stamped (chmod/chown change ctime)."""
    t0 = time.time()
    o = normalize(params)
    return run_with_progress("model_download", o, check_mode,
                             lambda progress: _run(o, check_mode, t0, progress, set_attributes))


def _run(o, check_mode, t0, progress, set_attributes=None):
    targets = build_targets(o)
    dest = os.path.abspath(o["dest"])
    progress.set(state="resolving")
    for t in targets:
        for path, single in owned_paths(t):
            check_own_path(path, single)
    if check_mode:
        return check_mode_result(decide(o, targets), t0)
    locks = []
    try:
        if not os.path.isdir(dest):
            os.makedirs(dest)
        deadline = time.monotonic() + o["lock_timeout"]
        for t in targets:
            try:
                locks.append(DestLock.acquire(lock_path(t.final_path), o["lock_timeout"], t.name,
                                              progress, deadline))
            except DownloadError as e:
                # a read-only dest (verified files on a read-only mount): no run can write there either
                if e.result.get("errno") not in (errno.EROFS, errno.EACCES, errno.EPERM):
                    raise
        progress.set(state="resolving")
        for t in targets:  # again: another run may have worked here while we waited
            for path, single in owned_paths(t)[:4]:
                check_own_path(path, single)
        return apply(decide(o, targets), progress, t0, set_attributes)
    finally:
        for lk in reversed(locks):
            lk.release()


# ---------------------------------------------------------------------------------------------
# decide: what to do per file, and why (reads the records, the parts and the source; writes nothing)
# ---------------------------------------------------------------------------------------------
def decide(o, targets):
    records = dict((t.name, _trusted_record(t, o)) for t in targets)
    plan = _plan(o, targets, records)
    mixed = _commits(plan)
    if len(mixed) > 1 and o["update"] and plan.set_commit:
        # update: true, but a part cannot move to the new commit verifiably and is kept: the whole set stays
        # at that part's commit (never a set of two commits)
        new = plan.set_commit
        stay = [s for s in plan.steps if s.target.commit != new]
        kept = stay[0].target.commit
        plan = _plan(o, targets, records, set_commit=kept)
        text = ("the set cannot move to commit %s verifiably (%s); every part stays at commit %s"
                % (new, "; ".join("%s: %s" % (s.target.name, s.reason) for s in stay), kept))
        plan.notes.append(text)
        plan.warnings.append(text)
        plan.update_available = True
        mixed = _commits(plan)
    if len(mixed) > 1:
        raise DownloadError(
            "the parts of %s would come from %d commits (%s): a split set must come from one. Nothing was "
            "changed. Rerun when the hub answers for every part, or move the parts away to fetch the set "
            "again"
            % (o["filename"], len(mixed), ", ".join("%s: %s" % (s.target.name, s.target.commit)
                                                    for s in plan.steps)))
    return plan


def _commits(plan):
    """The commits the parts of a Hugging Face split set would come from (one, or none when the hub names
    none), first seen first."""
    out = []
    for step in plan.steps:
        c = step.target.commit
        if plan.one_commit and c and c not in out:
            out.append(c)
    return out


def _plan(o, targets, records, set_commit=None):
    plan = Plan(o, targets)
    for t in targets:
        t.size = t.sha256 = t.commit = t.etag = None  # a second try starts afresh
    _resolve_sources(plan, records, set_commit)
    for t in targets:
        step = _choose(plan, t, records[t.name])
        if t.size is None and step.action == "download":
            raise DownloadError("%s: the source does not tell the file size (no Content-Length); pass size "
                                "(and sha256)" % t.name)
        if step.action == "download":
            step.resumable = resumable_bytes(o, t)
        plan.steps.append(step)
    for t in targets:
        if o["repo"] and not t.sha256:
            plan.notes.append("%s: the hub sent no sha256 (X-Linked-Etag); recorded the sha256 computed "
                              "while downloading (pass sha256 to check it)" % t.name)
    return plan


def _trusted_record(t, o):
    """The sidecar record of t when it still describes the file there, the same source and any pinned
    sha256/size; else None."""
    rec = read_sidecar_record(t.final_path)
    if not (rec and sidecar_matches_file(rec, t.final_path) and _same_source(rec, t, o)):
        return None
    if o["sha256"] and rec["sha256"] != o["sha256"]:
        return None
    if o["size"] and rec["size"] != int(o["size"]):
        return None
    return rec


def _same_source(rec, t, o):
    src = rec.get("source") or {}
    if o["url"]:
        return src.get("url") == t.source.get("url")
    return src.get("repo") == o["repo"] and src.get("filename") == t.name


def _resolve_sources(plan, records, set_commit=None):
    """Fill every target's size/sha256/commit from the source (a HEAD each), or from its record when the
    commit is pinned, or when the source cannot be reached and every file is verified already.
    ``set_commit``: resolve a split set at this commit (decide's second try)."""
    o, targets = plan.o, plan.targets
    session = Session(o["token"], o["timeout"], o["validate_certs"])
    pinned = bool(o["repo"]) and bool(HEX40.match(o["revision"] or ""))
    try:
        done = _resolve_set(plan, records, session, pinned, set_commit) if plan.one_commit else 0
        for t in targets[done:]:
            rec = records[t.name]
            if rec and pinned and rec.get("commit") == o["revision"] and not o["force_verify"]:
                _fill_from_record(t, rec, o)  # commit pinned and file verified: nothing to ask
                continue
            fetch_metadata(o, t, session)
    except DownloadError as e:
        status = getattr(e, "result", {}).get("status")
        if all(records[t.name] for t in targets) and status not in (401, 403, 404):
            for t in targets:
                _fill_from_record(t, records[t.name], o)
            plan.notes.append("could not reach the source (%s); kept the verified file(s)" % e.msg)
        else:
            raise
    finally:
        session.close()


def _resolve_set(plan, records, session, pinned, set_commit):
    """Every part of a Hugging Face split set at one commit (``plan.set_commit``): the commit the revision
    resolves to now (the first part's HEAD; a branch moving between two HEADs cannot mix commits), or,
    while update is false, the commit of the parts already verified here (the first recorded one): the
    rest of a half-fetched set then comes from the kept parts' commit, never from the new one.  Returns how
    many targets it resolved (all, or only the first when the hub names no commit)."""
    o, targets = plan.o, plan.targets
    kept = next((records[t.name]["commit"] for t in targets
                 if records[t.name] and records[t.name].get("commit")), None)
    head = o["revision"] if pinned else None
    if head is None:
        fetch_metadata(o, targets[0], session)
        head = targets[0].commit
        if head is None:
            plan.notes.append("the hub sent no commit (X-Repo-Commit) for %s, so the other parts of the set "
                              "could not be pinned to its commit" % targets[0].name)
            return 1
    if set_commit is None:
        set_commit = kept if kept and kept != head and not o["update"] else head
    plan.set_commit = set_commit
    if set_commit != head and not o["update"]:
        plan.update_available = True
        plan.notes.append("the source moved (revision %s is now commit %s); kept the set at commit %s, every "
                          "part from it. Set update: true to fetch the new one"
                          % (o["revision"], head, set_commit))
    for i, t in enumerate(targets):
        if i == 0 and t.commit == set_commit:
            continue  # resolved by the HEAD above
        rec = records[t.name]
        if rec and pinned and rec.get("commit") == set_commit == o["revision"] and not o["force_verify"]:
            _fill_from_record(t, rec, o)  # commit pinned and file verified: nothing to ask
            continue
        fetch_metadata(o, t, session, revision=set_commit)
    return len(targets)


def _choose(plan, t, rec):
    o = plan.o
    keep = "force_verify" if o["force_verify"] else "keep"
    if rec is None:
        st = check_own_path(t.final_path)
        if st is not None:
            _refuse_unverifiable(t, st)
            return Step(t, "hash_existing", "a file without a matching sidecar record is in place")
        return Step(t, "download", "no file at the final path")
    moved = _moved(rec, t, o)
    if moved and plan.set_commit and not o["update"]:
        # a part of a set from another commit than the set's (_resolve_set): kept, it would mix commits
        moved = "the other parts of the set come from commit %s, this one is from %s" % (
            plan.set_commit, rec.get("commit"))
    elif moved and not o["update"]:
        plan.update_available = True
        plan.notes.append("%s: the source moved (%s); kept the verified file from %s. Set update: true "
                          "to fetch the new one"
                          % (t.name, moved, rec.get("commit") or rec.get("source_url")))
        _fill_from_record(t, rec, o)
        return Step(t, keep, "the source moved (%s); update is false" % moved, rec)
    if moved and t.sha256 and t.sha256 == rec.get("sha256"):
        return Step(t, "recommit", "the source moved (%s) but the bytes are the same" % moved, rec)
    if moved:
        why = _unverifiable(o, t)
        if why:
            return _keep_verified(plan, t, rec, keep, "the source moved (%s), but %s" % (moved, why))
        return Step(t, "download", "the source moved (%s)" % moved, rec)
    if t.sha256 and rec.get("sha256") != t.sha256:
        # the hub vouches for another sha256 than the record: the record is not trusted (whoever can write
        # the models directory may have written it), the file is hashed and judged by its hash alone
        plan.notes.append("%s: the sidecar record's sha256 %s disagrees with the source's %s; not "
                          "trusted, the file was hashed" % (t.name, rec.get("sha256"), t.sha256))
        return Step(t, "hash_existing", "the sidecar record's sha256 disagrees with the source's")
    if t.size is not None and t.size != rec.get("size"):
        if t.sha256:  # == the record's: a matching sha256 wins over a size claim
            plan.notes.append("%s: the source states %d bytes, but its sha256 is the verified file's (%d "
                              "bytes): the sha256 wins, kept the file" % (t.name, t.size, rec.get("size")))
            t.size = rec.get("size")
            return Step(t, keep, "the sha256 matches the record (the size claim does not)", rec)
        return _keep_verified(plan, t, rec, keep, "the source now states %d bytes and no sha256 for the "
                              "same version" % t.size)
    return Step(t, keep, "the sidecar record matches the file and the source", rec)


def _unverifiable(o, t):
    """Why t's source cannot vouch for bytes that would replace a file already there, or None.  A sha256
    vouches; without one, a new version of a non-empty size (a new commit, a plain URL's changed ETag or
    Last-Modified) does, because the user asked for it (update: true).  A size of 0 and nothing else (a
    mirror's empty 200, a listing entry of size 0) never does."""
    if t.sha256:
        return None
    if t.size is None:
        return "it states no size and no sha256"
    if t.size == 0:
        return "it states 0 bytes and no sha256"
    if o["url"] and not (t.etag or t.last_modified):
        return "it states no sha256, ETag or Last-Modified"
    return None


def _keep_verified(plan, t, rec, keep, why):
    """Keep a verified file that a claim without a sha256 would replace; say so (a warning: the source is
    broken or misconfigured)."""
    text = ("%s: %s; that cannot be verified, so it never replaces a verified file: kept the verified file "
            "(%d bytes, sha256 %s). Pass sha256 to fetch the source's file anyway"
            % (t.name, why, rec.get("size"), rec.get("sha256")))
    plan.notes.append(text)
    plan.warnings.append(text)
    _fill_from_record(t, rec, plan.o)
    return Step(t, keep, "the source claims nothing verifiable: %s" % why, rec)


def _refuse_unverifiable(t, st):
    """A file at the final path without a record of its verification is checked against the source's
    sha256, or against its size when the source gives no sha256.  When neither can be checked, or the size
    differs, it is left alone: the run fails saying so (it never replaces a file nothing vouches for)."""
    if t.sha256 or (t.size is not None and st.st_size == t.size):
        return
    claim = ("no sha256 and no size" if t.size is None else
             "%d bytes and no sha256, the file has %d" % (t.size, st.st_size))
    raise DownloadError(
        "%s is at the final path without a record of its verification, and the source states %s: there is "
        "nothing to verify it against, so it was left untouched. Pass sha256 (the file's expected digest) "
        "to check it, or move it away to download the source's file" % (t.final_path, claim),
        left_untouched=t.final_path)


def _moved(rec, t, o):
    if o["repo"]:
        if rec.get("commit") and t.commit and rec["commit"] != t.commit:
            return ("revision %s is now commit %s, the file is from %s"
                    % (o["revision"], t.commit, rec["commit"]))
        return None
    if t.sha256 and t.sha256 == rec.get("sha256"):
        return None  # the same content, whatever the size claim or ETag say
    if t.size is not None and t.size != rec.get("size"):
        return "size %s -> %s" % (rec.get("size"), t.size)
    if t.etag and rec.get("etag") and t.etag != rec["etag"]:
        return "ETag %s -> %s" % (rec["etag"], t.etag)
    return None


def _fill_from_record(t, rec, o):
    t.sha256 = rec.get("sha256")
    t.size = rec.get("size")
    t.commit = rec.get("commit")
    t.etag = rec.get("etag")
    if o["repo"] and t.commit:
        t.url = resolve_url(o, t.name, t.commit)


# ---------------------------------------------------------------------------------------------
# apply: carry the plan out (under the per-file locks)
# ---------------------------------------------------------------------------------------------
def apply(plan, progress, t0, set_attributes=None):
    o, targets, notes = plan.o, plan.targets, plan.notes
    progress.total = sum(t.size or 0 for t in targets)
    results = []
    pending = []
    for step in plan.steps:
        t, rec = step.target, step.record
        if step.action == "keep":
            results.append(_part_result(t, rec["sha256"], "sidecar", 0, 0, False))
            progress.add(t.size or rec["size"])
        elif step.action == "recommit":
            rec = write_sidecar(t, rec["sha256"])
            notes.append("%s: same bytes at commit %s; record updated" % (t.name, t.commit))
            results.append(_part_result(t, rec["sha256"], "sidecar", 0, 0, False))
            progress.add(t.size)
        elif step.action in ("force_verify", "hash_existing"):
            verified = _verify_in_place(step, progress, plan)
            if verified is None:
                pending.append(t)
            results.append(verified)
        else:
            pending.append(t)
            results.append(None)
    if pending:
        free_space_check(plan.dest, [(t.size, part_path(t)) for t in pending], o["free_space_margin"])
    todo = iter(pending)
    for i, r in enumerate(results):
        if r is None:
            t = next(todo)
            progress.set(state="downloading", file=t.name)
            results[i] = _download_one(o, t, progress, notes)
    attrs_changed = False
    if set_attributes is not None:
        for i, t in enumerate(targets):
            if set_attributes(t.final_path):
                attrs_changed = True
                write_sidecar(t, results[i]["sha256"])  # verified in this run; chmod/chown moved ctime
    progress.set(state="done")
    result = _final_result(o, targets, results, notes, plan.update_available, t0, attrs_changed)
    if plan.warnings:
        result["warnings"] = [scrub(w, o.get("token")) for w in plan.warnings]
    return result


# What a sidecar record takes on disk: one block.
RECORD_ROOM = 4096


def write_sidecar(t, sha, _stat=None):
    """Record that t's file (at its final path, hashed in this run) has sha256 ``sha``.  A disk full here
    (something else filled it while this run downloaded into its preallocated part) fails naming the
    filesystem; the file stays in place (its temporary record is removed) and the next run hashes it once
    and records it, without fetching it again."""
    if _stat is None:
        _stat = check_own_path(t.final_path)
        if _stat is None:
            raise DownloadError("%s vanished before its record was written; rerun" % t.final_path)
    try:
        return write_sidecar_record(t.final_path, sha, _stat=_stat, commit=t.commit, etag=t.etag,
                                    source=t.source, source_url=t.source_url)
    except OSError as e:
        if e.errno not in DISK_FULL:
            raise
        raise DownloadError(
            "disk full while writing %s, the verification record of %s (%s): the file is in place with "
            "sha256 %s, but nothing records that yet; %s: the next run hashes the file once and records it, "
            "without downloading it again" % (sidecar_path(t.final_path), t.final_path, os.strerror(e.errno),
                                              sha, no_room(t.final_path, RECORD_ROOM)),
            disk_full=True) from None


def _verify_in_place(step, progress, plan):
    """Hash the file at the final path: its part result when it is the file (recorded), else None: it must
    be downloaded, and it stays where it is until verified bytes replace it (``t.replaces``)."""
    t, rec, notes = step.target, step.record, plan.notes
    progress.set(state="hashing", file=t.name)
    st = check_own_path(t.final_path)
    try:
        got = hash_file(t.final_path, progress, nofollow=True)
    except OSError as e:
        check_own_path(t.final_path)
        raise DownloadError("cannot read %s: %s" % (t.final_path, e)) from None
    want = t.sha256 or (rec or {}).get("sha256")
    if want and got == want:
        if t.size is not None and st.st_size != t.size:
            notes.append("%s: the source states %d bytes, but the file's sha256 matches (%d bytes): the "
                         "sha256 wins, kept the file" % (t.name, t.size, st.st_size))
            t.size = st.st_size
        write_sidecar(t, got)
        return _part_result(t, got, "hashed", 0, 0, False)
    if not want:
        _refuse_unverifiable(t, st)  # decide() checked it; the file may have changed since
        notes.append("%s: no reference sha256 (pass sha256); recorded the existing file's" % t.name)
        write_sidecar(t, got)
        return _part_result(t, got, "hashed", 0, 0, False)
    # not the source's file: nothing may trust it any more, but it stays until verified bytes replace it
    side = sidecar_path(t.final_path)
    if os.path.lexists(side):
        os.unlink(side)
    t.replaces = {"sha256": got, "size": st.st_size}
    notes.append("%s: the file at the final path did not match (expected %s, got %s)" % (t.name, want, got))
    progress.add(-st.st_size)  # it is counted again while downloading
    return None


def _final_path_now(t):
    """Where the final path stands after a failed download, in words (for the message)."""
    if not os.path.lexists(t.final_path):
        return "Nothing is at the final path"
    replaced = t.replaces
    if replaced:
        return ("The final path still holds the file that was there before (sha256 %s, which does not match "
                "the source either)" % replaced["sha256"])
    return "The final path still holds the file that was there before, untouched"


def _download_one(o, t, progress, notes=None):
    started = time.time()
    part = part_path(t)
    dl = FileDownload(o, t, progress)
    resumed = dl.load_state() if t.size else 0
    try:
        got, new = dl.run()
    except DownloadError as e:
        if getattr(e, "discard_part", False):  # the source contradicts itself: nothing here can complete
            for p in (part, state_path(t)):
                if os.path.lexists(p):
                    os.unlink(p)
            e.msg = "%s. %s" % (e.msg, _final_path_now(t))
            e.args = (e.msg,)
        raise
    pst = check_own_path(part, single_link=True)
    if pst is None or (pst.st_dev, pst.st_ino) != dl.part_id:
        raise DownloadError("%s was replaced while this run wrote it; remove it and rerun" % part)
    actual = pst.st_size
    want = t.sha256
    if actual != t.size or (want and got != want):
        q, older = quarantine(part, t.final_path)
        drop_state(t)
        older = " (replacing the older copy %s)" % ", ".join(older) if older else ""
        raise DownloadError(
            "checksum mismatch for %s: expected sha256 %s (%d bytes), got %s (%d bytes); the downloaded "
            "bytes were moved to %s%s. %s. Rerun to download again; if it repeats, the source or a proxy "
            "corrupts data" % (t.name, want or "-", t.size, got, actual, q, older, _final_path_now(t)),
            quarantined=q, expected_sha256=want, got_sha256=got)
    check_own_path(t.final_path)  # a file (or nothing): never rename over a planted directory
    replaced = t.replaces
    if replaced and os.path.lexists(t.final_path):
        # the previous file (it did not match) goes to the quarantine slot; linked there first, so the final
        # path holds a file until the verified one is renamed over it
        q, older = quarantine(t.final_path, keep=True)
        if notes is not None:
            notes.append("%s: moved the previous file (sha256 %s) to %s%s" % (
                t.name, replaced["sha256"], q,
                " (replacing the older copy %s)" % ", ".join(older) if older else ""))
    os.rename(part, t.final_path)
    fst = os.lstat(t.final_path)
    if (fst.st_dev, fst.st_ino) != dl.part_id or not stat.S_ISREG(fst.st_mode):
        raise DownloadError("%s is not the file this run downloaded (replaced while renaming); remove it and "
                            "rerun" % t.final_path)
    fsync_dir(os.path.dirname(t.final_path))
    drop_state(t)
    write_sidecar(t, got, fst)
    fsync_dir(os.path.dirname(t.final_path))
    r = _part_result(t, got, "download", new, resumed, True)
    r["elapsed_s"] = round(time.time() - started, 3)
    return r


def _part_result(t, sha, verified, new, resumed, changed):
    return {"path": t.final_path, "name": t.name, "size": t.size, "sha256": sha, "commit": t.commit,
            "source_url": t.source_url, "verified": verified, "downloaded_bytes": new,
            "resumed_from": resumed, "changed": changed}


_VERIFIED_ORDER = {"sidecar": 0, "hashed": 1, "download": 2}


def _final_result(o, targets, parts, notes, update_available, t0, attrs_changed=False):
    first = parts[0]
    changed = any(p["changed"] for p in parts) or attrs_changed
    verified = max((p["verified"] for p in parts), key=lambda v: _VERIFIED_ORDER[v])
    dl = sum(p["downloaded_bytes"] for p in parts)
    elapsed = round(time.time() - t0, 3)
    if changed:
        msg = "downloaded %s (%s new, %s resumed) and verified sha256 in %.1fs" % (
            ", ".join(p["name"] for p in parts if p["changed"]), human(dl),
            human(sum(p["resumed_from"] for p in parts)), elapsed)
    else:
        msg = "%s already present and verified (%s)" % (
            ", ".join(p["name"] for p in parts), verified)
    if notes:
        msg += "; " + "; ".join(notes)
    return {
        "changed": changed, "path": first["path"], "paths": [p["path"] for p in parts],
        "size": sum(p["size"] or 0 for p in parts), "total_size": sum(p["size"] or 0 for p in parts),
        "sha256": first["sha256"], "commit": first["commit"],
        "source_url": first["source_url"], "downloaded_bytes": dl,
        "resumed_from": sum(p["resumed_from"] for p in parts), "verified": verified, "elapsed_s": elapsed,
        "update_available": update_available, "parts": parts, "msg": scrub(msg, o.get("token")),
    }


def check_mode_result(plan, t0):
    """What a real run would do (decide()'s plan), as a result: nothing is written."""
    o, notes = plan.o, list(plan.notes)
    todo = [s.target for s in plan.steps if s.action == "download"]
    if todo and os.path.isdir(plan.dest):
        try:
            free_space_check(plan.dest, [(t.size, part_path(t)) for t in todo], o["free_space_margin"])
        except DownloadError as e:
            notes.append("would fail: " + e.msg)
    would = []
    parts = []
    for step in plan.steps:
        t, action = step.target, step.action
        what = WOULD[action]
        if action == "download":
            what %= human((t.size or 0) - step.resumable)
        would.append("%s: %s" % (t.name, what))
        parts.append({"path": t.final_path, "name": t.name, "size": t.size,
                      "sha256": t.sha256 or (step.record or {}).get("sha256"), "commit": t.commit,
                      "source_url": t.source_url, "verified": "sidecar" if action == "keep" else None,
                      "downloaded_bytes": 0, "resumed_from": step.resumable, "changed": action == "download",
                      "action": action, "reason": step.reason})
    msg = "check mode: " + "; ".join(would + notes)
    return {
        "changed": any(p["changed"] for p in parts), "path": parts[0]["path"],
        "paths": [p["path"] for p in parts], "size": sum(p["size"] or 0 for p in parts),
        "total_size": sum(p["size"] or 0 for p in parts),
        "sha256": parts[0]["sha256"], "commit": parts[0]["commit"],
        "source_url": parts[0]["source_url"], "downloaded_bytes": 0,
        "resumed_from": sum(p["resumed_from"] for p in parts),
        "verified": "sidecar" if all(p["verified"] == "sidecar" for p in parts) else None,
        "elapsed_s": round(time.time() - t0, 3), "update_available": plan.update_available, "parts": parts,
        "msg": scrub(msg, o.get("token")),
        "warnings": [scrub(w, o.get("token")) for w in plan.warnings],
    }
