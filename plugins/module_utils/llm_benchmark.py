# -*- coding: utf-8 -*-
# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Benchmark an OpenAI-compatible endpoint (llama-server or vLLM) the way seed 003 does by hand.

Unique prompts (a random UUID and random words, so no prefix cache helps; the server's cached prompt tokens
are reported to prove it), warm-up requests that are not counted, then runs at given prompt lengths, output
lengths and concurrency levels, all streaming. Per request: time to first token, prefill and decode tokens/s
measured by the client, and the server's own figures where it returns them (llama-server's final-chunk
`timings`; vLLM's speculative-decoding counters from /metrics, read before and after each run).

Python 3.6, standard library only. `benchmark()` is the entry point; it never raises for a failed request:
errors are counted and reported per run. The API key never appears in what it returns.
"""
from __future__ import absolute_import, division, print_function

import http.client as http_client
import json
import random
import socket
import threading
import time
import uuid
from urllib.parse import urlsplit

__metaclass__ = type

ENGINES = ("llama.cpp", "vllm")
# the variable holding the key in an engine's environment file when api_key_env is not given
DEFAULT_KEY_VARIABLE = {"llama.cpp": "LLAMA_API_KEY", "vllm": "VLLM_API_KEY"}
DEFAULT_RUNS = (
    {"prompt_tokens": 1024, "max_tokens": 256, "concurrency": 1, "requests": 3},
    {"prompt_tokens": 1024, "max_tokens": 256, "concurrency": 2, "requests": 4},
)
# vLLM's speculative decoding counters (Prometheus text on /metrics)
VLLM_ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
VLLM_DRAFTED = "vllm:spec_decode_num_draft_tokens_total"
# warm-ups that calibrate words -> tokens: two different lengths give the slope and the template overhead
CALIBRATION_WORDS = (48, 192)
WARMUP_MAX_TOKENS = 8
MAX_ERROR_MESSAGES = 10
REDACTED = "<redacted>"

# Plain words the tokenizers of common models split into one or two tokens each.
WORDS = (
    "river mountain window garden pencil orange silver bridge candle forest harbor ladder marble pepper "
    "rocket saddle tunnel violin wagon yellow anchor basket castle dragon engine feather galaxy hammer "
    "island jacket kettle lantern magnet needle oyster parrot quartz rabbit shadow ticket umbrella valley "
    "walnut zipper copper meadow planet thunder blanket compass desert elbow falcon glacier helmet insect "
    "jungle kernel lemon mirror nickel orchard pillow puzzle ribbon sponge timber unicorn velvet whistle "
    "bottle carpet dolphin eagle fabric ginger honey iron jelly kitten lobster mango noodle olive peanut "
    "quiet rose salmon tiger uncle vessel winter yogurt zebra autumn breeze cloud dawn echo flame grove "
    "hill ivory jade knot leaf moss night ocean pearl quill rain stone tide vine wave yarn"
).split()


class BenchmarkError(Exception):
    """The benchmark cannot start (no model list, bad key file...); the message never holds the key."""


# --- the API key --------------------------------------------------------------------------------------------

def parse_env_file(text):
    """{name: value} of a systemd EnvironmentFile: KEY=VALUE lines, '#' and ';' comments, values in single
    or double quotes (backslash escapes inside double quotes), a trailing backslash continues a line."""
    values = {}
    logical = []
    pending = ""
    for raw in text.splitlines():
        if raw.endswith("\\") and not raw.endswith("\\\\"):
            pending += raw[:-1]
            continue
        logical.append(pending + raw)
        pending = ""
    if pending:
        logical.append(pending)
    for line in logical:
        line = line.strip()
        if not line or line[0] in "#;" or "=" not in line:
            continue
        name, value = line.split("=", 1)
        values[name.strip()] = _unquote(value.strip())
    return values


def _unquote(value):
    if len(value) >= 2 and value[0] == value[-1] == "'":
        return value[1:-1]
    if len(value) >= 2 and value[0] == value[-1] == '"':
        out = []
        chars = iter(value[1:-1])
        for char in chars:
            if char == "\\":
                escaped = next(chars, "")
                out.append({"n": "\n", "t": "\t"}.get(escaped, escaped))
            else:
                out.append(char)
        return "".join(out)
    return value


def read_api_key(api_key=None, api_key_file=None, env_file=None, api_key_env=None, engine="llama.cpp"):
    """The key from one of: api_key; api_key_file (llama-server's --api-key-file: the first line that is
    neither empty nor a '#' comment); env_file's api_key_env variable (default per engine). None if none."""
    if api_key:
        return api_key
    if api_key_file:
        for line in _read_text(api_key_file, "api_key_file").splitlines():
            line = line.strip()
            if line and not line.startswith("#"):
                return line
        raise BenchmarkError("api_key_file %s holds no key" % api_key_file)
    if env_file:
        variable = api_key_env or DEFAULT_KEY_VARIABLE.get(engine, "VLLM_API_KEY")
        key = parse_env_file(_read_text(env_file, "env_file")).get(variable)
        if not key:
            raise BenchmarkError("env_file %s does not set %s" % (env_file, variable))
        return key
    return None


def _read_text(path, option):
    try:
        with open(path) as handle:
            return handle.read()
    except (IOError, OSError) as exc:
        raise BenchmarkError("cannot read %s %s: %s" % (option, path, exc.strerror or exc)) from None


# --- HTTP ---------------------------------------------------------------------------------------------------

class Endpoint:
    """The server at a base URL (http or https) with an optional bearer key; one connection per request,
    so concurrent requests never share a socket."""

    def __init__(self, url, api_key=None, timeout=300.0):
        parts = urlsplit(url.rstrip("/"))
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise BenchmarkError("url must be http(s)://host[:port], got %r" % url)
        self.https = parts.scheme == "https"
        self.host = parts.hostname
        self.port = parts.port
        self.prefix = parts.path
        self.api_key = api_key
        self.timeout = timeout

    def redact(self, text):
        text = str(text)
        return text.replace(self.api_key, REDACTED) if self.api_key else text

    def open(self, method, path, body=None):
        """(connection, response) of a request; the caller reads and closes."""
        cls = http_client.HTTPSConnection if self.https else http_client.HTTPConnection
        conn = cls(self.host, self.port, timeout=self.timeout)
        headers = {"Accept": "application/json, text/event-stream"}
        if body is not None:
            headers["Content-Type"] = "application/json"
        if self.api_key:
            headers["Authorization"] = "Bearer " + self.api_key
        payload = None if body is None else json.dumps(body).encode("utf-8")
        try:
            conn.request(method, self.prefix + path, body=payload, headers=headers)
            return conn, conn.getresponse()
        except Exception:
            conn.close()
            raise

    def get(self, path):
        """(status, body text) of a GET."""
        conn, resp = self.open("GET", path)
        try:
            return resp.status, resp.read().decode("utf-8", "replace")
        finally:
            conn.close()


def http_error_message(status, text):
    """'HTTP 401: Invalid API Key' from an OpenAI-style error body (or its first 200 characters)."""
    try:
        error = json.loads(text).get("error")
        detail = error.get("message") if isinstance(error, dict) else error
    except (ValueError, AttributeError):
        detail = None
    return "HTTP %d: %s" % (status, detail or text.strip()[:200] or "(no body)")


def default_model(endpoint):
    """The id of the first model GET /v1/models lists."""
    try:
        status, text = endpoint.get("/v1/models")
    except (socket.error, http_client.HTTPException) as exc:
        raise BenchmarkError("cannot list models: %s" % endpoint.redact(exc)) from None
    if status != 200:
        raise BenchmarkError("cannot list models: %s" % endpoint.redact(http_error_message(status, text)))
    try:
        return json.loads(text)["data"][0]["id"]
    except (ValueError, KeyError, IndexError, TypeError):
        raise BenchmarkError("GET /v1/models returned no model: %s" % endpoint.redact(text[:200])) from None


def scrape_counters(endpoint, names):
    """{name: value summed over its label sets} from the Prometheus text on /metrics; {} if unavailable."""
    try:
        status, text = endpoint.get("/metrics")
    except (socket.error, http_client.HTTPException):
        return {}
    if status != 200:
        return {}
    totals = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in names:
            try:
                totals[name] = totals.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
            except (ValueError, IndexError):
                continue
    return totals


# --- one streamed request -----------------------------------------------------------------------------------

def stream_chat(endpoint, body):
    """Send one streaming chat completion and time it. Returns a record:
    ok, error, t_start, t_first (first content or reasoning token), t_last (last one), chunks (token
    events), usage and timings (of the last chunk that had them), all times from time.monotonic()."""
    record = {"ok": False, "error": None, "t_start": time.monotonic(), "t_first": None, "t_last": None,
              "chunks": 0, "usage": None, "timings": None}
    deadline = record["t_start"] + endpoint.timeout
    conn = None
    try:
        conn, resp = endpoint.open("POST", "/v1/chat/completions", body)
        if resp.status != 200:
            record["error"] = http_error_message(resp.status, resp.read().decode("utf-8", "replace"))
        while record["error"] is None:
            line = resp.readline()
            if not line:
                break
            if time.monotonic() > deadline:
                raise socket.timeout("request took longer than %s s" % endpoint.timeout)
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                break
            _take_chunk(record, json.loads(data.decode("utf-8")), time.monotonic())
        if record["error"] is None:
            record["ok"] = record["t_first"] is not None
            if not record["ok"]:
                record["error"] = "the stream ended without a token"
    except socket.timeout as exc:
        record["error"] = "timeout: %s" % (str(exc) or "no data for %s s" % endpoint.timeout)
    except (socket.error, http_client.HTTPException, ValueError, AttributeError, TypeError) as exc:
        # a broken stream (bad JSON, a chunk of the wrong shape) is this request's error, not a crash
        record["error"] = "%s: %s" % (type(exc).__name__, exc)
    finally:
        if conn is not None:
            conn.close()
    if record["error"]:
        record["ok"] = False
        record["error"] = endpoint.redact(record["error"])
    return record


def _take_chunk(record, chunk, now):
    if chunk.get("error"):
        error = chunk["error"]
        record["error"] = "stream error: %s" % (error.get("message") if isinstance(error, dict) else error)
    if chunk.get("usage"):
        record["usage"] = chunk["usage"]
    if chunk.get("timings"):
        record["timings"] = chunk["timings"]
    for choice in chunk.get("choices") or ():
        delta = choice.get("delta") or {}
        if delta.get("content") or delta.get("reasoning_content") or delta.get("reasoning"):
            if record["t_first"] is None:
                record["t_first"] = now
            record["t_last"] = now
            record["chunks"] += 1


def request_metrics(record):
    """Per-request figures from a successful record: token counts from usage (chunks when absent), TTFT,
    client prefill and decode tokens/s, the server's own rates and draft counts when it returned timings."""
    usage = record["usage"] or {}
    timings = record["timings"] or {}
    completion = usage.get("completion_tokens", record["chunks"])
    prompt = usage.get("prompt_tokens")
    ttft = record["t_first"] - record["t_start"]
    decode_span = record["t_last"] - record["t_first"]
    details = usage.get("prompt_tokens_details") or {}
    cached = timings.get("cache_n", details.get("cached_tokens"))
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "cached_prompt_tokens": cached,
        "ttft_s": ttft,
        "prefill_tps": prompt / ttft if prompt and ttft > 0 else None,
        # the first token comes from the prefill; the others are decode steps (llama-server counts alike)
        "decode_tps": (completion - 1) / decode_span if completion > 1 and decode_span > 0 else None,
        "server_prefill_tps": timings.get("prompt_per_second") or None,
        "server_decode_tps": timings.get("predicted_per_second") or None,
        "draft_n": timings.get("draft_n"),
        "draft_n_accepted": timings.get("draft_n_accepted"),
    }


# --- prompts ------------------------------------------------------------------------------------------------

def make_prompt(rng, n_words):
    """A prompt no cache has seen: a 64-character random id (uuid4, never from the seeded rng, so a
    repeated benchmark with the same seed is still unique) and n_words words chosen by rng."""
    words = " ".join(rng.choice(WORDS) for _word in range(max(0, n_words)))
    return "Request %s%s.\n%s\nContinue this list of words." % (uuid.uuid4().hex, uuid.uuid4().hex, words)


class Calibration:
    """prompt tokens = overhead + per_word * words, fitted by least squares to (words, prompt_tokens)
    pairs from the servers' usage fields (the overhead is the chat template and the prompt's frame)."""

    def __init__(self, points):
        mean_x = sum(float(words) for words, _tokens in points) / len(points)
        mean_y = sum(float(tokens) for _words, tokens in points) / len(points)
        var = sum((words - mean_x) ** 2 for words, _tokens in points)
        if var > 0:
            self.per_word = sum((w - mean_x) * (t - mean_y) for w, t in points) / var
            self.overhead = mean_y - self.per_word * mean_x
        else:
            self.per_word, self.overhead = mean_y / max(mean_x, 1.0), 0.0
        self.per_word = max(self.per_word, 0.1)

    def words_for(self, tokens):
        return max(1, int(round((tokens - self.overhead) / self.per_word)))


# --- runs ---------------------------------------------------------------------------------------------------

def normalize_runs(runs):
    """Runs with every key set: requests defaults to the larger of 3 and the concurrency."""
    out = []
    for run in runs or DEFAULT_RUNS:
        concurrency = int(run.get("concurrency") or 1)
        item = {"prompt_tokens": int(run["prompt_tokens"]), "max_tokens": int(run.get("max_tokens") or 256),
                "concurrency": concurrency, "requests": int(run.get("requests") or max(3, concurrency))}
        for key in ("prompt_tokens", "max_tokens", "concurrency", "requests"):
            if item[key] < 1:
                raise BenchmarkError("runs: %s must be at least 1, got %d" % (key, item[key]))
        out.append(item)
    return out


def request_body(model, prompt, max_tokens):
    """A streaming chat request whose output is max_tokens long: ignore_eos (llama-server and vLLM both
    accept it) keeps the model from stopping early."""
    return {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": True}


def run_concurrently(count, concurrency, work):
    """Call work(i) for i in range(count) from `concurrency` threads; (results in order, wall seconds)."""
    results = [None] * count
    lock = threading.Lock()
    queue = list(range(count))

    def worker():
        while True:
            with lock:
                if not queue:
                    return
                index = queue.pop(0)
            results[index] = work(index)

    threads = [threading.Thread(target=worker) for _thread in range(min(concurrency, count))]
    start = time.monotonic()
    for thread in threads:
        thread.daemon = True
        thread.start()
    for thread in threads:
        thread.join()
    return results, time.monotonic() - start


def _mean(values):
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def _percentile(sorted_values, fraction):
    if not sorted_values:
        return None
    position = (len(sorted_values) - 1) * fraction
    low = int(position)
    high = min(low + 1, len(sorted_values) - 1)
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * (position - low)


def _round(value, digits=3):
    return None if value is None else round(value, digits)


def summarize_run(run, records, wall_s, spec_counters=None):
    """One run's report (the result's `runs` item) from its request records and wall time.
    spec_counters: (accepted, drafted) deltas from vLLM's /metrics, or None."""
    good = [request_metrics(r) for r in records if r["ok"]]
    errors = [r["error"] for r in records if not r["ok"]]
    ttfts = sorted(m["ttft_s"] for m in good)
    drafted = sum(m["draft_n"] or 0 for m in good)
    accepted = sum(m["draft_n_accepted"] or 0 for m in good)
    if spec_counters and spec_counters[1] > 0:
        accepted, drafted = spec_counters
    messages = []
    for message in errors:
        if message not in messages and len(messages) < MAX_ERROR_MESSAGES:
            messages.append(message)
    return {
        "prompt_tokens_target": run["prompt_tokens"], "max_tokens": run["max_tokens"],
        "concurrency": run["concurrency"], "requests": len(records), "ok": len(good), "errors": len(errors),
        "error_messages": messages, "wall_s": _round(wall_s),
        "prompt_tokens": _round(_mean(m["prompt_tokens"] for m in good), 1),
        "completion_tokens": _round(_mean(m["completion_tokens"] for m in good), 1),
        "cached_prompt_tokens": _round(_mean(m["cached_prompt_tokens"] for m in good), 1),
        "ttft_s": {"mean": _round(_mean(ttfts), 4), "p50": _round(_percentile(ttfts, 0.5), 4),
                   "p90": _round(_percentile(ttfts, 0.9), 4), "max": _round(ttfts[-1] if ttfts else None, 4)},
        "prefill_tps": _round(_mean(m["prefill_tps"] for m in good), 2),
        "decode_tps": _round(_mean(m["decode_tps"] for m in good), 2),
        "decode_tps_total": _round(sum(m["completion_tokens"] or 0 for m in good) / wall_s
                                   if good and wall_s > 0 else None, 2),
        "server_prefill_tps": _round(_mean(m["server_prefill_tps"] for m in good), 2),
        "server_decode_tps": _round(_mean(m["server_decode_tps"] for m in good), 2),
        "draft_acceptance": _round(accepted / drafted if drafted else None, 4),
        "draft_tokens": drafted or None, "draft_accepted_tokens": accepted if drafted else None,
    }


def summarize(runs):
    """The result's `summary`: the figures of the lowest-concurrency runs (means over those runs), the
    acceptance over all runs, and the client/server decode ratio where both exist."""
    measured = [r for r in runs if r["ok"]]
    if not measured:
        return {"decode_tps": None, "ttft_s": None, "prefill_tps": None, "server_decode_tps": None,
                "draft_acceptance": None, "decode_tps_agreement": None}
    lowest = min(r["concurrency"] for r in measured)
    base = [r for r in measured if r["concurrency"] == lowest]
    decode = _mean(r["decode_tps"] for r in base)
    server = _mean(r["server_decode_tps"] for r in base)
    drafted = sum(r["draft_tokens"] or 0 for r in runs)
    accepted = sum(r["draft_accepted_tokens"] or 0 for r in runs)
    return {
        "decode_tps": _round(decode, 2),
        "ttft_s": _round(_mean(r["ttft_s"]["mean"] for r in base), 4),
        "prefill_tps": _round(_mean(r["prefill_tps"] for r in base), 2),
        "server_decode_tps": _round(server, 2),
        "draft_acceptance": _round(accepted / drafted if drafted else None, 4),
        "decode_tps_agreement": _round(decode / server if decode and server else None, 4),
    }


class Benchmark:
    """One benchmark of one endpoint; see benchmark()."""

    def __init__(self, endpoint, engine, model, seed=None):
        self.endpoint = endpoint
        self.engine = engine
        self.model = model
        self.rng = random.Random(seed)
        self.rng_lock = threading.Lock()
        self.calibration = None
        self.last_error = None

    def prompt(self, n_words):
        with self.rng_lock:  # random.Random is shared by the worker threads
            return make_prompt(self.rng, n_words)

    def send(self, n_words, max_tokens):
        return stream_chat(self.endpoint, request_body(self.model, self.prompt(n_words), max_tokens))

    def warm_up(self, count, runs):
        """count warm-up requests, not measured. The first two (small, two lengths) calibrate words ->
        tokens; later ones use the runs' prompt lengths, largest first, as seed 003 warms its 20K and 60K
        shapes. Calibration requests are added when the warm-ups gave fewer than two lengths to fit."""
        points = []
        lengths = sorted(set(r["prompt_tokens"] for r in runs), reverse=True)
        for index in range(count):
            if index < len(CALIBRATION_WORDS) or not points:
                self._probe(CALIBRATION_WORDS[index % len(CALIBRATION_WORDS)], points)
            else:
                target = lengths[(index - len(CALIBRATION_WORDS)) % len(lengths)]
                self.send(Calibration(points).words_for(target), WARMUP_MAX_TOKENS)
        for _attempt in range(2 * len(CALIBRATION_WORDS)):
            have = set(words for words, _tokens in points)
            missing = [words for words in CALIBRATION_WORDS if words not in have]
            if not missing:
                break
            self._probe(missing[0], points)
        if not points:
            raise BenchmarkError("no warm-up request succeeded, cannot calibrate prompt lengths (%s)"
                                 % self.last_error)
        self.calibration = Calibration(points)

    def _probe(self, words, points):
        """A warm-up of `words` words; its usage.prompt_tokens becomes a calibration point."""
        record = self.send(words, WARMUP_MAX_TOKENS)
        prompt_tokens = (record["usage"] or {}).get("prompt_tokens")
        if record["ok"] and prompt_tokens:
            points.append((words, prompt_tokens))
        else:
            self.last_error = record["error"] or "the server answered without usage.prompt_tokens"

    def measure(self, run):
        counters = (VLLM_ACCEPTED, VLLM_DRAFTED)
        before = scrape_counters(self.endpoint, counters) if self.engine == "vllm" else {}
        words = self.calibration.words_for(run["prompt_tokens"])
        records, wall = run_concurrently(run["requests"], run["concurrency"],
                                         lambda _index: self.send(words, run["max_tokens"]))
        spec = None
        if before:
            after = scrape_counters(self.endpoint, counters)
            spec = tuple(after.get(name, 0.0) - before.get(name, 0.0) for name in counters)
        return summarize_run(run, records, wall, spec)


def benchmark(url, engine="llama.cpp", model=None, api_key=None, runs=None, warmup_requests=2,
              timeout=300.0, seed=None):
    """Benchmark the endpoint at url. Returns the module's result (see plugins/modules/llm_benchmark.py):
    {url, engine, model, calibration, runs: [...], summary: {...}, errors, failed}.
    Raises BenchmarkError when it cannot start (bad options, no model, no warm-up answered)."""
    if engine not in ENGINES:
        raise BenchmarkError("engine must be one of %s, got %r" % (", ".join(ENGINES), engine))
    runs = normalize_runs(runs)
    endpoint = Endpoint(url, api_key, timeout)
    model = model or default_model(endpoint)
    bench = Benchmark(endpoint, engine, model, seed)
    bench.warm_up(warmup_requests, runs)
    reports = [bench.measure(run) for run in runs]
    errors = sum(r["errors"] for r in reports)
    return {
        "url": url, "engine": engine, "model": model,
        "calibration": {"tokens_per_word": _round(bench.calibration.per_word, 4),
                        "overhead_tokens": _round(bench.calibration.overhead, 1)},
        "runs": reports, "summary": summarize(reports), "errors": errors, "failed": errors > 0,
    }
