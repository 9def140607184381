# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Every pull of the L20 path through the one mirrors file: Docker's registry-mirrors reach the merged
daemon.json, the CUDA bases are pinned by digest, the builder's apt-get takes an Ubuntu mirror, no pip step
remains (nothing on the node uses the Docker SDK), and the driver's failure names every EPEL package it
needs."""

import base64
import glob
import json
import os
import re
import subprocess

from tests.helpers import ROOT, load_yaml, role_templar
from tests.roles.test_llama_cpp_role import render
from tests.roles.test_nvidia_driver import EL7_FACTS, RoleRenderer, flat_tasks

INVENTORY = os.path.join(ROOT, "inventories", "l20", "group_vars", "l20")
MIRRORS = os.path.join(INVENTORY, "mirrors.yml")
# What the CUDA 12.4.1 devel image (Ubuntu 22.04) has in /etc/apt/sources.list (comments left out).
JAMMY_SOURCES = """deb http://archive.ubuntu.com/ubuntu/ jammy main restricted
deb http://archive.ubuntu.com/ubuntu/ jammy-updates main restricted
deb http://security.ubuntu.com/ubuntu/ jammy-security main restricted
"""


def fed(name, mirrors):
    expression = load_yaml(MIRRORS)[name]
    return role_templar(os.path.join(ROOT, "roles"), {"llmops_mirrors": mirrors}).template(expression)


def dockerfile(**extra):
    variables = load_yaml(os.path.join(ROOT, "roles", "llama_cpp", "defaults", "main.yml"))
    variables.update(extra)
    variables.update(_llama_cpp_plan={"build_id": "b0", "cuda_architectures": "89"}, _llama_cpp_build_id="b0",
                     _llama_cpp_source_label="git@0c1e570")
    return render("Dockerfile.j2", variables)


def test_the_builder_apt_get_goes_through_the_ubuntu_mirror(tmp_path):
    assert fed("llama_cpp_builder_apt_mirror", {"ubuntu_apt": "https://mirrors.example.cn/ubuntu/"}) == \
        "https://mirrors.example.cn/ubuntu/"
    assert fed("llama_cpp_builder_apt_mirror", {}) == ""
    text = dockerfile(llama_cpp_builder_apt_mirror="https://mirrors.example.cn/ubuntu/")
    sed = re.search(r"sed -i -E '([^']+)'", text).group(1)
    assert "rm -f /etc/apt/sources.list.d/cuda*.list" in text
    assert text.index(sed) < text.index("apt-get update")
    sources = tmp_path / "sources.list"
    sources.write_text(JAMMY_SOURCES)
    subprocess.run(["sed", "-i", "-E", sed, str(sources)], check=True)
    assert sources.read_text() == JAMMY_SOURCES.replace("http://archive.ubuntu.com/ubuntu/",
                                                        "https://mirrors.example.cn/ubuntu/").replace(
        "http://security.ubuntu.com/ubuntu/", "https://mirrors.example.cn/ubuntu/")
    assert "sed -i" not in dockerfile() and "cuda*.list" not in dockerfile()


def test_docker_hub_mirrors_reach_the_merged_daemon_json():
    options = fed("nvidia_container_toolkit_daemon_options", {"docker_hub_mirrors": ["https://hub.example.cn"]})
    current = base64.b64encode(json.dumps({"registry-mirrors": ["https://old.example.cn"]}).encode()).decode()
    r = RoleRenderer("nvidia_container_toolkit", EL7_FACTS, "RedHat.yml",
                     nvidia_container_toolkit_daemon_options=options,
                     _nvidia_container_toolkit_daemon_raw={"content": current})
    assert r.var("_nvidia_container_toolkit_daemon_desired")["registry-mirrors"] == [
        "https://old.example.cn", "https://hub.example.cn"]


def test_the_cuda_bases_are_pinned_by_digest_and_through_the_site_registry():
    inventory = load_yaml(os.path.join(INVENTORY, "main.yml"))
    for name in ("llama_cpp_builder_image_digest", "llama_cpp_runtime_image_digest"):
        assert re.match(r"^sha256:[0-9a-f]{64}$", inventory[name]), name
    variables = load_yaml(os.path.join(ROOT, "roles", "llama_cpp", "defaults", "main.yml"))
    for name in ("llama_cpp_builder_image_digest", "llama_cpp_runtime_image_digest"):
        variables[name] = inventory[name]
    variables["llama_cpp_cuda_image_registry"] = fed("llama_cpp_cuda_image_registry",
                                                     {"registry": "registry.cn:5000"})
    templar = role_templar(os.path.join(ROOT, "roles", "llama_cpp"), variables)
    assert templar.template(variables["llama_cpp_builder_image"]) == (
        "registry.cn:5000/nvidia/cuda:12.4.1-devel-ubuntu22.04@"
        + inventory["llama_cpp_builder_image_digest"])


def test_no_pip_step_and_no_docker_sdk_user_on_the_node():
    for path in glob.glob(os.path.join(ROOT, "roles", "*", "tasks", "*.yml")):
        for task in flat_tasks(load_yaml(path) or []):
            modules = [k for k in task if k.startswith(("ansible.", "community.", "llmops."))]
            assert not [m for m in modules if m.startswith("community.docker.")], path
            if "nvidia_container_toolkit" in path:
                assert "ansible.builtin.pip" not in modules, path


def test_the_driver_failure_names_every_epel_package():
    r = RoleRenderer("nvidia_driver", EL7_FACTS, "RedHat.yml",
                     ansible_failed_result={"msg": "No package dkms"})
    block = next(t for t in r.tasks("setup-RedHat.yml") if "block" in t)
    msg = " ".join(r.expr(block["rescue"][0]["ansible.builtin.fail"]["msg"]).split())
    assert "needs these EPEL 7 packages: dkms, ocl-icd, opencl-filesystem" in msg
    assert "llmops_mirrors.epel_archive" in msg
