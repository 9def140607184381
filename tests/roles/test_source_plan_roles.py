# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The roles' `sources` entry points (playbooks/preflight.yml): the list of sources a run fetches from, built
from the settings as preflight builds it (real ansible-playbook on localhost), and what the node has left out.
The probing itself: tests/unit/plugins/module_utils/test_source_plan.py."""
import json
import sys

from tests.helpers import run_local_playbook

ENTRY_POINTS = ("llama_cpp", "model", "vllm", "nvidia_container_toolkit", "nvidia_driver")


def sources(tmp_path, **settings):
    """(name, kind, url, key) of every source the entry points list, and the raw entries."""
    settings = dict({"llama_cpp_build_root": str(tmp_path / "build"),
                     "llama_cpp_install_root": str(tmp_path / "install"),
                     "llmops_gpus": {"driver_version": "550.54.14"}}, **settings)
    (tmp_path / "vars.json").write_text(json.dumps(settings))
    tasks = ["    - ansible.builtin.include_role:\n        name: llmops.serving.%s\n"
             "        tasks_from: sources" % role for role in ENTRY_POINTS]
    (tmp_path / "play.yml").write_text(
        "- hosts: localhost\n  connection: local\n  gather_facts: true\n"
        "  gather_subset: ['!all', '!min', distribution, platform, pkg_mgr]\n  tasks:\n"
        + "\n".join(tasks)
        + "\n    - ansible.builtin.copy:\n        content: '{{ llmops_sources | default([]) | to_json }}'\n"
          "        dest: %s\n        mode: '0600'\n" % (tmp_path / "out.json"))
    result, stats = run_local_playbook(tmp_path / "play.yml", tmp_path,
                                       extra_args=["-e", "@%s" % (tmp_path / "vars.json"),
                                                   "-e", "ansible_python_interpreter=%s" % sys.executable])
    assert result.returncode == 0, result.stdout + result.stderr
    entries = json.loads((tmp_path / "out.json").read_text())
    return [(e["name"], e["kind"], e["url"], e["key"]) for e in entries], entries


def test_sources_are_listed_from_the_settings(tmp_path):
    digest = "sha256:" + "5" * 64
    got, entries = sources(
        tmp_path, llama_cpp_build_mode="container", llama_cpp_cuda_image_registry="registry.lan:5000",
        llama_cpp_runtime_image_digest=digest, llama_cpp_git_repo="https://git.lan/llama.cpp.git",
        model_models=[{"name": "qwen", "repo": "unsloth/Qwen3-GGUF", "filename": "q.gguf"}],
        model_hf_endpoint="https://hf.lan", vllm_runtime="container", vllm_image_registry="registry.lan:5000",
        llmops_gpus={"driver_version": "535.0"}, nvidia_driver_apt_repo_url="https://cuda.lan/debian12/x86_64",
        nvidia_container_toolkit_repo_base_url="https://nct.lan/stable")
    by_name = dict((g[0], g[1:]) for g in got)
    assert by_name["llama.cpp"] == ("git", "https://git.lan/llama.cpp.git", "llama_cpp_git")
    assert by_name["CUDA builder image"] == (
        "image", "registry.lan:5000/nvidia/cuda:12.4.1-devel-ubuntu22.04", "registry")
    assert by_name["CUDA runtime image"] == (
        "image", "registry.lan:5000/nvidia/cuda:12.4.1-runtime-ubuntu22.04@" + digest, "registry")
    assert by_name["ubuntu archive"] == ("apt", "http://archive.ubuntu.com/ubuntu", "ubuntu_apt")
    assert by_name["model qwen"] == ("hf", "https://hf.lan", "hf")
    assert by_name["vLLM image"] == ("image", "registry.lan:5000/vllm/vllm-openai:v0.33.0", "registry")
    assert by_name["nvidia-container-toolkit"][2] == "libnvidia_container"
    assert by_name["nvidia-container-toolkit"][1].startswith("https://nct.lan/stable/")
    # the driver's repository while the loaded driver (535) is not the wanted one
    assert by_name["nvidia-cuda"][2] == "nvidia_cuda"
    assert "llama.cpp web UI" not in by_name                   # llama_cpp_web_ui is off by default

    have = dict((e["name"], e.get("have")) for e in entries)
    assert have["CUDA runtime image"] == {"image": "registry.lan:5000/nvidia/cuda:12.4.1-runtime-ubuntu22.04@"
                                                   + digest}
    assert have["model qwen"]["model"].endswith("/qwen/q.gguf")


def test_a_builder_image_of_the_sites_own_needs_no_ubuntu_archive(tmp_path):
    # NVIDIA's CUDA images lack cmake and git (the builder apt-gets them); a site's own builder may have them
    got, _ = sources(tmp_path, llama_cpp_build_mode="container", llama_cpp_builder_image="site/builder:1",
                     llama_cpp_runtime_image="site/runtime:1")
    names = [g[0] for g in got]
    assert "CUDA builder image" in names and "ubuntu archive" not in names


def test_what_the_node_has_is_not_listed(tmp_path):
    # the loaded driver is the wanted one, the llama.cpp tree is a directory on the node, no models
    tree = tmp_path / "src"
    tree.mkdir()
    (tree / "CMakeLists.txt").write_text("project(llama.cpp)\n")
    got, _ = sources(tmp_path, llama_cpp_source_type="dir", llama_cpp_source_dir=str(tree),
                     llama_cpp_build_mode="host", vllm_runtime="venv", vllm_wheel="/srv/vllm.whl")
    names = [g[0] for g in got]
    assert "nvidia-cuda" not in names and "llama.cpp" not in names and "ubuntu archive" not in names
    assert "pip index" not in names                            # a wheel, not the package index
    assert names == ["nvidia-container-toolkit"]


def test_the_web_ui_and_the_pip_index_are_listed_when_used(tmp_path):
    got, _ = sources(tmp_path, llama_cpp_web_ui=True, llama_cpp_build_mode="host", vllm_runtime="venv",
                     vllm_index_url="https://pypi.lan/simple")
    by_name = dict((g[0], g[1:]) for g in got)
    assert by_name["llama.cpp web UI"] == ("binary", "https://huggingface.co/", "")
    assert by_name["pip index"] == ("pypi", "https://pypi.lan/simple", "pypi")


def test_the_yum_repositories_the_collection_adds_do_not_take_the_box_hostage():
    """Docker CE, the container toolkit and NVIDIA's CUDA repository (packages_common repo-RedHat): a mirror
    out of reach later must not fail every yum command on the node."""
    import os

    from tests.helpers import ROOT, load_yaml
    tasks = load_yaml(os.path.join(ROOT, "roles", "packages_common", "tasks", "repo-RedHat.yml"))
    from tests.roles.test_nvidia_driver import flat_tasks
    (repo,) = [t["ansible.builtin.yum_repository"] for t in flat_tasks(tasks)
               if "ansible.builtin.yum_repository" in t]
    assert repo["skip_if_unavailable"] is True and repo["enabled"] is True


def test_with_a_bundle_of_packages_the_repository_steps_add_nothing_and_without_one_they_do():
    """packages_common repo-Debian/repo-RedHat: an offline bundle holding package repositories makes every
    step that would add a repository (a key download, a list or repo file) skip; without one (or a bundle
    without packages) they run as before."""
    import os

    from tests.helpers import ROOT, load_yaml, role_templar
    from tests.roles.test_nvidia_driver import flat_tasks
    role_dir = os.path.join(ROOT, "roles", "packages_common")
    defaults = load_yaml(os.path.join(role_dir, "defaults", "main.yml"))
    bundles = {"bundle": {"packages": [{"name": "packages/debian12"}]}, "none": {},
               "bundle without packages": {"packages": [], "entries": ["models/x"]}}
    for tasks_file, adds in (("repo-Debian.yml", ("ansible.builtin.get_url", "ansible.builtin.copy")),
                             ("repo-RedHat.yml", ("ansible.builtin.yum_repository",))):
        top = load_yaml(os.path.join(role_dir, "tasks", tasks_file))
        (block,) = [t for t in top if "block" in t]
        assert [m for t in flat_tasks(block["block"]) for m in adds if m in t], tasks_file
        outside = [m for t in top if "block" not in t for m in adds if m in t]
        assert not outside, "a repository step outside the block"
        for label, bundle in bundles.items():
            templar = role_templar(role_dir, dict(defaults, packages_common_source_bundle=bundle))
            runs = templar.template("{{ %s }}" % block["when"])
            assert runs is (label != "bundle"), (tasks_file, label)
