# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Wait for an async download job, printing its progress, and return the job's final result.

The job (``llmops.serving.model_download`` started with ``async``/``poll: 0``) writes its progress to a
JSON file on the node. Each probe is one command on the node: it waits up to one interval for the job's
async record to become final (so the task ends within a second of the download), then prints the record's
state and the progress file. One progress line is printed per probe. The final result is the one
``ansible.builtin.async_status`` returns, so the tasks that follow read it as before.

The progress file sits in the model's directory, which the service user may write, and the probe runs as
root: it reads at most PROGRESS_MAX_BYTES of it with ``dd iflag=nofollow,nonblock`` (GNU coreutils), so a
symlink planted there is not followed (root would print any file it points to) and a FIFO does not block
the play. Where dd lacks those flags (busybox), the progress is not read at all ("starting").
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import time

from ansible.module_utils.six.moves import shlex_quote
from ansible.plugins.action import ActionBase
from ansible.utils.display import Display
from ansible.utils.vars import merge_hash

display = Display()

# The async wrapper ends the job at its ``async`` limit and then writes the final record: waiting this
# much longer than the limit collects that record ("Timeout exceeded") instead of a still-running one.
WRAPPER_GRACE_S = 30

# The progress file is one line of JSON of a few hundred bytes; more is not read.
PROGRESS_MAX_BYTES = 65536

# The async wrapper's first record is {"started": 1, "finished": 0, ...}; the final one replaces it whole.
# The progress file is read with O_NOFOLLOW and O_NONBLOCK (dd's iflag), one block at most, and only when it
# is a regular file: never a link's target, never a FIFO's writer awaited.
PROBE_SCRIPT = """job=%(job)s
progress=%(progress)s
end=$(( $(date +%%s) + %(wait)d ))
finished=false
while :; do
  if [ -f "$job" ] && ! grep -q '"started": 1' "$job"; then finished=true; break; fi
  [ "$(date +%%s)" -ge "$end" ] && break
  sleep 1
done
p=
if [ -f "$progress" ] && [ ! -L "$progress" ]; then
  p=$(dd if="$progress" iflag=nofollow,nonblock bs=%(max)d count=1 2>/dev/null | tr -d '\\n') || p=
fi
printf '{"finished": %%s, "progress": %%s}\\n' "$finished" "${p:-null}"
"""


def probe_command(results_file, progress_file, wait_s):
    """The /bin/sh command that waits up to wait_s seconds for the job's end, then reports."""
    return PROBE_SCRIPT % {"job": shlex_quote(results_file), "progress": shlex_quote(progress_file),
                           "wait": max(0, int(wait_s)), "max": PROGRESS_MAX_BYTES}


def parse_probe(stdout):
    """(finished, progress) from the probe's output; an unreadable output or progress counts as unknown."""
    try:
        state = json.loads(stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return False, None
    if not isinstance(state, dict):
        return False, None
    progress = state.get("progress")
    return state.get("finished") is True, progress if isinstance(progress, dict) else None


def _mb(n):
    return round(n / 1000000.0, 1)


def progress_line(progress):
    """One line of progress: state, percent, MB done/total, MB/s and ETA once the size is known."""
    if not isinstance(progress, dict):
        return "starting"
    total = progress.get("bytes_total") or 0
    if total > 0:
        eta = progress.get("eta_s")
        return "%s %s%% %s/%s MB, %s MB/s, ETA %s s" % (
            progress.get("state"), progress.get("percent"), _mb(progress.get("bytes_done") or 0), _mb(total),
            progress.get("rate_mbs"), eta if eta is not None else "?")
    return progress.get("state") or "starting"


def wait_for_job(probe, report, clock, interval, timeout):
    """Probe until the job ends or ``timeout`` seconds pass; report each probe's progress.

    probe(wait_s) -> (finished, progress) waits on the node up to wait_s seconds; report(progress)
    prints it. Returns True when the job ended, False when the time ran out first.
    """
    deadline = clock() + timeout
    while True:
        left = deadline - clock()
        finished, progress = probe(max(0, min(interval, left)))
        report(progress)
        if finished:
            return True
        if clock() >= deadline:
            return False


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = True

    def run(self, tmp=None, task_vars=None):
        result = super(ActionModule, self).run(tmp, task_vars)
        del tmp
        valid, args = self.validate_argument_spec(argument_spec={
            "jid": {"type": "str", "required": True},
            "progress_file": {"type": "path", "required": True},
            "interval": {"type": "int", "default": 30},
            "timeout": {"type": "int", "required": True},
            "label": {"type": "str"},
        })
        if args["interval"] < 1:
            return dict(result, failed=True, msg="interval must be at least 1 second")
        async_dir = self._remote_expand_user(self.get_shell_option("async_dir", default="~/.ansible_async"))
        results_file = self._connection._shell.join_path(async_dir, args["jid"])
        host = (task_vars or {}).get("inventory_hostname", "")
        prefix = "%s: %s: " % (host, args["label"]) if args.get("label") else "%s: " % host

        def probe(wait_s):
            out = self._low_level_execute_command(probe_command(results_file, args["progress_file"], wait_s),
                                                  executable="/bin/sh")
            return parse_probe(out.get("stdout", ""))

        def report(progress):
            display.display(prefix + progress_line(progress))

        ended = wait_for_job(probe, report, time.time, args["interval"], args["timeout"] + WRAPPER_GRACE_S)
        status = self._execute_module(module_name="ansible.legacy.async_status", task_vars=task_vars,
                                      module_args={"jid": args["jid"], "_async_dir": async_dir})
        result = merge_hash(result, {"ansible_job_id": args["jid"], "results_file": results_file,
                                     "started": 1, "finished": 0})
        result = merge_hash(result, status)
        if not ended and not result.get("finished"):
            result.update(failed=True, msg="the job did not end within %d s" % args["timeout"])
        return result
