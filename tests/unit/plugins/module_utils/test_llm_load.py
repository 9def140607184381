# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""llm_load: the load a server carries before a benchmark, read from llama-server's /slots or /metrics and
vLLM's /metrics (the fake OpenAI server in both flavours, on port 0; the real CPU llama-server when built),
and the busy policies (wait until idle or a bound, skip, measure anyway) with what they say."""
import os
import shutil
import subprocess
import threading
import time

import pytest
from ansible_collections.llmops.serving.plugins.module_utils._benchmark import client as lb
from ansible_collections.llmops.serving.plugins.module_utils._benchmark import load as llm_load

from tests.fixtures.fake_openai.server import FakeOpenAI
from tests.helpers import ROOT, wait_healthy

KEY = "sk-load-0123456789abcdef"


def _endpoint(fake, key=KEY):
    return llm_load.load_endpoint(fake.url, key, timeout=5)


# --- reading the load --------------------------------------------------------------------------------------

@pytest.mark.parametrize("body, expected", [
    ('[{"id": 0, "is_processing": true}, {"id": 1, "is_processing": false}]', (1, 2)),
    ('[{"id": 0, "state": 1}, {"id": 1, "state": 0}, {"id": 2, "state": 0}]', (1, 3)),   # older releases
    ('[]', (0, 0)),
    ('{"error": "nope"}', None), ('[{"id": 0}]', None), ('[1, 2]', None), ("not json", None),
])
def test_slots_body(body, expected):
    assert llm_load.parse_slots(body) == expected


def test_llama_server_load_from_slots_with_the_key():
    with FakeOpenAI(api_key=KEY, slots=4, busy_requests=3) as fake:
        assert llm_load.read_load(_endpoint(fake), "llama.cpp") == {
            "source": "/slots", "processing": 3, "waiting": None, "slots": 4}
        # without the key neither endpoint answers: the load is unknown, not "idle"
        assert llm_load.read_load(_endpoint(fake, None), "llama.cpp")["source"] is None
    assert fake.auth_headers[0] == "Bearer " + KEY


def test_llama_server_without_slots_falls_back_to_metrics():
    with FakeOpenAI(slots_endpoint=False, metrics=True, busy_requests=1, busy_waiting=2) as fake:
        assert llm_load.read_load(_endpoint(fake), "llama.cpp") == {
            "source": "/metrics", "processing": 1, "waiting": 2, "slots": None}
    assert fake.gets == ["/slots", "/metrics"]


def test_a_server_with_neither_endpoint_has_an_unknown_load():
    with FakeOpenAI(slots_endpoint=False) as fake:
        load = llm_load.check_load(_endpoint(fake), "llama.cpp", "skip")
    assert load["source"] is None and load["measure"] is True and load["busy"] is False
    assert load["message"] == "load unknown (neither /slots nor /metrics answered)"


def test_vllm_load_sums_the_engines_running_and_waiting():
    with FakeOpenAI(engine="vllm", busy_requests=3, busy_waiting=1) as fake:
        load = llm_load.read_load(_endpoint(fake), "vllm")
    assert load == {"source": "/metrics", "processing": 3, "waiting": 1, "slots": None}
    assert llm_load.describe(load) == "3 requests processing, 1 waiting (/metrics)"


def test_a_streaming_request_counts_as_load():
    with FakeOpenAI(api_key=KEY, decode_tps=20) as fake:
        endpoint = lb.Endpoint(fake.url, KEY, 10)
        body = lb.request_body("fake-model", "one two three", 30)
        stream = threading.Thread(target=lb.stream_chat, args=(endpoint, body))
        stream.start()
        time.sleep(0.3)
        busy = llm_load.read_load(_endpoint(fake), "llama.cpp")
        stream.join()
        # The client returns on the stream's last event; the server's handler ends its request a moment
        # later (under a busy CI, tens of ms): idle is what the server says once it has.
        deadline = time.monotonic() + 5
        idle = llm_load.read_load(_endpoint(fake), "llama.cpp")
        while idle["processing"] and time.monotonic() < deadline:
            time.sleep(0.05)
            idle = llm_load.read_load(_endpoint(fake), "llama.cpp")
    assert (busy["processing"], idle["processing"]) == (1, 0)


# --- the policies ------------------------------------------------------------------------------------------

def test_idle_is_measured_at_once():
    with FakeOpenAI(engine="vllm") as fake:
        load = llm_load.check_load(_endpoint(fake), "vllm", "wait", wait_s=5, poll_s=1)
    assert (load["measure"], load["busy"], load["checks"], load["waited_s"]) == (True, False, 1, 0.0)
    assert load["message"] == "idle (/metrics)"
    assert load["checked_at"].endswith("Z")


def test_skip_does_not_measure_a_busy_server_and_says_why():
    with FakeOpenAI(api_key=KEY, busy_requests=2) as fake:
        load = llm_load.check_load(_endpoint(fake), "llama.cpp", "skip", wait_s=60)
    assert (load["measure"], load["busy"], load["checks"], load["processing"]) == (False, True, 1, 2)
    assert load["message"] == ("2 requests processing (/slots, 2 slots): not measured, so as not to compete "
                               "with its users (busy_policy skip)")
    assert KEY not in str(load)


def test_wait_measures_once_the_users_are_done():
    with FakeOpenAI(engine="vllm", busy_requests=1) as fake:
        timer = threading.Timer(0.6, fake.settings.update, kwargs={"busy_requests": 0})
        timer.start()
        load = llm_load.check_load(_endpoint(fake), "vllm", "wait", wait_s=10, poll_s=0.2)
        timer.join()
    assert load["measure"] is True and load["busy"] is False and load["checks"] >= 3
    assert 0.5 <= load["waited_s"] <= 2.0
    assert load["message"].startswith("idle (/metrics) after waiting ")
    assert load["message"].endswith("(it was 1 request processing (/metrics))")


def test_wait_gives_up_at_its_bound():
    with FakeOpenAI(engine="vllm", busy_waiting=4) as fake:
        started = time.monotonic()
        load = llm_load.check_load(_endpoint(fake), "vllm", "wait", wait_s=0.6, poll_s=0.25)
        took = time.monotonic() - started
    assert load["measure"] is False and load["busy"] is True
    assert 0.5 <= took < 1.5 and load["checks"] >= 3
    assert "0 requests processing, 4 waiting (/metrics) after waiting" in load["message"]
    assert "(busy_wait 0.6): not measured" in load["message"]


def test_measure_records_the_load_and_says_the_figures_include_it():
    with FakeOpenAI(engine="vllm", busy_requests=1) as fake:
        load = llm_load.check_load(_endpoint(fake), "vllm", "measure")
    assert load["measure"] is True and load["busy"] is True and load["processing"] == 1
    assert "measured anyway" in load["message"]


def test_policy_and_bounds_are_checked():
    endpoint = lb.Endpoint("http://127.0.0.1:9")
    with pytest.raises(lb.BenchmarkError, match="busy_policy must be one of wait, skip, measure"):
        llm_load.check_load(endpoint, "vllm", "later")
    with pytest.raises(lb.BenchmarkError, match="busy_poll > 0"):
        llm_load.check_load(endpoint, "vllm", "wait", poll_s=0)


def test_the_wait_uses_the_clock_it_is_given():
    """The wait is bounded by the clock, and sleeps no longer than what is left of the bound."""
    ticks = {"now": 0.0}
    sleeps = []

    def sleep(seconds):
        sleeps.append(seconds)
        ticks["now"] += seconds

    with FakeOpenAI(engine="vllm", busy_requests=1) as fake:
        load = llm_load.check_load(_endpoint(fake), "vllm", "wait", wait_s=12, poll_s=5,
                                   clock=lambda: ticks["now"], sleep=sleep)
    assert sleeps == [5, 5, 2] and load["checks"] == 4 and load["waited_s"] == 12.0
    assert load["measure"] is False


# --- the real llama-server ---------------------------------------------------------------------------------

def _llama_server():
    for path in (os.environ.get("LLMOPS_LLAMA_SERVER"), os.path.join(ROOT, ".cache", "ci-llama", "bin",
                                                                       "llama-server")):
        if path and os.access(path, os.X_OK):
            return path
    pytest.skip("no llama-server binary (set LLMOPS_LLAMA_SERVER or build .cache/ci-llama)")


def _free_port():
    import socket
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.needs_llama_server
def test_real_llama_server_slots_show_a_request_in_flight(tmp_path):
    binary = _llama_server()
    from tests.fixtures.gguf.make_tiny_model import cached_tiny_model
    model = tmp_path / "tiny.gguf"
    shutil.copy(cached_tiny_model("llama"), model)
    key_file = tmp_path / "key"
    key_file.write_text(KEY + "\n")
    port = _free_port()
    log = tmp_path / "llama-server.log"
    with open(str(log), "w") as out:
        proc = subprocess.Popen([binary, "-m", str(model), "--host", "127.0.0.1", "--port", str(port),
                                 "--threads", "1", "--ctx-size", "1024", "--parallel", "2",
                                 "--api-key-file", str(key_file)], stdout=out, stderr=subprocess.STDOUT)
    url = "http://127.0.0.1:%d" % port
    try:
        wait_healthy(proc, url, log)
        endpoint = llm_load.load_endpoint(url, KEY)
        idle = llm_load.read_load(endpoint, "llama.cpp")
        assert idle == {"source": "/slots", "processing": 0, "waiting": None, "slots": 2}
        assert llm_load.read_load(llm_load.load_endpoint(url, "wrong"), "llama.cpp")["source"] is None
        request = lb.Endpoint(url, KEY, 60)
        stream = threading.Thread(target=lb.stream_chat,
                                  args=(request, lb.request_body("tiny", "count to a thousand", 400)))
        stream.start()
        seen = []
        while stream.is_alive() and not any(seen):
            seen.append(llm_load.read_load(endpoint, "llama.cpp")["processing"])
            time.sleep(0.05)
        stream.join()
        assert any(seen), seen
        assert llm_load.check_load(endpoint, "llama.cpp", "skip")["measure"] is True
    finally:
        proc.terminate()
        proc.wait(timeout=10)
