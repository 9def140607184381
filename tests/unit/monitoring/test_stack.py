# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The monitoring stack as real processes on loopback (tests/fixtures/monitoring/stack.py): Debian's
Prometheus in agent mode on the "node" scraping node_exporter with the GPU collector (through the fake
nvidia-smi) and the fake vLLM, remote-writing with basic auth to Debian's Prometheus on the "monitoring
host", which evaluates the role's rules and sends alerts to Debian's Alertmanager, which posts them to a
webhook in this process.

- every query of the fleet, vLLM instance and GPU dashboards, every variable query and every recording rule
  of the vLLM, node and inventory groups returns at least one series; promtool and amtool accept the
  configurations the collection renders;
- end to end: the vLLM instance is stopped, LlmopsInstanceDown reaches the webhook within a bound; it is
  started again and the alert resolves.

The llama.cpp half (its dashboard and rules against the real llama-server): test_stack_llama_server.py.
"""
import time

import pytest

from tests.fixtures.monitoring import promql, stack

pytestmark = pytest.mark.skipif(bool(stack.missing_binaries()),
                                reason="not installed: %s (Debian: prometheus, prometheus-alertmanager, "
                                       "prometheus-node-exporter)" % ", ".join(stack.missing_binaries()))
# Bound of each end-to-end step (stop -> notification, start -> resolved); a few seconds are typical.
ALERT_BOUND_S = 60


@pytest.fixture(scope="module")
def running(tmp_path_factory):
    node = stack.Stack(tmp_path_factory.mktemp("stack"))
    try:
        node.start_node()
        node.start_server()
        node.start_traffic()
        node.wait_for('up{job="llmops_instance", llm_instance="tiny-vllm"} == 1',
                      what="the agent's remote write")
        # Rates over the 10 s window need two samples with traffic between them.
        node.wait_for('llmops:instance:generation_tokens:rate{llm_instance="tiny-vllm"} > 0', timeout=60)
        yield node
    finally:
        node.close()


def test_every_panel_and_recording_rule_has_data(running):
    boards = {name: board for name, board in promql.dashboards().items() if "llamacpp" not in name}
    assert sorted(boards) == ["llmops-fleet.json", "llmops-gpus.json", "llmops-instance-vllm.json"]
    empty = stack.empty_panel_queries(running, boards, {"node": stack.NODE, "instance": "tiny-vllm",
                                                        "gpu": ".*"})
    assert empty == [], "queries without data:\n" + "\n".join("%s / %s: %s" % e for e in empty)
    empty = stack.empty_recording_rules(running, ("llmops-vllm", "llmops-node", "llmops-inventory",
                                                  "llmops-gates"))
    assert empty == []
    # The agent's labels reach the monitoring host; the vLLM key is never needed for /metrics (vLLM leaves it
    # open) and never in a label.
    (up,) = running.query('up{job="llmops_instance"}')
    assert up["metric"]["instance"] == "node-1:tiny-vllm" and up["metric"]["llm_engine"] == "vllm"
    assert "vllm-key" not in str(running.query('{job="llmops_instance"}'))


def test_the_rendered_configurations_pass_promtool_and_amtool(running):
    for command, code, output in stack.promtool_checks(running):
        assert code == 0, (command, output)


def test_a_stopped_instance_alerts_through_alertmanager_then_resolves(running):
    labels = {"node": stack.NODE, "llm_instance": "tiny-vllm", "severity": "critical"}
    stopped = time.monotonic()
    running.stop("vllm")
    waited, alert = stack.wait_notification(running, "LlmopsInstanceDown", "firing", ALERT_BOUND_S, **labels)
    print("LlmopsInstanceDown delivered %.1f s after the stop" % (time.monotonic() - stopped))
    assert alert["annotations"]["summary"] == "instance tiny-vllm on node-1 does not answer"
    assert waited < ALERT_BOUND_S
    started = time.monotonic()
    running.start_vllm()
    stack.wait_notification(running, "LlmopsInstanceDown", "resolved", ALERT_BOUND_S, **labels)
    print("resolved %.1f s after the start" % (time.monotonic() - started))
    # The instance answered the whole time it was reported: never "missing" (that is a dead node or agent).
    assert running.webhook.alerts("LlmopsInstanceMissing", "firing") == []
