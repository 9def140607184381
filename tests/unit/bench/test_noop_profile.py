# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""bench/noop: profile_tasks output read back (durations, recap, plays, slowest tasks; several playbooks in
one log, the log file's line prefixes) and the verdict no-op / cold, on synthetic runs in profile_tasks'
format and through `python -m bench noop --parse-only`."""
import os
import subprocess
import sys

import pytest

from bench.noop import profile
from tests.helpers import ROOT

HOST = "llmops-local-node"
LAST = "Benchmark the serving instances, write the reports on the controller and gate on the figures"


def clock(seconds):
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return "%d:%02d:%06.3f" % (hours, minutes, secs)


def fake_run(plays, host=HOST, changed=0, failed=0):
    """profile_tasks' output of one ansible-playbook run: plays = [(play, [(task, seconds)])]."""
    lines, total, previous, tasks = [], 0.0, 0.0, []
    for play, play_tasks in plays:
        lines += ["", "PLAY [%s] %s" % (play, "*" * 20), ""]
        for task, seconds in play_tasks:
            lines += ["TASK [%s] %s" % (task, "*" * 10),
                      "Wednesday 02 December 2026  05:26:16 +0000 (%s)       %s **** " % (clock(previous),
                                                                                         clock(total)),
                      "ok: [%s]" % host, ""]
            total += seconds
            previous = seconds
            tasks.append((seconds, task))
    lines += ["PLAY RECAP %s" % ("*" * 20),
              "%s          : ok=12   changed=%d    unreachable=0    failed=%d    skipped=9    rescued=0    "
              "ignored=0   " % (host, changed, failed), "",
              "Wednesday 02 December 2026  05:47:22 +0000 (%s)       %s **** "
              % (clock(previous), clock(total)),
              "=" * 79]
    lines += ["%s %s %.2fs" % (task, "-" * 10, seconds) for seconds, task in sorted(tasks, reverse=True)]
    return "\n".join(lines) + "\n"


PREPARE = fake_run([("Prepare the node", [("Install the fake nvidia-smi", 12.0)])])
COLD = fake_run([("Inspect the GPUs and plan the GPU host stage", [("Gathering Facts", 3.0)]),
                 ("Build (or reuse) the pinned engines", [("Compile llama.cpp", 700.0)]),
                 (LAST, [("Benchmark the instance on the node", 40.0)])], changed=40)
NOOP = fake_run([("Inspect the GPUs and plan the GPU host stage", [("Gathering Facts", 3.0),
                                                                   ("Read the GPUs", 1.25)]),
                 ("Build (or reuse) the pinned engines", [("Compute the build identity", 2.5)]),
                 (LAST, [("Read the last report kept on the node", 0.75)])])


def test_one_run_durations_recap_plays_and_slowest_tasks():
    (run,) = profile.playbooks(NOOP)
    assert run.seconds == pytest.approx(7.5)
    assert run.recap == {HOST: {"ok": 12, "changed": 0, "unreachable": 0, "failed": 0, "skipped": 9,
                                "rescued": 0, "ignored": 0}}
    assert run.tasks == [(3.0, "Gathering Facts"), (2.5, "Compute the build identity"),
                         (1.25, "Read the GPUs"), (0.75, "Read the last report kept on the node")]
    assert run.play_durations() == [("Inspect the GPUs and plan the GPU host stage", 4.25),
                                    ("Build (or reuse) the pinned engines", 2.5), (LAST, 0.75)]


def test_a_log_with_the_prepare_playbook_first_gives_site_yml_by_its_last_play():
    runs = profile.playbooks(PREPARE + "\nsome output of tests/demo/run.sh\n" + COLD)
    assert [round(r.seconds, 1) for r in runs] == [12.0, 743.0]
    assert profile.site_run(runs, LAST) is runs[1]
    assert profile.site_run(runs[:1], LAST) is None


def test_the_log_files_line_prefixes_are_read_through():
    prefixed = "".join("2026-12-02 05:26:16,015 p=32703 u=root n=ansible | %s\n" % line
                       for line in NOOP.splitlines())
    (run,) = profile.playbooks(prefixed)
    assert run.seconds == pytest.approx(7.5) and run.recap[HOST]["changed"] == 0 and len(run.tasks) == 4


def test_running_totals_past_an_hour_and_a_run_cut_short():
    text = ("PLAY [p] ***\nTASK [t] ***\nWednesday 02 December 2026  05:26:16 +0000 (0:00:01.000)       "
            "1:02:03.500 **** \n")
    (run,) = profile.playbooks(text)
    assert run.seconds == pytest.approx(3723.5) and run.recap == {} and run.plays == [("p", 3723.5)]


def test_verdict_ratio_and_what_misses_the_goal():
    cold = profile.site_run(profile.playbooks(COLD), LAST)
    noop = profile.site_run(profile.playbooks(NOOP), LAST)
    verdict = profile.compare(cold, noop, 0.03, HOST)
    assert verdict == {"cold_s": 743.0, "noop_s": 7.5, "ratio": round(7.5 / 743.0, 4), "goal": 0.03,
                       "changed": 0, "problems": [], "ok": True}
    tight = profile.compare(cold, noop, 0.01, HOST)                      # 7.5 / 743 = 1.009%
    assert tight["ok"] is False and tight["problems"] == [
        "the no-op run takes 1.0% of the cold run, the goal is at most 1.0%"]
    changed = profile.playbooks(fake_run([(LAST, [("Write", 1.0)])], changed=2, failed=1))[0]
    problems = profile.compare(cold, changed, 0.03, HOST)["problems"]
    assert problems == ["the no-op run changed 2 task(s) on llmops-local-node (it must change nothing)",
                        "the no-op run failed on llmops-local-node"]
    assert "no recap line for other" in profile.compare(cold, noop, 0.03, "other")["problems"][0]


def _bench(logs, *args):
    return subprocess.run([sys.executable, "-m", "bench", "noop", "--parse-only", "--logs", str(logs)]
                          + list(args), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          universal_newlines=True, timeout=120)


def test_python_m_bench_noop_prints_the_ratio_and_exits_on_the_goal(tmp_path):
    (tmp_path / "cold.log").write_text(PREPARE + COLD)
    (tmp_path / "noop.log").write_text(NOOP)
    result = _bench(tmp_path)
    assert result.returncode == 0, result.stdout
    assert "| cold | 743.0 | 40 | 0 |" in result.stdout and "| no-op | 7.5 | 0 | 0 |" in result.stdout
    assert "no-op / cold = 0.0101 (1.0%), goal <= 3.0%" in result.stdout
    assert "     3.00 s  Gathering Facts" in result.stdout and "goal met" in result.stdout
    missed = _bench(tmp_path, "--goal", "0.005")
    assert missed.returncode == 1 and "GOAL MISSED: the no-op run takes 1.0% of the cold run" in missed.stdout
    os.remove(str(tmp_path / "noop.log"))
    assert _bench(tmp_path).returncode != 0
