#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: llama_cpp_build_info
short_description: Compute the identity of a llama.cpp build and whether it is installed
author:
  - llmops.serving developers (@llmops)
description:
  - Computes the CMake arguments and the build id of a llama.cpp build from the source, the build mode,
    the CUDA settings (from the gpu_facts fact C(llmops_gpus)), the targets and the images or host
    platform. The build id is the first 16 hex digits of the sha256 of the canonical JSON of that identity.
  - Reads the manifests under O(install_root)/builds and reports whether this exact identity is installed,
    which build C(current) and C(previous) point at, and which builds a new install would prune.
  - Changes nothing on the node; used by the role C(llmops.serving.llama_cpp) to decide whether to build.
version_added: "0.1.0"
extends_documentation_fragment:
  - llmops.serving.attributes
  - llmops.serving.attributes.info_module
options:
  source_type:
    description: Where the source comes from.
    type: str
    choices: [git, archive, dir]
    default: git
  git_repo:
    description: Git URL of llama.cpp (source_type C(git)).
    type: str
  git_ref:
    description: Pinned tag or commit SHA (source_type C(git)).
    type: str
  archive_sha256:
    description: sha256 of the source archive (source_type C(archive)).
    type: str
  archive_commit:
    description:
      - The full commit (40 hex digits) the source archive is a C(git archive) of, or empty (source_type
        C(archive)). With it the source identity is that commit, as for a git checkout of it, so the build id
        equals that of a git build of the same commit (the offline bundle sets it).
    type: str
    default: ""
  source_dir:
    description: llama.cpp source tree on the node (source_type C(dir)); its content hash is the identity.
    type: path
  source_dir_excludes:
    description: Glob patterns of relative paths left out of the directory content hash.
    type: list
    elements: str
    default: ['.git', 'build', 'build-*', '*/__pycache__', '__pycache__', '*.pyc']
  mode:
    description: C(host) builds on the node, C(container) in a builder image.
    type: str
    choices: [host, container]
    required: true
  cuda:
    description: C(auto) builds with CUDA when O(gpus) says GPUs are present; C(true)/C(false) force it.
    type: str
    default: auto
  gpus:
    description: The C(llmops_gpus) fact of gpu_facts (keys C(present), C(archs)).
    type: dict
    default: {}
  cuda_architectures:
    description: CUDA architectures such as V(89); empty means O(gpus)C(.archs).
    type: list
    elements: str
    default: []
  web_ui:
    description:
      - Embed llama-server's web UI, which the pinned llama.cpp downloads from Hugging Face while it builds.
      - V(false) builds with no network and serves the API only. Part of the build identity.
    type: bool
    default: false
  build_type:
    description: CMake build type.
    type: str
    default: Release
  cmake_extra_options:
    description: More CMake options, C(NAME) to value; booleans become ON/OFF.
    type: dict
    default: {}
  removed_option_policy:
    description: What to do with options the pinned llama.cpp removed; C(fail) or drop them with a warning.
    type: str
    choices: [fail, warn]
    default: fail
  targets:
    description: CMake targets to build; must include llama-server.
    type: list
    elements: str
    default: [llama-server, llama-cli, llama-quantize, llama-bench]
  builder_image:
    description: Image the container build compiles in (container mode).
    type: str
  runtime_image:
    description: Base image of the runtime image (container mode).
    type: str
  platform:
    description: Host platform that host-mode binaries depend on (distribution, version, architecture).
    type: dict
    default: {}
  ccache:
    description: Use ccache; changes the speed arguments only, never the build id.
    type: bool
    default: false
  install_root:
    description: Directory that holds C(builds/<build_id>), C(current) and C(previous).
    type: path
    default: /opt/llama.cpp
  keep_builds:
    description: How many builds to keep, current and previous included; at least 2.
    type: int
    default: 3
"""

EXAMPLES = r"""
- name: Compute the llama.cpp build id
  llmops.serving.llama_cpp_build_info:
    source_type: git
    git_repo: https://github.com/ggml-org/llama.cpp.git
    git_ref: 0c1e57098bba43ac29e6e3b677cdceebdd22334f
    mode: container
    gpus: "{{ llmops_gpus }}"
    builder_image: nvidia/cuda:12.4.1-devel-ubuntu22.04
    runtime_image: nvidia/cuda:12.4.1-runtime-ubuntu22.04
  register: llama_cpp_plan
"""

RETURN = r"""
build_id:
  description: First 16 hex digits of RV(identity_sha256).
  returned: always
  type: str
  sample: 3f0c9a51d2e47b18
identity:
  description:
    - The build identity (source, mode, cmake_args, targets, images or platform).
    - A source pinned to a full commit is named by the commit alone (type C(git), key C(commit)), whether it
      is a git checkout or an archive of that commit; an image pinned by digest is named without its registry
      host.
  returned: always
  type: dict
identity_sha256:
  description: sha256 of the canonical JSON of RV(identity).
  returned: always
  type: str
source_key:
  description:
    - Name of the source's checkout under the build root. A git source pinned to a full commit is named by the
      commit alone (the same commit from another URL is the same tree, and the same path keeps ccache hits).
  returned: always
  type: str
  sample: git-0c1e57098bba43ac
cmake_args:
  description: CMake -D arguments that define the product.
  returned: always
  type: list
  elements: str
  sample: ["-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=OFF", "-DCMAKE_CUDA_ARCHITECTURES=89"]
speed_args:
  description: CMake arguments that only change build speed (ccache).
  returned: always
  type: list
  elements: str
cuda:
  description: Whether this is a CUDA build.
  returned: always
  type: bool
cuda_architectures:
  description: The CUDA architectures, C(;)-separated; empty for CPU builds.
  returned: always
  type: str
targets:
  description: Sorted build targets.
  returned: always
  type: list
  elements: str
installed:
  description: Whether a manifest with this identity exists (host mode, with its binary).
  returned: always
  type: bool
manifest:
  description: The installed manifest of this build, or null.
  returned: always
  type: dict
current_build_id:
  description: Build the C(current) link points at now, or null.
  returned: always
  type: str
links_in_place:
  description: Whether C(current) is already the link C(builds/<build_id>) and C(previous) already points at
    RV(next_previous_build_id) (nothing for the role's link tasks to do).
  returned: always
  type: bool
previous_build_id:
  description: Build the C(previous) link points at now, or null.
  returned: always
  type: str
next_previous_build_id:
  description: What C(previous) will point at once this build is current.
  returned: always
  type: str
prune:
  description: Builds to delete once this build is current (beyond keep_builds, never current or previous).
  returned: always
  type: list
  elements: str
prune_images:
  description: Image tags recorded in the manifests of the builds in RV(prune).
  returned: always
  type: list
  elements: str
source_warning:
  description: Why the git ref is not an immutable pin, or null.
  returned: always
  type: str
"""

import os  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.llmops.serving.plugins.module_utils._software.llama_cpp_build import (  # noqa: E402
    BuildError,
    build_id,
    build_identity,
    builds_to_prune,
    cmake_args,
    cuda_wanted,
    dir_content_hash,
    identity_sha256,
    installed_builds,
    is_installed,
    link_target_id,
    links_in_place,
    normalize_archs,
    plan_links,
    ref_warning,
    source_identity,
    source_key,
    speed_args,
)
from ansible_collections.llmops.serving.plugins.module_utils.module_guard import run_module  # noqa: E402

ARGUMENT_SPEC = dict(
    source_type=dict(type="str", default="git", choices=["git", "archive", "dir"]),
    git_repo=dict(type="str"),
    git_ref=dict(type="str"),
    archive_sha256=dict(type="str"),
    archive_commit=dict(type="str", default=""),
    source_dir=dict(type="path"),
    source_dir_excludes=dict(type="list", elements="str",
                             default=[".git", "build", "build-*", "*/__pycache__", "__pycache__",
                                      "*.pyc"]),
    mode=dict(type="str", required=True, choices=["host", "container"]),
    cuda=dict(type="str", default="auto"),
    gpus=dict(type="dict", default={}),
    cuda_architectures=dict(type="list", elements="str", default=[]),
    web_ui=dict(type="bool", default=False),
    build_type=dict(type="str", default="Release"),
    cmake_extra_options=dict(type="dict", default={}),
    removed_option_policy=dict(type="str", default="fail", choices=["fail", "warn"]),
    targets=dict(type="list", elements="str",
                 default=["llama-server", "llama-cli", "llama-quantize", "llama-bench"]),
    builder_image=dict(type="str"),
    runtime_image=dict(type="str"),
    platform=dict(type="dict", default={}),
    ccache=dict(type="bool", default=False),
    install_root=dict(type="path", default="/opt/llama.cpp"),
    keep_builds=dict(type="int", default=3),
)


def main():
    run_module(AnsibleModule, "llama_cpp_build_info", _run, argument_spec=ARGUMENT_SPEC,
               expected=(BuildError,))


def _run(module):
    p = module.params
    if p["keep_builds"] < 2:
        raise BuildError("llama_cpp_keep_builds must be at least 2 (the current build and the previous "
                         "one for rollback), got %d" % p["keep_builds"])
    cuda = cuda_wanted(p["cuda"], (p["gpus"] or {}).get("present", False))
    archs = p["cuda_architectures"] or (p["gpus"] or {}).get("archs") or []
    args, warnings = cmake_args(cuda=cuda, archs=archs, web_ui=p["web_ui"],
                                build_type=p["build_type"], extra=p["cmake_extra_options"],
                                removed_policy=p["removed_option_policy"])
    dir_hash = None
    if p["source_type"] == "dir":
        if not p["source_dir"]:
            raise BuildError("source type dir needs llama_cpp_source_dir")
        dir_hash = dir_content_hash(p["source_dir"], tuple(p["source_dir_excludes"]))
    source = source_identity(p["source_type"], git_repo=p["git_repo"], git_ref=p["git_ref"],
                             archive_sha256=p["archive_sha256"], dir_hash=dir_hash,
                             archive_commit=p["archive_commit"])
    identity = build_identity(source, p["mode"], args, p["targets"], builder_image=p["builder_image"],
                              runtime_image=p["runtime_image"], platform=p["platform"])
    builds = installed_builds(p["install_root"])
    digest = identity_sha256(identity)
    bid = build_id(identity)
    current = link_target_id(os.path.join(p["install_root"], "current"))
    previous = link_target_id(os.path.join(p["install_root"], "previous"))
    new_current, new_previous = plan_links(bid, current, previous)
    prune = builds_to_prune(dict((k, v) for k, v in builds.items() if k != bid), p["keep_builds"] - 1,
                            [new_previous])
    for warning in warnings:
        module.warn(warning)
    source_warning = ref_warning(p["git_ref"]) if p["source_type"] == "git" else None
    if source_warning:
        module.warn(source_warning)
    manifest = builds.get(bid)
    module.exit_json(
        changed=False,
        build_id=bid,
        identity=identity,
        identity_sha256=digest,
        source_key=source_key(identity["source"]),
        cmake_args=args,
        speed_args=speed_args(p["ccache"]),
        cuda=cuda,
        cuda_architectures=normalize_archs(archs) if cuda else "",
        targets=identity["targets"],
        installed=is_installed(manifest, digest, p["mode"]),
        manifest=manifest,
        current_build_id=current,
        previous_build_id=previous,
        next_previous_build_id=new_previous,
        links_in_place=links_in_place(p["install_root"], bid, new_previous),
        prune=prune,
        prune_images=[builds[b]["image"] for b in prune if builds[b].get("image")],
        source_warning=source_warning,
    )


if __name__ == "__main__":
    main()
