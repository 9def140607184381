# -*- coding: utf-8 -*-
# Copyright: llmops.serving contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Filters that expose the validate stage's report and gate (plugins/plugin_utils/benchmark_report.py).

    {{ llmops_instances | llmops.serving.benchmark_targets(validate_instances) }}   -> llm_benchmark arguments
    {{ validate_instances | llmops.serving.benchmark_unknown_instances([llmops_instances of each host]) }}
    {{ results_by_name | llmops.serving.benchmark_report(host=..., instances=llmops_instances, runs=...,
                                                        warmup_requests=..., timestamp=...) }}
    {{ report | llmops.serving.benchmark_markdown(chart_file='node1.svg') }}  -> the Markdown report
    {{ report | llmops.serving.benchmark_table }}                         -> one table, all instances
    {{ report | llmops.serving.benchmark_svg }}                           -> the SVG chart
    {{ report | llmops.serving.benchmark_html }}                          -> one HTML page, the chart inline
    {{ report | llmops.serving.benchmark_gate(min_decode_tps=45, max_ttft_s={'qwen': 2}) }}
                                                                          -> {failed, messages}
"""
from __future__ import absolute_import, division, print_function

from ansible_collections.llmops.serving.plugins.plugin_utils import benchmark_report
from ansible_collections.llmops.serving.plugins.plugin_utils.serving_errors import filter_errors

__metaclass__ = type

_wrap = filter_errors("validate")


def benchmark_report_filter(results, host=None, instances=None, runs=None, warmup_requests=None,
                            timestamp=None):
    """Benchmark results by instance name -> the JSON report of one host."""
    return benchmark_report.build_report(host, instances, results, runs=runs, warmup_requests=warmup_requests,
                                         timestamp=timestamp)


def benchmark_unknown_instances(names, instances_per_host):
    return benchmark_report.unknown_instances(names, instances_per_host)


class FilterModule(object):
    """The validate stage: benchmark targets, reports (JSON, Markdown, SVG) and the gate."""

    def filters(self):
        return {
            "benchmark_targets": _wrap(benchmark_report.benchmark_targets),
            "benchmark_unknown_instances": _wrap(benchmark_unknown_instances),
            "benchmark_report": _wrap(benchmark_report_filter),
            "benchmark_markdown": _wrap(benchmark_report.markdown_report),
            "benchmark_table": _wrap(benchmark_report.markdown_table),
            "benchmark_svg": _wrap(benchmark_report.svg_chart),
            "benchmark_html": _wrap(benchmark_report.html_report),
            "benchmark_gate": _wrap(benchmark_report.gate),
        }
