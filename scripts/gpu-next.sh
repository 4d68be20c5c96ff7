#!/usr/bin/env bash
# The omni GPU measurements still to run, one device call each (docs/gpu-machine.md):
#   scripts/gpu-next.sh talker   the live talker against the talker call per token, through the
#                                server (about 320 s held)
#   scripts/gpu-next.sh codec    Qwen2.5 at N = 8, 16, 32 with 10 and 5 DiT steps (the codec's
#                                windows counted by shape, graph and eager), then one codec window's
#                                DiT and vocoder apart by batch and step count (about 540 s held)
# Run on the lent machine from the repository root with .whl_tf, .whl_server and .omni_cfg
# carried; results go to $OUT (the device tool brings that folder back).
set -euo pipefail
cd "$(dirname "$0")/.."
: "${OUT:?run this on the device machine: it writes to \$OUT}"

mkdir -p /tmp/site
tar -xJf .whl_tf/transformers.tar.xz -C /tmp/site
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl_tf/*.whl .whl_server/*.whl
export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)' \
  | tee -a "$OUT/gpu.txt"

case "${1:-}" in
  talker)
    mkdir -p /tmp/q3
    cp .omni_cfg/Qwen3-Omni-30B-A3B-Instruct/config.reconstructed.json /tmp/q3/config.json
    server=(benchmarks/omni_server.py --model-dir /tmp/q3 --random-weights --sessions 32@150 40@100 8 32
            --slots 40 --speech .omni_cfg/turn.npy)
    timeout 280 python3 "${server[@]}" --out "$OUT/live.json" 2>&1 | tail -40
    REALTIME_OMNI_OMNI_LIVE_TALKER=0 timeout 280 python3 "${server[@]}" --out "$OUT/per_token.json" 2>&1 | tail -40
    ;;
  codec)
    for steps in 10 5; do
      timeout 200 python3 benchmarks/omni_capacity.py --config .omni_cfg/Qwen2.5-Omni-7B/config.reconstructed.json \
        --sessions 8 16 32 --dit-steps "$steps" --out "$OUT/q25_steps$steps.json" 2>&1 | grep -v '^\[transformers\]' | tail -5 || true
    done
    timeout 120 python3 benchmarks/omni_codec_profile.py --config .omni_cfg/Qwen2.5-Omni-7B/config.reconstructed.json \
      --codes 54 74 --batch 1 8 16 32 --steps 10 5 --out "$OUT/codec_profile.json" 2>&1 | grep -v '^\[transformers\]' | tail -12 || true
    ;;
  *)
    echo "usage: scripts/gpu-next.sh talker|codec" >&2
    exit 2
    ;;
esac
