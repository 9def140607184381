# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Role llama_cpp run for real by Ansible on localhost (container mode) against a fake docker CLI: an image of
this build that the daemon already has (an offline bundle's `docker load`) is installed without fetching the
source or compiling (issue 33), and an image whose build-id label is another build's is not."""
import hashlib
import io
import json
import os
import sys
import tarfile

import yaml

from tests.helpers import run_local_playbook
from tests.roles.test_llama_cpp_role import run_module

COMMIT = "0c1e57098bba43ac29e6e3b677cdceebdd22334f"
NVCC = "nvcc: NVIDIA (R) Cuda compiler driver\nCuda compilation tools, release 12.4, V12.4.131\n"

# Images: {reference: labels} in $FAKE_DOCKER_IMAGES for the role's own repository; every other image (the
# builder tag, the CUDA bases) is present. Every call is logged, one JSON argv a line, to $FAKE_DOCKER_LOG.
FAKE_DOCKER = r'''#!%(python)s
import json, os, sys
argv = sys.argv[1:]
with open(os.environ["FAKE_DOCKER_LOG"], "a") as log:
    log.write(json.dumps(argv) + "\n")
images = json.load(open(os.environ["FAKE_DOCKER_IMAGES"]))
if argv[0] == "version":
    print("26.1.4")
elif argv[:2] == ["image", "inspect"]:
    ref = argv[-1]
    if ref.startswith("llmops/llama.cpp:"):
        if ref not in images:
            sys.stderr.write("Error response from daemon: No such image: %%s\n" %% ref)
            sys.exit(1)
        print(json.dumps(images[ref]) if "json .Config.Labels" in argv[-2] else "sha256:" + "1" * 64)
    else:
        print("{}" if "json" in argv[-2] else "sha256:" + "2" * 64)
elif argv[0] == "run" and "/opt/llama.cpp/bin/llama-server" in argv and argv[-1] == "--version":
    sys.stderr.write("version: 7000 (0c1e570)\nbuilt with cc for x86_64-linux-gnu\n")
elif argv[0] == "run" and argv[argv.index("--entrypoint") + 1] == "cat":
    sys.stdout.write(%(nvcc)r)
elif argv[0] == "run" and argv[-1].endswith("/build.sh"):
    sys.stderr.write("fake docker: no compiler here\n")
    sys.exit(2)
'''


def staging_build_id(tmp_path):
    """The build id the staging node computed for the image it put into the bundle: a git checkout of the
    pinned commit from GitHub, CUDA for the L20 (89), the role's default images."""
    r = run_module(tmp_path, {"mode": "container", "git_repo": "https://github.com/ggml-org/llama.cpp.git",
                              "git_ref": COMMIT, "cuda": "true", "cuda_architectures": ["89"],
                              "builder_image": "nvidia/cuda:12.4.1-devel-ubuntu22.04",
                              "runtime_image": "nvidia/cuda:12.4.1-runtime-ubuntu22.04",
                              "install_root": str(tmp_path / "staging")})
    assert not r.get("failed"), r
    return r["build_id"]


def source_tarball(tmp_path):
    """A `git archive` style tarball (one top directory) and its sha256."""
    path = tmp_path / "llama.cpp.tar.gz"
    data = b"cmake_minimum_required(VERSION 3.14)\nproject(llama.cpp)\n"
    with tarfile.open(str(path), "w:gz") as tar:
        info = tarfile.TarInfo("llama.cpp-%s/CMakeLists.txt" % COMMIT[:7])
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return path, hashlib.sha256(path.read_bytes()).hexdigest()


def run_role(tmp_path, images, archive_url, archive_sha256, check=False):
    """The role as playbooks/build.yml runs it after roles/bundle's verify.yml set the archive source."""
    fake = tmp_path / "bin" / "docker"
    if not fake.exists():
        fake.parent.mkdir()
        fake.write_text(FAKE_DOCKER % {"python": sys.executable, "nvcc": NVCC})
        fake.chmod(0o755)
    (tmp_path / "images.json").write_text(json.dumps(images))
    settings = {"llama_cpp_build_mode": "container", "llama_cpp_cuda": True,
                "llama_cpp_cuda_architectures": ["89"], "llama_cpp_source_type": "archive",
                "llama_cpp_archive_url": archive_url, "llama_cpp_archive_sha256": archive_sha256,
                "llama_cpp_archive_commit": COMMIT, "llama_cpp_install_root": str(tmp_path / "opt"),
                "llama_cpp_build_root": str(tmp_path / "build"), "llama_cpp_ccache": False,
                "llama_cpp_build_cleanup": False, "ansible_python_interpreter": sys.executable}
    (tmp_path / "vars.json").write_text(json.dumps(settings))
    play = [{"hosts": "localhost", "connection": "local", "gather_facts": True,
             "gather_subset": ["!all", "!min", "distribution", "platform", "pkg_mgr"],
             "roles": ["llmops.serving.llama_cpp"]}]
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play))
    env = {"FAKE_DOCKER_LOG": str(tmp_path / "docker.log"),
           "FAKE_DOCKER_IMAGES": str(tmp_path / "images.json")}
    args = ["-e", "@%s" % (tmp_path / "vars.json")] + (["--check"] if check else [])
    return run_local_playbook(tmp_path / "play.yml", str(fake.parent), extra_env=env, extra_args=args)


def docker_calls(tmp_path):
    path = tmp_path / "docker.log"
    if not path.exists():
        return []
    calls = [json.loads(line) for line in path.read_text().splitlines()]
    path.write_text("")  # the next run's calls only
    return calls


def compiles(calls):
    return [c for c in calls if c[0] == "build" or (c[0] == "run" and c[-1].endswith("/build.sh"))]


def test_the_bundled_image_of_this_build_is_installed_without_compiling(tmp_path):
    build_id = staging_build_id(tmp_path)
    image = "llmops/llama.cpp:" + build_id
    images = {image: {"io.llmops.llama-cpp.build-id": build_id,
                      "org.opencontainers.image.title": "llama.cpp"}}
    # the archive is not there: adopting must not fetch the source
    missing = "file://%s/nowhere/llama.cpp.tar.gz" % tmp_path

    result, recap = run_role(tmp_path, images, missing, "a" * 64, check=True)
    assert recap.get("failed") == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert ("would install llama.cpp %s from the image %s already in the daemon (no compile)"
            % (build_id, image)) in " ".join(result.stdout.split())
    assert not (tmp_path / "opt" / "builds").exists()

    result, recap = run_role(tmp_path, images, missing, "a" * 64)
    assert recap.get("failed") == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert recap["changed"] > 0
    assert compiles(docker_calls(tmp_path)) == []
    assert not (tmp_path / "build" / "src").exists() and not (tmp_path / "build" / "downloads").exists()
    install_dir = tmp_path / "opt" / "builds" / build_id
    manifest = json.loads((install_dir / "manifest.json").read_text())
    assert manifest["build_id"] == build_id and manifest["adopted"] is True
    assert manifest["image"] == image and manifest["identity"]["source"] == {"type": "git", "commit": COMMIT}
    assert manifest["version"] == "7000 (0c1e570)" and manifest["cuda_version"] == "12.4"
    assert manifest["source"]["path"] == "" and manifest["build_log"] == str(install_dir / "build.log")
    assert "adopted" in (install_dir / "build.log").read_text()
    assert os.readlink(str(tmp_path / "opt" / "current")) == "builds/" + build_id

    # the manifest is there now: a second run has nothing to do
    result, recap = run_role(tmp_path, images, missing, "a" * 64)
    assert recap.get("failed") == 0 and recap["changed"] == 0, result.stdout[-4000:]
    assert compiles(docker_calls(tmp_path)) == []


def test_an_image_labelled_for_another_build_is_compiled_over(tmp_path):
    build_id = staging_build_id(tmp_path)
    image = "llmops/llama.cpp:" + build_id
    images = {image: {"io.llmops.llama-cpp.build-id": "0123456789abcdef"}}
    tarball, digest = source_tarball(tmp_path)

    result, recap = run_role(tmp_path, images, "file://%s" % tarball, digest, check=True)
    assert recap.get("failed") == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "would build llama.cpp %s (container)" % build_id in " ".join(result.stdout.split())
    assert "already in the daemon" not in result.stdout

    result, recap = run_role(tmp_path, images, "file://%s" % tarball, digest)
    # the compile path: the source unpacked where a git checkout of the commit goes, build.sh run in the
    # builder container (which the fake docker fails), no manifest
    assert recap.get("failed") == 1, result.stdout[-4000:] + result.stderr[-2000:]
    assert "llama.cpp build %s (container) failed" % build_id in " ".join(result.stdout.split())
    assert (tmp_path / "build" / "src" / ("git-" + COMMIT[:16]) / "CMakeLists.txt").exists()
    assert len(compiles(docker_calls(tmp_path))) == 1
    assert not (tmp_path / "opt" / "builds" / build_id / "manifest.json").exists()


def run_sources(tmp_path, bundle_refs):
    """The role's `sources` entry point as preflight runs it after the bundle check set
    llmops_bundle_sources."""
    fake = tmp_path / "bin" / "docker"
    fake.parent.mkdir()
    fake.write_text(FAKE_DOCKER % {"python": sys.executable, "nvcc": NVCC})
    fake.chmod(0o755)
    (tmp_path / "images.json").write_text("{}")
    settings = {"llama_cpp_build_mode": "container", "llama_cpp_cuda": True,
                "llama_cpp_cuda_architectures": ["89"], "llama_cpp_git_ref": COMMIT,
                "llama_cpp_install_root": str(tmp_path / "opt"),
                "llama_cpp_build_root": str(tmp_path / "build"),
                "ansible_python_interpreter": sys.executable,
                "llmops_bundle_sources": {"images": [{"name": "images/llama.cpp", "refs": bundle_refs}]}}
    (tmp_path / "vars.json").write_text(json.dumps(settings))
    play = [{"hosts": "localhost", "connection": "local", "gather_facts": True,
             "gather_subset": ["!all", "!min", "distribution", "platform", "pkg_mgr"],
             "tasks": [{"ansible.builtin.include_role": {"name": "llmops.serving.llama_cpp",
                                                         "tasks_from": "sources"}},
                       {"ansible.builtin.debug": {
                           "msg": "SOURCES {{ llmops_sources | default([]) | to_json }}"}}]}]
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play))
    env = {"FAKE_DOCKER_LOG": str(tmp_path / "docker.log"),
           "FAKE_DOCKER_IMAGES": str(tmp_path / "images.json")}
    return run_local_playbook(tmp_path / "play.yml", str(fake.parent), extra_env=env,
                              extra_args=["-e", "@%s" % (tmp_path / "vars.json")])


def test_preflight_fetches_nothing_when_the_bundle_holds_this_builds_image(tmp_path):
    build_id = staging_build_id(tmp_path)
    result, recap = run_sources(tmp_path, ["llmops/llama.cpp:" + build_id])
    assert recap.get("failed") == 0, result.stdout[-4000:]
    assert "SOURCES []" in result.stdout


def test_preflight_refuses_a_bundle_whose_llama_cpp_image_is_another_build(tmp_path):
    build_id = staging_build_id(tmp_path)
    result, recap = run_sources(tmp_path, ["llmops/llama.cpp:0123456789abcdef"])
    assert recap.get("failed") == 1, result.stdout[-4000:]
    text = " ".join(result.stdout.split())
    assert "The offline bundle holds llmops/llama.cpp:0123456789abcdef, but this node" in text
    assert "llama.cpp build is llmops/llama.cpp:%s: the build identities differ" % build_id in text
