# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The Grafana dashboards of role monitoring_server, as code: this module builds them, and writes them as
Grafana JSON into roles/monitoring_server/files/dashboards/ (which Grafana provisions from files).

    .venv/bin/python tools/gen_dashboards.py            # rewrite the JSON files
    .venv/bin/python tools/gen_dashboards.py --check    # exit 1 when a file differs (a unit test runs this)

Four dashboards: the fleet, one llama.cpp instance, one vLLM instance (each engine's panels are the figures
its /metrics has, so no panel waits for a metric its engine never sends), the GPUs. Every query reads the
labels the nodes' agents add (node, llm_instance, llm_engine: plugins/plugin_utils/monitoring.py) and the
recording rules of roles/monitoring_server/templates/rules/. tests/unit/monitoring checks that every metric a
panel names exists in the engine or collector that serves it, and runs every query against a real Prometheus.
"""

import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "roles", "monitoring_server", "files", "dashboards")
DATASOURCE = {"type": "prometheus", "uid": "llmops-prometheus"}
RATE = "$__rate_interval"
INSTANCE_SEL = 'node=~"$node", llm_instance=~"$instance"'
GPU_SEL = 'node=~"$node", gpu=~"$gpu"'


def target(expr, legend="", ref="A"):
    return {"datasource": DATASOURCE, "expr": expr, "legendFormat": legend, "refId": ref}


def panel(
    title,
    targets,
    kind="timeseries",
    unit="short",
    description="",
    width=12,
    height=8,
    minimum=None,
    maximum=None,
):
    defaults = {"unit": unit}
    if minimum is not None:
        defaults["min"] = minimum
    if maximum is not None:
        defaults["max"] = maximum
    refs = "ABCDEFGH"
    return {
        "type": kind,
        "title": title,
        "description": description,
        "datasource": DATASOURCE,
        "targets": [dict(t, refId=refs[i]) for i, t in enumerate(targets)],
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": {"legend": {"displayMode": "table", "placement": "bottom", "calcs": ["lastNotNull"]}}
        if kind == "timeseries"
        else {},
        "gridPos": {"w": width, "h": height},
    }


def text_panel(title, content, width=24, height=3):
    return {
        "type": "text",
        "title": title,
        "options": {"mode": "markdown", "content": content},
        "gridPos": {"w": width, "h": height},
    }


def variable(name, label, query, multi=True):
    return {
        "type": "query",
        "name": name,
        "label": label,
        "datasource": DATASOURCE,
        "query": {"query": query, "refId": "%s-variable" % name},
        "definition": query,
        "refresh": 2,
        "includeAll": multi,
        "multi": multi,
        "sort": 1,
        "current": {},
    }


def dashboard(uid, title, description, variables, panels):
    x = y = row_h = 0
    for number, item in enumerate(panels, 1):
        item["id"] = number
        grid = item["gridPos"]
        if x + grid["w"] > 24:
            x, y, row_h = 0, y + row_h, 0
        grid["x"], grid["y"] = x, y
        x, row_h = x + grid["w"], max(row_h, grid["h"])
    return {
        "uid": uid,
        "title": title,
        "description": description,
        "tags": ["llmops"],
        "editable": True,
        "schemaVersion": 39,
        "version": 1,
        "timezone": "browser",
        "refresh": "30s",
        "graphTooltip": 1,
        "time": {"from": "now-6h", "to": "now"},
        "templating": {"list": variables},
        "links": [{"type": "dashboards", "tags": ["llmops"], "asDropdown": True, "title": "llmops"}],
        "panels": panels,
    }


NODE_VAR = variable("node", "node", 'label_values(up{job="llmops_node"}, node)')


def fleet():
    sel = 'node=~"$node"'
    return dashboard(
        "llmops-fleet",
        "llmops: fleet",
        "Every instance and GPU of the nodes, one line each.",
        [NODE_VAR],
        [
            panel(
                "Instances answering",
                [target('sum(up{job="llmops_instance", %s})' % sel)],
                "stat",
                width=6,
                height=4,
                description="Instances whose /metrics the node's agent reads.",
            ),
            panel(
                "Instances not answering",
                [target('sum(1 - up{job="llmops_instance", %s})' % sel)],
                "stat",
                width=6,
                height=4,
                description="LlmopsInstanceDown fires when one stays so.",
            ),
            panel(
                "GPUs in a bad state",
                [target("sum(1 - llmops_gpu_healthy{%s})" % sel)],
                "stat",
                width=6,
                height=4,
                description="Lost, needing a reset or in error (nvidia-smi).",
            ),
            panel(
                "Models filesystem free",
                [target("llmops:models_filesystem:avail:ratio{%s}" % sel, "{{node}} {{mountpoint}}")],
                "stat",
                "percentunit",
                width=6,
                height=4,
            ),
            panel(
                "Tokens generated /s",
                [target("llmops:instance:generation_tokens:rate{%s}" % sel, "{{node}}/{{llm_instance}}")],
                unit="short",
                description="All streams of an instance together.",
            ),
            panel(
                "Decode tok/s per stream",
                [
                    target(
                        "llmops:instance:decode_tokens_per_second:per_stream{%s}" % sel,
                        "{{node}}/{{llm_instance}}",
                    )
                ],
                description="What validate_min_decode_tps gates: the speed one request sees.",
            ),
            panel(
                "Requests",
                [
                    target("llmops:instance:requests_running{%s}" % sel, "running {{node}}/{{llm_instance}}"),
                    target("llmops:instance:requests_waiting{%s}" % sel, "waiting {{node}}/{{llm_instance}}"),
                ],
                description="Running and waiting (vLLM) or deferred (llama.cpp) requests.",
            ),
            panel(
                "Inter-token latency (mean)",
                [
                    target(
                        "llmops:instance:inter_token_latency_seconds:mean{%s}" % sel,
                        "{{node}}/{{llm_instance}}",
                    )
                ],
                unit="s",
            ),
            panel(
                "Speculative decoding acceptance",
                [target("llmops:instance:spec_acceptance:ratio{%s}" % sel, "{{node}}/{{llm_instance}}")],
                unit="percentunit",
                minimum=0,
                maximum=1,
                description="Accepted / drafted tokens (MTP or draft model).",
            ),
            panel(
                "GPU memory used",
                [target("llmops:gpu:memory_used:ratio{%s}" % sel, "{{node}} GPU {{gpu}}")],
                unit="percentunit",
                minimum=0,
                maximum=1,
            ),
            panel(
                "GPU utilization",
                [target("llmops_gpu_utilization_ratio{%s}" % sel, "{{node}} GPU {{gpu}}")],
                unit="percentunit",
                minimum=0,
                maximum=1,
            ),
            panel(
                "Instances",
                [target('up{job="llmops_instance", %s}' % sel, "{{node}}/{{llm_instance}} ({{llm_engine}})")],
                "state-timeline",
                description="1: the agent reads its /metrics.",
            ),
        ],
    )


def instance_var(engine):
    return variable(
        "instance",
        "instance",
        'label_values(up{job="llmops_instance", llm_engine="%s", node=~"$node"}, llm_instance)' % engine,
        multi=False,
    )


def rate(metric, sel=INSTANCE_SEL):
    return "rate(%s{%s}[%s])" % (metric, sel, RATE)


def quantiles(metric, points=(0.5, 0.95, 0.99)):
    return [
        target(
            "histogram_quantile(%s, sum by (le) (%s))" % (q, rate(metric + "_bucket")), "p%d" % round(q * 100)
        )
        for q in points
    ]


def vllm_instance():
    sel = INSTANCE_SEL
    return dashboard(
        "llmops-instance-vllm",
        "llmops: vLLM instance",
        "One vLLM instance: latency, throughput, queue, KV cache, speculative decoding.",
        [NODE_VAR, instance_var("vllm")],
        [
            panel("Answering", [target('up{job="llmops_instance", %s}' % sel)], "stat", width=6, height=4),
            panel(
                "Running requests",
                [target("sum(vllm:num_requests_running{%s})" % sel)],
                "stat",
                width=6,
                height=4,
            ),
            panel(
                "Waiting requests",
                [target("sum(vllm:num_requests_waiting{%s})" % sel)],
                "stat",
                width=6,
                height=4,
            ),
            panel(
                "KV cache in use",
                [target("max(vllm:kv_cache_usage_perc{%s})" % sel)],
                "gauge",
                "percentunit",
                width=6,
                height=4,
                minimum=0,
                maximum=1,
            ),
            panel(
                "Time to first token",
                quantiles("vllm:time_to_first_token_seconds"),
                unit="s",
                description="validate_max_ttft_s gates p95 (LlmopsTtftAboveGate).",
            ),
            panel("Inter-token latency", quantiles("vllm:inter_token_latency_seconds"), unit="s"),
            panel(
                "Tokens /s",
                [
                    target("sum(%s)" % rate("vllm:generation_tokens_total"), "generated"),
                    target("sum(%s)" % rate("vllm:prompt_tokens_total"), "prompt"),
                ],
            ),
            panel(
                "Decode tok/s per stream",
                [target("llmops:instance:decode_tokens_per_second:per_stream{%s}" % sel, "per stream")],
                description="1 / mean inter-token latency: what validate_min_decode_tps gates.",
            ),
            panel(
                "Queue",
                [
                    target("sum(vllm:num_requests_running{%s})" % sel, "running"),
                    target("sum(vllm:num_requests_waiting{%s})" % sel, "waiting"),
                ],
            ),
            panel(
                "KV cache in use",
                [target("max(vllm:kv_cache_usage_perc{%s})" % sel, "KV cache")],
                unit="percentunit",
                minimum=0,
                maximum=1,
            ),
            panel(
                "Speculative decoding acceptance",
                [
                    target(
                        "sum(%s) / sum(%s)"
                        % (
                            rate("vllm:spec_decode_num_accepted_tokens_total"),
                            rate("vllm:spec_decode_num_draft_tokens_total"),
                        ),
                        "all positions",
                    ),
                    target(
                        "sum by (position) (%s) / ignoring (position) group_left sum(%s)"
                        % (
                            rate("vllm:spec_decode_num_accepted_tokens_per_pos_total"),
                            rate("vllm:spec_decode_num_drafts_total"),
                        ),
                        "position {{position}}",
                    ),
                ],
                unit="percentunit",
                minimum=0,
                maximum=1,
                description="Accepted / drafted tokens, and per draft position the share of drafts accepted.",
            ),
            panel(
                "Requests finished /s",
                [
                    target(
                        "sum by (finished_reason) (%s)" % rate("vllm:request_success_total"),
                        "{{finished_reason}}",
                    )
                ],
            ),
            panel(
                "End-to-end request latency",
                quantiles("vllm:e2e_request_latency_seconds", (0.5, 0.95)),
                unit="s",
            ),
            panel("Queue time", quantiles("vllm:request_queue_time_seconds", (0.5, 0.95)), unit="s"),
            panel(
                "Preemptions /s",
                [target("sum(%s)" % rate("vllm:num_preemptions_total"), "preemptions")],
                description="Requests pushed out of the KV cache (many: the cache is too small).",
            ),
            panel(
                "Prefix cache hit rate",
                [
                    target(
                        "sum(%s) / sum(%s)"
                        % (rate("vllm:prefix_cache_hits_total"), rate("vllm:prefix_cache_queries_total")),
                        "hits",
                    )
                ],
                unit="percentunit",
                minimum=0,
                maximum=1,
            ),
        ],
    )


def llama_instance():
    sel = INSTANCE_SEL
    return dashboard(
        "llmops-instance-llamacpp",
        "llmops: llama.cpp instance",
        "One llama-server instance: throughput, slots, context, speculative decoding.",
        [NODE_VAR, instance_var("llama.cpp")],
        [
            panel("Answering", [target('up{job="llmops_instance", %s}' % sel)], "stat", width=6, height=4),
            panel(
                "Slots busy",
                [
                    target("sum(llamacpp:requests_processing{%s})" % sel, "busy"),
                    target("sum(llmops_instance_slots{%s})" % sel, "slots"),
                ],
                "stat",
                width=6,
                height=4,
                description="Slots processing a request, of --parallel.",
            ),
            panel(
                "Deferred requests",
                [target("sum(llamacpp:requests_deferred{%s})" % sel)],
                "stat",
                width=6,
                height=4,
                description="Requests waiting for a free slot.",
            ),
            panel(
                "Longest sequence / context",
                [
                    target(
                        "max(llamacpp:n_tokens_max{%s}) / max(llmops_instance_context_tokens{%s})"
                        % (sel, sel)
                    )
                ],
                "gauge",
                "percentunit",
                width=6,
                height=4,
                minimum=0,
                maximum=1,
                description="The longest prompt + generation seen, of ctx_size: how full the KV cache got.",
            ),
            text_panel(
                "Time to first token",
                "llama-server's `/metrics` has no per-request latency (no TTFT "
                "histogram): the validate stage measures TTFT (its report); prompt throughput below shows "
                "how fast prompts are read.",
            ),
            panel(
                "Tokens /s",
                [
                    target("sum(%s)" % rate("llamacpp:tokens_predicted_total"), "generated"),
                    target("sum(%s)" % rate("llamacpp:prompt_tokens_total"), "prompt"),
                    target("sum(%s)" % rate("llamacpp:prompt_tokens_cached_total"), "prompt from cache"),
                ],
                description="Counted when a request ends.",
            ),
            panel(
                "Decode tok/s per stream",
                [
                    target("llmops:instance:decode_tokens_per_second:per_stream{%s}" % sel, "per stream"),
                    target(
                        "max(llamacpp:predicted_tokens_seconds{%s})" % sel, "server average since last scrape"
                    ),
                ],
                description="What validate_min_decode_tps gates.",
            ),
            panel(
                "Inter-token latency (mean)",
                [target("llmops:instance:inter_token_latency_seconds:mean{%s}" % sel, "mean")],
                unit="s",
            ),
            panel(
                "Prompt throughput",
                [target("max(llamacpp:prompt_tokens_seconds{%s})" % sel, "prompt tok/s")],
                description="Prompt tokens read per second, averaged between two scrapes.",
            ),
            panel(
                "Slots",
                [
                    target("sum(llamacpp:requests_processing{%s})" % sel, "processing"),
                    target("sum(llamacpp:requests_deferred{%s})" % sel, "deferred"),
                    target("sum(llmops_instance_slots{%s})" % sel, "slots (--parallel)"),
                ],
            ),
            panel(
                "Busy slots per decode",
                [target("max(llamacpp:n_busy_slots_per_decode{%s})" % sel, "slots")],
                description="How many slots share each llama_decode() call (continuous batching).",
            ),
            panel(
                "Speculative decoding acceptance",
                [
                    target(
                        "sum(%s) / sum(%s)"
                        % (
                            rate("llamacpp:spec_decode_num_accepted_tokens_total"),
                            rate("llamacpp:spec_decode_num_draft_tokens_total"),
                        ),
                        "all positions",
                    ),
                    target(
                        "sum by (position) (%s) / ignoring (position) group_left sum(%s)"
                        % (
                            rate("llamacpp:spec_decode_num_accepted_tokens_per_pos_total"),
                            rate("llamacpp:spec_decode_num_drafts_total"),
                        ),
                        "position {{position}}",
                    ),
                ],
                unit="percentunit",
                minimum=0,
                maximum=1,
                description="MTP or draft model: accepted / drafted tokens, and per draft position.",
            ),
            panel(
                "Prompt tokens from the cache",
                [
                    target(
                        "sum(%s) / (sum(%s) + sum(%s))"
                        % (
                            rate("llamacpp:prompt_tokens_cached_total"),
                            rate("llamacpp:prompt_tokens_total"),
                            rate("llamacpp:prompt_tokens_cached_total"),
                        ),
                        "reused",
                    )
                ],
                unit="percentunit",
                minimum=0,
                maximum=1,
            ),
        ],
    )


def gpus():
    sel = GPU_SEL
    legend = "{{node}} GPU {{gpu}}"
    return dashboard(
        "llmops-gpus",
        "llmops: GPUs",
        "nvidia-smi and the kernel's XID errors through role monitoring's collector.",
        [NODE_VAR, variable("gpu", "GPU", 'label_values(llmops_gpu_info{node=~"$node"}, gpu)')],
        [
            panel(
                "Memory used",
                [
                    target("llmops_gpu_memory_used_bytes{%s}" % sel, "used " + legend),
                    target("llmops_gpu_memory_total_bytes{%s}" % sel, "total " + legend),
                ],
                unit="bytes",
            ),
            panel(
                "Utilization",
                [
                    target("llmops_gpu_utilization_ratio{%s}" % sel, "SM " + legend),
                    target("llmops_gpu_memory_utilization_ratio{%s}" % sel, "memory " + legend),
                ],
                unit="percentunit",
                minimum=0,
                maximum=1,
            ),
            panel(
                "Temperature",
                [
                    target("llmops_gpu_temperature_celsius{%s}" % sel, "core " + legend),
                    target("llmops_gpu_memory_temperature_celsius{%s}" % sel, "HBM " + legend),
                ],
                unit="celsius",
            ),
            panel(
                "Power",
                [
                    target("llmops_gpu_power_draw_watts{%s}" % sel, "draw " + legend),
                    target("llmops_gpu_power_limit_watts{%s}" % sel, "limit " + legend),
                ],
                unit="watt",
            ),
            panel(
                "Clocks",
                [
                    target("llmops_gpu_sm_clock_hertz{%s}" % sel, "SM " + legend),
                    target("llmops_gpu_sm_clock_max_hertz{%s}" % sel, "SM max " + legend),
                    target("llmops_gpu_memory_clock_hertz{%s}" % sel, "memory " + legend),
                ],
                unit="hertz",
            ),
            panel(
                "Throttle reasons",
                [target("llmops_gpu_throttled{%s}" % sel, legend + " {{reason}}")],
                "state-timeline",
                description="1 while the GPU holds its clocks down for that reason.",
            ),
            panel(
                "ECC errors",
                [target("llmops_gpu_ecc_errors_total{%s}" % sel, legend + " {{type}} {{scope}}")],
                description="Uncorrected volatile errors fire LlmopsGpuEccUncorrected.",
            ),
            panel(
                "Rows waiting to be remapped",
                [target("llmops_gpu_remapped_rows_pending{%s}" % sel, legend)],
                description="1: the GPU needs a reset (Ampere and later).",
            ),
            panel(
                "XID errors",
                [target("llmops_gpu_xid_errors_total{%s}" % sel, legend + " XID {{xid}}")],
                description="From the kernel log (NVRM: Xid), counted by the collector.",
            ),
            panel(
                "Health", [target("llmops_gpu_healthy{%s}" % sel, legend + " {{state}}")], "state-timeline"
            ),
            panel(
                "Performance state",
                [target("llmops_gpu_performance_state{%s}" % sel, legend)],
                description="0 = P0, the fastest.",
            ),
            panel(
                "Collector",
                [
                    target('llmops_gpu_collector_success{node=~"$node"}', "{{node}} success"),
                    target(
                        'time() - llmops_gpu_collector_last_run_timestamp_seconds{node=~"$node"}',
                        "{{node}} seconds since the last run",
                    ),
                ],
            ),
        ],
    )


DASHBOARDS = {
    "llmops-fleet.json": fleet,
    "llmops-instance-llamacpp.json": llama_instance,
    "llmops-instance-vllm.json": vllm_instance,
    "llmops-gpus.json": gpus,
}


def render():
    return {name: json.dumps(build(), indent=2) + "\n" for name, build in sorted(DASHBOARDS.items())}


def main(argv):
    stale = []
    for name, text in render().items():
        path = os.path.join(OUT, name)
        current = open(path).read() if os.path.exists(path) else None
        if current != text:
            stale.append(path)
            if "--check" not in argv:
                os.makedirs(OUT, exist_ok=True)
                with open(path, "w") as handle:
                    handle.write(text)
    if stale and "--check" in argv:
        sys.stderr.write("stale: %s (run tools/gen_dashboards.py)\n" % ", ".join(stale))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
