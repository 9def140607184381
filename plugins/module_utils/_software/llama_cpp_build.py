# -*- coding: utf-8 -*-
# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
# PRIVATE to llmops.serving: it can change at any time; do not import it from other collections.
"""Build identity and CMake options for llama.cpp builds (role llmops.serving.llama_cpp).

Pure functions, Python 3.6, standard library only: the llama_cpp_build_info module calls them on the managed
node, the unit tests call them directly.

The build identity is everything that decides what binary comes out: the source (a full commit - from git
or an archive of it -, else git repo + ref, archive sha256 or directory content hash), the build mode, the
CMake arguments, the targets, the base images (container mode; a digest without its registry host) or the
host platform (host mode). Where the source or an image was fetched from is not identity: the same commit or
digest from a mirror, GitHub or an offline bundle is the same input, so the same build (and its image, which
a bundle carries to a node with no route out, is used there as it is). build_id = first 16 hex digits of
the sha256 of the canonical JSON of that identity; a build whose manifest carries the same identity is not
built again.
Things that only change how fast a build runs (jobs, ccache, build root) are deliberately left out.
"""

from __future__ import absolute_import, division, print_function

import fnmatch
import hashlib
import json
import os
import re
import stat

from ansible_collections.llmops.serving.plugins.module_utils._software.image_reference import (
    content_reference,
)
from ansible_collections.llmops.serving.plugins.module_utils.validators import matches, whole

__metaclass__ = type

# 2: a full commit is the source whatever it came from (no repo; an archive with llama_cpp_archive_commit),
# images pinned by digest without their registry host.
IDENTITY_SCHEMA = 2
BUILD_ID_LENGTH = 16

# The llama.cpp commit pinned by default: the tree vendored by llama-cpp-python 0.3.36
# (ggml-org/llama.cpp@0c1e57098, 2026-10-01; CMake reports llama.cpp 0.5.0-dev, ggml 0.25.3).
DEFAULT_REF = "0c1e57098bba43ac29e6e3b677cdceebdd22334f"

DEFAULT_TARGETS = ("llama-server", "llama-cli", "llama-quantize", "llama-bench")

# CMake options that older recipes pass but the pinned llama.cpp no longer has. Each entry says what to
# do instead; `replacement` is the option to use, or None when the behaviour is automatic now.
# Checked against the pinned tree by tests/unit/plugins/module_utils/test_llama_cpp_build.py (none of these
# is an option()).
REMOVED_OPTIONS = {
    "GGML_CUDA_F16": {
        "replacement": None,
        "reason": "removed from ggml: the CUDA backend chooses FP16 paths itself; "
                  "to steer kernels use GGML_CUDA_FORCE_MMQ or GGML_CUDA_FORCE_CUBLAS",
    },
    "LLAMA_CURL": {
        "replacement": "LLAMA_OPENSSL",
        "reason": "libcurl support was removed (the pinned tree ignores it with a warning); model downloads "
                  "use the built-in HTTP client, HTTPS comes from LLAMA_OPENSSL (ON by default)",
    },
    "LLAMA_SERVER_SSL": {
        "replacement": "LLAMA_OPENSSL",
        "reason": "server TLS is built in when LLAMA_OPENSSL is ON (the default)",
    },
    "LLAMA_CUBLAS": {"replacement": "GGML_CUDA", "reason": "renamed (a fatal error in the pinned tree)"},
    "LLAMA_CUDA": {"replacement": "GGML_CUDA", "reason": "renamed; set llama_cpp_cuda instead"},
    "LLAMA_NATIVE": {"replacement": "GGML_NATIVE", "reason": "renamed; the role always sets GGML_NATIVE=OFF"},
    "LLAMA_RPC": {"replacement": "GGML_RPC", "reason": "renamed"},
    "LLAMA_METAL": {"replacement": "GGML_METAL", "reason": "renamed"},
    "LLAMA_CUDA_F16": {"replacement": None, "reason": "removed (see GGML_CUDA_F16)"},
    "GGML_CUDA_DMMV_X": {"replacement": None, "reason": "the DMMV kernels were removed from ggml-cuda"},
    "GGML_CUDA_MMV_Y": {"replacement": None, "reason": "the DMMV kernels were removed from ggml-cuda"},
    "GGML_CUDA_FORCE_DMMV": {"replacement": None, "reason": "the DMMV kernels were removed from ggml-cuda"},
    "GGML_CUDA_KQUANTS_ITER": {"replacement": None, "reason": "removed from ggml-cuda"},
    "GGML_CUDA_PEER_MAX_BATCH_SIZE": {
        "replacement": None,
        "reason": "removed; peer copies are switched off with GGML_CUDA_NO_PEER_COPY",
    },
}

# Options the role sets from its own variables; extra options may not override them.
MANAGED_OPTIONS = {
    "CMAKE_BUILD_TYPE": "llama_cpp_build_type",
    "GGML_NATIVE": "(always OFF: binaries must run on any CPU of the fleet)",
    "BUILD_SHARED_LIBS": "(always OFF: static binaries; llama_cpp_shared_libs was removed)",
    "GGML_CUDA": "llama_cpp_cuda",
    "CMAKE_CUDA_ARCHITECTURES": "llama_cpp_cuda_architectures (or the gpu_facts fact llmops_gpus.archs)",
    "GGML_CCACHE": "llama_cpp_ccache",
    "LLAMA_USE_PREBUILT_UI": "llama_cpp_web_ui",
    "LLAMA_BUILD_UI": "llama_cpp_web_ui",
}

_OPTION_NAME = whole(r"[A-Za-z_][A-Za-z0-9_]*(:(BOOL|STRING|PATH|FILEPATH|INTERNAL))?")
_ARCH = whole(r"[1-9][0-9]{1,2}[af]?(-real|-virtual)?")
_TARGET = whole(r"[A-Za-z0-9][A-Za-z0-9_.+-]*")
_SHA256 = whole(r"[0-9a-f]{64}")
_COMMIT = whole(r"[0-9a-f]{40}")
_RELEASE_TAG = whole(r"b[0-9]+")


class BuildError(ValueError):
    """Bad input: the message says what to change."""


def cuda_wanted(setting, gpus_present):
    """llama_cpp_cuda: 'auto' follows llmops_gpus.present; true/false force it."""
    if isinstance(setting, bool):
        return setting
    text = str(setting).strip().lower()
    if text in ("auto", ""):
        return bool(gpus_present)
    if text in ("true", "yes", "on", "1"):
        return True
    if text in ("false", "no", "off", "0"):
        return False
    raise BuildError("llama_cpp_cuda must be auto, true or false, not %r" % (setting,))


def normalize_archs(archs):
    """["89", 90, "89"] or "89;90" -> "89;90" (sorted numerically, unique). Empty input -> ""."""
    if archs is None:
        return ""
    if isinstance(archs, (str, int)):
        items = [a for a in re.split(r"[;,\s]+", str(archs)) if a]
    else:
        items = [str(a).strip() for a in archs if str(a).strip()]
    out = []
    for item in items:
        if item.startswith("sm_"):
            item = item[3:]
        if "." in item:  # "8.9" compute capability
            major, minor = item.split(".", 1)
            item = major + minor
        if not _ARCH.match(item):
            raise BuildError(
                "CUDA architecture %r is not valid: use numbers like 89 (L20/L40/RTX 4090), 90 (H100/H200), "
                "optionally with a/f or -real/-virtual suffix" % (item,))
        if item not in out:
            out.append(item)
    out.sort(key=lambda a: (int(re.match(r"[0-9]+", a).group(0)), a))
    return ";".join(out)


def cmake_value(value):
    """Python value -> CMake command-line value."""
    if isinstance(value, bool):
        return "ON" if value else "OFF"
    if value is None:
        raise BuildError("CMake option values may not be empty (null)")
    if isinstance(value, (int, float)):
        return str(value)
    text = str(value)
    if "\n" in text or "\r" in text or "\x00" in text:
        raise BuildError("CMake option values may not contain newlines: %r" % (text,))
    return text


def removed_option_message(name):
    entry = REMOVED_OPTIONS[name]
    msg = "CMake option %s is not supported by the pinned llama.cpp: %s" % (name, entry["reason"])
    if entry["replacement"]:
        msg += "; use %s instead" % entry["replacement"]
    else:
        msg += "; remove it from llama_cpp_cmake_extra_options"
    return msg


def check_extra_options(extra, removed_policy="fail"):
    """Validate llama_cpp_cmake_extra_options. Returns (options sorted by name, warnings).

    Removed options: policy 'fail' raises BuildError, 'warn' drops them and returns a warning each.
    """
    if extra is None:
        extra = {}
    if not isinstance(extra, dict):
        raise BuildError("llama_cpp_cmake_extra_options must be a dict of OPTION: value, not %s"
                         % type(extra).__name__)
    if removed_policy not in ("fail", "warn"):
        raise BuildError("llama_cpp_removed_option_policy must be fail or warn, not %r" % (removed_policy,))
    warnings = []
    errors = []
    kept = []
    for key in sorted(extra):
        name = str(key)
        if not _OPTION_NAME.match(name):
            errors.append("%r is not a CMake option name (letters, digits, _; optional :TYPE)" % (name,))
            continue
        bare = name.split(":", 1)[0]
        if bare in MANAGED_OPTIONS:
            errors.append("CMake option %s is set by the role: use %s, not llama_cpp_cmake_extra_options"
                          % (bare, MANAGED_OPTIONS[bare]))
            continue
        if bare in REMOVED_OPTIONS:
            if removed_policy == "fail":
                errors.append(removed_option_message(bare))
            else:
                warnings.append(removed_option_message(bare) + " (dropped)")
            continue
        kept.append((name, cmake_value(extra[key])))
    if errors:
        raise BuildError("; ".join(errors))
    return kept, warnings


def validate_targets(targets):
    if isinstance(targets, str):
        targets = [targets]
    out = []
    for target in targets or []:
        target = str(target).strip()
        if not _TARGET.match(target):
            raise BuildError("build target %r is not a valid CMake target name" % (target,))
        if target not in out:
            out.append(target)
    if "llama-server" not in out:
        raise BuildError("llama_cpp_targets must include llama-server (the role publishes its path), got %s"
                         % (out,))
    return sorted(out)


def cmake_args(cuda=False, archs=None, web_ui=False, build_type="Release", extra=None,
               removed_policy="fail"):
    """The CMake -D arguments that define the product. Returns (args, warnings).

    archs: CUDA architectures (list or string), required when cuda is true.
    web_ui: embed llama-server's web UI. The pinned tree fetches it from Hugging Face while it builds
    (LLAMA_USE_PREBUILT_UI, default ON upstream: tag b<N>, else "latest"), so a build with it needs that
    host and can embed whatever "latest" is that day; without it nothing is fetched, the build runs with
    its network off, and llama-server serves the API only. Either way the choice is in the identity.
    Libraries are always static: one self-contained binary per build, nothing to resolve at run time but
    the C/C++ runtime, the CUDA runtime and the host driver.
    """
    if not matches(r"[A-Za-z]+", str(build_type)):
        raise BuildError("llama_cpp_build_type must be a CMake build type such as Release, not %r"
                         % (build_type,))
    extra_kept, warnings = check_extra_options(extra, removed_policy)
    args = [
        "-DCMAKE_BUILD_TYPE=%s" % build_type,
        "-DGGML_NATIVE=OFF",
        "-DBUILD_SHARED_LIBS=OFF",
        "-DLLAMA_BUILD_TESTS=OFF",
        "-DLLAMA_BUILD_EXAMPLES=OFF",
        "-DLLAMA_BUILD_UI=OFF",
        "-DLLAMA_USE_PREBUILT_UI=%s" % ("ON" if web_ui else "OFF"),
    ]
    if cuda:
        arch_text = normalize_archs(archs)
        if not arch_text:
            raise BuildError(
                "a CUDA build needs CUDA architectures: gpu_facts found none (llmops_gpus.archs is empty); "
                "run llmops.serving.gpu_facts first or set llama_cpp_cuda_architectures, e.g. ['89'] for L20")
        args.append("-DGGML_CUDA=ON")
        args.append("-DCMAKE_CUDA_ARCHITECTURES=%s" % arch_text)
    else:
        args.append("-DGGML_CUDA=OFF")
    for name, value in extra_kept:
        args.append("-D%s=%s" % (name, value))
    return args, warnings


def speed_args(ccache):
    """Arguments that change build speed only (never part of the identity)."""
    return ["-DGGML_CCACHE=%s" % ("ON" if ccache else "OFF")]


def ref_warning(ref):
    """A warning when a git ref is not an immutable pin (commit SHA or bNNNN release tag)."""
    if _COMMIT.match(ref) or _RELEASE_TAG.match(ref) or re.match(r"^v?[0-9]+\.[0-9]+", ref):
        return None
    return ("llama_cpp_git_ref %r does not look like a commit SHA or a release tag (bNNNN): the build id "
            "follows the ref name, so new commits on a branch are not rebuilt" % (ref,))


def archive_commit_of(value):
    """llama_cpp_archive_commit: the full commit (lowercase) an archive is a `git archive` of, or ''."""
    text = str(value or "").strip().lower()
    if text and not _COMMIT.fullmatch(text):
        raise BuildError("llama_cpp_archive_commit must be the full 40-hex-digit commit the archive is a "
                         "`git archive` of, or empty, not %r" % (value,))
    return text


def source_identity(source_type, git_repo=None, git_ref=None, archive_sha256=None, dir_hash=None,
                    archive_commit=None):
    """The source part of the identity. A full commit names the tree whatever it came from: a git checkout
    of it (from GitHub or a mirror) and an archive of it (archive_commit) give the same
    {"type": "git", "commit": ...}; the archive's sha256 is still checked when it is fetched, it is just not
    the tree's name then."""
    commit = archive_commit_of(archive_commit)
    if source_type == "git":
        if not git_repo or not git_ref:
            raise BuildError("source type git needs llama_cpp_git_repo and llama_cpp_git_ref")
        if _COMMIT.fullmatch(str(git_ref).strip().lower()):
            return {"type": "git", "commit": str(git_ref).strip().lower()}
        # a tag or branch names no fixed tree: which repository it is read from matters
        return {"type": "git", "repo": git_repo, "ref": git_ref}
    if source_type == "archive":
        digest = (archive_sha256 or "").strip().lower()
        if digest.startswith("sha256:"):
            digest = digest[7:]
        if not _SHA256.match(digest):
            raise BuildError("source type archive needs llama_cpp_archive_sha256 (64 hex digits), got %r"
                             % (archive_sha256,))
        if commit:
            return {"type": "git", "commit": commit}
        return {"type": "archive", "sha256": digest}
    if source_type == "dir":
        if not dir_hash:
            raise BuildError("source type dir needs the directory content hash")
        return {"type": "dir", "content_sha256": dir_hash}
    raise BuildError("llama_cpp_source_type must be git, archive or dir, not %r" % (source_type,))


def source_key(source):
    """The name of a source's checkout under the build root. A source that is a full commit (a git checkout
    of it, an archive of it) is named by the commit alone: the same commit from another URL (a mirror,
    another clone's local copy, an offline bundle's archive) is the same tree, and keeping its path lets
    ccache hit (the compile lines and __FILE__ hold the path). Any other source is named by its whole
    identity."""
    commit = str(source.get("commit") or "")
    if source.get("type") == "git" and _COMMIT.fullmatch(commit):
        return "git-" + commit[:16]
    digest = hashlib.sha256(canonical_json(source).encode("ascii")).hexdigest()
    return "%s-%s" % (source.get("type"), digest[:16])


def build_identity(source, mode, args, targets, builder_image=None, runtime_image=None, platform=None):
    """The dict whose canonical JSON defines the build."""
    if mode not in ("host", "container"):
        raise BuildError("llama_cpp_build_mode must be host or container, not %r" % (mode,))
    identity = {
        "schema": IDENTITY_SCHEMA,
        "source": source,
        "mode": mode,
        "cmake_args": list(args),
        "targets": validate_targets(targets),
    }
    if mode == "container":
        if not builder_image or not runtime_image:
            raise BuildError("container mode needs llama_cpp_builder_image and llama_cpp_runtime_image")
        identity["builder_image"] = content_reference(builder_image)
        identity["runtime_image"] = content_reference(runtime_image)
    else:
        identity["platform"] = platform or {}
    return identity


def canonical_json(data):
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def identity_sha256(identity):
    return hashlib.sha256(canonical_json(identity).encode("utf-8")).hexdigest()


def build_id(identity):
    return identity_sha256(identity)[:BUILD_ID_LENGTH]


DEFAULT_DIR_EXCLUDES = (".git", "build", "build-*", "*/__pycache__", "__pycache__", "*.pyc")


def _excluded(rel, patterns):
    return any(fnmatch.fnmatchcase(rel, p) for p in patterns)


def dir_content_hash(root, excludes=DEFAULT_DIR_EXCLUDES):
    """sha256 over relative path, file type, executable bit and content of every file below root.

    Order-independent of the filesystem (sorted walk); mtimes and owners are ignored, so a copy of the
    same tree hashes the same. Symlinks are hashed by their target text, never followed.
    """
    if not os.path.isdir(root):
        raise BuildError("llama_cpp_source_dir %s is not a directory on the node" % root)
    if not os.path.isfile(os.path.join(root, "CMakeLists.txt")):
        raise BuildError("llama_cpp_source_dir %s has no CMakeLists.txt: point it at the top of a llama.cpp "
                         "source tree" % root)
    outer = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = os.path.relpath(dirpath, root)
        rel_dir = "" if rel_dir == "." else rel_dir
        keep = []
        for d in sorted(dirnames):
            rel = os.path.join(rel_dir, d) if rel_dir else d
            full = os.path.join(dirpath, d)
            if _excluded(rel, excludes):
                continue
            if os.path.islink(full):
                filenames.append(d)  # hashed as a link below, never followed
                continue
            keep.append(d)
        dirnames[:] = keep
        for name in sorted(set(filenames)):
            rel = os.path.join(rel_dir, name) if rel_dir else name
            if _excluded(rel, excludes):
                continue
            full = os.path.join(dirpath, name)
            st = os.lstat(full)
            if stat.S_ISLNK(st.st_mode):
                entry = "L\0%s\0%s" % (rel, os.readlink(full))
            elif stat.S_ISREG(st.st_mode):
                digest = hashlib.sha256()
                with open(full, "rb") as handle:
                    for chunk in iter(lambda: handle.read(1 << 20), b""):
                        digest.update(chunk)
                entry = "F\0%s\0%d\0%s" % (rel, 1 if st.st_mode & 0o111 else 0, digest.hexdigest())
            else:
                continue  # sockets, fifos: not source
            outer.update(entry.encode("utf-8", "surrogateescape"))
            outer.update(b"\n")
    return outer.hexdigest()


def read_manifest(path):
    """The manifest dict, or None when missing or unreadable (a half-written install counts as absent)."""
    try:
        with open(path) as handle:
            data = json.load(handle)
    except (IOError, OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def installed_builds(install_root):
    """{build_id: manifest} for every build under <install_root>/builds with a readable manifest."""
    builds = {}
    base = os.path.join(install_root, "builds")
    if not os.path.isdir(base):
        return builds
    for name in sorted(os.listdir(base)):
        manifest = read_manifest(os.path.join(base, name, "manifest.json"))
        if manifest is not None and manifest.get("build_id") == name:
            builds[name] = manifest
    return builds


def link_target_id(path):
    """Build id a current/previous symlink points at, or None."""
    if not os.path.islink(path):
        return None
    return os.path.basename(os.path.normpath(os.readlink(path))) or None


def link_points_at(path, build_id):
    """True when `path` is the relative symlink builds/<build_id> that tasks/links.yml writes."""
    return bool(build_id) and os.path.islink(path) and os.readlink(path) == "builds/" + build_id


def links_in_place(install_root, build_id, next_previous):
    """Whether current already points at this build and previous at what it would point at: then the role's
    link tasks have nothing to do and are skipped (a run that changes nothing)."""
    return link_points_at(os.path.join(install_root, "current"), build_id) and (
        not next_previous or link_points_at(os.path.join(install_root, "previous"), next_previous))


def is_installed(manifest, wanted_identity_sha256, mode):
    """True when the manifest describes this exact identity and (host mode) its binary is there."""
    if not manifest or manifest.get("identity_sha256") != wanted_identity_sha256:
        return False
    if manifest.get("mode") != mode:
        return False
    if mode == "host":
        binary = manifest.get("binary") or ""
        return os.path.isfile(binary) and os.access(binary, os.X_OK)
    return True  # the role checks the image with `docker image inspect`


def plan_links(new_id, current_id, previous_id):
    """current/previous after installing (or re-selecting) new_id."""
    if current_id == new_id:
        return new_id, previous_id
    return new_id, current_id if current_id else previous_id


def builds_to_prune(builds, keep, protect):
    """Build ids to delete: the oldest beyond `keep`, never one in `protect` (current, previous).

    builds: {build_id: manifest}; age from manifest installed_at (ISO 8601 UTC sorts as text).
    """
    if keep < 0:
        raise BuildError("the number of builds to keep cannot be negative")
    protect = set(p for p in protect if p)
    ordered = sorted(builds, key=lambda b: (str(builds[b].get("installed_at", "")), b), reverse=True)
    kept = [b for b in ordered if b in protect]
    prune = []
    for b in ordered:
        if b in protect:
            continue
        if len(kept) < keep:
            kept.append(b)
        else:
            prune.append(b)
    return sorted(prune)


def parse_version(output):
    """`llama-server --version` output -> '0.5.0-dev (build 1, commit 0c1e570)' (or the first line)."""
    for line in (output or "").splitlines():
        line = line.strip()
        if line.startswith("version:"):
            return line[len("version:"):].strip()
    for line in (output or "").splitlines():
        if line.strip():
            return line.strip()
    return ""
