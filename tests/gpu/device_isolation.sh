#!/usr/bin/env bash
# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
# Decides serving_gpu_isolation on a node with two or more GPUs (CI has none: docs/security.md). Runs nvidia-smi
# in a transient unit that may open only the LAST GPU's /dev/nvidia<minor> (as serving_gpu_isolation's units
# do) and compares what it lists with the node's view:
#   renumbered   the sandbox lists that one GPU as index 0: serving_gpu_isolation: true is right for this node
#   not hidden   the sandbox lists every GPU: keep serving_gpu_isolation false (the default)
#   failed       nvidia-smi failed in the sandbox: keep it false, and send the output to the project
# The GPU's device node is its "Minor Number" (nvidia-smi -q), which this script also checks against the
# index (the role assumes /dev/nvidia<index>).
#
#   sudo tests/gpu/device_isolation.sh
set -euo pipefail
command -v nvidia-smi >/dev/null || { echo "no nvidia-smi on this node" >&2; exit 2; }
mapfile -t gpus < <(nvidia-smi --query-gpu=index,uuid --format=csv,noheader)
[ "${#gpus[@]}" -ge 2 ] || { echo "needs two or more GPUs (found ${#gpus[@]})" >&2; exit 2; }
last=${gpus[-1]}; index=${last%%,*}; uuid=${last#*, }
minor=$(nvidia-smi -i "$index" -q | awk -F': ' '/Minor Number/ {print $2; exit}')
echo "node: ${#gpus[@]} GPUs; the last: index $index, minor $minor, $uuid"
[ "$minor" = "$index" ] || echo "WARNING: GPU $index is /dev/nvidia$minor: the role's /dev/nvidia<index> would be wrong here"
seen=$(timeout 60 systemd-run --quiet --wait --pipe --collect -p DevicePolicy=closed \
  -p "DeviceAllow=/dev/nvidia$minor rw" -p "DeviceAllow=/dev/nvidiactl rw" -p "DeviceAllow=/dev/nvidia-uvm rw" \
  -p "DeviceAllow=char-nvidia-caps r" nvidia-smi --query-gpu=index,uuid --format=csv,noheader 2>&1) || {
  echo "failed: $seen"; exit 1; }
echo "sandbox sees:"; printf '  %s\n' "$seen"
if [ "$(printf '%s\n' "$seen" | wc -l)" = 1 ] && [ "$seen" = "0, $uuid" ]; then
  echo "renumbered: serving_gpu_isolation: true is right for this node"
else
  echo "not hidden: keep serving_gpu_isolation: false"
fi
