# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Disk: Docker's data-root, the build root and the ccache are inventory variables (l20 puts them on /home,
where the box has its space; CentOS 7's / is 50 GB), Docker's data-root gets /var/lib/docker's SELinux labels,
and preflight refuses with the numbers before anything is installed or downloaded. The preflight's own tasks
(role llama_cpp's disk entry point, then the disk_space_info check) run here for real."""

import os
import sys

import yaml

from tests.helpers import ROOT, load_yaml, run_local_playbook
from tests.roles.test_nvidia_driver import EL7_FACTS, RoleRenderer, flat_tasks

L20 = os.path.join(ROOT, "inventories", "l20", "group_vars", "l20", "main.yml")
PREFLIGHT = os.path.join(ROOT, "playbooks", "preflight.yml")


def test_the_l20_inventory_writes_to_home():
    inventory = load_yaml(L20)
    assert inventory["nvidia_container_toolkit_docker_data_root"] == "/home/docker"
    assert inventory["llama_cpp_build_root"].startswith("/home/")
    assert inventory["llama_cpp_ccache_dir"].startswith("/home/")
    assert inventory["l20_models_dir"].startswith("/home/")


def toolkit(**extra):
    return RoleRenderer("nvidia_container_toolkit", EL7_FACTS, "RedHat.yml", **extra)


def test_the_data_root_is_merged_into_daemon_json_with_the_registry_mirrors():
    r = toolkit(nvidia_container_toolkit_docker_data_root="/home/docker/",
                nvidia_container_toolkit_daemon_options={"registry-mirrors": ["https://hub.lan"]},
                # {"runtimes": {}}
                _nvidia_container_toolkit_daemon_raw={"content": "eyJydW50aW1lcyI6IHt9fQ=="})
    assert r.var("_nvidia_container_toolkit_daemon_desired") == {
        "runtimes": {}, "registry-mirrors": ["https://hub.lan"], "data-root": "/home/docker"}
    assert "data-root" not in toolkit(_nvidia_container_toolkit_daemon_raw={"content": ""}).var(
        "_nvidia_container_toolkit_daemon_desired")


def test_selinux_gets_the_docker_equivalence_only_when_missing():
    listing = "SELinux Local fcontext Equivalence \n\n/home/docker = /var/lib/docker\n"
    have = toolkit(nvidia_container_toolkit_docker_data_root="/home/docker",
                   _nvidia_container_toolkit_semanage_local={"stdout_lines": listing.splitlines()})
    assert have.var("_nvidia_container_toolkit_selinux_equal") is True
    other = toolkit(nvidia_container_toolkit_docker_data_root="/srv/docker",
                    _nvidia_container_toolkit_semanage_local={"stdout_lines": listing.splitlines()})
    assert other.var("_nvidia_container_toolkit_selinux_equal") is False
    tasks = list(flat_tasks(other.tasks("data-root.yml")))
    block = next(t for t in other.tasks("data-root.yml") if "block" in t)
    assert "selinux" in block["when"] and "enabled" in block["when"]
    add = next(t for t in tasks if "-e" in str(t.get("ansible.builtin.command", {})))
    assert other.expr(add["ansible.builtin.command"]["argv"]) == [
        "semanage", "fcontext", "-a", "-e", "/var/lib/docker", "/srv/docker"]
    relabel = next(t for t in tasks if "restorecon" in str(t.get("ansible.builtin.command", {})))
    assert other.expr(relabel["ansible.builtin.command"]["argv"]) == ["restorecon", "-R", "/srv/docker"]
    main = toolkit().tasks("main.yml")
    names = [t.get("ansible.builtin.include_tasks") or t.get("ansible.builtin.import_tasks") for t in main]
    assert names.index("data-root.yml") < names.index("daemon.yml")


def test_preflight_checks_the_disk_after_reading_the_model_sizes():
    tasks = load_yaml(PREFLIGHT)[0]["tasks"]
    order = [str(t.get("ansible.builtin.include_role", {}).get("tasks_from")
                 or next(k for k in t if k.startswith(("ansible.", "llmops.")))) for t in tasks]
    # the build's and the images' writes are counted before the models' read (which reads whether they are
    # there already), the models' sizes after it, and the check weighs them all
    assert order.index("disk") < order.index("headers") < order.index("llmops.serving.disk_space_info")
    check = tasks[order.index("llmops.serving.disk_space_info")]
    assert check["llmops.serving.disk_space_info"]["writes"] == "{{ llmops_disk_writes }}"
    assert check["check_mode"] is False


def run_preflight_disk(tmp_path, build_gib, with_build=False):
    install_root = tmp_path / "opt" / "llama.cpp"
    if with_build:
        (install_root / "builds" / "b1").mkdir(parents=True)
        os.symlink(str(install_root / "builds" / "b1"), str(install_root / "current"))
    model_write = {"path": str(tmp_path / "models" / "qwen"), "bytes": 19 * 1024 ** 3,
                   "what": "model qwen3.6-27b-ud-q5_k_xl", "variable": "model_dir"}
    play = [{"hosts": "localhost", "gather_facts": True, "connection": "local",
             "vars": {"llama_cpp_build_root": str(tmp_path / "build"),
                      "llama_cpp_install_root": str(install_root),
                      "llama_cpp_ccache": True, "llama_cpp_ccache_dir": str(tmp_path / "ccache"),
                      "llama_cpp_build_mode": "container",
                      "llmops_docker_data_root": str(tmp_path / "docker"),
                      "llama_cpp_disk_build_gib": build_gib},
             "tasks": [
                 {"ansible.builtin.set_fact": {"llmops_disk_writes": [model_write]}},
                 {"ansible.builtin.include_role": {"name": "llmops.serving.llama_cpp", "tasks_from": "disk"}},
                 {"llmops.serving.disk_space_info": {"writes": "{{ llmops_disk_writes }}", "candidates": [],
                                                "reserve": "0"}, "register": "disk"},
                 {"ansible.builtin.debug": {
                     "msg": "{{ disk.filesystems | map(attribute='writes') | flatten | map(attribute='what') "
                            "| list }}"}},
                 {"ansible.builtin.debug": {
                     "msg": "already there: {{ disk.already_there | join(' + ') }}"}}]}]
    path = tmp_path / "play.yml"
    path.write_text(yaml.safe_dump(play))
    return run_local_playbook(path, str(tmp_path),
                              extra_args=["-e", "ansible_python_interpreter=%s" % sys.executable])


def test_preflight_refuses_a_filesystem_the_run_would_fill_with_the_numbers(tmp_path):
    result, stats = run_preflight_disk(tmp_path, build_gib=100 * 1024 ** 2)  # 100 PiB: no disk has that
    assert result.returncode != 0 and stats["failed"] == 1
    out = " ".join(result.stdout.split())
    assert "Not enough disk space for this run: " in out
    assert "free, the run writes ~" in out and "llama.cpp build ~100.0 PiB (%s/build)" % tmp_path in out
    assert "model qwen3.6-27b-ud-q5_k_xl ~19.0 GiB" in out and "ccache ~9.3 GiB" in out
    assert "CUDA and llama.cpp images ~16.0 GiB (%s/docker)" % tmp_path in out
    assert ("set llama_cpp_build_root, llama_cpp_ccache_dir, model_dir, "
            "nvidia_container_toolkit_docker_data_root") in out


def test_a_node_with_a_build_counts_no_build_and_passes(tmp_path):
    result, stats = run_preflight_disk(tmp_path, build_gib=100 * 1024 ** 2, with_build=True)
    assert result.returncode == 0, result.stdout
    assert "- model qwen3.6-27b-ud-q5_k_xl\n    - ccache\n" in result.stdout, result.stdout
    assert "- llama.cpp build" not in result.stdout
    # the build and its images are left out by disk_space_info itself (unless_exists), in the same call
    assert "already there: llama.cpp build + CUDA and llama.cpp images" in result.stdout
