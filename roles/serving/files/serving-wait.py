# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Wait until a serving instance (llama-server or vLLM) answers GET /health with 200 and lists its served
model name in GET /v1/models, or fail fast when its unit died.

llama-server answers 503 while it loads the model, vLLM refuses connections until its engine is up; both
answer 200 once they serve. This script polls /health and, between polls, asks systemd about the unit: when
the process exited (the unit is failed, inactive, or waiting to auto-restart) it stops at once instead of
waiting out the timeout. Then it asks /v1/models with the instance's key (a key file for llama-server,
VLLM_API_KEY of the instance's env file for vLLM, both read as root) and checks that the served name is
listed: a rejected key or a wrong name fails at once. On failure it prints the unit state and the last
journal lines, and exits 1. Python 3.6+, standard library only (runs on the managed node).

It reads an env file with the collection's one reader (plugins/module_utils/_serving/env_file.py), which
role serving installs beside it in its package layout (tasks/wait_script.yml), and runs it isolated
(python3 -I -S: no PYTHONPATH, no site-packages), so this directory is the only place it is found.

    serving-wait.py --url http://127.0.0.1:8003 --unit llama-server-qwen.service --model qwen \
        --key-file /etc/llama-server/qwen.key --timeout 900
    serving-wait.py --url http://127.0.0.1:8000 --unit vllm-q.service --model qwen-local \
        --env-file /etc/llama-server/q.env --key-env VLLM_API_KEY --timeout 1800
"""
import argparse
import json
import os
import subprocess
import sys
import time

try:
    from urllib.error import HTTPError, URLError
    from urllib.request import ProxyHandler, Request, build_opener
except ImportError:  # pragma: no cover - Python 2 is not supported
    sys.exit("python3 is required")

# The collection's env-file reader, installed beside this script (the node has no collection on sys.path).
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ansible_collections.llmops.serving.plugins.module_utils._serving.env_file import parse_env_text  # noqa: E402

# The instance is on this node: never through a proxy. urlopen() honours http_proxy and HTTPS_PROXY (a proxy
# in /etc/environment reaches this script through the login session), and a proxy cannot reach 127.0.0.1:
# the gate would fail and the deploy be rolled back. An empty ProxyHandler reads no proxy variable.
OPENER = build_opener(ProxyHandler({}))


def get(url, key=None):
    """-> (status code or None, body text or reason)"""
    request = Request(url)
    if key:
        request.add_header("Authorization", "Bearer %s" % key)
    try:
        response = OPENER.open(request, timeout=5)
        return response.getcode(), response.read().decode("utf-8", "replace")
    except HTTPError as exc:
        return exc.code, exc.reason
    except (URLError, OSError) as exc:
        return None, str(getattr(exc, "reason", exc))


def env_file_value(path, name):
    """`name`'s value in an env file the role wrote, read as its own reader (systemd or docker) reads it."""
    with open(path) as handle:
        return parse_env_text(handle.read()).get(name)


def read_key(args):
    if args.key_file:
        with open(args.key_file) as handle:
            return handle.read().strip()
    if args.env_file and args.key_env:
        return env_file_value(args.env_file, args.key_env)
    return None


def model_ids(body):
    try:
        return [str(m.get("id")) for m in json.loads(body).get("data") or [] if isinstance(m, dict)]
    except (ValueError, AttributeError):
        return None


def check_models(url, model, key):
    """-> (done, error): done when the listing answered; error None when `model` is listed."""
    status, body = get(url + "/v1/models", key)
    if status in (401, 403):
        return True, ("GET /v1/models with the instance's key answered %s: the server does not accept it"
                      % status)
    if status != 200:
        return False, "GET /v1/models answered %s %s" % (status if status is not None else "none", body)
    ids = model_ids(body)
    if ids is None:
        return True, "GET /v1/models did not answer an OpenAI model list: %s" % body[:200]
    if model not in ids:
        return True, "GET /v1/models lists %s, not the served name %s" % (", ".join(ids) or "nothing", model)
    return True, None


def unit_state(unit):
    out = subprocess.Popen(["systemctl", "show", "-p", "ActiveState", "-p", "SubState", "-p", "Result",
                            "-p", "ExecMainStatus", unit], stdout=subprocess.PIPE,
                           universal_newlines=True).communicate()[0]
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def journal(unit, lines, since, tries=5, pause=1.0):
    """The unit's last lines since `since` (epoch): this start's, not the previous process's. journald writes
    what a process printed a little after it exits (seconds on a loaded host): an answer with no line of the
    process's own (empty, or systemd's restart lines only) is asked again, a few times, before it is
    reported as it is."""
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(since))   # a format systemd 219 reads
    text = ""
    for attempt in range(tries):
        proc = subprocess.Popen(["journalctl", "-u", unit, "--since", stamp, "-n", str(lines), "--no-pager",
                                 "-o", "short-iso"],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True)
        text = proc.communicate()[0]
        # the process's own lines, not only systemd's (Scheduled restart, Stopped, Starting)
        if any(line.strip() and not line.startswith("-- ") and " systemd[1]: " not in line
               for line in text.splitlines()):
            return text
        if attempt < tries - 1:
            time.sleep(pause)
    return text


def dead(state):
    return (state.get("ActiveState") in ("failed", "inactive")
            or state.get("SubState") in ("auto-restart", "failed", "dead"))


def wait(args, start):
    """None when healthy and listing the model, else why not."""
    key = read_key(args)
    healthy = False
    while True:
        if not healthy:
            status, text = get(args.url + "/health")
            healthy = status == 200
            last = "last answer: %s %s" % (status if status is not None else "none",
                                           text if status != 200 else "")
        if healthy:
            if not args.model:
                return None
            done, error = check_models(args.url, args.model, key)
            if done:
                return error
            last = error
        state = unit_state(args.unit)
        if dead(state):
            return "the process exited (%s)" % ", ".join("%s=%s" % kv for kv in sorted(state.items()))
        if time.time() - start >= args.timeout:
            if not healthy:
                return "no 200 from %s/health within %ds (%s)" % (args.url, args.timeout, last.strip())
            return "no model list from %s within %ds (%s)" % (args.url, args.timeout, last)
        time.sleep(args.interval)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--unit", required=True)
    parser.add_argument("--model", help="served model name that /v1/models must list")
    parser.add_argument("--key-file", help="the API key in a file (llama-server)")
    parser.add_argument("--env-file", help="the instance's env file that holds the key (vLLM)")
    parser.add_argument("--key-env", help="the key's variable in --env-file (VLLM_API_KEY)")
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--interval", type=float, default=1.0)
    parser.add_argument("--journal-lines", type=int, default=40)
    args = parser.parse_args()

    start = time.time()
    reason = wait(args, start)
    if reason is None:
        print("%s healthy after %.1fs%s" % (args.unit, time.time() - start,
                                            ", serving %s" % args.model if args.model else ""))
        return 0
    print("%s is not healthy: %s" % (args.unit, reason))
    print("--- last %d journal lines of %s ---" % (args.journal_lines, args.unit))
    print(journal(args.unit, args.journal_lines, start - 5).rstrip())
    return 1


if __name__ == "__main__":
    sys.exit(main())
