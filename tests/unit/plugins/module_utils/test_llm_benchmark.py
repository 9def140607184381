# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""llm_benchmark against the fake OpenAI server (known rates), and against the real CPU llama-server with MTP
speculative decoding: the figures are right, runs are really concurrent, errors are counted and reported,
the key comes from a file or a systemd env file and never appears in what the benchmark returns."""
import json
import os
import re
import socket
import subprocess
import time

import pytest
from ansible_collections.llmops.serving.plugins.module_utils._benchmark import client as lb
from ansible_collections.llmops.serving.plugins.module_utils.engines import VLLM

from tests.fixtures.fake_openai.server import FakeOpenAI
from tests.helpers import ROOT, wait_healthy

KEY = "sk-bench-0123456789abcdef"


def _bench(fake, runs, **kwargs):
    kwargs.setdefault("timeout", 10)
    return lb.benchmark(fake.url, runs=runs, **kwargs)


# --- metrics from controlled delays ----------------------------------------------------------------------

def _timings_match(run):
    """The timed figures against the fake's known rates (a descheduled client on a loaded machine misses now
    and then; a miscount or a wrong clock misses every time)."""
    return (run["ttft_s"]["mean"] == pytest.approx(0.2, abs=0.05)          # 200 tokens at 1000 tok/s
            and run["prefill_tps"] == pytest.approx(1000.0, rel=0.2)
            and run["decode_tps"] == pytest.approx(50.0, rel=0.1)
            and run["server_decode_tps"] == pytest.approx(50.0, rel=0.1)
            and run["server_prefill_tps"] == pytest.approx(1000.0, rel=0.2)
            # two requests of ~0.2 + 25/50 s one after the other
            and run["wall_s"] == pytest.approx(1.4, abs=0.3))


def test_figures_match_the_servers_known_rates():
    timed = []
    for _attempt in range(3):   # the best of three for the timed figures; the counts must hold every time
        with FakeOpenAI(decode_tps=50.0, prefill_tps=1000.0, prompt_overhead=12) as fake:
            result = _bench(fake, [{"prompt_tokens": 200, "max_tokens": 26, "concurrency": 1, "requests": 2}])
        run = result["runs"][0]
        assert (run["ok"], run["errors"], run["error_messages"]) == (2, 0, [])
        # the fake counts one token per word: the calibration is exact, so is the prompt length
        # the fake counts words: its 12 template words + the frame (Request, the 12 id words, 5 closing words)
        assert result["calibration"] == {"tokens_per_word": 1.0, "overhead_tokens": 30.0}
        assert run["prompt_tokens"] == 200 and run["completion_tokens"] == 26
        assert run["cached_prompt_tokens"] == 0
        assert run["ttft_s"]["p50"] <= run["ttft_s"]["p90"] <= run["ttft_s"]["max"]
        assert run["draft_acceptance"] is None
        assert run["decode_tps_total"] == pytest.approx(52 / run["wall_s"], rel=0.01)
        timed.append((run["ttft_s"]["mean"], run["prefill_tps"], run["decode_tps"], run["wall_s"]))
        if _timings_match(run):
            break
    else:
        raise AssertionError("timed figures off in three runs (ttft, prefill, decode, wall): %s" % timed)
    summary = result["summary"]
    assert summary["decode_tps"] == run["decode_tps"]
    assert summary["decode_tps_agreement"] == pytest.approx(1.0, abs=0.05)
    assert result["errors"] == 0 and result["failed"] is False
    assert result["model"] == "fake-model" and result["engine"] == "llama.cpp"


def test_requests_are_unique_streaming_and_ask_for_the_full_output():
    with FakeOpenAI(decode_tps=2000.0, prefill_tps=1e6) as fake:
        _bench(fake, [{"prompt_tokens": 60, "max_tokens": 8, "concurrency": 2, "requests": 4}],
               warmup_requests=3)
    bodies = fake.requests
    assert len(bodies) == 3 + 4
    prompts = [b["messages"][0]["content"] for b in bodies]
    ids = [re.search(r"Request ((?:[a-z]+ ){11}[a-z]+)\.", p).group(1) for p in prompts]
    assert len(set(ids)) == len(ids)
    for body in bodies:
        assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
        assert body["ignore_eos"] is True and body["model"] == "fake-model"
    # two calibration lengths, then a warm-up at the run's length, then the run
    lengths = [len(p.split()) for p in prompts]  # the id's words are the same number in every prompt
    assert lengths[0] < lengths[1] and lengths[2] == lengths[3] == lengths[-1]


def test_seed_makes_word_choice_reproducible_but_ids_stay_unique():
    def words(seed):
        with FakeOpenAI(decode_tps=2000.0, prefill_tps=1e6) as fake:
            _bench(fake, [{"prompt_tokens": 40, "max_tokens": 2, "requests": 1}], seed=seed)
        return [b["messages"][0]["content"] for b in fake.requests]

    first, again, other = words(7), words(7), words(8)
    def strip(prompts):
        return [re.sub(r"^Request [a-z ]+\.", "", p) for p in prompts]

    assert strip(first) == strip(again)
    assert strip(first) != strip(other)
    assert set(first).isdisjoint(again)


def test_reasoning_tokens_count_as_first_tokens():
    # 10 reasoning tokens at 20 tok/s: 0.5 s before the first content token. The first token is the first
    # reasoning one (0.05 s); half the reasoning time leaves a loaded machine room either way.
    with FakeOpenAI(decode_tps=20.0, prefill_tps=1e6, reasoning_tokens=10) as fake:
        run = _bench(fake, [{"prompt_tokens": 30, "max_tokens": 21, "requests": 1}])["runs"][0]
    assert run["ok"] == 1 and run["completion_tokens"] == 21
    assert run["ttft_s"]["max"] < 0.25
    assert run["decode_tps"] == pytest.approx(20.0, rel=0.1)


# --- concurrency -----------------------------------------------------------------------------------------

def test_concurrency_is_real():
    with FakeOpenAI(decode_tps=40.0, prefill_tps=1e6) as fake:
        result = _bench(fake, [{"prompt_tokens": 30, "max_tokens": 21, "concurrency": 4, "requests": 4},
                               {"prompt_tokens": 30, "max_tokens": 21, "concurrency": 1, "requests": 2}])
    parallel, serial = result["runs"]
    assert fake.max_in_flight == 4
    # four 0.5 s streams at once take 0.5 s, not 2 s
    assert parallel["wall_s"] < 0.9 and serial["wall_s"] > 0.9
    assert parallel["decode_tps"] == pytest.approx(40.0, rel=0.1)
    assert parallel["decode_tps_total"] == pytest.approx(4 * 21 / parallel["wall_s"], rel=0.01)
    assert parallel["decode_tps_total"] > 3 * serial["decode_tps_total"]
    # the summary is the lowest concurrency, wherever it comes in the list
    assert result["summary"]["decode_tps"] == serial["decode_tps"]


def test_run_concurrently_caps_threads_and_keeps_order():
    import threading
    active, peak, lock = [0], [0], threading.Lock()

    def work(index):
        with lock:
            active[0] += 1
            peak[0] = max(peak[0], active[0])
        time.sleep(0.05)
        with lock:
            active[0] -= 1
        return index * 10

    results, wall = lb.run_concurrently(7, 3, work)
    assert results == [0, 10, 20, 30, 40, 50, 60] and peak[0] == 3
    assert 0.14 < wall < 0.5  # three waves of 0.05 s


# --- errors ----------------------------------------------------------------------------------------------

def test_errors_are_counted_and_reported_not_raised():
    # completions 1 and 2 calibrate; the run's six are 3..8, of which 3 and 6 fail
    with FakeOpenAI(decode_tps=2000.0, prefill_tps=1e6, fail_every=3, api_key=KEY) as fake:
        result = _bench(fake, [{"prompt_tokens": 30, "max_tokens": 4, "concurrency": 2, "requests": 6}],
                        api_key=KEY)
    run = result["runs"][0]
    assert (run["ok"], run["errors"]) == (4, 2)
    assert result["errors"] == 2 and result["failed"] is True
    assert sorted(run["error_messages"]) == [
        "HTTP 503: fake failure 3 (Authorization: Bearer <redacted>)",
        "HTTP 503: fake failure 6 (Authorization: Bearer <redacted>)"]
    assert run["decode_tps"] is not None
    assert KEY not in json.dumps(result)


def test_timeouts_are_errors():
    with FakeOpenAI(decode_tps=2000.0, prefill_tps=1e6, stall_every=3, stall_s=2.0) as fake:
        result = _bench(fake, [{"prompt_tokens": 30, "max_tokens": 4, "requests": 3}], timeout=0.5)
    run = result["runs"][0]
    assert (run["ok"], run["errors"]) == (2, 1)
    assert run["error_messages"][0].startswith("timeout")


# --- where a run's wall time went --------------------------------------------------------------------------

def test_a_stall_after_the_last_token_is_flagged_and_placed():
    """The demo's cold run: two sequential requests, 15.6 s of wall time, each with a short time to first
    token and decode. The time a stream takes past its last token is recorded (tail_s) and the run says
    where its unexplained wall time went; the same run without the stall is not flagged."""
    runs = [{"prompt_tokens": 30, "max_tokens": 8, "concurrency": 1, "requests": 2}]
    with FakeOpenAI(decode_tps=2000.0, prefill_tps=1e6, tail_s=1.5) as fake:
        stalled = _bench(fake, runs, warmup_requests=0)["runs"][0]
    with FakeOpenAI(decode_tps=2000.0, prefill_tps=1e6) as fake:
        clean = _bench(fake, runs, warmup_requests=0)["runs"][0]
    assert stalled["ok"] == 2 and stalled["ttft_s"]["max"] < 0.5
    assert stalled["tail_s"]["mean"] == pytest.approx(1.5, abs=0.3)
    assert stalled["unexplained_s"] == pytest.approx(3.0, abs=0.5) and stalled["idle_s"] < 0.3
    assert "after the last tokens until the streams ended" in stalled["stall"], stalled["stall"]
    assert clean["stall"] is None and clean["unexplained_s"] < 0.3 and clean["tail_s"]["max"] < 0.3


def test_queue_and_connect_are_recorded_apart_from_the_time_to_first_token():
    """A request left waiting for an HTTP worker or a slot: queue_s is that wait (request written to first
    token, less the server's own prompt time); the time to first token still includes it, and a wait over
    STALL_MIN_S is named."""
    runs = [{"prompt_tokens": 200, "max_tokens": 4, "concurrency": 1, "requests": 2}]
    with FakeOpenAI(decode_tps=2000.0, prefill_tps=1000.0, queue_s=1.2) as fake:
        run = _bench(fake, runs, warmup_requests=0)["runs"][0]
    assert run["queue_s"]["mean"] == pytest.approx(1.2, abs=0.2)
    assert run["ttft_s"]["mean"] == pytest.approx(1.2 + 0.2, abs=0.25)       # the queue and 200 tokens
    assert run["connect_s"]["max"] < 0.2
    assert "spent 1.2 s queued at the server" in run["stall"] and "connecting" not in run["stall"], run
    with FakeOpenAI(decode_tps=2000.0, prefill_tps=1000.0) as fake:
        run = _bench(fake, runs, warmup_requests=0)["runs"][0]
    assert run["queue_s"]["max"] < 0.2 and run["stall"] is None, run


def _timed(start, first, last, end, ok=True):
    return {"ok": ok, "t_start": start, "t_connected": start + 0.001, "t_sent": start + 0.002,
            "t_headers": first, "t_first": first, "t_last": last, "t_end": end, "timings": None}


def test_stall_check_counts_idle_time_and_overlaps_once():
    # two requests in parallel, then 2 s with none in flight, then one more: 2 s unexplained, all idle
    records = [_timed(0.0, 0.1, 1.0, 1.0), _timed(0.0, 0.2, 1.0, 1.0), _timed(3.0, 3.1, 4.0, 4.0)]
    found = lb.stall_check(records, 4.0)
    assert (found["unexplained_s"], found["idle_s"]) == (2.0, 2.0)
    assert "2.0 s with no request in flight" in found["stall"]
    # below both bounds (STALL_MIN_S and STALL_FRACTION of the wall time): not a stall
    records[2] = _timed(1.5, 1.6, 10.0, 10.0)
    found = lb.stall_check(records, 10.0)
    assert found["unexplained_s"] == 0.5 and found["stall"] is None
    # a failed request explains its time up to its end; a record without times (a crashed worker) none
    found = lb.stall_check([_timed(0.0, None, None, 5.0, ok=False), {"ok": False, "error": "x"}], 5.0)
    assert found["unexplained_s"] == 0.0 and found["stall"] is None


def test_a_long_queue_is_a_stall_alone_but_not_behind_the_runs_own_requests():
    waited = [_timed(0.0, 2.0, 3.0, 3.0), _timed(3.0, 3.1, 4.0, 4.0)]   # 2 s to the first token, no timings
    assert "spent 2.0 s queued at the server" in lb.stall_check(waited, 4.0)["stall"]
    # at concurrency 4 on 2 slots, a request waits for the run's own others: reported (queue_s), not a stall
    assert lb.stall_check(waited, 4.0, concurrency=4)["stall"] is None
    slow_connect = [dict(_timed(0.0, 2.0, 3.0, 3.0), t_connected=1.5)]
    assert "spent 1.5 s connecting" in lb.stall_check(slow_connect, 3.0, concurrency=4)["stall"]


def test_a_failed_warm_up_is_retried_for_calibration():
    with FakeOpenAI(decode_tps=2000.0, prefill_tps=1e6, fail_every=2) as fake:
        result = _bench(fake, [{"prompt_tokens": 40, "max_tokens": 2, "requests": 1}])
    # completion 2 failed; 3 calibrated the second length, 4 failed (the run), so the run has an error
    assert result["calibration"]["tokens_per_word"] == 1.0
    assert result["runs"][0]["errors"] == 1


def test_cannot_start_without_the_right_key_and_says_why_without_the_key():
    with FakeOpenAI(api_key=KEY) as fake:
        with pytest.raises(lb.BenchmarkError) as info:
            _bench(fake, None, api_key=KEY[:-1])
    assert "HTTP 401: Invalid API Key" in str(info.value) and KEY[:-1] not in str(info.value)
    with FakeOpenAI(api_key=KEY, fail_every=1) as fake:
        with pytest.raises(lb.BenchmarkError) as info:
            _bench(fake, None, api_key=KEY)
    assert "no warm-up request succeeded" in str(info.value) and KEY not in str(info.value)
    assert "<redacted>" in str(info.value)


def test_unreachable_server():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    with pytest.raises(lb.BenchmarkError, match="cannot list models"):
        lb.benchmark("http://127.0.0.1:%d" % port, timeout=2)
    with pytest.raises(lb.BenchmarkError, match="url must be"):
        lb.benchmark("ftp://example", model="m")
    with pytest.raises(lb.BenchmarkError, match="engine must be"):
        lb.benchmark("http://127.0.0.1:1", engine="tgi")


# --- vLLM ------------------------------------------------------------------------------------------------

def test_vllm_acceptance_from_metrics_delta():
    with FakeOpenAI(engine="vllm", decode_tps=500.0, prefill_tps=1e6, draft_n_per_token=3.0,
                    draft_accept=0.75, cached_tokens=0) as fake:
        result = _bench(fake, [{"prompt_tokens": 30, "max_tokens": 21, "requests": 2}], engine="vllm")
    run = result["runs"][0]
    # warm-up drafts happened before the run's first scrape: only the run's 2 x 60 drafted tokens count
    assert run["draft_tokens"] == 120 and run["draft_accepted_tokens"] == 90
    assert run["draft_acceptance"] == 0.75 and result["summary"]["draft_acceptance"] == 0.75
    assert run["server_decode_tps"] is None and result["summary"]["decode_tps_agreement"] is None
    assert run["cached_prompt_tokens"] == 0


def test_llama_cpp_acceptance_from_timings_and_cached_tokens_reported():
    with FakeOpenAI(decode_tps=500.0, prefill_tps=1e6, draft_n_per_token=2.0, draft_accept=0.5,
                    cached_tokens=7) as fake:
        run = _bench(fake, [{"prompt_tokens": 30, "max_tokens": 11, "requests": 2}])["runs"][0]
    assert run["draft_acceptance"] == 0.5 and run["draft_tokens"] == 40
    assert run["cached_prompt_tokens"] == 7


def test_scrape_counters_sums_label_sets_and_tolerates_absence():
    with FakeOpenAI(engine="vllm") as fake:
        fake.spec_counters.update(draft=9, accepted=5)
        endpoint = lb.Endpoint(fake.url)
        accepted, drafted = VLLM.spec_metrics
        assert lb.scrape_counters(endpoint, (accepted, drafted)) == {accepted: 5.0, drafted: 9.0}
    with FakeOpenAI(engine="llama.cpp") as fake:
        assert lb.scrape_counters(lb.Endpoint(fake.url), (drafted,)) == {}


# --- the key ---------------------------------------------------------------------------------------------

def test_key_from_file_and_env_file(tmp_path):
    key_file = tmp_path / "key"
    key_file.write_text("# llama-server key\n\n%s\nsecond-key\n" % KEY)
    assert lb.read_api_key(api_key_file=str(key_file)) == KEY
    env = tmp_path / "vllm.env"
    env.write_text('# unit env\nHF_HOME=/srv/hf\nVLLM_API_KEY="%s"\n; comment\nOTHER=x\n' % KEY)
    assert lb.read_api_key(env_file=str(env), engine="vllm") == KEY
    assert lb.read_api_key(env_file=str(env), api_key_env="OTHER") == "x"
    assert lb.read_api_key(api_key="direct", api_key_file=str(key_file)) == "direct"
    assert lb.read_api_key() is None
    with pytest.raises(lb.BenchmarkError, match="does not set LLAMA_API_KEY"):
        lb.read_api_key(env_file=str(env))
    empty = tmp_path / "empty"
    empty.write_text("# nothing\n\n")
    with pytest.raises(lb.BenchmarkError, match="holds no key"):
        lb.read_api_key(api_key_file=str(empty))
    with pytest.raises(lb.BenchmarkError, match="cannot read env_file"):
        lb.read_api_key(env_file=str(tmp_path / "missing"))


def test_systemd_env_file_quoting():
    text = ("A=plain value\n"
            "  B = 'single $quoted \\n'\n"
            'C="double \\"inner\\" \\\\ back"\n'
            "D=continued \\\n"
            "line\n"
            "#E=commented\n"
            ";F=commented\n"
            "G=\n"
            "not an assignment\n")
    assert lb.parse_env_file(text) == {"A": "plain value", "B": "single $quoted \\n",
                                       "C": 'double "inner" \\ back', "D": "continued line", "G": ""}


def test_benchmark_with_key_from_env_file_never_returns_it(tmp_path):
    env = tmp_path / "vllm.env"
    env.write_text("VLLM_API_KEY='%s'\n" % KEY)
    with FakeOpenAI(engine="vllm", api_key=KEY, decode_tps=2000.0, prefill_tps=1e6) as fake:
        key = lb.read_api_key(env_file=str(env), engine="vllm")
        result = _bench(fake, [{"prompt_tokens": 30, "max_tokens": 4, "requests": 2}], engine="vllm",
                        api_key=key)
    assert result["errors"] == 0
    assert set(fake.auth_headers) == {"Bearer " + KEY}
    assert KEY not in json.dumps(result)


# --- pure helpers ----------------------------------------------------------------------------------------

def test_normalize_runs():
    assert lb.normalize_runs(None) == [dict(r) for r in lb.DEFAULT_RUNS]
    assert lb.normalize_runs([{"prompt_tokens": 100, "concurrency": 8}]) == [
        {"prompt_tokens": 100, "max_tokens": 256, "concurrency": 8, "requests": 8}]
    assert lb.normalize_runs([{"prompt_tokens": 100}])[0]["requests"] == 3
    with pytest.raises(lb.BenchmarkError, match="prompt_tokens must be at least 1"):
        lb.normalize_runs([{"prompt_tokens": 0}])


def test_calibration_fit():
    fit = lb.Calibration([(48, 48 * 1.3 + 20), (192, 192 * 1.3 + 20)])
    assert fit.per_word == pytest.approx(1.3) and fit.overhead == pytest.approx(20)
    assert fit.words_for(1320) == 1000
    assert lb.Calibration([(100, 150)]).words_for(300) == 200   # one length: a ratio, no overhead


def test_summary_with_nothing_measured():
    run = lb.summarize_run({"prompt_tokens": 10, "max_tokens": 5, "concurrency": 1},
                           [{"ok": False, "error": "HTTP 500: x"}] * 3, 1.0)
    assert (run["ok"], run["errors"], run["error_messages"]) == (0, 3, ["HTTP 500: x"])
    assert run["decode_tps"] is None and run["ttft_s"]["p50"] is None
    assert lb.summarize([run])["decode_tps"] is None


# --- the real llama-server with MTP ----------------------------------------------------------------------

def _llama_server():
    path = os.environ.get("LLMOPS_LLAMA_SERVER") or os.path.join(ROOT, ".cache", "host-build", "bin",
                                                                   "llama-server")
    if not os.access(path, os.X_OK):
        pytest.skip("no llama-server binary (set LLMOPS_LLAMA_SERVER or build .cache/host-build)")
    return path


def _port_in_range(first=18100, last=18119):
    for port in range(first, last + 1):
        sock = socket.socket()
        try:
            sock.bind(("127.0.0.1", port))
            return port
        except OSError:
            continue
        finally:
            sock.close()
    pytest.skip("no free port in %d-%d" % (first, last))


@pytest.mark.needs_llama_server
def test_real_llama_server_with_mtp(tmp_path):
    np = pytest.importorskip("numpy")  # noqa: F841  (the tiny model generator needs it)
    from tests.fixtures.gguf import make_tiny_model

    model = make_tiny_model.cached_tiny_model("qwen35")
    key_file = tmp_path / "api.key"
    key_file.write_text(KEY + "\n")
    os.chmod(str(key_file), 0o600)
    port = _port_in_range()
    log_path = str(tmp_path / "server.log")
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [_llama_server(), "-m", model, "--host", "127.0.0.1", "--port", str(port), "--threads", "1",
             "-c", "4096", "--parallel", "2", "--kv-unified", "--jinja", "--api-key-file", str(key_file),
             "--spec-type", "draft-mtp", "--spec-draft-n-max", "3"], stdout=log, stderr=subprocess.STDOUT)
    url = "http://127.0.0.1:%d" % port
    try:
        wait_healthy(proc, url, log_path)
        runs = [{"prompt_tokens": 512, "max_tokens": 512, "concurrency": 1, "requests": 2},
                {"prompt_tokens": 512, "max_tokens": 256, "concurrency": 2, "requests": 2}]
        result = lb.benchmark(url, "llama.cpp", api_key=lb.read_api_key(api_key_file=str(key_file)),
                              runs=runs, timeout=120)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    print(json.dumps(result, indent=1))
    assert result["errors"] == 0 and KEY not in json.dumps(result)
    single, pair = result["runs"]
    for run in (single, pair):
        assert run["completion_tokens"] == run["max_tokens"]
        assert run["prompt_tokens"] == pytest.approx(512, rel=0.05)
        assert run["cached_prompt_tokens"] == 0
        assert run["draft_acceptance"] > 0
        assert run["decode_tps"] == pytest.approx(run["server_decode_tps"], rel=0.10)
    agreement = result["summary"]["decode_tps_agreement"]
    assert 0.9 <= agreement <= 1.1, agreement


def test_a_malformed_stream_is_an_error_of_that_request():
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer

    class Broken(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            self.wfile.write(b'data: {"choices": [{"delta": {"content": "a"}}]}\n\ndata: [1, 2]\n\n')

    server = HTTPServer(("127.0.0.1", 0), Broken)
    thread = threading.Thread(target=server.handle_request)
    thread.start()
    try:
        endpoint = lb.Endpoint("http://127.0.0.1:%d" % server.server_address[1], timeout=5)
        record = lb.stream_chat(endpoint, lb.request_body("m", "hi", 4))
    finally:
        thread.join(10)
        server.server_close()
    assert record["ok"] is False and record["error"] == "ValueError: a stream chunk is not a JSON object"
