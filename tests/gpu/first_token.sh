#!/usr/bin/env bash
# Copyright: contributors to llmops.serving
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
# Runs the llama.cpp image the role built (the L20 twin's, or a node's) to a first token on a real GPU: the
# one thing CI's compile cannot show (docs/cuda.md). Any machine with an NVIDIA GPU, a driver >= 550 (the
# build is CUDA 12.4) and the NVIDIA container toolkit; sm_89 runs the SASS, newer GPUs JIT the compute_89 PTX.
#
#   # where the image is (the L20 twin, or a node): save it with a tiny model
#   docker save -o llama-cpp.tar llmops/llama.cpp:<build id>
#   .venv/bin/python -m tests.fixtures.gguf.make_tiny_model --arch qwen35 --out tiny.gguf
#   # on the GPU machine
#   tests/gpu/first_token.sh llama-cpp.tar tiny.gguf      # or an image name instead of the tar
#
# Prints the GPU, the devices llama-server sees, the first token and its time; exits non-zero if none came.
# Env: PORT (18098).
set -euo pipefail
image=${1:?usage: $0 IMAGE.tar|IMAGE MODEL.gguf}
model=${2:?usage: $0 IMAGE.tar|IMAGE MODEL.gguf}
port=${PORT:-18098}
nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv,noheader
if [ -f "$image" ]; then
  image=$(docker load -i "$image" | sed -n 's/^Loaded image: //p' | tail -1)
fi
echo "image: $image"
docker run --rm --gpus all "$image" --list-devices
name=llmops-first-token-$$
trap 'docker rm -f "$name" >/dev/null 2>&1 || true' EXIT
docker run -d --name "$name" --gpus all -p "127.0.0.1:$port:8080" -v "$(realpath "$model"):/m.gguf:ro" \
  "$image" -m /m.gguf --host 0.0.0.0 --port 8080 -ngl 999 >/dev/null
for _ in $(seq 120); do
  curl --noproxy '*' -fsS "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break
  sleep 1
done
docker logs "$name" 2>&1 | grep -E 'CUDA|offloaded|ggml_cuda_init' | head -8
start=$(date +%s.%N)
out=$(curl --noproxy '*' -fsS "http://127.0.0.1:$port/completion" -H 'Content-Type: application/json' \
  -d '{"prompt": "Hello", "n_predict": 1}')
end=$(date +%s.%N)
echo "first token: $(printf '%s' "$out" | python3 -c 'import json,sys; print(repr(json.load(sys.stdin)["content"]))')"
echo "time: $(python3 -c "print('%.3f s' % ($end - $start))")"
docker logs "$name" 2>&1 | grep -q 'offloaded' || { echo "no layers offloaded to the GPU" >&2; exit 1; }
