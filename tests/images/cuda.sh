#!/usr/bin/env bash
# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
# Builds the two CUDA 12.4.1 stand-in images of the L20 twin (tests/images/README.md says what differs from
# NVIDIA's nvidia/cuda:12.4.1-{devel,runtime}-ubuntu22.04 and why it does not matter to what is checked):
#   llmops-test/cuda:12.4.1-devel     Debian 13 (trixie) + non-free nvidia-cuda-toolkit 12.4.131~12.4.1 (nvcc
#                                     12.4.131, cuBLAS 12.4.5.8), gcc-13 as the default compiler, laid out as the
#                                     role relies on in nvidia/cuda (/usr/local/cuda, nvcc on PATH, the driver
#                                     stub under lib64/stubs), without the driver's user space (libcuda.so.1)
#   llmops-test/cuda:12.4.1-runtime   trixie + the CUDA 12.4 runtime libraries llama-server links (cudart,
#                                     cuBLAS, cuBLASLt), without libcuda.so.1: that one comes from the host driver
#   llmops-test/cuda:driver-550       trixie + libcuda1 550.163.01: the host driver's user space that the NVIDIA
#                                     container runtime would mount into a GPU container (the twin's stand-in
#                                     runtime, tests/fixtures/fake_vllm/docker-gpus, mounts its libcuda.so.1)
# Made with debootstrap and `docker import`: nothing is pulled from a registry. The Debian mirror is this
# machine's own (as in build.sh). Tagged with a hash of this recipe; an image with that hash is not rebuilt.
#   tests/images/cuda.sh            # build if needed, tag :12.4.1-devel / :12.4.1-runtime
#   FORCE=1 tests/images/cuda.sh    # rebuild
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=tests/images/mirror.sh
. "$here/mirror.sh"
repo=llmops-test/cuda
suite=trixie
# The recipe's contents only (sha256sum would also hash the file names: every checkout path a new 8 GB set).
recipe_hash=$(cat "$0" "$here/mirror.sh" | sha256sum | cut -c1-16)

if [ -z "${FORCE:-}" ] && docker image inspect "$repo:devel-$recipe_hash" "$repo:runtime-$recipe_hash" \
     "$repo:driver-$recipe_hash" >/dev/null 2>&1; then
  docker tag "$repo:devel-$recipe_hash" "$repo:12.4.1-devel"
  docker tag "$repo:runtime-$recipe_hash" "$repo:12.4.1-runtime"
  docker tag "$repo:driver-$recipe_hash" "$repo:driver-550"
  echo "images $repo:{devel,runtime}-$recipe_hash are up to date"
  exit 0
fi

mirror=${DEBIAN_MIRROR:-$(debian_mirror)}
[ -n "$mirror" ] || { echo "No Debian mirror found in /etc/apt/sources.list*; set DEBIAN_MIRROR=http://your-mirror/debian" >&2; exit 1; }
command -v debootstrap >/dev/null || { echo "debootstrap is missing: apt-get install debootstrap" >&2; exit 1; }

work=$(mktemp -d /var/tmp/llmops-cuda-rootfs.XXXXXX)
trap 'rm -rf "$work"' EXIT
echo "debootstrap $suite (main contrib non-free) from $mirror (recipe $recipe_hash)"
debootstrap --variant=minbase --components=main,contrib,non-free --include=ca-certificates \
  "$suite" "$work/rootfs" "$mirror" >"$work/debootstrap.log" 2>&1 || { tail -30 "$work/debootstrap.log"; exit 1; }
echo force-unsafe-io >"$work/rootfs/etc/dpkg/dpkg.cfg.d/llmops-test-unsafe-io"
# The driver's user space never enters an image: dpkg leaves these files out, so the packages that depend on
# libcuda1 install and stay consistent for apt, and the only libcuda.so in the devel image is the link stub.
cat >"$work/rootfs/etc/dpkg/dpkg.cfg.d/llmops-no-driver" <<'CFG'
path-exclude=/usr/lib/x86_64-linux-gnu/nvidia/*
path-exclude=/usr/lib/x86_64-linux-gnu/libcuda.so*
path-exclude=/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1*
path-exclude=/usr/lib/x86_64-linux-gnu/libnvidia-ptxjitcompiler.so*
CFG
rm -rf "$work"/rootfs/var/lib/apt/lists/* "$work"/rootfs/var/cache/apt/archives/*.deb
tar -C "$work/rootfs" --numeric-owner -c . | docker import - "$repo:base-$recipe_hash" >/dev/null

# What NVIDIA's images set for every CUDA image (the role and the container toolkit read some of it).
nvidia_env='ENV NVARCH=x86_64 CUDA_VERSION=12.4.1 NVIDIA_REQUIRE_CUDA="cuda>=12.4" \
    NVIDIA_VISIBLE_DEVICES=all NVIDIA_DRIVER_CAPABILITIES=compute,utility \
    PATH=/usr/local/nvidia/bin:/usr/local/cuda/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    LD_LIBRARY_PATH=/usr/local/nvidia/lib:/usr/local/nvidia/lib64
LABEL maintainer="llmops.serving tests (stand-in for NVIDIA CORPORATION <cudatools@nvidia.com>)" \
    org.llmops.stand-in="nvidia/cuda:12.4.1 from Debian trixie nvidia-cuda-toolkit 12.4.131~12.4.1-2" \
    org.llmops.recipe='"$recipe_hash"

echo "devel image: nvidia-cuda-toolkit, gcc-13, make"
docker build --network host -q -t "$repo:devel-$recipe_hash" - >/dev/null <<DOCKERFILE
FROM $repo:base-$recipe_hash
ENV DEBIAN_FRONTEND=noninteractive
# NVIDIA's devel image has build-essential (gcc 11) and make, not cmake, git or ccache: the role's builder
# step installs those. nvcc 12.4 refuses gcc 14 (trixie's default), so gcc-13 is the image's default compiler.
RUN apt-get update -qq && apt-get install -y -qq --no-install-recommends \
      nvidia-cuda-toolkit nvidia-cuda-dev gcc-13 g++-13 make libc6-dev >/dev/null \
 && ln -sf /usr/bin/gcc-13 /usr/local/bin/gcc && ln -sf /usr/bin/g++-13 /usr/local/bin/g++ \
 && ln -sf /usr/bin/gcc-13 /usr/local/bin/cc && ln -sf /usr/bin/g++-13 /usr/local/bin/c++ \
 && mkdir -p /usr/local/cuda-12.4/bin /usr/local/cuda-12.4/lib64/stubs \
 && ln -s /usr/bin/nvcc /usr/local/cuda-12.4/bin/nvcc \
 && ln -s /usr/lib/nvidia-cuda-toolkit/include /usr/local/cuda-12.4/include \
 && for lib in /usr/lib/x86_64-linux-gnu/libcudart* /usr/lib/x86_64-linux-gnu/libcublas*; do \
      ln -s "\$lib" /usr/local/cuda-12.4/lib64/; done \
 && ln -s /usr/lib/x86_64-linux-gnu/stubs/libcuda.so /usr/local/cuda-12.4/lib64/stubs/libcuda.so \
 && ln -s /usr/local/cuda-12.4 /usr/local/cuda \
 && rm -f /etc/alternatives/libcuda* /etc/alternatives/nvidia--libcuda* \
 && rm -rf /var/lib/apt/lists/* \
 && ! ldconfig -p | grep -q 'libcuda\.so\.1' \
 && nvcc --version | grep -q 'release 12.4'
$nvidia_env
ENV LIBRARY_PATH=/usr/local/cuda/lib64/stubs
CMD ["/bin/bash"]
DOCKERFILE

echo "runtime image: cudart, cuBLAS, cuBLASLt 12.4"
docker build --network host -q -t "$repo:runtime-$recipe_hash" - >/dev/null <<DOCKERFILE
FROM $repo:base-$recipe_hash
ENV DEBIAN_FRONTEND=noninteractive
RUN apt-get update -qq && apt-get install -y -qq --no-install-recommends libcudart12 libcublas12 libcublaslt12 >/dev/null \
 && rm -rf /var/lib/apt/lists/* \
 && ! ldconfig -p | grep -q 'libcuda\.so' \
 && ldconfig -p | grep -q 'libcublasLt\.so\.12'
$nvidia_env
CMD ["/bin/bash"]
DOCKERFILE

echo "host driver stand-in: Debian's libcuda1 (the R550 driver's user space, no kernel module)"
docker build --network host -q -t "$repo:driver-$recipe_hash" - >/dev/null <<DOCKERFILE
FROM $repo:base-$recipe_hash
ENV DEBIAN_FRONTEND=noninteractive
RUN rm /etc/dpkg/dpkg.cfg.d/llmops-no-driver \
 && apt-get update -qq && apt-get install -y -qq --no-install-recommends libcuda1 >/dev/null \
 && rm -rf /var/lib/apt/lists/* \
 && test -e /usr/lib/x86_64-linux-gnu/nvidia/current/libcuda.so.1
CMD ["/bin/bash"]
DOCKERFILE

docker rmi "$repo:base-$recipe_hash" >/dev/null
docker tag "$repo:devel-$recipe_hash" "$repo:12.4.1-devel"
docker tag "$repo:runtime-$recipe_hash" "$repo:12.4.1-runtime"
docker tag "$repo:driver-$recipe_hash" "$repo:driver-550"
echo "built $repo:12.4.1-devel and $repo:12.4.1-runtime ($recipe_hash)"
