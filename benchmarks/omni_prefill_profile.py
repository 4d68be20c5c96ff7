#!/usr/bin/env python
"""Where a batched prefill of the omni engine spends its time: wall time, kernel launches and
the places that make the host wait for the device.

N sessions hand the benchmark's user turn (``omni_gpu.build_request``) to
``ModelSession.prefill`` together (the thinker's batched prefill, then the talker's). Each level
is timed; one level runs again under the torch profiler (kernel launches, host time per
operator) and under CUDA's sync debug mode, which warns at every host synchronisation: those
are grouped by the project or transformers line that caused them.

    python benchmarks/omni_prefill_profile.py --config .omni_cfg/Qwen3-Omni-30B-A3B-Instruct/config.reconstructed.json \\
        --sessions 1 16 --profile 16 --out prefill-profile.json

``--cold-profile`` puts the first level under the profiler instead: what a batch shape met for the
first time costs (the one-time 1.7 s of a first 4-row prefill seen at `e2adc41`). The model is
warmed up as the server's is (``OmniModel.warm_up``: prefills of one, two and four sessions on
CUDA), so this shows what is left of those costs after the load.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import threading
import time
import traceback
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for path in (ROOT, ROOT / "benchmarks"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

from omni_gpu import _sync, build_request  # noqa: E402


def prefill_together(model, req, n: int) -> dict:
    """``n`` fresh sessions prefill the same turn at once; seconds until all are done."""
    sessions = [model.open_session() for _ in range(n)]
    barrier = threading.Barrier(n)
    done: list[float] = [0.0] * n
    errors: list[str] = []

    def one(i: int) -> None:
        try:
            barrier.wait()
            t0 = time.perf_counter()
            sessions[i].prefill(req)
            _sync()
            done[i] = time.perf_counter() - t0
        except BaseException as exc:  # noqa: BLE001
            errors.append(f"{type(exc).__name__}: {exc}"[:300])
            barrier.abort()

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(n)]
    t0 = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    wall = time.perf_counter() - t0
    for s in sessions:
        s.close()
    return {"sessions": n, "wall_ms": 1000 * wall, "max_ms": 1000 * max(done), "errors": errors,
            "batches": {k: v for k, v in model.batching.stats().items() if "prefill" in k}}


def sync_sites(model, req, n: int, top: int) -> list[dict]:
    """The source lines (project or transformers) that synchronised with the device."""
    import torch

    sites: collections.Counter[str] = collections.Counter()

    def note(message, category, filename, lineno, file=None, line=None):  # noqa: ARG001
        frames = [f for f in traceback.extract_stack()[:-1]
                  if ("realtime_omni" in f.filename or "transformers" in f.filename) and "warnings" not in f.filename]
        where = " <- ".join(f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in frames[-3:][::-1])
        sites[where or f"{filename}:{lineno}"] += 1

    previous = warnings.showwarning
    warnings.showwarning = note
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                prefill_together(model, req, n)
            finally:
                torch.cuda.set_sync_debug_mode(0)
    finally:
        warnings.showwarning = previous
    return [{"site": site, "syncs": count} for site, count in sites.most_common(top)]


def profile(model, req, n: int, top: int, level: dict | None = None) -> dict:
    """The torch profiler around one level (its result is written into ``level`` if given)."""
    from torch.profiler import ProfilerActivity, profile as torch_profile

    with torch_profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        ran = prefill_together(model, req, n)
    if level is not None:
        level.update(ran)
    table = prof.key_averages()
    launches = sum(e.count for e in table if e.key in ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC",
                                                       "cuLaunchKernelEx"))
    out = {"kernel_launches": launches}
    for key in ("self_cpu_time_total", "self_device_time_total"):
        rows = sorted(table, key=lambda e: getattr(e, key, 0), reverse=True)[:top]
        out[key] = [{"name": e.key[:100], "calls": e.count, "ms": getattr(e, key, 0) / 1000} for e in rows]
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", required=True, type=Path)
    ap.add_argument("--sessions", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--profile", type=int, default=16)
    ap.add_argument("--prompt-tokens", type=int, default=120)
    ap.add_argument("--audio-seconds", type=float, default=2.0)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--cold-profile", action="store_true",
                    help="run the first level (after the one-session warm-up) under the profiler: "
                         "what a batch shape met for the first time costs")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    import torch

    from realtime_omni.engines.omni import OmniModel
    from realtime_omni.engines.settings import OmniSettings

    slots = max(*args.sessions, args.profile)
    settings = OmniSettings(device=args.device, dtype=args.dtype, system_prompt="", max_new_tokens=8, seed=0,
                            max_sessions=slots, cache_tokens=1024, realtime_admission="off")
    model = OmniModel.random(args.config, settings, model_id=args.config.parent.name,
                             progress=lambda msg: print(msg, flush=True))
    req, _msg, n_prompt = build_request(model, args.prompt_tokens, args.audio_seconds, 8)
    prefill_together(model, req, 1)  # warm-up
    result: dict = {"config": str(args.config), "prompt_tokens": n_prompt, "torch": torch.__version__, "levels": []}
    for i, n in enumerate(args.sessions):
        if i == 0 and args.cold_profile and torch.cuda.is_available():
            level: dict = {}
            result["cold_profile"] = profile(model, req, n, args.top, level)
            for row in result["cold_profile"]["self_cpu_time_total"][:15]:
                print(f"cold host {row['ms']:9.1f} ms {row['calls']:7d} x {row['name']}", flush=True)
        else:
            level = prefill_together(model, req, n)
        print(json.dumps({k: level[k] for k in ("sessions", "wall_ms", "max_ms", "errors")}), flush=True)
        result["levels"].append(level)
    if args.profile and torch.cuda.is_available():
        result["syncs"] = sync_sites(model, req, args.profile, args.top)
        for row in result["syncs"]:
            print(f"sync {row['syncs']:6d} x {row['site']}", flush=True)
        result["profile"] = profile(model, req, args.profile, args.top)
        print(f"kernel launches: {result['profile']['kernel_launches']}", flush=True)
        for row in result["profile"]["self_cpu_time_total"][:20]:
            print(f"host {row['ms']:9.1f} ms {row['calls']:7d} x {row['name']}", flush=True)
    model.close()
    args.out.write_text(json.dumps(result, indent=1, default=float))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
