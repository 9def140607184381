# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Issue 34: values that reach a configuration file are checked over the whole string, or quoted so that they
cannot become syntax. Each reproducer of the issue is refused with a message naming the setting; the values a
user means are still accepted (spaces where the file allows them).

The template-level reproducers (ray.service, the timer, Prometheus' ARGS, Grafana's data source) are in
tests/roles/test_hostile_template_values.py."""
import pytest
from ansible_collections.llmops.serving.plugins.module_utils._download.messages import DownloadError
from ansible_collections.llmops.serving.plugins.module_utils._download.sidecar import _HEX64 as SIDECAR_HEX64
from ansible_collections.llmops.serving.plugins.module_utils._serving.deployment import DeploymentError, Paths
from ansible_collections.llmops.serving.plugins.module_utils._snapshot.listing import check_listing
from ansible_collections.llmops.serving.plugins.plugin_utils import gateway_config, monitoring, systemd
from ansible_collections.llmops.serving.plugins.plugin_utils.env_files import check_env
from ansible_collections.llmops.serving.plugins.plugin_utils.serving_errors import ServingError

HEX = "ab" * 32
STATS_SOCKET = "stdout format raw local0\n stats socket /tmp/x.sock mode 666 level admin"  # the issue's


# --- class 1: validators that stopped before a final newline ---------------------------------------------


@pytest.mark.parametrize("target", [STATS_SOCKET, "stdout format raw local0 info\n",
                                    "stdout format raw local0\nlua-load /tmp/x.lua"])
def test_a_log_target_with_a_newline_is_refused_before_haproxy_c_sees_it(target):
    with pytest.raises(gateway_config.GatewayError, match="gateway_log_target"):
        gateway_config._check_settings({"log_target": target})


@pytest.mark.parametrize("target", ["stdout format raw local0 info", "/dev/log local0",
                                    "127.0.0.1:514 local1"])
def test_log_targets_of_several_words_are_kept(target):
    assert gateway_config._check_settings({"log_target": target})["log_target"] == target


@pytest.mark.parametrize("name", ["qwen\n", "qwen\nx", "\nqwen"])
def test_a_deployment_name_with_a_newline_is_refused(name):
    with pytest.raises(DeploymentError, match="instance name"):
        Paths("/var/lib/llmops/deployments", name)


def test_deployment_names_are_kept():
    for name in ("qwen", "qwen3.6-27b_fp8", "a" * 63):
        Paths("/var/lib/llmops/deployments", name)


def test_an_env_name_with_a_final_newline_is_refused_and_named():
    with pytest.raises(ServingError, match="not a valid variable name"):
        check_env({"HF_TOKEN\n": "x"})
    assert list(check_env({"HF_TOKEN": "a b", "_X1": "1"})) == ["HF_TOKEN", "_X1"]


def listing(sha):
    return [("model.safetensors", 10, sha, None, True)]


def test_a_listing_sha256_with_a_final_newline_is_refused_not_trusted():
    with pytest.raises(DownloadError, match="malformed sha256"):
        check_listing(listing(HEX + "\n"), "the listing")
    assert check_listing(listing(HEX), "the listing")[0].sha256 == HEX
    assert not SIDECAR_HEX64.match(HEX + "\n") and SIDECAR_HEX64.match(HEX)


def test_gateway_host_names_and_times_are_whole_string():
    for bad in ("gpu-a\n", "gpu-a\nlua-load /x"):
        with pytest.raises(gateway_config.GatewayError):
            gateway_config.check_address(bad, "gateway_bind_address")
    assert gateway_config.check_address("gpu-a.lan", "gateway_bind_address") == "gpu-a.lan"
    # numbers and times are read after strip() and rendered from what was read: no newline reaches the file
    settings = gateway_config._check_settings({"timeout_connect": "5s\n", "maxconn": "10\n"})
    assert settings["timeout_connect"] == "5s" and settings["maxconn"] == 10
    with pytest.raises(gateway_config.GatewayError, match="gateway_timeout_connect"):
        gateway_config._check_settings({"timeout_connect": "5s\nlua-load /x"})


def test_the_metrics_bind_is_checked():
    assert gateway_config.bind_line("127.0.0.1", 9101, "gateway_metrics_address") == "127.0.0.1:9101"
    assert gateway_config.bind_line("", "9101", "gateway_metrics_address") == "*:9101"
    assert gateway_config.bind_line("::1", 9101, "gateway_metrics_address") == "ipv6@::1:9101"
    for bad in ("127.0.0.1:9101\n    lua-load /tmp/x.lua\n#", "127.0.0.1 ssl"):
        with pytest.raises(gateway_config.GatewayError, match="gateway_metrics_address"):
            gateway_config.bind_line(bad, 9101, "gateway_metrics_address")
    assert gateway_config.bind_line("127.0.0.1", "9101\n", "gateway_metrics_address") == "127.0.0.1:9101"
    with pytest.raises(gateway_config.GatewayError, match="gateway_metrics_port"):
        gateway_config.bind_line("127.0.0.1", "9101\n    lua-load /x", "gateway_metrics_address")


# --- class 2: systemd values ------------------------------------------------------------------------------


@pytest.mark.parametrize("env", [
    {"A": "1\nUser=root\nExecStartPre=+/bin/touch /tmp/x"},
    {"A\nUser=root": "1"},
    {"A": "1\r"},
    {"A=B": "1"},
    {"1A": "1"},
])
def test_environment_refuses_what_would_leave_its_line(env):
    with pytest.raises(ServingError, match="ray_cluster_env") as caught:
        systemd.environment(env, "ray_cluster_env")
    assert "/tmp/x" not in str(caught.value)  # the value is never shown


def test_environment_quotes_spaces_quotes_backslashes_and_percent():
    got = systemd.environment({"NCCL_SOCKET_IFNAME": "eth1", "B": 'a b "c" \\d 100%', "A": 2},
                              "ray_cluster_env", sort=True)
    assert got == ['"A=2"', '"B=a b \\"c\\" \\\\d 100%%"', '"NCCL_SOCKET_IFNAME=eth1"']
    assert systemd.environment({"Z": "1", "A": "2"}, "env") == ['"Z=1"', '"A=2"']  # the mapping's order
    assert systemd.environment(None, "env") == []


def test_unit_value_refuses_a_newline_and_doubles_percent():
    with pytest.raises(ServingError, match="ray_cluster_user"):
        systemd.unit_value("llama\nUser=root", "ray_cluster_user")
    assert systemd.unit_value("/var/lib/ray 100%", "x") == "/var/lib/ray 100%%"


@pytest.mark.parametrize("span", ["15s", "1min 30s", "1min30s", "90", "2h", "500ms", "1.5s"])
def test_timespans_are_kept(span):
    assert systemd.timespan(span, "monitoring_gpu_collector_interval") == span


@pytest.mark.parametrize("span", ["15s\nUnit=other.service", "15s\n", "15 s; rm", "", "s", True, None])
def test_a_timespan_that_is_not_one_is_refused(span):
    with pytest.raises(ServingError, match="monitoring_gpu_collector_interval"):
        systemd.timespan(span, "monitoring_gpu_collector_interval")


def test_the_verify_command_names_the_unit_and_takes_one_path():
    command = systemd.verify_command("llmops-gpu-metrics.timer")
    assert command.startswith("sh -c '") and command.endswith(" systemd-verify %s llmops-gpu-metrics.timer")
    assert command.count("%") == 1  # Ansible formats it with the temporary file's path
    for bad in ("ray.service\n", "ray", "a b.service", "../x.service"):
        with pytest.raises(ServingError):
            systemd.verify_command(bad)


# --- class 2: Prometheus' ARGS and Grafana's user --------------------------------------------------------

FLAGS = {"listen_address": "0.0.0.0", "port": 9090, "retention": "30d",
         "config_file": "/etc/prometheus/prometheus.yml", "web_config": "/etc/prometheus/llmops-web.yml"}


def test_prometheus_flags_from_checked_values():
    assert monitoring.prometheus_args(FLAGS) == [
        "--config.file=/etc/prometheus/prometheus.yml", "--web.listen-address=0.0.0.0:9090",
        "--web.config.file=/etc/prometheus/llmops-web.yml", "--web.enable-remote-write-receiver",
        "--storage.tsdb.retention.time=30d"]
    flags = monitoring.prometheus_args(dict(FLAGS, listen_address="::", port="9091", retention="1y2w"))
    assert "--web.listen-address=[::]:9091" in flags and "--storage.tsdb.retention.time=1y2w" in flags
    flags = monitoring.prometheus_args(dict(FLAGS, listen_address="mon.lan"))
    assert "--web.listen-address=mon.lan:9090" in flags


@pytest.mark.parametrize("key, value", [
    ("retention", "30d --web.enable-admin-api"),
    ("retention", "30d\n"),
    ("retention", '30d" LD_PRELOAD="/tmp/x.so'),
    ("listen_address", '0.0.0.0" LD_PRELOAD="/tmp/x.so'),
    ("listen_address", "0.0.0.0 --web.enable-admin-api"),
    ("listen_address", "0.0.0.0\n"),
    ("port", "9090 --web.enable-admin-api"),
    ("port", 70000),
])
def test_prometheus_flags_refuse_what_would_add_a_flag_or_a_variable(key, value):
    with pytest.raises(ServingError, match="monitoring_server_%s" % key):
        monitoring.prometheus_args(dict(FLAGS, **{key: value}))


def test_basic_auth_users_are_whole_string():
    assert monitoring.check_username("llmops-grafana", "monitoring_server_query_username") == "llmops-grafana"
    for bad in ("llmops-grafana\n  - name: evil\n    isDefault: true", "a:b", "a b", "", None):
        with pytest.raises(monitoring.MonitoringError, match="monitoring_server_query_username"):
            monitoring.check_username(bad, "monitoring_server_query_username")
    with pytest.raises(monitoring.MonitoringError, match="monitoring_server_query_username"):
        monitoring.server_config({"self_password_file": "/p", "self_username": "a\nb"})
