#!/usr/bin/env python3
# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Gateway benchmark: role gateway's rendered haproxy.cfg (HAProxy from the distribution) in front of one
engine, measured side by side with direct requests to that engine, in one run.

The engine: the real CPU llama-server (.cache/ci-llama/bin/llama-server or $LLMOPS_LLAMA_SERVER, serving the
tiny llama model of tests/fixtures/gguf/make_tiny_model.py with the command line role serving renders),
else the streaming double (tests/fixtures/stream_double.py, its own process: chunks 20 ms apart), and the
run says which. The gateway: tests/fixtures/gateway_render.py renders the role's templates from its
defaults and plan task; plain HTTP and TLS (self-signed) both run.

1. Keep-alive latency: --requests generations of one token (POST /v1/chat/completions, max_tokens 1) on one
   kept-alive connection each way: p50 and p99, and what the gateway adds.
2. Streams: --streams streamed generations of --tokens tokens on a kept-alive connection: time to first
   chunk (request sent -> first `data:` line), and the spread of the chunks' arrival times (gaps between
   consecutive chunks: p50, p99, max; and first to last chunk).
3. Reading "model" from the body (option: --memory): HAProxy's peak memory with --inflight requests in flight
   whose bodies fill the buffer, for gateway_bufsize 64 KiB, 1 MiB and 4 MiB, and the largest offset of
   "model" in a JSON body that each buffer size still routes by.

Direct and gateway requests are interleaved, one way after the other, so that a busy machine weighs on each
alike. Goals (exit 1 when one is missed), with and without TLS: the gateway adds at most 10 ms to the median
time to first chunk (before option http-no-delay: 150-210 ms without TLS); the gaps between chunks (p50,
p90) stay within 5 ms of the direct ones, and at most 20 points more of the chunks arrive together (< 2 ms
apart) than direct (a proxy holding chunks bunches them: 93% of them, before); the median keep-alive latency
grows by at most 5 ms. The bounds leave room for a busy shared machine (load 13 on 2 cores adds 1-4 ms of
scheduling to every hop); the failures they catch are tens to hundreds of ms.

Usage: .venv/bin/python bench/gateway/run.py [--requests 300] [--streams 30] [--tokens 32] [--memory]
       [--engine auto|llama-server|double]
Needs haproxy and openssl (apt-get install haproxy openssl). About 1 minute on 2 shared cores.
"""
import argparse
import contextlib
import http.client
import json
import os
import shutil
import ssl
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
COLLECTIONS = os.path.join(ROOT, "collections")
sys.path.insert(0, COLLECTIONS)
sys.path.insert(0, ROOT)

from tests.fixtures.gateway_render import CLIENT_KEYS, free_port, node_vars, running_gateway  # noqa: E402

GOAL_FIRST_CHUNK_MS = 10.0
GOAL_GAP_MS = 5.0
GOAL_TOGETHER_POINTS = 20.0
GOAL_LATENCY_P50_MS = 5.0
ENGINE_KEY = "bench-engine-key-5d1f"
CLIENT_KEY = CLIENT_KEYS[0]["key"]
# The benchmark's client key: a generation limit no run reaches (rate limits are not measured here).
BENCH_KEYS = [dict(CLIENT_KEYS[0], rate_limit=10 ** 7)]
MODEL = "tiny"
START_TIMEOUT = 120


def llama_server_binary():
    path = os.environ.get("LLMOPS_LLAMA_SERVER") or os.path.join(ROOT, ".cache", "ci-llama", "bin",
                                                                   "llama-server")
    return path if os.access(path, os.X_OK) else None


def wait_for(url, proc, log_path, timeout=START_TIMEOUT):
    deadline = time.monotonic() + timeout
    host, port = url.split("//")[1].split(":")
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            with open(log_path, errors="replace") as log:
                raise SystemExit("the engine exited (rc %s): %s" % (proc.returncode, log.read()[-2000:]))
        try:
            conn = http.client.HTTPConnection(host, int(port), timeout=2)
            conn.request("GET", "/health")
            if conn.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise SystemExit("the engine at %s was not healthy within %d s" % (url, timeout))


@contextlib.contextmanager
def engine_process(kind, work):
    """The engine in its own process: yields (name, engine, port)."""
    port = free_port()
    log_path = os.path.join(work, "engine.log")
    binary = llama_server_binary()
    if kind == "llama-server" or (kind == "auto" and binary):
        if not binary:
            raise SystemExit("no llama-server at .cache/ci-llama/bin/llama-server: set LLMOPS_LLAMA_SERVER")
        from ansible_collections.llmops.serving.plugins.plugin_utils import llama_server_flags

        from tests.fixtures.gguf.make_tiny_model import cached_tiny_model
        key_file = os.path.join(work, "engine.key")
        with open(key_file, "w") as handle:
            handle.write(ENGINE_KEY)
        settings = {"ctx_size": 4096, "parallel": 2, "threads": 1}
        argv = [binary] + llama_server_flags.build_argv(settings, model=cached_tiny_model("llama"),
                                                        host="127.0.0.1", port=port, api_key_file=key_file,
                                                        served_model_name=MODEL)
        name = "llama-server %s (tiny llama model)" % binary
        engine = "llama.cpp"
    else:
        argv = [sys.executable, "-m", "tests.fixtures.stream_double", "--port", str(port), "--engine",
                "llama.cpp", "--model", MODEL, "--api-key", ENGINE_KEY, "--first-delay", "0.005",
                "--interval", "0.02"]
        name = "the streaming double (no llama-server here: chunks written 20 ms apart)"
        engine = "llama.cpp"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(argv, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=dict(os.environ, PYTHONPATH=ROOT))
    try:
        wait_for("http://127.0.0.1:%d" % port, proc, log_path)
        yield name, engine, port
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class Client(object):
    """One kept-alive connection; request() returns (status, [arrival times of data lines], send time).
    closes_after_stream: the server closes the connection after a streamed answer though its headers say
    keep-alive (llama-server does, at once): the client then opens a new one for the next request."""

    def __init__(self, port, key, tls=False, closes_after_stream=False):
        self.closes_after_stream = closes_after_stream
        if tls:
            context = ssl._create_unverified_context()  # noqa: S323 - the gateway's self-signed certificate
            self.conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=60, context=context)
        else:
            self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        self.headers = {"Authorization": "Bearer " + key, "Content-Type": "application/json"}

    def request(self, body):
        data = json.dumps(body).encode()
        sent = time.monotonic()
        self.conn.request("POST", "/v1/chat/completions", body=data, headers=self.headers)
        resp = self.conn.getresponse()
        arrivals = []
        if body.get("stream"):
            for line in resp:
                if line.startswith(b"data: ") and not line.startswith(b"data: [DONE]"):
                    arrivals.append(time.monotonic())
        else:
            resp.read()
            arrivals.append(time.monotonic())
        if resp.status != 200:
            raise SystemExit("HTTP %d from %s" % (resp.status, self.conn.port))
        if body.get("stream") and self.closes_after_stream:
            self.conn.close()  # http.client connects again on the next request
        return arrivals, sent

    def close(self):
        self.conn.close()


def pct(values, q):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100.0 * (len(ordered) - 1))))]


WAYS = ("direct", "plain", "tls")


def measure(ports, args):
    """The same requests direct and through both gateways, interleaved (one each in turn, the order rotating)
    so that a busy machine weighs on every way alike. ports: {way: port}."""
    clients = {"direct": Client(ports["direct"], ENGINE_KEY, closes_after_stream=True),
               "plain": Client(ports["plain"], CLIENT_KEY), "tls": Client(ports["tls"], CLIENT_KEY, tls=True)}
    out = dict((way, {"latency": [], "first": [], "gaps": [], "spans": []}) for way in WAYS)
    one = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    stream = dict(one, max_tokens=args.tokens, stream=True, ignore_eos=True)
    try:
        for way in WAYS:
            for _ in range(5):
                clients[way].request(one)  # warm up (connection, TLS session, the engine's first request)
        for turn in range(args.requests):
            for way in WAYS[turn % 3:] + WAYS[:turn % 3]:
                arrivals, sent = clients[way].request(one)
                out[way]["latency"].append((arrivals[-1] - sent) * 1000)
        for turn in range(args.streams):
            for way in WAYS[turn % 3:] + WAYS[:turn % 3]:
                arrivals, sent = clients[way].request(stream)
                out[way]["first"].append((arrivals[0] - sent) * 1000)
                pairs = zip(arrivals[:-1], arrivals[1:], strict=True)
                out[way]["gaps"].extend((b - a) * 1000 for a, b in pairs)
                out[way]["spans"].append((arrivals[-1] - arrivals[0]) * 1000)
    finally:
        for client in clients.values():
            client.close()
    return out


ROWS = (("keep-alive latency p50", "latency", 50), ("keep-alive latency p99", "latency", 99),
        ("time to first chunk p50", "first", 50), ("time to first chunk p99", "first", 99),
        ("gap between chunks p10", "gaps", 10), ("gap between chunks p50", "gaps", 50),
        ("gap between chunks p90", "gaps", 90), ("gap between chunks p99", "gaps", 99),
        ("first to last chunk p50", "spans", 50))
# Chunks that arrive together (a gap this short) though the engine wrote them apart: a proxy holding them.
TOGETHER_MS = 2.0


def together(gaps):
    return 100.0 * sum(1 for gap in gaps if gap < TOGETHER_MS) / max(len(gaps), 1)


def report(results):
    """Print the side-by-side table; return the goals' results [(text, ok)]."""
    direct = results["direct"]
    header = "%-28s %10s %12s %10s %12s %10s" % ("ms", "direct", "gw plain", "added", "gw TLS", "added")
    print(header)
    print("-" * len(header))
    for label, key, q in ROWS:
        d = pct(direct[key], q)
        plain, tls = pct(results["plain"][key], q), pct(results["tls"][key], q)
        print("%-28s %10.2f %12.2f %+10.2f %12.2f %+10.2f" % (label, d, plain, plain - d, tls, tls - d))
    d, plain, tls = (together(results[way]["gaps"]) for way in WAYS)
    print("%-28s %9.1f%% %11.1f%% %+10.1f %11.1f%% %+10.1f"
          % ("chunks arriving together", d, plain, plain - d, tls, tls - d))
    goals = []
    for way, name in (("plain", "plain"), ("tls", "TLS")):
        added = pct(results[way]["first"], 50) - pct(direct["first"], 50)
        goals.append(("%s: added time to first chunk p50 %.2f ms <= %.0f ms"
                      % (name, added, GOAL_FIRST_CHUNK_MS), added <= GOAL_FIRST_CHUNK_MS))
        shift = max(abs(pct(results[way]["gaps"], q) - pct(direct["gaps"], q)) for q in (50, 90))
        goals.append(("%s: gaps between chunks (p50, p90) within %.2f ms of direct, <= %.0f ms" % (
            name, shift, GOAL_GAP_MS), shift <= GOAL_GAP_MS))
        more = together(results[way]["gaps"]) - together(direct["gaps"])
        goals.append(("%s: chunks arriving together %+.1f points from direct, <= %.0f" % (
            name, more, GOAL_TOGETHER_POINTS), more <= GOAL_TOGETHER_POINTS))
        added = pct(results[way]["latency"], 50) - pct(direct["latency"], 50)
        goals.append(("%s: added keep-alive latency p50 %.2f ms <= %.0f ms"
                      % (name, added, GOAL_LATENCY_P50_MS), added <= GOAL_LATENCY_P50_MS))
    return goals


# ---------------------------------------------------------------- generations lost: none through the gateway

CONNECTIONS = ("keep-alive", "new")


class Generations(object):
    """Short streamed generations, each checked whole (200, then the stream up to `data: [DONE]`), on one
    kept-alive connection per client thread (reopened after a failure) or a new connection each."""

    def __init__(self, port, key, tls, connection, tokens):
        self.port, self.tls, self.connection = port, tls, connection
        self.headers = {"Authorization": "Bearer " + key, "Content-Type": "application/json"}
        self.body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
                                "max_tokens": tokens, "stream": True, "ignore_eos": True}).encode()
        self.local = threading.local()
        self.lock = threading.Lock()
        self.failures = {}
        self.done = 0

    def _connection(self):
        conn = getattr(self.local, "conn", None) if self.connection == "keep-alive" else None
        if conn is None:
            if self.tls:
                context = ssl._create_unverified_context()  # noqa: S323 - the gateway's self-signed certificate
                conn = http.client.HTTPSConnection("127.0.0.1", self.port, timeout=120, context=context)
            else:
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
            self.local.conn = conn
        return conn

    def one(self):
        conn = self._connection()
        failure = None
        try:
            conn.request("POST", "/v1/chat/completions", body=self.body, headers=self.headers)
            resp = conn.getresponse()
            done = False
            for line in resp:
                done = done or line.startswith(b"data: [DONE]")
            if resp.status != 200:
                failure = "HTTP %d" % resp.status
            elif not done:
                failure = "stream cut before [DONE]"
        except (OSError, http.client.HTTPException) as exc:
            failure = type(exc).__name__
        if failure or self.connection == "new":
            conn.close()
            self.local.conn = None
        with self.lock:
            self.done += 1
            if failure:
                self.failures[failure] = self.failures.get(failure, 0) + 1

    def run(self, count, concurrency):
        """`count` generations from `concurrency` threads; returns the seconds taken."""
        left = [count]

        def worker():
            while True:
                with self.lock:
                    if not left[0]:
                        break
                    left[0] -= 1
                self.one()
            conn = getattr(self.local, "conn", None)
            if conn is not None:
                conn.close()

        threads = [threading.Thread(target=worker) for _ in range(concurrency)]
        started = time.monotonic()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return time.monotonic() - started


def reliability(ports, args):
    """args.generations sequential and args.generations concurrent (args.concurrency clients) generations
    of args.generation_tokens tokens, per way and per client connection kind. {(way, connection, mode):
    (count, failures, seconds)}."""
    out = {}
    keys = {"direct": ENGINE_KEY, "plain": CLIENT_KEY, "tls": CLIENT_KEY}
    ways = ("direct", "plain", "tls") if args.direct_control else ("plain", "tls")
    for mode, concurrency in (("sequential", 1), ("concurrent", args.concurrency)):
        for connection in CONNECTIONS:
            for way in ways:
                gens = Generations(ports[way], keys[way], way == "tls", connection, args.generation_tokens)
                seconds = gens.run(args.generations, concurrency)
                out[(way, connection, mode)] = (gens.done, gens.failures, seconds)
                print("  %-6s %-10s %-10s %5d generations, %d failed %s (%.0f s)" % (
                    way, connection, mode, gens.done, sum(gens.failures.values()),
                    gens.failures or "", seconds), flush=True)
    return out


def reliability_goals(results):
    """One goal per gateway way: no generation failed, over every connection kind and mode."""
    goals = []
    for way, name in (("plain", "plain"), ("tls", "TLS")):
        runs = [value for key, value in results.items() if key[0] == way]
        if not runs:
            continue
        count = sum(done for done, _, _ in runs)
        failed = sum(sum(failures.values()) for _, failures, _ in runs)
        goals.append(("%s: generations failed through the gateway %d of %d (sequential and concurrent, "
                      "kept-alive and new client connections), must be 0" % (name, failed, count),
                      failed == 0 and count > 0))
    return goals


def connection_cost(port, key, count):
    """What a new connection per request costs at the engine (the gateway opens one per request): one-token
    generations direct on a kept-alive connection and on a new one each, interleaved: (p50, p50) in ms."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    kept, times = Client(port, key), {"kept": [], "new": []}
    try:
        for _ in range(count):
            arrivals, sent = kept.request(body)
            times["kept"].append((arrivals[-1] - sent) * 1000)
            fresh = Client(port, key)  # http.client connects on the first request: inside its time
            try:
                arrivals, sent = fresh.request(body)
            finally:
                fresh.close()
            times["new"].append((arrivals[-1] - sent) * 1000)
    finally:
        kept.close()
    return pct(times["kept"], 50), pct(times["new"], 50)


# ---------------------------------------------------------------- what reading "model" from the body costs

def _rss_kib(pid, field):
    with open("/proc/%d/status" % pid) as handle:
        for line in handle:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def _haproxy_pid(sock_admin):
    for line in sock_admin("show info").splitlines():
        if line.startswith("Pid:"):
            return int(line.split(":")[1])
    raise SystemExit("no Pid in HAProxy's show info")


def _routed_offset(gw_port, bufsize):
    """The largest offset of "model" in a JSON body the gateway still routes by (bisection, to the model
    "other" that answers at once)."""
    def routed(offset):
        filler = "x" * max(offset - 40, 0)
        body = ('{"messages":[{"role":"user","content":"%s"}],"max_tokens":1,"model":"other"}'
                % filler).encode()
        conn = http.client.HTTPConnection("127.0.0.1", gw_port, timeout=30)
        try:
            conn.request("POST", "/v1/chat/completions", body=body,
                         headers={"Authorization": "Bearer " + CLIENT_KEY,
                                  "Content-Type": "application/json"})
            resp = conn.getresponse()
            resp.read()
            return resp.status == 200
        except OSError:
            return False
        finally:
            conn.close()
    low, high = 0, bufsize * 2
    while high - low > 64:
        mid = (low + high) // 2
        low, high = (mid, high) if routed(mid) else (low, mid)
    return low


def _one_request(port, body, statuses):
    from tests.fixtures.stream_double import timed_request
    try:
        answer = timed_request("127.0.0.1", port, "/v1/chat/completions", body,
                               {"Authorization": "Bearer " + CLIENT_KEY})
        statuses.append(answer["status"])
    except OSError as exc:
        statuses.append(type(exc).__name__)


def memory_section(args, work):
    """Peak RSS of HAProxy with --inflight bodies in flight, per buffer size; the routed offset of "model"."""
    print("\nreading \"model\" from the body: HAProxy's memory with %d requests in flight (bodies of 4 x the "
          "buffer, engine silent 2 s), and how far into the body \"model\" may sit" % args.inflight)
    header = "%-12s %14s %14s %16s %22s" % ("bufsize", "RSS idle MiB", "RSS peak MiB", "per request KiB",
                                            "model routed up to")
    print(header)
    print("-" * len(header))
    for bufsize in (65536, 1 << 20, 4 << 20):
        port, other = free_port(), free_port()
        procs = []
        for engine_port, model, silence in ((port, MODEL, "2"), (other, "other", "0")):
            argv = [sys.executable, "-m", "tests.fixtures.stream_double", "--port", str(engine_port),
                    "--model", model, "--api-key", ENGINE_KEY, "--silence", silence, "--first-delay", "0",
                    "--interval", "0"]
            procs.append(subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
                                          env=dict(os.environ, PYTHONPATH=ROOT)))
        try:
            for engine_port, proc in zip((port, other), procs, strict=True):
                wait_for("http://127.0.0.1:%d" % engine_port, proc, os.devnull)
            hostvars = {"n1": node_vars({MODEL: (MODEL, port, "llama.cpp")}, key=ENGINE_KEY),
                        "n2": node_vars({"other": ("other", other, "llama.cpp")}, key=ENGINE_KEY)}
            directory = tempfile.mkdtemp(dir=work)
            with running_gateway(directory, hostvars, gateway_tls=False, gateway_bufsize=bufsize,
                                 gateway_api_keys=BENCH_KEYS) as gw:
                pid = _haproxy_pid(gw["admin"])
                idle = _rss_kib(pid, "VmRSS")
                body = json.dumps({"model": MODEL, "max_tokens": 1,
                                   "messages": [{"role": "user", "content": "x" * (4 * bufsize)}]}).encode()
                statuses = []
                threads = [threading.Thread(target=_one_request, args=(gw["port"], body, statuses))
                           for _ in range(args.inflight)]
                for thread in threads:
                    thread.start()
                for thread in threads:
                    thread.join(60)
                peak = _rss_kib(pid, "VmHWM")
                failed = [status for status in statuses if status != 200]
                if failed:
                    print("%d of the %d requests failed: %s" % (len(failed), args.inflight, failed[:5]))
                offset = _routed_offset(gw["port"], bufsize)
        finally:
            for proc in procs:
                proc.terminate()
                proc.wait(10)
        per_request = (peak - idle) / float(args.inflight)
        print("%-12s %14.1f %14.1f %16.0f %20d B" % ("%d KiB" % (bufsize // 1024), idle / 1024.0,
                                                      peak / 1024.0, per_request, offset))
    print("(beyond the routed offset a request names its model in the X-Model header; each request in flight "
          "holds up to two buffers)")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=300, help="one-token generations per way (default 300)")
    ap.add_argument("--streams", type=int, default=30, help="streamed generations per way (default 30)")
    ap.add_argument("--tokens", type=int, default=32, help="tokens per stream (default 32)")
    ap.add_argument("--engine", choices=("auto", "llama-server", "double"), default="auto")
    ap.add_argument("--generations", type=int, default=2000,
                    help="generations per gateway way (plain, TLS), client connection kind (kept-alive, new) "
                         "and mode (sequential, concurrent) that must all succeed (default 2000; 0: skip)")
    ap.add_argument("--concurrency", type=int, default=8, help="clients of the concurrent mode (default 8)")
    ap.add_argument("--generation-tokens", type=int, default=2, help="tokens per such generation (default 2)")
    ap.add_argument("--direct-control", action="store_true",
                    help="also count failures of the same generations sent to the engine directly")
    ap.add_argument("--memory", action="store_true", help="also measure the buffer sizes' memory and reach")
    ap.add_argument("--inflight", type=int, default=64, help="requests in flight for --memory (default 64)")
    args = ap.parse_args()
    from ansible.plugins.loader import init_plugin_loader
    init_plugin_loader([COLLECTIONS])  # the role's templates use the collection's filters
    for tool in ("haproxy", "openssl"):
        if not shutil.which(tool) and not os.path.exists("/usr/sbin/" + tool):
            print("needs %s (apt-get install haproxy openssl)" % tool)
            return 1
    t0 = time.time()
    work = tempfile.mkdtemp(prefix="bench-gateway-")
    try:
        with engine_process(args.engine, work) as (name, engine, port):
            print("engine: %s, on 127.0.0.1:%d" % (name, port))
            hostvars = {"n1": node_vars({MODEL: (MODEL, port, engine)}, key=ENGINE_KEY,
                                        settings={"ctx_size": 4096})}
            with running_gateway(tempfile.mkdtemp(dir=work), hostvars, gateway_tls=False,
                                 gateway_api_keys=BENCH_KEYS) as plain, \
                    running_gateway(tempfile.mkdtemp(dir=work), hostvars, gateway_tls=True,
                                    gateway_api_keys=BENCH_KEYS) as tls:
                ports = {"direct": port, "plain": plain["port"], "tls": tls["port"]}
                results = measure(ports, args)
                kept_ms, new_ms = connection_cost(port, ENGINE_KEY, max(args.requests // 3, 20))
                counts = {}
                if args.generations > 0:
                    print("\ngenerations that must all succeed (%d tokens each; concurrent: %d clients):"
                          % (args.generation_tokens, args.concurrency), flush=True)
                    counts = reliability(ports, args)
                    for way, gateway in (("plain", plain), ("tls", tls)):
                        if any(sum(value[1].values()) for key, value in counts.items() if key[0] == way):
                            lines = gateway["log"].read_text(errors="replace").splitlines()
                            print("HAProxy's log (%s), the last lines:\n%s" % (way, "\n".join(lines[-15:])))
            print("\ngateway: roles/gateway rendered (HAProxy %s), client keep-alive, a new server "
                  "connection per request; %d one-token requests and %d streams of %d tokens per way, "
                  "interleaved\n"
                  % (subprocess.run(["haproxy", "-v"], stdout=subprocess.PIPE, universal_newlines=True,
                                    check=False).stdout.split()[2], args.requests, args.streams, args.tokens))
            goals = report(results)
            print("a new connection per request at the engine (what the gateway does): one-token p50 %.2f ms "
                  "kept-alive, %.2f ms new (%+.2f ms)" % (kept_ms, new_ms, new_ms - kept_ms))
            goals += reliability_goals(counts)
        if args.memory:
            memory_section(args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print()
    for text, ok in goals:
        print("goal: %s: %s" % (text, "PASS" if ok else "FAIL"))
    print("%.0f s" % (time.time() - t0))
    return 0 if all(ok for _, ok in goals) else 1


if __name__ == "__main__":
    sys.exit(main())
