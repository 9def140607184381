# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Filters that expose the validate stage's report and gate (plugins/plugin_utils/benchmark_report.py).

    {{ llmops_instances | llmops.serving.benchmark_targets(validate_instances) }}   -> llm_benchmark arguments
    {{ validate_instances | llmops.serving.benchmark_unknown_instances([llmops_instances of each host]) }}
    {{ slurped_text | llmops.serving.benchmark_last_report }}             -> the node's last report or {}
    {{ systemctl_show_result | llmops.serving.benchmark_unit_states(targets) }}  -> {instance: state}
    {{ targets | llmops.serving.benchmark_plan(llmops_instances, last=..., deployments=..., force=...,
                                               units=...) }}
    {{ plan | llmops.serving.benchmark_down }}                            -> the instances not serving
    {{ plan | llmops.serving.benchmark_plan_messages }}                   -> one line per instance
    {{ results_by_name | llmops.serving.benchmark_report(host=..., instances=llmops_instances, runs=...,
                                                        warmup_requests=..., timestamp=..., last=...) }}
    {{ report | llmops.serving.benchmark_markdown(chart_file='node1.svg') }}  -> the Markdown report
    {{ report | llmops.serving.benchmark_table }}                         -> one table, all instances
    {{ report | llmops.serving.benchmark_svg }}                           -> the SVG chart
    {{ report | llmops.serving.benchmark_json }}                          -> the JSON the node keeps
    {{ report | llmops.serving.benchmark_report_files(host, dir) }}      -> [{name, content}] to write
    {{ item.content | llmops.serving.benchmark_text }}                    -> the text, kept a text
    {{ report | llmops.serving.benchmark_html }}                          -> one HTML page, the chart inline
    {{ report | llmops.serving.benchmark_gate(min_decode_tps=45, max_ttft_s={'qwen': 2}) }}
                                                                          -> {failed, messages}
"""
from __future__ import absolute_import, division, print_function

from ansible.utils.native_jinja import NativeJinjaText
from ansible_collections.llmops.serving.plugins.plugin_utils import benchmark_report
from ansible_collections.llmops.serving.plugins.plugin_utils.serving_errors import filter_errors

__metaclass__ = type

_wrap = filter_errors("validate")


def benchmark_report_filter(results, host=None, instances=None, runs=None, warmup_requests=None,
                            timestamp=None, last=None):
    """Benchmark results by instance name -> the JSON report of one host (merged into `last`)."""
    return benchmark_report.build_report(host, instances, results, runs=runs, warmup_requests=warmup_requests,
                                         timestamp=timestamp, last=last)


def benchmark_plan(targets, instances, last=None, deployments=None, force=False, units=None):
    return benchmark_report.measure_plan(targets, instances, last=last, deployments=deployments,
                                         force=force, units=units)


def benchmark_unknown_instances(names, instances_per_host):
    return benchmark_report.unknown_instances(names, instances_per_host)


def benchmark_json(report):
    """The report's JSON text, kept a text: Ansible turns a template result that looks like JSON back into
    data, and the copy module would then write it compact, unlike the same report written before."""
    return NativeJinjaText(benchmark_report.report_json(report))


def benchmark_text(text):
    """A file's text kept a text when it goes through a variable into the copy module (see benchmark_json)."""
    return NativeJinjaText(text)


class FilterModule(object):
    """The validate stage: benchmark targets, reports (JSON, Markdown, SVG) and the gate."""

    def filters(self):
        return {
            "benchmark_targets": _wrap(benchmark_report.benchmark_targets),
            "benchmark_unknown_instances": _wrap(benchmark_unknown_instances),
            "benchmark_report": _wrap(benchmark_report_filter),
            "benchmark_last_report": _wrap(benchmark_report.parse_last_report),
            "benchmark_plan": _wrap(benchmark_plan),
            "benchmark_plan_messages": _wrap(benchmark_report.plan_messages),
            "benchmark_unit_states": _wrap(benchmark_report.unit_states),
            "benchmark_down": _wrap(benchmark_report.down_messages),
            "benchmark_markdown": _wrap(benchmark_report.markdown_report),
            "benchmark_table": _wrap(benchmark_report.markdown_table),
            "benchmark_svg": _wrap(benchmark_report.svg_chart),
            "benchmark_html": _wrap(benchmark_report.html_report),
            "benchmark_gate": _wrap(benchmark_report.gate),
            "benchmark_json": _wrap(benchmark_json),
            "benchmark_report_files": _wrap(benchmark_report.report_files),
            "benchmark_text": _wrap(benchmark_text),
        }
