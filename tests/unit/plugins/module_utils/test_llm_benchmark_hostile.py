# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""llm_benchmark under hostile servers and inputs (issue 23): a key with a trailing newline is refused without
being shown (in no form: raw, b'Bearer ...\\n', URL-encoded); a request has a total deadline however slowly
the server sends; one SSE line, a stream and a plain body are bounded; chunks of the wrong type or nested 100k
deep are that request's error; a FIFO as key file never blocks; env files are read as serving writes them."""
import os
import socket
import threading
import time

import pytest
from ansible_collections.llmops.serving.plugins.module_utils._benchmark import client as lb
from ansible_collections.llmops.serving.plugins.module_utils.secrets import scrub

from tests.helpers import run_module_file

KEY = "sk-hostile-4f2a"


class RawServer:
    """A TCP server on 127.0.0.1 that answers each connection with `script(conn)` (raw bytes, any pace)."""

    def __init__(self, script):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.url = "http://127.0.0.1:%d" % self.sock.getsockname()[1]
        self.script = script
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        self.sock.settimeout(0.2)
        while not self.stop.is_set():
            try:
                conn, _addr = self.sock.accept()
            except OSError:
                continue
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn):
        try:
            data = b""
            while b"\r\n\r\n" not in data:  # the whole request: closing on unread bytes would reset
                data += conn.recv(65536)
            head, body = data.split(b"\r\n\r\n", 1)
            length = [int(line.split(b":")[1]) for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length:")]
            while length and len(body) < length[0]:
                body += conn.recv(65536)
            self.script(conn, self.stop)
        except OSError:
            pass
        finally:
            conn.close()

    def close(self):
        self.stop.set()
        self.thread.join(5)
        self.sock.close()


@pytest.fixture
def raw_server():
    servers = []

    def start(script):
        servers.append(RawServer(script))
        return servers[-1]
    yield start
    for server in servers:
        server.close()


HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"


def test_a_key_with_a_trailing_newline_is_refused_without_showing_it(tmp_path):
    with pytest.raises(lb.BenchmarkError) as info:
        lb.read_api_key(api_key=KEY + "\n")
    assert "api_key contains whitespace" in str(info.value) and KEY not in str(info.value)
    key_file = tmp_path / "k"
    key_file.write_text(KEY + " extra\n")
    with pytest.raises(lb.BenchmarkError, match="whitespace") as info:
        lb.read_api_key(api_key_file=str(key_file))
    assert KEY not in str(info.value)
    result = run_module_file(tmp_path, "llm_benchmark", {"url": "http://127.0.0.1:9", "api_key": KEY + "\n"})
    assert result["failed"] and "api_key contains whitespace" in result["msg"]
    assert KEY not in str(result) and "Traceback" not in str(result)


def test_every_form_of_the_key_is_scrubbed_from_messages():
    key = KEY + "\n"
    endpoint = lb.Endpoint("http://127.0.0.1:9", key)
    for text in ("Invalid header value b'Bearer %s\\n'" % KEY, "token=%s%%0A" % KEY.upper(),
                 "json \"%s\\n\"" % KEY, "url %s" % KEY.replace("-", "%2D")):
        assert KEY.lower() not in endpoint.redact(text).lower(), text
        assert KEY.lower() not in scrub(text, key).lower(), text


@pytest.mark.parametrize("name, value", [("timeout", float("nan")), ("timeout", float("inf")),
                                         ("timeout", -1.0), ("busy_poll", 0.0), ("busy_wait", float("nan"))])
def test_options_out_of_range_are_refused_by_name(name, value):
    with pytest.raises(lb.BenchmarkError, match=name):
        lb.check_options(**{name: value})


def test_a_trickling_server_meets_the_total_deadline(raw_server):
    def trickle(conn, stop):
        conn.sendall(HEAD + b"data: ")
        while not stop.is_set():  # one byte every 100 ms: an idle timeout never fires
            conn.sendall(b"a")
            time.sleep(0.1)
    server = raw_server(trickle)
    start = time.monotonic()
    record = lb.stream_chat(lb.Endpoint(server.url, timeout=1.0), lb.request_body("m", "hi", 4))
    assert time.monotonic() - start < 4
    assert record["ok"] is False and record["error"].startswith("timeout"), record["error"]


def test_one_endless_sse_line_is_bounded(raw_server):
    def endless(conn, stop):
        conn.sendall(HEAD + b"data: ")
        chunk = b"x" * 65536
        while not stop.is_set():
            conn.sendall(chunk)
    server = raw_server(endless)
    record = lb.stream_chat(lb.Endpoint(server.url, timeout=30.0), lb.request_body("m", "hi", 4))
    assert record["ok"] is False and "longer than %d bytes" % lb.MAX_LINE_BYTES in record["error"]


def test_an_endless_plain_body_is_bounded(raw_server):
    def endless(conn, stop):
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n")
        chunk = b"[" * 65536
        while not stop.is_set():
            conn.sendall(chunk)
    server = raw_server(endless)
    with pytest.raises(lb.BenchmarkError, match="larger than"):
        lb.default_model(lb.Endpoint(server.url, timeout=30.0))


def test_chunks_nested_100k_deep_or_of_the_wrong_type_are_errors_of_their_request(raw_server):
    def deep(conn, stop):
        conn.sendall(HEAD + b"data: " + b"[" * 100000 + b"]" * 100000 + b"\n\n")
    server = raw_server(deep)
    record = lb.stream_chat(lb.Endpoint(server.url, timeout=10.0), lb.request_body("m", "hi", 4))
    assert record["ok"] is False and "nested too deeply" in record["error"]

    record = {"ok": True, "error": None, "t_start": 0.0, "t_first": None, "t_last": None, "chunks": 0,
              "usage": None, "timings": None}
    lb._take_chunk(record, {"choices": [{"delta": {"content": "a"}}], "usage": "lots", "timings": [1]}, 1.0)
    lb._take_chunk(record, {"choices": [{"delta": {"content": "b"}}],
                            "usage": {"completion_tokens": "many", "prompt_tokens": float("nan")},
                            "timings": {"predicted_per_second": "fast", "draft_n": -3, "cache_n": [1]}}, 2.0)
    metrics = lb.request_metrics(record)
    assert metrics["completion_tokens"] == 2 and metrics["prompt_tokens"] is None
    assert metrics["server_decode_tps"] is None and metrics["draft_n"] is None
    run = {"prompt_tokens": 8, "max_tokens": 4, "concurrency": 1, "requests": 1}
    assert lb.summarize_run(run, [record], 1.0)["ok"] == 1


def test_a_fifo_as_key_file_never_blocks(tmp_path):
    fifo = str(tmp_path / "key.fifo")
    os.mkfifo(fifo)
    start = time.monotonic()
    with pytest.raises(lb.BenchmarkError, match="not a regular file"):
        lb.read_api_key(api_key_file=fifo)
    with pytest.raises(lb.BenchmarkError, match="not a regular file"):
        lb.read_api_key(env_file=fifo, engine="vllm")
    assert time.monotonic() - start < 2


def test_env_files_are_read_as_serving_writes_them(tmp_path):
    env = tmp_path / "q.env"
    env.write_text('# header\nVLLM_API_KEY="%s"\nOTHER="a\\"b"\n' % KEY)
    assert lb.read_api_key(env_file=str(env), engine="vllm") == KEY
    # the multi-line value the old reader returned with its quote: read as written, then refused unshown
    env.write_text('VLLM_API_KEY="%s\n"\n' % KEY)
    assert lb.parse_env_file(env.read_text())["VLLM_API_KEY"] == KEY + "\n"
    with pytest.raises(lb.BenchmarkError, match="whitespace") as info:
        lb.read_api_key(env_file=str(env), engine="vllm")
    assert KEY not in str(info.value)
