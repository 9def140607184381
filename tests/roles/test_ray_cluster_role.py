# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Role ray_cluster: its interface (defaults = argument specs, prefixes), the head's and a worker's
`ray start` command lines, the ports opened to the other nodes, and how `ray status` is read. The real
two-node cluster is molecule/ray."""
import os
import shlex

import pytest

from tests.helpers import ROOT, load_yaml, role_templar

ROLE = os.path.join(ROOT, "roles", "ray_cluster")
HOSTS = ["gpu-a", "gpu-b", "gpu-c"]
# `ray status` of Ray 2.60.0 for two nodes of 2 GPUs, one instance's placement group holding all 4.
RAY_STATUS = """======== Autoscaler status: 2026-12-01 11:17:37.454063 ========
Node status
---------------------------------------------------------------
Active:
 1 node_2e3020addbd2c694d3eef0788ff4a52119474c28a937ab9cb77c8e93
 1 node_a0373ea3ef3bb32f560eb6c2345e2705633f3424e29c58aa46488c5b
Pending:
 (no pending nodes)
Recent failures:
 (no failures)

Resources
---------------------------------------------------------------
Total Usage:
 0.0/2.0 CPU
 0.0/4.0 GPU (0.0 used of 4.0 reserved in placement groups)
 0B/46.28GiB memory
 0B/190.73MiB object_store_memory
"""


def role_vars(host="gpu-a", per_host=None, **extra):
    """defaults + OS vars + vars/main.yml for `host` of a 3-node cluster (gpu-a the head), with the facts
    validate.yml sets on every node (their addresses 10.0.0.1-3)."""
    variables = load_yaml(os.path.join(ROLE, "defaults", "main.yml"))
    variables.update(load_yaml(os.path.join(ROLE, "vars", "Debian.yml")))
    variables.update(extra)
    variables.update(load_yaml(os.path.join(ROLE, "vars", "main.yml")))
    variables.update({
        "inventory_hostname": host, "ansible_managed": "Ansible managed",
        "groups": {"ray_cluster": HOSTS, "ray_head": ["gpu-a"], "ray_workers": HOSTS[1:]},
        "llmops_vllm": {"venv": "/opt/llmops/vllm/0.33.0"},
        "ansible_facts": {"os_family": "Debian", "llmops_gpus": {"count": 4}},
    })
    hostvars = {}
    for index, name in enumerate(HOSTS):
        hostvars[name] = {"_ray_cluster_node_ip": "10.0.0.%d" % (index + 1),
                          "_ray_cluster_node_gcs_port": str((per_host or {}).get(name, {}).get("gcs", 6379))}
    variables["hostvars"] = hostvars
    variables["_ray_cluster_node_ip"] = hostvars[host]["_ray_cluster_node_ip"]
    return variables


def template(variables, expression):
    return role_templar(ROLE, variables).template(expression)


def exec_start(variables):
    with open(os.path.join(ROLE, "templates", "ray.service.j2")) as handle:
        source = handle.read()
    text = role_templar(ROLE, variables).template(source, preserve_trailing_newlines=True,
                                                   escape_backslashes=False)
    line = [x for x in text.splitlines() if x.startswith("ExecStart=")]
    assert len(line) == 1, text
    return shlex.split(line[0][len("ExecStart="):]), text


def option(argv, name):
    return argv[argv.index(name) + 1]


# --- interface -----------------------------------------------------------------------------------


def test_the_pin_matches_the_wheel_fixture():
    from tests.fixtures import ray_wheels
    defaults = load_yaml(os.path.join(ROLE, "defaults", "main.yml"))
    assert defaults["ray_cluster_version"] == ray_wheels.RAY_VERSION == "2.60.0"
    assert ray_wheels.download_argv("/d")[-1] == "ray==2.60.0"
    assert ray_wheels.download_argv("/d")[3:] == [
        "download", "--disable-pip-version-check", "-q", "--only-binary=:all:", "--python-version", "3.11",
        "--platform", "manylinux2014_x86_64", "-d", "/d", "ray==2.60.0"]


# --- units ---------------------------------------------------------------------------------------


def test_head_unit_runs_ray_from_vllms_venv_with_every_port_fixed():
    argv, text = exec_start(role_vars("gpu-a"))
    assert argv[:4] == ["/opt/llmops/vllm/0.33.0/bin/ray", "start", "--block", "--disable-usage-stats"]
    assert "--head" in argv and "--address" not in argv
    assert option(argv, "--port") == "6379"
    assert option(argv, "--node-ip-address") == "10.0.0.1"
    for flag, port in (("--node-manager-port", "6380"), ("--object-manager-port", "6381"),
                       ("--runtime-env-agent-port", "6382"), ("--metrics-export-port", "6383"),
                       ("--dashboard-agent-grpc-port", "6384"), ("--dashboard-agent-listen-port", "52365"),
                       ("--min-worker-port", "10002"), ("--max-worker-port", "10999")):
        assert option(argv, flag) == port, flag
    assert "--include-dashboard=false" in argv and "--dashboard-port" not in argv
    assert "--ray-client-server-port" not in argv        # needs ray[client], not installed
    assert option(argv, "--num-gpus") == "4"            # llmops_gpus.count
    assert option(argv, "--temp-dir") == "/var/lib/llama-server/ray"
    assert "--num-cpus" not in argv and "--object-store-memory" not in argv
    assert "User=llama" in text and "Restart=always" in text


def test_worker_unit_joins_the_heads_gcs_port():
    argv, _text = exec_start(role_vars("gpu-b", per_host={"gpu-a": {"gcs": 18250}}, ray_cluster_num_gpus=2,
                                       ray_cluster_object_store_memory=100000000, ray_cluster_num_cpus=1))
    assert "--head" not in argv and "--port" not in argv and "--include-dashboard=false" not in argv
    assert option(argv, "--address") == "10.0.0.1:18250"
    assert option(argv, "--node-ip-address") == "10.0.0.2"
    assert option(argv, "--num-gpus") == "2"
    assert option(argv, "--num-cpus") == "1"
    assert option(argv, "--object-store-memory") == "100000000"


def test_dashboard_client_server_resources_and_environment_when_asked():
    argv, text = exec_start(role_vars("gpu-a", ray_cluster_include_dashboard=True,
                                      ray_cluster_dashboard_port=8266, ray_cluster_client_server_port=10001,
                                      ray_cluster_resources={"fast": 1},
                                      ray_cluster_env={"NCCL_SOCKET_IFNAME": "eth1"}))
    assert "--include-dashboard=true" in argv and option(argv, "--dashboard-port") == "8266"
    assert option(argv, "--ray-client-server-port") == "10001"
    assert option(argv, "--resources") == '{"fast": 1}'
    assert 'Environment="NCCL_SOCKET_IFNAME=eth1"' in text


# --- firewall ------------------------------------------------------------------------------------


def test_ports_are_opened_to_the_other_nodes_only():
    head = role_vars("gpu-a")
    assert template(head, "{{ _ray_cluster_peers }}") == ["10.0.0.2", "10.0.0.3"]
    assert template(head, "{{ _ray_cluster_open_ports }}") == [
        "6380", "6381", "6382", "6383", "6384", "52365", "6379", "10002-10999"]
    worker = role_vars("gpu-c", ray_cluster_include_dashboard=True)
    assert template(worker, "{{ _ray_cluster_peers }}") == ["10.0.0.1", "10.0.0.2"]
    assert "6379" not in template(worker, "{{ _ray_cluster_open_ports }}"), "the GCS is the head's"
    dashboard = role_vars("gpu-a", ray_cluster_include_dashboard=True)
    assert "8265" in template(dashboard, "{{ _ray_cluster_open_ports }}")


@pytest.mark.parametrize("extra, ok", [
    ({}, True),
    ({"ray_cluster_node_manager_port": 6379}, False),        # twice the same port (head: GCS)
    ({"ray_cluster_metrics_export_port": 10500}, False),     # inside the worker range
])
def test_port_check_refuses_clashes(extra, ok):
    variables = role_vars("gpu-a", **extra)
    fixed = template(variables, "{{ _ray_cluster_fixed_ports }}")
    low, high = variables["ray_cluster_min_worker_port"], variables["ray_cluster_max_worker_port"]
    distinct = len(set(fixed)) == len(fixed)
    outside = not [p for p in fixed if low <= p <= high]
    assert (distinct and outside) is ok


# --- health ------------------------------------------------------------------------------------------


def test_ray_status_is_read_for_live_nodes_and_gpus():
    variables = role_vars("gpu-a")
    variables["status"] = RAY_STATUS
    assert template(variables, "{{ status | regex_findall(_ray_cluster_node_line) | length }}") == "2"
    assert template(variables, "{{ status | regex_findall(_ray_cluster_gpu_line) | first }}") == "4.0"
    second = " 1 node_a0373ea3ef3bb32f560eb6c2345e2705633f3424e29c58aa46488c5b\n"
    variables["status"] = RAY_STATUS.replace(second, "")
    assert template(variables, "{{ status | regex_findall(_ray_cluster_node_line) | length }}") == "1"
