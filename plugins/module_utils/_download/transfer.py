# -*- coding: utf-8 -*-
# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
# PRIVATE to llmops.serving: it can change at any time; do not import it from other collections.
"""One file's bytes: parallel ranged GETs into ``<file>.part`` with the sha256 computed while data arrives.

``connections`` threads fetch chunks of the missing ranges (download_parts.py says which) with ``Range``
and ``os.pwrite`` them into the ``.part``.  The thread writing at the hashed frontier feeds its buffer
straight into the hash; a hasher thread reads back (from the page cache, just written) the ranges other
threads finished ahead of the frontier, in order.  So every byte is hashed exactly once and the hash is
final the moment the last byte lands; on resume the hasher re-reads the present prefix once (hashlib
state cannot be persisted portably) while the missing ranges download.

A server that ignores Range (200) or refuses it (416), or a plain URL without a validator, makes the
download start over from byte 0 on one connection, honestly (``downloaded_bytes`` counts every byte).

Plain Python 3.6, standard library only; importable without Ansible.
"""
from __future__ import absolute_import, division, print_function

import hashlib
import os
import re
import threading
import time
from http import client as http_client

from ansible_collections.llmops.serving.plugins.module_utils._download import parts
from ansible_collections.llmops.serving.plugins.module_utils._download.http import (
    Session,
    abandon,
    backoff,
    describe_error,
    drain,
    refuse_html,
    status_error,
)
from ansible_collections.llmops.serving.plugins.module_utils._download.messages import (
    DownloadError,
    Progressed,
    RangesRefused,
    Retryable,
    redact_url,
)
from ansible_collections.llmops.serving.plugins.module_utils._download.ranges import Ranges
from ansible_collections.llmops.serving.plugins.module_utils._files.safe import open_regular

__metaclass__ = type

MIB = 1 << 20
BUF_SIZE = 256 * 1024


class FileDownload:
    def __init__(self, o, target, progress):
        self.o = o
        self.t = target
        self.progress = progress
        self.part = parts.part_path(target)
        self.state_path = parts.state_path(target)
        self.size = target.size
        self.lock = threading.Condition()
        self.done = Ranges()
        self.hashed = 0
        self.h = hashlib.sha256()
        self.gen = 0
        self.new_bytes = 0
        self.stop = False
        self.error = None
        self.cdn_url = None
        self.cdn_etag = None
        self.restart_owner = None
        self.queue = []
        self.fd = None
        self.part_id = None
        self.resumed_from = 0
        self.workers_done = False
        self.restart_reason = None

    # state ---------------------------------------------------------------------------------
    def _identity(self):
        return parts.part_identity(self.t)

    def load_state(self):
        """Take over the trusted ranges of an earlier run (download_parts.resume); return their bytes."""
        self.done, self.cdn_etag = parts.resume(self.o, self.t)
        self.resumed_from = self.done.total()
        return self.resumed_from

    def save_state(self, sync=False):
        with self.lock:
            done = [list(r) for r in self.done.items]
            cdn_etag = self.cdn_etag
        parts.save_state(self.t, done, cdn_etag, self.fd if sync else None)

    # writing & hashing ------------------------------------------------------------------------
    def _write(self, pos, data, gen):
        n = len(data)
        off = 0
        while off < n:
            try:
                off += os.pwrite(self.fd, data[off:], pos + off)
            except OSError as e:
                with self.lock:
                    remaining = self.size - self.done.total()
                raise parts.disk_error(e, self.part, remaining) from None
        with self.lock:
            if gen != self.gen:
                return
            self.done.add(pos, pos + n)
            self.new_bytes += n
            if pos <= self.hashed < pos + n:
                self.h.update(data[self.hashed - pos:])
                self.hashed = pos + n
            elif self.done.prefix_end() > self.hashed:
                self.lock.notify_all()
        self.progress.add(n)

    def _hasher(self):
        try:
            while True:
                with self.lock:
                    while not self.stop and self.done.prefix_end() <= self.hashed and not self._all_in():
                        self.lock.wait(0.5)
                    if self.stop or self.done.prefix_end() <= self.hashed:
                        return
                    start, gen = self.hashed, self.gen
                    end = min(self.done.prefix_end(), start + 4 * MIB)
                data = os.pread(self.fd, end - start, start)
                with self.lock:
                    if gen == self.gen and start <= self.hashed < start + len(data):
                        self.h.update(memoryview(data)[self.hashed - start:])
                        self.hashed = start + len(data)
                        self.lock.notify_all()
        except Exception as e:  # pragma: no cover - surfaced by run()
            with self.lock:
                self.error = self.error or DownloadError("hashing %s failed: %s" % (self.part, e))
                self.stop = True

    def _all_in(self):
        return self.workers_done and self.done.prefix_end() <= self.hashed

    def _reset_to_zero(self):
        """Forget every byte and the hash: the next body starts at byte 0.  Returns the new generation
        (writes of older generations are dropped)."""
        with self.lock:
            self.restart_owner = None  # every range worker has ended
            self.gen += 1
            self.done = Ranges()
            self.hashed = 0
            self.h = hashlib.sha256()
            self.cdn_etag = None
            self.lock.notify_all()
            return self.gen

    # network -----------------------------------------------------------------------------
    def _get(self, session, pos, end, ranged):
        headers = {}
        if ranged:
            headers["Range"] = "bytes=%d-%d" % (pos, end - 1)
            if self.cdn_etag and not self.cdn_etag.startswith("W/"):
                headers["If-Range"] = self.cdn_etag
            elif self.o.get("url") and self.t.last_modified:
                headers["If-Range"] = self.t.last_modified
        url = self.cdn_url or self.t.url
        resp, final = session.request("GET", url, headers=headers, auth_origin=self.o.get("auth_origin"))
        if resp.status in (401, 403, 404, 410) and self.cdn_url:
            drain(resp)
            self.cdn_url = None  # signed CDN URL expired: resolve again
            raise Retryable("CDN answered %d; resolving the URL again" % resp.status)
        if resp.status in (200, 206):
            refuse_html(resp, self.t.name, final)
        if final != url and resp.status in (200, 206, 416):
            self.cdn_url = final  # reuse the (signed) CDN URL for the next ranges
        return resp

    def _check_length(self, resp, want):
        """A whole-file (200) answer must be exactly the expected size: a longer or shorter body is
        another version of the file (or something else), never the file."""
        cl = (resp.getheader("Content-Length") or "").strip()
        if cl.isdigit() and int(cl) != want:
            abandon(resp)
            raise DownloadError(
                "%s: %s sends %s bytes, expected %d (the size from the metadata): the file changed at the "
                "source, or the server sends something else; nothing reached the final path. Rerun to fetch "
                "the current file (pass size/sha256 to pin it)"
                % (self.t.name, redact_url(self.cdn_url or self.t.url), cl, want),
                expected_size=want, got_size=int(cl))

    def _check_end(self, resp):
        """After the expected bytes of a body of unknown length: nothing may follow."""
        if getattr(resp, "length", 0) is None and not resp.isclosed():
            try:
                extra = resp.read(1)
            except (http_client.HTTPException, OSError):
                extra = b""
            if extra:
                abandon(resp)
                raise DownloadError("%s: %s sends more than the expected %d bytes: the file changed at the "
                                    "source, or the server sends something else; nothing reached the final "
                                    "path" % (self.t.name, redact_url(self.cdn_url or self.t.url), self.size))

    def _fetch_range(self, session, pos, end, gen):
        """Fetch [pos, end) into the part; return the new position (== end when complete)."""
        resp = self._get(session, pos, end, True)
        if resp.status == 416:
            cr = resp.getheader("Content-Range") or ""
            drain(resp)
            m = re.match(r"bytes \*/(\d+)", cr)
            if m and int(m.group(1)) != self.size:
                raise DownloadError("%s: the server now reports %s bytes, expected %d: the file changed "
                                    "upstream; rerun (set update: true for a moved branch)"
                                    % (self.t.name, m.group(1), self.size))
            raise RangesRefused("416 to a range request")
        if resp.status == 200 and pos == 0 and end == self.size:
            return self._stream_whole(resp, gen)  # the whole file was asked for anyway
        if resp.status == 200:
            abandon(resp)
            raise RangesRefused("server ignored Range (200)")
        if resp.status != 206:
            raise status_error(resp, self.cdn_url or self.t.url, "GET %s" % self.t.name)
        m = re.match(r"bytes (\d+)-(\d+)/(\d+|\*)", resp.getheader("Content-Range") or "")
        if not m or int(m.group(1)) != pos:
            abandon(resp)
            raise Retryable("bad Content-Range %r for bytes=%d-%d"
                            % (resp.getheader("Content-Range"), pos, end - 1))
        if m.group(3) != "*" and int(m.group(3)) != self.size:
            abandon(resp)
            raise self._size_conflict(int(m.group(3)))
        cl = (resp.getheader("Content-Length") or "").strip()
        if cl.isdigit() and int(cl) != int(m.group(2)) - int(m.group(1)) + 1:
            abandon(resp)
            raise Retryable("Content-Length %s does not match Content-Range %r"
                            % (cl, resp.getheader("Content-Range")))
        etag = resp.getheader("ETag")
        with self.lock:
            if etag and self.cdn_etag is None:
                self.cdn_etag = etag
            elif etag and etag != self.cdn_etag and not self.t.sha256:
                # without a known sha256 the ETag is all that ties the ranges together; with one, the
                # final hash check catches mixed content, and CDN edges may spell ETags differently
                abandon(resp)
                raise RangesRefused("ETag changed (%s -> %s)" % (self.cdn_etag, etag))
        return self._stream(resp, pos, min(end, int(m.group(2)) + 1), gen)

    def _size_conflict(self, served):
        """The server's file has another size than the metadata states: not a transient fault (retrying gets
        the same answer), so the download stops at once and its part is discarded (``discard_part``)."""
        err = DownloadError(
            "%s: %s serves a file of %d bytes, but the metadata states %d bytes%s: the source contradicts "
            "itself (stale metadata on a mirror?); nothing reached the final path. Retrying will not help: "
            "use another endpoint or mirror, or pin revision to a commit whose metadata is right"
            % (self.t.name, redact_url(self.cdn_url or self.t.url), served, self.size,
               " (sha256 %s)" % self.t.sha256 if self.t.sha256 else ""),
            expected_size=self.size, got_size=served)
        err.discard_part = True
        return err

    def _fetch_whole(self, session, pos, end, gen):
        """The whole file without Range (``pos`` is always 0 here: a retry starts over)."""
        resp = self._get(session, 0, self.size, False)
        if resp.status != 200:
            raise status_error(resp, self.t.url, "GET %s" % self.t.name)
        return self._stream_whole(resp, gen)

    def _stream_whole(self, resp, gen):
        self._check_length(resp, self.size)
        done = self._stream(resp, 0, self.size, gen)
        if done >= self.size:
            self._check_end(resp)
        return done

    def _stream(self, resp, pos, end, gen):
        buf = bytearray(BUF_SIZE)
        mv = memoryview(buf)
        try:
            while pos < end:
                if self._cancelled(gen):
                    resp.close()
                    return pos
                try:
                    n = resp.readinto(mv[:min(BUF_SIZE, end - pos)])
                except (http_client.HTTPException, OSError) as e:
                    raise Retryable("%s: connection broke at byte %d: %s"
                                    % (self.t.name, pos, describe_error(e))) from None
                if not n:
                    raise Retryable("%s: connection closed at byte %d" % (self.t.name, pos))
                self._write(pos, mv[:n], gen)
                pos += n
        except Retryable:
            resp.close()
            raise Progressed(pos)  # noqa: B904 (the cause is kept in .cause)
        return pos

    def _cancelled(self, gen):
        return self.stop or gen != self.gen or self.restart_owner is not None

    def _retrying(self, session, pos, end, gen, whole):
        """Fetch [pos, end) until it is in, retrying drops, stalls and 429/5xx with backoff.

        Ranged (``whole`` false): a retry continues where the bytes stopped, and progress resets the
        failure count.  Whole body (``whole``): the server gives no ranges, so every retry forgets the
        bytes and the hash and starts at byte 0 again."""
        failures = 0
        while True:
            if self._cancelled(gen):
                return
            err, retry_after = None, None
            fetch = self._fetch_whole if whole else self._fetch_range
            try:
                pos = fetch(session, pos, end, gen)
                if pos >= end:
                    return
                if self._cancelled(gen):
                    return
                err = "connection ended at byte %d" % pos
            except Progressed as p:
                if p.pos > pos and not whole:
                    failures = 0
                pos, err = p.pos, p.cause
            except Retryable as e:
                err, retry_after = e, e.retry_after
            if self.stop:
                return
            session.close()
            failures += 1
            if failures > self.o["retries"]:
                if whole:
                    raise DownloadError("%s: the download kept failing (%s); it restarts from byte 0 each "
                                        "time (%s)" % (self.t.name, err, self.restart_reason))
                raise DownloadError("%s: giving up after %d retries at byte %d: %s; the partial "
                                    "download is kept, rerun to resume"
                                    % (self.t.name, self.o["retries"], pos, err))
            if whole:
                gen, pos = self._reset_to_zero(), 0
            self._sleep(backoff(failures, self.o["retry_delay"], retry_after))

    def _worker(self):
        session = Session(self.o["token"], self.o["timeout"], self.o["validate_certs"])
        try:
            while True:
                with self.lock:
                    if self.stop or not self.queue or self.restart_owner is not None:
                        return
                    pos, end = self.queue.pop(0)
                    gen = self.gen
                self._retrying(session, pos, end, gen, whole=False)
        except RangesRefused as r:
            with self.lock:
                if self.restart_owner is None:
                    self.restart_owner = threading.current_thread()
                    self.restart_reason = str(r)
                    self.lock.notify_all()
        except BaseException as e:
            with self.lock:
                self.error = self.error or e
                self.stop = True
                self.lock.notify_all()
        finally:
            session.close()

    def _sleep(self, s):
        end = time.time() + s
        while time.time() < end and not self.stop:
            time.sleep(min(0.2, end - time.time()))

    def _run_workers(self, gaps, nconn):
        chunk = max(4 * MIB, min(128 * MIB, self.size // max(1, nconn * 4)))
        if nconn <= 1:
            self.queue = list(gaps)
        else:
            self.queue = []
            for a, b in gaps:
                while a < b:
                    self.queue.append((a, min(b, a + chunk)))
                    a += chunk
        nconn = max(1, min(nconn, len(self.queue)))
        threads = [threading.Thread(target=self._worker, name="dl-%d" % i) for i in range(nconn)]
        for th in threads:
            th.daemon = True
            th.start()
        self._wait(threads)

    def _run_empty(self):
        """A file of 0 bytes: an empty ``.part`` (its identity recorded for the rename), nothing fetched."""
        fd = open_regular(self.part, os.O_WRONLY | os.O_CREAT, 0o644, single_link=True)
        try:
            os.ftruncate(fd, 0)
            st = os.fstat(fd)
            self.part_id = (st.st_dev, st.st_ino)
        finally:
            os.close(fd)
        return hashlib.sha256().hexdigest(), 0

    def _wait(self, threads):
        while True:
            alive = [th for th in threads if th.is_alive()]
            if not alive:
                return
            alive[0].join(1.0)
            self.save_state(sync=True)
            self.progress.maybe_write()

    def _full_body(self):
        """Start over from byte 0 on one connection without Range (the server will not do ranges)."""
        gen = self._reset_to_zero()
        self.save_state()
        session = Session(self.o["token"], self.o["timeout"], self.o["validate_certs"])
        try:
            self._retrying(session, 0, self.size, gen, whole=True)
        finally:
            session.close()

    def run(self):
        """Download/finish the part; return (sha256 hex, downloaded bytes)."""
        if self.size == 0:
            return self._run_empty()
        self.fd = open_regular(self.part, os.O_RDWR | os.O_CREAT, 0o644, single_link=True)
        pst = os.fstat(self.fd)
        self.part_id = (pst.st_dev, pst.st_ino)
        self.workers_done = False
        hasher = None
        try:
            st = os.fstat(self.fd)
            if st.st_size != self.size:
                self.done = Ranges()
                os.ftruncate(self.fd, 0)
                try:
                    parts.preallocate(self.fd, self.size, self.part)
                except DownloadError as e:
                    # the part holds nothing: it goes (with any state), and the message says so
                    for p in (self.part, self.state_path):
                        try:
                            os.unlink(p)
                        except OSError:
                            pass
                    e.msg += "; the empty partial file was removed"
                    e.args = (e.msg,)
                    raise
            self.save_state()
            self.progress.add(0)
            with self.progress.lock:
                self.progress.done += self.done.total()
            hasher = threading.Thread(target=self._hasher, name="dl-hash")
            hasher.daemon = True
            hasher.start()
            gaps = self.done.missing(self.size)
            nconn = self.o["connections"] if self.size >= self.o["parallel_min_size"] else 1
            self.restart_owner = None
            if gaps and not parts.ranges_safe(self.o, self.t):
                # no ETag/Last-Modified and no sha256: a range could splice two versions of the file
                self.restart_owner = "no validator"
                self.restart_reason = ("the server gives no ETag or Last-Modified, so bytes fetched in "
                                       "pieces could mix two versions of the file")
            elif gaps:
                self._run_workers(gaps, nconn)
            if self.error is None and self.restart_owner is not None:
                self._full_body()
            with self.lock:
                self.workers_done = True
                self.lock.notify_all()
            if self.error is None:
                self.progress.set(state="verifying")
            hasher.join()
            if self.error is not None:
                raise self.error
            if self.hashed != self.size or self.done.prefix_end() != self.size:
                raise DownloadError("%s: download ended with %d of %d bytes hashed; rerun to resume"
                                    % (self.t.name, self.hashed, self.size))
            os.fsync(self.fd)
            return self.h.hexdigest(), self.new_bytes
        finally:
            with self.lock:
                self.stop = True
                self.lock.notify_all()
            if hasher is not None:
                hasher.join(5)
            if self.fd is not None:
                os.close(self.fd)
            if os.path.exists(self.part) and os.path.exists(self.state_path):
                self.save_state()
