# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The fake OpenAI server itself: its stream format matches llama-server's, it keeps its token rate, and its
auth, faults and vLLM metrics behave as documented."""
import http.client
import json
import subprocess
import sys
import time

import pytest

from tests.fixtures.fake_openai.server import FakeOpenAI
from tests.helpers import ROOT


def _post(fake, body, key=None):
    conn = http.client.HTTPConnection(fake.host, fake.port, timeout=10)
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = "Bearer " + key
    conn.request("POST", "/v1/chat/completions", body=json.dumps(body), headers=headers)
    return conn, conn.getresponse()


def _stream(fake, body, key=None):
    """[(arrival time, parsed event)] of a streamed completion."""
    conn, resp = _post(fake, body, key)
    assert resp.status == 200, resp.read()
    events = []
    for line in resp:
        if line.startswith(b"data: "):
            data = line[6:].strip()
            events.append((time.monotonic(), data.decode() if data == b"[DONE]" else json.loads(data)))
    conn.close()
    return events


BODY = {"model": "m", "messages": [{"role": "user", "content": "one two three four"}], "max_tokens": 21,
        "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": True}


def test_stream_shape_and_rate_like_llama_server():
    with FakeOpenAI(decode_tps=100.0, prefill_tps=160.0, prompt_overhead=12) as fake:
        start = time.monotonic()
        events = _stream(fake, BODY)
    tokens = [(t, e) for t, e in events if isinstance(e, dict) and e["choices"]
              and e["choices"][0]["delta"].get("content")]
    assert len(tokens) == 21
    assert tokens[0][0] - start == pytest.approx(16 / 160.0, abs=0.05)  # 12 + 4 words at 160 tok/s
    assert (len(tokens) - 1) / (tokens[-1][0] - tokens[0][0]) == pytest.approx(100.0, rel=0.15)
    assert events[-1][1] == "[DONE]"
    final = events[-2][1]
    assert final["choices"] == [] and final["usage"]["prompt_tokens"] == 16
    assert final["usage"]["completion_tokens"] == 21
    timings = final["timings"]
    assert set(timings) == {"cache_n", "prompt_n", "prompt_ms", "prompt_per_token_ms", "prompt_per_second",
                            "predicted_n", "predicted_ms", "predicted_per_token_ms", "predicted_per_second"}
    assert timings["predicted_per_second"] == pytest.approx(100.0, rel=0.15)


def test_without_ignore_eos_the_output_stops_early_and_drafts_are_reported():
    body = dict(BODY, ignore_eos=False)
    with FakeOpenAI(natural_tokens=5, draft_n_per_token=2.0, draft_accept=0.5, decode_tps=500) as fake:
        final = _stream(fake, body)[-2][1]
    assert final["usage"]["completion_tokens"] == 5
    assert final["timings"]["draft_n"] == 8 and final["timings"]["draft_n_accepted"] == 4


def test_auth_and_failures():
    with FakeOpenAI(api_key="sekret", fail_every=2, fail_status=429) as fake:
        _, resp = _post(fake, BODY)
        assert resp.status == 401 and json.loads(resp.read())["error"]["message"] == "Invalid API Key"
        assert len(_stream(fake, BODY, key="sekret")) > 3        # completion 1
        _, resp = _post(fake, BODY, key="sekret")                # completion 2 fails
        assert resp.status == 429 and "fake failure 2" in resp.read().decode()
        assert fake.auth_headers == [None, "Bearer sekret", "Bearer sekret"]


def test_vllm_flavour_has_metrics_and_no_timings():
    with FakeOpenAI(engine="vllm", draft_n_per_token=3.0, draft_accept=0.5, decode_tps=1000) as fake:
        final = _stream(fake, BODY)[-2][1]
        conn = http.client.HTTPConnection(fake.host, fake.port, timeout=5)
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
    assert "timings" not in final
    totals = {}
    for line in text.splitlines():
        if not line.startswith("#"):
            name = line.split("{")[0]
            totals[name] = totals.get(name, 0) + float(line.split()[-1])
    assert totals == {"vllm:spec_decode_num_draft_tokens_total": 60.0,
                      "vllm:spec_decode_num_accepted_tokens_total": 30.0,
                      "vllm:num_requests_running": 0.0, "vllm:num_requests_waiting": 0.0}


def _get(fake, path, key=None):
    conn = http.client.HTTPConnection(fake.host, fake.port, timeout=5)
    conn.request("GET", path, headers={"Authorization": "Bearer " + key} if key else {})
    resp = conn.getresponse()
    return resp.status, resp.read().decode()


def test_the_load_of_other_users_and_its_own_streams_is_reported_per_flavour():
    import threading
    with FakeOpenAI(engine="vllm", busy_requests=3, busy_waiting=1) as fake:
        text = _get(fake, "/metrics")[1]
        gauges = [line for line in text.splitlines() if line.startswith("vllm:num_requests")]
        assert sorted(gauges) == ['vllm:num_requests_running{engine="0",model_name="fake-model"} 1.0',
                                  'vllm:num_requests_running{engine="1",model_name="fake-model"} 2.0',
                                  'vllm:num_requests_waiting{engine="0",model_name="fake-model"} 0.0',
                                  'vllm:num_requests_waiting{engine="1",model_name="fake-model"} 1.0']
    with FakeOpenAI(api_key="k", slots=3, decode_tps=20) as fake:
        assert _get(fake, "/slots")[0] == 401                                  # the key guards it
        assert [s["is_processing"] for s in json.loads(_get(fake, "/slots", "k")[1])] == [False] * 3
        assert _get(fake, "/metrics", "k")[0] == 501                          # no --metrics
        stream = threading.Thread(target=_stream, args=(fake, dict(BODY, max_tokens=20), "k"))
        stream.start()
        time.sleep(0.3)
        fake.settings["busy_requests"] = 1
        assert [s["is_processing"] for s in json.loads(_get(fake, "/slots", "k")[1])] == [True, True, False]
        stream.join()
        assert fake.gets == ["/slots", "/slots", "/metrics", "/slots"]
    with FakeOpenAI(metrics=True, slots_endpoint=False, busy_requests=2, busy_waiting=5) as fake:
        assert _get(fake, "/slots")[0] == 501
        assert _get(fake, "/metrics")[1] == ("# TYPE llamacpp:requests_processing gauge\n"
                                             "llamacpp:requests_processing 2\n"
                                             "# TYPE llamacpp:requests_deferred gauge\n"
                                             "llamacpp:requests_deferred 5\n")


def test_concurrent_streams_are_counted():
    import threading
    with FakeOpenAI(decode_tps=50) as fake:
        threads = [threading.Thread(target=_stream, args=(fake, dict(BODY, max_tokens=10))) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert fake.max_in_flight == 3 and len(fake.requests) == 3


def test_cli_serves(tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "tests.fixtures.fake_openai.server", "--port", "0",
                             "--model", "cli-model"], cwd=ROOT, stdout=subprocess.PIPE,
                            universal_newlines=True)
    try:
        url = proc.stdout.readline().strip()
        host, port = url.split("//")[1].split(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=5)
        conn.request("GET", "/v1/models")
        assert json.loads(conn.getresponse().read())["data"][0]["id"] == "cli-model"
    finally:
        proc.terminate()
        proc.wait(timeout=10)
