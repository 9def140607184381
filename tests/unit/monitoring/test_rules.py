# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Role monitoring_server's recording and alerting rules, rendered as the role renders them (its defaults,
Ansible's Templar, the inventory's rules from plugins/plugin_utils/monitoring.py), checked by Debian's
promtool (`check rules`) and unit-tested with input series (`test rules`, the files in rule_tests/). Every
alert and every recording rule has a test that expects it."""
import glob
import os
import re
import shutil
import subprocess

import pytest
import yaml

from tests.fixtures.monitoring import stack

RULE_TESTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "rule_tests")
# The inventory the rule tests are written for: node-1 serves qwen (llama.cpp) and tiny-vllm (vLLM); qwen is
# gated at 20 tok/s per stream, every instance at a TTFT of 2 s (as validate_min_decode_tps / _max_ttft_s).
NODES = {"node-1": {"qwen": {"engine": "llama.cpp"}, "tiny-vllm": {"engine": "vllm"}}}
GATES = {"min_decode_tps": {"qwen": 20}, "max_ttft_s": 2}

pytestmark = pytest.mark.skipif(shutil.which("promtool") is None,
                                reason="promtool (Debian package prometheus) is not installed")


def default_settings():
    defaults = stack.role_defaults(stack.SERVER_ROLE)
    return {k: v for k, v in defaults.items() if k.startswith("monitoring_server_alert")
            or k == "monitoring_server_rate_window"}


@pytest.fixture(scope="module")
def rules_dir(tmp_path_factory):
    directory = str(tmp_path_factory.mktemp("rules"))
    stack.render_rules(directory, default_settings(), nodes=NODES, gates=GATES)
    return directory


def promtool(*args, cwd=None):
    proc = subprocess.run(["promtool"] + list(args), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          universal_newlines=True, cwd=cwd, timeout=120, check=False)
    return proc.returncode, proc.stdout


def test_the_rendered_rules_pass_promtool_check_with_its_lint(rules_dir):
    files = sorted(glob.glob(os.path.join(rules_dir, "*.yml")))
    assert [os.path.basename(f) for f in files] == ["llmops-alerts.yml", "llmops-inventory.yml",
                                                    "llmops-recording.yml"]
    rc, out = promtool("check", "rules", *files)
    assert rc == 0, out


@pytest.mark.parametrize("name", sorted(os.path.basename(p)
                                        for p in glob.glob(os.path.join(RULE_TESTS, "*.yml"))))
def test_promtool_unit_tests(rules_dir, name):
    shutil.copy(os.path.join(RULE_TESTS, name), os.path.join(rules_dir, name))
    rc, out = promtool("test", "rules", name, cwd=rules_dir)
    assert rc == 0, out


def rules_of(rules_dir):
    alerts, records = set(), set()
    for path in glob.glob(os.path.join(rules_dir, "*.yml")):
        with open(path) as handle:
            document = yaml.safe_load(handle) or {}
        for group in document.get("groups") or ():
            for rule in group["rules"]:
                if "alert" in rule:
                    alerts.add(rule["alert"])
                else:
                    records.add(rule["record"])
    return alerts, records


def test_every_alert_and_recording_rule_has_a_unit_test(rules_dir):
    alerts, records = rules_of(rules_dir)
    fired, evaluated = set(), set()
    for path in glob.glob(os.path.join(RULE_TESTS, "*.yml")):
        with open(path) as handle:
            document = yaml.safe_load(handle)
        for test in document["tests"]:
            for case in test.get("alert_rule_test") or ():
                if case.get("exp_alerts"):
                    fired.add(case["alertname"])
            for case in test.get("promql_expr_test") or ():
                evaluated.update(re.findall(r"llmops:[a-z0-9_:]+", case["expr"]))
    assert len(alerts) >= 12 and len(records) >= 14
    assert alerts - fired == set(), "alerts no test expects to fire"
    assert records - evaluated == set(), "recording rules no test evaluates"


def test_thresholds_and_durations_are_role_variables(tmp_path):
    """Another site's settings reach the rendered rules (and still pass promtool)."""
    settings = dict(default_settings(), monitoring_server_alert_gpu_temperature_c=77,
                    monitoring_server_alert_for=dict(default_settings()["monitoring_server_alert_for"],
                                                     instance_down="45s"),
                    monitoring_server_rate_window="2m")
    stack.render_rules(str(tmp_path), settings, nodes=NODES)
    text = (tmp_path / "llmops-alerts.yml").read_text()
    assert "llmops_gpu_temperature_celsius > 77" in text
    down = [r for g in yaml.safe_load(text)["groups"] for r in g["rules"]
            if r.get("alert") == "LlmopsInstanceDown"]
    assert down[0]["for"] == "45s"
    assert "[2m]" in (tmp_path / "llmops-recording.yml").read_text()
    assert not (tmp_path / "llmops-gates.yml").exists()
    rc, out = promtool("check", "rules", *sorted(glob.glob(str(tmp_path / "*.yml"))))
    assert rc == 0, out
