# -*- coding: utf-8 -*-
# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
# PRIVATE to llmops.serving: it can change at any time; do not import it from other collections.
"""The load an inference server carries before a benchmark: requests its users have in flight or queued.

A benchmark of a production instance competes with its users (with `parallel 2`, a run at concurrency 2 takes
both of llama-server's slots) and measures their load with it. So llm_benchmark asks the server first:

    llama-server  GET /slots (on by default; `is_processing` per slot, or `state` != 0 before it existed),
                  else GET /metrics (with --metrics: llamacpp:requests_processing, llamacpp:requests_deferred)
    vLLM          GET /metrics (vllm:num_requests_running, vllm:num_requests_waiting, summed over engines)

(the engine descriptor's slots_path and load_metrics, module_utils/engines.py)
with the instance's key (llama-server guards both endpoints with it; the key never appears in what is
returned). `check_load()` applies the policy: `measure` (record the load, measure anyway), `skip` (busy:
do not measure), `wait` (poll until idle, at most `wait_s` seconds, then skip). A server that exposes none of
these endpoints has an unknown load: it is measured, and the result says the load was not known.

Python 3.6, standard library only; the HTTP client is llm_benchmark's Endpoint.
"""
from __future__ import absolute_import, division, print_function

import http.client as http_client
import json
import socket
import time

from ansible_collections.llmops.serving.plugins.module_utils._benchmark.client import (
    BenchmarkError,
    Endpoint,
    engine_descriptor,
    scrape_counters,
)

__metaclass__ = type

POLICIES = ("wait", "skip", "measure")


def parse_slots(text):
    """(processing, slots) from llama-server's GET /slots body, or None when it is not a list of slots."""
    try:
        slots = json.loads(text)
    except ValueError:
        return None
    if not isinstance(slots, list) or not all(isinstance(slot, dict) for slot in slots):
        return None
    processing = 0
    for slot in slots:
        if "is_processing" in slot:
            processing += 1 if slot["is_processing"] is True else 0
        elif "state" in slot:
            # releases before is_processing: state 0 is idle, anything else works on a task
            processing += 1 if slot["state"] not in (0, "0", None) else 0
        else:
            return None
    return processing, len(slots)


def _slots(endpoint, path):
    try:
        status, text = endpoint.get(path)
    except (socket.error, http_client.HTTPException):
        return None
    return parse_slots(text) if status == 200 else None


def read_load(endpoint, engine):
    """What the server is doing now: {"source", "processing", "waiting", "slots"}; source None (and counts
    None) when it exposes none of the endpoints above (then the load is unknown)."""
    descriptor = engine_descriptor(engine)
    if descriptor.slots_path:
        slots = _slots(endpoint, descriptor.slots_path)
        if slots is not None:
            return {"source": descriptor.slots_path, "processing": slots[0], "waiting": None,
                    "slots": slots[1]}
    names = descriptor.load_metrics  # (running, waiting)
    gauges = scrape_counters(endpoint, names)
    if names[0] not in gauges:
        return {"source": None, "processing": None, "waiting": None, "slots": None}
    return {"source": "/metrics", "processing": int(gauges[names[0]]),
            "waiting": int(gauges[names[1]]) if names[1] in gauges else None, "slots": None}


def is_busy(load):
    """True when requests are in flight or queued; False when idle or unknown (nothing to wait for)."""
    return bool((load.get("processing") or 0) + (load.get("waiting") or 0))


def describe(load):
    """'2 requests processing, 1 waiting (vLLM /metrics)' / 'idle (llama-server /slots, 2 slots)'."""
    if not load.get("source"):
        return "load unknown (neither /slots nor /metrics answered)"
    where = load["source"] + (", %d slots" % load["slots"] if load.get("slots") else "")
    if not is_busy(load):
        return "idle (%s)" % where
    text = "%d request%s processing" % (load["processing"], "" if load["processing"] == 1 else "s")
    if load.get("waiting"):
        text += ", %d waiting" % load["waiting"]
    return "%s (%s)" % (text, where)


def check_load(endpoint, engine, policy="measure", wait_s=120.0, poll_s=5.0, clock=time.monotonic,
               sleep=time.sleep, now=time.time):
    """Read the load and decide whether to measure. Returns the load the decision saw, plus:
    measure (bool), waited_s, checks (reads made), busy (at the last read), checked_at (UTC, ISO 8601) and
    message (what was seen and done)."""
    if policy not in POLICIES:
        raise BenchmarkError("busy_policy must be one of %s, got %r" % (", ".join(POLICIES), policy))
    if wait_s < 0 or poll_s <= 0:
        raise BenchmarkError("busy_wait must be >= 0 and busy_poll > 0, got %s and %s" % (wait_s, poll_s))
    start = clock()
    load = read_load(endpoint, engine)
    checks = 1
    first = dict(load)
    while policy == "wait" and is_busy(load) and clock() - start < wait_s:
        sleep(max(0.0, min(poll_s, wait_s - (clock() - start))))
        load = read_load(endpoint, engine)
        checks += 1
    waited = clock() - start if checks > 1 else 0.0
    busy = is_busy(load)
    measure = policy == "measure" or not busy
    if not busy and checks > 1:
        message = "%s after waiting %.0f s (it was %s)" % (describe(load), waited, describe(first))
    elif not busy:
        message = describe(load)
    elif policy == "measure":
        message = "%s: measured anyway (busy_policy measure), the figures include that load" % describe(load)
    elif policy == "wait":
        message = "%s after waiting %.0f s (busy_wait %g): not measured, so as not to compete with its " \
                  "users" % (describe(load), waited, wait_s)
    else:
        message = "%s: not measured, so as not to compete with its users (busy_policy skip)" % describe(load)
    load.update(measure=measure, busy=busy, waited_s=round(waited, 1), checks=checks,
                checked_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now())),
                message=endpoint.redact(message))
    return load


def load_endpoint(url, api_key=None, timeout=30.0):
    """The Endpoint of the load check (short timeout: these are cheap GETs)."""
    return Endpoint(url, api_key, min(float(timeout), 30.0))
