# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The monitoring roles' decisions (plugins/plugin_utils/monitoring.py): the node agent's scrape jobs, remote
write and key copies; the instances' textfile; the rules the inventory implies; the server's and
Alertmanager's configuration."""

import pytest
from ansible_collections.llmops.serving.plugins.plugin_utils import monitoring
from ansible_collections.llmops.serving.plugins.plugin_utils.monitoring import MonitoringError
from ansible_collections.llmops.serving.plugins.plugin_utils.serving_errors import ServingError

# llmops_instances of the L20 box as role serving publishes it (inventories/l20): llama.cpp on all addresses
# with a key, vLLM on loopback (its key guards /v1 only).
L20 = {
    "qwen36-27b": {
        "engine": "llama.cpp",
        "url": "http://127.0.0.1:8003",
        "served_model_name": "qwen36-27b",
        "key_file": "/etc/llama-server/qwen36-27b.key",
        "api_key_env": None,
        "host": "0.0.0.0",
        "settings": {"parallel": 2, "ctx_size": 262144},
        "model_sha256": "ab" * 32,
        "build_id": "b1",
    },
    "qwen36-27b-fp8": {
        "engine": "vllm",
        "url": "http://127.0.0.1:8000",
        "served_model_name": "qwen3.6-27b-fp8",
        "key_file": None,
        "api_key_env": "VLLM_API_KEY",
        "host": "127.0.0.1",
        "settings": {"max_model_len": 131072},
    },
}
OPTIONS = {
    "remote_write_url": "https://mon.lan:9090/api/v1/write",
    "remote_write_password_file": "/etc/llmops-monitoring/remote-write.password",
}


def jobs(plan):
    return {job["job_name"]: job for job in plan["config"]["scrape_configs"]}


def test_the_agent_scrapes_each_instance_on_loopback_with_its_key_file_never_the_key():
    plan = monitoring.agent_plan("l20-node-01", L20, OPTIONS)
    found = jobs(plan)
    assert sorted(found) == [
        "llmops_agent",
        "llmops_instance_qwen36-27b",
        "llmops_instance_qwen36-27b-fp8",
        "llmops_node",
    ]
    llama = found["llmops_instance_qwen36-27b"]
    assert llama["static_configs"] == [
        {
            "targets": ["127.0.0.1:8003"],
            "labels": {
                "node": "l20-node-01",
                "instance": "l20-node-01:qwen36-27b",
                "llm_instance": "qwen36-27b",
                "llm_engine": "llama.cpp",
                "served_model_name": "qwen36-27b",
            },
        }
    ]
    assert llama["authorization"] == {
        "type": "Bearer",
        "credentials_file": "/etc/llmops-monitoring/keys/qwen36-27b.key",
    }
    assert llama["relabel_configs"] == [{"target_label": "job", "replacement": "llmops_instance"}]
    assert plan["credentials"] == [
        {
            "instance": "qwen36-27b",
            "src": "/etc/llama-server/qwen36-27b.key",
            "dest": "/etc/llmops-monitoring/keys/qwen36-27b.key",
        }
    ]
    vllm = found["llmops_instance_qwen36-27b-fp8"]
    assert "authorization" not in vllm and vllm["static_configs"][0]["targets"] == ["127.0.0.1:8000"]
    assert found["llmops_node"]["static_configs"][0]["targets"] == ["127.0.0.1:9100"]
    remote = plan["config"]["remote_write"]
    assert remote == [
        {
            "url": "https://mon.lan:9090/api/v1/write",
            "basic_auth": {
                "username": "llmops-agent",
                "password_file": "/etc/llmops-monitoring/remote-write.password",
            },
        }
    ]
    assert plan["config"]["global"] == {
        "scrape_interval": "15s",
        "scrape_timeout": "10s",
        "external_labels": {"node": "l20-node-01"},
    }
    assert plan["warnings"] == []


def test_gateway_ray_and_dcgm_jobs_where_the_host_has_them():
    plan = monitoring.agent_plan(
        "gw",
        {},
        dict(
            OPTIONS,
            gateway_metrics_url="http://127.0.0.1:8405/metrics",
            ray_metrics="10.0.0.5:6383",
            dcgm="127.0.0.1:9400",
            remote_write_ca_file="/etc/ssl/mon-ca.pem",
            queue_config={"batch_send_deadline": "1s"},
        ),
    )
    found = jobs(plan)
    assert found["llmops_gateway"]["static_configs"][0]["targets"] == ["127.0.0.1:8405"]
    assert "metrics_path" not in found["llmops_gateway"]
    assert found["llmops_ray"]["static_configs"][0]["targets"] == ["10.0.0.5:6383"]
    assert found["llmops_dcgm"]["static_configs"][0]["labels"] == {"node": "gw", "instance": "gw"}
    assert plan["config"]["remote_write"][0]["tls_config"] == {"ca_file": "/etc/ssl/mon-ca.pem"}
    assert plan["config"]["remote_write"][0]["queue_config"] == {"batch_send_deadline": "1s"}


def test_an_instance_bound_to_the_node_address_is_scraped_there_with_a_warning():
    instances = {"q": dict(L20["qwen36-27b"], url="http://10.0.0.7:8003")}
    plan = monitoring.agent_plan("n", instances, OPTIONS)
    assert jobs(plan)["llmops_instance_q"]["static_configs"][0]["targets"] == ["10.0.0.7:8003"]
    assert plan["warnings"] == [
        "instance q binds 10.0.0.7:8003: the agent scrapes it there, from the node itself"
    ]


@pytest.mark.parametrize(
    "options, message",
    [
        ({"remote_write_password_file": "/p"}, "monitoring_remote_write_url is empty"),
        ({"remote_write_url": "mon:9090"}, "not an http(s) URL"),
        ({"remote_write_url": "http://mon:9090/api/v1/write"}, "needs the remote-write password"),
        (dict(OPTIONS, scrape_interval="15 seconds"), "not a Prometheus duration"),
    ],
)
def test_an_agent_that_could_not_write_is_refused(options, message):
    with pytest.raises(MonitoringError, match=message.replace("(", r"\(").replace(")", r"\)")):
        monitoring.agent_plan("n", {}, options)


def test_an_unknown_engine_is_refused():
    with pytest.raises(MonitoringError, match="engine 'sglang' has no metrics mapping"):
        monitoring.agent_plan("n", {"x": {"engine": "sglang", "url": "http://127.0.0.1:1"}}, OPTIONS)


def test_the_models_filesystem_is_the_longest_mount_holding_them():
    mounts = [{"mount": "/"}, {"mount": "/home"}, {"mount": "/home/models/other"}]
    assert monitoring.models_mountpoint(["/home/models/qwen"], mounts) == "/home"
    assert monitoring.models_mountpoint(["/srv/models"], mounts) == "/"
    assert monitoring.models_mountpoint([], mounts) is None


def test_the_instances_textfile_holds_slots_context_and_model_never_a_key():
    text = monitoring.node_textfile(L20, "/home/models", "/home")
    assert 'llmops_instance_slots{llm_instance="qwen36-27b",llm_engine="llama.cpp"} 2' in text
    assert 'llmops_instance_context_tokens{llm_instance="qwen36-27b-fp8",llm_engine="vllm"} 131072' in text
    assert 'llmops_models_filesystem{mountpoint="/home",path="/home/models"} 1' in text
    assert "model_sha256=\"%s\"" % ("ab" * 32) in text and ".key" not in text
    # vLLM without max_num_seqs: no slots line (vLLM decides), never a guess.
    assert 'llmops_instance_slots{llm_instance="qwen36-27b-fp8"' not in text


def test_inventory_nodes_from_published_facts_else_from_serving_instances():
    hostvars = {
        "a": {"llmops_instances": {"q": {"engine": "llama.cpp"}}},
        "b": {"serving_instances": [{"name": "v", "engine": "vllm"}, {"name": "l"}]},
        "c": {"serving_instances": [{"name": "x"}], "serving_default_engine": "vllm"},
    }
    assert monitoring.inventory_nodes(["a", "b", "c", "d"], hostvars) == {
        "a": {"q": {"engine": "llama.cpp"}},
        "b": {"v": {"engine": "vllm"}, "l": {"engine": "llama.cpp"}},
        "c": {"x": {"engine": "vllm"}},
        "d": {},
    }


def test_inventory_rules_expect_every_instance_and_carry_the_validate_gates():
    nodes = {
        "n1": {"q": {"engine": "llama.cpp"}, "v": {"engine": "vllm"}},
        "n2": {"q": {"engine": "llama.cpp"}},
    }
    rules = monitoring.inventory_rules(nodes, min_decode_tps={"q": 45, "v": 0}, max_ttft_s=2.5)
    expected, gates = rules["groups"]
    assert [(r["labels"]["node"], r["labels"]["llm_instance"]) for r in expected["rules"]] == [
        ("n1", "q"),
        ("n1", "v"),
        ("n2", "q"),
    ]
    assert [(r["record"], r["expr"], r["labels"]) for r in gates["rules"]] == [
        ("llmops:gate:min_decode_tps", "vector(45.0)", {"llm_instance": "q"}),
        ("llmops:gate:max_ttft_seconds", "vector(2.5)", {"llm_instance": "q"}),
        ("llmops:gate:max_ttft_seconds", "vector(2.5)", {"llm_instance": "v"}),
    ]
    assert [g["name"] for g in monitoring.inventory_rules(nodes)["groups"]] == ["llmops-inventory"]
    no_gates = monitoring.inventory_rules(nodes, min_decode_tps="0", max_ttft_s="")
    assert [g["name"] for g in no_gates["groups"]] == ["llmops-inventory"]
    with pytest.raises(ServingError, match="validate_max_ttft_s: 'fast'"):
        monitoring.inventory_rules(nodes, max_ttft_s="fast")


def test_the_server_reads_its_rules_and_sends_to_alertmanager():
    config = monitoring.server_config(
        {"rules_dir": "/etc/prometheus/llmops-rules", "self_password_file": "/p"}
    )
    assert config["rule_files"] == ["/etc/prometheus/llmops-rules/*.yml"]
    assert config["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"] == ["127.0.0.1:9093"]
    assert config["scrape_configs"][0]["basic_auth"] == {"username": "llmops-grafana", "password_file": "/p"}


def test_alertmanager_routes_to_the_receivers_and_inhibits_an_instance_that_is_down():
    receivers = [{"name": "ops", "webhook_configs": [{"url": "http://hook.lan/"}]}, {"name": "pager"}]
    config = monitoring.alertmanager_config(
        {"receivers": receivers, "default_receiver": "pager", "group_wait": "10s"}
    )
    assert config["route"]["receiver"] == "pager" and config["route"]["group_wait"] == "10s"
    assert config["route"]["group_by"] == ["alertname", "node", "llm_instance"]
    inhibit = config["inhibit_rules"][0]
    assert inhibit["source_matchers"] == ['alertname="LlmopsInstanceDown"']
    assert "LlmopsRequestsStalled" in inhibit["target_matchers"][0]
    for bad, message in (
        ({"receivers": []}, "receivers is empty"),
        ({"receivers": [{"webhook_configs": []}]}, "needs a name"),
        ({"receivers": receivers, "default_receiver": "x"}, "not one of the receivers"),
        ({"receivers": receivers, "group_wait": "soon"}, "not a Prometheus duration"),
    ):
        with pytest.raises(MonitoringError, match=message):
            monitoring.alertmanager_config(bad)
