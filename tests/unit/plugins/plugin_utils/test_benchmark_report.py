# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The validate stage's report, renderings and gate (plugins/plugin_utils/benchmark_report.py, its filters),
from recorded llm_benchmark results: a llama.cpp instance with the seed's L20 figures (two L20s, MTP) and a
vLLM instance with a failed request."""
import copy
import json
import xml.etree.ElementTree as ET

import pytest
from ansible.errors import AnsibleFilterError
from ansible_collections.llmops.serving.plugins.filter.benchmark import FilterModule
from ansible_collections.llmops.serving.plugins.plugin_utils import benchmark_report as br

SVG = "{http://www.w3.org/2000/svg}"
SHA = "3f" * 32


def run(prompt, max_tokens, concurrency, requests, ttft, prefill, decode, total, server, acceptance,
        errors=0, messages=()):
    ok = requests - errors
    return {
        "prompt_tokens_target": prompt, "max_tokens": max_tokens, "concurrency": concurrency,
        "requests": requests, "ok": ok, "errors": errors, "error_messages": list(messages),
        "wall_s": round(requests / concurrency * (ttft + max_tokens / decode), 3) if ok else 0.5,
        "prompt_tokens": prompt + 42.0 if ok else None,
        "completion_tokens": float(max_tokens) if ok else None,
        "cached_prompt_tokens": 0.0 if ok else None,
        "ttft_s": {"mean": ttft, "p50": ttft, "p90": ttft and round(ttft * 1.01, 4),
                   "max": ttft and ttft * 1.02},
        "prefill_tps": prefill, "decode_tps": decode, "decode_tps_total": total,
        "server_prefill_tps": prefill and prefill * 1.02, "server_decode_tps": server,
        "draft_acceptance": acceptance,
    }


LLAMA_RESULT = {
    "url": "http://127.0.0.1:8003", "engine": "llama.cpp", "model": "qwen36-27b",
    "calibration": {"tokens_per_word": 1.31, "overhead_tokens": 17.0},
    "runs": [run(20000, 256, 1, 3, 13.09, 1301.9, 88.0, 86.1, 89.2, 0.789),
             run(60000, 128, 1, 2, 45.59, 1118.4, 87.1, 84.0, 88.0, 0.636),
             run(20000, 256, 2, 4, 24.8, 1290.0, 61.5, 118.2, 62.0, 0.71)],
    "summary": {"decode_tps": 87.55, "ttft_s": 29.34, "prefill_tps": 1210.15, "server_decode_tps": 88.6,
                "draft_acceptance": 0.72, "decode_tps_agreement": 0.9881},
    "errors": 0, "failed": False,
    # Ansible's bookkeeping of a registered loop item: not part of the report.
    "changed": False, "invocation": {"module_args": {"api_key": "VALUE_SPECIFIED_IN_NO_LOG_PARAMETER"}},
    "_validate_target": {"name": "qwen36-27b"}, "ansible_loop_var": "_validate_target",
}
VLLM_RESULT = {
    "url": "http://127.0.0.1:8000", "engine": "vllm", "model": "qwen-local",
    "runs": [run(512, 128, 1, 2, 0.21, 2400.0, 41.3, 40.9, 41.0, None),
             run(512, 128, 2, 4, 0.35, 2900.0, 38.0, 70.4, 37.5, None, errors=1,
                 messages=["HTTP 500: CUDA out of memory"])],
    "summary": {"decode_tps": 41.3, "ttft_s": 0.21, "prefill_tps": 2400.0, "server_decode_tps": 41.0,
                "draft_acceptance": None, "decode_tps_agreement": 1.0073},
    "errors": 1, "failed": True,
}
INSTANCES = {
    "qwen36-27b": {"url": "http://127.0.0.1:8003", "engine": "llama.cpp", "served_model_name": "qwen36-27b",
                   "key_file": "/etc/llmops/keys/qwen36-27b.key", "api_key_env": None, "env_file": None,
                   "unit": "llama-server-qwen36-27b.service", "port": 8003, "host": "127.0.0.1",
                   "gpus": [0, 1],
                   "model": "qwen3-27b", "model_path": "/home/models/Qwen3.6-27B-UD-Q5_K_XL.gguf",
                   "model_sha256": SHA, "mode": "host", "build_id": "0c1e57098bba43ac",
                   "settings": {"ctx_size": 262144, "parallel": 2, "cache_type_k": "q8_0"}},
    "qwen-fp8": {"url": "http://127.0.0.1:8000", "engine": "vllm", "served_model_name": "qwen-local",
                 "key_file": None, "api_key_env": "VLLM_API_KEY", "env_file": "/etc/llmops/qwen-fp8.env",
                 "unit": "vllm-qwen-fp8.service", "port": 8000, "host": "127.0.0.1", "gpus": [2, 3],
                 "model": "/home/models/qwen-fp8", "model_path": "/home/models/qwen-fp8",
                 "model_sha256": None,
                 "mode": "venv", "build_id": "vllm-0.11.0", "settings": {"max_model_len": 100000}},
}
RUNS = [{"prompt_tokens": 20000, "max_tokens": 256, "concurrency": 1, "requests": 3}]


def report(results=None):
    results = results if results is not None else {"qwen36-27b": LLAMA_RESULT, "qwen-fp8": VLLM_RESULT}
    return br.build_report("l20", INSTANCES, copy.deepcopy(results), runs=RUNS, warmup_requests=2,
                           timestamp="2026-12-01T05:30:00Z")


# --- targets -----------------------------------------------------------------------------------------------

def test_targets_pass_the_key_by_file_for_llama_cpp_and_by_env_file_for_vllm():
    targets = br.benchmark_targets(INSTANCES)
    assert [t["name"] for t in targets] == ["qwen-fp8", "qwen36-27b"]
    vllm, llama = targets
    assert llama == {"name": "qwen36-27b", "url": "http://127.0.0.1:8003", "engine": "llama.cpp",
                     "model": "qwen36-27b", "api_key_file": "/etc/llmops/keys/qwen36-27b.key",
                     "env_file": None, "api_key_env": None, "unit": "llama-server-qwen36-27b.service"}
    assert vllm["api_key_file"] is None and vllm["model"] == "qwen-local"
    assert (vllm["env_file"], vllm["api_key_env"]) == ("/etc/llmops/qwen-fp8.env", "VLLM_API_KEY")


def test_targets_keep_only_named_instances_of_this_host():
    assert [t["name"] for t in br.benchmark_targets(INSTANCES, ["qwen36-27b", "elsewhere"])] == ["qwen36-27b"]
    assert br.benchmark_targets({}, ["qwen36-27b"]) == []
    assert br.benchmark_targets(None) == []


def test_unknown_names_are_those_no_host_serves():
    per_host = [INSTANCES, {"elsewhere": {}}, None]
    assert br.unknown_instances(["qwen36-27b", "elsewhere", "qwen36-72b"], per_host) == ["qwen36-72b"]
    assert br.unknown_instances([], per_host) == []


# --- the JSON report ---------------------------------------------------------------------------------------

def test_report_keeps_the_results_and_what_was_measured_without_ansible_bookkeeping():
    rep = report()
    assert rep["host"] == "l20" and rep["timestamp"] == "2026-12-01T05:30:00Z"
    assert rep["benchmark"] == {"runs": RUNS, "warmup_requests": 2}
    llama = rep["instances"]["qwen36-27b"]
    assert llama["model_sha256"] == SHA and llama["build_id"] == "0c1e57098bba43ac"
    assert llama["settings"]["ctx_size"] == 262144 and llama["engine"] == "llama.cpp"
    assert set(llama["result"]) == {"url", "engine", "model", "calibration", "runs", "summary", "errors",
                                    "failed"}
    assert llama["result"]["runs"] == LLAMA_RESULT["runs"]
    assert "invocation" not in json.dumps(rep) and "key_file" not in llama
    json.dumps(rep)  # plain data


# --- Markdown ----------------------------------------------------------------------------------------------

def _rows(table):
    lines = table.splitlines()
    cells = [[c.strip() for c in line.strip("|").split(" | ")] for line in lines]
    return cells[0], lines[1], cells[2:]


def test_markdown_table_of_all_instances_has_one_row_per_run():
    header, rule, rows = _rows(br.markdown_table(report()))
    assert header[0] == "instance" and header[1:] == list(br.TABLE_COLUMNS)
    assert rule.count("---") == len(header)
    assert all(len(r) == len(header) for r in rows)
    assert [r[0] for r in rows] == ["qwen-fp8"] * 2 + ["qwen36-27b"] * 3
    first_llama = dict(zip(header, rows[2], strict=True))
    assert first_llama["concurrency"] == "1" and first_llama["requests ok/sent"] == "3/3"
    assert first_llama["prompt tok (target/mean)"] == "20000/20042"
    assert first_llama["output tok (max/mean)"] == "256/256"
    assert first_llama["TTFT mean s"] == "13.090" and first_llama["prefill tok/s"] == "1301.9"
    assert first_llama["decode tok/s client"] == "88.0" and first_llama["decode tok/s server"] == "89.2"
    assert first_llama["acceptance"] == "78.9%" and first_llama["errors"] == "0"
    failed_run = dict(zip(header, rows[1], strict=True))
    assert failed_run["errors"] == "1" and failed_run["requests ok/sent"] == "3/4"
    assert failed_run["acceptance"] == "-"


def test_markdown_report_names_settings_build_sha_and_errors():
    text = br.markdown_report(report(), chart_file="l20.svg")
    assert text.startswith("# Benchmark of l20\n")
    assert "![decode tok/s and TTFT by concurrency](l20.svg)" in text
    assert "## Instance qwen36-27b (llama.cpp)" in text and "## Instance qwen-fp8 (vllm)" in text
    assert "- model sha256: `%s`" % SHA in text and "- build id: `0c1e57098bba43ac`" in text
    assert '"ctx_size": 262144' in text and "GPUs: 0, 1" in text
    assert "- summary: decode 87.5 tok/s, TTFT 29.340 s, prefill 1210.2 tok/s, server decode 88.6 tok/s, " \
        "acceptance 72.0%" in text
    assert ("- run 2 (prompt 512, max_tokens 128, concurrency 2): 1 of 4 requests failed: HTTP 500: CUDA out "
            "of memory") in text
    # one table per instance (no instance column there)
    assert text.count("| run | concurrency |") == 2


# --- SVG ---------------------------------------------------------------------------------------------------

def _polylines(svg):
    root = ET.fromstring(svg.encode())
    assert root.tag == SVG + "svg"
    panels = [g for g in root.iter(SVG + "g") if g.get("class") == "panel"]
    def points(polyline):
        return [tuple(map(float, xy.split(","))) for xy in polyline.get("points").split()]
    return root, [[(line.get("data-instance"), points(line)) for line in panel.iter(SVG + "polyline")]
                  for panel in panels]


def test_svg_parses_with_two_panels_and_one_line_per_instance_each():
    root, panels = _polylines(br.svg_chart(report()))
    assert len(panels) == 2
    for panel in panels:
        assert sorted(name for name, _ in panel) == ["qwen-fp8", "qwen36-27b"]
        assert all(len(points) == 2 for _, points in panel)         # concurrency 1 and 2
    texts = [t.text for t in root.iter(SVG + "text")]
    assert "concurrency" in texts and "qwen36-27b (llama.cpp)" in texts and "qwen-fp8 (vllm)" in texts
    assert "decode tok/s (all streams)" in texts and "time to first token (mean)" in texts
    decode = dict(panels[0])
    # llama.cpp at concurrency 1: mean of the 20K and 60K runs' total decode (86.1, 84.0); more is higher up
    assert decode["qwen36-27b"][1][1] < decode["qwen36-27b"][0][1]          # 118.2 above 85.05
    assert decode["qwen-fp8"][0][1] > decode["qwen36-27b"][0][1]            # 40.9 below 85.05
    assert decode["qwen36-27b"][0][0] == decode["qwen-fp8"][0][0]            # same concurrency, same x


def test_series_average_runs_at_one_concurrency():
    series = br.series_by_concurrency(report()["instances"]["qwen36-27b"])
    assert series[1] == (pytest.approx(85.05), pytest.approx((13.09 + 45.59) / 2))
    assert series[2] == (118.2, 24.8)


def test_svg_skips_unmeasured_points_and_escapes_names():
    failed = copy.deepcopy(VLLM_RESULT)
    failed["runs"][1] = run(512, 128, 2, 4, None, None, None, None, None, None, errors=4,
                            messages=["refused"])
    rep = br.build_report("node<1>", {"a&b": INSTANCES["qwen-fp8"]}, {"a&b": failed}, timestamp="t")
    root, panels = _polylines(br.svg_chart(rep))
    assert [len(points) for panel in panels for _, points in panel] == [1, 1]
    assert root.find(SVG + "title").text == "Benchmark of node<1> (t)"
    assert panels[0][0][0] == "a&b"


def test_svg_of_a_host_without_runs_is_still_valid():
    root, panels = _polylines(br.svg_chart(br.build_report("h", {}, {}, timestamp="t")))
    assert panels == [[], []]


@pytest.mark.parametrize("value, top", [(0, 1.0), (0.42, 0.5), (85.05, 100.0), (118.2, 200.0), (45.59, 50.0),
                                        (1301.9, 2000.0), (100.0, 100.0), (2.1, 2.5)])
def test_axis_top_is_a_round_number_at_or_above_the_largest_value(value, top):
    assert br._nice_max(value) == pytest.approx(top)


# --- the gate ----------------------------------------------------------------------------------------------

def test_gate_names_instance_figure_and_threshold():
    only_llama = report({"qwen36-27b": LLAMA_RESULT})
    decision = br.gate(only_llama, min_decode_tps=90, max_ttft_s={"qwen36-27b": 20})
    assert decision == {"failed": True, "messages": [
        "instance qwen36-27b: decode 87.5 tok/s < validate_min_decode_tps 90",
        "instance qwen36-27b: TTFT 29.340 s > validate_max_ttft_s 20"]}
    assert br.gate(only_llama, min_decode_tps=80, max_ttft_s=30) == {"failed": False, "messages": []}


def test_gate_per_instance_thresholds_and_no_gate_values():
    rep = report()
    decision = br.gate(rep, min_decode_tps={"qwen-fp8": 45, "qwen36-27b": 80}, fail_on_errors=False)
    assert decision["messages"] == ["instance qwen-fp8: decode 41.3 tok/s < validate_min_decode_tps 45"]
    for none in (0, None, "", {}, {"qwen-fp8": 0}):
        assert br.gate(rep, min_decode_tps=none, max_ttft_s=none, fail_on_errors=False)["failed"] is False


def test_gate_lists_failed_requests_unless_told_not_to():
    decision = br.gate(report())
    assert decision["failed"] is True
    assert decision["messages"] == [
        "instance qwen-fp8: run 2 (prompt 512, max_tokens 128, concurrency 2): 1 of 4 requests failed: "
        "HTTP 500: CUDA out of memory"]
    assert br.gate(report(), fail_on_errors=False)["failed"] is False


def test_gate_fails_when_nothing_was_measured():
    broken = {"msg": "no warm-up request answered (connection refused)", "failed": True}
    rep = report({"qwen36-27b": broken})
    decision = br.gate(rep, min_decode_tps=45, max_ttft_s=5)
    assert decision["messages"] == [
        "instance qwen36-27b: decode not measured tok/s < validate_min_decode_tps 45",
        "instance qwen36-27b: TTFT not measured s > validate_max_ttft_s 5",
        "instance qwen36-27b: benchmark failed: no warm-up request answered (connection refused)"]
    assert br.gate(report({"qwen36-27b": {}}))["messages"] == ["instance qwen36-27b: no run completed"]


def test_gate_refuses_a_threshold_that_is_not_a_number():
    with pytest.raises(br.BenchmarkReportError, match="validate_min_decode_tps: 'fast' .instance qwen36-27b"):
        br.gate(report(), min_decode_tps={"qwen36-27b": "fast"})


# --- the filters -------------------------------------------------------------------------------------------

def test_filters_wrap_the_functions_and_raise_filter_errors():
    filters = FilterModule().filters()
    assert set(filters) == {"benchmark_targets", "benchmark_unknown_instances", "benchmark_report",
                            "benchmark_markdown", "benchmark_table", "benchmark_svg", "benchmark_html",
                            "benchmark_gate", "benchmark_last_report", "benchmark_plan",
                            "benchmark_plan_messages", "benchmark_json", "benchmark_report_files",
                            "benchmark_text", "benchmark_unit_states", "benchmark_down"}
    rep = filters["benchmark_report"]({"qwen36-27b": LLAMA_RESULT}, host="l20", instances=INSTANCES,
                                      runs=RUNS, warmup_requests=2, timestamp="t")
    assert rep["instances"]["qwen36-27b"]["result"]["summary"]["decode_tps"] == 87.55
    assert filters["benchmark_gate"](rep, min_decode_tps=100)["failed"] is True
    with pytest.raises(AnsibleFilterError, match="^validate: validate_max_ttft_s"):
        filters["benchmark_gate"](rep, max_ttft_s=[1])


# --- measure only what changed: the plan, the merged report, the gate of a skipped instance ----------------

FP = {"qwen36-27b": "1111111111111111", "qwen-fp8": "2222222222222222"}
LOAD = {"source": "/slots", "processing": 0, "waiting": None, "slots": 2, "busy": False, "waited_s": 0.0,
        "checks": 1, "checked_at": "2026-12-01T05:29:58Z", "measure": True,
        "message": "idle (/slots, 2 slots)"}


def fingerprinted(**changes):
    instances = copy.deepcopy(INSTANCES)
    for name, entry in instances.items():
        entry["fingerprint"] = FP[name]
    for name, change in changes.items():
        instances[name].update(change)
    return instances


def measured(results=None, instances=None, timestamp="2026-12-01T05:30:00Z", last=None):
    results = results if results is not None else {"qwen36-27b": dict(LLAMA_RESULT, load=LOAD, measured=True)}
    return br.build_report("l20", instances or fingerprinted(), copy.deepcopy(results), runs=RUNS,
                           warmup_requests=2, timestamp=timestamp, last=last)


def reread(rep):
    """The report as the node keeps it and the next run reads it back."""
    return br.parse_last_report(br.report_json(rep))


def test_the_files_render_the_same_report_the_same_way():
    rep = measured()
    files = br.report_files(rep, "l20")
    assert [f["name"] for f in files] == ["l20.json", "l20.md", "l20.svg", "l20.html"]
    assert files[0]["content"] == br.report_json(reread(rep)) and files[0]["content"].endswith("}\n")
    assert "![decode tok/s and TTFT by concurrency](l20.svg)" in files[1]["content"]
    ET.fromstring(files[2]["content"].split("\n", 1)[1])
    assert files[3]["content"] == br.html_report(rep)


def test_only_the_files_missing_or_different_on_the_controller_are_written(tmp_path):
    rep = measured()
    names = [f["name"] for f in br.report_files(rep, "l20", str(tmp_path))]
    assert names == ["l20.json", "l20.md", "l20.svg", "l20.html"]
    for item in br.report_files(rep, "l20"):
        (tmp_path / item["name"]).write_text(item["content"])
    assert br.report_files(rep, "l20", str(tmp_path)) == []
    (tmp_path / "l20.svg").unlink()
    assert [f["name"] for f in br.report_files(rep, "l20", str(tmp_path))] == ["l20.svg"]
    # another report: all three are written again (the Markdown and the chart render the JSON)
    (tmp_path / "l20.svg").write_text("old chart")
    other = measured(timestamp="2026-12-03T00:00:00Z")
    assert [f["name"] for f in br.report_files(other, "l20", str(tmp_path))] == names


def plan(instances=None, last=None, **kwargs):
    instances = instances or fingerprinted()
    return br.measure_plan(br.benchmark_targets(instances), instances, last=last, **kwargs)


def test_a_measurement_records_the_deployment_it_measured_when_and_the_load_it_saw():
    llama = measured()["instances"]["qwen36-27b"]
    assert llama["fingerprint"] == FP["qwen36-27b"] and llama["measured_at"] == "2026-12-01T05:30:00Z"
    assert llama["load"] == LOAD and llama["skipped"] is None
    assert llama["benchmark"] == {"runs": RUNS, "warmup_requests": 2}
    assert "load" not in llama["result"] and "measured" not in llama["result"]
    assert measured()["version"] == br.REPORT_VERSION


@pytest.mark.parametrize("text", [None, "", "not json", "[]", '{"instances": []}', '{"host": "x"}'])
def test_an_unusable_last_report_counts_as_none(text):
    assert br.parse_last_report(text) == {}


def test_nothing_changed_nothing_is_measured_and_the_last_measurement_is_said():
    last = reread(measured())
    items = plan(fingerprinted(), last, deployments={"qwen36-27b": {"changed": False}})
    llama = next(i for i in items if i["name"] == "qwen36-27b")
    assert llama["measure"] is False and llama["measured_at"] == "2026-12-01T05:30:00Z"
    assert llama["reason"] == "unchanged since its measurement at 2026-12-01T05:30:00Z"
    assert br.plan_messages([llama]) == [
        "qwen36-27b: not measured, unchanged since its measurement at 2026-12-01T05:30:00Z: decode 87.5 "
        "tok/s, TTFT 29.340 s (validate_force: true measures it again)."]
    # the other instance was never measured: it is
    fp8 = next(i for i in items if i["name"] == "qwen-fp8")
    assert (fp8["measure"], fp8["reason"]) == (True, "it has no earlier measurement")


@pytest.mark.parametrize("kwargs, changes, reason", [
    ({"force": True}, {}, "validate_force is set"),
    ({"deployments": {"qwen36-27b": {"changed": True}}}, {}, "its deployment changed in this run"),
    ({}, {"qwen36-27b": {"fingerprint": "3333333333333333", "settings": {"ctx_size": 8192}}},
     "its deployment differs from the one measured at 2026-12-01T05:30:00Z (settings changed)"),
    ({}, {"qwen36-27b": {"fingerprint": "3333333333333333", "build_id": "b2", "model_sha256": "ab" * 32}},
     "its deployment differs from the one measured at 2026-12-01T05:30:00Z (build_id, model_sha256 changed)"),
    ({}, {"qwen36-27b": {"fingerprint": "3333333333333333"}},
     "its deployment differs from the one measured at 2026-12-01T05:30:00Z (command line, environment or "
     "binary changed)"),
    ({}, {"qwen36-27b": {"fingerprint": None}},
     "llmops_instances has no deployment fingerprint for it (run the serve stage of this version first)"),
])
def test_what_makes_an_instance_measured_again(kwargs, changes, reason):
    last = reread(measured())
    items = plan(fingerprinted(**changes), last, **kwargs)
    llama = next(i for i in items if i["name"] == "qwen36-27b")
    assert (llama["measure"], llama["reason"]) == (True, reason)
    assert br.plan_messages([llama]) == ["qwen36-27b: measuring, %s." % reason]


def test_a_failed_measurement_is_measured_again():
    last = reread(measured({"qwen-fp8": dict(VLLM_RESULT, load=LOAD, measured=True)}))
    fp8 = next(i for i in plan(fingerprinted(), last) if i["name"] == "qwen-fp8")
    assert (fp8["measure"], fp8["reason"]) == (True, "its last measurement (2026-12-01T05:30:00Z) failed")


def test_measuring_one_instance_keeps_the_others_measurement_and_drops_instances_no_longer_served():
    good_vllm = dict(VLLM_RESULT, errors=0, failed=False, load=LOAD, measured=True)
    good_llama = dict(LLAMA_RESULT, load=LOAD, measured=True)
    first = reread(measured({"qwen36-27b": good_llama, "qwen-fp8": good_vllm}))
    changed = fingerprinted(**{"qwen-fp8": {"fingerprint": "4444444444444444"}})
    second = measured({"qwen-fp8": good_vllm},
                      instances=changed, timestamp="2026-12-02T08:00:00Z", last=first)
    assert second["instances"]["qwen36-27b"] == first["instances"]["qwen36-27b"]
    assert second["instances"]["qwen-fp8"]["measured_at"] == "2026-12-02T08:00:00Z"
    assert second["instances"]["qwen-fp8"]["fingerprint"] == "4444444444444444"
    assert second["timestamp"] == "2026-12-02T08:00:00Z"
    gone = dict(changed)
    del gone["qwen36-27b"]
    third = measured({}, instances=gone, last=reread(second))
    assert list(third["instances"]) == ["qwen-fp8"]


BUSY = dict(LOAD, processing=2, busy=True, measure=False, waited_s=120.0, checks=25,
            message="2 requests processing (/slots, 2 slots) after waiting 120 s (busy_wait 120): not "
                    "measured, so as not to compete with its users")


def test_a_busy_instance_keeps_its_last_measurement_says_why_and_is_not_gated():
    last = reread(measured())
    changed = fingerprinted(**{"qwen36-27b": {"fingerprint": "5555555555555555"}})
    skipped = {"measured": False, "msg": BUSY["message"], "load": BUSY, "runs": [], "summary": {},
               "errors": 0, "failed": False}
    rep = measured({"qwen36-27b": skipped}, instances=changed, timestamp="2026-12-02T08:00:00Z", last=last)
    llama = rep["instances"]["qwen36-27b"]
    assert llama["result"] == last["instances"]["qwen36-27b"]["result"]          # the last figures stay
    assert llama["fingerprint"] == FP["qwen36-27b"]                              # of what they measured
    assert llama["skipped"] == {"at": "2026-12-02T08:00:00Z", "reason": BUSY["message"], "load": BUSY,
                                "fingerprint": "5555555555555555"}
    assert br.gate(rep, min_decode_tps=1000)["failed"] is False
    text = br.markdown_report(rep)
    assert ("- **not measured** at 2026-12-02T08:00:00Z (deployment `5555555555555555`): 2 requests "
            "processing (/slots, 2 slots) after waiting 120 s") in text
    # the next run still wants it measured (its fingerprint still differs)
    item = next(i for i in plan(changed, reread(rep)) if i["name"] == "qwen36-27b")
    assert item["measure"] is True and "differs" in item["reason"]
    # a busy instance never measured before has no figures, and no gate failure either
    fresh = measured({"qwen-fp8": skipped}, last={})
    assert "result" not in fresh["instances"]["qwen-fp8"] and br.gate(fresh)["failed"] is False


def test_markdown_says_when_each_instance_was_measured_and_the_load_before():
    text = br.markdown_report(measured())
    assert ("- measured: 2026-12-01T05:30:00Z (deployment `1111111111111111`), load before: idle (/slots, 2 "
            "slots)") in text


def test_gate_checks_only_the_instances_of_this_run():
    rep = measured({"qwen36-27b": dict(LLAMA_RESULT, load=LOAD, measured=True),
                    "qwen-fp8": dict(VLLM_RESULT, load=LOAD, measured=True)})
    assert br.gate(rep, names=["qwen36-27b"]) == {"failed": False, "messages": []}
    assert br.gate(rep, names=["qwen-fp8"])["failed"] is True


# --- an unchanged instance whose unit does not serve is named, not passed over ---------------------------

def show(*units, rc=0):
    """plan.yml's one `systemctl show --property=Id,... -- UNIT...` result and its targets, from (name, unit,
    properties) triples: a block per unit, empty lines between."""
    stdout = "\n".join("Id=%s\n%s" % (unit, text) for _, unit, text in units)
    return {"rc": rc, "stdout": stdout}, [{"name": name, "unit": unit} for name, unit, _ in units]


# What systemd 252 (Debian 12) shows once the start limit stopped a crash loop (molecule/faults b): the last
# run's result, the restarts counted; "Start request repeated too quickly" is in the journal.
CRASH_LOOP = "LoadState=loaded\nActiveState=failed\nSubState=failed\nResult=exit-code\nNRestarts=5\n"
RUNNING = "LoadState=loaded\nActiveState=active\nSubState=running\nResult=success\nNRestarts=0\n"


def test_an_unchanged_instance_in_a_crash_loop_stopped_by_the_start_limit_is_named_and_fails_the_gate():
    """The fault of molecule/faults b: the unit ended in failed/start-limit-hit; before, validate said
    'not measured, unchanged since its measurement' and passed."""
    last = reread(measured({"qwen36-27b": dict(LLAMA_RESULT, load=LOAD, measured=True),
                            "qwen-fp8": dict(VLLM_RESULT, errors=0, failed=False, load=LOAD,
                                             measured=True)}))
    units = br.unit_states(*show(("qwen36-27b", "llama-server-qwen36-27b.service", CRASH_LOOP),
                                 ("qwen-fp8", "vllm-qwen-fp8.service", RUNNING)))
    assert units["qwen-fp8"]["ActiveState"] == "active" and units["qwen36-27b"]["NRestarts"] == "5"
    items = plan(fingerprinted(), last, units=units)
    llama = next(i for i in items if i["name"] == "qwen36-27b")
    fp8 = next(i for i in items if i["name"] == "qwen-fp8")
    assert llama["measure"] is False and "start-limit-hit" not in (fp8["down"] or "")
    assert (fp8["measure"], fp8["down"]) == (False, None)
    messages = br.down_messages(items)
    assert messages == [
        "instance qwen36-27b: its unit llama-server-qwen36-27b.service is failed: systemd's start limit "
        "stopped its restart loop after 5 restarts (last result exit-code): the server keeps failing at "
        "start. `systemctl status "
        "llama-server-qwen36-27b.service` and `journalctl -u llama-server-qwen36-27b.service` say why; fix "
        "the cause, then `systemctl reset-failed llama-server-qwen36-27b.service` and run the serve stage "
        "again"]
    assert br.plan_messages([llama])[0].startswith("qwen36-27b: not measured, NOT SERVING: its unit ")
    # without systemd's view (as before): unchanged, nothing named
    assert br.down_messages(plan(fingerprinted(), last)) == []


@pytest.mark.parametrize("stdout, expected", [
    (RUNNING, None),
    ("LoadState=loaded\nActiveState=activating\nSubState=auto-restart\nResult=signal\nNRestarts=1\n", None),
    ("LoadState=loaded\nActiveState=inactive\nSubState=dead\nResult=success\nNRestarts=0\n",
     "is inactive (dead): it was stopped and not started again"),
    ("LoadState=loaded\nActiveState=failed\nSubState=failed\nResult=exit-code\nNRestarts=0\n",
     "is failed: it ended with result exit-code"),
    # a start refused by the limit itself
    ("LoadState=loaded\nActiveState=failed\nSubState=failed\nResult=start-limit-hit\nNRestarts=0\n",
     "start limit stopped its restart loop after 0 restarts (last result start-limit-hit)"),
    ("LoadState=not-found\nActiveState=inactive\nSubState=dead\nResult=success\n", None),
    ("", None),
])
def test_which_unit_states_count_as_not_serving(stdout, expected):
    states = br.unit_states(*show(("x", "x.service", stdout)))
    down = br.unit_down(states.get("x"))
    if expected is None:
        assert down is None
    else:
        assert expected in down and down.startswith("its unit x.service ")


def test_unit_states_skip_failed_reads_and_targets_without_a_unit():
    assert br.unit_states(*show(("x", "x.service", CRASH_LOOP), rc=1)) == {}
    assert br.unit_states({"skipped": True}, [{"name": "x", "unit": "x.service"}]) == {}
    result, targets = show(("x", "x.service", CRASH_LOOP))
    assert br.unit_states(result, targets + [{"name": "y"}, {"name": "z", "unit": "z.service"}]) == {
        "x": dict(br.unit_states(result, targets)["x"])}
    assert br.unit_states(None, None) == {}
