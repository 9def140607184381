# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Wait until a llama-server instance answers GET /health with 200, or fail fast when its unit died.

llama-server answers 503 while it loads the model and 200 once it serves. This script polls /health and,
between polls, asks systemd about the unit: when the process exited (the unit is failed, inactive, or waiting
to auto-restart) it stops at once instead of waiting out the timeout. On failure it prints the unit state and
the last journal lines, and exits 1. Python 3.6+, standard library only (runs on the managed node).

    llama-server-wait.py --url http://127.0.0.1:8003 --unit llama-server-qwen.service --timeout 900
"""
import argparse
import subprocess
import sys
import time

try:
    from urllib.error import HTTPError, URLError
    from urllib.request import urlopen
except ImportError:  # pragma: no cover - Python 2 is not supported
    sys.exit("python3 is required")


def probe(url):
    """-> (status code or None, short text)"""
    try:
        response = urlopen(url + "/health", timeout=5)
        return response.getcode(), "ok"
    except HTTPError as exc:
        return exc.code, exc.reason
    except (URLError, OSError) as exc:
        return None, str(getattr(exc, "reason", exc))


def unit_state(unit):
    out = subprocess.Popen(["systemctl", "show", "-p", "ActiveState", "-p", "SubState", "-p", "Result",
                            "-p", "ExecMainStatus", unit], stdout=subprocess.PIPE,
                           universal_newlines=True).communicate()[0]
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def journal(unit, lines, since):
    """The unit's last lines since `since` (epoch): this start's, not the previous process's."""
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(since))   # a format systemd 219 reads
    proc = subprocess.Popen(["journalctl", "-u", unit, "--since", stamp, "-n", str(lines), "--no-pager",
                             "-o", "short-iso"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True)
    return proc.communicate()[0]


def dead(state):
    return (state.get("ActiveState") in ("failed", "inactive")
            or state.get("SubState") in ("auto-restart", "failed", "dead"))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--unit", required=True)
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--interval", type=float, default=1.0)
    parser.add_argument("--journal-lines", type=int, default=40)
    args = parser.parse_args()

    start = time.time()
    last = (None, "not polled")
    while True:
        last = probe(args.url)
        if last[0] == 200:
            print("%s healthy after %.1fs" % (args.unit, time.time() - start))
            return 0
        state = unit_state(args.unit)
        if dead(state):
            reason = "the process exited (%s)" % ", ".join("%s=%s" % kv for kv in sorted(state.items()))
            break
        if time.time() - start >= args.timeout:
            reason = "no 200 from %s/health within %ds (last answer: %s %s)" % (
                args.url, args.timeout, last[0] if last[0] is not None else "none", last[1])
            break
        time.sleep(args.interval)
    print("%s is not healthy: %s" % (args.unit, reason))
    print("--- last %d journal lines of %s ---" % (args.journal_lines, args.unit))
    print(journal(args.unit, args.journal_lines, start - 5).rstrip())
    return 1


if __name__ == "__main__":
    sys.exit(main())
