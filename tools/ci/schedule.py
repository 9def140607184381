# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The jobs of `bin/llmops-dev test` (= `.ci/run`), run side by side on a 2-core machine, and the table of
where the time went.

    python -m tools.ci.schedule                # every job (JOBS), then the phase table
    python -m tools.ci.schedule unit lint      # only these jobs (and nothing they need)
    python -m tools.ci.schedule --list         # the jobs, what each needs, its expected duration

Each job is a nox session (noxfile.py); a Molecule scenario is the job `molecule:<scenario>`. Jobs start as
soon as what they need has passed and the machine has room: `LLMOPS_CI_CAPACITY` (default 3) units of
load, each job weighing what it keeps busy (the llama.cpp compile and the unit tests weigh 2, a Molecule
scenario that mostly waits on systemd and health checks 1). Among the jobs that are ready, the one with the
longest chain of work behind it starts first (its critical path), measured from the durations the last
green run on this machine recorded (`$LLMOPS_CI_CACHE/durations.json`) or, on a new machine, from the
estimates below. Each job writes its output, every line stamped with the minutes since the job started,
to `.cache/ci-logs/<job>.log`, printed whole when the job ends (interleaved output would be unreadable).
The run stops starting jobs after the first failure, lets the running ones finish, and exits 1.

The table at the end lists the setup phases (`.cache/ci-phases.tsv`, written by bin/llmops-dev) and every
job with its start, duration and result, and for each Molecule scenario how long each of its steps took
(create, prepare, converge, ...), read from the stamped log. Then the faults the fault scenarios injected
(`.cache/faults/<scenario>-<fault>.tsv`), each with what a client saw, what was lost and the seconds to
recover.
"""
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CACHE = os.environ.get("LLMOPS_CACHE_DIR", os.path.join(ROOT, ".cache"))
# Machine-level caches that outlive a clone (a second CI run on the same machine reuses them): the ccache of
# the llama.cpp builds (mounted into the scenario containers at this same path), downloaded wheels, the
# durations of the last green run.
CI_CACHE = os.environ.get("LLMOPS_CI_CACHE") or os.path.join(
    os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
    "llmops.serving", "ci")
LOGS = os.path.join(CACHE, "ci-logs")
PHASES = os.path.join(CACHE, "ci-phases.tsv")
HISTORY = os.path.join(CI_CACHE, "durations.json")


class Job:
    """One nox session. `needs`: jobs that must have passed first; `weight`: load units it keeps busy;
    `estimate`: seconds, used until this machine has measured it."""

    def __init__(self, name, argv, needs=(), weight=1, estimate=300):
        self.name, self.argv, self.needs = name, argv, tuple(needs)
        self.weight, self.estimate = weight, estimate


def _molecule(scenario, needs=(), weight=1, estimate=300):
    return Job("molecule:" + scenario, ["nox", "--no-venv", "-s", "molecule", "--", scenario], needs, weight,
               estimate)


# What builds llama.cpp: llama_cpp pays the cold compile into the shared ccache; the scenarios that build it
# again (each in its own build root) start after it, so their builds are ccache hits.
AFTER_COMPILE = ("molecule:llama_cpp",)
JOBS = (
    Job("lint", ["nox", "--no-venv", "-s", "lint"], estimate=120),
    Job("sanity", ["nox", "--no-venv", "-s", "sanity"], estimate=180),
    # Weight 1 although it runs on both cores: with 2 it waited for two free slots, which the scenarios never
    # left (0.6.0's warm run started it at 26:28, after every scenario, and ended with it alone for 5:41).
    Job("unit", ["nox", "--no-venv", "-s", "unit"], estimate=420),
    _molecule("llama_cpp", weight=2, estimate=900),
    _molecule("serving_llama_cpp", needs=AFTER_COMPILE, estimate=300),
    _molecule("default", needs=AFTER_COMPILE, estimate=600),
    # The L20 twin compiles the CUDA build (nvcc over 144 CUDA objects: ~20 min on 2 idle cores cold, minutes
    # from the machine's ccache), the one CUDA compile of a run: it needs nothing first and has the longest
    # path, so it starts first. Weight 1: most of its time is the scenario around the compile.
    _molecule("l20", estimate=2400),
    _molecule("gpu_host", estimate=180),
    _molecule("model", estimate=240),
    _molecule("vllm", estimate=420),
    _molecule("fleet", estimate=600),
    _molecule("ray", estimate=300),
    # The offline bundle: writes a bundle on the host (a 37 MB llama.cpp tarball, the tiny model), then
    # installs from it on a node without a route out; no compile.
    _molecule("bundle", estimate=300),
    # Serving faults (SIGKILL, crash loop, node restart, GPU lost): builds llama.cpp again (ccache hits), then
    # mostly waits on systemd's restarts and start limit. Weight 1.
    _molecule("faults", needs=AFTER_COMPILE, estimate=900),
    Job("unit_llama_server", ["nox", "--no-venv", "-s", "unit_llama_server"], needs=AFTER_COMPILE,
        estimate=120),
)


def load_history(path=HISTORY):
    try:
        with open(path) as handle:
            data = json.load(handle)
        return {k: float(v) for k, v in data.items() if isinstance(v, (int, float))}
    except (OSError, ValueError, AttributeError):
        return {}


def save_history(durations, path=HISTORY):
    merged = load_history(path)
    merged.update(durations)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".tmp", "w") as handle:
        json.dump(merged, handle, indent=1, sort_keys=True)
    os.replace(path + ".tmp", path)


def select(jobs, names):
    """The named jobs (all when none), with the jobs they need dropped when not named: a partial run does
    not pull in a scenario it did not ask for (a missing prerequisite then costs time, not correctness)."""
    if not names:
        return list(jobs)
    known = {job.name for job in jobs}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise SystemExit("unknown job(s) %s; known: %s" % (", ".join(unknown), ", ".join(sorted(known))))
    chosen = [job for job in jobs if job.name in names]
    for job in chosen:
        job.needs = tuple(n for n in job.needs if n in names)
    return chosen


def critical_paths(jobs, durations):
    """{job: its duration plus the longest chain of jobs that wait for it}."""
    by_name = {job.name: job for job in jobs}
    waiting = {job.name: [j.name for j in jobs if job.name in j.needs] for job in jobs}
    memo = {}

    def path(name):
        if name not in memo:
            own = durations.get(name, by_name[name].estimate)
            memo[name] = own + max([path(n) for n in waiting[name]] or [0])
        return memo[name]

    return {job.name: path(job.name) for job in jobs}


def next_jobs(pending, passed, running_weight, capacity, priority):
    """The jobs to start now, best first: ready (all needs passed), and fitting the room left. A job heavier
    than the whole capacity still starts alone."""
    started, room = [], capacity - running_weight
    for job in sorted(pending, key=lambda j: (-priority[j.name], j.name)):
        if not all(n in passed for n in job.needs):
            continue
        if job.weight <= room or (running_weight == 0 and not started):
            started.append(job)
            room -= job.weight
            running_weight += job.weight
    return started


ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def _stamp(pipe, log, t0):
    """Copies a job's output to its log, each line stamped with minutes:seconds since the job started and
    without terminal colour codes."""
    with open(log, "w") as handle:
        for raw in iter(pipe.readline, b""):
            elapsed = time.time() - t0
            line = ANSI.sub("", raw.decode("utf-8", "replace"))
            handle.write("[%02d:%02d] %s" % (elapsed // 60, elapsed % 60, line))
            handle.flush()


MOLECULE_STEP = re.compile(
    r"^\[(\d+):(\d+)\] .*?\b(?:INFO|WARNING)\b\s+\S+\s+(?:\u279c|->)\s+(\w+):\s+(Executing|Starting)", re.M)


def molecule_steps(text):
    """[(step, seconds)] of one Molecule scenario's stamped log, from the lines where each step starts."""
    marks = [(m.group(3), int(m.group(1)) * 60 + int(m.group(2))) for m in MOLECULE_STEP.finditer(text)]
    end = re.findall(r"^\[(\d+):(\d+)\]", text, re.M)
    last = int(end[-1][0]) * 60 + int(end[-1][1]) if end else 0
    steps = []
    for index, (step, start) in enumerate(marks):
        stop = marks[index + 1][1] if index + 1 < len(marks) else last
        steps.append((step, stop - start))
    return steps


def cpu_times(path="/proc/stat"):
    """(all jiffies, idle jiffies) of the machine's CPUs, idle counting iowait; None where /proc is absent."""
    try:
        with open(path) as handle:
            fields = [int(x) for x in handle.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    return sum(fields), fields[3] + (fields[4] if len(fields) > 4 else 0)


def busy_percent(before, after):
    """How busy the CPUs were between two cpu_times() readings, in percent (None when unknown)."""
    if not before or not after or after[0] <= before[0]:
        return None
    return round(100.0 * (1 - float(after[1] - before[1]) / (after[0] - before[0])))


def compile_records(job, cache=CACHE):
    """[(what, seconds, ccache hits, cacheable calls)] that a scenario's verify step wrote about the compile
    its run made (.cache/ci-<scenario>/compile.tsv: the L20 twin's CUDA compile, cold or warm)."""
    path = os.path.join(cache, "ci-" + job.split(":", 1)[-1], "compile.tsv")
    records = []
    try:
        with open(path) as handle:
            for line in handle:
                parts = line.rstrip("\n").split("\t")
                if len(parts) == 4 and parts[1].isdigit():
                    records.append((parts[0], int(parts[1]), parts[2], parts[3]))
    except OSError:
        pass
    return records


def fault_records(cache=CACHE):
    """[(scenario, fault, injected, what a client saw, what was lost, seconds to recover, mtime)] of the rows
    the fault scenarios wrote (.cache/faults/<scenario>-<fault>.tsv: one line, five tab-separated fields;
    molecule/faults and the others that inject faults on purpose), by scenario and fault. A file that is not
    such a row is left out."""
    folder = os.path.join(cache, "faults")
    try:
        names = sorted(n for n in os.listdir(folder) if n.endswith(".tsv"))
    except OSError:
        return []
    records = []
    for name in names:
        path = os.path.join(folder, name)
        try:
            with open(path) as handle:
                lines = [line for line in handle.read().split("\n") if line.strip()]
            mtime = os.path.getmtime(path)
        except (OSError, UnicodeDecodeError):
            continue
        parts = lines[0].split("\t") if len(lines) == 1 else []
        if len(parts) != 5 or not all(p.strip() for p in parts):
            continue
        records.append((name[:-len(".tsv")].split("-", 1)[0],) + tuple(p.strip() for p in parts) + (mtime,))
    return records


def fault_table(records, since=None):
    """The "== faults ==" table: per fault its recovery time, what was injected, what a client saw and what
    was lost. A row written before `since` (a scenario this run did not run) says so."""
    if not records:
        return ""
    lines = ["", "== faults (what was injected, what a client saw, what was lost, seconds to recover) ==",
             "%-30s %10s" % ("scenario: fault", "recovered")]
    for scenario, fault, injected, client, lost, seconds, mtime in records:
        try:
            took = "%.1f s" % float(seconds)
        except ValueError:
            took = seconds
        stale = "  (an earlier run's)" if since is not None and mtime < since else ""
        lines.append("%-30s %10s%s" % ("%s: %s" % (scenario, fault), took, stale))
        lines += ["    %-9s %s" % (label, text) for label, text in
                  (("injected", injected), ("client", client), ("lost", lost))]
    return "\n".join(lines)


def _fmt(seconds):
    seconds = int(round(seconds))
    return "%d:%02d" % (seconds // 60, seconds % 60)


def read_phases(path=PHASES):
    rows = []
    try:
        with open(path) as handle:
            for line in handle:
                parts = line.rstrip("\n").split("\t")
                if len(parts) == 3:
                    rows.append((parts[0], float(parts[1]), float(parts[2])))
    except (OSError, ValueError):
        pass
    return rows


def table(results, t0, phases=(), logs=LOGS, cpu=None):
    """The phase table: setup phases, then every job in start order with its Molecule steps; with `cpu` (what
    run() measured) how busy the machine's CPUs were while each job ran, and minute by minute: a run whose
    CPUs idle has room for more jobs at once (LLMOPS_CI_CAPACITY), one that is busy throughout does not."""
    cpu = cpu or {}
    lines = ["", "== where the time went (wall clock, minutes:seconds; cpu: machine CPUs busy meanwhile) ==",
             "%-30s %8s %8s  %s" % ("phase", "start", "took", "result")]
    origin = min([start for _, start, _ in phases] + [t0])
    for name, start, stop in phases:
        lines.append("%-30s %8s %8s  %s" % ("setup: " + name, _fmt(start - origin), _fmt(stop - start), "ok"))
    for name, (start, stop, result) in sorted(results.items(), key=lambda kv: kv[1][0]):
        busy = (cpu.get("jobs") or {}).get(name)
        lines.append("%-30s %8s %8s  %s%s" % (name, _fmt(start - origin), _fmt(stop - start), result,
                                              "" if busy is None else "  cpu %d%%" % busy))
        if name.startswith("molecule:"):
            try:
                with open(os.path.join(logs, name.replace(":", "-") + ".log")) as handle:
                    steps = molecule_steps(handle.read())
            except OSError:
                steps = []
            for step, seconds in steps:
                lines.append("%-30s %8s %8s" % ("    " + step, "", _fmt(seconds)))
            for what, seconds, hits, calls in compile_records(name):
                lines.append("%-30s %8s %8s  ccache hits %s of %s"
                             % ("    " + what, "", _fmt(seconds), hits, calls))
    end = max([stop for _, stop, _ in results.values()] + [t0])
    lines.append("%-30s %8s %8s" % ("total", "", _fmt(end - origin)))
    if cpu.get("total") is not None:
        lines.append("machine CPU busy over the jobs: %d%%; per minute: %s"
                     % (cpu["total"], " ".join("%d" % m for m in cpu.get("minutes") or [])))
    return "\n".join(lines)


def run(jobs, capacity, env=None, out=sys.stdout, fail_fast=False, cpu=None):
    """Runs the jobs; returns {job: (start, stop, result)}. After a failure the jobs that do not need the
    failed one still run (one CI log shows every failure, not only the first), unless fail_fast; a job that
    needs a failed job never starts. `cpu` (a dict) receives how busy the machine was: per job, per minute
    and overall (table() prints it)."""
    cpu = {} if cpu is None else cpu
    cpu.update(jobs={}, minutes=[])
    cpu_start = cpu_mark = cpu_times()
    cpu_at_start = {}
    next_minute = time.time() + 60
    os.makedirs(LOGS, exist_ok=True)
    history = load_history()
    priority = critical_paths(jobs, history)
    pending, running, results, passed, failed = list(jobs), {}, {}, set(), []
    t0 = time.time()

    def say(text):
        elapsed = time.time() - t0
        out.write("[%s] %s\n" % (_fmt(elapsed), text))
        out.flush()

    try:
        while pending or running:
            if not (failed and fail_fast):
                weight = sum(job.weight for job, _, _, _ in running.values())
                for job in next_jobs(pending, passed, weight, capacity, priority):
                    pending.remove(job)
                    log = os.path.join(LOGS, job.name.replace(":", "-") + ".log")
                    process = subprocess.Popen(job.argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                               cwd=ROOT, env=env, start_new_session=True)
                    started = time.time()
                    pump = threading.Thread(target=_stamp, args=(process.stdout, log, started), daemon=True)
                    pump.start()
                    running[job.name] = (job, process, started, pump)
                    cpu_at_start[job.name] = cpu_times()
                    say("start %s (%s)" % (job.name, " ".join(job.argv)))
            if not running and not (pending and not failed):
                break
            time.sleep(1)
            if time.time() >= next_minute:
                now = cpu_times()
                cpu["minutes"].append(busy_percent(cpu_mark, now))
                cpu_mark, next_minute = now, next_minute + 60
            for name, (_, process, started, pump) in list(running.items()):
                code = process.poll()
                if code is None:
                    continue
                pump.join()
                stopped = time.time()
                del running[name]
                cpu["jobs"][name] = busy_percent(cpu_at_start.pop(name, None), cpu_times())
                result = "passed" if code == 0 else "FAILED (exit %d)" % code
                results[name] = (started, stopped, result)
                log = os.path.join(LOGS, name.replace(":", "-") + ".log")
                with open(log) as handle:
                    out.write("\n===== %s: %s in %s (log %s) =====\n%s"
                              % (name, result, _fmt(stopped - started), log, handle.read()))
                say("%s %s in %s" % (name, result, _fmt(stopped - started)))
                if code == 0:
                    passed.add(name)
                else:
                    failed.append(name)
        if pending and failed:
            say("not started after the failure of %s: %s"
                % (", ".join(failed), ", ".join(j.name for j in pending)))
    except KeyboardInterrupt:
        for _, process, _, _ in running.values():
            os.killpg(process.pid, signal.SIGTERM)
        raise
    cpu["total"] = busy_percent(cpu_start, cpu_times())
    cpu["minutes"] = [m for m in cpu["minutes"] if m is not None]
    if not failed:
        save_history({name: stop - start for name, (start, stop, _) in results.items()})
    return results


# Lines of a failed job's log that say what failed: pytest's summary lines, Ansible's failed tasks and
# recaps, molecule's step results, a Python traceback's last line.
_FAILURE_LINE = re.compile(r"^(FAILED|ERROR) |fatal: \[|FAILED!|failed=[1-9]|ERROR |Error: |Traceback|"
                           r"^E  +|Timeout|ailed: ")


def failure_digest(name, logs=LOGS, matches=40, tail=30):
    """What a failed job's log says about its failure, short: its failure lines (at most `matches`, the last
    ones) and its last `tail` lines. CI prints the whole log when a job ends, but a CI front end that keeps
    only the end of the output would show the last job's log: this digest comes last, after the table."""
    try:
        with open(os.path.join(logs, name.replace(":", "-") + ".log"), errors="replace") as handle:
            lines = handle.read().splitlines()
    except OSError as error:
        return "== %s: no log (%s) ==" % (name, error)
    found = [line for line in lines if _FAILURE_LINE.search(line.split("] ", 1)[-1])]
    out = ["", "== why %s failed (%d failure lines, the last %d; then the log's last %d lines) =="
           % (name, len(found), min(matches, len(found)), min(tail, len(lines)))]
    out += found[max(len(found) - matches, 0):]
    out.append("-- last lines of %s --" % name)
    out += lines[max(len(lines) - tail, 0):]
    return "\n".join(out)


def main(argv):
    if argv[:1] == ["--list"]:
        history = load_history()
        paths = critical_paths(JOBS, history)
        for job in JOBS:
            print("%-24s weight %d  ~%s  critical path %s  needs %s" % (
                job.name, job.weight, _fmt(history.get(job.name, job.estimate)), _fmt(paths[job.name]),
                ", ".join(job.needs) or "-"))
        return 0
    jobs = select(JOBS, argv)
    capacity = int(os.environ.get("LLMOPS_CI_CAPACITY", "3"))
    fail_fast = os.environ.get("LLMOPS_CI_FAIL_FAST", "") not in ("", "0")
    t0 = time.time()
    cpu = {}
    results = run(jobs, capacity, fail_fast=fail_fast, cpu=cpu)
    print(table(results, t0, read_phases(), cpu=cpu))
    faults = fault_table(fault_records(), since=t0)
    if faults:
        print(faults)
    failed = [name for name, (_, _, result) in results.items() if result != "passed"]
    not_run = [job.name for job in jobs if job.name not in results]
    for name in failed:
        print(failure_digest(name))
    if failed or not_run:
        print("\nfailed: %s%s" % (", ".join(failed) or "none",
                                  ("; not run: " + ", ".join(not_run)) if not_run else ""))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
