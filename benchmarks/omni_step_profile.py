#!/usr/bin/env python
"""What one batched decode step of each omni stage runs on the GPU, kernel by kernel.

A captured step costs about the number of its kernels (each is tiny at decode sizes), so this
replays each stage's CUDA graph (thinker step, talker frame) at a few batch buckets and every
column bucket (how much of the KV slots a step attends over), times the replays with CUDA events, and lists the kernels of one replay under the torch profiler, grouped
by name: where the next fusion pays.

    python benchmarks/omni_step_profile.py --config .omni_cfg/Qwen3-Omni-30B-A3B-Instruct/config.reconstructed.json \\
        --buckets 1 8 32 --out step-profile.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def replay_ms(graph, stream, replays: int) -> float:
    import torch

    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with torch.cuda.stream(stream):
        graph()
        start.record(stream)
        for _ in range(replays):
            graph()
        stop.record(stream)
    stop.synchronize()
    return start.elapsed_time(stop) / replays


def kernels(graph, stream, replays: int, top: int) -> dict:
    """Kernels of ``replays`` replays under the profiler, per replay: count and device ms."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        with torch.cuda.stream(stream):
            for _ in range(replays):
                graph()
        stream.synchronize()
    rows = [e for e in prof.key_averages() if getattr(e, "self_device_time_total", 0) > 0]
    rows.sort(key=lambda e: e.self_device_time_total, reverse=True)
    total_n = sum(e.count for e in rows) / replays
    total_ms = sum(e.self_device_time_total for e in rows) / 1000 / replays
    return {"kernels_per_replay": total_n, "kernel_ms_per_replay": total_ms,
            "top": [{"name": e.key[:100], "per_replay": e.count / replays,
                     "ms_per_replay": e.self_device_time_total / 1000 / replays} for e in rows[:top]]}


def together_ms(graphs: list, streams: list, replays: int, one_stream: bool) -> float:
    """Ms per round when every stage replays one step per round: each on its own stream (as the
    engine runs them, so the GPU interleaves their kernels) or all on the first stage's stream."""
    import time

    import torch

    used = [streams[0]] * len(streams) if one_stream else streams
    for _ in range(2):
        for graph, stream in zip(graphs, used, strict=True):
            with torch.cuda.stream(stream):
                graph()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(replays):
        for graph, stream in zip(graphs, used, strict=True):
            with torch.cuda.stream(stream):
                graph()
    torch.cuda.synchronize()
    return 1000 * (time.perf_counter() - t0) / replays


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", required=True, type=Path)
    ap.add_argument("--buckets", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--replays", type=int, default=20)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--show", type=int, default=12, help="kernels printed per step")
    ap.add_argument("--cache-tokens", type=int, default=1024,
                    help="KV tokens per session (the server's default is 8192); every column bucket is timed")
    ap.add_argument("--together", action="store_true",
                    help="also time the stages' steps replayed together, on their own streams and on one")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)

    import torch

    from realtime_omni.engines.omni import OmniModel
    from realtime_omni.engines.settings import OmniSettings

    settings = OmniSettings(device="cuda", dtype="bfloat16", ignore_eos=True, system_prompt="",
                            max_sessions=max(args.buckets), cache_tokens=args.cache_tokens, seed=0,
                            realtime_admission="off")
    model = OmniModel.random(args.config, settings)
    result: dict = {"config": str(args.config), "gpu": torch.cuda.get_device_name(0),
                    "torch": torch.__version__, "stages": {}}
    with torch.inference_mode():
        for batcher in model.batching.batchers:
            stage = result["stages"][batcher.name] = {}
            for size, columns in itertools.product(args.buckets, batcher.column_buckets):
                bucket = batcher._bucket(next(s for s in batcher.sizes if s >= size), columns)
                stream = batcher.stream or torch.cuda.current_stream()
                with torch.cuda.stream(stream):
                    bucket.graph.ensure_captured()
                entry = {"ms_per_replay": replay_ms(bucket.graph, stream, args.replays)}
                entry.update(kernels(bucket.graph, stream, 3, args.top))
                stage[f"{bucket.size}x{columns}"] = entry
                print(f"{batcher.name} B={bucket.size} columns={columns}: {entry['ms_per_replay']:.2f} ms per "
                      f"replay, {entry['kernels_per_replay']:.0f} kernels ({entry['kernel_ms_per_replay']:.2f} ms "
                      "of kernels)", flush=True)
                for row in entry["top"][:args.show]:
                    print(f"    {row['per_replay']:6.0f} x {row['ms_per_replay']:7.3f} ms  {row['name'][:90]}", flush=True)
        if args.together:
            result["together"] = {}
            for size in args.buckets:
                steps, streams = [], []
                for batcher in model.batching.batchers:
                    bucket = batcher._bucket(next(s for s in batcher.sizes if s >= size), batcher.column_buckets[0])
                    steps.append(bucket.graph)
                    streams.append(batcher.stream or torch.cuda.current_stream())
                entry = {"alone_ms": [replay_ms(g, st, args.replays) for g, st in zip(steps, streams, strict=True)],
                         "own_streams_ms": together_ms(steps, streams, args.replays, one_stream=False),
                         "one_stream_ms": together_ms(steps, streams, args.replays, one_stream=True)}
                result["together"][size] = entry
                print(f"together B={size}: alone {' + '.join(f'{x:.2f}' for x in entry['alone_ms'])} ms; a round on "
                      f"their own streams {entry['own_streams_ms']:.2f} ms, on one stream {entry['one_stream_ms']:.2f} ms",
                      flush=True)
    model.close()
    args.out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
