# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Read the output of ansible-playbook runs made with the ansible.posix.profile_tasks callback.

    playbooks(text)     -> one Run per ansible-playbook invocation in the text (split at its summary)
    Run.seconds         -> its duration (profile_tasks' running total at the end)
    Run.recap           -> {host: {ok, changed, unreachable, failed, skipped, rescued, ignored}}
    Run.tasks           -> [(seconds, task name)] of its summary, slowest first
    Run.plays           -> [(play name, seconds)] in order (the running total where each play starts)
    Run.has_play(name)  -> whether a play of that name ran
    compare(cold, noop, goal) -> the figures the benchmark prints and its verdict

profile_tasks prints before each task and once at the end of a run a line such as
    Wednesday 02 December 2026  05:26:16 +0000 (0:00:00.178)       0:00:00.178 ****
(the previous task's duration, then the running total), and after the recap a summary of the tasks, slowest
first: `<task name> ------- 1.23s`. A log can hold several runs (tests/demo/run.sh runs a prepare playbook
before site.yml on a new node): each ends with its recap and summary.
"""
import re

# (previous task's duration)   running total, which may start with "N day(s), "
STAMP = re.compile(r"\((\d+):(\d\d):(\d\d(?:\.\d+)?)\)\s+(?:(\d+) days?, )?(\d+):(\d\d):(\d\d(?:\.\d+)?)"
                   r"\s+\*+\s*$")
PLAY = re.compile(r"^PLAY \[(.*)\] \**\s*$")
RECAP_LINE = re.compile(r"^(\S+)\s*:\s*((?:\w+=\d+\s*)+)$")
SUMMARY_TASK = re.compile(r"^(.*\S) -+ (\d+(?:\.\d+)?)s\s*$")
RULE = re.compile(r"^=+\s*$")
# ANSIBLE_LOG_PATH files prefix every line: "2026-12-02 05:26:16,015 p=32703 u=root n=ansible | "
LOG_PREFIX = re.compile(r"^\d{4}-\d\d-\d\d [\d:,.]+ p=\d+ u=\S* n=\S+ \| ")


def _seconds(hours, minutes, seconds, days=None):
    return int(days or 0) * 86400 + int(hours) * 3600 + int(minutes) * 60 + float(seconds)


class Run(object):
    """One ansible-playbook invocation as profile_tasks printed it."""

    def __init__(self):
        self.seconds = 0.0
        self.recap = {}
        self.tasks = []
        self.plays = []

    def has_play(self, name):
        return any(play == name for play, _start in self.plays)

    def play_durations(self):
        """[(play, seconds)]: from each play's start to the next one's (the last to the run's end)."""
        out = []
        for index, (play, start) in enumerate(self.plays):
            end = self.plays[index + 1][1] if index + 1 < len(self.plays) else self.seconds
            out.append((play, round(max(0.0, end - start), 3)))
        return out


def playbooks(text):
    """The runs in `text`, in order. A run ends with its summary (the `=====` rule and the task lines after
    the recap); text after the last summary that holds a recap is a run that did not finish its summary."""
    runs = []
    run = Run()
    total = 0.0
    pending_play = None
    in_recap = in_summary = False
    for raw in text.splitlines():
        line = LOG_PREFIX.sub("", raw)
        play = PLAY.match(line)
        if play:
            if in_summary:
                runs.append(run)
                run, total, in_summary = Run(), 0.0, False
            pending_play = play.group(1)
            in_recap = False
            continue
        stamp = STAMP.search(line)
        if stamp:
            total = _seconds(stamp.group(5), stamp.group(6), stamp.group(7), stamp.group(4))
            run.seconds = max(run.seconds, total)
            if pending_play is not None:
                # the running total printed as the play's first task starts is where the play starts
                run.plays.append((pending_play, round(total, 3)))
                pending_play = None
            continue
        if line.startswith("PLAY RECAP"):
            in_recap = True
            continue
        if in_recap:
            recap = RECAP_LINE.match(line.strip())
            if recap:
                run.recap[recap.group(1)] = dict((k, int(v)) for k, v in
                                                 (item.split("=") for item in recap.group(2).split()))
                continue
            if RULE.match(line):
                in_recap, in_summary = False, True
            continue
        if in_summary:
            task = SUMMARY_TASK.match(line)
            if task:
                run.tasks.append((float(task.group(2)), task.group(1)))
    if run.recap or run.plays:
        if pending_play is not None:
            run.plays.append((pending_play, run.seconds))
        runs.append(run)
    for item in runs:
        item.tasks.sort(key=lambda pair: -pair[0])
    return runs


def site_run(runs, play_name):
    """The last run that has the play `play_name` (site.yml's last play), or None."""
    for run in reversed(runs):
        if run.has_play(play_name):
            return run
    return None


def compare(cold, noop, goal, host):
    """{cold_s, noop_s, ratio, goal, changed, failed, ok, problems}: the no-op run's share of the cold one,
    and what keeps it from meeting the goal (too slow, something changed or failed on `host`)."""
    problems = []
    ratio = noop.seconds / cold.seconds if cold.seconds > 0 else None
    recap = noop.recap.get(host)
    if ratio is None:
        problems.append("the cold run has no duration (was profile_tasks enabled?)")
    elif ratio > goal:
        problems.append("the no-op run takes %.1f%% of the cold run, the goal is at most %.1f%%"
                        % (100 * ratio, 100 * goal))
    if recap is None:
        problems.append("the no-op run has no recap line for %s" % host)
    else:
        if recap.get("changed"):
            problems.append("the no-op run changed %d task(s) on %s (it must change nothing)"
                            % (recap["changed"], host))
        if recap.get("failed") or recap.get("unreachable"):
            problems.append("the no-op run failed on %s" % host)
    cold_recap = cold.recap.get(host) or {}
    if cold_recap.get("failed") or cold_recap.get("unreachable"):
        problems.append("the cold run failed on %s" % host)
    return {"cold_s": round(cold.seconds, 3), "noop_s": round(noop.seconds, 3),
            "ratio": round(ratio, 4) if ratio is not None else None, "goal": goal,
            "changed": (recap or {}).get("changed"), "problems": problems, "ok": not problems}
