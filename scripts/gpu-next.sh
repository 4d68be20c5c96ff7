#!/usr/bin/env bash
# The omni GPU measurements still to run, one device call each (docs/gpu-machine.md):
#   scripts/gpu-next.sh talker   the live talker against the talker call per token, through the
#                                server (about 320 s held; re-run after 4bdfe5b and c7c738d)
#   scripts/gpu-next.sh codec    Qwen2.5 at N = 8, 16, 32: as built and with a 48-code steady chunk
#                                (about 420 s held)
#   scripts/gpu-next.sh codec-steps
#                                the same with a 48-code chunk and 5 DiT steps (about 220 s held)
#   scripts/gpu-next.sh qwen3    Qwen3-Omni-30B-A3B at N = 1 ... 64 in one process (about 300 s held)
#   scripts/gpu-next.sh qwen3-burst
#                                the same at N = 1 ... 64, then 16, 32, 64 without the burst of
#                                prefills gathered into one batch (about 200 s held)
#   scripts/gpu-next.sh qwen3-main
#                                the main levels (N = 1 ... 64), then 32 and 64 with the heap
#                                thawed and with speech-like replies (about 200 s held)
#   scripts/gpu-next.sh qwen3-ab this tree against an earlier one (.base, carried) at N = 1, 32, 64 (about
#                                300 s held)
#   scripts/gpu-next.sh qwen3-32 N = 32 twice, then with the heap thawed (about 110 s held)
#   scripts/gpu-next.sh admission
#                                the server with realtime_admission auto, 48 slots, 32 then 48 clients:
#                                those past the measured capacity refused (about 200 s held; carry
#                                .whl_server as for talker)
#   scripts/gpu-next.sh host-profile
#                                the sessions' own threads at N = 32 under a CPU profile (yappi's
#                                wheel in .whl_min; about 150 s held)
#   scripts/gpu-next.sh qwen3-modules
#                                the same at N = 16 ... 64 with the code predictor through transformers'
#                                modules, against the lean layout of e1caa08 (about 250 s held)
#   scripts/gpu-next.sh prefill-cold
#                                the first 4-row prefill of a fresh process under the profiler (about 150 s)
#   scripts/gpu-next.sh codec-dtype
#                                Qwen2.5's DiT in bfloat16 against float32: the window alone, then N = 8,
#                                16, 32 with a 48-code chunk (about 350 s held; an H100 will do)
#   scripts/gpu-next.sh dit-blocks
#                                Qwen2.5's DiT window through transformers' layers and the codec's
#                                own block loop, by operator, then qwen25's capacity run (about 450 s;
#                                an H100 will do)
#   scripts/gpu-next.sh vocoder-kernels
#                                Qwen2.5's vocoder activations as Triton kernels against the modules,
#                                then qwen25's capacity run (about 350 s; an H100 will do)
#   scripts/gpu-next.sh dit-kernels
#                                Qwen2.5's DiT window without and with the fused norm kernel (about 120 s
#                                held; an H100 will do)
#   scripts/gpu-next.sh q25-steps
#                                Qwen2.5's thinker and talker decode steps alone, at 1, 8, 16 and 32 rows,
#                                kernel by kernel, and replayed together (about 150 s held; an H100 will do)
#   scripts/gpu-next.sh q25-host the sessions' own threads of Qwen2.5 at N = 16 under a CPU profile (yappi
#                                in .whl_min; about 150 s held)
#   scripts/gpu-next.sh qwen25   Qwen2.5 at N = 8, 16, 32, DiT in bfloat16, 48-code chunk (about 300 s
#                                held; an H100 will do)
#   scripts/gpu-next.sh q25-mix  the same at N = 16, 32 with windows of several lengths in one codec pass,
#                                then a pass per length (about 250 s held)
#   scripts/gpu-next.sh q25-expect
#                                the same with and without the talker's prefill waiting for a thinker prefill
#                                batch's sessions (about 250 s held)
#   scripts/gpu-next.sh q25-first24
#                                the same with chunks of 24, 24, then 48 frames (about 220 s held)
#   scripts/gpu-next.sh q25-ramp first chunks of 18 frames with a ramp the talker keeps ahead of, at N = 16
#                                (about 450 s held; an H100 will do)
#   scripts/gpu-next.sh q25-first the same with the codec's first windows waiting for those of the replies
#                                prefilled with them, and without (about 400 s held)
#   scripts/gpu-next.sh q25-align the same with each stage's first decode steps after a prefill batch waiting
#                                for its sessions, and without (about 400 s held)
#   scripts/gpu-next.sh q25-first20 the same with first chunks of 20 frames, at N = 1, 16, 16, 20, 24 (about 400 s held)
#   scripts/gpu-next.sh q25-conn    the same at N = 16, 20, 20 with CUDA_DEVICE_MAX_CONNECTIONS=32 (about 330 s held)
#   scripts/gpu-next.sh probe       a long graph beside short steps, whole and in pieces (about 60 s, no model)
#   scripts/gpu-next.sh q25-pieces  q25-first20's N = 16, 20 with the codec's graphs in pieces, then all queued at once
#                                (about 330 s held)
#   scripts/gpu-next.sh qwen3-align Qwen3 at N = 1, 32, 32, 64, then 32 with the codec's graph pieces
#                                queued at once (about 200 s held on the H200)
#   scripts/gpu-next.sh q25-default the same at the defaults (pieces, 4 queued) at N = 1, 16, 16, then 16 with all
#                                pieces queued at once (about 300 s held)
#   scripts/gpu-next.sh qwen3-pieces Qwen3 at N = 1, 32 at the defaults, then 32 with all pieces queued at once
#                                (about 150 s held on the H200)
#   scripts/gpu-next.sh qwen3-h100 qwen3-pieces on an H100, the thinker cut to 32 of its 48 layers so that
#                                it fits (a proxy, not the target's shape; about 150 s held)
#   scripts/gpu-next.sh qwen3-h100-ab the proxy of qwen3-h100 at N = 1, 32 for an earlier tree (.base, carried)
#                                and this one, then the GPU tests of the graphs and streams (about 400 s)
#   scripts/gpu-next.sh codec-memory what the codec's window graphs hold, whole, in pieces and in one shared
#                                pool (Qwen3's real codec, the thinker and talker cut to one layer), then the
#                                GPU tests of the graphs (about 250 s held; an H100 will do)
#   scripts/gpu-next.sh q25-ab   the same for this tree and an earlier one (.base, carried; about 300 s)
#   several at once: scripts/gpu-next.sh prefill-cold qwen3
#   (the codec window profile of 2026-12-05: python3 benchmarks/omni_codec_profile.py --config
#    .omni_cfg/Qwen2.5-Omni-7B/config.reconstructed.json --codes 54 74 --out $OUT/profile.json)
# Build the carried folders first with scripts/gpu-carry.sh (a fresh checkout has none).
# Run on the lent machine from the repository root with .whl_tf, .whl_min and .omni_cfg carried
# (talker: .whl_server instead of .whl_min); results go to $OUT (the device tool brings it back).
set -euo pipefail
cd "$(dirname "$0")/.."
: "${OUT:?run this on the device machine: it writes to \$OUT}"

mkdir -p /tmp/site
tar -xJf .whl_tf/transformers.tar.xz -C /tmp/site
# .whl_server only for the runs through the server (talker): with it the tree passes the 64 MiB
# carry limit, and the in-process runs need only the few wheels of .whl_min
wheels=(.whl_tf/*.whl); [ -d .whl_min ] && wheels+=(.whl_min/*.whl); [ -d .whl_server ] && wheels+=(.whl_server/*.whl)
python3 -m pip install -q --no-index --no-deps --target /tmp/site "${wheels[@]}"
export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)' \
  | tee -a "$OUT/gpu.txt"

python3 -c 'import torch; print("stream priorities (least, greatest)", torch.cuda.Stream.priority_range())' | tee -a "$OUT/gpu.txt"
# qwen25's settings, also q25-ab's
q25=(--config .omni_cfg/Qwen2.5-Omni-7B/config.reconstructed.json --sessions 8 16 32
     --chunk-frames 48 --ramp-frames 12 18 24 --dit-dtype bfloat16)

# qwen3-pieces and qwen3-h100: N = 1, 32 at the defaults, then 32 with all pieces queued at once
qwen3_pieces() {  # CONFIG OUT_NAME
  timeout 270 python3 benchmarks/omni_capacity.py --config "$1" --sessions 1 32 --sweep whole:codec_queued=0 \
    --sweep-sessions 32 --out "$OUT/$2.json" 2>&1 | grep -v '^\[transformers\]' | cut -c1-300 | tail -6 || true
}

# the GPU-marked tests of the graphs and the streams
gpu_tests() {
  timeout 200 python3 -m pytest -q -p no:cacheprovider --noconftest -o addopts="" -m gpu \
    tests/engines/test_omni_graph_pieces.py tests/engines/test_omni_streams.py 2>&1 | tail -3 || true
}

# Qwen3 with the thinker cut to 32 of its 48 layers (fits an H100); prints the config's path
thinker32_config() {
  mkdir -p /tmp/Qwen3-Omni-thinker32
  python3 - .omni_cfg/Qwen3-Omni-30B-A3B-Instruct/config.reconstructed.json /tmp/Qwen3-Omni-thinker32/config.json <<'PY'
import json, sys
config = json.load(open(sys.argv[1]))
config["thinker_config"]["text_config"]["num_hidden_layers"] = 32
json.dump(config, open(sys.argv[2], "w"))
PY
  echo /tmp/Qwen3-Omni-thinker32/config.json
}

[ $# -gt 0 ] || set -- usage
for run in "$@"; do
case "$run" in
  talker)
    mkdir -p /tmp/q3
    cp .omni_cfg/Qwen3-Omni-30B-A3B-Instruct/config.reconstructed.json /tmp/q3/config.json
    server=(benchmarks/omni_server.py --model-dir /tmp/q3 --random-weights --sessions 32@150 40@100 8 32
            --slots 40 --speech .omni_cfg/turn.npy)
    timeout 280 python3 "${server[@]}" --out "$OUT/live.json" 2>&1 | tail -40
    REALTIME_OMNI_OMNI_LIVE_TALKER=0 timeout 280 python3 "${server[@]}" --out "$OUT/per_token.json" 2>&1 | tail -40
    ;;
  admission)
    # through the server with the engine's own admission (realtime_admission auto): 48 slots, 32 then
    # 48 clients at once; those past the measured capacity are refused with session_limit_reached
    # (admission.json; carry .whl_server, like talker)
    mkdir -p /tmp/q3
    cp .omni_cfg/Qwen3-Omni-30B-A3B-Instruct/config.reconstructed.json /tmp/q3/config.json
    timeout 330 python3 benchmarks/omni_server.py --model-dir /tmp/q3 --random-weights --sessions 32 48 --slots 48 \
      --realtime-admission auto --speech .omni_cfg/turn.npy --out "$OUT/admission.json" 2>&1 | tail -30
    ;;
  codec|codec-steps)
    # codec: the last window on a captured length and the speaker as a window input (23e1984),
    # then a 48-code steady chunk; codec-steps: that chunk with 5 DiT steps (one build per run)
    q25=(benchmarks/omni_capacity.py --config .omni_cfg/Qwen2.5-Omni-7B/config.reconstructed.json --sessions 8 16 32)
    runs=("default" "chunk48:--chunk-frames 48 --ramp-frames 12 18 24")
    [ "$1" = codec-steps ] && runs=("chunk48_steps5:--chunk-frames 48 --ramp-frames 12 18 24 --dit-steps 5")
    for run in "${runs[@]}"; do
      name="${run%%:*}"; extra=""; [ "$name" != "$run" ] && extra="${run#*:}"
      # shellcheck disable=SC2086
      timeout 250 python3 "${q25[@]}" $extra --out "$OUT/q25_$name.json" 2>&1 | grep -v '^\[transformers\]' | tail -4 || true
    done
    ;;
  qwen3)
    # the main table's Qwen3 levels; named twice ("qwen3 qwen3"), the second run shows the spread
    # between runs (q3.json, then q3_2.json)
    out="$OUT/q3.json"; n=2; while [ -e "$out" ]; do out="$OUT/q3_$n.json"; n=$((n + 1)); done
    timeout 400 python3 benchmarks/omni_capacity.py --config .omni_cfg/Qwen3-Omni-30B-A3B-Instruct/config.reconstructed.json \
      --sessions 1 8 16 32 48 64 --out "$out" 2>&1 | grep -v '^\[transformers\]' | tail -8 || true
    ;;
  qwen3-main)
    # the main levels with the burst of prefills gathered (the default since it was measured),
    # then 32 and 64 with the load's heap back in the collector's sight (thaw: gc.unfreeze) and
    # with speech-like replies (192 frames for 64 tokens) (q3_main.json)
    timeout 300 python3 benchmarks/omni_capacity.py --config .omni_cfg/Qwen3-Omni-30B-A3B-Instruct/config.reconstructed.json \
      --sessions 1 8 16 32 64 --sweep thaw:gc_freeze=0 speech:frames=192 --sweep-sessions 32 64 \
      --out "$OUT/q3_main.json" 2>&1 | grep -v '^\[transformers\]' | cut -c1-300 | tail -14 || true
    ;;
  q25-steps)
    # what one batched decode step of Qwen2.5's thinker and talker costs alone and replayed
    # together, kernel by kernel (q25_steps.json)
    timeout 300 python3 benchmarks/omni_step_profile.py --config .omni_cfg/Qwen2.5-Omni-7B/config.reconstructed.json \
      --buckets 1 8 16 32 --together --show 8 --out "$OUT/q25_steps.json" 2>&1 | grep -v '^\[transformers\]' | cut -c1-200 | tail -60 || true
    ;;
  q25-host)
    # Qwen2.5's sessions' own threads under a CPU profile at N = 16 (q25_host.json)
    timeout 300 python3 benchmarks/omni_host_profile.py --config .omni_cfg/Qwen2.5-Omni-7B/config.reconstructed.json \
      --sessions 16 --out "$OUT/q25_host.json" 2>&1 | grep -v '^\[transformers\]' | cut -c1-200 | tail -30 || true
    ;;
  host-profile)
    # the sessions' own threads under a CPU profile (yappi, its cp312 wheel in .whl_min) at
    # N = 32: where the 1.2 ms per session and frame goes (host_profile.json)
    timeout 300 python3 benchmarks/omni_host_profile.py --config .omni_cfg/Qwen3-Omni-30B-A3B-Instruct/config.reconstructed.json \
      --sessions 32 --out "$OUT/host_profile.json" 2>&1 | grep -v '^\[transformers\]' | cut -c1-200 | tail -30 || true
    ;;
  qwen3-ab)
    # this commit against an earlier one in the same call, N = 1, 32, 64 each, earlier first:
    # q3_ab_base.json, q3_ab_head.json. Make the earlier tree here first and carry it as well:
    #   rm -rf .base && mkdir .base && git archive <commit> realtime_omni benchmarks | tar -x -C .base
    for side in base head; do
      root=$PWD; [ "$side" = base ] && root=$PWD/.base
      [ -d "$root/realtime_omni" ] || { echo "qwen3-ab: no .base tree carried" >&2; continue; }
      (cd "$root" && PYTHONPATH="/tmp/site:$root" timeout 240 python3 benchmarks/omni_capacity.py \
        --config "$OLDPWD/.omni_cfg/Qwen3-Omni-30B-A3B-Instruct/config.reconstructed.json" --sessions 1 32 64 \
        --out "$OUT/q3_ab_$side.json" 2>&1 | grep -v '^\[transformers\]' | cut -c1-300 | tail -5) || true
    done
    ;;
  qwen3-32)
    # the shortest check of N = 32 all at once (twice, then with the heap thawed): q3_32.json
    timeout 220 python3 benchmarks/omni_capacity.py --config .omni_cfg/Qwen3-Omni-30B-A3B-Instruct/config.reconstructed.json \
      --sessions 1 32 32 --sweep thaw:gc_freeze=0 --sweep-sessions 32 --out "$OUT/q3_32.json" 2>&1 \
      | grep -v '^\[transformers\]' | cut -c1-300 | tail -8 || true
    ;;
  qwen3-burst)
    # the main table's levels (a burst of prefills gathered for up to 60 ms, the default since
    # 4fd3fc6), then 16, 32 and 64 again without it (burst_ms=0), in the same process (q3_burst.json;
    # the run of e3b85ce compared the other way round, the gathering then off by default)
    timeout 450 python3 benchmarks/omni_capacity.py --config .omni_cfg/Qwen3-Omni-30B-A3B-Instruct/config.reconstructed.json \
      --sessions 1 8 16 32 64 --sweep off:burst_ms=0 --sweep-sessions 16 32 64 --out "$OUT/q3_burst.json" 2>&1 \
      | grep -v '^\[transformers\]' | cut -c1-300 | tail -12 || true
    ;;
  qwen3-modules)
    timeout 400 python3 benchmarks/omni_capacity.py --config .omni_cfg/Qwen3-Omni-30B-A3B-Instruct/config.reconstructed.json \
      --sessions 16 32 48 64 --modules-code-predictor --out "$OUT/q3_modules.json" 2>&1 | grep -v '^\[transformers\]' | tail -6 || true
    ;;
  prefill-cold)
    # what a first 4-row prefill pays once (1.7 s at e2adc41): the first level after the warm-up
    # under the profiler, in a process of its own, before any other run has met that shape
    timeout 170 python3 benchmarks/omni_prefill_profile.py --config .omni_cfg/Qwen3-Omni-30B-A3B-Instruct/config.reconstructed.json \
      --sessions 4 8 --profile 8 --cold-profile --out "$OUT/prefill_cold.json" 2>&1 | grep -v '^\[transformers\]' | tail -30 || true
    ;;
  codec-dtype)
    # the DiT in bfloat16 against float32, the window alone and Qwen2.5 at N = 8, 16, 32
    timeout 200 python3 benchmarks/omni_codec_profile.py --config .omni_cfg/Qwen2.5-Omni-7B/config.reconstructed.json \
      --codes 54 74 --steps 10 5 --batch 16 32 --repeats 2 --dit-dtype float32 bfloat16 --out "$OUT/codec_dtype_profile.json" 2>&1 | grep -v '^\[transformers\]' | tail -20 || true
    timeout 400 python3 benchmarks/omni_capacity.py --config .omni_cfg/Qwen2.5-Omni-7B/config.reconstructed.json --sessions 8 16 32 \
      --chunk-frames 48 --ramp-frames 12 18 24 --dit-dtype bfloat16 --out "$OUT/q25_chunk48_bf16.json" 2>&1 | grep -v '^\[transformers\]' | tail -4 || true
    ;;
  dit-blocks)
    # Qwen2.5's DiT: transformers' layers against the codec's own block loop (dit_blocks), a 78-code
    # window (48-code chunk) in bfloat16 at 1 ... 32 windows, with device ms by operator
    # (dit_blocks.json), then the capacity run of qwen25 with the codec's loop (q25_blocks.json)
    timeout 200 python3 benchmarks/omni_codec_profile.py --config .omni_cfg/Qwen2.5-Omni-7B/config.reconstructed.json \
      --codes 78 --batch 1 8 32 --steps 10 --dit-dtype bfloat16 --blocks modules lean --kernels \
      --out "$OUT/dit_blocks.json" 2>&1 | grep -v '^\[transformers\]' | cut -c1-400 | tail -8 || true
    timeout 330 python3 benchmarks/omni_capacity.py --config .omni_cfg/Qwen2.5-Omni-7B/config.reconstructed.json --sessions 8 16 32 \
      --chunk-frames 48 --ramp-frames 12 18 24 --dit-dtype bfloat16 --out "$OUT/q25_blocks.json" 2>&1 | grep -v '^\[transformers\]' | cut -c1-600 | tail -8 || true
    ;;
  vocoder-kernels)
    # Qwen2.5's vocoder with its activations as fused Triton kernels against transformers' modules
    # (vocoder_kernels.json: times, largest difference, operators), the kernel tests on the GPU where
    # pytest is there, then qwen25's capacity run (q25_kernels.json)
    python3 -c 'import triton; print("triton", triton.__version__)' | tee -a "$OUT/gpu.txt" || true
    timeout 200 python3 benchmarks/omni_vocoder_kernels.py --config .omni_cfg/Qwen2.5-Omni-7B/config.reconstructed.json \
      --batch 1 8 32 --out "$OUT/vocoder_kernels.json" 2>&1 | grep -v '^\[transformers\]' | cut -c1-400 | tail -6 || true
    timeout 120 python3 -m pytest -q -p no:cacheprovider tests/engines/test_omni_vocoder_kernels.py 2>&1 | tail -3 || true
    timeout 330 python3 benchmarks/omni_capacity.py --config .omni_cfg/Qwen2.5-Omni-7B/config.reconstructed.json --sessions 8 16 32 \
      --chunk-frames 48 --ramp-frames 12 18 24 --dit-dtype bfloat16 --out "$OUT/q25_kernels.json" 2>&1 | grep -v '^\[transformers\]' | cut -c1-600 | tail -8 || true
    ;;
  dit-kernels)
    # Qwen2.5's DiT: the codec's block loop without and with its fused norm kernel, a 78-code
    # window in bfloat16 at 8 and 32 windows, by operator (dit_kernels.json; about 120 s held)
    timeout 150 python3 benchmarks/omni_codec_profile.py --config .omni_cfg/Qwen2.5-Omni-7B/config.reconstructed.json \
      --codes 78 --batch 32 8 --steps 10 --dit-dtype bfloat16 --blocks unfused lean --kernels \
      --out "$OUT/dit_kernels.json" 2>&1 | grep -v '^\[transformers\]' | cut -c1-300 | tail -6 || true
    ;;
  qwen25)
    # Qwen2.5 at N = 8, 16, 32 with the DiT in bfloat16 and a 48-code chunk, warmed up as the
    # server is (since 6405ffb): codec-dtype's capacity run without the window profile
    timeout 420 python3 benchmarks/omni_capacity.py "${q25[@]}" --out "$OUT/q25_bf16.json" 2>&1 | grep -v '^\[transformers\]' | tail -8 || true
    ;;
  q25-mix)
    # qwen25's run at N = 16 and 32 with Qwen2.5's codec windows of several lengths in one DiT
    # pass and the codec gathering the windows sent right after a pass (the defaults), then the
    # same levels a pass per window length, starting at once (q25_mix.json; about 250 s held)
    timeout 430 python3 benchmarks/omni_capacity.py "${q25[@]}" --sessions 16 32 \
      --sweep one-length:mix=0,codec_burst_ms=0 --out "$OUT/q25_mix.json" 2>&1 | grep -v '^\[transformers\]' \
      | cut -c1-600 | tail -12 || true
    ;;
  q25-expect)
    # qwen25's run at N = 16 and 32 with the talker's prefill waiting for the sessions of each
    # thinker prefill batch (the default), then without (q25_expect.json; about 250 s held)
    timeout 430 python3 benchmarks/omni_capacity.py "${q25[@]}" --sessions 16 32 \
      --sweep apart:expect_talkers=0 --out "$OUT/q25_expect.json" 2>&1 | grep -v '^\[transformers\]' \
      | cut -c1-600 | tail -12 || true
    ;;
  q25-first24)
    # qwen25's run at N = 16 and 32 with a first chunk of 24 frames and one ramp chunk of 24
    # (chunks 24, 24, 48, ...: twice the first audio's length of playback to cover the second
    # chunk; q25_first24.json; about 220 s held)
    timeout 215 python3 benchmarks/omni_capacity.py "${q25[@]}" --sessions 16 32 --first-frames 24 --ramp-frames 24 \
      --out "$OUT/q25_first24.json" 2>&1 | grep -v '^\[transformers\]' | cut -c1-600 | tail -6 || true
    ;;
  q25-ramp)
    # qwen25's run at N = 16 with first chunks long enough to cover one codec pass of all the
    # sessions' windows (about 290 ms at 16 sessions: 15 frames of audio) and a ramp the talker
    # keeps ahead of: 18, 18, 24, 36, then 48; then N = 16 without the talker's prefill waiting
    # for each thinker batch's sessions (q25_ramp18.json; about 450 s held: the build alone took
    # 160 s on one host, over 300 s on another)
    timeout 480 python3 benchmarks/omni_capacity.py "${q25[@]}" --sessions 16 --first-frames 18 --ramp-frames 18 24 36 \
      --sweep apart:expect_talkers=0 --out "$OUT/q25_ramp18.json" 2>&1 | grep -v '^\[transformers\]' \
      | cut -c1-600 | tail -8 || true
    ;;
  q25-first)
    # qwen25's run at N = 16 (twice) with the ramp of q25-ramp (18, 18, 24, 36, then 48) and the
    # codec's first windows waiting for those of the replies prefilled with them (the default),
    # then N = 16 without that wait (q25_first.json; about 400 s held)
    timeout 480 python3 benchmarks/omni_capacity.py "${q25[@]}" --sessions 16 16 --first-frames 18 --ramp-frames 18 24 36 \
      --sweep apart:expect_windows=0 --sweep-sessions 16 --out "$OUT/q25_first.json" 2>&1 | grep -v '^\[transformers\]' \
      | cut -c1-400 | tail -8 || true
    ;;
  q25-align)
    # qwen25's run at N = 16 (twice) with the ramp of q25-ramp and each stage's first decode steps
    # after a prefill batch waiting for that batch's sessions (the default since this mode was
    # written), then N = 16 without, then without the codec's first windows waiting for each
    # other (q25_align.json; about 400 s held)
    timeout 480 python3 benchmarks/omni_capacity.py "${q25[@]}" --sessions 16 16 --first-frames 18 --ramp-frames 18 24 36 \
      --sweep apart:expect_steps=0 windows-apart:expect_windows=0 --sweep-sessions 16 --out "$OUT/q25_align.json" 2>&1 \
      | grep -v '^\[transformers\]' | cut -c1-400 | tail -8 || true
    ;;
  q25-first20)
    # q25-align's run with first chunks of 20 frames (18 heard: the codec holds 2 back), which
    # outlast the second codec pass of 16 sessions (q25-align: 16 heard frames, 320 ms, against a
    # pass of about 322 ms), ramp 20, 24, 36, then 48; N = 1, 16 twice, 20 and 24 (q25_first20.json;
    # about 400 s held)
    timeout 480 python3 benchmarks/omni_capacity.py "${q25[@]}" --sessions 1 16 16 20 24 --first-frames 20 --ramp-frames 20 24 36 \
      --out "$OUT/q25_first20.json" 2>&1 | grep -v '^\[transformers\]' | cut -c1-400 | tail -8 || true
    ;;
  q25-default)
    # q25-first20's settings at the engine's defaults since the seventeenth session (codec graphs in
    # pieces, 4 queued): N = 1, 16, 16, then 16 with all pieces queued at once (codec_queued=0), all warm
    # (q25_default.json; about 300 s held; an H100 will do)
    timeout 420 python3 benchmarks/omni_capacity.py "${q25[@]}" --sessions 1 16 16 --first-frames 20 --ramp-frames 20 24 36 \
      --sweep whole:codec_queued=0 --sweep-sessions 16 --out "$OUT/q25_default.json" 2>&1 \
      | grep -v '^\[transformers\]' | cut -c1-400 | tail -8 || true
    ;;
  probe)
    # one thread replaying a long graph (3000 products, like a codec pass) beside another's short
    # steps, whole and in pieces: what the short step waits (probe.json; about 60 s held, no model)
    timeout 200 python3 benchmarks/graph_pieces_probe.py --out "$OUT/probe.json" 2>&1 | tail -12 || true
    ;;
  q25-pieces)
    # q25-first20's settings at N = 16 and 20 with the codec's graphs in pieces, two queued at a time
    # (--codec-queued-pieces 2; the engine's default is 4 since this run), then at N = 16
    # with every piece queued at once, as a whole pass was (codec_queued=0), and with four; each
    # loop's step timeline records its launches (q25_pieces.json; about 300 s held; an H100 will do)
    timeout 450 python3 benchmarks/omni_capacity.py "${q25[@]}" --sessions 16 20 --codec-queued-pieces 2 \
      --sweep whole:codec_queued=0 q4:codec_queued=4 --sweep-sessions 16 --first-frames 20 --ramp-frames 20 24 36 \
      --out "$OUT/q25_pieces.json" 2>&1 | grep -v '^\[transformers\]' | cut -c1-400 | tail -8 || true
    ;;
  q25-conn)
    # q25-first20's settings at N = 16, 20, 20 with 32 hardware work queues instead of the driver's
    # 8 (CUDA_DEVICE_MAX_CONNECTIONS): the first talker step after a codec pass begins took 55-120
    # ms against 9.5, as if queued behind the pass's kernels (q25_conn32.json; about 330 s held)
    CUDA_DEVICE_MAX_CONNECTIONS=32 timeout 420 python3 benchmarks/omni_capacity.py "${q25[@]}" --sessions 16 20 20 \
      --first-frames 20 --ramp-frames 20 24 36 --out "$OUT/q25_conn32.json" 2>&1 | grep -v '^\[transformers\]' \
      | cut -c1-400 | tail -6 || true
    ;;
  qwen3-align)
    # Qwen3 at N = 1, 32, 32, 64 with the codec's graphs in pieces, four queued at a time, then 32 with
    # them queued at once, and two at a time (q3_align.json; about 220 s held on the H200)
    timeout 330 python3 benchmarks/omni_capacity.py --config .omni_cfg/Qwen3-Omni-30B-A3B-Instruct/config.reconstructed.json \
      --sessions 1 32 32 64 --codec-queued-pieces 4 --sweep whole:codec_queued=0 q2:codec_queued=2 \
      --sweep-sessions 32 --out "$OUT/q3_align.json" 2>&1 \
      | grep -v '^\[transformers\]' | cut -c1-300 | tail -8 || true
    ;;
  qwen3-pieces)
    # qwen3-align cut to what a short lease holds: N = 1 (the warm-up), 32 at the defaults (pieces, 4
    # queued), then 32 with all pieces queued at once (q3_pieces.json; about 150 s held on the H200)
    qwen3_pieces .omni_cfg/Qwen3-Omni-30B-A3B-Instruct/config.reconstructed.json q3_pieces
    ;;
  qwen3-h100)
    # when no H200 comes: qwen3-pieces with the thinker's layers cut from 48 to 32 (about 20 GB of
    # experts less), so that the model fits an H100's 78 GiB; a 32-layer step at 3.35 TB/s takes about what the
    # H200 takes for 48 at 4.8, but it is a proxy: report it as such (q3_h100.json)
    qwen3_pieces "$(thinker32_config)" q3_h100
    ;;
  qwen3-h100-ab)
    # the 32-layer proxy of qwen3-h100 at N = 1, 32 for an earlier tree (.base, carried; made as for
    # qwen3-ab) and this one, earlier first (q3h_ab_base.json, q3h_ab_head.json; this one also at 32
    # with the interpreter's switch interval at 1 ms); then the GPU tests of the graphs and the
    # streams (about 400 s held). Without .base: this tree only
    config=$(thinker32_config)
    for side in base head; do
      root=$PWD; [ "$side" = base ] && root=$PWD/.base
      [ -d "$root/realtime_omni" ] || { echo "qwen3-h100-ab: no .base tree carried" >&2; continue; }
      extra=(); [ "$side" = head ] && extra=(--sweep switch1:switch_ms=1 --sweep-sessions 32)
      (cd "$root" && PYTHONPATH="/tmp/site:$root" timeout 200 python3 benchmarks/omni_capacity.py --config "$config" \
        --sessions 1 32 "${extra[@]}" --out "$OUT/q3h_ab_$side.json" 2>&1 | grep -v '^\[transformers\]' | cut -c1-300 | tail -4) || true
    done
    gpu_tests
    ;;
  codec-memory)
    # the codec's window graphs at 32 sessions' group buckets: GPU memory after the load and replays
    # against eager runs, by capture (codec_memory.json); then the graphs' GPU tests
    timeout 420 python3 benchmarks/codec_graph_memory.py --config .omni_cfg/Qwen3-Omni-30B-A3B-Instruct/config.reconstructed.json \
      --slots 32 --timeout 100 --out "$OUT/codec_memory.json" 2>&1 \
      | grep -v '^\[transformers\]' | cut -c1-300 | tail -8 || true
    gpu_tests
    ;;
  q25-ab)
    # qwen25's run of this tree against an earlier one (.base, carried; made as for qwen3-ab),
    # earlier first: q25_ab_base.json, q25_ab_head.json (about 300 s held)
    for side in base head; do
      root=$PWD; [ "$side" = base ] && root=$PWD/.base
      [ -d "$root/realtime_omni" ] || { echo "q25-ab: no .base tree carried" >&2; continue; }
      (cd "$root" && PYTHONPATH="/tmp/site:$root" timeout 280 python3 benchmarks/omni_capacity.py "${q25[@]/#.omni_cfg/$OLDPWD/.omni_cfg}" \
        --out "$OUT/q25_ab_$side.json" 2>&1 | grep -v '^\[transformers\]' | cut -c1-400 | tail -5) || true
    done
    ;;
  *)
    # the runs this script knows are those listed at its head
    echo "gpu-next: name one of these runs (got '$run'):" >&2
    sed -n '2,/^# Build the carried/p' "$0" | grep -v '^# Build the carried' >&2
    exit 2
    ;;
esac
done
