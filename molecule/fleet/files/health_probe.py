#!/usr/bin/env python3
# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Probe serving endpoints' /health every --interval seconds until --stop-file exists (bounded by
--max-seconds), for molecule/fleet's faults: how long no instance answered.

    health_probe.py --url http://127.0.0.1:18202/health [--url ...] --stop-file S --out O [--interval 0.2]

Writes {"rounds", "interval", "down_s": seconds during which no URL answered 200, "down_by_url": {url: s},
"outages": [[start, end], ...] (epoch)} as JSON to --out. A round in which no URL answered counts as the time
from its start to the next round's. Loopback only, proxies ignored.
"""
import argparse
import json
import os
import time
import urllib.request


def answers(opener, url):
    try:
        with opener.open(url, timeout=0.5) as resp:
            return resp.status == 200
    except Exception:  # noqa: BLE001 - refused, reset, timeout, 5xx: not answering
        return False


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", action="append", required=True)
    parser.add_argument("--stop-file", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--interval", type=float, default=0.2)
    parser.add_argument("--max-seconds", type=float, default=900)
    args = parser.parse_args()
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    end = time.time() + args.max_seconds
    rounds, down, by_url, outages = 0, 0.0, dict((u, 0.0) for u in args.url), []
    last = None     # (start, {url: up}) of the round before
    while time.time() < end and not os.path.exists(args.stop_file):
        start = time.time()
        up = dict((u, answers(opener, u)) for u in args.url)
        if last is not None:
            span = start - last[0]
            for url, ok in last[1].items():
                by_url[url] += 0 if ok else span
            if not any(last[1].values()):
                down += span
                if outages and outages[-1][1] == last[0]:
                    outages[-1][1] = start
                else:
                    outages.append([last[0], start])
        last = (start, up)
        rounds += 1
        time.sleep(max(0.0, args.interval - (time.time() - start)))
    with open(args.out + ".tmp", "w") as handle:
        json.dump({"rounds": rounds, "interval": args.interval, "down_s": round(down, 2),
                   "down_by_url": dict((u, round(s, 2)) for u, s in by_url.items()),
                   "outages": [[round(a, 2), round(b, 2)] for a, b in outages]}, handle)
    os.rename(args.out + ".tmp", args.out)


if __name__ == "__main__":
    main()
