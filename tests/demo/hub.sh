#!/usr/bin/env bash
# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
# Starts/stops the loopback fake model hub (a test double) that the demo and the default Molecule scenario
# download from, serving a tiny real GGUF generated on first use. Idempotent.
#   tests/demo/hub.sh start [PORT]   |   tests/demo/hub.sh stop
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
DIR="${LLMOPS_DEMO_DIR:-$ROOT/.cache/demo}"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
pidfile="$DIR/hub.pid"
model="$DIR/hub/llmops-demo/Tiny-Qwen35-MTP-GGUF/tiny-qwen35-Q4_0.gguf"

case "${1:-}" in
  start)
    port=${2:-18080}
    mkdir -p "$DIR"
    mkdir -p "$(dirname "$model")"
    [ -f "$model" ] || "$PY" -m tests.fixtures.gguf.make_tiny_model --arch qwen35 --out "$model"
    if [ ! -f "$DIR/api-key" ]; then
      (umask 077; "$PY" -c 'import secrets; print(secrets.token_urlsafe(32))' >"$DIR/api-key")
    fi
    if [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; then exit 0; fi
    nohup "$PY" -m tests.fixtures.fake_hub.server --root "$DIR/hub" --host 127.0.0.1 --port "$port" \
      >"$DIR/hub.log" 2>&1 &
    echo $! >"$pidfile"
    for _ in $(seq 50); do
      curl -fsI "http://127.0.0.1:$port/llmops-demo/Tiny-Qwen35-MTP-GGUF/resolve/main/tiny-qwen35-Q4_0.gguf" \
        >/dev/null 2>&1 && exit 0
      sleep 0.2
    done
    echo "fake hub did not start; see $DIR/hub.log" >&2; exit 1 ;;
  stop)
    if [ -f "$pidfile" ]; then kill "$(cat "$pidfile")" 2>/dev/null || true; rm -f "$pidfile"; fi ;;
  *) echo "usage: $0 start [PORT]|stop" >&2; exit 2 ;;
esac
