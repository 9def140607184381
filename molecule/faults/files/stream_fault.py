# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Fault a of molecule/faults, run on the node: open streaming chat completions (directly to the instance
that will be killed, and through the gateway), SIGKILL that instance's server once every stream has its
first token, then send new requests through the gateway for the whole outage, until the killed instance
answers /health again. Every wait is bounded: a stream that neither ends nor errors within `deadline`
seconds of the kill is a hang. Prints one JSON object.

    python3 stream_fault.py '<json: pid, direct, gateway, health, model, key, gateway_key, streams_direct,
                                    streams_gateway, max_tokens, deadline, recover_timeout, new_min>'
"""
import http.client
import json
import os
import signal
import sys
import threading
import time
import urllib.parse


def _connection(url, timeout):
    parts = urllib.parse.urlsplit(url)
    return http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout), parts.path


def _body(model, max_tokens, stream):
    return json.dumps({"model": model, "stream": stream, "max_tokens": max_tokens, "ignore_eos": True,
                       "messages": [{"role": "user", "content": "Count slowly from one to ten thousand."}]})


class Stream(threading.Thread):
    """One streaming request; records when its first token came and how it ended."""

    def __init__(self, url, key, model, max_tokens, read_timeout):
        super().__init__(daemon=True)
        self.url, self.key, self.model, self.max_tokens = url, key, model, max_tokens
        self.read_timeout = read_timeout
        self.first = threading.Event()
        self.chunks, self.ended_at, self.outcome, self.detail = 0, None, None, ""
        self.last_at = None

    def run(self):
        try:
            conn, path = _connection(self.url, self.read_timeout)
            conn.request("POST", path + "/v1/chat/completions", _body(self.model, self.max_tokens, True),
                         {"Authorization": "Bearer " + self.key, "Content-Type": "application/json"})
            response = conn.getresponse()
            if response.status != 200:
                self.outcome = "http %d" % response.status
                self.detail = response.read(300).decode("utf-8", "replace")
                return
            while True:
                line = response.readline()
                if not line:
                    self.outcome = "connection closed"
                    return
                line = line.strip()
                if line == b"data: [DONE]":
                    self.outcome = "completed"
                    return
                if line.startswith(b"data: "):
                    event = json.loads(line[6:].decode("utf-8", "replace"))
                    if "error" in event:
                        self.outcome = "error event"
                        self.detail = json.dumps(event["error"])[:300]
                        return
                    self.chunks += 1
                    self.last_at = time.time()
                    self.first.set()
        except (OSError, http.client.HTTPException, ValueError) as exc:
            # socket.timeout is an OSError: a read that waited read_timeout seconds is a hang.
            self.outcome = "hang" if "timed out" in str(exc) else "connection closed"
            self.detail = "%s: %s" % (type(exc).__name__, exc)
        finally:
            self.ended_at = time.time()
            self.first.set()


def _ok(url, key, model, timeout=30):
    """One short non-streaming request through the gateway: (ok, what failed)."""
    try:
        conn, path = _connection(url, timeout)
        conn.request("POST", path + "/v1/chat/completions", _body(model, 4, False),
                     {"Authorization": "Bearer " + key, "Content-Type": "application/json"})
        response = conn.getresponse()
        body = response.read()
        if response.status == 200 and json.loads(body.decode("utf-8")).get("choices"):
            return True, ""
        return False, "http %d %s" % (response.status, body[:200].decode("utf-8", "replace"))
    except (OSError, http.client.HTTPException, ValueError) as exc:
        return False, "%s: %s" % (type(exc).__name__, exc)


def _healthy(url):
    try:
        conn, path = _connection(url, 2)
        conn.request("GET", path + "/health")
        return conn.getresponse().status == 200
    except (OSError, http.client.HTTPException):
        return False


def main(args):
    streams = [Stream(args["direct"], args["key"], args["model"], args["max_tokens"], args["deadline"])
               for _ in range(args["streams_direct"])]
    streams += [Stream(args["gateway"], args["gateway_key"], args["model"], args["max_tokens"],
                       args["deadline"]) for _ in range(args["streams_gateway"])]
    for stream in streams:
        stream.start()
    started = time.time()
    for stream in streams:
        stream.first.wait(max(0.1, 60 - (time.time() - started)))
    open_at_kill = [s for s in streams if s.ended_at is None and s.chunks > 0]
    killed = time.time()
    os.kill(args["pid"], signal.SIGKILL)
    # New requests through the gateway for the whole outage (at least new_min of them), then until healthy.
    new_ok, new_failed, recovered = 0, [], None
    while time.time() - killed < args["recover_timeout"]:
        if recovered is None and _healthy(args["health"]):
            recovered = time.time()
        if recovered is not None and new_ok + len(new_failed) >= args["new_min"]:
            break
        ok, why = _ok(args["gateway"], args["gateway_key"], args["model"])
        if ok:
            new_ok += 1
        else:
            new_failed.append(why)
        time.sleep(0.1)
    for stream in streams:
        stream.join(max(0.1, args["deadline"] - (time.time() - killed)))
    ends, now = [], time.time()
    for index, stream in enumerate(streams):
        outcome = stream.outcome
        if outcome is None:
            # Still open: streaming from the other instance (a token within the last 5 s), else a hang.
            outcome = "streaming" if stream.last_at and now - stream.last_at < 5 else "hang"
        ends.append({
            "via": "direct" if index < args["streams_direct"] else "gateway",
            "open_at_kill": stream in open_at_kill,
            "chunks": stream.chunks,
            "outcome": outcome,
            "detail": stream.detail,
            "seconds_after_kill": None if stream.ended_at is None else round(stream.ended_at - killed, 3),
        })
    print(json.dumps({
        "streams": ends,
        "new_ok": new_ok,
        "new_failed": new_failed,
        "recovered_s": None if recovered is None else round(recovered - killed, 1),
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main(json.loads(sys.argv[1])))
