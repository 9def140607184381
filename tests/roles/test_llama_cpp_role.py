# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Role llama_cpp: its templates rendered with Ansible's own Templar, its build script run against a small
CMake project, and the llama_cpp_build_info module run as Ansible runs it (identity and skip logic)."""
import fcntl
import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from tests.helpers import (
    ROOT,  # noqa: E402
    load_yaml,
    role_templar,
)

ROLE = os.path.join(ROOT, "roles", "llama_cpp")
COLLECTIONS = os.path.join(ROOT, "collections")
MODULE = os.path.join(ROOT, "plugins", "modules", "llama_cpp_build_info.py")

def _templar(variables):
    return role_templar(ROLE, variables)


def run_module(tmp_path, args):
    args_file = tmp_path / "args.json"
    args_file.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": args}))
    env = dict(os.environ, PYTHONPATH=COLLECTIONS)
    proc = subprocess.run([sys.executable, MODULE, str(args_file)], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, env=env, timeout=60)
    return json.loads(proc.stdout.decode())


def plan(tmp_path, **over):
    args = {"mode": "container", "git_repo": "https://github.com/ggml-org/llama.cpp.git",
            "git_ref": "0c1e57098bba43ac29e6e3b677cdceebdd22334f",
            "gpus": {"present": True, "archs": ["89"]},
            "builder_image": "nvidia/cuda:12.4.1-devel-ubuntu22.04",
            "runtime_image": "nvidia/cuda:12.4.1-runtime-ubuntu22.04",
            "install_root": str(tmp_path / "opt")}
    args.update(over)
    return run_module(tmp_path, args)


def role_vars(result, extra=None, mode="container"):
    """Role defaults + Debian vars + the facts tasks/plan.yml sets from a module result."""
    variables = load_yaml(os.path.join(ROLE, "defaults", "main.yml"))
    variables.update(load_yaml(os.path.join(ROLE, "vars", "Debian.yml")))
    variables.update(extra or {})
    variables.update({
        "_llama_cpp_plan": result,
        "_llama_cpp_build_id": result["build_id"],
        "_llama_cpp_mode": mode,
        "_llama_cpp_src": variables.get("_llama_cpp_src", "/var/cache/llmops/llama.cpp/src/git-0123456789ab"),
        "_llama_cpp_work": variables.get("_llama_cpp_work", "/var/cache/llmops/" + result["build_id"]),
        "_llama_cpp_source_label": "https://github.com/ggml-org/llama.cpp.git@0c1e570",
    })
    return variables


def render(name, variables):
    with open(os.path.join(ROLE, "templates", name)) as handle:
        return _templar(variables).template(handle.read())


# --- module: identity and skip logic -----------------------------------------------------------------------

def test_module_cuda_build_from_gpu_facts(tmp_path):
    r = plan(tmp_path)
    assert not r.get("failed"), r
    assert r["changed"] is False and r["cuda"] is True and r["cuda_architectures"] == "89"
    assert "-DCMAKE_CUDA_ARCHITECTURES=89" in r["cmake_args"] and "-DGGML_CUDA=ON" in r["cmake_args"]
    assert r["installed"] is False and r["manifest"] is None and r["current_build_id"] is None
    assert r["build_id"] == r["identity_sha256"][:16]
    assert r["targets"] == ["llama-bench", "llama-cli", "llama-quantize", "llama-server"]


def test_module_auto_cpu_without_gpus(tmp_path):
    r = plan(tmp_path, gpus={"present": False, "archs": []})
    assert r["cuda"] is False and "-DGGML_CUDA=OFF" in r["cmake_args"]


def test_module_refuses_removed_option_clearly(tmp_path):
    r = plan(tmp_path, cmake_extra_options={"GGML_CUDA_F16": True})
    assert r["failed"] and "GGML_CUDA_F16" in r["msg"] and "not supported by the pinned llama.cpp" in r["msg"]


def test_module_warn_policy(tmp_path):
    r = plan(tmp_path, cmake_extra_options={"LLAMA_CURL": "OFF"}, removed_option_policy="warn")
    assert not r.get("failed")
    assert any("LLAMA_CURL" in w and "LLAMA_OPENSSL" in w for w in r["warnings"])


def test_module_keep_builds_minimum(tmp_path):
    r = plan(tmp_path, keep_builds=1)
    assert r["failed"] and "at least 2" in r["msg"]


def install(tmp_path, result, installed_at, mode="host"):
    """What tasks/install.yml leaves behind: bin/llama-server and manifest.json."""
    d = tmp_path / "opt" / "builds" / result["build_id"]
    (d / "bin").mkdir(parents=True)
    binary = d / "bin" / "llama-server"
    binary.write_text("#!/bin/sh\necho 'version: 0.5.0-dev (build 1, commit 0c1e570)'\n")
    binary.chmod(0o755)
    manifest = {"build_id": result["build_id"], "identity_sha256": result["identity_sha256"], "mode": mode,
                "binary": str(binary), "image": "", "installed_at": installed_at}
    (d / "manifest.json").write_text(json.dumps(manifest))
    return d


def host_plan(tmp_path, **over):
    kw = dict(mode="host", gpus={"present": False, "archs": []}, builder_image=None, runtime_image=None,
              platform={"distribution": "Debian", "version": "12", "architecture": "x86_64"})
    kw.update(over)
    return plan(tmp_path, **{k: v for k, v in kw.items() if v is not None})


def test_module_skip_logic_follows_the_manifest(tmp_path):
    first = host_plan(tmp_path)
    d = install(tmp_path, first, "2026-11-01T00:00:00Z")
    again = host_plan(tmp_path)
    assert again["build_id"] == first["build_id"] and again["installed"] is True
    assert again["manifest"]["binary"].endswith("/bin/llama-server")
    # An mtime change means nothing; a missing binary or a foreign identity means "not installed".
    os.utime(str(d / "manifest.json"), (0, 0))
    assert host_plan(tmp_path)["installed"] is True
    (d / "bin" / "llama-server").unlink()
    assert host_plan(tmp_path)["installed"] is False
    shutil.rmtree(str(d))
    d = install(tmp_path, first, "2026-11-01T00:00:00Z")
    m = json.loads((d / "manifest.json").read_text())
    m["identity_sha256"] = "0" * 64
    (d / "manifest.json").write_text(json.dumps(m))
    assert host_plan(tmp_path)["installed"] is False
    (d / "manifest.json").write_text("{half written")
    assert host_plan(tmp_path)["installed"] is False


def test_module_links_and_prune_plan(tmp_path):
    opt = tmp_path / "opt"
    ids = []
    for i, extra in enumerate([{"GGML_RPC": True}, {"GGML_RPC": False}, {"GGML_LTO": True}]):
        r = host_plan(tmp_path, cmake_extra_options=extra)
        install(tmp_path, r, "2026-11-0%dT00:00:00Z" % (i + 1))
        ids.append(r["build_id"])
    os.symlink("builds/" + ids[2], str(opt / "current"))
    os.symlink("builds/" + ids[1], str(opt / "previous"))
    new = host_plan(tmp_path, keep_builds=3)
    assert new["current_build_id"] == ids[2] and new["previous_build_id"] == ids[1]
    assert new["next_previous_build_id"] == ids[2]
    # keep 3 = new + current(->previous) + newest other: only the oldest goes.
    assert new["prune"] == [ids[0]]
    # Re-selecting the current build changes nothing.
    same = host_plan(tmp_path, cmake_extra_options={"GGML_LTO": True})
    assert same["installed"] and same["build_id"] == ids[2]
    assert same["next_previous_build_id"] == ids[1] and same["prune"] == []


def test_module_dir_source_hash_is_the_identity(tmp_path):
    src = tmp_path / "llama.cpp"
    (src / "src").mkdir(parents=True)
    (src / "CMakeLists.txt").write_text("project(llama.cpp)\n")
    (src / "src" / "llama.cpp").write_text("int x;\n")
    a = host_plan(tmp_path, source_type="dir", source_dir=str(src))
    assert a["identity"]["source"]["type"] == "dir" and len(a["identity"]["source"]["content_sha256"]) == 64
    assert host_plan(tmp_path, source_type="dir", source_dir=str(src))["build_id"] == a["build_id"]
    (src / "src" / "llama.cpp").write_text("int y;\n")
    assert host_plan(tmp_path, source_type="dir", source_dir=str(src))["build_id"] != a["build_id"]
    r = host_plan(tmp_path, source_type="dir", source_dir=str(tmp_path / "nope"))
    assert r["failed"] and "not a directory" in r["msg"]


def test_module_branch_ref_warns(tmp_path):
    r = plan(tmp_path, git_ref="master")
    assert any("not look like a commit SHA" in w for w in r["warnings"])


# --- Dockerfile ------------------------------------------------------------------------------------------

def test_dockerfile_is_multi_stage_with_image_and_arch_args(tmp_path):
    r = plan(tmp_path)
    text = render("Dockerfile.j2", role_vars(r, {"llama_cpp_ccache": True}))
    stages = re.findall(r"^FROM (\S+) AS (\w+)$", text, re.M)
    assert stages == [("${BUILDER_IMAGE}", "builder"), ("builder", "bundle"), ("${RUNTIME_IMAGE}", "runtime")]
    assert "ARG BUILDER_IMAGE=nvidia/cuda:12.4.1-devel-ubuntu22.04" in text
    assert "ARG RUNTIME_IMAGE=nvidia/cuda:12.4.1-runtime-ubuntu22.04" in text
    assert 'ARG CUDA_ARCHITECTURES="89"' in text
    assert "ARG LLAMA_CPP_BUILD_ID=%s" % r["build_id"] in text
    assert "for tool in cmake g++ git make ccache;" in text
    assert "ccache" in re.search(r'ARG BUILD_PACKAGES="([^"]*)"', text).group(1)
    assert "COPY --from=bundle /opt/llama.cpp/ /opt/llama.cpp/" in text
    assert 'ENTRYPOINT ["/opt/llama.cpp/bin/llama-server"]' in text
    # The driver and CUDA runtime libraries are never bundled.
    assert "libcuda.so*|libnvidia*|libcudart.so*" in text
    # Classic-builder compatible: no BuildKit-only syntax.
    assert "--mount=" not in text and "# syntax=" not in text


def test_dockerfile_mirror_images_and_no_ccache(tmp_path):
    extra = {"llama_cpp_builder_image": "registry.local:5000/nvidia/cuda:12.4.1-devel-ubuntu22.04",
             "llama_cpp_runtime_image": "registry.local:5000/nvidia/cuda:12.4.1-runtime-ubuntu22.04",
             "llama_cpp_ccache": False}
    r = plan(tmp_path, builder_image=extra["llama_cpp_builder_image"],
             runtime_image=extra["llama_cpp_runtime_image"], gpus={"present": False, "archs": []})
    text = render("Dockerfile.j2", role_vars(r, extra))
    assert "ARG BUILDER_IMAGE=registry.local:5000/nvidia/cuda:12.4.1-devel-ubuntu22.04" in text
    assert "ARG RUNTIME_IMAGE=registry.local:5000/nvidia/cuda:12.4.1-runtime-ubuntu22.04" in text
    assert 'ARG CUDA_ARCHITECTURES=""' in text
    assert "for tool in cmake g++ git make;" in text


# --- build script --------------------------------------------------------------------------------

def test_build_script_renders_cmake_args_quoted(tmp_path):
    r = plan(tmp_path, ccache=True,
             cmake_extra_options={"GGML_CUDA_FA_ALL_QUANTS": True, "LLAMA_BUILD_COMMIT": "0c1e570 x"})
    text = render("build.sh.j2", role_vars(r, {"llama_cpp_ccache": True, "llama_cpp_build_jobs": 2}))
    assert "  -DCMAKE_CUDA_ARCHITECTURES=89 \\" in text
    assert "  '-DLLAMA_BUILD_COMMIT=0c1e570 x' \\" in text
    assert "  -DGGML_CCACHE=ON \\" in text
    assert "JOBS=2" in text
    assert "--target llama-bench llama-cli llama-quantize llama-server" in text
    assert "export CCACHE_BASEDIR=/" in text and "export CCACHE_COMPILERCHECK=content" in text
    assert "export CCACHE_DIR=/var/cache/llmops/ccache" in text
    assert subprocess.run(["bash", "-n"], input=text.encode()).returncode == 0


FAKE_CMAKE = """#!/bin/sh
# stands in for cmake: configure writes a CMakeCache naming the fake nvcc, --build makes the targets
if [ "$1" = --build ]; then
  mkdir -p "$2/bin"; for t in llama-bench llama-cli llama-quantize llama-server; do : > "$2/bin/$t"; done
  exit 0
fi
while [ $# -gt 0 ]; do [ "$1" = -B ] && build=$2; shift; done
mkdir -p "$build"
cache="$build/CMakeCache.txt"
printf 'CMAKE_GENERATOR:INTERNAL=Unix Makefiles\nCMAKE_CUDA_COMPILER:FILEPATH=%s\n' "{nvcc}" > "$cache"
"""
FAKE_NVCC = """#!/bin/sh
printf 'nvcc: NVIDIA (R) Cuda compiler driver\nCuda compilation tools, release 12.4, V12.4.131\n'
"""


def test_cuda_build_records_the_cuda_release_of_its_nvcc(tmp_path):
    """build.sh writes the nvcc --version of the compiler CMake chose; the manifest's cuda_version (what the
    serving plan checks against the driver) is read from it with llmops.serving.cuda_from_nvcc."""
    from ansible_collections.llmops.serving.plugins.module_utils._gpu.cuda_compat import cuda_from_nvcc
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    nvcc = bin_dir / "nvcc"
    nvcc.write_text(FAKE_NVCC)
    (bin_dir / "cmake").write_text(FAKE_CMAKE.format(nvcc=nvcc))
    for tool in (nvcc, bin_dir / "cmake"):
        tool.chmod(0o755)
    work = tmp_path / "work"
    (work / "context").mkdir(parents=True)
    r = plan(tmp_path)
    variables = role_vars(r, {"_llama_cpp_src": str(tmp_path), "_llama_cpp_work": str(work),
                              "llama_cpp_ccache": False, "llama_cpp_build_jobs": 1})
    script = work / "build.sh"
    script.write_text(render("build.sh.j2", variables))
    env = dict(os.environ, PATH="%s:%s" % (bin_dir, os.environ["PATH"]))
    assert subprocess.run(["bash", str(script)], env=env, timeout=60).returncode == 0, \
        (work / "build.log").read_text()
    text = (work / "context" / "out" / "nvcc-version.txt").read_text()
    assert cuda_from_nvcc(text) == "12.4"
    # a CPU build has no nvcc step: its manifest's cuda_version stays empty
    cpu = plan(tmp_path, gpus={"present": False, "archs": []})
    assert "nvcc-version.txt" not in render("build.sh.j2", role_vars(cpu, mode="host"))


MINI_CMAKE = """cmake_minimum_required(VERSION 3.14)
project(mini CXX)
set(CMAKE_RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bin)
option(GGML_NATIVE "x" ON)
option(GGML_CUDA "x" OFF)
add_executable(llama-server server.cpp)
target_compile_definitions(llama-server PRIVATE MINI_VERSION="0.0.1-test")
"""
MINI_SERVER = """#include <cstdio>
int main() {
  std::fprintf(stderr, "version: " MINI_VERSION " (build 7, commit abcdef1)\\n");
  return 0;
}
"""


@pytest.mark.skipif(shutil.which("cmake") is None or shutil.which("c++") is None,
                    reason="needs cmake and c++")
def test_build_script_builds_stages_and_logs(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "CMakeLists.txt").write_text(MINI_CMAKE)
    (src / "server.cpp").write_text(MINI_SERVER)
    work = tmp_path / "work"
    (work / "context").mkdir(parents=True)
    r = plan(tmp_path, mode="host", gpus={"present": False, "archs": []}, targets=["llama-server"])
    variables = role_vars(r, {"_llama_cpp_src": str(src), "_llama_cpp_work": str(work),
                              "llama_cpp_build_jobs": 1}, mode="host")
    script = work / "build.sh"
    script.write_text(render("build.sh.j2", variables))
    assert subprocess.run(["bash", str(script)], timeout=300).returncode == 0
    binary = work / "context" / "out" / "bin" / "llama-server"
    assert os.access(str(binary), os.X_OK)
    out = subprocess.run([str(binary), "--version"], stderr=subprocess.PIPE).stderr.decode()
    assert "version: 0.0.1-test" in out
    log = (work / "build.log").read_text()
    assert "=== llama.cpp build %s (host) started" % r["build_id"] in log and "finished" in log
    assert "GGML_NATIVE:BOOL=OFF" in (work / "build" / "CMakeCache.txt").read_text()
    # A second run resumes in the same build directory (CMakeCache kept, generator kept); it waits while
    # another build of the same directory holds the lock (CI containers share the build root).
    with open(str(work / ".build.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        proc = subprocess.Popen(["bash", str(script)])
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(timeout=2)
        assert (work / "build.log").read_text().count("started") == 1
    assert proc.wait(timeout=300) == 0
    assert (work / "build.log").read_text().count("started") == 2

    # A compile error: non-zero exit, the compiler's message in the log (the role quotes its tail).
    (src / "server.cpp").write_text("int main() { return undeclared_symbol; }\n")
    assert subprocess.run(["bash", str(script)], timeout=300).returncode != 0
    assert "undeclared_symbol" in (work / "build.log").read_text()


# --- role wiring -------------------------------------------------------------------------------------------

def test_el7_defaults_to_container_and_refuses_host():
    el7 = load_yaml(os.path.join(ROLE, "vars", "RedHat-7.yml"))
    assert el7["_llama_cpp_default_build_mode"] == "container"
    assert el7["_llama_cpp_host_build_supported"] is False
    assert load_yaml(os.path.join(ROLE, "vars", "Debian.yml"))["_llama_cpp_default_build_mode"] == "host"


@pytest.mark.parametrize("distribution, family, major, expected", [
    ("CentOS", "RedHat", "7", "RedHat-7.yml"),
    ("RedHat", "RedHat", "7", "RedHat-7.yml"),
    ("Rocky", "RedHat", "9", "RedHat.yml"),
    ("Debian", "Debian", "12", "Debian.yml"),
    ("Ubuntu", "Debian", "24", "Debian.yml"),
])
def test_os_variables_are_loaded_first_through_os_vars_file(distribution, family, major, expected):
    from ansible_collections.llmops.serving.plugins.filter.os_vars import os_vars_file
    first = load_yaml(os.path.join(ROLE, "tasks", "main.yml"))[0]
    assert first["ansible.builtin.include_vars"] == \
        "{{ role_path | llmops.serving.os_vars_file(ansible_facts) }}"
    facts = {"distribution": distribution, "os_family": family, "distribution_major_version": major}
    assert os.path.basename(os_vars_file(ROLE, facts)) == expected


def test_internal_variables_carry_the_role_prefix():
    for base, _dirs, files in os.walk(ROLE):
        for name in files:
            with open(os.path.join(base, name)) as handle:
                assert "llama_cpp__" not in handle.read(), os.path.join(base, name)


def test_default_images_are_the_cuda_12_4_devel_and_runtime_images():
    defaults = load_yaml(os.path.join(ROLE, "defaults", "main.yml"))
    templar = _templar(defaults)
    assert templar.template(defaults["llama_cpp_builder_image"]) == "nvidia/cuda:12.4.1-devel-ubuntu22.04"
    assert templar.template(defaults["llama_cpp_runtime_image"]) == "nvidia/cuda:12.4.1-runtime-ubuntu22.04"


# --- CUDA base images: registry mirror, digest pin, pull failures ------------------------------------------

DIGEST = "sha256:" + "4f" * 32


def defaults_vars(**extra):
    variables = load_yaml(os.path.join(ROLE, "defaults", "main.yml"))
    variables.update(load_yaml(os.path.join(ROLE, "vars", "RedHat-7.yml")))
    variables.update({"inventory_hostname": "l20-node-01"})
    variables.update(extra)
    return variables


def expr(variables, text):
    return _templar(variables).template(text)


def test_image_references_are_composed_from_registry_repository_tag_and_digest():
    v = defaults_vars()
    # Defaults: Docker Hub by tag, exactly the references (and build identities) of before.
    assert expr(v, "{{ llama_cpp_builder_image }}") == "nvidia/cuda:12.4.1-devel-ubuntu22.04"
    assert expr(v, "{{ llama_cpp_runtime_image }}") == "nvidia/cuda:12.4.1-runtime-ubuntu22.04"
    v = defaults_vars(llama_cpp_cuda_image_registry="registry.lan:5000/",
                      llama_cpp_builder_image_digest=DIGEST,
                      llama_cpp_runtime_image_digest=DIGEST[len("sha256:"):])  # the prefix is optional
    assert expr(v, "{{ llama_cpp_builder_image }}") == (
        "registry.lan:5000/nvidia/cuda:12.4.1-devel-ubuntu22.04@" + DIGEST)
    assert expr(v, "{{ llama_cpp_runtime_image }}") == (
        "registry.lan:5000/nvidia/cuda:12.4.1-runtime-ubuntu22.04@" + DIGEST)
    v = defaults_vars(llama_cpp_cuda_image_repository="mirror/cuda",
                      llama_cpp_builder_image_tag="12.4.0-devel-ubuntu22.04")
    assert expr(v, "{{ llama_cpp_builder_image }}") == "mirror/cuda:12.4.0-devel-ubuntu22.04"


def test_dockerfile_pins_the_base_images_by_digest(tmp_path):
    v = defaults_vars(llama_cpp_builder_image_digest=DIGEST, llama_cpp_runtime_image_digest=DIGEST)
    builder, runtime = expr(v, "{{ llama_cpp_builder_image }}"), expr(v, "{{ llama_cpp_runtime_image }}")
    r = plan(tmp_path, builder_image=builder, runtime_image=runtime)
    text = render("Dockerfile.j2", role_vars(r, v))
    assert "ARG BUILDER_IMAGE=nvidia/cuda:12.4.1-devel-ubuntu22.04@" + DIGEST in text
    assert "ARG RUNTIME_IMAGE=nvidia/cuda:12.4.1-runtime-ubuntu22.04@" + DIGEST in text
    # The digest is part of the build identity: another image, another build.
    assert r["build_id"] != plan(tmp_path)["build_id"]


def test_a_malformed_digest_is_refused():
    tasks = load_yaml(os.path.join(ROLE, "tasks", "validate.yml"))
    task = next(t for t in tasks if "digest" in t["name"])
    for digest, ok in (("", True), (DIGEST, True), (DIGEST[7:], True), ("sha256:1234", False),
                       ("12.4.1-devel", False)):
        v = defaults_vars(llama_cpp_builder_image_digest=digest)
        assert all(expr(v, "{{ %s }}" % c) for c in task["ansible.builtin.assert"]["that"]) is ok, digest
    msg = expr(defaults_vars(), task["ansible.builtin.assert"]["fail_msg"])
    assert "llama_cpp_builder_image_digest" in msg


def container_tasks():
    return load_yaml(os.path.join(ROLE, "tasks", "build-container.yml"))


def test_base_images_are_pulled_before_the_build_only_when_missing():
    tasks = container_tasks()
    names = [t["name"] for t in tasks]
    check = next(t for t in tasks if "ansible.builtin.command" in t and "loop" in t and "inspect" in str(t))
    pull = next(t for t in tasks if "pull" in str(t.get("ansible.builtin.command", "")))
    build = next(t for t in tasks if t["name"].startswith("Build the builder image"))
    assert names.index(check["name"]) < names.index(pull["name"]) < names.index(build["name"])
    v = defaults_vars(llama_cpp_builder_image_digest=DIGEST, _llama_cpp_builder_inspect={"rc": 1})
    assert expr(v, check["loop"]) == ["nvidia/cuda:12.4.1-devel-ubuntu22.04@" + DIGEST,
                                      "nvidia/cuda:12.4.1-runtime-ubuntu22.04"]
    # A builder image built earlier needs no devel base (its tag may be gone by now).
    v = defaults_vars(_llama_cpp_builder_inspect={"rc": 0})
    assert expr(v, check["loop"]) == ["nvidia/cuda:12.4.1-runtime-ubuntu22.04"]
    v = defaults_vars(_llama_cpp_builder_inspect={"rc": 1}, _llama_cpp_base_inspect={"results": [
        {"item": "nvidia/cuda:12.4.1-devel-ubuntu22.04@" + DIGEST, "rc": 1},
        {"item": "nvidia/cuda:12.4.1-runtime-ubuntu22.04", "rc": 0}]})
    assert expr(v, pull["loop"]) == ["nvidia/cuda:12.4.1-devel-ubuntu22.04@" + DIGEST]
    # Pulled by digest when one is set (the tag is only a label then).
    v["item"] = "registry.lan:5000/nvidia/cuda:12.4.1-devel-ubuntu22.04@" + DIGEST
    assert expr(v, pull["ansible.builtin.command"]["argv"]) == [
        "docker", "pull", "registry.lan:5000/nvidia/cuda@" + DIGEST]
    v["item"] = "nvidia/cuda:12.4.1-runtime-ubuntu22.04"
    assert expr(v, pull["ansible.builtin.command"]["argv"])[-1] == "nvidia/cuda:12.4.1-runtime-ubuntu22.04"


def test_both_build_modes_compile_through_the_one_async_task():
    (compile_task, report) = load_yaml(os.path.join(ROLE, "tasks", "compile.yml"))
    assert compile_task["register"] == "_llama_cpp_compile"
    assert compile_task["async"] == "{{ llama_cpp_build_timeout }}" and compile_task["poll"] == 10
    assert compile_task["failed_when"] is False and compile_task["changed_when"] is True
    assert report["ansible.builtin.include_tasks"] == "build-failed.yml"
    assert report["when"] == "_llama_cpp_compile.rc | default(1) != 0"
    work, src = "/var/cache/llmops/0123456789abcdef", "/var/cache/llmops/llama.cpp/src/git-0123456789ab"
    v = defaults_vars(_llama_cpp_work=work, _llama_cpp_src=src, _llama_cpp_builder_tag="b:1",
                      _llama_cpp_container_name="llmops-llama-cpp-build-x", _llama_cpp_network_args=[],
                      _llama_cpp_compile_network_args=["--network", "none"],
                      llama_cpp_ccache=True, llama_cpp_container_extra_volumes=["/srv/m:/srv/m:ro"])
    (host,) = load_yaml(os.path.join(ROLE, "tasks", "build-host.yml"))
    container = next(t for t in container_tasks() if t.get("ansible.builtin.include_tasks") == "compile.yml")
    assert host["ansible.builtin.include_tasks"] == "compile.yml"
    assert expr(v, host["vars"]["_llama_cpp_compile_argv"]) == ["/bin/bash", work + "/build.sh"]
    assert expr(v, container["vars"]["_llama_cpp_compile_argv"]) == [
        "docker", "run", "--rm", "--name", "llmops-llama-cpp-build-x", "--network", "none",
        "--volume", work + ":" + work, "--volume", src + ":" + src + ":ro",
        "--volume", "/var/cache/llmops/ccache:/var/cache/llmops/ccache", "--volume=/srv/m:/srv/m:ro",
        "--workdir", work, "--entrypoint", "/bin/bash", "b:1", work + "/build.sh"]


@pytest.mark.parametrize("web_ui,network,expected", [
    (False, "", ["--network", "none"]),
    (False, "host", ["--network", "none"]),
    (True, "", []),
    (True, "host", ["--network", "host"]),
])
def test_the_compile_has_no_network_unless_the_web_ui_is_downloaded(web_ui, network, expected):
    """The source and the ccache are mounted: nothing outside is needed, so the compile container gets no
    network at all; only upstream's web UI download (llama_cpp_web_ui) needs one. The builder image's own
    build (apt) keeps llama_cpp_container_network either way."""
    names = next(t for t in container_tasks() if "ansible.builtin.set_fact" in t)["ansible.builtin.set_fact"]
    v = defaults_vars(llama_cpp_web_ui=web_ui, llama_cpp_container_network=network)
    assert expr(v, names["_llama_cpp_compile_network_args"]) == expected
    assert expr(v, names["_llama_cpp_network_args"]) == (["--network", network] if network else [])


def test_a_failed_pull_says_what_to_do_when_the_tag_is_gone():
    tasks = container_tasks()
    fail = next(t for t in tasks if "ansible.builtin.fail" in t and "pull" in t["name"])
    gone = {"item": "nvidia/cuda:12.4.1-devel-ubuntu22.04", "rc": 1, "stderr":
            "Error response from daemon: manifest for nvidia/cuda:12.4.1-devel-ubuntu22.04 not found: "
            "manifest unknown: manifest unknown"}
    v = defaults_vars(_llama_cpp_base_pull={"results": [gone, {"item": "x", "rc": 0, "stderr": ""}]})
    assert expr(v, "{{ %s }}" % fail["when"]) is True
    msg = " ".join(expr(v, fail["ansible.builtin.fail"]["msg"]).split())
    assert "nvidia/cuda:12.4.1-devel-ubuntu22.04" in msg and "manifest unknown" in msg
    for text in ("end-of-life", "docker save", "docker load", "l20-node-01", "docker push",
                 "llama_cpp_cuda_image_registry", "llama_cpp_builder_image_digest"):
        assert text in msg, text
    ok = defaults_vars(_llama_cpp_base_pull={"results": [{"item": "x", "rc": 0}]})
    assert expr(ok, "{{ %s }}" % fail["when"]) is False
    assert expr(defaults_vars(_llama_cpp_base_pull={"results": []}), "{{ %s }}" % fail["when"]) is False


def test_l20_inventory_shows_where_to_pin_the_cuda_images():
    with open(os.path.join(ROOT, "inventories", "l20", "group_vars", "l20", "main.yml")) as handle:
        text = handle.read()
    inv = load_yaml(os.path.join(ROOT, "inventories", "l20", "group_vars", "l20", "main.yml"))
    for name in ("llama_cpp_builder_image_digest", "llama_cpp_runtime_image_digest"):
        assert name in inv
    assert "llama_cpp_cuda_image_registry" in text and "docker save" in text
