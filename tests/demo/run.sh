#!/usr/bin/env bash
# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
# The embedded default: a local systemd container (llmops-local-node) plays a 4x L20 GPU host (fake
# nvidia-smi), a loopback fake model hub serves a tiny real GGUF (qwen35 hybrid with one MTP head), and
# site.yml runs the whole flow against it with inventories/local. Called by `bin/llmops-dev demo`.
#   tests/demo/run.sh up      # (re)start the pieces and run site.yml (idempotent; run it twice)
#   tests/demo/run.sh down    # remove the container and stop the hub
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
export LLMOPS_REPO="$ROOT"
export LLMOPS_DEMO_DIR="${LLMOPS_DEMO_DIR:-$ROOT/.cache/demo}"
# The machine's ccache (bin/llmops-dev exports it; shared with the test scenarios).
export LLMOPS_CI_CACHE="${LLMOPS_CI_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/llmops.serving/ci}"
NODE=llmops-local-node
HUB_PORT=${LLMOPS_DEMO_HUB_PORT:-18080}

down() {
  docker rm -f "$NODE" >/dev/null 2>&1 || true
  tests/demo/hub.sh stop
}

up() {
  mkdir -p "$LLMOPS_DEMO_DIR"
  tests/demo/hub.sh start "$HUB_PORT"
  if [ "$(docker inspect -f '{{.State.Running}}' "$NODE" 2>/dev/null)" != "true" ]; then
    docker rm -f "$NODE" >/dev/null 2>&1 || true
    python -m tests.fixtures.llama_cpp_source --mirror >/dev/null
    mkdir -p "$ROOT/.cache/ci-llama" "$LLMOPS_CI_CACHE/ccache"
    echo "starting the container $NODE (systemd, fake 4x L20)"
    docker run -d --name "$NODE" --hostname "$NODE" --cap-add SYS_ADMIN --cgroupns=host \
      -v /sys/fs/cgroup:/sys/fs/cgroup:rw --tmpfs /run --tmpfs /run/lock --tmpfs /tmp --network host \
      -v "$ROOT/.cache/llama.cpp.git:$ROOT/.cache/llama.cpp.git:ro" \
      -v "$LLMOPS_CI_CACHE/ccache:$LLMOPS_CI_CACHE/ccache" \
      -v "$ROOT/.cache/ci-llama:$ROOT/.cache/ci-llama" \
      llmops-test/debian12:latest >/dev/null
    ansible-playbook -i inventories/local molecule/shared/prepare.yml -e fake_gpu_profile=l20x4
  fi
  ansible-playbook -i inventories/local site.yml "$@"
  key_file="$LLMOPS_DEMO_DIR/api-key"
  report="$ROOT/reports/$NODE.md"
  if [ -f "$report" ]; then
    printf '\nBenchmark of the served instance (validate stage; report %s, .json and .svg beside it):\n' "$report"
    grep '^|' "$report"
  fi
  cat <<TXT

The node serves an OpenAI-compatible API on 127.0.0.1:18003 (key in $key_file):
  curl -s -H "Authorization: Bearer \$(cat $key_file)" -H 'Content-Type: application/json' \\
    -d '{"messages":[{"role":"user","content":"Hello"}],"max_tokens":16}' http://127.0.0.1:18003/v1/chat/completions
Run it again: a second run changes nothing. Remove it all: bin/llmops-dev demo-destroy
TXT
}

case "${1:-up}" in
  up) shift || true; up "$@" ;;
  down) down ;;
  *) echo "usage: $0 up|down" >&2; exit 2 ;;
esac
