#!/usr/bin/env python3
# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""GGUF benchmark: gguf_info's parser on crafted hostile files vs the real tiny model, side by side.

Writes a set of crafted GGUF files (tests/fixtures/gguf/builder.py) that claim huge counts or sit at the edge
of the limits (block_count, array counts, string lengths, nested arrays, key/value and tensor counts, n_dims,
dimension products, kept arrays, a string made 4x larger by one non-BMP character), and measures for each,
in one run, the time and the peak memory of gguf.inspect() (the code the module runs):

* time: best of --repeat in-process runs;
* Python heap: tracemalloc peak of one in-process run;
* process: peak resident memory (VmHWM) of a fresh child process that imports the parser and parses the file
  (interpreter included; the child that parses the real model is the reference).

Each is printed with its ratio to parsing the real tiny qwen35 model (tests/fixtures/gguf/make_tiny_model.py:
real 151936-token vocabulary, 11 MB). Goal for every hostile case: under 1 s and under 256 MB (child peak
RSS); exit status 1 when one misses it. Cases marked "accepted" sit exactly at a default limit and parse.

Usage: .venv/bin/python bench/gguf/run.py [--repeat 3] [--keep DIR]
"""
import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import tracemalloc

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "collections"))
sys.path.insert(0, ROOT)

from ansible_collections.llmops.serving.plugins.module_utils._model_format import gguf  # noqa: E402

from tests.fixtures.gguf.builder import (  # noqa: E402
    ARRAY,
    FLOAT32,
    STRING,
    UINT32,
    UINT64,
    GGUFBuilder,
    tiny_qwen35,
)

MIB = 1 << 20
GOAL_SECONDS = 1.0
GOAL_BYTES = 256 * MIB


def _base(arch="qwen35"):
    b = GGUFBuilder()
    b.add("general.architecture", STRING, arch)
    return b


def _patched(builder, kind, value, index=0, extra=b""):
    return builder.build().patch(kind, value, index=index) + extra


def cases():
    """name -> (what it claims, the file's bytes)."""
    out = {}

    def add(name, what, data):
        out[name] = (what, data)

    b = _base().add("qwen35.block_count", UINT64, 1 << 63)
    add("block_count_2^63", "qwen35.block_count 2^63 (llama.cpp: 512 max)", b.build().data)
    b = _base().add("qwen35.block_count", UINT64, 1 << 40)
    add("block_count_2^40", "qwen35.block_count 2^40", b.build().data)
    b = _base().add("qwen35.block_count", UINT32, 3000000)
    add("block_count_3M", "qwen35.block_count 3,000,000", b.build().data)
    b = _base().add("qwen35.block_count", UINT32, gguf.DEFAULT_LIMITS["max_block_count"])
    add("block_count_at_limit", "qwen35.block_count 4096 (accepted: per-layer lists)", b.build().data)

    b = _base().add("tokenizer.ggml.tokens", ARRAY, ["a"], STRING)
    add("array_count_2^24_strings", "string array claiming 2^24 elements",
        _patched(b, "array.count", 1 << 24))
    b = _base().add("tokenizer.ggml.scores", ARRAY, [0.0], FLOAT32)
    add("array_count_2^63_floats", "float array claiming 2^63 elements",
        _patched(b, "array.count", 1 << 63))
    n = gguf.DEFAULT_LIMITS["max_metadata_strings"] - 16
    b = _base().add("tokenizer.ggml.tokens", ARRAY, ["a"], STRING)
    add("strings_at_limit", "%d empty strings (16 MB, accepted: at the strings budget)" % n,
        _patched(b, "array.count", n, extra=b"\0" * (8 * (n - 1))))
    b = _base().add("tokenizer.ggml.tokens", ARRAY, ["a"], STRING)
    add("strings_over_limit", "3,000,000 empty strings (24 MB)",
        _patched(b, "array.count", 3000000, extra=b"\0" * (8 * 2999999)))

    b = _base().add("general.name", STRING, "x")
    add("string_len_2^63", "string value claiming 2^63 bytes", _patched(b, "value.len", 1 << 63))
    b = _base().add("general.name", STRING, "x")
    add("string_len_16MiB_past_eof", "string value claiming 16 MiB - 1 in a tiny file",
        _patched(b, "value.len", 16 * MIB - 1))
    b = _base()
    for i in range(3):
        b.add("x.s%d" % i, STRING, "\U0001F600" + "a" * (8 * MIB))
    add("strings_ucs4_blowup", "3 x 8 MiB strings with one emoji (4x when decoded)", b.build().data)

    b = _base().add("x.arr", ARRAY, [1, 2], UINT32)
    add("nested_array", "array of arrays (nesting)", _patched(b, "array.type", 9))

    b = _base()
    values = [float(i) + 0.5 for i in range(4096)]
    for i in range(600):
        b.add("x.arr%d" % i, ARRAY, values, FLOAT32)
    add("kept_arrays_memory", "600 float arrays of 4096 kept whole (9.8 MB, ~100 MB as Python floats)",
        b.build().data)

    seed = tiny_qwen35().build()
    add("kv_count_65535", "n_kv 65535 in a 3 KB file", seed.patch("n_kv", 65535))
    add("kv_count_2^64-1", "n_kv 2^64-1", seed.patch("n_kv", (1 << 64) - 1))
    b = _base()
    for i in range(65000):
        b.add("k%d" % i, UINT32, i)
    add("many_kvs_present", "65,000 key/values really present (accepted)", b.build().data)

    add("tensor_count_65535", "n_tensors 65535 in a 3 KB file", seed.patch("n_tensors", 65535))
    b = _base("llama")
    for i in range(65536):
        b.tensor("t%d" % i, [0], "F32")
    add("many_tensors_present", "65,536 empty tensors really present (accepted, at max_tensors)",
        b.build().data)

    add("n_dims_2^32-1", "a tensor with 2^32-1 dimensions", seed.patch("tensor.n_dims", (1 << 32) - 1))
    b = _base("llama").tensor("a.weight", [1 << 20, 1 << 20, 1 << 20, 1 << 20], "F32")
    add("dims_product_2^80", "a tensor of 2^20 x 2^20 x 2^20 x 2^20 elements", b.build(with_data=False).data)
    b = _base("llama").tensor("a.weight", [1 << 30, 1 << 30], "F32")
    add("tensor_2^60_past_eof", "a tensor of 2^60 elements in a tiny file", b.build(with_data=False).data)
    return out


def peak_rss():
    """Peak resident set of this process in bytes: VmHWM (per address space, so not inherited from the
    parent like ru_maxrss is across fork), else ru_maxrss."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (IOError, OSError, ValueError):
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def child_main(path):
    """Parse `path` in this fresh process; print elapsed, outcome and peak RSS as JSON."""
    start = time.perf_counter()
    try:
        if path != "-":
            gguf.inspect(path)
        outcome = "ok"
    except gguf.GGUFError as exc:
        outcome = "GGUFError"
        del exc
    elapsed = time.perf_counter() - start
    print(json.dumps({"elapsed": elapsed, "outcome": outcome, "maxrss": peak_rss()}))
    return 0


def run_child(path):
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", path], cwd=ROOT,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True,
                          timeout=600, check=False)
    if proc.returncode != 0:
        return {"elapsed": float("nan"), "outcome": "CRASH: %s" % proc.stderr.strip().splitlines()[-1:],
                "maxrss": 0}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def measure(path, repeat):
    best = None
    message = "ok"
    for _ in range(repeat):
        start = time.perf_counter()
        try:
            gguf.inspect(path)
            message = "ok"
        except gguf.GGUFError as exc:
            message = exc.message
        dt = time.perf_counter() - start
        best = dt if best is None else min(best, dt)
    tracemalloc.start()
    try:
        try:
            gguf.inspect(path)
        except gguf.GGUFError:
            pass
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    child = run_child(path)
    return {"seconds": best, "heap": peak, "maxrss": child["maxrss"], "message": message,
            "child_outcome": child["outcome"]}


def real_model():
    try:
        from tests.fixtures.gguf.make_tiny_model import cached_tiny_model
        return cached_tiny_model("qwen35"), "tiny qwen35 model (real vocab)"
    except Exception as exc:  # numpy or the llama.cpp source missing: take its vocabulary file instead
        from tests.fixtures import llama_cpp_source
        vocab = [p for p in llama_cpp_source.vocab_models() if p.endswith("ggml-vocab-qwen35.gguf")][0]
        return vocab, "ggml-vocab-qwen35.gguf (tiny model unavailable: %s)" % exc


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--keep", default=None, help="write the crafted files here and keep them")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        return child_main(a.child)

    t0 = time.time()
    work = a.keep or tempfile.mkdtemp(prefix="llmops-gguf-bench-")
    os.makedirs(work, exist_ok=True)
    try:
        ref_path, ref_name = real_model()
        ref = measure(ref_path, a.repeat)
        idle = run_child("-")
        print("reference: %s, %.1f MB: %.1f ms, heap peak %.1f MB, child maxrss %.1f MB "
              "(a child that parses nothing: %.1f MB)"
              % (ref_name, os.path.getsize(ref_path) / 1e6, ref["seconds"] * 1e3, ref["heap"] / MIB,
                 ref["maxrss"] / MIB, idle["maxrss"] / MIB))
        print()
        header = "%-26s %9s %9s %7s %9s %7s %9s %7s %5s  %s" % (
            "case", "file", "ms", "x real", "heap MB", "x real", "rss MB", "x real", "goal", "outcome")
        print(header)
        print("-" * len(header))
        failed = []
        for name, (what, data) in cases().items():
            path = os.path.join(work, name + ".gguf")
            with open(path, "wb") as f:
                f.write(data)
            m = measure(path, a.repeat)
            crashed = m["child_outcome"].startswith("CRASH")
            ok = m["seconds"] < GOAL_SECONDS and m["maxrss"] < GOAL_BYTES and not crashed
            if not ok:
                failed.append(name)
            size = len(data)
            print("%-26s %9s %9.2f %7.2f %9.2f %7.2f %9.1f %7.2f %5s  %s"
                  % (name, "%.1fM" % (size / 1e6) if size >= 1e5 else "%dB" % size, m["seconds"] * 1e3,
                     m["seconds"] / ref["seconds"], m["heap"] / MIB, m["heap"] / max(ref["heap"], 1),
                     m["maxrss"] / MIB, m["maxrss"] / max(ref["maxrss"], 1), "PASS" if ok else "FAIL",
                     (m["message"] if m["message"] == "ok" else "GGUFError: " + m["message"])[:90]))
            print("%-26s   %s" % ("", what))
            if not a.keep:
                os.remove(path)
    finally:
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)
    print()
    print("goal: every hostile case < %.0f s and < %d MB maxrss: %s"
          % (GOAL_SECONDS, GOAL_BYTES // MIB, "FAIL (%s)" % ", ".join(failed) if failed else "PASS"))
    print("total bench time %.1fs (cpu count %d)" % (time.time() - t0, os.cpu_count() or 0))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
