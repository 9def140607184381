# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""CMake arguments, removed options and build identity of role llama_cpp (module_utils/llama_cpp_build)."""
import glob
import os
import re

import pytest
from ansible_collections.llmops.serving.plugins.module_utils._software import llama_cpp_build as lb

from tests.fixtures.llama_cpp_source import ensure_source


def args_dict(args):
    out = {}
    for arg in args:
        assert arg.startswith("-D"), arg
        key, _, value = arg[2:].partition("=")
        out[key] = value
    return out


# --- CUDA decision and architectures ---------------------------------------------------------------

@pytest.mark.parametrize("setting,present,expected", [
    ("auto", True, True), ("auto", False, False), ("", True, True),
    (True, False, True), (False, True, False), ("true", False, True), ("False", True, False),
    ("on", False, True), ("no", True, False),
])
def test_cuda_wanted(setting, present, expected):
    assert lb.cuda_wanted(setting, present) is expected


def test_cuda_wanted_rejects_nonsense():
    with pytest.raises(lb.BuildError, match="auto, true or false"):
        lb.cuda_wanted("maybe", True)


@pytest.mark.parametrize("archs,expected", [
    (["89"], "89"),
    ([89], "89"),
    (["90", "89", "89"], "89;90"),
    ("89;90", "89;90"),
    ("120,89", "89;120"),
    (["sm_89"], "89"),
    (["8.9", "9.0"], "89;90"),
    (["90a", "89-real"], "89-real;90a"),
    ([], ""),
    (None, ""),
])
def test_normalize_archs(archs, expected):
    assert lb.normalize_archs(archs) == expected


@pytest.mark.parametrize("bad", [["sm89x"], ["ampere"], ["7"], ["89;rm -rf /"]])
def test_normalize_archs_rejects_bad_values(bad):
    with pytest.raises(lb.BuildError, match="not valid"):
        lb.normalize_archs(bad)


# --- CMake arguments -----------------------------------------------------------------------------------

def test_cuda_args_take_arch_from_facts():
    gpus = {"present": True, "archs": ["89"]}  # what gpu_facts publishes for 4x L20
    args, warnings = lb.cmake_args(cuda=lb.cuda_wanted("auto", gpus["present"]), archs=gpus["archs"])
    d = args_dict(args)
    assert d["GGML_CUDA"] == "ON"
    assert d["CMAKE_CUDA_ARCHITECTURES"] == "89"
    assert d["GGML_NATIVE"] == "OFF"
    assert d["BUILD_SHARED_LIBS"] == "OFF"
    assert d["CMAKE_BUILD_TYPE"] == "Release"
    assert "GGML_CUDA_F16" not in d and "LLAMA_CURL" not in d
    assert warnings == []


def test_cpu_args_have_no_cuda_arch():
    args, _ = lb.cmake_args(cuda=False, archs=["89"])
    d = args_dict(args)
    assert d["GGML_CUDA"] == "OFF"
    assert "CMAKE_CUDA_ARCHITECTURES" not in d


def test_cuda_without_archs_says_what_to_do():
    with pytest.raises(lb.BuildError, match="llama_cpp_cuda_architectures"):
        lb.cmake_args(cuda=True, archs=[])


def test_static_always():
    """The shared-library mode is gone: static binaries whatever else is set."""
    for web_ui in (False, True):
        args = lb.cmake_args(cuda=True, archs=["89"], web_ui=web_ui)[0]
        assert args_dict(args)["BUILD_SHARED_LIBS"] == "OFF"


def test_web_ui_off_fetches_nothing_and_on_uses_upstreams_download():
    """Off (the default): neither the npm build nor the download from Hugging Face, so the compile needs no
    network. On: upstream's prebuilt download, the only way the pinned tree embeds a UI without npm."""
    off = args_dict(lb.cmake_args()[0])
    assert off["LLAMA_USE_PREBUILT_UI"] == "OFF" and off["LLAMA_BUILD_UI"] == "OFF"
    on = args_dict(lb.cmake_args(web_ui=True)[0])
    assert on["LLAMA_USE_PREBUILT_UI"] == "ON" and on["LLAMA_BUILD_UI"] == "OFF"


def test_extra_options_pass_through_sorted_and_converted():
    args, _ = lb.cmake_args(extra={"GGML_CUDA_FA_ALL_QUANTS": True, "GGML_RPC": False,
                                   "GGML_SCHED_MAX_COPIES": 4, "LLAMA_BUILD_NUMBER:STRING": "1"})
    assert args[-4:] == ["-DGGML_CUDA_FA_ALL_QUANTS=ON", "-DGGML_RPC=OFF", "-DGGML_SCHED_MAX_COPIES=4",
                         "-DLLAMA_BUILD_NUMBER:STRING=1"]


@pytest.mark.parametrize("name,replacement", [
    ("GGML_CUDA_F16", None), ("LLAMA_CURL", "LLAMA_OPENSSL"), ("LLAMA_CUBLAS", "GGML_CUDA"),
    ("GGML_CUDA_DMMV_X", None),
])
def test_removed_options_are_refused_with_the_replacement(name, replacement):
    with pytest.raises(lb.BuildError) as info:
        lb.cmake_args(cuda=True, archs=["89"], extra={name: True})
    msg = str(info.value)
    assert name in msg and "not supported by the pinned llama.cpp" in msg
    if replacement:
        assert "use %s instead" % replacement in msg
    else:
        assert "remove it from llama_cpp_cmake_extra_options" in msg


def test_removed_options_warn_policy_drops_them():
    args, warnings = lb.cmake_args(extra={"GGML_CUDA_F16": True, "GGML_RPC": True}, removed_policy="warn")
    d = args_dict(args)
    assert "GGML_CUDA_F16" not in d and d["GGML_RPC"] == "ON"
    assert len(warnings) == 1 and "GGML_CUDA_F16" in warnings[0] and "dropped" in warnings[0]


def test_seed_recipe_options_map_cleanly():
    """The user's seed recipe: everything but GGML_CUDA_F16 is either managed or passes through."""
    seed = {"GGML_CUDA_F16": "ON", "GGML_RPC": "OFF"}
    with pytest.raises(lb.BuildError, match="GGML_CUDA_F16"):
        lb.cmake_args(cuda=True, archs=["89"], extra=seed)
    seed.pop("GGML_CUDA_F16")
    d = args_dict(lb.cmake_args(cuda=True, archs=["89"], extra=seed)[0])
    assert d["GGML_RPC"] == "OFF" and d["CMAKE_CUDA_ARCHITECTURES"] == "89"


@pytest.mark.parametrize("name,var", [
    ("GGML_CUDA", "llama_cpp_cuda"), ("CMAKE_CUDA_ARCHITECTURES", "llama_cpp_cuda_architectures"),
    ("BUILD_SHARED_LIBS", "always OFF"), ("GGML_NATIVE", "always OFF"),
    ("LLAMA_USE_PREBUILT_UI", "llama_cpp_web_ui"), ("LLAMA_BUILD_UI", "llama_cpp_web_ui"),
    ("CMAKE_BUILD_TYPE:STRING", "llama_cpp_build_type"),
])
def test_managed_options_point_at_the_role_variable(name, var):
    with pytest.raises(lb.BuildError) as info:
        lb.cmake_args(extra={name: "ON"})
    assert var in str(info.value)


@pytest.mark.parametrize("extra,match", [
    ({"BAD NAME": 1}, "not a CMake option name"),
    ({"-DFOO": 1}, "not a CMake option name"),
    ({"FOO": "a\nb"}, "newlines"),
    ({"FOO": None}, "empty"),
    (["GGML_RPC"], "must be a dict"),
])
def test_bad_extra_options(extra, match):
    with pytest.raises(lb.BuildError, match=match):
        lb.cmake_args(extra=extra)


def test_all_errors_reported_at_once():
    with pytest.raises(lb.BuildError) as info:
        lb.cmake_args(extra={"GGML_CUDA_F16": True, "GGML_NATIVE": True})
    assert "GGML_CUDA_F16" in str(info.value) and "GGML_NATIVE" in str(info.value)


def test_speed_args_follow_ccache():
    assert lb.speed_args(True) == ["-DGGML_CCACHE=ON"]
    assert lb.speed_args(False) == ["-DGGML_CCACHE=OFF"]


def test_bad_build_type():
    with pytest.raises(lb.BuildError, match="build type"):
        lb.cmake_args(build_type="Release; rm -rf /")


# --- targets ---------------------------------------------------------------------------------------------

def test_targets_sorted_unique_and_need_llama_server():
    assert lb.validate_targets(["llama-server", "llama-cli", "llama-server"]) == ["llama-cli", "llama-server"]
    with pytest.raises(lb.BuildError, match="must include llama-server"):
        lb.validate_targets(["llama-cli"])
    with pytest.raises(lb.BuildError, match="not a valid CMake target"):
        lb.validate_targets(["llama-server", "a b"])


# --- source and build identity ------------------------------------------------------------------------

def identity(**over):
    kw = dict(source=lb.source_identity("git", git_repo="https://github.com/ggml-org/llama.cpp.git",
                                        git_ref=lb.DEFAULT_REF),
              mode="container", args=lb.cmake_args(cuda=True, archs=["89"])[0],
              targets=list(lb.DEFAULT_TARGETS),
              builder_image="nvidia/cuda:12.4.1-devel-ubuntu22.04",
              runtime_image="nvidia/cuda:12.4.1-runtime-ubuntu22.04")
    kw.update(over)
    return lb.build_identity(**kw)


def test_build_id_is_stable_and_canonical():
    a = identity()
    b = identity(targets=list(reversed(lb.DEFAULT_TARGETS)))
    assert lb.build_id(a) == lb.build_id(b)
    assert re.match(r"^[0-9a-f]{16}$", lb.build_id(a))
    assert lb.identity_sha256(a).startswith(lb.build_id(a))
    # The canonical JSON does not depend on dict insertion order.
    assert lb.canonical_json({"b": 1, "a": [1, 2]}) == '{"a":[1,2],"b":1}'


GITHUB = "https://github.com/ggml-org/llama.cpp.git"


@pytest.mark.parametrize("change", [
    dict(source=lb.source_identity("git", git_repo=GITHUB, git_ref="b9999")),
    dict(source=lb.source_identity("git", git_repo=GITHUB, git_ref="1" * 40)),
    dict(source=lb.source_identity("archive", archive_sha256="a" * 64)),
    dict(args=lb.cmake_args(cuda=True, archs=["89", "90"])[0]),
    dict(args=lb.cmake_args(cuda=False)[0]),
    dict(args=lb.cmake_args(cuda=True, archs=["89"], web_ui=True)[0]),
    dict(args=lb.cmake_args(cuda=True, archs=["89"], extra={"GGML_CUDA_FA_ALL_QUANTS": True})[0]),
    dict(targets=["llama-server"]),
    dict(builder_image="registry.local/nvidia/cuda:12.4.1-devel-ubuntu22.04"),
    dict(runtime_image="nvidia/cuda:12.6.0-runtime-ubuntu22.04"),
    dict(mode="host", builder_image=None, runtime_image=None,
         platform={"distribution": "Debian", "version": "12", "architecture": "x86_64"}),
])
def test_build_id_changes_with_every_input(change):
    assert lb.build_id(identity(**change)) != lb.build_id(identity())


def test_build_id_ignores_speed_settings():
    """ccache, jobs and build root are not identity: the same product must not rebuild."""
    base = identity()
    assert "GGML_CCACHE" not in lb.canonical_json(base)
    assert lb.build_id(identity(args=lb.cmake_args(cuda=True, archs=["89"])[0])) == lb.build_id(base)


def test_host_identity_includes_the_platform():
    p1 = {"distribution": "Debian", "version": "12", "architecture": "x86_64"}
    p2 = {"distribution": "Ubuntu", "version": "22.04", "architecture": "x86_64"}
    a = identity(mode="host", platform=p1, builder_image=None, runtime_image=None)
    b = identity(mode="host", platform=p2, builder_image=None, runtime_image=None)
    assert "builder_image" not in a and lb.build_id(a) != lb.build_id(b)


DIGEST = "sha256:" + "4f" * 32


def test_the_same_commit_from_any_repository_is_the_same_build():
    """A full commit names the tree: a mirror's copy of it is the same source, so the same build id."""
    mirror = lb.source_identity("git", git_repo="https://git.lan/llama.cpp.git",
                                git_ref=lb.DEFAULT_REF.upper())
    assert mirror == {"type": "git", "commit": lb.DEFAULT_REF}
    assert lb.build_id(identity(source=mirror)) == lb.build_id(identity())
    other = lb.source_identity("git", git_repo="https://git.lan/llama.cpp.git", git_ref="1" * 40)
    assert lb.build_id(identity(source=other)) != lb.build_id(identity())
    # a tag or a branch is read from a repository: another repository may have another tree under it
    assert lb.source_identity("git", git_repo=GITHUB, git_ref="b9999") == {
        "type": "git", "repo": GITHUB, "ref": "b9999"}
    short = lb.DEFAULT_REF[:12]
    assert lb.source_identity("git", git_repo=GITHUB, git_ref=short)["ref"] == short


def test_an_archive_of_a_commit_is_the_build_of_that_commit():
    """The offline bundle's `git archive` of the pinned commit: with llama_cpp_archive_commit the build id,
    the checkout path (source_key) and so the image tag are those of a git checkout of that commit."""
    archive = lb.source_identity("archive", archive_sha256="b" * 64,
                                 archive_commit=" " + lb.DEFAULT_REF + "\n")
    git = lb.source_identity("git", git_repo=GITHUB, git_ref=lb.DEFAULT_REF)
    assert archive == git == {"type": "git", "commit": lb.DEFAULT_REF}
    assert lb.build_id(identity(source=archive)) == lb.build_id(identity(source=git))
    assert lb.source_key(archive) == lb.source_key(git) == "git-" + lb.DEFAULT_REF[:16]
    # without the commit the archive is named by its sha256: another build
    plain = lb.source_identity("archive", archive_sha256="b" * 64, archive_commit="")
    assert plain == {"type": "archive", "sha256": "b" * 64}
    assert lb.build_id(identity(source=plain)) != lb.build_id(identity(source=git))
    assert lb.source_key(plain).startswith("archive-")


@pytest.mark.parametrize("commit", ["0c1e570", lb.DEFAULT_REF + "0", "g" * 40, "master",
                                    lb.DEFAULT_REF + "\nx"])
def test_an_archive_commit_that_is_not_a_full_commit_is_refused(commit):
    with pytest.raises(lb.BuildError, match="llama_cpp_archive_commit must be the full 40-hex-digit commit"):
        lb.source_identity("archive", archive_sha256="b" * 64, archive_commit=commit)


def test_a_digest_names_the_image_wherever_it_is_pulled_from():
    mirror = "registry.lan:5000/nvidia/cuda:12.4.1-%s-ubuntu22.04@" + DIGEST
    hub = "nvidia/cuda:12.4.1-%s-ubuntu22.04@" + DIGEST
    by_mirror = identity(builder_image=mirror % "devel", runtime_image=mirror % "runtime")
    by_hub = identity(builder_image=hub % "devel", runtime_image=hub % "runtime")
    assert by_mirror == by_hub and by_mirror["builder_image"] == hub % "devel"
    assert lb.build_id(by_mirror) == lb.build_id(by_hub)
    assert lb.build_id(identity(builder_image="nvidia/cuda:12.4.1-devel-ubuntu22.04@sha256:" + "5" * 64,
                                runtime_image=hub % "runtime")) != lb.build_id(by_hub)
    # a tag alone: another registry may hold another image under it
    by_tag = identity(builder_image="registry.lan:5000/nvidia/cuda:12.4.1-devel-ubuntu22.04")
    assert by_tag["builder_image"] == "registry.lan:5000/nvidia/cuda:12.4.1-devel-ubuntu22.04"
    assert lb.build_id(by_tag) != lb.build_id(identity())


def test_archive_identity_normalizes_the_digest():
    digest = "AB" * 32
    assert lb.source_identity("archive", archive_sha256="sha256:" + digest) == {
        "type": "archive", "sha256": digest.lower()}
    with pytest.raises(lb.BuildError, match="64 hex digits"):
        lb.source_identity("archive", archive_sha256="abc")


@pytest.mark.parametrize("kwargs,match", [
    (dict(source_type="git", git_repo="x"), "llama_cpp_git_ref"),
    (dict(source_type="dir"), "content hash"),
    (dict(source_type="svn"), "git, archive or dir"),
])
def test_source_identity_errors(kwargs, match):
    with pytest.raises(lb.BuildError, match=match):
        lb.source_identity(**kwargs)


def test_container_identity_needs_images():
    with pytest.raises(lb.BuildError, match="llama_cpp_builder_image"):
        identity(builder_image="")


def test_ref_warning():
    assert lb.ref_warning(lb.DEFAULT_REF) is None
    assert lb.ref_warning("b6000") is None
    assert "not look like" in lb.ref_warning("master")


# --- directory content hash -------------------------------------------------------------------------------

def make_tree(root):
    os.makedirs(os.path.join(root, "src"))
    os.makedirs(os.path.join(root, ".git"))
    with open(os.path.join(root, "CMakeLists.txt"), "w") as f:
        f.write("project(llama.cpp)\n")
    with open(os.path.join(root, "src", "llama.cpp"), "w") as f:
        f.write("int main() { return 0; }\n")
    with open(os.path.join(root, ".git", "HEAD"), "w") as f:
        f.write("ref: refs/heads/master\n")


def test_dir_hash_follows_content_not_metadata(tmp_path):
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    make_tree(a)
    make_tree(b)
    assert lb.dir_content_hash(a) == lb.dir_content_hash(b)
    before = lb.dir_content_hash(a)
    os.utime(os.path.join(a, "src", "llama.cpp"), (1, 1))
    with open(os.path.join(a, ".git", "HEAD"), "w") as f:
        f.write("0c1e57098bba43ac29e6e3b677cdceebdd22334f\n")  # excluded
    os.makedirs(os.path.join(a, "build", "bin"))  # in-tree build dir: excluded
    with open(os.path.join(a, "build", "bin", "x.o"), "w") as f:
        f.write("obj")
    assert lb.dir_content_hash(a) == before
    with open(os.path.join(a, "src", "llama.cpp"), "a") as f:
        f.write("// patched\n")
    assert lb.dir_content_hash(a) != before


def test_dir_hash_sees_renames_exec_bits_and_links(tmp_path):
    a = str(tmp_path / "a")
    make_tree(a)
    h0 = lb.dir_content_hash(a)
    os.chmod(os.path.join(a, "src", "llama.cpp"), 0o755)
    h1 = lb.dir_content_hash(a)
    assert h1 != h0
    os.symlink("llama.cpp", os.path.join(a, "src", "link.cpp"))
    h2 = lb.dir_content_hash(a)
    assert h2 != h1
    os.rename(os.path.join(a, "src"), os.path.join(a, "src2"))
    assert lb.dir_content_hash(a) != h2


def test_dir_hash_errors(tmp_path):
    with pytest.raises(lb.BuildError, match="not a directory"):
        lb.dir_content_hash(str(tmp_path / "missing"))
    with pytest.raises(lb.BuildError, match="no CMakeLists.txt"):
        lb.dir_content_hash(str(tmp_path))


# --- versions, links, pruning ------------------------------------------------------------------------------

def test_parse_version_of_the_pinned_tree():
    out = "version: 0.5.0-dev (build 1, commit 0c1e570)\nbuilt with GNU 12.2.0 for Linux x86_64\n"
    assert lb.parse_version(out) == "0.5.0-dev (build 1, commit 0c1e570)"
    assert lb.parse_version("version: 6000 (abcdef12)\n") == "6000 (abcdef12)"
    assert lb.parse_version("") == ""


@pytest.mark.parametrize("new,current,previous,expected", [
    ("n", None, None, ("n", None)),          # first install
    ("n", "c", None, ("n", "c")),            # upgrade: old current becomes previous
    ("n", "c", "p", ("n", "c")),
    ("n", "n", "p", ("n", "p")),             # re-run: nothing moves
    ("p", "n", "p", ("p", "n")),             # roll back to previous: they swap
])
def test_plan_links(new, current, previous, expected):
    assert lb.plan_links(new, current, previous) == expected


def manifests(*ids):
    return {b: {"build_id": b, "installed_at": "2026-11-%02dT00:00:00Z" % (i + 1)} for i, b in enumerate(ids)}


def test_prune_keeps_newest_and_protected():
    builds = manifests("a", "b", "c", "d", "e")  # a oldest
    assert lb.builds_to_prune(builds, keep=2, protect=["e"]) == ["a", "b", "c"]
    assert lb.builds_to_prune(builds, keep=2, protect=["a"]) == ["b", "c", "d"]  # rollback target kept
    assert lb.builds_to_prune(builds, keep=5, protect=[]) == []
    assert lb.builds_to_prune(builds, keep=0, protect=[None]) == ["a", "b", "c", "d", "e"]


# --- the pinned llama.cpp tree ----------------------------------------------------------------------

def declared_options(tree):
    names = set()
    for path in [os.path.join(tree, "CMakeLists.txt"), os.path.join(tree, "ggml", "CMakeLists.txt")]:
        with open(path) as f:
            names.update(re.findall(r"^\s*option\s*\(\s*([A-Z0-9_]+)", f.read(), re.M))
    return names


def test_removed_options_table_matches_the_pinned_tree():
    tree = ensure_source()
    options = declared_options(tree)
    assert {"GGML_CUDA", "GGML_NATIVE", "BUILD_SHARED_LIBS", "GGML_CCACHE", "LLAMA_BUILD_TESTS",
            "LLAMA_BUILD_EXAMPLES", "LLAMA_OPENSSL", "GGML_RPC"} <= options
    assert not set(lb.REMOVED_OPTIONS) & options, "an option listed as removed is still declared"
    for entry in lb.REMOVED_OPTIONS.values():
        if entry["replacement"]:
            assert entry["replacement"] in options, entry


def test_default_targets_exist_in_the_pinned_tree():
    tree = ensure_source()
    found = set()
    for path in glob.glob(os.path.join(tree, "tools", "*", "CMakeLists.txt")):
        with open(path) as f:
            found.update(re.findall(r"set\(TARGET\s+(llama-[a-z0-9-]+)\)", f.read()))
    assert set(lb.DEFAULT_TARGETS) <= found


def test_a_pinned_commit_keeps_its_checkout_path_whatever_the_url():
    """The same commit from a mirror or another clone's local copy is the same tree: the same path under the
    build root, so ccache hits (compile lines and __FILE__ hold the path)."""
    commit = "0c1e57098bba43ac29e6e3b677cdceebdd22334f"
    one = lb.source_identity("git", git_repo="file:///work/ci1/.cache/llama.cpp.git", git_ref=commit)
    two = lb.source_identity("git", git_repo="https://mirror.example/llama.cpp.git", git_ref=commit)
    assert lb.source_key(one) == lb.source_key(two) == "git-0c1e57098bba43ac"
    # a branch or tag names no fixed tree: the whole identity names it
    upstream = "https://github.com/ggml-org/llama.cpp"
    branch = lb.source_key(lb.source_identity("git", git_repo=upstream, git_ref="master"))
    assert branch.startswith("git-") and branch != lb.source_key(
        lb.source_identity("git", git_repo="https://mirror.example/llama.cpp.git", git_ref="master"))
    archive = lb.source_identity("archive", archive_sha256="a" * 64)
    assert lb.source_key(archive).startswith("archive-")


def test_links_in_place_only_when_both_links_are_the_role_s_own(tmp_path):
    root = str(tmp_path)
    os.makedirs(os.path.join(root, "builds", "b2"))
    assert not lb.links_in_place(root, "b2", "b1")                       # no links yet
    os.symlink("builds/b2", os.path.join(root, "current"))
    assert lb.links_in_place(root, "b2", None)                           # nothing to roll back to
    assert not lb.links_in_place(root, "b2", "b1")                       # previous missing
    os.symlink("builds/b1", os.path.join(root, "previous"))
    assert lb.links_in_place(root, "b2", "b1")
    assert not lb.links_in_place(root, "b3", "b2")                       # a new build: both move
    os.remove(os.path.join(root, "current"))
    os.symlink(os.path.join(root, "builds", "b2"), os.path.join(root, "current"))
    assert not lb.links_in_place(root, "b2", "b1")                       # absolute: rewritten as ours
