# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""download_wait: the progress line, the probe run on the node, and the wait loop (fake clock and probe)."""
import json
import os
import subprocess
import sys

import yaml
from ansible_collections.llmops.serving.plugins.action.download_wait import (
    parse_probe,
    probe_command,
    progress_line,
    wait_for_job,
)

RUNNING = {"bytes_done": 100000000, "bytes_total": 250000000, "percent": 40.0, "rate_mbs": 3.12, "eta_s": 48,
           "state": "downloading", "file": "m.gguf", "updated": 1, "error": None}


def test_progress_line_once_the_size_is_known():
    assert progress_line(RUNNING) == "downloading 40.0% 100.0/250.0 MB, 3.12 MB/s, ETA 48 s"
    assert progress_line(dict(RUNNING, eta_s=None, rate_mbs=0.0)) == \
        "downloading 40.0% 100.0/250.0 MB, 0.0 MB/s, ETA ? s"


def test_progress_line_before_the_size_is_known():
    assert progress_line(dict(RUNNING, bytes_total=0, state="resolving")) == "resolving"
    assert progress_line({"bytes_total": 0}) == "starting"
    assert progress_line(None) == "starting"


def test_parse_probe():
    assert parse_probe('{"finished": true, "progress": null}\n') == (True, None)
    running = '{"finished": false, "progress": %s}\n' % json.dumps(RUNNING)
    assert parse_probe('noise\n' + running) == (False, RUNNING)
    # a progress file caught half-written (or garbage) is unknown, not a failure
    assert parse_probe('{"finished": false, "progress": {"bytes_do\n') == (False, None)
    assert parse_probe("") == (False, None)
    assert parse_probe('{"finished": false, "progress": 3}') == (False, None)


class FakeNode:
    """A node whose job ends after `ends_after` seconds; a probe waits like the real one."""

    def __init__(self, ends_after):
        self.now = 0.0
        self.ends_after = ends_after
        self.waits = []

    def clock(self):
        return self.now

    def probe(self, wait_s):
        self.waits.append(wait_s)
        if self.now + wait_s >= self.ends_after:
            self.now = max(self.now, float(self.ends_after))
            return True, {"state": "done"}
        self.now += wait_s
        return False, {"state": "downloading"}


def test_wait_reports_every_interval_and_ends_with_the_job():
    node, lines = FakeNode(ends_after=95), []
    assert wait_for_job(node.probe, lines.append, node.clock, interval=30, timeout=1000) is True
    assert node.waits == [30, 30, 30, 30]
    assert node.now == 95  # not the next whole interval
    assert [p["state"] for p in lines] == ["downloading"] * 3 + ["done"]


def test_wait_gives_up_at_the_timeout():
    node, lines = FakeNode(ends_after=10 ** 6), []
    assert wait_for_job(node.probe, lines.append, node.clock, interval=30, timeout=100) is False
    assert node.waits == [30, 30, 30, 10]  # the last wait is cut to the deadline
    assert len(lines) == 4


def _probe(tmp_path, job=None, progress=None, wait=0):
    job_file, progress_file = tmp_path / "job record", tmp_path / "progress's.json"
    if job is not None:
        job_file.write_text(job)
    if progress is not None:
        progress_file.write_text(progress)
    out = subprocess.run(["/bin/sh", "-c", probe_command(str(job_file), str(progress_file), wait)],
                         stdout=subprocess.PIPE, check=True, universal_newlines=True).stdout
    return parse_probe(out)


def test_probe_on_the_node(tmp_path):
    started = '{"started": 1, "finished": 0, "ansible_job_id": "j1"}'
    assert _probe(tmp_path) == (False, None)  # the wrapper has not written its record yet
    assert _probe(tmp_path, job=started, progress=json.dumps(RUNNING)) == (False, RUNNING)
    assert _probe(tmp_path, job='{"changed": false, "paths": ["/m"]}') == (True, RUNNING)


def test_probe_waits_for_the_interval_while_the_job_runs(tmp_path):
    import time
    t0 = time.time()
    assert _probe(tmp_path, job='{"started": 1, "finished": 0}', wait=1) == (False, None)
    assert time.time() - t0 >= 1


def test_the_action_prints_progress_and_returns_the_job_result(tmp_path):
    """A real async job on localhost that writes a progress file, then the action waits for it."""
    from tests.helpers import run_local_playbook
    progress = tmp_path / "progress.json"
    steps = [dict(RUNNING, bytes_done=n * 50000000, percent=20.0 * n) for n in (1, 2, 3)]
    # each step held 2 s: under load the action's first probe can come seconds after the job started
    script = "; ".join("echo %s > %s; sleep 2" % (json.dumps(json.dumps(s)), progress) for s in steps)
    play = tmp_path / "play.yml"
    play.write_text(yaml.safe_dump([{
        "hosts": "localhost", "connection": "local", "gather_facts": False,
        "vars": {"ansible_python_interpreter": sys.executable},
        "tasks": [
            {"name": "Start a job that writes progress", "ansible.builtin.shell": script + "; echo fin",
             "async": 60, "poll": 0, "register": "job", "changed_when": False},
            {"name": "Wait for it", "llmops.serving.download_wait": {
                "jid": "{{ job.ansible_job_id }}", "progress_file": str(progress), "interval": 1,
                "timeout": 60, "label": "tiny"}, "register": "waited"},
            {"name": "Keep the result", "ansible.builtin.copy": {
                "content": "{{ waited | to_json }}", "dest": str(tmp_path / "result.json"), "mode": "0600"}},
        ]}]))
    result, stats = run_local_playbook(play, os.path.dirname(sys.executable))
    out = result.stdout + result.stderr
    assert stats.get("failed") == 0, out
    # whichever step the first probe finds (when it comes depends on the machine's load)
    printed = ["localhost: tiny: downloading %.1f%% %.1f/250.0 MB, 3.12 MB/s, ETA 48 s" % (20.0 * n, 50.0 * n)
               for n in (1, 2, 3)]
    assert any(line in out for line in printed), out
    waited = json.loads((tmp_path / "result.json").read_text())
    assert waited["finished"] == 1 and waited["stdout"] == "fin", waited
