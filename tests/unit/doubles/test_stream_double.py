# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The streaming engine double itself (tests/fixtures/stream_double.py): it paces its chunks as told and
records when it wrote them, reads large and chunked bodies, frames its answers like each engine, checks the
key, and timed_request() sees what it wrote when it wrote it."""
import json
import socket
import time

import pytest

from tests.fixtures.stream_double import StreamDouble, timed_request

BODY = {"model": "qwen", "messages": [{"role": "user", "content": "hi"}], "stream": True}


def _paced_run():
    with StreamDouble(chunks=4, first_delay=0.05, interval=0.03) as double:
        answer = timed_request(double.host, double.port, "/v1/chat/completions", BODY)
    return answer, double.completions()[0]


def test_chunks_paced_and_recorded():
    # Timing on a shared machine (CI runs this beside a compile): the loopback delay is the best of three
    # runs. A double that buffered its chunks would be late in every run; scheduling is late now and then.
    runs = [_paced_run() for _ in range(3)]
    for answer, record in runs:
        assert answer["status"] == 200 and answer["headers"]["Content-Type"] == "text/event-stream"
        writes = record["writes"]
        assert len(writes) == 4 and len(answer["events"]) == 5  # and data: [DONE]
        # on an absolute schedule (a late chunk does not shift the next ones): never early, late only by what
        # a busy machine's scheduling adds
        offsets = [w - record["received"] - (0.05 + i * 0.03) for i, w in enumerate(writes)]
        assert all(-0.002 < offset < 0.5 for offset in offsets), offsets
        assert json.loads(answer["events"][0][1][6:])["choices"][0]["delta"]["content"] == " tok0"
    # the client saw each chunk when it was written (loopback, no proxy); the write time is taken just after
    # the write (a thread descheduled between the write and the clock makes one run's client look early: best
    # of three, as above)
    delays = [sorted(t - w for (t, _), w in zip(answer["events"][:4], record["writes"], strict=True))
              for answer, record in runs]
    assert max(d[0] for d in delays) > -0.002, delays
    assert min(d[1] for d in delays) < 0.05, delays


def test_max_tokens_sets_the_chunks_and_plain_answers():
    with StreamDouble(chunks=9, first_delay=0, interval=0) as double:
        answer = timed_request(double.host, double.port, "/v1/chat/completions", dict(BODY, max_tokens=2))
        plain = timed_request(double.host, double.port, "/v1/completions", {"model": "x", "max_tokens": 3})
    assert len(answer["events"]) == 3
    assert json.loads(plain["body"])["choices"][0]["message"]["content"] == "tok" * 3


def test_silence_before_the_headers():
    with StreamDouble(silence=0.3, chunks=1, first_delay=0) as double:
        started = time.monotonic()
        answer = timed_request(double.host, double.port, "/v1/chat/completions", BODY)
    assert answer["status"] == 200 and time.monotonic() - started >= 0.3


def test_large_and_chunked_bodies_are_read_whole():
    messages = [{"role": "user", "content": "w" * (3 << 20)}]
    big = json.dumps(dict(BODY, stream=False, messages=messages)).encode()
    with StreamDouble(chunks=1, first_delay=0) as double:
        assert timed_request(double.host, double.port, "/v1/chat/completions", big)["status"] == 200
        sock = socket.create_connection((double.host, double.port))
        payload = json.dumps(dict(BODY, stream=False)).encode()
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                     + b"%x\r\n%s\r\n0\r\n\r\n" % (len(payload), payload))
        assert sock.recv(100).startswith(b"HTTP/1.1 200")
        sock.close()
    assert [r["length"] for r in double.completions()] == [len(big), len(payload)]
    assert double.completions()[1]["model"] == "qwen"


@pytest.mark.parametrize("engine,server,content_type", [
    ("llama.cpp", "llama.cpp", "text/event-stream"),
    ("vllm", "uvicorn", "text/event-stream; charset=utf-8"),
])
def test_engine_framing_and_unknown_model(engine, server, content_type):
    with StreamDouble(engine=engine, models=("qwen",), chunks=1, first_delay=0) as double:
        answer = timed_request(double.host, double.port, "/v1/chat/completions", BODY)
        other = timed_request(double.host, double.port, "/v1/chat/completions", dict(BODY, model="llama"))
    assert answer["headers"]["Server"].startswith(server)
    assert answer["headers"]["content-type" if engine == "vllm" else "Content-Type"] == content_type
    # vLLM refuses a model it does not serve; llama-server answers whatever is asked
    assert other["status"] == (404 if engine == "vllm" else 200)


def test_key_checked_on_v1_not_on_health():
    with StreamDouble(api_key="k1") as double:
        assert timed_request(double.host, double.port, "/health")["status"] == 200
        assert timed_request(double.host, double.port, "/v1/models")["status"] == 401
        ok = timed_request(double.host, double.port, "/v1/models", headers={"Authorization": "Bearer k1"})
        refused = timed_request(double.host, double.port, "/v1/chat/completions", BODY)
    assert ok["status"] == 200 and json.loads(ok["body"])["data"][0]["id"] == "qwen"
    assert refused["status"] == 401 and double.completions()[0]["authorization"] is None
