# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""CentOS 7 runs firewalld by default: role serving opens the ports of its exposed instances and role
ray_cluster its ports to the other nodes, with firewall-cmd (ansible.posix.firewalld needs python3 firewalld
bindings, which CentOS 7 does not have). The roles' firewall tasks run here for real against the fake
firewall-cmd of tests/fixtures/fake_firewalld."""

import glob
import json
import os
import shutil
import subprocess
import sys

import pytest
import yaml
from ansible_collections.llmops.serving.plugins.plugin_utils.instance_plan import (
    exposed_listeners,
    exposed_ports,
)

from tests.helpers import FIXTURES, ROOT, load_yaml, run_local_playbook
from tests.roles.test_nvidia_driver import flat_tasks

FAKE = os.path.join(FIXTURES, "fake_firewalld", "firewall-cmd")
FAKE_IP = os.path.join(FIXTURES, "fake_firewalld", "ip")
RICH = 'rule family="ipv4" source address="%s" port port="%s" protocol="tcp" accept'


def test_no_role_uses_the_python_firewalld_module():
    for path in glob.glob(os.path.join(ROOT, "roles", "*", "tasks", "*.yml")):
        for task in flat_tasks(load_yaml(path) or []):
            assert not {"ansible.posix.firewalld", "firewalld"} & set(task), path


def test_only_instances_bound_beyond_loopback_need_a_port():
    plans = [{"host": "0.0.0.0", "port": 8003}, {"host": "127.0.0.1", "port": 8000},
             {"host": "127.0.0.1,10.0.0.5", "port": 8010}, {"host": "::1", "port": 8020}]
    assert exposed_ports(plans) == ["8003/tcp", "8010/tcp"]
    # with their bind addresses: firewall_ports opens each in the zone of the interface carrying it
    assert exposed_listeners(plans) == [{"port": "8003/tcp", "host": "0.0.0.0"},
                                        {"port": "8010/tcp", "host": "127.0.0.1,10.0.0.5"}]
    assert exposed_listeners([]) == [] and exposed_listeners(None) == []


def test_serving_opens_its_ports_after_the_instances_by_default():
    main = load_yaml(os.path.join(ROOT, "roles", "serving", "tasks", "main.yml"))
    names = [t.get("ansible.builtin.include_tasks") or t.get("ansible.builtin.import_tasks") for t in main]
    assert names.index("firewall.yml") > names.index("instance.yml")
    step = main[names.index("firewall.yml")]
    assert step["when"] == "serving_manage_firewall | bool"
    defaults = load_yaml(os.path.join(ROOT, "roles", "serving", "defaults", "main.yml"))
    assert defaults["serving_manage_firewall"] is True and defaults["serving_firewall_sources"] == []


@pytest.fixture
def firewalld(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shutil.copy(FAKE, str(bin_dir / "firewall-cmd"))
    shutil.copy(FAKE_IP, str(bin_dir / "ip"))
    state = tmp_path / "firewalld"
    env = {"FAKE_FIREWALLD_DIR": str(state / "permanent"),
           "FAKE_FIREWALLD_RUNTIME_DIR": str(state / "runtime"),
           "FAKE_FIREWALLD_LOG": str(state / "calls.log"),
           "FAKE_IP_ADDRESSES": str(tmp_path / "addresses.json")}
    # the node: eth0 (no zone: the default, public) and eth1 in zone internal
    (tmp_path / "addresses.json").write_text(json.dumps({"lo": ["127.0.0.1/8"], "eth0": ["192.0.2.2/24"],
                                                         "eth1": ["10.0.0.5/24"]}))
    (state / "permanent").mkdir(parents=True)
    (state / "permanent" / "interfaces.json").write_text(json.dumps({"eth1": "internal"}))
    return bin_dir, env


def firewall_cmd(env, *args):
    return subprocess.run([FAKE] + list(args), stdout=subprocess.PIPE, universal_newlines=True,
                          env=dict(os.environ, **env), check=False).stdout


def run_tasks(tmp_path, firewalld, role, variables):
    bin_dir, env = firewalld
    play = [{"hosts": "localhost", "gather_facts": False, "connection": "local",
             # ip: the double (get_bin_path looks in /usr/sbin before PATH)
             "module_defaults": {"llmops.serving.firewall_ports": {"record_dir": str(tmp_path / "record"),
                                                                   "ip_cmd": str(bin_dir / "ip")}},
             "tasks": [{"ansible.builtin.include_role": {"name": "llmops.serving.%s" % role,
                                                          "tasks_from": "firewall.yml"},
                        "vars": variables}]}]
    path = tmp_path / "play.yml"
    path.write_text(yaml.safe_dump(play))
    return run_local_playbook(path, str(bin_dir), extra_env=env,
                              extra_args=["-e", "ansible_python_interpreter=%s" % sys.executable])


L20_PLAN = [{"name": "qwen36-27b", "host": "0.0.0.0", "port": 8003},
            {"name": "qwen36-27b-fp8", "host": "127.0.0.1", "port": 8000}]


def test_serving_opens_the_l20_port_to_the_sources_then_changes_nothing(tmp_path, firewalld):
    variables = {"_serving_instance_plans": L20_PLAN, "serving_firewall_sources": ["10.20.0.0/16"]}
    result, stats = run_tasks(tmp_path, firewalld, "serving", variables)
    assert result.returncode == 0, result.stdout + result.stderr
    assert stats["changed"] == 1
    env = firewalld[1]
    assert firewall_cmd(env, "--permanent", "--list-rich-rules").strip() == RICH % ("10.20.0.0/16", 8003)
    assert firewall_cmd(env, "--list-rich-rules").strip() == RICH % ("10.20.0.0/16", 8003)
    assert firewall_cmd(env, "--list-ports").strip() == ""  # vLLM on loopback: nothing opened for it
    again, stats = run_tasks(tmp_path, firewalld, "serving", variables)
    assert again.returncode == 0 and stats["changed"] == 0


def test_serving_without_firewalld_says_which_port_to_open(tmp_path, firewalld):
    state = tmp_path / "firewalld" / "permanent"
    (state / "stopped").write_text("")
    result, stats = run_tasks(tmp_path, firewalld, "serving", {"_serving_instance_plans": L20_PLAN})
    assert result.returncode == 0 and stats["changed"] == 0
    assert "firewalld is not running on localhost: if another firewall guards it, allow TCP 8003/tcp" in \
        " ".join(result.stdout.split())


def test_ray_opens_its_ports_to_the_peers_only_and_drops_a_peer_that_left(tmp_path, firewalld):
    variables = {"_ray_cluster_peers": ["10.0.0.2", "10.0.0.3"],
                 "_ray_cluster_open_ports": ["6380", "10002-10999"], "_ray_cluster_node_ip": "10.0.0.1"}
    result, stats = run_tasks(tmp_path, firewalld, "ray_cluster", variables)
    assert result.returncode == 0, result.stdout + result.stderr
    env = firewalld[1]
    rules = set(firewall_cmd(env, "--permanent", "--list-rich-rules").splitlines())
    assert rules == {RICH % (peer, port)
                     for peer in ("10.0.0.2", "10.0.0.3") for port in ("6380", "10002-10999")}
    assert firewall_cmd(env, "--list-ports").strip() == ""  # never the whole zone
    variables["_ray_cluster_peers"] = ["10.0.0.2"]
    result, stats = run_tasks(tmp_path, firewalld, "ray_cluster", variables)
    assert result.returncode == 0 and stats["changed"] == 1
    assert set(firewall_cmd(env, "--list-rich-rules").splitlines()) == {
        RICH % ("10.0.0.2", port) for port in ("6380", "10002-10999")}


def test_serving_opens_a_port_in_the_zone_of_its_bind_address_not_the_default(tmp_path, firewalld):
    plans = [{"name": "qwen36-27b", "host": "10.0.0.5", "port": 8003},
             {"name": "qwen36-27b-fp8", "host": "0.0.0.0", "port": 8004}]
    result, stats = run_tasks(tmp_path, firewalld, "serving", {"_serving_instance_plans": plans})
    assert result.returncode == 0, result.stdout + result.stderr
    env = firewalld[1]
    assert firewall_cmd(env, "--zone=internal", "--list-ports").split() == ["8003/tcp", "8004/tcp"]
    assert firewall_cmd(env, "--permanent", "--zone=public", "--list-ports").split() == ["8004/tcp"]
    assert "8003/tcp: zone internal (10.0.0.5 is on eth1; eth1 is in zone internal)" in result.stdout
    given, _stats = run_tasks(tmp_path, firewalld, "serving",
                              {"_serving_instance_plans": plans, "serving_firewall_zone": "trusted"})
    assert given.returncode == 0, given.stdout + given.stderr
    assert firewall_cmd(env, "--zone=trusted", "--list-ports").split() == ["8003/tcp", "8004/tcp"]
    assert firewall_cmd(env, "--zone=internal", "--list-ports").split() == []


def test_ray_opens_its_ports_in_the_zone_of_the_node_address(tmp_path, firewalld):
    variables = {"_ray_cluster_peers": ["10.0.0.2"], "_ray_cluster_open_ports": ["6380", "10002-10999"],
                 "_ray_cluster_node_ip": "10.0.0.5"}
    result, _stats = run_tasks(tmp_path, firewalld, "ray_cluster", variables)
    assert result.returncode == 0, result.stdout + result.stderr
    env = firewalld[1]
    assert set(firewall_cmd(env, "--zone=internal", "--list-rich-rules").splitlines()) == {
        RICH % ("10.0.0.2", port) for port in ("6380", "10002-10999")}
    assert firewall_cmd(env, "--zone=public", "--list-rich-rules").strip() == ""
