#!/usr/bin/env bash
# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
# Builds the Molecule test-host image llmops-test/debian12: Debian 12 with systemd as PID 1 and python3,
# made with debootstrap and `docker import` (no registry, nothing pulled). The Debian mirror is read from
# this machine's own apt configuration, never written into the repository.
#
# The image is tagged with a hash of this recipe; when an image with that hash exists, nothing is built.
#   tests/images/build.sh            # build if needed, tag :latest
#   FORCE=1 tests/images/build.sh    # rebuild
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=tests/images/mirror.sh
. "$here/mirror.sh"
repo=llmops-test/debian12
suite=bookworm
packages=(
  systemd systemd-sysv dbus python3 python3-apt sudo ca-certificates procps iproute2 curl gnupg
  apt-transport-https lsb-release kmod
)
recipe_hash=$( { cat "$0" "$here/mirror.sh"; printf '%s\n' "${packages[@]}"; } | sha256sum | cut -c1-16)

if [ -z "${FORCE:-}" ] && docker image inspect "$repo:$recipe_hash" >/dev/null 2>&1; then
  docker tag "$repo:$recipe_hash" "$repo:latest"
  echo "image $repo:$recipe_hash is up to date"
  exit 0
fi

mirror=${DEBIAN_MIRROR:-$(debian_mirror)}
if [ -z "$mirror" ]; then
  echo "No Debian mirror found in /etc/apt/sources.list*; set DEBIAN_MIRROR=http://your-mirror/debian" >&2
  exit 1
fi
command -v debootstrap >/dev/null || { echo "debootstrap is missing: apt-get install debootstrap" >&2; exit 1; }

work=$(mktemp -d /tmp/llmops-rootfs.XXXXXX)
trap 'rm -rf "$work"' EXIT
rootfs="$work/rootfs"
echo "debootstrap $suite from $mirror (recipe $recipe_hash)"
debootstrap --variant=minbase --include="$(IFS=,; echo "${packages[*]}")" \
  "$suite" "$rootfs" "$mirror" >"$work/debootstrap.log" 2>&1 || { tail -30 "$work/debootstrap.log"; exit 1; }

# Units that make no sense in a container (consoles, kernel, hardware) would fail or hang at boot.
for unit in getty.target console-getty.service systemd-udevd.service systemd-udev-trigger.service \
            systemd-modules-load.service sys-kernel-config.mount sys-kernel-debug.mount \
            systemd-firstboot.service systemd-remount-fs.service; do
  ln -sf /dev/null "$rootfs/etc/systemd/system/$unit"
done
# Test nodes live for one scenario: dpkg need not fsync every file it unpacks (Docker's own Debian images once
# shipped the same setting), which matters when three scenarios install compilers at once on two cores.
echo force-unsafe-io >"$rootfs/etc/dpkg/dpkg.cfg.d/llmops-test-unsafe-io"
echo "llmops-test" >"$rootfs/etc/hostname"
: >"$rootfs/etc/machine-id"
rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/archives/*.deb

tar -C "$rootfs" --numeric-owner -c . | docker import --change 'CMD ["/sbin/init"]' - "$repo:rootfs-$recipe_hash" >/dev/null
printf 'FROM %s\nLABEL org.llmops.recipe=%s\nENV container=docker\nSTOPSIGNAL SIGRTMIN+3\nCMD ["/sbin/init"]\n' \
  "$repo:rootfs-$recipe_hash" "$recipe_hash" | docker build -q -t "$repo:$recipe_hash" - >/dev/null
docker rmi "$repo:rootfs-$recipe_hash" >/dev/null
docker tag "$repo:$recipe_hash" "$repo:latest"
echo "built $repo:$recipe_hash"
