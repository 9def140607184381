# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Role vllm: its variables (Templar), playbooks/build.yml's engine choice, the fake vLLM wheel in a real
virtualenv, and the role itself run against localhost - the venv runtime installing the fake wheel (then
idempotent, and in check mode), the container runtime against a fake docker CLI."""

import json
import os
import socket
import stat
import subprocess
import sys
import time
import urllib.request

import pytest

from tests.fixtures.fake_vllm import build_wheel
from tests.helpers import ROOT, load_yaml, role_templar, run_local_playbook

ROLE = os.path.join(ROOT, "roles", "vllm")
DIGEST = "sha256:" + "ab" * 32


def role_vars(os_vars="Debian.yml", **extra):
    """defaults + OS vars + vars/main.yml, as the role sees them."""
    variables = load_yaml(os.path.join(ROLE, "defaults", "main.yml"))
    variables.update(load_yaml(os.path.join(ROLE, "vars", os_vars)))
    variables.update(load_yaml(os.path.join(ROLE, "vars", "main.yml")))
    variables.update(extra)
    return variables


def value(name, os_vars="Debian.yml", **extra):
    variables = role_vars(os_vars, **extra)
    return role_templar(ROLE, variables).template(variables[name])


# --- interface -----------------------------------------------------------------------------------


def test_pin_is_the_cached_wheel_and_the_image_tag():
    assert value("_vllm_pip_target") == "vllm==0.33.0"
    assert value("vllm_venv_dir") == "/opt/llmops/vllm/0.33.0"
    assert value("_vllm_image") == "vllm/vllm-openai:v0.33.0"
    assert value("_vllm_image_ref") == "vllm/vllm-openai:v0.33.0"


def test_os_defaults_container_on_el7_venv_elsewhere():
    assert value("_vllm_runtime", "RedHat-7.yml") == "container"
    assert value("_vllm_runtime", "RedHat.yml") == "venv" and value("_vllm_runtime") == "venv"
    assert value("_vllm_runtime", "RedHat-7.yml", vllm_runtime="venv") == "venv"


def test_mirror_and_digest_make_the_reference():
    ref = dict(vllm_image_registry="registry.lan:5000/", vllm_image_digest=DIGEST[len("sha256:") :])
    assert value("_vllm_image", **ref) == "registry.lan:5000/vllm/vllm-openai:v0.33.0@" + DIGEST
    assert value("_vllm_image_ref", **ref) == "registry.lan:5000/vllm/vllm-openai@" + DIGEST


def test_a_cuda_variant_picks_the_image_tag_and_the_indexes():
    variant = dict(vllm_version="0.32.0", vllm_cuda_variant="cu129")
    assert value("_vllm_image", **variant) == "vllm/vllm-openai:v0.32.0-cu129"
    assert value("_vllm_pip_options", **variant) == [
        "--extra-index-url=https://wheels.vllm.ai/0.32.0/cu129",
        "--extra-index-url=https://download.pytorch.org/whl/cu129",
    ]
    # a wheel file or a source tree is what it is: no variant index
    assert value("_vllm_pip_options", vllm_wheel="w/vllm-0.32.0-cp38-abi3-linux_x86_64.whl", **variant) == []
    assert value("_vllm_image") == "vllm/vllm-openai:v0.33.0" and value("_vllm_pip_options") == []


def test_sources_and_pip_options():
    assert value("_vllm_pip_target") == "vllm==0.33.0"
    assert value(
        "_vllm_pip_options",
        vllm_index_url="https://pypi.lan/simple",
        vllm_extra_index_urls=["https://torch.lan/cu128"],
        vllm_pip_extra_args=["--no-cache-dir"],
    ) == [
        "--index-url",
        "https://pypi.lan/simple",
        "--extra-index-url=https://torch.lan/cu128",
        "--no-cache-dir",
    ]
    wheel = dict(vllm_wheel="files/vllm-0.24.0+sm75-cp312-cp312-linux_x86_64.whl")
    assert (
        value("_vllm_source", **wheel) == "wheel" and value("_vllm_wanted_version", **wheel) == "0.24.0+sm75"
    )
    assert (
        value("_vllm_pip_target", **wheel)
        == "/var/cache/llmops/vllm/vllm-0.24.0+sm75-cp312-cp312-linux_x86_64.whl"
    )
    fork = dict(vllm_source_dir="/home/u/vllm-2080ti-0.24.0", vllm_version="0.24.0")
    assert value("_vllm_pip_target", **fork) == "/home/u/vllm-2080ti-0.24.0"
    assert value("_vllm_wanted_version", **fork) == "0.24.0"
    # the index requirement always pins vllm_version: one variable names the version
    assert value("_vllm_pip_target", vllm_version="0.34.1") == "vllm==0.34.1"
    assert value("_vllm_pip_target", vllm_package_name="vllm-fork") == "vllm-fork==0.33.0"


# --- playbooks/build.yml: which engines -------------------------------------------------------------------


@pytest.mark.parametrize(
    "instances,engines",
    [
        (None, []),
        ([], []),
        ([{"name": "a"}], ["llama.cpp"]),
        ([{"name": "a"}, {"name": "b", "engine": "vllm"}], ["llama.cpp", "vllm"]),
        ([{"engine": "vllm"}], ["vllm"]),
    ],
)
def test_build_playbook_runs_the_engines_the_instances_use(instances, engines):
    play = load_yaml(os.path.join(ROOT, "playbooks", "build.yml"))[0]
    variables = {} if instances is None else {"serving_instances": instances}
    templar = role_templar(ROLE, dict(variables, **{k: v for k, v in play["vars"].items()}))
    roles = templar.template("{{ _build_roles }}")
    # a build-only run (no instances) builds the default engine, llama.cpp
    assert roles == [{"llama.cpp": "llama_cpp", "vllm": "vllm"}[e] for e in engines or ["llama.cpp"]]
    names = {task["ansible.builtin.include_role"]["name"]: task for task in play["tasks"]}
    assert sorted(names) == ["llmops.serving.bundle", "llmops.serving.{{ _build_role }}"]
    assert names["llmops.serving.{{ _build_role }}"]["loop"] == "{{ _build_roles }}"
    # without an offline bundle (llmops_bundle_sources, set by playbooks/offline_bundle.yml) nothing is loaded
    assert templar.template("{{ %s }}" % names["llmops.serving.bundle"]["when"]) is False
    # an instance that preflight left out builds nothing for it; every instance left out: no build at all
    if instances and all("name" in i for i in instances):
        refused = [dict(name=i["name"]) for i in instances]
        left = role_templar(ROLE, dict(variables, llmops_refused_instances=refused, **play["vars"]))
        assert left.template("{{ _build_roles }}") == []


# --- the fake vLLM wheel in a real virtualenv --------------------------------------------------------------


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_fake_wheel_installs_with_pip_and_serves_health(tmp_path):
    wheel = build_wheel.build(str(tmp_path))
    assert os.path.basename(wheel) == "vllm-0.33.0-py3-none-any.whl"
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    subprocess.run(
        [str(venv / "bin" / "pip"), "install", "-q", "--no-index", "--disable-pip-version-check", wheel],
        check=True,
        timeout=120,
    )
    probe = load_yaml(os.path.join(ROLE, "vars", "main.yml"))["_vllm_version_probe"]
    assert subprocess.check_output([str(venv / "bin" / "python"), "-c", probe]).decode().strip() == "0.33.0"
    port, record = free_port(), tmp_path / "record.json"
    server = subprocess.Popen(
        [
            str(venv / "bin" / "vllm"),
            "serve",
            "/models/m",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--served-model-name",
            "qwen-local",
        ],
        env=dict(os.environ, FAKE_VLLM_RECORD=str(record), FAKE_VLLM_ACCESS_LOG="0"),
    )
    try:
        deadline = time.time() + 20
        while True:
            try:
                with urllib.request.urlopen("http://127.0.0.1:%d/health" % port, timeout=2) as response:
                    assert response.status == 200
                    break
            except OSError:
                assert time.time() < deadline and server.poll() is None
                time.sleep(0.2)
        with urllib.request.urlopen("http://127.0.0.1:%d/v1/models" % port, timeout=2) as response:
            assert [m["id"] for m in json.load(response)["data"]] == ["qwen-local"]
    finally:
        server.terminate()
        server.wait(timeout=10)
    assert json.loads(record.read_text())["argv"][0] == str(venv / "bin" / "vllm")


# --- the role against localhost ---------------------------------------------------------------------


def run_role(tmp_path, variables, extra_args=(), path_prefix=None):
    fact_file = tmp_path / "llmops_vllm.json"
    play = tmp_path / "play.yml"
    play.write_text(
        json.dumps(
            [
                {
                    "hosts": "localhost",
                    "connection": "local",
                    "gather_facts": False,
                    "vars": {"ansible_python_interpreter": sys.executable},
                    "roles": [{"role": "llmops.serving.vllm"}],
                    "post_tasks": [
                        {
                            "name": "Save the fact",
                            "ansible.builtin.copy": {
                                "content": "{{ llmops_vllm | to_json }}",
                                "dest": str(fact_file),
                                "mode": "0644",
                            },
                            "check_mode": False,
                            "changed_when": False,
                        }
                    ],
                }
            ]
        )
    )
    (tmp_path / "vars.json").write_text(json.dumps(variables))
    result, recap = run_local_playbook(
        play,
        path_prefix or str(tmp_path / "bin"),
        extra_args=["-e", "@%s" % (tmp_path / "vars.json")] + list(extra_args),
    )
    fact = json.loads(fact_file.read_text()) if fact_file.exists() and recap.get("failed") == 0 else None
    if fact_file.exists():
        fact_file.unlink()
    return result, recap, fact


def venv_vars(tmp_path):
    wheel = build_wheel.build(str(tmp_path))
    return {
        "vllm_runtime": "venv",
        "vllm_wheel": wheel,
        "vllm_wheel_cache_dir": str(tmp_path / "wheels"),
        "vllm_venv_dir": str(tmp_path / "venv"),
        "vllm_python": sys.executable,
        "vllm_pip_extra_args": ["--no-index"],
        "vllm_extra_flags": ["--fork-flag"],
        "vllm_env": {"VLLM_USE_DEEP_GEMM": "0"},
    }


def test_venv_runtime_installs_the_wheel_once_and_publishes_the_fact(tmp_path):
    variables = venv_vars(tmp_path)
    check, recap, _fact = run_role(tmp_path, variables, extra_args=["--check"])
    assert recap["failed"] == 0, check.stdout
    assert "would install %s/vllm-0.33.0-py3-none-any.whl into %s" % (
        tmp_path / "wheels",
        tmp_path / "venv",
    ) in " ".join(check.stdout.split())
    assert not (tmp_path / "venv").exists()

    first, recap, fact = run_role(tmp_path, variables)
    assert recap["failed"] == 0 and recap["changed"] > 0, first.stdout
    venv = str(tmp_path / "venv")
    assert fact == {
        "mode": "host",
        "binary": venv + "/bin/vllm",
        "python": venv + "/bin/python",
        "image": "",
        "entrypoint": [venv + "/bin/vllm", "serve"],
        "version": "0.33.0",
        "venv": venv,
        "extra_flags": ["--fork-flag"],
        "env": {"VLLM_USE_DEEP_GEMM": "0"},
        # the fake wheel brings no torch: the CUDA release is not known, and not invented
        "cuda_version": None,
        "cuda_source": None,
    }
    assert subprocess.check_output([fact["binary"], "--version"]).decode().strip() == "0.33.0"

    again, recap, fact_again = run_role(tmp_path, variables)
    assert recap["failed"] == 0 and recap["changed"] == 0, again.stdout
    assert fact_again == fact and "wheel_compat_info" not in again.stdout


def test_venv_runtime_publishes_the_cuda_of_its_torch(tmp_path):
    """The fake torch carries its CUDA like the real wheel (torch/version.py, METADATA): the fact has it."""
    variables = venv_vars(tmp_path)
    torch_dir = tmp_path / "torch-wheels"
    torch_dir.mkdir()
    build_wheel.build_torch(str(torch_dir), "12.9")
    first, recap, _fact = run_role(tmp_path, variables)
    assert recap["failed"] == 0, first.stdout
    subprocess.check_call([str(tmp_path / "venv" / "bin" / "python"), "-m", "pip", "install", "-q",
                           "--no-index", "--no-deps", "--disable-pip-version-check",
                           str(torch_dir / "torch-2.14.0-py3-none-any.whl")])
    again, recap, fact = run_role(tmp_path, variables)
    assert recap["failed"] == 0 and recap["changed"] == 0, again.stdout
    assert fact["cuda_version"] == "12.9"
    assert fact["cuda_source"] == "torch/version.py cuda = '12.9'"


def test_venv_runtime_refuses_an_old_python_before_installing(tmp_path):
    py39 = os.path.expanduser("~/.pyenv/versions/3.9.18/bin/python3.9")
    if not os.path.exists(py39):
        pytest.skip("no Python 3.9 in ~/.pyenv")
    variables = dict(venv_vars(tmp_path), vllm_wheel="", vllm_python=py39)
    result, recap, _fact = run_role(tmp_path, variables)
    assert recap["failed"] == 1 and not (tmp_path / "venv").exists()
    assert "Requires-Python >=3.11,<3.15 excludes" in result.stdout
    assert "Use a Python that Requires-Python allows (set vllm_python" in " ".join(result.stdout.split())


FAKE_DOCKER = """#!/bin/sh
# fake docker: `image inspect` finds the image once pulled; `pull` records the reference
echo "$*" >> "{log}"
case "$1 $2" in
  "image inspect") [ -f "{state}" ] && grep -qxF "$5" "{state}" \
                     || {{ echo "Error: No such image: $5" >&2; exit 1; }}
                   case "$4" in
                     *Config.Env*) echo '["PATH=/bin","CUDA_VERSION=13.0.2","NVIDIA_REQUIRE_CUDA=cuda>=13.0"]'
                                   ;;
                     *) echo sha256:0123 ;;
                   esac
                   exit 0 ;;
esac
if [ "$1" = pull ]; then
  [ -n "$FAKE_DOCKER_PULL_FAILS" ] && {{ echo "Error response from daemon: manifest unknown" >&2; exit 1; }}
  echo "$2" >> "{state}"; echo "Status: Downloaded newer image for $2"; exit 0
fi
exit 0
"""


def fake_docker(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    docker = bin_dir / "docker"
    docker.write_text(FAKE_DOCKER.format(log=tmp_path / "docker.log", state=tmp_path / "images"))
    docker.chmod(docker.stat().st_mode | stat.S_IEXEC)
    return tmp_path / "docker.log"


def test_container_runtime_pulls_a_missing_image_once(tmp_path):
    log = fake_docker(tmp_path)
    variables = {"vllm_runtime": "container", "vllm_image_registry": "mirror.lan", "vllm_env": {"A": "1"}}
    first, recap, fact = run_role(tmp_path, variables)
    assert recap["failed"] == 0 and recap["changed"] == 1, first.stdout
    assert "is pinned by tag only: a moved tag" in " ".join(first.stdout.split())
    assert "pull mirror.lan/vllm/vllm-openai:v0.33.0" in log.read_text()
    assert fact == {
        "mode": "container",
        "binary": "",
        "python": "",
        "image": "mirror.lan/vllm/vllm-openai:v0.33.0",
        "entrypoint": ["vllm", "serve"],
        "version": "0.33.0",
        "venv": "",
        "extra_flags": [],
        "env": {"A": "1"},
        # from the image's environment, as the official image (FROM nvidia/cuda) carries it
        "cuda_version": "13.0",
        "cuda_source": "image mirror.lan/vllm/vllm-openai:v0.33.0 environment",
    }
    again, recap, _fact = run_role(tmp_path, variables)
    assert recap["failed"] == 0 and recap["changed"] == 0, again.stdout
    assert [line for line in log.read_text().splitlines() if line.startswith("pull ")] == [
        "pull mirror.lan/vllm/vllm-openai:v0.33.0"
    ]


def test_container_runtime_pulls_by_digest_and_says_what_to_do_when_it_cannot(tmp_path):
    log = fake_docker(tmp_path)
    variables = {"vllm_runtime": "container", "vllm_image_digest": DIGEST}
    result, recap, fact = run_role(tmp_path, variables)
    assert recap["failed"] == 0 and "is pinned by tag only: a moved tag" not in " ".join(
        result.stdout.split()
    )
    assert "pull vllm/vllm-openai@" + DIGEST in log.read_text()
    assert fact["image"] == "vllm/vllm-openai:v0.33.0@" + DIGEST
    never, recap, _fact = run_role(tmp_path, dict(variables, vllm_image_digest="", vllm_image_pull="never"))
    assert recap["failed"] == 1 and "vllm_image_pull is never" in never.stdout
    assert "docker load -i vllm.tar" in " ".join(never.stdout.split())
    os.environ["FAKE_DOCKER_PULL_FAILS"] = "1"
    try:
        failed, recap, _fact = run_role(tmp_path, dict(variables, vllm_image_digest=""))
    finally:
        del os.environ["FAKE_DOCKER_PULL_FAILS"]
    assert recap["failed"] == 1 and "manifest unknown" in failed.stdout
