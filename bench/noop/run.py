#!/usr/bin/env python3
# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""No-op benchmark: a second site.yml that changes nothing, beside a cold one, on the local demo.

1. cold: `tests/demo/run.sh down`, then `tests/demo/run.sh up` - a new node container (systemd, fake 4x L20),
   its prepare playbook, then site.yml from nothing: driver check, llama.cpp build, model download from the
   loopback hub, the unit, validate's measurement. The build starts from an empty ccache of its own (under
   --logs) and a build directory inside the new container, as a user's first run on a new box does: the
   machine's ccache and the demo's build directory (.cache/ci-llama), which the tests keep warm, would make
   "cold" a rebuild from cache (--warm-ccache measures that instead, and says so);
2. no-op: `tests/demo/run.sh up` again - site.yml on the node as the first run left it (same ccache setting).

Both with ANSIBLE_CALLBACKS_ENABLED=ansible.posix.profile_tasks, their output kept in --logs (cold.log,
noop.log). Only site.yml's own duration counts (profile_tasks' running total at its end; the prepare playbook
of the cold run is not part of it). Goal: the no-op run takes at most 3% of the cold one, changes nothing
(changed=0 on the node) and fails nothing. Prints both durations, the ratio, the no-op run's plays and its
slowest tasks (where the time of a run that does nothing still goes).

Usage: python -m bench noop [--logs DIR] [--goal 0.03] [--warm-ccache] [--noop-only] [--parse-only]
  --warm-ccache the cold run's build reuses the machine's ccache (a developer's second demo, not a first run)
  --noop-only   keep the demo as it is (it must be up): only the no-op run, compared with cold.log in --logs
  --parse-only  run nothing: compare cold.log and noop.log in --logs (a run made earlier, or elsewhere)
Needs docker, the test image llmops-test/debian12 and what `bin/llmops-dev demo` needs (tests/demo/run.sh);
the cold run takes minutes (about 15 on a fresh machine, less with a warm ccache).
"""
import argparse
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from bench.noop import profile  # noqa: E402

HOST = "llmops-local-node"
# site.yml's last play (playbooks/validate.yml): the run that has it is site.yml's, not the prepare playbook's
LAST_PLAY = "Benchmark the serving instances, write the reports on the controller and gate on the figures"
DEMO = os.path.join(ROOT, "tests", "demo", "run.sh")
# Not a mounted path: the build directory lives and dies with the demo's node container.
COLD_BUILD_ROOT = "/var/tmp/llmops-bench-build"


def cfg_callbacks():
    """callbacks_enabled of the checkout's ansible.cfg ("" when it has none)."""
    import configparser

    parser = configparser.ConfigParser(interpolation=None)
    parser.read(os.path.join(ROOT, "ansible.cfg"))
    return parser.get("defaults", "callbacks_enabled", fallback="")


def run_logged(argv, log_path, extra_env=None):
    """Run argv with profile_tasks on, its output to the terminal and to log_path; (returncode, seconds)."""
    env = dict(os.environ)
    env.update(extra_env or {})
    # ANSIBLE_CALLBACKS_ENABLED replaces ansible.cfg's callbacks_enabled: start from the checkout's list
    # (llmops.serving.preload) as a user's run has it
    enabled = env.get("ANSIBLE_CALLBACKS_ENABLED", cfg_callbacks())
    callbacks = [c.strip() for c in enabled.split(",") if c.strip()]
    if "ansible.posix.profile_tasks" not in callbacks:
        callbacks.append("ansible.posix.profile_tasks")
    env["ANSIBLE_CALLBACKS_ENABLED"] = ",".join(callbacks)
    env.setdefault("ANSIBLE_NOCOLOR", "1")
    start = time.monotonic()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                universal_newlines=True)
        for line in proc.stdout:
            sys.stdout.write(line)
            log.write(line)
        proc.wait()
    return proc.returncode, time.monotonic() - start


def load(log_path, what):
    if not os.path.exists(log_path):
        sys.exit("%s: no %s (run without --parse-only first)" % (what, log_path))
    with open(log_path) as handle:
        run = profile.site_run(profile.playbooks(handle.read()), LAST_PLAY)
    if run is None:
        sys.exit("%s: no site.yml run with profile_tasks in %s" % (what, log_path))
    return run


def report(cold, noop, goal):
    verdict = profile.compare(cold, noop, goal, HOST)
    print("\n=== no-op site.yml vs cold site.yml on the local demo (%s)" % HOST)
    print("| run | site.yml s | changed | failed |")
    print("|---|---|---|---|")
    for name, run in (("cold", cold), ("no-op", noop)):
        recap = run.recap.get(HOST) or {}
        print("| %s | %.1f | %s | %s |" % (name, run.seconds, recap.get("changed", "-"),
                                           recap.get("failed", "-")))
    if verdict["ratio"] is not None:
        print("no-op / cold = %.4f (%.1f%%), goal <= %.1f%%" % (verdict["ratio"], 100 * verdict["ratio"],
                                                              100 * goal))
    print("\nno-op run by play:")
    for play, seconds in noop.play_durations():
        print("  %7.1f s  %s" % (seconds, play))
    print("\nno-op run, slowest tasks:")
    for seconds, task in noop.tasks[:15]:
        print("  %7.2f s  %s" % (seconds, task))
    for problem in verdict["problems"]:
        print("GOAL MISSED: %s" % problem)
    if verdict["ok"]:
        print("goal met")
    return verdict["ok"]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--logs", default=os.path.join(ROOT, ".cache", "bench-noop"))
    parser.add_argument("--goal", type=float, default=0.03)
    parser.add_argument("--noop-only", action="store_true")
    parser.add_argument("--parse-only", action="store_true")
    parser.add_argument("--warm-ccache", action="store_true")
    args = parser.parse_args(argv)
    os.makedirs(args.logs, exist_ok=True)
    cold_log, noop_log = os.path.join(args.logs, "cold.log"), os.path.join(args.logs, "noop.log")
    # tests/demo/run.sh mounts $LLMOPS_CI_CACHE/ccache into the node and the local inventory builds with it:
    # a cache directory of the benchmark's own makes the first run's compile a real one.
    env, extra = {}, []
    if not args.warm_ccache:
        env["LLMOPS_CI_CACHE"] = os.path.join(os.path.abspath(args.logs), "cache")
        extra = ["-e", "llama_cpp_build_root=" + COLD_BUILD_ROOT]
    if not args.parse_only:
        if not args.noop_only:
            subprocess.check_call([DEMO, "down"], cwd=ROOT)
            if not args.warm_ccache:
                subprocess.check_call(["rm", "-rf", env["LLMOPS_CI_CACHE"]])
                os.makedirs(os.path.join(env["LLMOPS_CI_CACHE"], "ccache"))
            print("cold run: %s" % ("the machine's ccache (--warm-ccache)" if args.warm_ccache
                                    else "an empty ccache in %s" % env["LLMOPS_CI_CACHE"]))
            rc, wall = run_logged([DEMO, "up"] + extra, cold_log, env)
            print("cold: exit %d after %.0f s (container, prepare and site.yml)" % (rc, wall))
            if rc:
                sys.exit("the cold run failed: see %s" % cold_log)
        rc, wall = run_logged([DEMO, "up"] + extra, noop_log, env)
        print("no-op: exit %d after %.0f s" % (rc, wall))
        if rc:
            sys.exit("the no-op run failed: see %s" % noop_log)
    return 0 if report(load(cold_log, "cold"), load(noop_log, "no-op"), args.goal) else 1


if __name__ == "__main__":
    sys.exit(main())
