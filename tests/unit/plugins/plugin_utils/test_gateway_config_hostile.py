# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""gateway_config.build under hostile values anywhere (property-based): it returns a configuration whose
every rendered value is inert for haproxy.cfg and the map files, or raises GatewayError; never anything
else, and a refusal never shows a key."""
import re

from ansible_collections.llmops.serving.plugins.plugin_utils import gateway_config as gc
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

NASTY = ["", " ", "\n", "\r\n", "\x00", "#", "$HOME", "%[env(HOME)]", '"', "'", "\\", "`", "{{ x }}", "é",
         "\u200b", "a b", "0.0.0.0", "::", "127.0.0.1", "node-1", "8000", "10m", "-1", "1e9", "nan"]
VALUES = st.one_of(st.sampled_from(NASTY), st.text(max_size=12), st.integers(-2 ** 40, 2 ** 40),
                   st.floats(allow_nan=True, allow_infinity=True), st.booleans(), st.none(),
                   st.lists(st.sampled_from(NASTY), max_size=3), st.dictionaries(st.sampled_from(NASTY),
                                                                                 st.sampled_from(NASTY),
                                                                                 max_size=2))
KEY = "sk-secret-7d1e"


FIELDS = ("served", "port", "host", "settings", "engine", "instance", "node_address", "backend_key", "keys",
          "client_name", "client_key", "client_limit", "rate_limit")
FIELDS += tuple("setting:" + name for name in gc.SETTINGS)


@st.composite
def cases(draw):
    """Everything good but one or two fields, those hostile (and sometimes acceptable: "8000", "10m")."""
    hostile = draw(st.lists(st.sampled_from(FIELDS), min_size=1, max_size=2, unique=True))
    value = dict((field, draw(VALUES)) for field in hostile)

    def pick(field, good):
        return value[field] if field in value else good

    instance = {"served_model_name": pick("served", "qwen"), "port": pick("port", 8000),
                "host": pick("host", "0.0.0.0"), "engine": pick("engine", "vllm"),
                "settings": pick("settings", {"max_model_len": 4096})}
    name = pick("instance", "qwen")
    name = name if isinstance(name, str) else "qwen"
    node = {"llmops_instances": {name: instance}, "llmops_node_address": pick("node_address", "10.0.0.1"),
            "serving_api_keys": {name: pick("backend_key", KEY)}}
    keys = pick("keys", [{"name": pick("client_name", "alice"), "key": pick("client_key", KEY + "c"),
                          "rate_limit": pick("client_limit", 5)}])
    setting_values = dict((field.split(":", 1)[1], value[field]) for field in hostile
                          if field.startswith("setting:"))
    return node, keys, pick("rate_limit", 60), setting_values


SAFE_WORD = re.compile(r"^[^\s#$'\"\\%]+$")


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_build_returns_inert_values_or_refuses(case):
    node, keys, rate_limit, setting_values = case
    try:
        config = gc.build(["n1"], {"n1": node}, gateway_host="gw", api_keys=keys, rate_limit=rate_limit,
                          settings=setting_values)
    except gc.GatewayError as error:
        assert KEY not in str(error)
        event("refused")
        return
    event("built")
    for line in config["models_map"].splitlines() + config["keys_map"].splitlines() + \
            config["limits_map"].splitlines() + config["request_limits_map"].splitlines():
        fields = line.split(" ")
        assert len(fields) == 2 and not line.startswith("#") and all(SAFE_WORD.match(f) for f in fields), line
    for name, value in config["settings"].items():
        if isinstance(value, str) and name != "log_target":
            assert SAFE_WORD.match(value), (name, value)
    assert all(SAFE_WORD.match(word) for word in config["settings"]["log_target"].split(" "))
    for backend in config["backends"]:
        assert SAFE_WORD.match(backend["name"]) and SAFE_WORD.match(backend["timeout_server"])
        assert "\n" not in backend["timeout_reason"] and "\n" not in " ".join(backend["models"])
        header = backend["auth_header"]
        if header is not None:
            assert not re.search(r'["$\\\n]', header.replace("\\x", "")), header
            assert "%" not in header.replace("%%", "")
        for server in backend["servers"]:
            assert SAFE_WORD.match(gc.haproxy_address(server["address"], server["port"]))
            assert SAFE_WORD.match(server["server"])
