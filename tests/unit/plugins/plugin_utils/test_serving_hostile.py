# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Nothing user-given becomes unit syntax, and every instance key follows the collection's one secret rule
(issue 23): a newline in host, extra_args, a setting, the model or the build fact is refused at plan time
naming the setting; a key with a trailing newline is refused for the key file and the env file, never
shown."""
import pytest
from ansible_collections.llmops.serving.plugins.plugin_utils import instance_plan, systemd
from ansible_collections.llmops.serving.plugins.plugin_utils.serving_errors import ServingError

from tests.unit.plugins.plugin_utils.serving_helpers import HOST_CPP, plan

KEY = "sk-unit-9c1e"
VLLM = {"mode": "host", "binary": "/opt/vllm/bin/vllm", "version": "0.9.1"}


def _instance(**changes):
    inst = {"name": "a", "model": "tiny", "port": 8003}
    inst.update(changes)
    return inst


@pytest.mark.parametrize("changes, setting", [
    ({"host": "127.0.0.1\nExecStartPre=/bin/sh -c id"}, "host"),
    ({"extra_args": ["--verbose", "x\nUser=root"]}, "extra_args[1]"),
    ({"settings": {"spec_type": "draft-mtp,x\nUser=root"}}, "setting spec_type"),
    ({"settings": {"tensor_split": ["1", "1\r\nUser=root"]}}, "setting tensor_split"),
    ({"model": "/home/models/x\n.gguf"}, "model"),
])
def test_a_newline_anywhere_the_unit_renders_is_refused_by_setting(changes, setting):
    with pytest.raises(ServingError) as info:
        plan([_instance(**changes)])
    message = str(info.value)
    assert "instance a" in message and "control character" in message and setting in message, message
    assert "User=root" not in message and "ExecStartPre" not in message


def test_a_build_fact_value_with_a_newline_is_refused():
    with pytest.raises(ServingError, match="the build fact's build_id"):
        plan([_instance()], build=dict(HOST_CPP, build_id="b1\nUser=root"))


def test_the_unit_quoting_refuses_control_characters_as_a_last_guard():
    with pytest.raises(ServingError, match="control character"):
        systemd.systemd_quote("a\nUser=root")
    assert systemd.systemd_quote("a b") == '"a b"'


@pytest.mark.parametrize("key", [KEY + "\n", " " + KEY, KEY + "\x00", "sk one"])
def test_instance_keys_follow_the_one_secret_rule(key):
    with pytest.raises(ServingError) as info:
        plan([_instance()], api_keys={"a": key})
    assert "serving_api_keys[a] contains whitespace" in str(info.value) and KEY not in str(info.value)
    vllm = [{"name": "v", "engine": "vllm", "model": "/home/models/q", "port": 8010}]
    with pytest.raises(ServingError) as info:
        instance_plan.instance_env_file(vllm, "v", mode="host", api_keys={"v": key})
    assert "serving_api_keys[v]" in str(info.value) and KEY not in str(info.value)


def test_good_keys_pass_and_name_the_instances_with_a_key():
    plans = plan([_instance(host="0.0.0.0")], api_keys={"a": KEY, "b": ""})
    assert plans[0]["key_file"].endswith("/a.key")
    text = instance_plan.instance_env_file([{"name": "v", "engine": "vllm"}], "v", api_keys={"v": KEY})
    assert text == 'VLLM_API_KEY="%s"\n' % KEY
