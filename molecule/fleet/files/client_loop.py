#!/usr/bin/env python3
# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""A bounded client loop through the gateway (loopback only), for molecule/fleet's rolling update.

    client_loop.py --url http://127.0.0.1:18210 --key-file F --model M --stop-file S --out O [--max-seconds N]

Sends one chat completion after another until --stop-file exists (or --max-seconds pass), records every
request (time, status, error) and writes {"requests", "failed", "failures": [...]} as JSON to --out.
"""
import argparse
import json
import os
import time
import urllib.error
import urllib.parse
import urllib.request


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--key-file", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--stop-file", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--max-seconds", type=float, default=600)
    parser.add_argument("--pause", type=float, default=0.05)
    args = parser.parse_args()
    host = urllib.parse.urlparse(args.url).hostname
    if host not in ("127.0.0.1", "localhost", "::1"):
        raise SystemExit("client_loop.py talks to loopback only, not %s" % host)
    with open(args.key_file) as handle:
        key = handle.read().strip()
    body = json.dumps({"model": args.model, "max_tokens": 4,
                       "messages": [{"role": "user", "content": "hello fleet"}]}).encode("utf-8")
    records, deadline = [], time.time() + args.max_seconds
    while not os.path.exists(args.stop_file) and time.time() < deadline:
        request = urllib.request.Request(args.url.rstrip("/") + "/v1/chat/completions", data=body,
                                         method="POST", headers={"Content-Type": "application/json",
                                                  "Authorization": "Bearer " + key})
        started = time.time()
        record = {"t": round(started, 3)}
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                record["status"] = response.status
                json.loads(response.read().decode("utf-8"))
        except urllib.error.HTTPError as exc:
            record["status"], record["error"] = exc.code, exc.read().decode("utf-8", "replace")[:200]
        except Exception as exc:  # pylint: disable=broad-except  (every failure is a failed request)
            record["status"], record["error"] = None, "%s: %s" % (type(exc).__name__, exc)
        record["seconds"] = round(time.time() - started, 3)
        records.append(record)
        time.sleep(args.pause)
    failures = [r for r in records if r.get("status") != 200]
    with open(args.out, "w") as handle:
        json.dump({"requests": len(records), "failed": len(failures), "failures": failures[:20]}, handle)


if __name__ == "__main__":
    main()
