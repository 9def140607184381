# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The validate stage's decisions, on the controller: what to benchmark, the report, its renderings, the gate.

    benchmark_targets(llmops_instances, names)      -> [{name, url, engine, model, api_key_file, ...}]
    parse_last_report(text)                         -> the last report recorded on the node, or {}
    measure_plan(targets, llmops_instances, last, deployments=, force=) -> [{name, measure, reason, ...}]
    plan_messages(plan)                             -> what validate does with each instance, and why
    build_report(host, llmops_instances, results, last=...) -> the JSON report (one host)
    markdown_report(report) / markdown_table(report) / svg_chart(report) / html_report(report)
                                                    -> text
    report_json(report) / report_files(report, host, dir) -> the texts the node and the controller keep
    gate(report, min_decode_tps=..., max_ttft_s=..., fail_on_errors=True) -> {"failed", "messages"}

`results` maps an instance name to the result of the module llmops.serving.llm_benchmark (url, engine, model,
runs, summary, errors, load, measured; `msg` when the module itself failed or did not measure a busy server).

A measurement is kept until what it measured changes: each instance of the report carries the deployment
`fingerprint` it measured (llmops_instances[name].fingerprint, plugins/plugin_utils/rollout.py), when
(`measured_at`) and the load it saw first (`load`). measure_plan() measures an instance again only when its
deployment changed in this run (llmops_deployments[name].changed), its fingerprint differs from the one
measured, it was never measured (or the measurement failed), or validate_force asks; otherwise the last
measurement stands and the report is not rewritten. Plain Python (no plotting library): the chart
is hand-written SVG. Unit-tested by tests/unit/plugins/plugin_utils/test_benchmark_report.py.
"""
from __future__ import absolute_import, division, print_function

import io
import json
import math
import os
from xml.sax.saxutils import escape

from ansible_collections.llmops.serving.plugins.plugin_utils.serving_errors import ServingError, is_number

__metaclass__ = type

# What the report keeps of a module result (the rest is Ansible's bookkeeping: invocation, changed, ...).
RESULT_KEYS = ("url", "engine", "model", "calibration", "runs", "summary", "errors", "failed", "msg")
# What the report keeps of an llmops_instances entry beside the figures (never a key: the fact has none).
INSTANCE_KEYS = ("engine", "served_model_name", "model", "model_path", "model_sha256", "build_id", "url",
                 "host", "port", "gpus", "mode", "unit", "settings")
# What the plan compares to say what changed since the last measurement (the fingerprint covers more: the
# command line, the environment, the binary).
CHANGE_KEYS = ("engine", "mode", "build_id", "model_path", "model_sha256", "served_model_name", "gpus",
               "settings")
REPORT_VERSION = 2
# Line colours of the chart, one per instance (cycled): distinguishable, also in grey print.
COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf")


class BenchmarkReportError(ServingError):
    """A validate input the report or the gate cannot use (unknown instance, threshold not a number)."""


# --- what to benchmark -------------------------------------------------------------------------------------

def benchmark_targets(instances, names=None):
    """The llm_benchmark arguments for each instance of this host (all, or those in `names` present here).

    Key passing follows the engine: llama.cpp reads the key file, vLLM the VLLM_API_KEY of its env file."""
    instances = instances or {}
    wanted = sorted(instances) if not names else [n for n in names if n in instances]
    targets = []
    for name in wanted:
        entry = instances[name] or {}
        targets.append({
            "name": name,
            "url": entry.get("url"),
            "engine": entry.get("engine"),
            "model": entry.get("served_model_name") or entry.get("model") or name,
            "api_key_file": entry.get("key_file") or None,
            "env_file": (entry.get("env_file") or None) if entry.get("api_key_env") else None,
            "api_key_env": entry.get("api_key_env") or None,
            "unit": entry.get("unit") or None,
        })
    return targets


def unknown_instances(names, instances_per_host):
    """Names of `names` that no host of the play serves (a typo must not pass the gate silently)."""
    known = set()
    for instances in instances_per_host or ():
        known.update(instances or {})
    return [n for n in names or () if n not in known]


# --- what to measure: the last measurement and what changed since ------------------------------------------

def parse_last_report(text):
    """The report recorded on the node by the last validate run (its JSON text), or {} when there is none
    or it cannot be used (then every instance is measured again, which writes a good one). {} rather than
    None: a set_fact keeps it a dict."""
    if not text or not isinstance(text, str):
        return {}
    try:
        report = json.loads(text)
    except ValueError:
        return {}
    if not isinstance(report, dict) or not isinstance(report.get("instances"), dict):
        return {}
    return report


def _last_entry(last, name):
    entry = ((last or {}).get("instances") or {}).get(name)
    return entry if isinstance(entry, dict) else None


def _measurement_failed(entry):
    result = entry.get("result") or {}
    return bool(result.get("msg") and not result.get("runs")) or bool(result.get("errors")) \
        or not result.get("runs")


def _changed_keys(entry, current):
    return [key for key in CHANGE_KEYS if entry.get(key) != (current or {}).get(key)]


# --- is it serving at all: systemd's view of each instance's unit ------------------------------------------

# A unit in these states runs or is (re)starting: the benchmark (or the busy check) sees how it answers.
_UNIT_UP = ("active", "activating", "reloading", "deactivating")


def unit_states(result, targets=None):
    """{instance name: {property: value}} from plan.yml's one `systemctl show --property=Id,... -- UNIT...`
    call (`result`: its registered result; stdout: a block of Key=Value lines per unit, blocks apart by an
    empty line, each with its Id=) for the `targets` (the instances, each with its unit). A failed or
    skipped read gives {}: the benchmark then finds whether an instance answers."""
    result = result or {}
    if result.get("skipped") or result.get("rc", 0) != 0:
        return {}
    by_unit = {}
    for block in (result.get("stdout") or "").split("\n\n"):
        state = {}
        for line in block.splitlines():
            key, sep, value = line.partition("=")
            if sep and key:
                state[key] = value.strip()
        if state.get("Id"):
            by_unit[state.pop("Id")] = state
    states = {}
    for target in targets or ():
        unit = (target or {}).get("unit")
        if target.get("name") and unit and by_unit.get(unit):
            states[target["name"]] = dict(by_unit[unit], Unit=unit)
    return states


def unit_down(state):
    """Why an instance's unit does not serve (a sentence), or None when it runs or its state is unknown. A
    unit systemd does not know (an instance run outside systemd, as the role's tests run theirs) is left to
    the benchmark, which finds whether it answers."""
    if not state or state.get("ActiveState") in _UNIT_UP or not state.get("ActiveState") \
            or state.get("LoadState") == "not-found":
        return None
    unit = state.get("Unit") or "its unit"
    active, sub, result = state["ActiveState"], state.get("SubState") or "", state.get("Result") or ""
    restarts = state.get("NRestarts") or ""
    how = "%s (%s)" % (active, sub) if sub and sub != active else active
    # A start refused by the limit (a manual start) leaves start-limit-hit; the restart loop that reaches it
    # leaves the last run's own result (systemd 252: exit-code, "Start request repeated too quickly" in the
    # journal), with the restarts counted. The role's units restart on failure: failed after restarts means
    # systemd gave up.
    if result == "start-limit-hit" or (active == "failed" and restarts.isdigit() and int(restarts) > 0):
        why = ("systemd's start limit stopped its restart loop after %s restarts (last result %s): the "
               "server keeps failing at start" % (restarts or "several", result or "unknown"))
    elif result and result != "success":
        why = "it ended with result %s" % result
    else:
        why = "it was stopped and not started again"
    return ("its unit %s is %s: %s. `systemctl status %s` and `journalctl -u %s` say why; fix the cause, "
            "then `systemctl reset-failed %s` and run the serve stage again"
            % (unit, how, why, unit, unit, unit))


def measure_plan(targets, instances, last=None, deployments=None, force=False, units=None):
    """Per target (benchmark_targets' items, in order): {name, measure, reason, measured_at, summary, down}.

    An instance whose unit does not run (`units`: unit_states(), systemd's view) is not measured (nothing
    would answer) and is `down`, with why: down_messages() names it and the gate fails on it, whatever its
    last measurement says.

    measure is true when validate_force asks (`force`), when role serving changed the deployment in this
    run (`deployments`: llmops_deployments, {name: {changed}}), when the last report (`last`, see
    parse_last_report) has no measurement of it or a failed one, or when the instance's fingerprint
    (llmops_instances[name].fingerprint) differs from the one recorded beside its measurement."""
    plan = []
    for target in targets or ():
        name = target["name"]
        current = (instances or {}).get(name) or {}
        entry = _last_entry(last, name)
        measured = bool(entry and entry.get("result") and entry.get("measured_at"))
        item = {"name": name, "measure": True, "down": None,
                "measured_at": entry.get("measured_at") if measured else None,
                "summary": ((entry.get("result") or {}).get("summary") or {}) if measured else {}}
        down = unit_down((units or {}).get(name))
        if down:
            item.update(measure=False, down=down, reason="NOT SERVING: " + down)
        elif force:
            item["reason"] = "validate_force is set"
        elif ((deployments or {}).get(name) or {}).get("changed") in (True, "True", "true"):
            item["reason"] = "its deployment changed in this run"
        elif not measured:
            item["reason"] = "it has no earlier measurement"
        elif _measurement_failed(entry):
            item["reason"] = "its last measurement (%s) failed" % entry["measured_at"]
        elif not current.get("fingerprint"):
            item["reason"] = ("llmops_instances has no deployment fingerprint for it (run the serve stage "
                              "of this version first)")
        elif current["fingerprint"] != entry.get("fingerprint"):
            keys = _changed_keys(entry, current)
            item["reason"] = "its deployment differs from the one measured at %s (%s)" % (
                entry["measured_at"], ", ".join(keys) + " changed" if keys
                else "command line, environment or binary changed")
        else:
            item.update(measure=False, reason="unchanged since its measurement at %s" % entry["measured_at"])
        plan.append(item)
    return plan


def plan_messages(plan):
    """One line per instance: measured now and why, or the last measurement that stands and when."""
    lines = []
    for item in plan or ():
        if item.get("down"):
            lines.append("%s: not measured, %s." % (item["name"], item["reason"]))
            continue
        if item["measure"]:
            lines.append("%s: measuring, %s." % (item["name"], item["reason"]))
            continue
        summary = item.get("summary") or {}
        lines.append("%s: not measured, %s: decode %s tok/s, TTFT %s s (validate_force: true measures it "
                     "again)." % (item["name"], item["reason"], _fmt(summary.get("decode_tps")),
                                  _fmt(_ttft(summary.get("ttft_s")), 3)))
    return lines


def down_messages(plan):
    """One gate message per instance whose unit does not serve (measure_plan's `down`)."""
    return ["instance %s: %s" % (item["name"], item["down"]) for item in plan or () if item.get("down")]


# --- the report --------------------------------------------------------------------------------------------

def build_report(host, instances, results, runs=None, warmup_requests=None, timestamp=None, last=None):
    """The JSON report of one host: every instance's full benchmark result beside what it measured.

    `last` is the previous report (parse_last_report): the instances measured then and still served keep
    their measurement; those in `results` get the new one. A result that did not measure (a busy server)
    keeps the instance's last measurement and adds `skipped` (when, why, the load it saw)."""
    instances = instances or {}
    report_instances = {}
    for name, entry in sorted(((last or {}).get("instances") or {}).items()):
        if name in instances and isinstance(entry, dict):
            report_instances[name] = entry
    for name in sorted(results or {}):
        entry = instances.get(name) or {}
        result = results[name] or {}
        if result.get("measured") is False:
            described = dict(report_instances.get(name) or {key: entry.get(key) for key in INSTANCE_KEYS})
            described["skipped"] = {"at": timestamp, "reason": result.get("msg"), "load": result.get("load"),
                                    "fingerprint": entry.get("fingerprint")}
            report_instances[name] = described
            continue
        described = {key: entry.get(key) for key in INSTANCE_KEYS}
        described.update(fingerprint=entry.get("fingerprint"), measured_at=timestamp,
                         load=result.get("load"), skipped=None,
                         benchmark={"runs": list(runs or []), "warmup_requests": warmup_requests})
        described["result"] = {key: result[key] for key in RESULT_KEYS if key in result}
        report_instances[name] = described
    return {
        "version": REPORT_VERSION,
        "host": host,
        "timestamp": timestamp,
        "benchmark": {"runs": list(runs or []), "warmup_requests": warmup_requests},
        "instances": report_instances,
    }


def _mean(values):
    values = [v for v in values if is_number(v)]
    return sum(values) / len(values) if values else None


def _ttft(value, stat="mean"):
    """A TTFT figure: the module gives {mean, p50, p90, max} per run; a bare number is taken as it is."""
    if isinstance(value, dict):
        return value.get(stat)
    return value if is_number(value) else None


def _fmt(value, digits=1, suffix=""):
    if not is_number(value):
        return "-"
    return "%.*f%s" % (digits, value, suffix)


def _percent(value):
    return _fmt(value * 100.0 if is_number(value) else None, 1, "%")


TABLE_COLUMNS = ("run", "concurrency", "requests ok/sent", "prompt tok (target/mean)",
                 "output tok (max/mean)", "TTFT mean s", "TTFT p90 s", "prefill tok/s", "decode tok/s client",
                 "decode tok/s server", "decode tok/s total", "acceptance", "errors")


def _run_cells(index, run):
    errors = run.get("errors") or 0
    return [
        str(index),
        str(run.get("concurrency", "-")),
        "%s/%s" % (run.get("ok", "-"), run.get("requests", "-")),
        "%s/%s" % (run.get("prompt_tokens_target", "-"), _fmt(run.get("prompt_tokens"), 0)),
        "%s/%s" % (run.get("max_tokens", "-"), _fmt(run.get("completion_tokens"), 0)),
        _fmt(_ttft(run.get("ttft_s")), 3),
        _fmt(_ttft(run.get("ttft_s"), "p90"), 3),
        _fmt(run.get("prefill_tps")),
        _fmt(run.get("decode_tps")),
        _fmt(run.get("server_decode_tps")),
        _fmt(run.get("decode_tps_total")),
        _percent(run.get("draft_acceptance")),
        str(errors) if errors else "0",
    ]


def _table(header, rows):
    def line(cells):
        return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"
    return [line(header), "|" + "|".join("---" for _column in header) + "|"] + [line(r) for r in rows]


def _runs(described):
    return (described.get("result") or {}).get("runs") or []


def markdown_table(report, instance=None):
    """The runs as one Markdown table: of one instance, or of all (then with an instance column first)."""
    names = [instance] if instance else sorted(report.get("instances") or {})
    rows = []
    for name in names:
        for index, run in enumerate(_runs(report["instances"][name]), 1):
            cells = _run_cells(index, run)
            rows.append(cells if instance else [name] + cells)
    header = list(TABLE_COLUMNS) if instance else ["instance"] + list(TABLE_COLUMNS)
    return "\n".join(_table(header, rows))


def markdown_report(report, chart_file=None):
    """The Markdown report of one host: per instance what was measured, its table, its errors."""
    bench = report.get("benchmark") or {}
    lines = ["# Benchmark of %s" % report.get("host"), "",
             "Measured %s with llmops.serving.llm_benchmark: %s warm-up request(s), then the runs below "
             "(unique prompts, streamed). Client figures are measured by the benchmark, server figures are "
             "the engine's own timings or metrics." % (report.get("timestamp") or "-",
                                                       bench.get("warmup_requests", "-")), ""]
    if chart_file:
        lines += ["![decode tok/s and TTFT by concurrency](%s)" % chart_file, ""]
    for name in sorted(report.get("instances") or {}):
        described = report["instances"][name]
        result = described.get("result") or {}
        summary = result.get("summary") or {}
        lines += [
            "## Instance %s (%s)" % (name, described.get("engine") or "-"), "",
            "- model: %s (served as `%s`)" % (described.get("model") or "-",
                                              described.get("served_model_name")),
            "- model sha256: `%s`" % (described.get("model_sha256") or "-"),
            "- build id: `%s`" % (described.get("build_id") or "-"),
            "- url: %s, GPUs: %s" % (described.get("url") or result.get("url") or "-",
                                     ", ".join(str(g) for g in described.get("gpus") or []) or "-"),
            "- settings: `%s`" % json.dumps(described.get("settings") or {}, sort_keys=True),
            "- measured: %s (deployment `%s`), load before: %s" % (
                described.get("measured_at") or report.get("timestamp") or "-",
                described.get("fingerprint") or "-",
                (described.get("load") or {}).get("message") or "not read"),
            "- summary: decode %s tok/s, TTFT %s s, prefill %s tok/s, server decode %s tok/s, acceptance %s"
            % (_fmt(summary.get("decode_tps")), _fmt(_ttft(summary.get("ttft_s")), 3),
               _fmt(summary.get("prefill_tps")), _fmt(summary.get("server_decode_tps")),
               _percent(summary.get("draft_acceptance"))),
        ]
        skipped = described.get("skipped") or {}
        if skipped:
            lines.append("- **not measured** at %s (deployment `%s`): %s; the figures below are the last "
                         "measurement's" % (skipped.get("at") or "-", skipped.get("fingerprint") or "-",
                                            skipped.get("reason") or "-"))
        lines += [
            "",
            markdown_table(report, name),
            "",
        ]
        problems = instance_errors(described)
        if problems:
            lines += ["Errors:", ""] + ["- %s" % p for p in problems] + [""]
    return "\n".join(lines)


# --- the chart ---------------------------------------------------------------------------------------------

def series_by_concurrency(described):
    """{concurrency: (total decode tok/s, mean TTFT s)} of one instance, runs at one concurrency averaged."""
    grouped = {}
    for run in _runs(described):
        grouped.setdefault(run.get("concurrency"), []).append(run)
    return {c: (_mean(r.get("decode_tps_total") for r in runs), _mean(_ttft(r.get("ttft_s")) for r in runs))
            for c, runs in grouped.items() if is_number(c)}


def _nice_max(value):
    """The smallest 1/2/2.5/5 x 10^k at or above `value` (the top tick of an axis)."""
    if not is_number(value) or value <= 0:
        return 1.0
    magnitude = 10.0 ** math.floor(math.log10(value))
    steps = (1.0, 2.0, 2.5, 5.0, 10.0)
    return next(step * magnitude for step in steps if step * magnitude >= value * 0.999999)


def _panel(x0, title, unit, levels, lines, pick, width=400, height=260):
    """One panel: frame, axes with ticks, a polyline (and dots) per instance."""
    top, left, plot_w, plot_h = 40, x0 + 60, width - 80, height - 90
    values = [pick(point) for _name, series, _colour in lines for point in series.values()]
    y_max = _nice_max(max([v for v in values if is_number(v)] or [0]))
    slots = max(len(levels), 1)

    def x_at(level):
        return left + plot_w * (levels.index(level) + 0.5) / slots

    def y_at(value):
        return top + plot_h - plot_h * value / y_max

    out = ['<g class="panel">',
           '<text x="%g" y="24" font-size="14" text-anchor="middle" font-weight="bold">%s</text>'
           % (left + plot_w / 2, escape(title)),
           '<line x1="%g" y1="%g" x2="%g" y2="%g" stroke="#000"/>' % (left, top, left, top + plot_h),
           '<line x1="%g" y1="%g" x2="%g" y2="%g" stroke="#000"/>'
           % (left, top + plot_h, left + plot_w, top + plot_h)]
    for tick in range(6):
        value, y = y_max * tick / 5, y_at(y_max * tick / 5)
        out.append('<line x1="%g" y1="%g" x2="%g" y2="%g" stroke="#ddd"/>' % (left, y, left + plot_w, y))
        out.append('<text x="%g" y="%g" font-size="11" text-anchor="end">%s</text>'
                   % (left - 6, y + 4, _fmt(value, 0 if y_max >= 10 else 2)))
    for level in levels:
        out.append('<line x1="%g" y1="%g" x2="%g" y2="%g" stroke="#000"/>'
                   % (x_at(level), top + plot_h, x_at(level), top + plot_h + 5))
        out.append('<text x="%g" y="%g" font-size="11" text-anchor="middle">%s</text>'
                   % (x_at(level), top + plot_h + 18, level))
    out.append('<text x="%g" y="%g" font-size="12" text-anchor="middle">concurrency</text>'
               % (left + plot_w / 2, top + plot_h + 36))
    middle = top + plot_h / 2
    out.append('<text x="%g" y="%g" font-size="12" text-anchor="middle" transform="rotate(-90 %g %g)">'
               '%s</text>' % (x0 + 16, middle, x0 + 16, middle, escape(unit)))
    for name, series, colour in lines:
        measured = [c for c in levels if c in series and is_number(pick(series[c]))]
        points = [(x_at(c), y_at(pick(series[c]))) for c in measured]
        out.append('<polyline data-instance="%s" fill="none" stroke="%s" stroke-width="2" points="%s"/>'
                   % (escape(name, {'"': "&quot;"}), colour, " ".join("%.1f,%.1f" % p for p in points)))
        out.extend('<circle cx="%.1f" cy="%.1f" r="3" fill="%s"/>' % (x, y, colour) for x, y in points)
    out.append("</g>")
    return out


def svg_chart(report):
    """Two panels, decode tok/s (all streams) and mean TTFT by concurrency, one line per instance."""
    names = sorted(report.get("instances") or {})
    lines = [(name, series_by_concurrency(report["instances"][name]), COLOURS[i % len(COLOURS)])
             for i, name in enumerate(names)]
    levels = sorted({c for _name, series, _colour in lines for c in series})
    legend_h = 20 * len(names)
    height = 260 + 20 + legend_h
    out = ['<?xml version="1.0" encoding="UTF-8"?>',
           '<svg xmlns="http://www.w3.org/2000/svg" width="820" height="%d" viewBox="0 0 820 %d" '
           'font-family="sans-serif">' % (height, height),
           '<title>Benchmark of %s (%s)</title>' % (escape(str(report.get("host"))),
                                                    escape(str(report.get("timestamp")))),
           '<rect width="100%" height="100%" fill="#fff"/>']
    out += _panel(0, "decode tok/s (all streams)", "tok/s", levels, lines, lambda point: point[0])
    out += _panel(410, "time to first token (mean)", "seconds", levels, lines, lambda point: point[1])
    for i, (name, _series, colour) in enumerate(lines):
        y = 275 + 20 * i
        out.append('<line x1="70" y1="%d" x2="100" y2="%d" stroke="%s" stroke-width="2"/>' % (y, y, colour))
        out.append('<text x="108" y="%d" font-size="12">%s</text>'
                   % (y + 4, escape("%s (%s)" % (name, report["instances"][name].get("engine") or "-"))))
    out.append("</svg>")
    return "\n".join(out) + "\n"


# --- the files --------------------------------------------------------------------------------------------

def report_json(report):
    """The report as the node and the controller keep it: one rendering, so equal reports are equal files."""
    return json.dumps(report, indent=4, sort_keys=True, separators=(",", ": "), ensure_ascii=False) + "\n"


def report_files(report, host, directory=None):
    """[{name, content}]: <host>.json, .md (linking the chart), .svg and .html (one page, the chart inline) of
    the report; with `directory` (the controller's report directory), only those missing there or different,
    so that a run which measured nothing rewrites nothing (an equal file is left alone, its time too)."""
    renderings = (("json", report_json), ("md", lambda r: markdown_report(r, chart_file="%s.svg" % host)),
                  ("svg", svg_chart), ("html", html_report))
    if directory is None:
        return [{"name": "%s.%s" % (host, ext), "content": render(report)} for ext, render in renderings]
    json_text = report_json(report)
    same = _read(os.path.join(directory, "%s.json" % host)) == json_text
    files = []
    for ext, render in renderings:
        name = "%s.%s" % (host, ext)
        if same and os.path.exists(os.path.join(directory, name)):
            # the Markdown and the chart are renderings of that same JSON: not rendered again
            continue
        content = json_text if ext == "json" else render(report)
        if _read(os.path.join(directory, name)) != content:
            files.append({"name": name, "content": content})
    return files


def _read(path):
    try:
        with io.open(path, encoding="utf-8") as handle:
            return handle.read()
    except (IOError, OSError, UnicodeDecodeError):
        return None


# --- the gate ----------------------------------------------------------------------------------------------

def _run_label(index, run):
    return "run %d (prompt %s, max_tokens %s, concurrency %s)" % (
        index, run.get("prompt_tokens_target", "-"), run.get("max_tokens", "-"), run.get("concurrency", "-"))


def instance_errors(described):
    """What went wrong for one instance: the module's own failure, its errors, each run's failed requests."""
    result = described.get("result") or {}
    failed = result.get("msg") and not result.get("runs")
    problems = ["benchmark failed: %s" % result["msg"]] if failed else []
    # The module's `errors` is the count of failed requests (listed per run below); a list is kept as it is.
    problems += [str(e) for e in result["errors"]] if isinstance(result.get("errors"), list) else []
    for index, run in enumerate(result.get("runs") or [], 1):
        if run.get("errors"):
            messages = "; ".join(str(m) for m in run.get("error_messages") or []) or "no message"
            problems.append("%s: %s of %s requests failed: %s" % (
                _run_label(index, run), run["errors"], run.get("requests", "-"), messages))
    if not result.get("runs") and not problems:
        problems.append("no run completed")
    return problems


def _threshold(setting, name, variable):
    """The threshold of one instance: a number for all, or a dict name -> number; 0/empty/None = none."""
    value = setting.get(name) if isinstance(setting, dict) else setting
    if value in (None, "", 0):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        raise BenchmarkReportError("%s: %r (instance %s) is not a number" % (variable, value, name)) from None


# Public: role monitoring_server reads the same thresholds for its alert rules (plugin_utils/monitoring.py).
threshold = _threshold


def gate(report, min_decode_tps=None, max_ttft_s=None, fail_on_errors=True, names=None):
    """{"failed": bool, "messages": [...]}: one message per threshold missed or instance with errors.

    `names`: the instances this run selected (default all of the report). An instance whose current
    deployment was not measured (`skipped`: its server was busy) is not gated: its figures, if any, are an
    older deployment's; the next run measures it."""
    messages = []
    for name in sorted(report.get("instances") or {}):
        if names is not None and name not in names:
            continue
        described = report["instances"][name]
        if described.get("skipped"):
            continue
        summary = (described.get("result") or {}).get("summary") or {}
        minimum = _threshold(min_decode_tps, name, "validate_min_decode_tps")
        decode = summary.get("decode_tps")
        if minimum is not None and not (is_number(decode) and decode >= minimum):
            messages.append("instance %s: decode %s tok/s < validate_min_decode_tps %g"
                            % (name, _fmt(decode) if is_number(decode) else "not measured", minimum))
        maximum = _threshold(max_ttft_s, name, "validate_max_ttft_s")
        ttft = _ttft(summary.get("ttft_s"))
        if maximum is not None and not (is_number(ttft) and ttft <= maximum):
            messages.append("instance %s: TTFT %s s > validate_max_ttft_s %g"
                            % (name, _fmt(ttft, 3) if is_number(ttft) else "not measured", maximum))
        if fail_on_errors:
            messages += ["instance %s: %s" % (name, p) for p in instance_errors(described)]
    return {"failed": bool(messages), "messages": messages}


# --- the HTML page -----------------------------------------------------------------------------------------

HTML_STYLE = (
    "body{font-family:sans-serif;margin:2em auto;max-width:1100px;color:#222}"
    "table{border-collapse:collapse;margin:.5em 0 1.5em;font-size:13px}"
    "th,td{border:1px solid #ccc;padding:3px 6px;text-align:right}th{background:#f3f3f3}"
    "td:first-child,th:first-child{text-align:left}code{font-size:12px}.errors{color:#b00}"
)


def _html(value):
    import html

    return html.escape(str(value), quote=True)


def _html_table(header, rows):
    out = ["<table>", "<tr>" + "".join("<th>%s</th>" % _html(h) for h in header) + "</tr>"]
    out += ["<tr>" + "".join("<td>%s</td>" % _html(c) for c in row) + "</tr>" for row in rows]
    return out + ["</table>"]


def html_report(report):
    """The report of one host as one self-contained HTML page (the SVG chart inline, no external file or
    script): what markdown_report says, for a browser."""
    bench = report.get("benchmark") or {}
    host = report.get("host")
    chart = svg_chart(report).split("?>", 1)[-1].strip()      # inline: no XML declaration inside HTML
    out = ["<!DOCTYPE html>", '<html lang="en">', "<head>", '<meta charset="utf-8">',
           "<title>Benchmark of %s</title>" % _html(host), "<style>%s</style>" % HTML_STYLE, "</head>",
           "<body>", "<h1>Benchmark of %s</h1>" % _html(host),
           "<p>Measured %s with llmops.serving.llm_benchmark: %s warm-up request(s), then the runs below "
           "(unique prompts, streamed). Client figures are measured by the benchmark, server figures are the "
           "engine's own timings or metrics.</p>" % (_html(report.get("timestamp") or "-"),
                                                     _html(bench.get("warmup_requests", "-"))),
           '<figure id="chart">', chart, "<figcaption>decode tok/s (all streams) and mean time to first "
           "token, by concurrency</figcaption>", "</figure>"]
    for name in sorted(report.get("instances") or {}):
        described = report["instances"][name]
        summary = (described.get("result") or {}).get("summary") or {}
        model, served = _html(described.get("model") or "-"), _html(described.get("served_model_name"))
        settings = _html(json.dumps(described.get("settings") or {}, sort_keys=True))
        out += ["<h2>Instance %s (%s)</h2>" % (_html(name), _html(described.get("engine") or "-")), "<ul>",
                "<li>model: %s (served as <code>%s</code>)</li>" % (model, served),
                "<li>model sha256: <code>%s</code></li>" % _html(described.get("model_sha256") or "-"),
                "<li>build id: <code>%s</code></li>" % _html(described.get("build_id") or "-"),
                "<li>settings: <code>%s</code></li>" % settings,
                "<li>summary: decode %s tok/s, TTFT %s s, prefill %s tok/s, server decode %s tok/s, "
                "acceptance %s</li>" % tuple(_html(v) for v in (
                    _fmt(summary.get("decode_tps")), _fmt(_ttft(summary.get("ttft_s")), 3),
                    _fmt(summary.get("prefill_tps")), _fmt(summary.get("server_decode_tps")),
                    _percent(summary.get("draft_acceptance")))),
                "</ul>"]
        rows = [_run_cells(index, run) for index, run in enumerate(_runs(described), 1)]
        out += _html_table(TABLE_COLUMNS, rows)
        problems = instance_errors(described)
        if problems:
            out += ['<ul class="errors">'] + ["<li>%s</li>" % _html(p) for p in problems] + ["</ul>"]
    out += ["</body>", "</html>"]
    return "\n".join(out) + "\n"
