# -*- coding: utf-8 -*-
# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Run a command on the node with a deadline and a read limit (issue 23): an nvidia-smi that never stops
writing, or an interpreter probe that hangs, is killed - its whole process group - when it passes either,
instead of filling the module's memory (communicate() reads everything) or holding the play.

Plain Python 3.6, standard library only.
"""
from __future__ import absolute_import, division, print_function

import os
import selectors
import signal
import subprocess
import time

__metaclass__ = type

# What a probe may print (stdout and stderr together) before it is stopped: nvidia-smi's CSV and XML for
# 16 GPUs is well under 1 MiB.
DEFAULT_MAX_BYTES = 8 * 1024 * 1024


def run_bounded(argv, timeout, max_bytes=DEFAULT_MAX_BYTES, env=None):
    """(rc, stdout bytes, stderr bytes, timed_out, overflowed). The process runs in its own session; on the
    deadline or past max_bytes its process group is killed (rc is then the signal's negative number).
    OSError when argv cannot be started."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                            env=env, start_new_session=True)
    deadline = time.monotonic() + max(float(timeout), 0.0)
    chunks = {proc.stdout: [], proc.stderr: []}
    total = 0
    timed_out = overflowed = False
    selector = selectors.DefaultSelector()
    for pipe in (proc.stdout, proc.stderr):
        selector.register(pipe, selectors.EVENT_READ)
    try:
        while selector.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                timed_out = True
                break
            for key, _events in selector.select(min(left, 1.0)):
                data = os.read(key.fileobj.fileno(), 65536)
                if not data:
                    selector.unregister(key.fileobj)
                    continue
                total += len(data)
                if total > max_bytes:
                    overflowed = True
                    break
                chunks[key.fileobj].append(data)
            if overflowed:
                break
    finally:
        selector.close()
        if timed_out or overflowed:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except OSError:
                pass
        for pipe in (proc.stdout, proc.stderr):
            pipe.close()
        try:
            proc.wait(timeout=5 if (timed_out or overflowed) else max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            timed_out = True
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except OSError:
                pass
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
    out, err = b"".join(chunks[proc.stdout]), b"".join(chunks[proc.stderr])
    return proc.returncode, out, err, timed_out, overflowed
