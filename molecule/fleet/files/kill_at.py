#!/usr/bin/env python3
# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Run a command in its own process group and SIGKILL the whole group at a chosen point (molecule/fleet).

    kill_at.py --mark FILE --log FILE [--health-down URL [--health-wait S]] [--timeout S] -- COMMAND...

The point: FILE appears (callback/fault_marker.py writes it when the run reaches the chosen task), then, with
--health-down, URL stops answering 200 (the restart the run started is under way; at most --health-wait
seconds, then it kills anyway and says so: "health_down": false). Then `kill -9 -<pgid>`, as
an operator's lost session or the OOM killer would end it, and the run is reaped (no zombie: its pid is gone).
Prints one JSON line: {"killed": true, "task", "host", "marked_at", "killed_at", "rc", ...}; exits 1 when
the run ended or the timeout passed before the point (the fault was not injected). Loopback only, proxies
ignored.
"""
import argparse
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request


def healthy(opener, url):
    try:
        with opener.open(url, timeout=0.5) as resp:
            return resp.status == 200
    except Exception:  # noqa: BLE001 - refused, reset, timeout: not answering
        return False


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--mark", required=True)
    parser.add_argument("--log", required=True)
    parser.add_argument("--health-down")
    parser.add_argument("--health-wait", type=float, default=60)
    parser.add_argument("--timeout", type=float, default=300)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    if os.path.exists(args.mark):
        os.unlink(args.mark)
    deadline = time.time() + args.timeout
    with open(args.log, "wb") as log:
        run = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    stage, health_down, marked = "mark", None, None
    while time.time() < deadline and run.poll() is None:
        if stage == "mark" and os.path.exists(args.mark):
            stage, marked = ("health" if args.health_down else "kill"), time.time()
        if stage == "health":
            health_down = not healthy(opener, args.health_down)
            if health_down or time.time() > marked + args.health_wait:
                stage = "kill"
        if stage == "kill":
            os.killpg(run.pid, signal.SIGKILL)
            killed_at = time.time()
            rc = run.wait(30)
            with open(args.mark) as handle:
                task, host, marked_at = handle.read().rstrip("\n").split("\t")
            print(json.dumps({"killed": True, "task": task, "host": None if host == "-" else host,
                              "marked_at": float(marked_at), "killed_at": killed_at, "pid": run.pid, "rc": rc,
                              "health_down": health_down}))
            return 0
        time.sleep(0.05)
    if run.poll() is None:
        os.killpg(run.pid, signal.SIGKILL)
        run.wait(30)
    print(json.dumps({"killed": False, "stage": stage, "rc": run.returncode}))
    return 1


if __name__ == "__main__":
    sys.exit(main())
