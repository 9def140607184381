# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""plugins/plugin_utils/gateway_config.py: backends, servers, maps and refusals of the gateway."""
import hashlib
import re

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
    # all requests: gateway_request_rate_limit, or the key's generation limit when higher
    assert config["request_limits_map"] == "alice 600\nbob 600\n"
    keys = [dict(KEYS[0], rate_limit=5000), KEYS[1]]
    config = gc.build(["n1"], hostvars(), api_keys=keys, settings={"request_rate_limit": 100})
    assert config["request_limits_map"] == "alice 5000\nbob 100\n"


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


# ---------------------------------------------------------------- nothing user-given becomes config syntax

def one_node(**instance):
    base = inst("qwen", 8000)
    base.update(instance)
    return {"n1": node({"qwen": base}, "10.0.0.1", {"qwen": "kq"})}


@pytest.mark.parametrize("name", ["#qwen", "qw#en", 'qw"en', "qw'en", "q\\w", "qw$en", "qw%en", "qw en",
                                  "qw\nen", "qw\x00en", "qw\u200ben", "x" * 257])
def test_served_model_names_that_would_be_syntax_are_refused(name):
    hv = one_node(served_model_name=name)
    with pytest.raises(gc.GatewayError, match="instance qwen of n1: served_model_name"):
        gc.build(["n1"], hv, api_keys=KEYS)


def test_served_model_names_routable_as_they_are():
    hv = one_node(served_model_name=["qwen3:8b@q4", "通义千问-7B"])
    config = gc.build(["n1"], hv, api_keys=KEYS)
    assert config["models_map"] == "qwen3:8b@q4 be_qwen3_8b_q4\n通义千问-7B be_qwen3_8b_q4\n"
    assert config["backends"][0]["models"] == ["qwen3:8b@q4", "通义千问-7B"]
    assert config["single_model"] is True


def test_one_name_on_two_backends_or_two_name_sets_refused():
    hv = {"n1": node({"a": inst(["m", "alias"], 1), "b": inst(["alias"], 2)}, "10.0.0.1")}
    with pytest.raises(gc.GatewayError, match="alias is given to two backends"):
        gc.build(["n1"], hv, api_keys=KEYS)
    hv = {"n1": node({"a": inst(["m", "x"], 1)}, "10.0.0.1"), "n2": node({"a": inst(["m"], 2)}, "10.0.0.2")}
    with pytest.raises(gc.GatewayError, match="under different names"):
        gc.build(["n1", "n2"], hv, api_keys=KEYS)


@pytest.mark.parametrize("host,node_address", [
    ("10.0.0.5\n    server evil 10.6.6.6:80", "10.0.0.1"),
    ("10.0.0.5 #", "10.0.0.1"),
    ("0.0.0.0", "node 1"),
    ("0.0.0.0", "n1\nbackend x"),
    ("0.0.0.0", "$HOME"),
])
def test_addresses_that_would_be_syntax_are_refused(host, node_address):
    hv = {"n1": node({"qwen": inst("qwen", 8000, host=host)}, node_address)}
    with pytest.raises(gc.GatewayError, match="instance qwen of n1: its address"):
        gc.build(["n1"], hv, api_keys=KEYS)


def test_addresses_accepted():
    for address in ("10.0.0.1", "fd00::1", "[fd00::2]", "node-1.lan", "gpu_01"):
        hv = {"n1": node({"qwen": inst("qwen", 8000)}, address)}
        server = gc.build(["n1"], hv, api_keys=KEYS)["backends"][0]["servers"][0]
        assert server["address"] == address.strip("[]")


@pytest.mark.parametrize("port", [0, 70000, 8000.5, "80 80", "8000\nx", True, None, -1, float("inf"),
                                  float("nan"), 10 ** 30])
def test_bad_ports_refused(port):
    with pytest.raises(gc.GatewayError, match="instance qwen of n1"):
        gc.build(["n1"], one_node(port=port), api_keys=KEYS)


def test_port_given_as_text_is_a_number():
    for port in ("8000", "8000\n"):  # rendered as the number: surrounding whitespace is harmless
        server = gc.build(["n1"], one_node(port=port), api_keys=KEYS)["backends"][0]["servers"][0]
        assert server["port"] == 8000


SECRET = 'k"\n    http-request deny\n#'


@pytest.mark.parametrize("key", [SECRET, "k ey", "k\tey", "kéy", "k\x7fey", "k\x00"])
def test_backend_keys_with_whitespace_or_control_refused_without_showing_them(key):
    hv = {"n1": node({"qwen": inst("qwen", 8000)}, "10.0.0.1", {"qwen": key})}
    with pytest.raises(gc.GatewayError) as error:
        gc.build(["n1"], hv, api_keys=KEYS)
    message = str(error.value)
    assert "serving_api_keys[qwen] of host n1" in message and "not shown" in message
    assert key not in message and repr(key) not in message and "deny" not in message


@pytest.mark.parametrize("key", ["sk\nx", "sk\x00x", "skéx", "s k"])
def test_client_keys_with_whitespace_or_control_refused_without_showing_them(key):
    with pytest.raises(gc.GatewayError) as error:
        gc.build(["n1"], hostvars(), api_keys=[{"name": "alice", "key": key}])
    assert "gateway_api_keys[alice].key" in str(error.value) and key not in str(error.value)


def test_backend_key_escaped_for_a_double_quoted_log_format_string():
    key = 'sk-"$HOME%[env(HOME)]\\#\'`{x}'
    hv = {"n1": node({"qwen": inst("qwen", 8000)}, "10.0.0.1", {"qwen": key})}
    backend = gc.build(["n1"], hv, api_keys=KEYS)["backends"][0]
    assert backend["api_key"] == key
    assert backend["auth_header"] == "Bearer sk-\\x22\\x24HOME%%[env(HOME)]\\x5c\\x23\\x27\\x60{x}"
    # decoding the escapes and the doubled % gives the key back: nothing else is left to interpret
    decoded = re.sub(r"\\x([0-9a-f]{2})", lambda m: chr(int(m.group(1), 16)), backend["auth_header"])
    assert decoded.replace("%%", "%") == "Bearer " + key
    assert not re.search(r'["$#\\\']', backend["auth_header"].replace("\\x", ""))


# ---------------------------------------------------------------- the role's settings

@pytest.mark.parametrize("name,value", [
    ("bind_address", "0.0.0.0:80 ssl"), ("bind_address", "a\nb"), ("port", "84 43"), ("port", 0),
    ("tls", "yes"), ("log_target", "stdout\n    stats socket /tmp/x level admin"), ("log_target", "$HOME"),
    ("log_target", "/dev/log  local0"), ("admin_socket", "relative.sock"), ("admin_socket", "/run/a b.sock"),
    ("admin_socket", "/" + "x" * 120), ("maxconn", -1), ("maxconn", "1e9"), ("bufsize", 1024),
    ("bufsize", 1 << 30), ("health_path", "health"), ("health_path", "/health #x"),
    ("health_path", "/h\nserver x 1.2.3.4:5"), ("health_path", "/$HOME"), ("health_fall", 0),
    ("health_inter", "2 s"), ("retries", -1), ("timeout_connect", "5x"), ("timeout_client", "30d"),
    ("timeout_server", "0"), ("timeout_server", "10m\nx"), ("timeout_server", "1 0m"),
    ("timeout_queue", True), ("timeout_body", ""),
    ("request_rate_limit", 0), ("slowest_tokens_per_second", 0), ("slowest_tokens_per_second", float("nan")),
    ("slowest_tokens_per_second", "inf"), ("assumed_context", 0),
])
def test_bad_settings_refused_naming_the_setting(name, value):
    with pytest.raises(gc.GatewayError, match="gateway_%s" % name):
        gc.build(["n1"], hostvars(), api_keys=KEYS, settings={name: value})


def test_unknown_setting_refused():
    with pytest.raises(gc.GatewayError, match="unknown gateway settings: colour"):
        gc.build(["n1"], hostvars(), api_keys=KEYS, settings={"colour": 1})


def test_settings_as_ansible_templates_them():
    """Ansible may hand numbers and booleans over as text: they are read as such."""
    settings = {"port": "8080", "tls": "False", "maxconn": "100", "slowest_tokens_per_second": "12.5",
                "bind_address": "fd00::5", "request_rate_limit": "30", "assumed_context": "4096"}
    out = gc.build(["n1"], hostvars(), api_keys=KEYS, rate_limit="7", settings=settings)["settings"]
    assert (out["port"], out["tls"], out["maxconn"]) == (8080, False, 100)
    assert out["slowest_tokens_per_second"] == 12.5
    assert out["bind"] == "ipv6@fd00::5:8080" and out["rate_limit"] == 7 and out["request_rate_limit"] == 30
    assert gc.build(["n1"], hostvars(), api_keys=KEYS, settings={"timeout_client": "5m\n"})["settings"][
        "timeout_client"] == "5m"
    default = gc.build(["n1"], hostvars(), api_keys=KEYS)["settings"]
    assert default["bind"] == "0.0.0.0:8443" and default["tls"] is True


# ---------------------------------------------------------------- timeouts sized from the longest context

def test_server_timeout_covers_the_longest_context():
    hv = {"n1": node({"a": dict(inst("qwen", 1, engine="vllm"), settings={"max_model_len": 131072}),
                      "b": dict(inst("llama", 2, engine="llama.cpp"), settings={"ctx_size": "262144"}),
                      "c": dict(inst("small", 3, engine="llama.cpp"), settings={"ctx_size": 4096})},
                     "10.0.0.1"),
          "n2": node({"a": dict(inst("qwen", 1, engine="vllm"), settings={"max_model_len": 32768})},
                     "10.0.0.2")}
    backends = {b["model"]: b for b in gc.build(["n1", "n2"], hv, api_keys=KEYS)["backends"]}
    assert backends["qwen"]["timeout_server"] == "6554s"  # 131072 / 20, n1's (the longest of the two)
    assert "131072 tokens (server n1-a, max_model_len)" in backends["qwen"]["timeout_reason"]
    assert backends["llama"]["timeout_server"] == "13108s"
    assert backends["small"]["timeout_server"] == "10m"  # 4096 / 20 = 205 s: the floor
    assert backends["small"]["timeout_reason"].startswith("gateway_timeout_server: the longest context, 4096")


def test_server_timeout_of_unstated_context_and_rate():
    hv = {"n1": node({"a": dict(inst("qwen", 1, engine="llama.cpp"), settings={"ctx_size": 0})}, "10.0.0.1")}
    settings = {"assumed_context": 65536, "slowest_tokens_per_second": 64, "timeout_server": "30s"}
    backend = gc.build(["n1"], hv, api_keys=KEYS, settings=settings)["backends"][0]
    assert backend["timeout_server"] == "1024s" and "gateway_assumed_context (ctx_size not set)" in \
        backend["timeout_reason"]
    settings["slowest_tokens_per_second"] = 0.0001  # never beyond HAProxy's 24-day timer
    backend = gc.build(["n1"], hv, api_keys=KEYS, settings=settings)["backends"][0]
    assert backend["timeout_server"] == "2147483s"


def test_several_models_are_not_single():
    config = gc.build(["n1", "n2"], hostvars(), api_keys=KEYS)
    assert config["single_model"] is False and config["models"] == "llama, qwen"


def test_default_settings_are_the_roles_defaults():
    """gateway_config.DEFAULT_SETTINGS (for callers that give none) says what roles/gateway/defaults says."""
    from tests.helpers import ROOT, load_yaml
    defaults = load_yaml(ROOT + "/roles/gateway/defaults/main.yml")
    for name, value in gc.DEFAULT_SETTINGS.items():
        if name not in ("port", "tls"):  # gateway_port is templated from gateway_tls
            assert defaults["gateway_" + name] == value, name
    assert defaults["gateway_tls"] is True and gc.DEFAULT_SETTINGS["port"] == 8443
    assert defaults["gateway_rate_limit"] == 60
