# -*- coding: utf-8 -*-
# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
# PRIVATE to llmops.serving: it can change at any time; do not import it from other collections.
"""The progress file model_download updates about once a second (percent, rate, ETA) for the role to poll.

Plain Python 3.6, standard library only; importable without Ansible.
"""
from __future__ import absolute_import, division, print_function

import json
import threading
import time

from ansible_collections.llmops.serving.plugins.module_utils._download.messages import (
    DownloadError,
    scrub,
    scrub_all,
)
from ansible_collections.llmops.serving.plugins.module_utils._files.safe import write_atomic

__metaclass__ = type


class Progress:
    def __init__(self, path, total=0, token=None):
        self.path = path
        self.token = token
        self.total = total
        self.done = 0
        self.state = "resolving"
        self.file = None
        self.lock = threading.Lock()
        self.samples = [(time.time(), 0)]
        self.new = 0
        self._last = 0.0
        self.error = None
        self._wlock = threading.Lock()

    def add(self, n):
        with self.lock:
            self.done += n
            self.new += n
        self.maybe_write()

    def set(self, state=None, file=None):
        with self.lock:
            if state:
                self.state = state
            if file:
                self.file = file
        self.write()

    def snapshot(self):
        now = time.time()
        with self.lock:
            self.samples.append((now, self.new))
            self.samples = [s for s in self.samples if now - s[0] <= 5.0] or [(now, self.new)]
            t0, n0 = self.samples[0]
            rate = (self.new - n0) / (now - t0) if now > t0 else 0.0
            left = max(0, self.total - self.done)
            return {"bytes_done": self.done, "bytes_total": self.total,
                    "percent": round(100.0 * self.done / self.total, 1) if self.total else 0.0,
                    "rate_mbs": round(rate / 1e6, 2), "eta_s": int(left / rate) if rate > 0 else None,
                    "state": self.state, "file": self.file, "updated": int(now), "error": self.error}

    def maybe_write(self):
        if self.path and time.time() - self._last >= 1.0:
            self.write()

    def write(self):
        if not self.path or not self._wlock.acquire(False):
            return
        try:
            self._last = time.time()
            write_atomic(self.path, scrub(json.dumps(self.snapshot(), sort_keys=True), self.token))
        except OSError:
            pass
        finally:
            self._wlock.release()


def run_with_progress(what, o, check_mode, work):
    """``work(progress)``'s result, scrubbed of the token, with the run's progress file (none in check mode).

    The one way model_download and model_snapshot end a run: a DownloadError leaves with its message and
    result scrubbed, anything unexpected becomes one scrubbed DownloadError line naming ``what`` (the
    module; the token may sit in any exception text), and the progress file says ``failed`` either way."""
    token = o.get("token")
    progress = Progress(o["progress_file"] if not check_mode else None, token=token)
    try:
        return scrub_all(work(progress), token)
    except DownloadError as e:
        e.msg = scrub(e.msg, token)
        e.args = (e.msg,)
        e.result = scrub_all(e.result, token)
        progress.error = e.msg
        progress.set(state="failed")
        raise
    except Exception as e:
        msg = scrub("%s failed: %s: %s" % (what, type(e).__name__, e), token)
        progress.error = msg
        progress.set(state="failed")
        raise DownloadError(msg) from None
    except BaseException:
        progress.set(state="failed")
        raise
