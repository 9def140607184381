# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Roles monitoring and monitoring_server rendered with Ansible's own Templar from their defaults, vars and
task expressions, for the L20 box (a llama.cpp instance with a key, a vLLM instance) and a monitoring host:
the agent's configuration passes Debian's promtool, units listen on loopback and carry no secret, the web
configuration holds bcrypt hashes that match the passwords, the inventory's rules follow the hosts."""

import os
import shutil
import subprocess

import pytest
import yaml

from tests.helpers import ROOT, load_yaml, role_templar

NODE_ROLE = os.path.join(ROOT, "roles", "monitoring")
SERVER_ROLE = os.path.join(ROOT, "roles", "monitoring_server")
L20_INSTANCES = {
    "qwen36-27b": {
        "engine": "llama.cpp",
        "url": "http://127.0.0.1:8003",
        "served_model_name": "qwen36-27b",
        "key_file": "/etc/llama-server/qwen36-27b.key",
        "host": "0.0.0.0",
        "settings": {"parallel": 2, "ctx_size": 262144},
    },
    "qwen36-27b-fp8": {
        "engine": "vllm",
        "url": "http://127.0.0.1:8000",
        "served_model_name": "qwen3.6-27b-fp8",
        "key_file": None,
        "api_key_env": "VLLM_API_KEY",
        "host": "127.0.0.1",
        "settings": {},
    },
}
SECRET = "agent-secret-4b1d"


def role_vars(role, os_family="Debian", **extra):
    variables = {}
    for path in ("defaults/main.yml", "vars/%s.yml" % os_family, "vars/main.yml"):
        variables.update(load_yaml(os.path.join(role, path)))
    variables.update(
        {
            "role_path": role,
            "ansible_managed": "Ansible managed",
            "inventory_hostname": "l20-node-01",
            "ansible_facts": {"os_family": os_family, "mounts": [{"mount": "/"}, {"mount": "/home"}]},
        }
    )
    variables.update(extra)
    return variables


def task_expression(role, tasks_file, name, key):
    for task in load_yaml(os.path.join(role, "tasks", tasks_file)):
        if task.get("name") == name:
            return task["ansible.builtin.set_fact"][key]
    raise AssertionError("no task %r in %s" % (name, tasks_file))


def node_plan(tmp_path, **extra):
    given = dict(
        {
            "llmops_instances": L20_INSTANCES,
            "monitoring_remote_write_password": SECRET,
            "monitoring_config_dir": str(tmp_path / "etc"),
            "groups": {"llm_monitoring": ["mon"]},
            "hostvars": {"mon": {"ansible_host": "192.0.2.20", "monitoring_server_tls_cert": "/c.pem"}},
            "llmops_models": {"q": {"path": "/home/models/q/model.gguf"}},
        },
        **extra,
    )
    variables = role_vars(NODE_ROLE, **given)
    templar = role_templar(NODE_ROLE, variables)
    name = "Plan the agent's scrape jobs, remote write and key copies"
    variables["_monitoring_plan"] = templar.template(
        task_expression(NODE_ROLE, "plan.yml", name, "_monitoring_plan")
    )
    variables["_monitoring_models_mount"] = templar.template(
        task_expression(NODE_ROLE, "plan.yml", name, "_monitoring_models_mount")
    )
    return variables, role_templar(NODE_ROLE, variables)


def render(templar, role, name):
    with open(os.path.join(role, "templates", name)) as handle:
        return templar.template(handle.read())


def test_the_agent_writes_to_the_monitoring_host_with_key_files_and_passes_promtool(tmp_path):
    variables, templar = node_plan(tmp_path)
    plan = variables["_monitoring_plan"]
    remote = plan["config"]["remote_write"][0]
    assert remote["url"] == "https://192.0.2.20:9090/api/v1/write"
    assert remote["basic_auth"]["password_file"] == str(tmp_path / "etc" / "remote-write.password")
    assert plan["credentials"] == [
        {
            "instance": "qwen36-27b",
            "src": "/etc/llama-server/qwen36-27b.key",
            "dest": str(tmp_path / "etc" / "keys" / "qwen36-27b.key"),
        }
    ]
    assert variables["_monitoring_models_mount"] == "/home"
    text = templar.template("{{ _monitoring_plan.config | to_nice_yaml(indent=2, sort_keys=false) }}")
    assert SECRET not in text and "credentials_file" in text
    if shutil.which("promtool") is None:
        pytest.skip("promtool (Debian: prometheus) is not installed")
    (tmp_path / "etc" / "keys").mkdir(parents=True)
    (tmp_path / "etc" / "remote-write.password").write_text(SECRET)
    (tmp_path / "etc" / "keys" / "qwen36-27b.key").write_text("k")
    (tmp_path / "agent.yml").write_text(text)
    proc = subprocess.run(
        ["promtool", "check", "config", "--agent", str(tmp_path / "agent.yml")],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        universal_newlines=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout


def test_an_explicit_url_wins_and_a_plain_http_host_is_written_to_over_http(tmp_path):
    variables, _templar = node_plan(
        tmp_path, monitoring_remote_write_url="https://mon.example:443/api/v1/write"
    )
    assert (
        variables["_monitoring_plan"]["config"]["remote_write"][0]["url"]
        == "https://mon.example:443/api/v1/write"
    )
    variables, _templar = node_plan(tmp_path, hostvars={"mon": {"ansible_host": "192.0.2.20"}})
    assert (
        variables["_monitoring_plan"]["config"]["remote_write"][0]["url"]
        == "http://192.0.2.20:9090/api/v1/write"
    )


def exec_start(unit):
    return next(line for line in unit.splitlines() if line.startswith("ExecStart="))


def test_units_listen_on_loopback_and_carry_no_secret(tmp_path):
    variables, templar = node_plan(tmp_path)
    exporter = exec_start(render(templar, NODE_ROLE, "llmops-node-exporter.service.j2"))
    assert exporter == (
        "ExecStart=/usr/bin/prometheus-node-exporter --web.listen-address=127.0.0.1:9100 "
        "--collector.textfile.directory=/var/lib/llmops-monitoring/textfile"
    )
    agent = render(templar, NODE_ROLE, "llmops-prometheus-agent.service.j2")
    assert exec_start(agent) == (
        "ExecStart=/usr/bin/prometheus --enable-feature=agent --config.file=%s/agent.yml "
        "--storage.agent.path=/var/lib/llmops-monitoring/agent "
        "--web.listen-address=127.0.0.1:9095" % (tmp_path / "etc")
    )
    assert "User=prometheus" in agent and SECRET not in agent
    collector = exec_start(render(templar, NODE_ROLE, "llmops-gpu-metrics.service.j2"))
    assert collector == (
        "ExecStart=/usr/bin/python3 /usr/local/lib/llmops-monitoring/llmops_gpu_metrics.py --output "
        "/var/lib/llmops-monitoring/textfile/llmops_gpu.prom --state "
        "/var/lib/llmops-monitoring/gpu-collector.json --kmsg /dev/kmsg --timeout 10"
    )
    assert "OnUnitActiveSec=15s" in render(templar, NODE_ROLE, "llmops-gpu-metrics.timer.j2")
    entry = render(templar, NODE_ROLE, "llmops_gpu_metrics.py.j2")
    assert 'sys.path.insert(0, "/usr/local/lib/llmops-monitoring")' in entry
    compile(entry, "llmops_gpu_metrics.py", "exec")


def test_the_dcgm_exporter_image_comes_through_the_mirror_pinned_by_digest(tmp_path):
    _variables, templar = node_plan(tmp_path)
    dcgm = exec_start(render(templar, NODE_ROLE, "llmops-dcgm-exporter.service.j2"))
    assert dcgm.endswith("-p 127.0.0.1:9400:9400 nvcr.io/nvidia/k8s/dcgm-exporter:3.3.9-3.6.1-ubuntu22.04")
    digest = "sha256:" + "0" * 64
    _variables, templar = node_plan(
        tmp_path,
        monitoring_dcgm_exporter_registry="registry.lan:5000/",
        monitoring_dcgm_exporter_digest=digest,
    )
    dcgm = exec_start(render(templar, NODE_ROLE, "llmops-dcgm-exporter.service.j2"))
    assert dcgm.endswith(" registry.lan:5000/nvidia/k8s/dcgm-exporter:3.3.9-3.6.1-ubuntu22.04@" + digest)


def test_el_installs_release_archives(tmp_path):
    variables = role_vars(NODE_ROLE, os_family="RedHat")
    assert variables["_monitoring_install"] == "release" and variables["_monitoring_packaged_units"] == []
    templar = role_templar(NODE_ROLE, variables)
    assert templar.template(variables["monitoring_prometheus_archive_url"]) == (
        "https://github.com/prometheus/prometheus/releases/download/v2.54.1/prometheus-2.54.1.linux-amd64.tar.gz"
    )
    # pinned by default, each the upstream sha256 of its linux-amd64 archive (the role refuses an empty one)
    assert variables["monitoring_prometheus_archive_sha256"] == (
        "31715ef65e8a898d0f97c8c08c03b6b9afe485ac84e1698bcfec90fc6e62924f")
    assert variables["monitoring_node_exporter_archive_sha256"] == (
        "af999fd31ab54ed3a34b9f0b10c28e9acee9ef5ac5a5d5edfdde85437db7acbb")


# --- the monitoring host ----------------------------------------------------------------------------------


SERVER_FLAGS_TASK = "Plan Prometheus' flags and check the basic-auth users"


def server_vars(**extra):
    given = dict(
        {
            "inventory_hostname": "mon",
            "monitoring_server_remote_write_password": SECRET,
            "monitoring_server_alertmanager_receivers": [
                {"name": "ops", "webhook_configs": [{"url": "http://hook.lan/alerts"}]}
            ],
            "groups": {"llm_nodes": ["l20-node-01", "new-node"]},
            "hostvars": {
                "l20-node-01": {"llmops_instances": L20_INSTANCES},
                "new-node": {"serving_instances": [{"name": "tiny", "engine": "vllm"}]},
            },
            "validate_min_decode_tps": {"qwen36-27b": 45},
            "validate_max_ttft_s": 0,
        },
        **extra,
    )
    variables = role_vars(SERVER_ROLE, **given)
    templar = role_templar(SERVER_ROLE, variables)
    # What plan.yml decides before anything changes (Prometheus' flags, checked).
    variables["_monitoring_server_prometheus_args"] = templar.template(task_expression(
        SERVER_ROLE, "plan.yml", SERVER_FLAGS_TASK, "_monitoring_server_prometheus_args"))
    return variables, role_templar(SERVER_ROLE, variables)


def web_config(templar):
    """The web configuration the role writes (the task's own expression)."""
    task = next(
        t
        for t in load_yaml(os.path.join(SERVER_ROLE, "tasks", "prometheus.yml"))
        if t["name"].startswith("Write Prometheus' web configuration")
    )
    return templar.template(task["vars"]["_monitoring_server_web"])


def test_the_web_configuration_holds_bcrypt_hashes_of_both_users_stable_across_runs(tmp_path):
    # password_hash('bcrypt') needs passlib or Python's crypt (gone in 3.13; the controller's venv is 3.11).
    crypt = pytest.importorskip("crypt")
    _variables, templar = server_vars()
    web = web_config(templar)
    users = web["basic_auth_users"]
    assert sorted(users) == ["llmops-agent", "llmops-grafana"]
    for hashed in users.values():
        assert hashed.startswith("$2b$") and crypt.crypt(SECRET, hashed) == hashed
    assert users["llmops-agent"] != users["llmops-grafana"]  # a salt per user
    assert web_config(server_vars()[1]) == web  # a second run changes nothing
    assert "tls_server_config" not in web
    _variables, templar = server_vars(
        monitoring_server_tls_cert="/c.pem",
        monitoring_server_tls_key="/k.pem",
        monitoring_server_query_password="reader-pw",
    )
    web = web_config(templar)
    assert web["tls_server_config"] == {"cert_file": "/c.pem", "key_file": "/k.pem"}
    assert (
        crypt.crypt("reader-pw", web["basic_auth_users"]["llmops-grafana"])
        == web["basic_auth_users"]["llmops-grafana"]
    )
    if shutil.which("promtool"):
        (tmp_path / "web.yml").write_text(yaml.safe_dump(web_config(server_vars()[1])))
        proc = subprocess.run(
            ["promtool", "check", "web-config", str(tmp_path / "web.yml")],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            universal_newlines=True,
            check=False,
        )
        assert proc.returncode == 0, proc.stdout


def test_the_inventory_rules_follow_the_hosts_and_the_validate_gates():
    variables, templar = server_vars()
    name = "Plan the configuration of Prometheus and Alertmanager and the inventory's rules"
    nodes = templar.template(task_expression(SERVER_ROLE, "plan.yml", name, "_monitoring_server_nodes"))
    assert nodes == {
        "l20-node-01": {"qwen36-27b": {"engine": "llama.cpp"}, "qwen36-27b-fp8": {"engine": "vllm"}},
        "new-node": {"tiny": {"engine": "vllm"}},
    }
    variables["_monitoring_server_nodes"] = nodes
    rules = role_templar(SERVER_ROLE, variables).template(
        task_expression(
            SERVER_ROLE,
            "plan.yml",
            "Plan the rules the inventory implies (expected instances, validate gates)",
            "_monitoring_server_inventory_rules",
        )
    )
    assert [g["name"] for g in rules["groups"]] == ["llmops-inventory", "llmops-gates"]
    assert rules["groups"][1]["rules"] == [
        {
            "record": "llmops:gate:min_decode_tps",
            "expr": "vector(45.0)",
            "labels": {"llm_instance": "qwen36-27b"},
        }
    ]


def test_prometheus_and_alertmanager_flags():
    _variables, templar = server_vars()
    args = render(templar, SERVER_ROLE, "prometheus.default.j2")
    for flag in (
        "--web.enable-remote-write-receiver",
        "--web.config.file=/etc/prometheus/llmops-web.yml",
        "--web.listen-address=0.0.0.0:9090",
        "--storage.tsdb.retention.time=30d",
    ):
        assert flag in args
    assert "--web.listen-address=127.0.0.1:9093 --cluster.listen-address=" in render(
        templar, SERVER_ROLE, "alertmanager.default.j2"
    )
    assert SECRET not in args


def test_the_collector_runs_from_the_files_the_role_copies(tmp_path):
    """The node gets only _monitoring_collector_files: the entry point must import from them alone
    (_gpu/smi.py
    imports bounded_run, _gpu/cuda_compat, _gpu/names and validators; a missing one is an ImportError every
    run)."""
    variables = role_vars(NODE_ROLE)
    files = role_templar(NODE_ROLE, variables).template(variables["_monitoring_collector_files"])
    package = tmp_path / "ansible_collections" / "llmops" / "serving" / "plugins" / "module_utils"
    (package / "_gpu").mkdir(parents=True)
    for name in files:
        shutil.copy(os.path.join(ROOT, "plugins", "module_utils", name), str(package / name))
    code = ("import sys; sys.path.insert(0, %r); "
            "from ansible_collections.llmops.serving.plugins.module_utils._gpu import metrics as gpu_metrics;"
            " "
            "print(gpu_metrics.__file__)" % str(tmp_path))
    # -S -I: no site-packages, no PYTHONPATH, so nothing of this checkout's collection is found elsewhere
    proc = subprocess.run(["python3", "-S", "-I", "-c", code], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, universal_newlines=True, check=False, timeout=60)
    assert proc.returncode == 0 and proc.stdout.startswith(str(tmp_path)), proc.stdout
