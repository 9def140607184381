# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Role llmops.serving.nvidia_container_toolkit: EL 7 / Debian variables and templates rendered with
Ansible's Templar, the daemon.json merge expressions of vars/main.yml, and the fake nvidia-ctk that the
Molecule scenario packages (tests/fixtures/apt_repo)."""

import base64
import json
import os
import shutil
import subprocess
import sys

import pytest

from tests.helpers import run_local_playbook
from tests.roles.test_nvidia_driver import DEBIAN_FACTS, EL7_FACTS, ROOT, RoleRenderer, packages_common

FAKE_CTK = os.path.join(ROOT, "tests", "fixtures", "apt_repo", "nvidia-ctk")
BUILD_REPO = os.path.join(ROOT, "tests", "fixtures", "apt_repo", "build-repo.sh")


def el7(**extra):
    return RoleRenderer("nvidia_container_toolkit", EL7_FACTS, "RedHat.yml", **extra)


def debian(**extra):
    return RoleRenderer("nvidia_container_toolkit", DEBIAN_FACTS, "Debian.yml", **extra)


def daemon_raw(text):
    return {"content": base64.b64encode(text.encode()).decode()}


def merge(text, **extra):
    """(current, desired, runtime_missing) as the role computes them from daemon.json text."""
    r = debian(_nvidia_container_toolkit_daemon_raw=daemon_raw(text) if text is not None else {}, **extra)
    return (
        r.var("_nvidia_container_toolkit_daemon_current"),
        r.var("_nvidia_container_toolkit_daemon_desired"),
        r.var("_nvidia_container_toolkit_runtime_missing"),
    )


def run_ctk(config, *args, log=None):
    env = dict(os.environ, FAKE_NVIDIA_CTK_LOG=log or os.devnull)
    return subprocess.run(
        [sys.executable, FAKE_CTK, "runtime", "configure", "--runtime=docker", "--config=%s" % config]
        + list(args),
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )


# --- packages and repositories ---------------------------------------------------------------------


def test_el7_docker_ce_and_containerd_are_pinned_to_the_last_el7_release():
    r = el7()
    assert r.var("_nvidia_container_toolkit_docker_packages") == [
        "docker-ce-26.1.4",
        "docker-ce-cli-26.1.4",
        "containerd.io-1.6.33",
    ]


def test_el7_toolkit_packages_share_one_version():
    r = el7(nvidia_container_toolkit_version="1.17.5")
    assert r.var("_nvidia_container_toolkit_packages") == [
        "nvidia-container-toolkit-1.17.5",
        "nvidia-container-toolkit-base-1.17.5",
        "libnvidia-container-tools-1.17.5",
        "libnvidia-container1-1.17.5",
    ]
    assert el7().var("nvidia_container_toolkit_version") == "1.17.8"
    locks = r.var("_nvidia_container_toolkit_lock_names")
    assert {"docker-ce", "docker-ce-cli", "containerd.io", "nvidia-container-toolkit"} <= set(locks)


def test_el7_repositories_use_the_base_url_variables():
    r = el7(
        nvidia_container_toolkit_repo_base_url="http://mirror.lan/libnvidia-container/stable",
        nvidia_container_toolkit_docker_ce_repo_url="http://mirror.lan/docker-ce/7/$basearch/stable",
    )
    repos = {repo["name"]: repo for repo in packages_common(r, "setup-RedHat.yml", "repo-RedHat")
             .var("packages_common_yum_repos")}
    assert list(repos) == ["docker-ce-stable", "nvidia-container-toolkit"]
    assert repos["nvidia-container-toolkit"]["gpgcheck"] is False
    no_docker = packages_common(el7(nvidia_container_toolkit_docker_install=False), "setup-RedHat.yml",
                                "repo-RedHat")
    names = [repo["name"] for repo in no_docker.var("packages_common_yum_repos")]
    assert names == ["nvidia-container-toolkit"]
    assert repos["docker-ce-stable"]["baseurl"] == "http://mirror.lan/docker-ce/7/$basearch/stable"
    assert (
        repos["nvidia-container-toolkit"]["baseurl"]
        == "http://mirror.lan/libnvidia-container/stable/rpm/$basearch"
    )
    assert repos["nvidia-container-toolkit"]["repo_gpgcheck"] is True
    default = el7()
    assert (
        default.var("nvidia_container_toolkit_docker_ce_repo_url")
        == "https://download.docker.com/linux/centos/7/$basearch/stable"
    )


def test_debian_uses_docker_io_and_version_pinned_toolkit():
    r = debian()
    assert r.var("_nvidia_container_toolkit_docker_packages") == ["docker.io"]
    assert r.var("_nvidia_container_toolkit_packages") == [
        "nvidia-container-toolkit=1.17.8-*",
        "nvidia-container-toolkit-base=1.17.8-*",
        "libnvidia-container-tools=1.17.8-*",
        "libnvidia-container1=1.17.8-*",
    ]
    assert "docker.io" not in r.var("_nvidia_container_toolkit_lock_names")


@pytest.mark.parametrize(
    "trusted,expected",
    [
        (
            False,
            "deb [signed-by=/etc/apt/keyrings/nvidia-container-toolkit.asc] "
            "http://m.lan/stable/deb/$(ARCH) /",
        ),
        (True, "deb [trusted=yes] http://m.lan/stable/deb/$(ARCH) /"),
    ],
)
def test_debian_repository_line(trusted, expected):
    r = debian(
        nvidia_container_toolkit_repo_base_url="http://m.lan/stable",
        nvidia_container_toolkit_apt_repo_trusted=trusted,
    )
    text = packages_common(r, "setup-Debian.yml", "repo-Debian").template("apt-source.list.j2")
    assert text.startswith("# Managed by Ansible (llmops.serving.nvidia_container_toolkit)\n")
    lines = [x for x in text.splitlines() if x.startswith("deb ")]
    assert lines == [expected]


# --- daemon.json decisions ---------------------------------------------------------------------------


def test_absent_or_empty_daemon_json_needs_the_runtime():
    for text in (None, "", "  \n"):
        current, desired, missing = merge(text)
        assert current == {} and desired == {} and missing is True


def test_existing_settings_survive_and_runtime_presence_is_detected():
    text = json.dumps(
        {
            "registry-mirrors": ["https://mirror.lan"],
            "log-opts": {"max-size": "10m"},
            "runtimes": {"nvidia": {"path": "nvidia-container-runtime", "args": []}},
        }
    )
    current, desired, missing = merge(text)
    assert missing is False
    assert desired == current == json.loads(text)


def test_other_runtimes_do_not_count_as_nvidia():
    _, _, missing = merge(json.dumps({"runtimes": {"runsc": {"path": "/usr/bin/runsc"}}}))
    assert missing is True


def test_options_merge_recursively_and_lists_gain_items_once():
    text = json.dumps(
        {"registry-mirrors": ["https://a.lan"], "log-opts": {"max-size": "10m"}, "debug": False}
    )
    options = {"registry-mirrors": ["https://a.lan", "https://b.lan"], "log-opts": {"max-file": "3"}}
    current, desired, _ = merge(
        text, nvidia_container_toolkit_daemon_options=options, nvidia_container_toolkit_default_runtime=True
    )
    assert desired == {
        "registry-mirrors": ["https://a.lan", "https://b.lan"],
        "log-opts": {"max-size": "10m", "max-file": "3"},
        "debug": False,
        "default-runtime": "nvidia",
    }
    # second run: the merged file merges to itself (no write, no restart)
    again_current, again_desired, _ = merge(
        json.dumps(desired),
        nvidia_container_toolkit_daemon_options=options,
        nvidia_container_toolkit_default_runtime=True,
    )
    assert again_desired == again_current


def test_invalid_daemon_json_is_not_a_mapping():
    r = debian(_nvidia_container_toolkit_daemon_raw=daemon_raw("[1, 2]"))
    assert r.expr("{{ _nvidia_container_toolkit_daemon_current is mapping }}") is False


def test_merge_write_is_gated_by_a_comparison_and_notifies_the_restart():
    tasks = debian().tasks("daemon.yml")
    write = next(t for t in tasks if "ansible.builtin.copy" in t)
    assert (
        write["when"]
        == "_nvidia_container_toolkit_daemon_desired != _nvidia_container_toolkit_daemon_current"
    )
    assert write["notify"] == "Restart the Docker engine"
    ctk = next(t for t in tasks if "ansible.builtin.command" in t)
    assert ctk["when"] == "_nvidia_container_toolkit_runtime_missing | bool"
    assert ctk["notify"] == "Restart the Docker engine"
    assert "--runtime=docker" in ctk["ansible.builtin.command"]["argv"]


# --- the fake nvidia-ctk (test double packaged into the Molecule apt repository) -----------------------


def test_fake_ctk_adds_the_runtime_once_and_keeps_other_settings(tmp_path):
    config = tmp_path / "daemon.json"
    config.write_text(
        json.dumps({"registry-mirrors": ["https://mirror.lan"], "insecure-registries": ["r:5000"]})
    )
    log = str(tmp_path / "ctk.log")
    first = run_ctk(str(config), log=log)
    assert first.returncode == 0, first.stderr
    assert "Wrote updated config to %s" % config in first.stderr
    data = json.loads(config.read_text())
    assert data == {
        "registry-mirrors": ["https://mirror.lan"],
        "insecure-registries": ["r:5000"],
        "runtimes": {"nvidia": {"args": [], "path": "nvidia-container-runtime"}},
    }
    written = config.read_text()
    assert written.startswith('{\n    "insecure-registries"')  # sorted keys, 4-space indent, as Go writes
    second = run_ctk(str(config), log=log)
    assert second.returncode == 0 and config.read_text() == written
    with open(log) as fh:
        assert len(fh.read().splitlines()) == 2
    # after nvidia-ctk the role sees nothing missing and nothing to merge
    current, desired, missing = merge(written)
    assert missing is False and desired == current


def test_fake_ctk_creates_a_missing_file_and_sets_default(tmp_path):
    config = tmp_path / "docker" / "daemon.json"
    result = run_ctk(str(config), "--set-as-default")
    assert result.returncode == 0, result.stderr
    assert json.loads(config.read_text())["default-runtime"] == "nvidia"


def test_fake_ctk_refuses_invalid_json_and_other_runtimes(tmp_path):
    config = tmp_path / "daemon.json"
    config.write_text("{not json")
    result = run_ctk(str(config))
    assert result.returncode == 1 and "unable to load config" in result.stderr
    assert config.read_text() == "{not json"
    other = subprocess.run(
        [sys.executable, FAKE_CTK, "runtime", "configure", "--runtime=podman", "--config=%s" % config],
        capture_output=True,
        text=True,
        env=dict(os.environ, FAKE_NVIDIA_CTK_LOG=os.devnull),
        check=False,
    )
    assert other.returncode == 1 and "unrecognized runtime" in other.stderr


@pytest.mark.skipif(shutil.which("dpkg-deb") is None, reason="needs dpkg-deb (Debian/Ubuntu)")
def test_fixture_repo_builds_flat_indexes_with_pinned_versions(tmp_path):
    out = tmp_path / "repo"
    subprocess.run(
        ["bash", BUILD_REPO, str(out), "--kernel-headers", "6.1.0-99-amd64"], check=True, capture_output=True
    )
    arch = subprocess.run(
        ["dpkg", "--print-architecture"], capture_output=True, text=True, check=True
    ).stdout.strip()
    index = (out / "libnvidia-container" / "stable" / "deb" / arch / "Packages").read_text()
    stanzas = [
        dict(line.split(": ", 1) for line in s.splitlines() if ": " in line and not line.startswith(" "))
        for s in index.strip().split("\n\n")
    ]
    assert {s["Package"]: s["Version"] for s in stanzas} == {
        "nvidia-container-toolkit": "1.17.8-1",
        "nvidia-container-toolkit-base": "1.17.8-1",
        "libnvidia-container-tools": "1.17.8-1",
        "libnvidia-container1": "1.17.8-1",
    }
    for s in stanzas:
        assert (out / "libnvidia-container" / "stable" / "deb" / arch / s["Filename"]).exists()
    base = next(s for s in stanzas if s["Package"] == "nvidia-container-toolkit-base")
    listing = subprocess.run(
        ["dpkg-deb", "-c", str(out / "libnvidia-container" / "stable" / "deb" / arch / base["Filename"])],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "./usr/bin/nvidia-ctk" in listing
    cuda = (out / "cuda" / "debian12" / "x86_64" / "Packages").read_text()
    assert "Package: cuda-drivers-550\nVersion: 550.54.14-1" in cuda
    assert (out / "kernel" / "linux-headers-6.1.0-99-amd64_6.1.0-99-amd64_all.deb").exists()


# --- the daemon.json tasks run for real (connection local) with the fake nvidia-ctk on PATH -------------



def run_daemon_tasks(tmp_path, extra_vars=""):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    shutil.copy(FAKE_CTK, bin_dir / "nvidia-ctk")
    (bin_dir / "nvidia-ctk").chmod(0o755)
    play = tmp_path / "play.yml"
    play.write_text(
        "- hosts: localhost\n  gather_facts: false\n  connection: local\n  tasks:\n"
        "    - ansible.builtin.include_role:\n"
        "        name: llmops.serving.nvidia_container_toolkit\n        tasks_from: daemon.yml\n"
        "      vars:\n"
        "        nvidia_container_toolkit_daemon_json: %s\n"
        "        nvidia_container_toolkit_docker_service_manage: false\n%s"
        % (tmp_path / "etc" / "docker" / "daemon.json", extra_vars)
    )
    result, stats = run_local_playbook(
        play, bin_dir, extra_env={"FAKE_NVIDIA_CTK_LOG": str(tmp_path / "ctk.log")},
        extra_args=["-e", "ansible_python_interpreter=%s" % sys.executable])
    return result, stats.get("changed")


@pytest.mark.skipif(os.geteuid() != 0, reason="the tasks create root-owned files")
def test_daemon_tasks_merge_once_then_change_nothing(tmp_path):
    config = tmp_path / "etc" / "docker" / "daemon.json"
    config.parent.mkdir(parents=True)
    config.write_text('{"registry-mirrors": ["https://mirror.lan"], "log-opts": {"max-size": "50m"}}\n')
    options = '        nvidia_container_toolkit_daemon_options: {"log-opts": {"max-file": "3"}}\n'
    first, changed = run_daemon_tasks(tmp_path, options)
    assert first.returncode == 0, first.stdout + first.stderr
    assert changed == 2  # nvidia-ctk, then the merge of the role's options
    data = json.loads(config.read_text())
    assert data == {
        "registry-mirrors": ["https://mirror.lan"],
        "log-opts": {"max-size": "50m", "max-file": "3"},
        "runtimes": {"nvidia": {"args": [], "path": "nvidia-container-runtime"}},
    }
    second, changed = run_daemon_tasks(tmp_path, options)
    assert second.returncode == 0 and changed == 0, second.stdout
    assert len((tmp_path / "ctk.log").read_text().splitlines()) == 1


@pytest.mark.skipif(os.geteuid() != 0, reason="the tasks create root-owned files")
def test_daemon_tasks_refuse_a_broken_daemon_json(tmp_path):
    config = tmp_path / "etc" / "docker" / "daemon.json"
    config.parent.mkdir(parents=True)
    config.write_text('{"registry-mirrors": [')
    result, _ = run_daemon_tasks(tmp_path)
    assert result.returncode != 0
    assert "is not a JSON object, so it cannot be merged" in result.stdout
    assert config.read_text() == '{"registry-mirrors": ['
    assert not (tmp_path / "ctk.log").exists()
