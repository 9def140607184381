# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""plugins/plugin_utils/gateway_config.py: backends, servers, maps and refusals of the gateway."""
import hashlib

import pytest
from ansible.errors import AnsibleFilterError
from ansible_collections.llmops.serving.plugins.filter.gateway import FilterModule
from ansible_collections.llmops.serving.plugins.plugin_utils import gateway_config as gc

KEYS = [{"name": "alice", "key": "sk-alice-1"}, {"name": "bob", "key": "sk-bob-2", "rate_limit": 5}]


def inst(model, port, host="0.0.0.0", engine="vllm"):
    return {"served_model_name": model, "port": port, "host": host, "engine": engine,
            "url": "http://127.0.0.1:%d" % port}


def node(instances, address=None, keys=None):
    out = {"llmops_instances": instances, "serving_api_keys": keys or {}}
    if address:
        out["llmops_node_address"] = address
    return out


def hostvars():
    return {
        "n1": node({"qwen": inst("qwen", 8000), "llama": inst("llama", 8001, engine="llama.cpp")}, "10.0.0.1",
                   {"qwen": "kq", "llama": "kl"}),
        "n2": dict(node({"qwen": inst("qwen", 8000, host="10.0.1.2")}, keys={"qwen": "kq"}),
                   ansible_host="n2.lan"),
    }


def test_one_backend_per_model_with_servers_and_key():
    config = gc.build(["n1", "n2"], hostvars(), gateway_host="gw", api_keys=KEYS, rate_limit=60)
    assert [b["name"] for b in config["backends"]] == ["be_llama", "be_qwen"]
    assert config["default_backend"] == "be_llama"
    qwen = config["backends"][1]
    assert qwen["api_key"] == "kq"
    assert [(s["server"], s["address"], s["port"]) for s in qwen["servers"]] == [
        ("n1-qwen", "10.0.0.1", 8000), ("n2-qwen", "10.0.1.2", 8000)]
    assert config["models_map"] == "llama be_llama\nqwen be_qwen\n"


def test_maps_hold_digests_not_keys():
    config = gc.build(["n1"], hostvars(), api_keys=KEYS, rate_limit=60)
    digest = hashlib.sha256(b"sk-alice-1").hexdigest()
    assert "%s alice\n" % digest in config["keys_map"]
    assert "sk-alice-1" not in config["keys_map"] and "sk-bob-2" not in config["keys_map"]
    assert config["limits_map"] == "alice 60\nbob 5\n"


def test_node_address_falls_back_to_ansible_host_then_name():
    hv = {"a": node({"m": inst("m", 1)}), "b": dict(node({"m": inst("m", 2)}), ansible_host="b.lan")}
    servers = gc.build(["a", "b"], hv, api_keys=KEYS)["backends"][0]["servers"]
    assert [s["address"] for s in servers] == ["a", "b.lan"]


def test_loopback_instance_refused_from_another_node():
    hv = {"n1": node({"m": inst("m", 1, host="127.0.0.1")}, "10.0.0.1")}
    with pytest.raises(gc.GatewayError, match="binds 127.0.0.1 .loopback.: only a gateway on n1"):
        gc.build(["n1"], hv, gateway_host="gw", api_keys=KEYS)


def test_loopback_instance_fronted_from_its_own_node_or_loopback_network():
    hv = {"n1": node({"m": inst("m", 1, host="127.0.0.1")}, "10.0.0.1"),
          "n2": node({"m": inst("m", 2, host="127.0.0.1")}, "127.0.0.1")}
    servers = gc.build(["n1", "n2"], hv, gateway_host="n1", api_keys=KEYS)["backends"][0]["servers"]
    assert [s["address"] for s in servers] == ["127.0.0.1", "127.0.0.1"]


def test_different_keys_in_one_backend_refused():
    hv = hostvars()
    hv["n2"]["serving_api_keys"] = {"qwen": "other"}
    with pytest.raises(gc.GatewayError, match="n1/qwen and n2/qwen serve model qwen .* different API keys"):
        gc.build(["n1", "n2"], hv, api_keys=KEYS)


@pytest.mark.parametrize("keys,message", [
    ([], "gateway_api_keys is empty"),
    ([{"name": "a"}], r"gateway_api_keys\[0\] needs a name and a key"),
    ([{"name": "a b", "key": "k"}], "use 1-64 letters"),
    ([{"name": "a", "key": "k"}, {"name": "a", "key": "j"}], "name a is used twice"),
    ([{"name": "a", "key": "k"}, {"name": "b", "key": "k"}], "same key is given to two names"),
    ([{"name": "a", "key": "k", "rate_limit": 0}], "rate_limit must be"),
])
def test_client_key_refusals(keys, message):
    with pytest.raises(gc.GatewayError, match=message):
        gc.build(["n1"], hostvars(), api_keys=keys)


def test_host_without_instances_or_unknown_refused():
    with pytest.raises(gc.GatewayError, match="publishes no llmops_instances: run role serving"):
        gc.build(["x"], {"x": {}}, api_keys=KEYS)
    with pytest.raises(gc.GatewayError, match="not in the inventory"):
        gc.build(["y"], {}, api_keys=KEYS)
    with pytest.raises(gc.GatewayError, match="gateway_upstream_hosts is empty"):
        gc.build([], {}, api_keys=KEYS)


def test_server_names_sanitized_and_unique():
    hv = {"h:1": node({"m": inst("m", 1)}, "10.0.0.1"), "h_1": node({"m": inst("m", 2)}, "10.0.0.2")}
    with pytest.raises(gc.GatewayError, match="same server name h_1-m"):
        gc.build(["h:1", "h_1"], hv, api_keys=KEYS)
    assert gc.sanitize("node 1/qwen@x") == "node_1_qwen_x"


def test_public_fact_has_no_secret():
    config = gc.build(["n1", "n2"], hostvars(), api_keys=KEYS)
    fact = gc.public_fact(config, url="https://gw:8443", admin_socket="/run/haproxy/llmops-admin.sock")
    assert fact["backends"] == {"be_llama": ["n1-llama"], "be_qwen": ["n1-qwen", "n2-qwen"]}
    assert {"host": "n2", "instance": "qwen", "backend": "be_qwen", "server": "n2-qwen",
            "address": "10.0.1.2:8000"} in fact["servers"]
    assert "kq" not in repr(fact) and "sk-alice" not in repr(fact)


def test_version_and_address_spelling():
    assert gc.parse_version("HAProxy version 2.6.12-1+deb12u4 2026/10/17") == [2, 6, 12]
    assert gc.parse_version("HA-Proxy version 1.5.18 2016/05/10") == [1, 5, 18]
    assert gc.haproxy_address("fd00::1", 80) == "ipv6@fd00::1:80"
    assert gc.haproxy_address("10.0.0.1", 80) == "10.0.0.1:80"


def test_filter_raises_ansible_filter_error():
    with pytest.raises(AnsibleFilterError, match="^gateway: gateway_api_keys is empty"):
        FilterModule().filters()["gateway_config"](["n1"], hostvars(), api_keys=[])
