"""Does one long CUDA graph hold up another thread's short steps, and do pieces help?

A stand-in for the omni engine's codec pass beside its decode steps, without a model: one thread
replays a long graph (a chain of matrix products, thousands of kernels, like a codec pass of
Qwen2.5) over and over on a low-priority stream; another replays a short graph (a few dozen
kernels, like a decode step) on a high-priority stream and waits for each, as the talker's loop
does. The short step's wall time is measured alone, beside the long graph captured whole, and
beside the same work captured in pieces (``StepGraph(pieces=True)``, ``piece_boundary``) with
1, 2 or 4 queued at once. On an H100 (seventeenth session) the short step took 7.0 ms in every
case (1.8 alone): this stand-in does not reproduce the engine's stall, which follows how much of
the codec's work waits on the device (docs/benchmarks/omni-codec-pieces.md). Needs CUDA; writes JSON:

    python3 benchmarks/graph_pieces_probe.py --out probe.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from pathlib import Path

from realtime_omni.engines.omni.graphs import StepGraph, piece_boundary


def long_work(x, w, kernels: int, every: int):
    """``kernels`` products in a chain, a piece boundary every ``every`` of them."""
    for i in range(kernels):
        if i and i % every == 0:
            piece_boundary()
        x = x @ w
    return x


def short_work(h, w, kernels: int):
    for _ in range(kernels):
        h = h @ w
    return h


def short_steps(step, stream, seconds: float) -> list[float]:
    import torch

    times = []
    end = time.perf_counter() + seconds
    with torch.cuda.stream(stream):
        while time.perf_counter() < end:
            t0 = time.perf_counter()
            step()
            stream.synchronize()
            times.append(1000 * (time.perf_counter() - t0))
    return times


def beside(step, stream, long_graph, long_stream, seconds: float) -> list[float]:
    import torch

    stop = threading.Event()

    def churn() -> None:
        with torch.cuda.stream(long_stream):
            while not stop.is_set():
                long_graph()
                long_stream.synchronize()

    thread = threading.Thread(target=churn, daemon=True)
    thread.start()
    try:
        time.sleep(0.2)
        return short_steps(step, stream, seconds)
    finally:
        stop.set()
        thread.join(timeout=30)


def summary(times: list[float]) -> dict:
    times = sorted(times)
    return {"steps": len(times), "p50_ms": statistics.median(times), "p95_ms": times[int(0.95 * (len(times) - 1))],
            "max_ms": times[-1]}


def main(argv=None) -> int:
    import torch

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--long-kernels", type=int, default=3000)
    ap.add_argument("--every", type=int, default=300, help="kernels per piece")
    ap.add_argument("--short-kernels", type=int, default=200)
    ap.add_argument("--seconds", type=float, default=4.0)
    args = ap.parse_args(argv)
    dev = torch.device("cuda")
    low, high = torch.cuda.Stream(dev, priority=0), torch.cuda.Stream(dev, priority=-2)
    gen = torch.Generator(device=dev).manual_seed(0)
    big = torch.randn(2048, 2048, device=dev, dtype=torch.bfloat16, generator=gen) / 32
    wbig = torch.randn(2048, 2048, device=dev, dtype=torch.bfloat16, generator=gen) / 32
    small = torch.randn(16, 4096, device=dev, dtype=torch.bfloat16, generator=gen) / 64
    wsmall = torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16, generator=gen) / 64
    step = StepGraph(lambda: short_work(small, wsmall, args.short_kernels), device=dev, name="short",
                     run_stream=high, capture_stream=torch.cuda.Stream(dev))
    with torch.cuda.stream(high):
        step()
    queued = {"n": 0}
    whole = StepGraph(lambda: long_work(big, wbig, args.long_kernels, args.every), device=dev, name="long whole",
                      run_stream=low, capture_stream=torch.cuda.Stream(dev))
    pieces = StepGraph(lambda: long_work(big, wbig, args.long_kernels, args.every), device=dev, name="long pieces",
                       run_stream=low, capture_stream=torch.cuda.Stream(dev), pieces=True,
                       queued=lambda: queued["n"])
    with torch.cuda.stream(low):
        whole()
        pieces()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        whole()
        low.synchronize()
        long_ms = 1000 * (time.perf_counter() - t0)
    result = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "args": vars(args) | {"out": str(args.out)},
              "long_graph_ms": long_ms, "pieces": len(pieces.graphs)}
    result["alone"] = summary(short_steps(step, high, args.seconds))
    result["beside whole"] = summary(beside(step, high, whole, low, args.seconds))
    for n in (1, 2, 4, 0):
        queued["n"] = n
        result[f"beside pieces, {n or 'all'} queued"] = summary(beside(step, high, pieces, low, args.seconds))
    for key, value in result.items():
        print(key, json.dumps(value), flush=True)
    args.out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
