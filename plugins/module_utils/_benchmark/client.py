# -*- coding: utf-8 -*-
# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
# PRIVATE to llmops.serving: it can change at any time; do not import it from other collections.
"""Benchmark an OpenAI-compatible endpoint (llama-server or vLLM) the way seed 003 does by hand.

Unique prompts (a random UUID and random words, so no prefix cache helps; the server's cached prompt tokens
are reported to prove it), warm-up requests that are not counted, then runs at given prompt lengths, output
lengths and concurrency levels, all streaming. Per request: time to first token, prefill and decode tokens/s
measured by the client, and the server's own figures where it returns them (llama-server's final-chunk
`timings`; vLLM's speculative-decoding counters from /metrics, read before and after each run: the engine
descriptor's spec_metrics, module_utils/engines.py).

Python 3.6, standard library only. `benchmark()` is the entry point; it never raises for a failed request:
errors are counted and reported per run. The API key never appears in what it returns.
"""
from __future__ import absolute_import, division, print_function

import http.client as http_client
import json
import math
import random
import socket
import threading
import time
from urllib.parse import urlsplit

from ansible_collections.llmops.serving.plugins.module_utils import engines
from ansible_collections.llmops.serving.plugins.module_utils._serving.env_file import parse_env_text
from ansible_collections.llmops.serving.plugins.module_utils.secrets import SecretError, check_secret, scrub

__metaclass__ = type

DEFAULT_RUNS = (
    {"prompt_tokens": 1024, "max_tokens": 256, "concurrency": 1, "requests": 3},
    {"prompt_tokens": 1024, "max_tokens": 256, "concurrency": 2, "requests": 4},
)
# warm-ups that calibrate words -> tokens: two different lengths give the slope and the template overhead
CALIBRATION_WORDS = (48, 192)
WARMUP_MAX_TOKENS = 8
# A run's wall time its requests' time to first token and decode leave unexplained beyond this (seconds and
# fraction of the wall time) is a stall the run reports; so is a connect or a queue longer than STALL_MIN_S.
STALL_MIN_S = 1.0
STALL_FRACTION = 0.1
MAX_ERROR_MESSAGES = 10
REDACTED = "<redacted>"
# Read limits (documented in the module): one SSE line, a whole streamed answer, a plain body (/v1/models,
# /metrics, /slots), a key or env file. A server past them gets an error for that request, not our memory.
MAX_LINE_BYTES = 1024 * 1024
MAX_STREAM_BYTES = 256 * 1024 * 1024
MAX_BODY_BYTES = 16 * 1024 * 1024
MAX_FILE_BYTES = 1024 * 1024
# Option ranges: (low, high); a value outside is refused naming the option.
OPTION_RANGES = {"timeout": (0.001, 86400.0), "busy_wait": (0.0, 86400.0), "busy_poll": (0.001, 3600.0)}
RUN_RANGES = {"prompt_tokens": 10 ** 7, "max_tokens": 10 ** 7, "concurrency": 1024, "requests": 10 ** 6}
MAX_WARMUP = 1000

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


def engine_descriptor(engine):
    """The descriptor of `engine` (module_utils/engines.py); BenchmarkError when there is none."""
    descriptor = engines.lookup(engine)
    if descriptor is None:
        raise BenchmarkError("engine must be one of %s, got %r" % (", ".join(engines.names()), engine))
    return descriptor


# --- the API key --------------------------------------------------------------------------------------------

def parse_env_file(text):
    """{name: value} of an env file, read as serving writes it (module_utils/_serving/env_file.py: the one
    reader)."""
    return parse_env_text(text)


def read_api_key(api_key=None, api_key_file=None, env_file=None, api_key_env=None,
                 engine=engines.DEFAULT_ENGINE):
    """The key from one of: api_key; api_key_file (llama-server's --api-key-file: the first line that is
    neither empty nor a '#' comment); env_file's api_key_env variable (default: the engine descriptor's
    key_variable). None if none."""
    try:
        if api_key:
            return check_secret(api_key, "api_key")
        if api_key_file:
            for line in _read_text(api_key_file, "api_key_file").splitlines():
                line = line.strip()
                if line and not line.startswith("#"):
                    return check_secret(line, "the key in api_key_file %s" % api_key_file)
            raise BenchmarkError("api_key_file %s holds no key" % api_key_file)
        if env_file:
            variable = api_key_env or engine_descriptor(engine).key_variable
            key = parse_env_file(_read_text(env_file, "env_file")).get(variable)
            if not key:
                raise BenchmarkError("env_file %s does not set %s" % (env_file, variable))
            return check_secret(key, "%s in env_file %s" % (variable, env_file))
    except SecretError as exc:
        raise BenchmarkError(str(exc)) from None
    return None


def check_options(timeout=300.0, busy_wait=120.0, busy_poll=5.0, warmup_requests=2, runs=None):
    """The numeric options in range (finite; a NaN or inf timeout would never end a request)."""
    values = {"timeout": timeout, "busy_wait": busy_wait, "busy_poll": busy_poll}
    for name, (low, high) in sorted(OPTION_RANGES.items()):
        value = values[name]
        if value is None or isinstance(value, bool) or not isinstance(value, (int, float)) \
                or not math.isfinite(value) or not low <= value <= high:
            raise BenchmarkError("%s must be a number of seconds from %g to %g, got %r"
                                 % (name, low, high, value))
    if not isinstance(warmup_requests, int) or not 0 <= warmup_requests <= MAX_WARMUP:
        raise BenchmarkError("warmup_requests must be from 0 to %d, got %r" % (MAX_WARMUP, warmup_requests))
    for index, run in enumerate(runs or ()):
        if not isinstance(run, dict):
            raise BenchmarkError("runs[%d] must be a mapping (prompt_tokens, max_tokens, concurrency, "
                                 "requests)" % index)
        for key, high in sorted(RUN_RANGES.items()):
            value = run.get(key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                      or not 1 <= value <= high):
                raise BenchmarkError("runs[%d].%s must be from 1 to %d, got %r" % (index, key, high, value))


def _read_text(path, option):
    """A key or env file's text: a regular file (never a FIFO that blocks, nor a device), at most
    MAX_FILE_BYTES, UTF-8."""
    import os
    import stat
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except (IOError, OSError, ValueError) as exc:
        reason = getattr(exc, "strerror", None) or exc
        raise BenchmarkError("cannot read %s %s: %s" % (option, path, reason)) from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise BenchmarkError("%s %s is not a regular file" % (option, path))
        data = os.read(fd, MAX_FILE_BYTES + 1)
    except (IOError, OSError) as exc:
        raise BenchmarkError("cannot read %s %s: %s" % (option, path, exc.strerror or exc)) from None
    finally:
        os.close(fd)
    if len(data) > MAX_FILE_BYTES:
        raise BenchmarkError("%s %s is larger than %d bytes: not a key file" % (option, path, MAX_FILE_BYTES))
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise BenchmarkError("%s %s is not UTF-8 text" % (option, path)) from None


def _shutdown(sock):
    """The watchdog of a request's total deadline: shutting the socket down wakes a blocked read at once
    (a server that sends one byte a second never lets an idle timeout fire)."""
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except (OSError, socket.error, ValueError):
        pass


class _Watchdog:
    def __init__(self, sock, seconds):
        self.timer = threading.Timer(max(seconds, 0.0), _shutdown, [sock])
        self.timer.daemon = True
        self.timer.start()

    def cancel(self):
        self.timer.cancel()


# --- HTTP ---------------------------------------------------------------------------------------------------

class Endpoint:
    """The server at a base URL (http or https) with an optional bearer key; one connection per request,
    so concurrent requests never share a socket."""

    def __init__(self, url, api_key=None, timeout=300.0):
        if not isinstance(url, str) or any(ord(c) < 33 or ord(c) == 127 for c in url):
            raise BenchmarkError("url must be http(s)://host[:port] without spaces or control characters")
        try:
            parts = urlsplit(url.rstrip("/"))
            port = parts.port
        except ValueError:
            raise BenchmarkError("url must be http(s)://host[:port], got %r" % url[:200]) from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise BenchmarkError("url must be http(s)://host[:port], got %r" % url[:200])
        self.https = parts.scheme == "https"
        self.host = parts.hostname
        self.port = port
        self.prefix = parts.path
        self.api_key = api_key
        self.timeout = timeout

    def redact(self, text):
        """`text` without the key in any form (raw, escaped as in b'Bearer ...', URL-encoded)."""
        return scrub(str(text), self.api_key, mask=REDACTED) if self.api_key else str(text)

    def open(self, method, path, body=None, deadline=None, marks=None):
        """(connection, response) of a request; the caller reads and closes (close() also ends the
        watchdog that enforces `deadline`, time.monotonic() based: the request's total time). `marks`, a
        dict, gets the times the connection was made ("connected"), the request written ("sent") and the
        response's headers read ("headers")."""
        marks = {} if marks is None else marks
        cls = http_client.HTTPSConnection if self.https else http_client.HTTPConnection
        deadline = time.monotonic() + self.timeout if deadline is None else deadline
        conn = cls(self.host, self.port, timeout=max(min(self.timeout, deadline - time.monotonic()), 0.001))
        try:
            conn.connect()
        except Exception:
            conn.close()
            raise
        marks["connected"] = time.monotonic()
        # the socket itself: http.client drops conn.sock when the answer says Connection: close
        watchdog = _Watchdog(conn.sock, deadline - time.monotonic())
        opening = [True]
        close = conn.close

        def close_all():
            if not opening[0]:  # getresponse() closes conn itself: the watchdog stays until the caller's
                watchdog.cancel()
            close()
        conn.close = close_all
        headers = {"Accept": "application/json, text/event-stream"}
        if body is not None:
            headers["Content-Type"] = "application/json"
        if self.api_key:
            headers["Authorization"] = "Bearer " + self.api_key
        payload = None if body is None else json.dumps(body).encode("utf-8")
        try:
            conn.request(method, self.prefix + path, body=payload, headers=headers)
            marks["sent"] = time.monotonic()
            response = conn.getresponse()
            marks["headers"] = time.monotonic()
        except Exception:
            opening[0] = False
            conn.close()
            raise
        opening[0] = False
        return conn, response

    def get(self, path):
        """(status, body text) of a GET, within the timeout in all and at most MAX_BODY_BYTES."""
        deadline = time.monotonic() + self.timeout
        conn, resp = self.open("GET", path, deadline=deadline)
        try:
            data = resp.read(MAX_BODY_BYTES + 1)
            if len(data) > MAX_BODY_BYTES:
                raise http_client.HTTPException("the answer to GET %s is larger than %d bytes"
                                                % (path, MAX_BODY_BYTES))
            if time.monotonic() > deadline:
                raise socket.timeout("GET %s took longer than %s s" % (path, self.timeout))
            return resp.status, data.decode("utf-8", "replace")
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
        model = json.loads(text)["data"][0]["id"]
        if not isinstance(model, str) or not model:
            raise TypeError(model)
        return model
    except (ValueError, KeyError, IndexError, TypeError, RecursionError):
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
                value = float(line.rsplit(" ", 1)[1])
            except (ValueError, IndexError):
                continue
            if math.isfinite(value):
                totals[name] = totals.get(name, 0.0) + value
    return totals


# --- one streamed request -----------------------------------------------------------------------------------

def stream_chat(endpoint, body):
    """Send one streaming chat completion and time it. Returns a record:
    ok, error, t_start, t_connected (TCP and TLS done), t_sent (request written), t_headers (response
    headers read), t_first (first content or reasoning token), t_last (last one), t_end (the stream ended or
    failed), chunks (token events), usage and timings (of the last chunk that had them), all times from
    time.monotonic() (None for a step not reached).

    `endpoint.timeout` is the request's total deadline (a watchdog shuts the socket down when it passes,
    however slowly the server sends), one line is at most MAX_LINE_BYTES and the whole stream at most
    MAX_STREAM_BYTES."""
    record = {"ok": False, "error": None, "t_start": time.monotonic(), "t_first": None, "t_last": None,
              "t_end": None, "chunks": 0, "usage": None, "timings": None}
    deadline = record["t_start"] + endpoint.timeout
    conn = None
    received = 0
    marks = {}
    try:
        conn, resp = endpoint.open("POST", "/v1/chat/completions", body, deadline=deadline, marks=marks)
        if resp.status != 200:
            record["error"] = http_error_message(resp.status, resp.read(64 * 1024).decode("utf-8", "replace"))
        while record["error"] is None:
            line = resp.readline(MAX_LINE_BYTES + 1)
            if time.monotonic() > deadline:
                raise socket.timeout("request took longer than %s s" % endpoint.timeout)
            if not line:
                break
            received += len(line)
            if len(line) > MAX_LINE_BYTES:
                raise ValueError("a stream line is longer than %d bytes" % MAX_LINE_BYTES)
            if received > MAX_STREAM_BYTES:
                raise ValueError("the stream is longer than %d bytes" % MAX_STREAM_BYTES)
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                break
            try:
                chunk = json.loads(data.decode("utf-8"))
            except RecursionError:
                raise ValueError("a stream chunk is nested too deeply") from None
            _take_chunk(record, chunk, time.monotonic())
        if record["error"] is None:
            record["ok"] = record["t_first"] is not None
            if not record["ok"]:
                record["error"] = "the stream ended without a token"
    except socket.timeout as exc:
        record["error"] = "timeout: %s" % (str(exc) or "no data for %s s" % endpoint.timeout)
    except (socket.error, http_client.HTTPException, ValueError, AttributeError, TypeError) as exc:
        # a broken stream (bad JSON, a chunk of the wrong shape) is this request's error, not a crash
        if time.monotonic() > deadline:
            record["error"] = "timeout: request took longer than %s s" % endpoint.timeout
        else:
            record["error"] = "%s: %s" % (type(exc).__name__, exc)
    finally:
        record["t_end"] = time.monotonic()
        for name in ("connected", "sent", "headers"):
            record["t_" + name] = marks.get(name)
        if conn is not None:
            conn.close()
    if record["error"]:
        record["ok"] = False
        record["error"] = endpoint.redact(record["error"])[:1000]
    return record


def _take_chunk(record, chunk, now):
    if not isinstance(chunk, dict):
        raise ValueError("a stream chunk is not a JSON object")
    if chunk.get("error"):
        error = chunk["error"]
        record["error"] = "stream error: %s" % (error.get("message") if isinstance(error, dict) else error)
    if isinstance(chunk.get("usage"), dict):
        record["usage"] = chunk["usage"]
    if isinstance(chunk.get("timings"), dict):
        record["timings"] = chunk["timings"]
    choices = chunk.get("choices")
    for choice in choices if isinstance(choices, list) else ():
        delta = choice.get("delta") if isinstance(choice, dict) else None
        delta = delta if isinstance(delta, dict) else {}
        if delta.get("content") or delta.get("reasoning_content") or delta.get("reasoning"):
            if record["t_first"] is None:
                record["t_first"] = now
            record["t_last"] = now
            record["chunks"] += 1


def _count(value):
    """A token count the server reported: a whole number >= 0, else None (a string, NaN, a list...)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, float) and (not math.isfinite(value) or value != int(value)):
        return None
    return int(value) if 0 <= value < 2 ** 53 else None


def _rate(value):
    """A rate the server reported: a finite number > 0, else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, int) and value > 2 ** 53:
        return None
    return float(value) if math.isfinite(value) and value > 0 else None


def request_metrics(record):
    """Per-request figures from a successful record: token counts from usage (chunks when absent), TTFT,
    client prefill and decode tokens/s, the server's own rates and draft counts when it returned timings."""
    usage = record["usage"] if isinstance(record["usage"], dict) else {}
    timings = record["timings"] if isinstance(record["timings"], dict) else {}
    completion = _count(usage.get("completion_tokens", record["chunks"]))
    completion = record["chunks"] if completion is None else completion
    prompt = _count(usage.get("prompt_tokens"))
    ttft = record["t_first"] - record["t_start"]
    decode_span = record["t_last"] - record["t_first"]
    details = usage.get("prompt_tokens_details")
    details = details if isinstance(details, dict) else {}
    cached = _count(timings.get("cache_n", details.get("cached_tokens")))
    return {
        "connect_s": _span(record, "t_start", "t_connected"),
        "queue_s": _queue(record),
        "tail_s": _span(record, "t_last", "t_end"),
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "cached_prompt_tokens": cached,
        "ttft_s": ttft,
        "prefill_tps": prompt / ttft if prompt and ttft > 0 else None,
        # the first token comes from the prefill; the others are decode steps (llama-server counts alike)
        "decode_tps": (completion - 1) / decode_span if completion > 1 and decode_span > 0 else None,
        "server_prefill_tps": _rate(timings.get("prompt_per_second")),
        "server_decode_tps": _rate(timings.get("predicted_per_second")),
        "draft_n": _count(timings.get("draft_n")),
        "draft_n_accepted": _count(timings.get("draft_n_accepted")),
    }


def _prompt_ms(record):
    """The server's own prompt time (llama-server's timings.prompt_ms): a finite number >= 0, else None."""
    value = record["timings"].get("prompt_ms") if isinstance(record.get("timings"), dict) else None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or abs(value) > 2 ** 53:
        return None
    return float(value) if math.isfinite(value) and value >= 0 else None


def _span(record, first, last):
    """Seconds from record[first] to record[last]; None when either step was not reached."""
    if record.get(first) is None or record.get(last) is None:
        return None
    return max(0.0, record[last] - record[first])


def _queue(record):
    """How long the request waited at the server before its work began: from the request written to the
    first token, less the server's own prompt time (llama-server's timings.prompt_ms: an HTTP worker, then a
    slot); without it, to the response headers (vLLM writes them when its handler takes the request)."""
    prompt_ms = _prompt_ms(record)
    if prompt_ms is not None and record.get("t_first") is not None and record.get("t_sent") is not None:
        return max(0.0, record["t_first"] - record["t_sent"] - prompt_ms / 1000.0)
    return _span(record, "t_sent", "t_headers")


# --- prompts ------------------------------------------------------------------------------------------------

# The prompt's unique id: words drawn by the system's RNG (never the seeded rng, so a repeated benchmark with
# the same seed is still unique; ~100^12 ids). Words, not hex: a hex id tokenizes into a number of tokens
# that varies from prompt to prompt (20 to 60 on a small vocabulary), which the calibration cannot predict.
ID_WORDS = 12
_ID_RNG = random.SystemRandom()


def make_prompt(rng, n_words):
    """A prompt no cache has seen: a random id of ID_WORDS words, then n_words words chosen by rng."""
    ident = " ".join(_ID_RNG.choice(WORDS) for _word in range(ID_WORDS))
    words = " ".join(rng.choice(WORDS) for _word in range(max(0, n_words)))
    return "Request %s.\n%s\nContinue this list of words." % (ident, words)


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
            try:
                results[index] = work(index)
            except Exception as exc:  # a request's failure is its record, never a dead thread
                results[index] = {"ok": False, "error": "%s: %s" % (type(exc).__name__, str(exc)[:300])}

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


def _covered(intervals):
    """Seconds covered by at least one of the (start, end) intervals."""
    total, reach = 0.0, None
    for start, end in sorted(intervals):
        if reach is None or start > reach:
            total, reach = total + end - start, end
        elif end > reach:
            total, reach = total + end - reach, end
    return total


def _stats(values):
    values = sorted(v for v in values if v is not None)
    return {"mean": _round(_mean(values), 4), "max": _round(values[-1] if values else None, 4)}


def stall_check(records, wall_s, concurrency=1):
    """Where a run's wall time went that its requests' time to first token and decode do not explain:
    {unexplained_s (wall time outside every request's start..last token, or start..end when it failed),
    idle_s (no request in flight), stall (None, or what the time was spent on when unexplained_s is over
    STALL_MIN_S and STALL_FRACTION of the wall time)}. Connect and queue times are inside the time to
    first token: the run reports them apart (connect_s, queue_s), and a stall names them when longer than
    STALL_MIN_S (a queue only at concurrency 1: above it, a request may wait for the run's own others)."""
    timed = [r for r in records if r.get("t_start") is not None and r.get("t_end") is not None]
    explained = _covered((r["t_start"], r["t_last"] if r.get("ok") and r.get("t_last") else r["t_end"])
                         for r in timed)
    unexplained = max(0.0, wall_s - explained)
    idle = max(0.0, wall_s - _covered((r["t_start"], r["t_end"]) for r in timed))
    found = []
    if unexplained > max(STALL_MIN_S, STALL_FRACTION * wall_s):
        tails = [_span(r, "t_last", "t_end") or 0.0 for r in timed if r.get("ok")] or [0.0]
        found.append("%.1f s of the run's %.1f s wall time is outside its requests' time to first token and "
                     "decode: %.1f s after the last tokens until the streams ended (at most %.1f s in one), "
                     "%.1f s with no request in flight" % (unexplained, wall_s, sum(tails), max(tails), idle))
    for name, values in (("connecting", [_span(r, "t_start", "t_connected") for r in timed]),
                         ("queued at the server", [_queue(r) for r in timed] if concurrency == 1 else [])):
        longest = max([v for v in values if v is not None] or [0.0])
        if longest > STALL_MIN_S:
            found.append("a request spent %.1f s %s (inside its time to first token)" % (longest, name))
    stall = "; ".join(found) or None
    return {"unexplained_s": _round(unexplained), "idle_s": _round(idle), "stall": stall}


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
    report = {
        "prompt_tokens_target": run["prompt_tokens"], "max_tokens": run["max_tokens"],
        "concurrency": run["concurrency"], "requests": len(records), "ok": len(good), "errors": len(errors),
        "error_messages": messages, "wall_s": _round(wall_s),
        "prompt_tokens": _round(_mean(m["prompt_tokens"] for m in good), 1),
        "completion_tokens": _round(_mean(m["completion_tokens"] for m in good), 1),
        "cached_prompt_tokens": _round(_mean(m["cached_prompt_tokens"] for m in good), 1),
        "ttft_s": {"mean": _round(_mean(ttfts), 4), "p50": _round(_percentile(ttfts, 0.5), 4),
                   "p90": _round(_percentile(ttfts, 0.9), 4), "max": _round(ttfts[-1] if ttfts else None, 4)},
        "connect_s": _stats(m["connect_s"] for m in good), "queue_s": _stats(m["queue_s"] for m in good),
        "tail_s": _stats(m["tail_s"] for m in good),
        "prefill_tps": _round(_mean(m["prefill_tps"] for m in good), 2),
        "decode_tps": _round(_mean(m["decode_tps"] for m in good), 2),
        "decode_tps_total": _round(sum(m["completion_tokens"] or 0 for m in good) / wall_s
                                   if good and wall_s > 0 else None, 2),
        "server_prefill_tps": _round(_mean(m["server_prefill_tps"] for m in good), 2),
        "server_decode_tps": _round(_mean(m["server_decode_tps"] for m in good), 2),
        "draft_acceptance": _round(accepted / drafted if drafted else None, 4),
        "draft_tokens": drafted or None, "draft_accepted_tokens": accepted if drafted else None,
    }
    report.update(stall_check(records, wall_s, run["concurrency"]))
    return report


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
        usage = record["usage"] if isinstance(record["usage"], dict) else {}
        prompt_tokens = _count(usage.get("prompt_tokens"))
        if record["ok"] and prompt_tokens:
            points.append((words, prompt_tokens))
        else:
            self.last_error = record["error"] or "the server answered without usage.prompt_tokens"

    def measure(self, run):
        # (accepted, drafted) on /metrics, or None: the figures come in the last chunk's timings
        counters = engine_descriptor(self.engine).spec_metrics
        before = scrape_counters(self.endpoint, counters) if counters else {}
        words = self.calibration.words_for(run["prompt_tokens"])
        records, wall = run_concurrently(run["requests"], run["concurrency"],
                                         lambda _index: self.send(words, run["max_tokens"]))
        spec = None
        if before:
            after = scrape_counters(self.endpoint, counters)
            spec = tuple(after.get(name, 0.0) - before.get(name, 0.0) for name in counters)
        return summarize_run(run, records, wall, spec)


def benchmark(url, engine=engines.DEFAULT_ENGINE, model=None, api_key=None, runs=None, warmup_requests=2,
              timeout=300.0, seed=None):
    """Benchmark the endpoint at url. Returns the module's result (see plugins/modules/llm_benchmark.py):
    {url, engine, model, calibration, runs: [...], summary: {...}, errors, failed}.
    Raises BenchmarkError when it cannot start (bad options, no model, no warm-up answered)."""
    engine_descriptor(engine)
    check_options(timeout=timeout, warmup_requests=warmup_requests, runs=runs)
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
