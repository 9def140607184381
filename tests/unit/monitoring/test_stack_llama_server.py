# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The monitoring stack of test_stack.py with the real llama-server the build made ($LLMOPS_LLAMA_SERVER,
built from the pinned llama.cpp by CI; skipped without it) beside the fake vLLM: the tiny qwen35 model with
its MTP draft, `--metrics` and an API key, scraped by the node's agent through a copy of the key file
(`authorization.credentials_file`).

- every query of all four dashboards and every recording rule returns at least one series;
- every llama-server metric a panel or rule names is in the built binary's own /metrics, and every metric the
  binary exposes is one the pinned source defines (the list test_dashboards.py checks against);
- /metrics refuses a request without the key: the agent's `up` of 1 is its key file at work.
"""

import os
import urllib.error
import urllib.request

import pytest

from tests.fixtures import llama_cpp_source
from tests.fixtures.monitoring import promql, stack
from tests.helpers import ROOT

pytestmark = [
    pytest.mark.needs_llama_server,
    pytest.mark.skipif(
        bool(stack.missing_binaries()), reason="not installed: %s" % ", ".join(stack.missing_binaries())
    ),
]


def llama_server():
    path = os.environ.get("LLMOPS_LLAMA_SERVER") or os.path.join(
        ROOT, ".cache", "ci-llama", "bin", "llama-server"
    )
    if not os.access(path, os.X_OK):
        pytest.skip(
            "no llama-server binary (set LLMOPS_LLAMA_SERVER; CI builds it in the llama_cpp scenario)"
        )
    return path


@pytest.fixture(scope="module")
def running(tmp_path_factory):
    pytest.importorskip("numpy")  # the tiny model generator (llama.cpp's gguf-py) needs it
    from tests.fixtures.gguf import make_tiny_model

    binary = llama_server()
    node = stack.Stack(
        tmp_path_factory.mktemp("stack"), llama_server=(binary, make_tiny_model.cached_tiny_model("qwen35"))
    )
    try:
        node.start_node()
        node.start_server()
        node.start_traffic()
        node.wait_for(
            'up{job="llmops_instance", llm_instance="tiny-llama"} == 1',
            what="the agent's scrape with the key",
        )
        # Counters move when a request ends; the per-position counter appears with the first accepted draft.
        node.wait_for('llmops:instance:generation_tokens:rate{llm_instance="tiny-llama"} > 0', timeout=120)
        node.wait_for("llamacpp:spec_decode_num_accepted_tokens_per_pos_total", timeout=120)
        # The fake vLLM beside it: its rates too (two samples with traffic between them; a loaded machine
        # scrapes later than the window assumes).
        node.wait_for('llmops:instance:generation_tokens:rate{llm_instance="tiny-vllm"} > 0', timeout=120)
        node.wait_for('llmops:instance:decode_tokens_per_second:per_stream{llm_instance="tiny-vllm"}',
                      timeout=120)
        yield node
    finally:
        node.close()


def test_every_panel_of_every_dashboard_and_every_recording_rule_has_data(running):
    empty = []
    for name, board in promql.dashboards().items():
        instance = "tiny-vllm" if "vllm" in name else "tiny-llama"
        empty += stack.empty_panel_queries(
            running, {name: board}, {"node": stack.NODE, "instance": instance, "gpu": ".*"}
        )
    assert empty == [], "queries without data:\n" + "\n".join("%s / %s: %s" % e for e in empty)
    assert (
        stack.empty_recording_rules(
            running, ("llmops-llamacpp", "llmops-vllm", "llmops-node", "llmops-inventory")
        )
        == []
    )


def scrape(running, key=None):
    url = running.instances["tiny-llama"]["url"] + "/metrics"
    headers = {"Authorization": "Bearer " + key} if key else {}
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10) as response:
        return response.read().decode()


def test_llama_server_metric_names_come_from_the_built_binary_and_the_pinned_source(running):
    text = scrape(running, key="llama-key-%d" % os.getpid())
    exposed = {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line and line[0] != "#"}
    used = set()
    for _name, board in promql.dashboards().items():
        for _title, target in promql.panel_targets(board):
            used |= promql.metric_names(target["expr"])
    for _rule, expr in promql.rule_expressions(running.rule_files):
        used |= promql.metric_names(expr)
    used = {m for m in used if m.startswith("llamacpp:")}
    assert len(used) >= 12
    assert used - exposed == set(), "named by a panel or rule, not in the binary's /metrics"
    assert exposed - set(llama_cpp_source.server_metrics()) == set(), (
        "in the binary, not in the pinned source"
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        scrape(running)
    assert refused.value.code == 401
