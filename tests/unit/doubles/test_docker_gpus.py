# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""tests/fixtures/fake_vllm/docker-gpus: the stand-in for the NVIDIA container runtime (molecule/vllm)."""
import importlib.machinery
import importlib.util
import json
import os
import subprocess
import sys

from tests.helpers import FIXTURES

SHIM = os.path.join(FIXTURES, "fake_vllm", "docker-gpus")


def load_shim():
    loader = importlib.machinery.SourceFileLoader("docker_gpus", SHIM)
    spec = importlib.util.spec_from_loader("docker_gpus", loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def test_gpus_become_nvidia_visible_devices():
    args = ["run", "--rm", "--gpus", '"device=2,3"', "--env-file", "/e", "img", "--port", "1"]
    assert load_shim().translate(args) == [
        "run", "--rm", "-e", "NVIDIA_VISIBLE_DEVICES=2,3", "--env-file", "/e", "img", "--port", "1"]


def test_gpus_get_the_host_driver_libraries_where_cuda_images_look():
    """As the NVIDIA runtime gives a GPU container the host's libcuda.so.1; a run without --gpus gets none."""
    shim = load_shim()
    assert shim.translate(["run", "--gpus", "all", "img"], "/usr/lib/llmops-test/driver") == [
        "run", "-e", "NVIDIA_VISIBLE_DEVICES=all",
        "-v", "/usr/lib/llmops-test/driver:/usr/local/nvidia/lib64:ro", "img"]
    assert shim.translate(["run", "--rm", "img"], "/usr/lib/llmops-test/driver") == ["run", "--rm", "img"]


def test_driver_libraries_come_from_the_nodes_setting(tmp_path, monkeypatch):
    shim = load_shim()
    monkeypatch.setenv("DOCKER_GPUS_DRIVER_LIBS", str(tmp_path))
    assert shim._driver_libs() == str(tmp_path)
    monkeypatch.setenv("DOCKER_GPUS_DRIVER_LIBS", str(tmp_path / "missing"))
    assert shim._driver_libs() is None
    monkeypatch.setenv("DOCKER_GPUS_DRIVER_LIBS", "")
    assert shim._driver_libs() is None


def test_runs_are_logged_and_passed_on(tmp_path):
    real = tmp_path / "docker"
    real.write_text("#!/bin/sh\nprintf '%s\\n' \"$@\"\n")
    real.chmod(0o755)
    log = tmp_path / "runs.jsonl"
    env = dict(os.environ, DOCKER_GPUS_REAL=str(real), DOCKER_GPUS_LOG=str(log), DOCKER_GPUS_DRIVER_LIBS="")
    out = subprocess.check_output([sys.executable, SHIM, "run", "--gpus", '"device=0"', "img"], env=env)
    assert out.decode().split() == ["run", "-e", "NVIDIA_VISIBLE_DEVICES=0", "img"]
    assert json.loads(log.read_text()) == ["run", "--gpus", '"device=0"', "img"]
    out = subprocess.check_output([sys.executable, SHIM, "rm", "-f", "c"], env=env)
    assert out.decode().split() == ["rm", "-f", "c"]
    assert len(log.read_text().splitlines()) == 1


def test_bind_mount_sources_are_mapped_to_the_host_path():
    shim = load_shim()
    path_map = [("/", "/var/lib/docker/overlay2/abc/merged"),
                ("/home/llmops/ccache", "/root/.cache/ci/ccache")]
    path_map = sorted(path_map, key=lambda pair: -len(pair[0]))
    args = ["run", "--rm", "--name", "x", "--network", "host", "-v", "/home/models/q:/models:ro",
            "--volume=/home/llmops/ccache:/home/llmops/ccache", "-e", "A=-v",
            "--mount", "type=bind,source=/etc/k,target=/run/k,readonly", "-v", "named:/data",
            "img", "-v", "/not/a/mount:/x"]
    assert shim.map_volumes(args, path_map) == [
        "run", "--rm", "--name", "x", "--network", "host",
        "-v", "/var/lib/docker/overlay2/abc/merged/home/models/q:/models:ro",
        "--volume=/root/.cache/ci/ccache:/home/llmops/ccache", "-e", "A=-v",
        "--mount", "type=bind,source=/var/lib/docker/overlay2/abc/merged/etc/k,target=/run/k,readonly",
        "-v", "named:/data", "img", "-v", "/not/a/mount:/x"]
    # Other commands, and runs without a map, are passed on unchanged.
    assert shim.map_volumes(["build", "-v", "/a:/b"], path_map) == ["build", "-v", "/a:/b"]
    assert shim.map_volumes(args, []) == args


def test_the_path_map_file_is_read_longest_prefix_first(tmp_path):
    path = tmp_path / "map"
    path.write_text(json.dumps([["/", "/h/root/"], ["/home/llmops/ccache/", "/c"]]))
    shim = load_shim()
    path_map = shim.load_path_map(str(path))
    assert path_map == [("/home/llmops/ccache", "/c"), ("/", "/h/root")]
    assert shim.host_path("/home/llmops/ccache/x", path_map) == "/c/x"
    assert shim.host_path("/home/llmops/ccachex", path_map) == "/h/root/home/llmops/ccachex"
    assert shim.load_path_map(str(tmp_path / "missing")) == []


def test_the_host_network_becomes_the_nodes_own():
    """A node that is a container (the L20 twin's, with no route out): its instances run in its namespace."""
    shim = load_shim()
    node = "container:l20-node-01"
    argv = ["run", "--rm", "--network", "host", "--init", "img", "--network", "host"]
    assert shim.map_network(argv, node) == [
        "run", "--rm", "--network", node, "--init", "img", "--network", "host"]
    assert shim.map_network(["create", "--net=host", "img"], node) == ["create", "--net=" + node, "img"]
    assert shim.map_network(["run", "--net", "host", "-e", "A=1", "img"], node) == [
        "run", "--net", node, "-e", "A=1", "img"]


def test_other_networks_and_nodes_without_one_are_left_as_they_are():
    shim = load_shim()
    node = "container:l20-node-01"
    for argv in (["run", "--network", "none", "img"], ["run", "--network", "host-net", "img"],
                 ["run", "--network=bridge", "img"], ["run", "-e", "--network", "img"],
                 ["build", "--network", "host", "."], ["run", "img", "--network", "host"]):
        assert shim.map_network(argv, node) == argv
    assert shim.map_network(["run", "--network", "host", "img"], None) == ["run", "--network", "host", "img"]


def test_the_nodes_network_comes_from_its_setting(tmp_path, monkeypatch):
    shim = load_shim()
    monkeypatch.setenv("DOCKER_GPUS_NETWORK", "container:node")
    assert shim._node_network() == "container:node"
    monkeypatch.setenv("DOCKER_GPUS_NETWORK", "")
    assert shim._node_network() is None
    real = tmp_path / "docker"
    real.write_text("#!/bin/sh\nprintf '%s\\n' \"$@\"\n")
    real.chmod(0o755)
    env = dict(os.environ, DOCKER_GPUS_REAL=str(real), DOCKER_GPUS_LOG=str(tmp_path / "runs.jsonl"),
               DOCKER_GPUS_DRIVER_LIBS="", DOCKER_GPUS_NETWORK="container:node")
    out = subprocess.check_output([sys.executable, SHIM, "run", "--network", "host", "img"], env=env)
    assert out.decode().split() == ["run", "--network", "container:node", "img"]


def test_a_sandboxed_run_logs_to_the_journal_when_the_log_cannot_be_written(tmp_path):
    """A serving unit's ProtectSystem=strict keeps /var/log read-only: the line goes to stderr (journal)."""
    real = tmp_path / "docker"
    real.write_text("#!/bin/sh\nprintf '%s\\n' \"$@\"\n")
    real.chmod(0o755)
    unwritable = tmp_path / "read-only" / "runs.jsonl"       # its directory is missing: open() fails
    env = dict(os.environ, DOCKER_GPUS_REAL=str(real), DOCKER_GPUS_LOG=str(unwritable),
               DOCKER_GPUS_DRIVER_LIBS="")
    result = subprocess.run([sys.executable, SHIM, "run", "--gpus", '"device=2,3"', "img"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True,
                            check=True)
    assert result.stdout.split() == ["run", "-e", "NVIDIA_VISIBLE_DEVICES=2,3", "img"]
    (line,) = [x for x in result.stderr.splitlines() if x.startswith("docker-gpus run: ")]
    assert json.loads(line[len("docker-gpus run: "):]) == ["run", "--gpus", '"device=2,3"', "img"]
    assert not unwritable.exists()
