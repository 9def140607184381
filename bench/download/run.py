#!/usr/bin/env python3
# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Download benchmark: llmops.serving model_download vs curl / aria2c / sha256sum, side by side.

Starts the fake hub (tests/fixtures/fake_hub) in its own process on 127.0.0.1, generates the model
files in a temp dir, and measures in one run:

1. per-connection rate cap on the hub (a capped mirror/CDN): model_download with 8 connections vs
   ``curl -L -C -`` (goal: >= 4x faster) and vs ``aria2c -x8 -s8`` (printed; ~1.0 is parity, and
   model_download also verifies the sha256 while aria2c does not);
2. no cap: model_download (download + sha256 verification) vs ``curl`` followed by ``sha256sum``
   (goal: time ratio <= 0.8, i.e. hashing overlaps the download);
3. re-run on the verified file (sidecar fast path, includes the hub HEAD for the commit check) vs
   ``sha256sum`` of the file (goal: < 1%).

model_download is timed as the in-process call of its logic (plugins/module_utils/download.run), the
same code the module runs, without Python/Ansible start-up.  Every measurement runs ``--repeat`` times
(default 2) and the best is kept (the box is shared).  Exit status 1 when a goal fails.

Usage: .venv/bin/python bench/download/run.py [--size-mib 512] [--capped-size-mib 128] [--rate-mbs 8]
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "collections"))
sys.path.insert(0, ROOT)

from ansible_collections.llmops.serving.plugins.module_utils._download import fetch as dl  # noqa: E402

from tests.fixtures.fake_hub.server import write_random_file  # noqa: E402

MIB = 1 << 20


def sh(cmd):
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def timed(fn, repeat, cleanup=None):
    best = None
    out = None
    for _ in range(repeat):
        if cleanup:
            cleanup()
        t = time.perf_counter()
        out = fn()
        dt = time.perf_counter() - t
        best = dt if best is None else min(best, dt)
    return best, out


def control(url, payload):
    req = urllib.request.Request(url + "/_control", data=json.dumps(payload).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size-mib", type=int, default=512, help="file for the uncapped runs")
    ap.add_argument("--capped-size-mib", type=int, default=128, help="file for the rate-capped runs")
    ap.add_argument("--rate-mbs", type=float, default=8.0, help="per-connection cap, MB/s (10^6)")
    ap.add_argument("--connections", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--workdir", default=None, help="default: a temp dir (removed afterwards)")
    a = ap.parse_args()
    for tool in ("curl", "aria2c", "sha256sum"):
        if not shutil.which(tool):
            sys.exit("bench needs %s (apt-get install curl aria2 coreutils)" % tool)

    work = a.workdir or tempfile.mkdtemp(prefix="llmops-dl-bench-")
    os.makedirs(work, exist_ok=True)
    hubroot = os.path.join(work, "hub")
    out = os.path.join(work, "out")
    t0 = time.time()
    print("generating %d MiB + %d MiB of model files in %s ..." % (a.size_mib, a.capped_size_mib, work))
    sha_big = write_random_file(os.path.join(hubroot, "org", "bench", "big.gguf"), a.size_mib * MIB, seed=1)
    sha_cap = write_random_file(os.path.join(hubroot, "org", "bench", "capped.gguf"), a.capped_size_mib * MIB,
                                seed=2)
    hub = subprocess.Popen([sys.executable, "-m", "tests.fixtures.fake_hub.server", "--root", hubroot,
                            "--port", "0", "--host", "127.0.0.1"], cwd=ROOT, stdout=subprocess.PIPE,
                           universal_newlines=True)
    rows = []
    goals = []
    try:
        m = re.search(r"(http://127\.0\.0\.1:\d+)", hub.stdout.readline())
        if not m:
            sys.exit("fake hub did not start")
        url = m.group(1)

        def clean():
            shutil.rmtree(out, ignore_errors=True)
            os.makedirs(out)

        def md(name, sha):
            r = dl.run(dict(repo="org/bench", filename=name, endpoint=url, dest=out,
                            connections=a.connections, free_space_margin=0, retry_delay=0.2))
            assert r["sha256"] == sha and r["verified"] in ("download", "sidecar"), r
            return r

        def cdn(name):
            return "%s/org/bench/resolve/main/%s" % (url, name)

        def curl(name):
            sh(["curl", "-sS", "--fail", "-L", "-C", "-", "-o", os.path.join(out, name), cdn(name)])

        def aria(name):
            sh(["aria2c", "-q", "-x%d" % a.connections, "-s%d" % a.connections, "--min-split-size=4M",
                "--file-allocation=none", "--allow-overwrite=true", "--auto-file-renaming=false",
                "-d", out, "-o", name, cdn(name)])

        def sha256sum(path):
            p = subprocess.run(["sha256sum", path], check=True, stdout=subprocess.PIPE,
                               universal_newlines=True)
            return p.stdout.split()[0]

        # -- 1. rate-capped hub ---------------------------------------------------------------
        bps = a.rate_mbs * 1e6
        control(url, {"clear": True, "faults": {"rate": {"bps": bps, "times": -1}}})
        size_c = a.capped_size_mib * MIB
        t_md, _ = timed(lambda: md("capped.gguf", sha_cap), a.repeat, clean)
        t_aria, _ = timed(lambda: aria("capped.gguf"), a.repeat, clean)
        assert sha256sum(os.path.join(out, "capped.gguf")) == sha_cap
        t_curl, _ = timed(lambda: curl("capped.gguf"), 1, clean)  # one run: it is the slow one
        rows.append(("capped %g MB/s/conn" % a.rate_mbs, "model_download x%d (+sha256)" % a.connections,
                     t_md, size_c))
        rows.append(("capped %g MB/s/conn" % a.rate_mbs, "aria2c -x%d -s%d" % (a.connections, a.connections),
                     t_aria, size_c))
        rows.append(("capped %g MB/s/conn" % a.rate_mbs, "curl -L -C -", t_curl, size_c))
        goals.append(("capped: model_download vs curl speed-up", t_curl / t_md, ">= 4.0",
                      t_curl / t_md >= 4.0))
        goals.append(("capped: model_download time / aria2c time", t_md / t_aria, "~1.0 (info)", None))

        # -- 2. uncapped ------------------------------------------------------------------------
        control(url, {"clear": True})
        size_b = a.size_mib * MIB
        t_md2, _ = timed(lambda: md("big.gguf", sha_big), a.repeat, clean)

        def curl_then_hash():
            curl("big.gguf")
            assert sha256sum(os.path.join(out, "big.gguf")) == sha_big
        t_cs, _ = timed(curl_then_hash, a.repeat, clean)
        rows.append(("no cap", "model_download (download+verify)", t_md2, size_b))
        rows.append(("no cap", "curl + sha256sum", t_cs, size_b))
        goals.append(("no cap: model_download / (curl + sha256sum)", t_md2 / t_cs, "<= 0.8",
                      t_md2 / t_cs <= 0.8))

        # -- 3. re-run on the verified file ------------------------------------------------------
        clean()
        md("big.gguf", sha_big)
        t_re, r = timed(lambda: md("big.gguf", sha_big), 3)
        assert r["verified"] == "sidecar" and not r["changed"]
        t_sum, got = timed(lambda: sha256sum(os.path.join(out, "big.gguf")), 1)
        assert got == sha_big
        rows.append(("re-run, verified file", "model_download (sidecar)", t_re, size_b))
        rows.append(("re-run, verified file", "sha256sum", t_sum, size_b))
        goals.append(("re-run: model_download / sha256sum", t_re / t_sum, "< 0.01", t_re / t_sum < 0.01))
    finally:
        hub.terminate()
        hub.wait(10)
        if not a.workdir:
            shutil.rmtree(work, ignore_errors=True)

    print()
    print("%-24s %-36s %10s %12s" % ("scenario", "tool", "seconds", "MB/s"))
    print("-" * 86)
    for sc, tool, t, size in rows:
        print("%-24s %-36s %10.3f %12.1f" % (sc, tool, t, size / t / 1e6))
    print()
    print("%-48s %10s %14s %6s" % ("goal", "measured", "target", ""))
    print("-" * 82)
    failed = False
    for name, val, target, ok in goals:
        verdict = "info" if ok is None else ("PASS" if ok else "FAIL")
        failed = failed or ok is False
        print("%-48s %10.4f %14s %6s" % (name, val, target, verdict))
    print("\ntotal bench time %.1fs (cpu count %d)" % (time.time() - t0, os.cpu_count() or 0))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
