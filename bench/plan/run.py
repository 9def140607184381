#!/usr/bin/env python3
# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Planner benchmark: the memory planner's figures beside what llama.cpp itself logs it allocated.

1. llama.cpp's log: for the tiny real models (tests/fixtures/gguf/make_tiny_model.py, --arch llama and
   --arch qwen35 with its MTP block) and a grid of settings (context 4096/16384/65536, parallel 1/2/4,
   f16 and q8_0 KV, unified KV or not, ubatch 128/512, MTP draft with 1 or 3 draft tokens), start the CPU
   llama-server with the command line the serving role would write (plugins/plugin_utils/
   llama_server_flags.build_argv) plus `-lv 4 --threads 1 --no-repack --fit off --no-warmup`, wait until it
   has allocated its buffers, stop it, parse the log (bench/plan/llama_log.py) and print each category
   beside memory_plan.llama_cpp_breakdown()'s. Goal: every case's total within 10%.
2. The seed: a sparse stand-in for Qwen3.6-27B-UD-Q5_K_XL.gguf (tests/fixtures/gguf/make_qwen36_header.py,
   the real header and tensor table) planned with the L20 profile's settings (inventories/l20: 262144
   context, q8_0 KV, parallel 2, unified KV, MTP 3 tokens, tensor split 0.5/0.5, ubatch 128) on two L20s;
   the planned total beside the 33 GB the seed reports in use ("192GB 总显存 (用了 33GB / 18%)": 18% of the
   4 x 46,068 MiB nvidia-smi shows is 33 GiB, so read as GiB). Goal: within 15%.

Usage: .venv/bin/python bench/plan/run.py [--jobs 2] [--quick] [--keep-logs DIR]
Needs the CPU llama-server at .cache/ci-llama/bin/llama-server (or $LLMOPS_LLAMA_SERVER).
"""
import argparse
import concurrent.futures
import itertools
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "collections"))
sys.path.insert(0, ROOT)

import yaml  # noqa: E402
from ansible_collections.llmops.serving.plugins.module_utils._model_format import gguf  # noqa: E402
from ansible_collections.llmops.serving.plugins.plugin_utils import llama_server_flags  # noqa: E402

from bench.plan import llama_log  # noqa: E402

MIB = 1 << 20
GIB = 1 << 30
GOAL_LOG = 0.10
GOAL_SEED = 0.15
SEED_REPORTED_BYTES = 33 * GIB  # seed 000: "192GB 总显存 (用了 33GB / 18%)": 18% of 4 x 46,068 MiB = GiB
PORTS = range(18160, 18180)
START_TIMEOUT = 90
BENCH_FLAGS = ["-lv", "4", "--threads", "1", "--no-repack", "--fit", "off", "--no-warmup"]
# Categories in print order; a log category the planner does not name is folded into its neighbour.
CATEGORIES = ("weights", "kv", "draft_kv", "recurrent", "compute", "draft_compute", "output")
FOLD = {"draft_output": "output", "draft_recurrent": "recurrent"}
L20 = {"name": "NVIDIA L20", "memory_total_mib": 46068, "memory_free_mib": 45596, "memory_used_mib": 472,
       "compute_cap": "8.9", "state": "ok"}


def server_binary():
    path = os.environ.get("LLMOPS_LLAMA_SERVER") or os.path.join(ROOT, ".cache", "ci-llama", "bin",
                                                                   "llama-server")
    if not os.access(path, os.X_OK):
        raise SystemExit("no llama-server at %s (build it: tests/fixtures ci-llama, or set "
                         "LLMOPS_LLAMA_SERVER)" % path)
    return path


def grid(quick=False):
    """(name, arch, settings): context x parallel for both models; KV type, unified KV, ubatch and (qwen35)
    the MTP draft depth vary along the grid so every value meets several others."""
    cases = []
    contexts = (4096, 16384, 65536)
    parallels = (1, 2, 4)
    for i, (ctx, parallel) in enumerate(itertools.product(contexts, parallels)):
        kv_type = ("f16", "q8_0")[i % 2]
        base = {"ctx_size": ctx, "parallel": parallel, "kv_unified": bool((i // 2) % 2),
                "cache_type_k": kv_type, "cache_type_v": kv_type, "ubatch_size": (512, 128)[(i // 4) % 2],
                "batch_size": 2048, "flash_attn": "auto"}
        cases.append(("llama", dict(base)))
        cases.append(("qwen35", dict(base)))
        cases.append(("qwen35", dict(base, spec_type="draft-mtp", spec_draft_n_max=(3, 1)[i % 2])))
    # the draft cache's own types (f16) under a q8_0 main cache
    cases.append(("qwen35", {"ctx_size": 16384, "parallel": 2, "kv_unified": True, "cache_type_k": "q8_0",
                             "cache_type_v": "q8_0", "spec_type": "draft-mtp", "spec_draft_n_max": 3,
                             "spec_draft_cache_type_k": "f16", "spec_draft_cache_type_v": "f16",
                             "ubatch_size": 128, "flash_attn": "auto"}))
    if quick:
        cases = cases[::4]
    return [(_case_name(arch, s), arch, s) for arch, s in cases]


def _case_name(arch, s):
    name = "%s c%dk np%d %s%s ub%d" % (arch, s["ctx_size"] // 1024, s["parallel"], s["cache_type_k"],
                                       " kvu" if s.get("kv_unified") else "", s["ubatch_size"])
    if s.get("spec_type"):
        name += " mtp%d" % s["spec_draft_n_max"]
        if s.get("spec_draft_cache_type_k"):
            name += " d%s" % s["spec_draft_cache_type_k"]
    return name


def run_server(binary, model_path, settings, port, log_path):
    """Start llama-server, wait until its buffers are allocated (or it exits), stop it; the log's text."""
    argv = [binary] + llama_server_flags.build_argv(settings, model=model_path, host="127.0.0.1",
                                                    port=port) + BENCH_FLAGS
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        deadline = time.time() + START_TIMEOUT
        while time.time() < deadline:
            with open(log_path, errors="replace") as f:
                text = f.read()
            if llama_log.allocated(text) or proc.poll() is not None:
                break
            time.sleep(0.1)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    with open(log_path, errors="replace") as f:
        text = f.read()
    if not llama_log.allocated(text):
        tail = [line for line in text.splitlines() if line.strip()][-3:]
        raise RuntimeError("llama-server did not finish loading (rc %s): %s"
                           % (proc.returncode, " | ".join(tail)))
    return text, argv


def compare(logged, planned):
    """Per category (log bytes, plan bytes), log categories the planner lacks folded into a neighbour."""
    log = dict(logged)
    for extra, into in FOLD.items():
        if extra not in planned:
            log[into] = log.get(into, 0) + log.pop(extra, 0)
    rows = {}
    for category in CATEGORIES:
        if category in planned or log.get(category):
            rows[category] = (log.get(category, 0), planned.get(category))
    return rows


def _fmt_pair(pair):
    log, plan = pair
    plan_text = "-" if plan is None else "%.2f" % (plan / MIB)
    return "%.2f/%s" % (log / MIB, plan_text)


def log_section(memory_plan, args, work):
    binary = server_binary()
    from tests.fixtures.gguf.make_tiny_model import cached_tiny_model
    models = {arch: cached_tiny_model(arch) for arch in ("llama", "qwen35")}
    infos = {arch: gguf.inspect(path) for arch, path in models.items()}
    cases = grid(args.quick)
    ports = queue.Queue()
    for port in PORTS:
        ports.put(port)

    def one(index_case):
        index, (name, arch, settings) = index_case
        port = ports.get()
        try:
            log_path = os.path.join(work, "case%02d.log" % index)
            text, argv = run_server(binary, models[arch], settings, port, log_path)
        finally:
            ports.put(port)
        return name, arch, settings, llama_log.parse(text), argv

    print("llama-server: %s; models: %s" % (binary, ", ".join("%s %.1f MB" % (a, os.path.getsize(p) / 1e6)
                                                             for a, p in models.items())))
    print("each cell: MiB logged by llama.cpp / MiB planned (llama_cpp_breakdown); ratio = planned / logged")
    header = "%-34s %s %10s %10s %7s %5s" % ("case", " ".join("%-17s" % c for c in CATEGORIES), "log MiB",
                                              "plan MiB", "ratio", "goal")
    print(header)
    print("-" * len(header))
    failed = []
    worst = 0.0
    with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
        for name, arch, settings, parsed, argv in pool.map(one, enumerate(cases)):
            planned = memory_plan.llama_cpp_breakdown(infos[arch], settings)
            rows = compare(parsed["totals"], planned)
            log_total = parsed["totals"]["total"]
            plan_total = planned["total"]
            ratio = plan_total / log_total if log_total else float("inf")
            ok = abs(ratio - 1) <= GOAL_LOG
            worst = max(worst, abs(ratio - 1))
            if not ok:
                failed.append(name)
            cells = " ".join("%-17s" % (_fmt_pair(rows[c]) if c in rows else "") for c in CATEGORIES)
            print("%-34s %s %10.2f %10.2f %7.3f %5s" % (name, cells, log_total / MIB, plan_total / MIB, ratio,
                                                        "PASS" if ok else "FAIL"), flush=True)
            if args.verbose:
                print("    %s" % " ".join(argv[1:]))
    print()
    print("goal: planned total within %d%% of llama.cpp's logged total in all %d cases (worst %.1f%%): %s"
          % (GOAL_LOG * 100, len(cases), worst * 100, "FAIL (%s)" % "; ".join(failed) if failed else "PASS"))
    return not failed


def seed_settings():
    with open(os.path.join(ROOT, "inventories", "l20", "group_vars", "l20", "main.yml")) as f:
        return dict(yaml.safe_load(f)["l20_qwen_settings"])


def seed_section(memory_plan, work):
    from tests.fixtures.gguf.make_qwen36_header import write_qwen36_header
    if not hasattr(memory_plan, "plan_llama_cpp"):
        print("memory_plan.plan_llama_cpp() is missing: no plan to compare with the seed")
        return False
    path = os.path.join(work, "Qwen3.6-27B-UD-Q5_K_XL.header.gguf")
    size = write_qwen36_header(path)
    model = gguf.inspect(path)
    settings = seed_settings()
    gpus = [dict(L20, index=i, uuid="GPU-l20-%d" % i) for i in (2, 3)]
    plan = memory_plan.plan_llama_cpp(model, gpus, settings, name="qwen36-27b")
    print("model: sparse Qwen3.6-27B stand-in, %.2f GB of tensors (%d blocks, %d on disk KiB)"
          % (size / 1e9, model["block_count"], os.stat(path).st_blocks // 2))
    print("settings (inventories/l20 l20_qwen_settings): ctx %s, parallel %s, kv_unified %s, K/V %s/%s, "
          "%s n_max %s, tensor_split %s, ubatch %s; 2 x L20 (%d MiB, %d MiB free)"
          % (settings.get("ctx_size"), settings.get("parallel"), settings.get("kv_unified"),
             settings.get("cache_type_k"), settings.get("cache_type_v"), settings.get("spec_type"),
             settings.get("spec_draft_n_max"), settings.get("tensor_split"), settings.get("ubatch_size"),
             L20["memory_total_mib"], L20["memory_free_mib"]))
    keys = ("weights", "kv", "draft_kv", "recurrent", "compute", "draft_compute", "pipeline_copies",
            "overhead", "total")
    header = "%-6s %s" % ("gpu", " ".join("%*s" % (max(10, len(k)), k) for k in keys))
    print(header + "   (MiB)")
    print("-" * len(header))
    for gpu in plan["gpus"]:
        print("%-6s %s" % (gpu.get("index"), " ".join("%*.0f" % (max(10, len(k)), (gpu.get(k) or 0) / MIB)
                                                      for k in keys)))
    total = plan["total_bytes"]
    ratio = total / SEED_REPORTED_BYTES
    ok = abs(ratio - 1) <= GOAL_SEED
    print("pipeline parallelism: %s; host memory (input embedding, pinned output/compute buffers): %.0f MiB"
          % (plan.get("pipeline_parallel"), plan["host"]["total"] / MIB))
    print("planned total %.2f GiB (%.2f GB), fits: %s; the seed reports 33 GB in use (33 GiB = %.2f GB): "
          "planned / reported = %.3f (%.3f if the seed meant 33e9 bytes)"
          % (total / GIB, total / 1e9, plan.get("fits"), SEED_REPORTED_BYTES / 1e9, ratio, total / 33e9))
    print("goal: within %d%% of the seed's 33 GiB: %s" % (GOAL_SEED * 100, "PASS" if ok else "FAIL"))
    return ok


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--jobs", type=int, default=2, help="servers started at once (default 2)")
    ap.add_argument("--quick", action="store_true", help="every 4th case of the grid")
    ap.add_argument("--verbose", action="store_true", help="print each command line")
    ap.add_argument("--keep-logs", default=None, help="write the llama-server logs here and keep them")
    args = ap.parse_args()
    t0 = time.time()
    try:
        from ansible_collections.llmops.serving.plugins.module_utils._memory_plan import plan as memory_plan
    except ImportError as exc:
        print("memory planner not importable: %s" % exc)
        return 1
    work = args.keep_logs or tempfile.mkdtemp(prefix="llmops-plan-bench-")
    os.makedirs(work, exist_ok=True)
    try:
        print("--- llama.cpp's logged allocations vs the planner (CPU build)")
        ok_log = log_section(memory_plan, args, work)
        print()
        print("--- the seed: Qwen3.6-27B UD-Q5_K_XL on two L20s")
        ok_seed = seed_section(memory_plan, work)
    finally:
        if not args.keep_logs:
            shutil.rmtree(work, ignore_errors=True)
    print("total bench time %.1fs (cpu count %d)" % (time.time() - t0, os.cpu_count() or 0))
    return 0 if ok_log and ok_seed else 1


if __name__ == "__main__":
    sys.exit(main())
