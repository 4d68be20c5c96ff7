#!/usr/bin/env python
"""How many live omni sessions one GPU keeps in real time (the batched stages).

For each N: N sessions are opened first, then N replies start together (a barrier), each driven
the way the pipeline drives one (think / talk / decode threads, see ``omni_gpu.stream_once``),
with the shared prompt of the GPU report and a reply forced to ``--reply-tokens`` tokens.
Recorded per N: time to first audio, chunk real-time factor, audio produced per wall second,
underruns after the first audio (a chunk ready after the listener would have reached it), GPU
memory, and the batchers' step counts, rows per step and step times.

    python benchmarks/omni_capacity.py --config .omni_cfg/Qwen3-Omni-30B-A3B-Instruct/config.reconstructed.json \\
        --sessions 1 2 4 8 16 32 48 64 --out capacity-raw.json

One process per ``--config`` (a fault in one model leaves the other's numbers).
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
for p in (ROOT, ROOT / "benchmarks"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

from omni_gpu import _pct, _sync, build_request, run_isolated, stream_once  # noqa: E402

from realtime_omni.engines.omni.streams import sleeping_waits  # noqa: E402
from realtime_omni.engines.settings import OmniSettings  # noqa: E402


def late_chunks(run: dict) -> list[tuple[int, float]]:
    """Chunks that arrived after playback (started at the first audio) would have needed them:
    (index among the reply's audio chunks, ms late)."""
    first = run["ttfa_ms"]
    if first is None:
        return []
    clock = first / 1000.0
    late_ones = []
    for index, chunk in enumerate(c for c in run["chunks"] if c["samples"] > 0):
        late = chunk["ready_s"] - clock
        if late > 0.001:
            late_ones.append((index, 1000 * late))
            clock = chunk["ready_s"]
        clock += chunk["samples"] / 24_000
    return late_ones


def underruns(run: dict) -> tuple[int, float]:
    """How many chunks were late, and the total gap (ms) a listener heard."""
    late = late_chunks(run)
    return len(late), sum(ms for _, ms in late)


def batch_loops(model) -> dict:
    """Every batched loop of the model by name (decode steps, prefills, codec)."""
    if model.batching is None:
        return {}
    loops = {b.name: b for b in model.batching.batchers}
    loops["thinker prefill"] = model.batching.prefill
    loops["talker prefill"] = model.batching.talker_prefill
    if model.codec.batcher is not None:
        loops["codec"] = model.codec.batcher
    return loops


def batch_stats(model) -> dict:
    """steps / rows / busy seconds of every batched loop."""
    return {name: loop.stats() for name, loop in batch_loops(model).items()}


#: how much of a level's start the timeline keeps: its burst of prefills and first chunks
TIMELINE_S = 3.0


def loop_timeline(model, since: float) -> dict[str, list[list[float]]]:
    """Each loop's steps in the first :data:`TIMELINE_S` after ``since``: [start ms, duration
    ms, rows, launch ms] — which loop held the others up while a burst of replies started, and
    whether a step waited on its host thread (its launch: queuing its work) or on the device
    (launch ms null: a step that launched nothing, a prefill)."""
    out = {}
    for name, loop in batch_loops(model).items():
        launched = dict(loop.launches)
        out[name] = [[round(1000 * (a - since), 1), round(1000 * (b - a), 1), rows,
                      round(1000 * (launched[a] - a), 1) if a in launched else None]
                     for a, b, rows in loop.steps_since(since) if a - since < TIMELINE_S]
    return out


def stats_delta(before: dict, after: dict) -> dict:
    out = {}
    for name, a in after.items():
        b = before.get(name, {"steps": 0, "rows": 0, "busy_s": 0.0})
        steps = a["steps"] - b["steps"]
        rows = a["rows"] - b["rows"]
        busy = a["busy_s"] - b["busy_s"]
        dev = a.get("device_s", 0.0) - b.get("device_s", 0.0)
        dev_steps = a.get("device_steps", 0) - b.get("device_steps", 0)
        out[name] = {"steps": steps, "mean_rows": rows / steps if steps else 0.0,
                     "ms_per_step": 1000 * busy / steps if steps else None, "busy_s": busy,
                     # the device's span of a step (CUDA events), beside the loop's wall time
                     "device_ms_per_step": 1000 * dev / dev_steps if dev_steps else None, "device_s": dev,
                     "step_ms_by_bucket": a.get("step_ms", {}),
                     "steps_by_columns": {c: n - b.get("columns_steps", {}).get(c, 0)
                                          for c, n in a.get("columns_steps", {}).items()}}
        if "phase_s" in a:  # the loop's idle / host / device-wait seconds over the level
            out[name]["phase_s"] = {k: v - b.get("phase_s", {}).get(k, 0.0) for k, v in a["phase_s"].items()}
        if "graph_batches" in a:  # prefills: batches that replayed a captured bucket
            out[name]["graph_batches"] = a["graph_batches"] - b.get("graph_batches", 0)
        if "requests" in a:  # prefills: each new turn's wait for a batch, and until its result
            new = a["requests"] - b.get("requests", 0)
            recent = a.get("recent", [])[-new:] if 0 < new <= len(a.get("recent", [])) else []
            out[name]["requests"] = new
            out[name]["wait_ms"] = _spread([1000 * w for _, w, _ in recent])
            out[name]["latency_ms"] = _spread([1000 * t for _, _, t in recent])
            prepared = [1000 * p for p, _, _ in recent if p is not None]
            if prepared:  # the session's own work before queuing it (its prompt, its inputs)
                out[name]["prepared_ms"] = _spread(prepared)
        for key in ("graph_rows", "eager_rows", "padded_rows", "mixed_passes", "mixed_padded_codes"):  # codec
            if key in a:
                out[name][key] = a[key] - b.get(key, 0)
    return out


def _spread(values: list[float]) -> dict[str, float | None]:
    return {"p50": _pct(values, 50), "p95": _pct(values, 95), "max": max(values, default=None)}


def count_windows(model) -> dict:
    """Count the codec windows replies ask for, by (length in codes, steady), until the level
    ends (an instance attribute over :meth:`OmniCodec._window`, removed afterwards)."""
    shapes: dict = {}
    codec = model.codec
    if codec is None:
        return shapes
    window = type(codec)._window.__get__(codec)
    lock = threading.Lock()

    def counted(key, fn, inputs, steady, *rest):
        with lock:
            shapes[(key[-1], steady)] = shapes.get((key[-1], steady), 0) + 1
        return window(key, fn, inputs, steady, *rest)

    codec._window = counted
    return shapes


class GcPauses:
    """The garbage collector's passes while a level runs, by generation: count, longest and
    total ms (each pass holds the interpreter lock: every loop and session waits)."""

    def __init__(self) -> None:
        self.passes: list[tuple[int, float]] = []
        self._began = 0.0

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._began = time.perf_counter()
        else:
            self.passes.append((int(info["generation"]), 1000 * (time.perf_counter() - self._began)))

    def __enter__(self) -> GcPauses:
        gc.callbacks.append(self)
        return self

    def __exit__(self, *exc) -> None:
        gc.callbacks.remove(self)

    def summary(self) -> dict[str, list[float]]:
        out: dict[str, list[float]] = {}
        for gen in sorted({g for g, _ in self.passes}):
            ms = [m for g, m in self.passes if g == gen]
            out[str(gen)] = [len(ms), round(max(ms), 1), round(sum(ms), 1)]
        return out


def run_n(model, req, n: int, ahead_ms: float = 0.0, arrive_ms: float = 0.0) -> dict:
    """N sessions, then N replies asked for together, or with ``arrive_ms``, one after another at
    that interval (session i asks ``i * arrive_ms`` after the first: replies that start while
    others are playing). With ``ahead_ms``, each session's turn is handed to
    ``ModelSession.prefill`` that long before its reply is asked for (as the server does at the
    pause that ends a turn under server_vad: 64 ms into the silence, 500 ms before the turn
    ends); timings count from the moment each reply is asked for, whether or not the prefill has
    finished by then."""
    import torch

    sessions = [model.open_session() for _ in range(n)]
    starts: list[float] = []
    barrier = threading.Barrier(n, action=lambda: starts.append(time.perf_counter()))
    results: list = [None] * n
    prefill_ms: list = [None] * n
    errors: list = []

    def one(i: int) -> None:
        try:
            if not ahead_ms and not arrive_ms:
                results[i] = stream_once(model, req, session=sessions[i], start=barrier)
                return
            barrier.wait()
            asked = starts[0] + (i * arrive_ms + ahead_ms) / 1000
            if ahead_ms:
                handed = asked - ahead_ms / 1000
                time.sleep(max(0.0, handed - time.perf_counter()))
                sessions[i].prefill(req)
                prefill_ms[i] = 1000 * (time.perf_counter() - handed)
            time.sleep(max(0.0, asked - time.perf_counter()))
            results[i] = stream_once(model, req, session=sessions[i], t0=asked)
        except BaseException as exc:  # noqa: BLE001
            errors.append(f"{type(exc).__name__}: {exc}"[:300])
            barrier.abort()

    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    shapes = count_windows(model)
    before = batch_stats(model)
    t0, cpu0 = time.perf_counter(), time.process_time()
    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(n)]
    with GcPauses() as pauses:
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    wall = time.perf_counter() - t0
    cpu = time.process_time() - cpu0  # every thread's CPU time: near 1 per wall second when the GIL binds
    after = batch_stats(model)
    timeline = loop_timeline(model, starts[0] if starts else t0)
    if model.codec is not None:
        del model.codec._window  # the class's method again
    for s in sessions:
        s.close()
    runs = [r for r in results if r is not None]
    ttfa = [r["ttfa_ms"] for r in runs if r["ttfa_ms"] is not None]
    rtf_p50 = [r["chunk_rtf_p50"] for r in runs if r["chunk_rtf_p50"] is not None]
    rtf_p95 = [r["chunk_rtf_p95"] for r in runs if r["chunk_rtf_p95"] is not None]
    rtf_max = [r["chunk_rtf_max"] for r in runs if r["chunk_rtf_max"] is not None]
    under = [underruns(r) for r in runs]
    decode = [1000 * c["decode_s"] for r in runs for c in r["chunks"]]
    audio = sum(r["audio_s"] for r in runs)
    return {
        "sessions": n, "errors": errors, "completed": len(runs), "wall_s": wall, "cpu_s": cpu,
        # the sessions' threads' CPU seconds by role, summed over sessions
        "session_cpu_s": {role: sum(r.get("thread_cpu_s", {}).get(role, 0.0) for r in runs)
                          for role in ("thinker", "talker", "codec")},
        "ttfa_ms": {"p50": _pct(ttfa, 50), "p95": _pct(ttfa, 95), "max": max(ttfa) if ttfa else None},
        "first_token_ms_p50": _pct([r["first_token_ms"] for r in runs], 50),
        # first audio by phase: the first thinker token (prefill), the first codes (talker), the audio
        "first_token_ms": _spread([r["first_token_ms"] for r in runs]),
        "first_codes_ms": _spread([r["first_codes_ms"] for r in runs]),
        # each phase from the thinker prefill's return to the first token, over sessions
        "reply_start_ms": {phase: _spread([r["reply_start_ms"][phase] for r in runs if r.get("reply_start_ms")])
                           for phase in ("prompt", "pick", "load")},
        # per session: its median / p95 / worst chunk; then over sessions
        "chunk_rtf": {"p50": _pct(rtf_p50, 50), "p95": _pct(rtf_p95, 95), "max": max(rtf_max) if rtf_max else None},
        "audio_s_per_wall_s": audio / wall if wall else None,
        "audio_s": audio,
        "underrun_sessions": sum(1 for c, _ in under if c),
        "underruns": sum(c for c, _ in under),
        "underrun_gap_ms_max": max((g for _, g in under), default=0.0),
        # where in the replies the late chunks were: audio chunk index (5: the 6th or later) → count, ms
        "late_by_chunk": _late_by_chunk(runs),
        # which chunks make the chunk RTF's tail: its spread over sessions by audio chunk index
        "rtf_by_chunk": _rtf_by_chunk(runs),
        "decode_ms": {"p50": _pct(decode, 50), "p95": _pct(decode, 95)},
        # codec windows the replies asked for, by length in codes (steady: a shape that recurs)
        "codec_window_codes": {f"{k[0]}{'' if k[1] else ' last'}": v for k, v in sorted(shapes.items())},
        "gpu_mem_peak_gb": torch.cuda.max_memory_allocated() / 1e9 if torch.cuda.is_available() else None,
        "batches": stats_delta(before, after),
        "ttfa_all_ms": ttfa,
        # the collector's passes by generation: [count, longest ms, total ms]
        "gc_pauses": pauses.summary(),
        # the burst phase by phase: each loop's steps, and each session's first token / codes / audio
        "timeline": timeline,
        "session_marks_ms": sorted([r["first_token_ms"], r["first_codes_ms"], -1.0 if r["ttfa_ms"] is None else r["ttfa_ms"]]
                                   for r in runs),
        "ahead_ms": ahead_ms,
        "arrive_ms": arrive_ms,
        "pace_ms": 1000 * model.talker_settings.pace_lead_s,
        "prefill_ahead_ms": ({"p50": _pct([p for p in prefill_ms if p is not None], 50),
                              "max": max((p for p in prefill_ms if p is not None), default=None)}
                             if ahead_ms else None),
    }


def _late_by_chunk(runs: list[dict]) -> dict[int, dict[str, float]]:
    out: dict[int, dict[str, float]] = {}
    for run in runs:
        for index, ms in late_chunks(run):
            slot = out.setdefault(min(index, 5), {"count": 0, "ms_max": 0.0})
            slot["count"] += 1
            slot["ms_max"] = max(slot["ms_max"], ms)
    return dict(sorted(out.items()))


def _rtf_by_chunk(runs: list[dict], last: int = 8) -> dict[int, dict[str, float]]:
    """Chunk RTF (wall time since the previous audio chunk over this one's duration) by audio
    chunk index (``last``: that one and every later one), p50 / p95 / max over the sessions'
    chunks, with their mean length in frames."""
    rtf: dict[int, list[float]] = {}
    frames: dict[int, list[int]] = {}
    for run in runs:
        audible = [c for c in run["chunks"] if c["samples"] > 0]
        for index in range(1, len(audible)):
            gap = audible[index]["ready_s"] - audible[index - 1]["ready_s"]
            if gap <= 0:  # made together with the one before (as the per-session RTF counts them)
                continue
            slot = min(index, last)
            rtf.setdefault(slot, []).append(gap / (audible[index]["samples"] / 24_000))
            frames.setdefault(slot, []).append(audible[index]["frames"])
    return {i: {"p50": _pct(v, 50), "p95": _pct(v, 95), "max": max(v), "frames": sum(frames[i]) / len(frames[i])}
            for i, v in sorted(rtf.items())}


def level(model, req, n: int, variant: str, ahead_ms: float = 0.0, arrive_ms: float = 0.0) -> dict:
    res = run_n(model, req, n, ahead_ms, arrive_ms)
    brief = {k: res[k] for k in ("sessions", "completed", "ttfa_ms", "chunk_rtf", "audio_s_per_wall_s",
                                  "underrun_sessions", "underrun_gap_ms_max", "late_by_chunk", "rtf_by_chunk",
                                  "gpu_mem_peak_gb")}
    brief["variant"] = variant
    if ahead_ms:
        brief["prefill_ahead_ms"] = res["prefill_ahead_ms"]
    brief["rows"] = {k: round(v["mean_rows"], 1) for k, v in res["batches"].items()}
    brief["ms_per_step"] = {k: v["ms_per_step"] and round(v["ms_per_step"], 1) for k, v in res["batches"].items()}
    brief["device_ms_per_step"] = {k: v["device_ms_per_step"] and round(v["device_ms_per_step"], 1)
                                   for k, v in res["batches"].items()}
    brief["first_token_ms"], brief["first_codes_ms"] = res["first_token_ms"], res["first_codes_ms"]
    brief["reply_start_ms"] = res["reply_start_ms"]
    brief["prefill_ms"] = {k: {"prepared": v.get("prepared_ms"), "wait": v["wait_ms"], "done": v["latency_ms"]}
                           for k, v in res["batches"].items() if "wait_ms" in v}
    codec = res["batches"].get("codec", {})
    brief["codec_window_codes"] = res["codec_window_codes"]
    brief["codec_windows"] = {k: codec[k] for k in ("graph_rows", "eager_rows", "padded_rows", "mixed_passes",
                                                    "mixed_padded_codes") if k in codec}
    print(json.dumps(brief, default=float), flush=True)
    return res


def profile_level(model, req, n: int) -> dict:
    """One more level of ``n`` sessions under the torch profiler: the operators that took the
    most device and host time (where the time of a level goes)."""
    from torch.profiler import ProfilerActivity, profile

    short = type(req)(req.instructions, req.messages, 8, req.voice, True)  # the prefills dominate
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        run_n(model, short, n)
    table = prof.key_averages()
    out = {}
    for key in ("self_device_time_total", "self_cpu_time_total"):
        rows = sorted(table, key=lambda e: getattr(e, key, 0), reverse=True)[:30]
        out[key] = [{"name": e.key[:120], "calls": e.count, "ms": getattr(e, key, 0) / 1000} for e in rows]
        for row in out[key][:25]:
            print(f"profile {key}: {row['ms']:9.1f} ms {row['calls']:7d} x {row['name'][:90]}", flush=True)
    return out


#: what a ``--sweep`` variant may change between levels, without rebuilding the model
SWEEP_KEYS = {"switch_ms", "prefill_tokens", "frames", "lookahead", "ahead_ms", "all_columns",
              "eager_prefill", "pipelined", "arrive_ms", "pace_ms", "first_frames", "ramp", "burst_ms",
              "gc_freeze", "sleeping_waits", "mix", "codec_burst_ms", "codec_graphs", "codec_queued",
              "expect_talkers", "expect_windows", "expect_steps"}
#: each stage's column buckets as built (``all_columns=1`` makes every step attend over the whole slot)
_COLUMN_BUCKETS: dict[str, list[int]] = {}


def parse_variant(spec: str) -> tuple[str, dict[str, float]]:
    """``name:key=value,key=value`` (keys in :data:`SWEEP_KEYS`)."""
    name, _, body = spec.partition(":")
    settings = {}
    for part in filter(None, body.split(",")):
        key, _, value = part.partition("=")
        if key not in SWEEP_KEYS:
            raise SystemExit(f"--sweep: unknown setting {key!r} (one of {sorted(SWEEP_KEYS)})")
        settings[key] = float(value)
    return name, settings


def ramp_frames(value: float | tuple[int, ...]) -> tuple[int, ...]:
    """The frames of the chunks after the first: the model's own (a tuple, passed through) or a
    sweep's digits (24: a chunk of 2, then 4; 0: none). The model's ramp never goes through
    digits: Qwen2.5's (12, 18) written as 1218 came back as chunks of 1, 2, 1 and 8 frames, window
    shapes the codec had not captured at load (every Qwen2.5 window ran eagerly)."""
    if isinstance(value, tuple):
        return value
    return tuple(int(d) for d in str(int(value))) if value else ()


def apply_variant(model, settings: dict[str, float], defaults: dict[str, Any]) -> dict[str, Any]:
    values = {**defaults, **settings}
    sys.setswitchinterval(values["switch_ms"] / 1000.0)
    if values["gc_freeze"]:  # the load's heap out of the collector's sight (the engine does so on CUDA)
        gc.freeze()
    else:
        gc.unfreeze()
    sleeping_waits.on = bool(values["sleeping_waits"])
    for batcher in model.batching.batchers:
        batcher.pipelined = bool(values["pipelined"])
        built = _COLUMN_BUCKETS.setdefault(batcher.name, list(batcher.column_buckets))
        batcher.column_buckets = built[-1:] if values["all_columns"] else list(built)
    model.batching.prefill.token_budget = int(values["prefill_tokens"])
    for prefill in (model.batching.prefill, model.batching.talker_prefill):  # 1: no prefill graphs
        prefill.graphs.enabled = not values["eager_prefill"]
        prefill.burst_s = values["burst_ms"] / 1000.0
    model.talker_settings.max_new_tokens = int(values["frames"]) + 1
    model.talker_settings.pace_lead_s = values["pace_ms"] / 1000.0
    model.talker_settings.first_chunk_frames = int(values["first_frames"])
    model.talker_settings.ramp_frames = ramp_frames(values["ramp"])
    model.batching.lookahead = int(values["lookahead"])  # sessions opened from now on
    # the talker's prefill waits for the sessions of each thinker prefill batch (0: it does not)
    model.batching.prefill.on_finished = model.batching.talker_prefill.expect if values["expect_talkers"] else None
    # each stage's first decode steps after a prefill batch wait for its sessions (0: they do not)
    steps = bool(values["expect_steps"])
    model.batching.prefill.stepper = model.batching.thinker if steps else None
    model.batching.talker_prefill.stepper = model.batching.talker if steps else None
    # the codec's first windows wait for those of the replies prefilled with them (0: they do not)
    batcher = model.codec.batcher
    model.batching.talker_prefill.on_finished = (batcher.expect_first if values["expect_windows"] and batcher is not None
                                                 else None)
    if model.codec.batcher is not None:  # Qwen2.5: windows of several lengths in one pass (0: one length)
        model.codec.batcher.mix = bool(values["mix"])
        model.codec.batcher.burst_s = values["codec_burst_ms"] / 1000.0
    if model.codec is not None:  # 0: the codec's windows run eagerly (its graphs kept for later levels)
        model.codec.windows.enabled = bool(values["codec_graphs"])
        # the codec's graph pieces on the device at once (0: a pass queued whole)
        model.codec.windows.queued = int(values["codec_queued"])
    return values


def capacity_estimate(model) -> dict:
    """What the engine's admission would allow (``batching/capacity.py``), from the steps timed
    now: the levels' audio per wall second tell how close its model of the device comes."""
    from realtime_omni.engines.omni.batching import capacity

    sessions, line = model.estimate_capacity()
    times = model.capacity_times
    return {"sessions": sessions, "line": line, "budget": model.settings.realtime_budget,
            "ms_per_step": {"thinker": dict(times.thinker), "talker": dict(times.talker), "codec": dict(times.codec)},
            # a throw-away reply's own threads: the interpreter's ms per session and frame (0: not measured)
            "host_ms_per_frame": times.host,
            "tokens_per_frame": capacity.TOKENS_PER_FRAME[model.arch]}


def check_alone(model, req) -> dict:
    """A short reply in a batched session and in a session that steps alone (per-session graphs):
    the thinker's greedy tokens must agree. (The batched talker samples in its graph, with the
    model's setting, so its codes are not compared here; the CPU tests compare them greedily.)"""
    short = type(req)(req.instructions, req.messages, 12, req.voice, True)
    sampling = model.talker_settings.do_sample
    model.talker_settings.do_sample = False
    batching = model.batching
    try:
        batched = stream_once(model, short)
        model.batching = None
        alone = stream_once(model, short)
    finally:
        model.batching = batching
        model.talker_settings.do_sample = sampling
    pairs = zip(batched["tokens"], alone["tokens"])
    first_difference = next((i for i, (b, a) in enumerate(pairs) if b != a), None)
    return {"tokens_equal": batched["tokens"] == alone["tokens"], "first_difference": first_difference,
            "ttfa_ms": {"batched": batched["ttfa_ms"], "alone": alone["ttfa_ms"]}}


def run_config(path: Path, args) -> dict:
    import torch
    import transformers

    from realtime_omni.engines.omni import OmniModel
    from realtime_omni.engines.omni.graphs import verdicts
    from realtime_omni.engines.omni.loader import detect_architecture

    raw = json.loads(path.read_text())
    arch = detect_architecture(raw, where=str(path))
    frames = args.frames or (3 * args.reply_tokens if arch == "qwen2_5_omni" else args.reply_tokens)
    variants = [parse_variant(v) for v in args.sweep]
    most_frames = max([frames] + [int(v.get("frames", frames)) for _, v in variants])
    slots = max(max(args.sessions), args.profile, *(args.sweep_sessions or [0]))
    result: dict = {"config": str(path), "arch": arch, "name": path.parent.name, "frames": frames, "slots": slots,
                    "chunk_frames": args.chunk_frames, "ramp_frames": args.ramp_frames, "first_frames": args.first_frames,
                    "lookahead": args.lookahead, "dit_steps": args.dit_steps, "dit_dtype": args.dit_dtype,
                    "codec_queued_pieces": args.codec_queued_pieces, "codec_shared_pool": args.codec_shared_pool,
                    "lean_code_predictor": not args.modules_code_predictor,
                    "versions": {"torch": torch.__version__, "transformers": transformers.__version__}}
    t0 = time.perf_counter()
    settings = OmniSettings(device=args.device, dtype=args.dtype, ignore_eos=True, system_prompt="",
                            max_new_tokens=args.reply_tokens, talker_max_frames=most_frames + 1, seed=0,
                            max_sessions=slots, cache_tokens=args.cache_tokens, batch_gather_ms=args.gather_ms,
                            lookahead_steps=args.lookahead, chunk_frames=args.chunk_frames,
                            first_chunk_frames=args.first_frames,
                            ramp_frames=args.ramp_frames, pace_lead_ms=args.pace_ms, dit_steps=args.dit_steps,
                            dit_dtype=args.dit_dtype, codec_queued_pieces=args.codec_queued_pieces,
                            codec_shared_pool=bool(args.codec_shared_pool),
                            lean_code_predictor=not args.modules_code_predictor,
                            # every level runs, past the capacity too; the estimate is recorded below
                            realtime_admission="off")
    loading: list[str] = []  # the load's own report (graphs captured, prefills warmed up)

    def progress(msg: str) -> None:
        loading.append(msg)
        print(msg, flush=True)

    model = OmniModel.random(path, settings, model_id=path.parent.name, progress=progress)
    _sync()
    result["build_s"] = time.perf_counter() - t0
    result["load_messages"] = loading
    result["gpu_mem_after_load_gb"] = torch.cuda.memory_allocated() / 1e9 if torch.cuda.is_available() else None
    result["batching"] = {k: v for k, v in model.batching.stats().items() if k in ("slots", "kv_bytes_per_session")}
    result["graphs"] = {b.name: b.stats()["graphs"] for b in model.batching.batchers}
    for prefill in (model.batching.prefill, model.batching.talker_prefill):
        result["graphs"][prefill.name] = prefill.stats()["graphs"]
    if model.codec is not None:  # window shapes captured at load (alone and per group bucket)
        result["graphs"]["codec"] = model.codec.windows.captured
        result["codec_last_window_lengths"] = model.codec.last_window_lengths
    result["graph_verdicts"] = verdicts()
    result["capacity_estimate"] = capacity_estimate(model)
    print(result["capacity_estimate"]["line"], flush=True)
    print(json.dumps({"graphs": result["graphs"], "verdicts": result["graph_verdicts"],
                      "codec_last_window_lengths": result.get("codec_last_window_lengths")}), flush=True)
    req, _msg, n_prompt = build_request(model, args.prompt_tokens, args.audio_seconds, args.reply_tokens)
    result["prompt_tokens"] = n_prompt
    warm = type(req)(req.instructions, req.messages, 4, req.voice, True)
    stream_once(model, warm)
    defaults = {"switch_ms": 1000 * sys.getswitchinterval(),
                "prefill_tokens": model.batching.prefill.token_budget, "frames": frames,
                "burst_ms": 1000 * model.batching.prefill.burst_s, "gc_freeze": float(gc.get_freeze_count() > 0),
                "sleeping_waits": float(sleeping_waits.on),
                "lookahead": model.batching.lookahead, "ahead_ms": 0.0, "all_columns": 0.0,
                "eager_prefill": 0.0, "pipelined": float(model.batching.thinker.pipelined), "arrive_ms": 0.0,
                "pace_ms": 1000 * model.talker_settings.pace_lead_s,
                "first_frames": model.talker_settings.first_chunk_frames,
                "ramp": tuple(model.talker_settings.ramp_frames),
                "expect_talkers": float(model.batching.prefill.on_finished is not None),
                "expect_windows": float(model.batching.talker_prefill.on_finished is not None),
                "expect_steps": float(model.batching.prefill.stepper is not None),
                "mix": float(model.codec.batcher is not None and model.codec.batcher.mix),
                "codec_burst_ms": 1000.0 * model.codec.batcher.burst_s if model.codec.batcher is not None else 0.0,
                "codec_graphs": float(model.codec is not None and model.codec.windows.enabled),
                "codec_queued": float(model.codec.windows.queued if model.codec is not None else 0)}
    apply_variant(model, {}, defaults)
    result["runs"] = []
    for n in args.sessions:
        result["runs"].append(level(model, req, n, "default"))
        if args.partial is not None:
            args.partial.write_text(json.dumps(result, indent=1, default=float))
    result["sweep"] = []
    for name, settings in variants:
        values = apply_variant(model, settings, defaults)
        entry = {"name": name, "settings": values, "runs": []}
        result["sweep"].append(entry)
        for n in args.sweep_sessions or args.sessions:
            entry["runs"].append(level(model, req, n, name, values["ahead_ms"], values["arrive_ms"]))
            if args.partial is not None:
                args.partial.write_text(json.dumps(result, indent=1, default=float))
    apply_variant(model, {}, defaults)
    if args.profile:
        result["profile"] = profile_level(model, req, args.profile)
    if args.check_alone:
        try:
            result["check_alone"] = check_alone(model, req)
        except Exception as exc:  # noqa: BLE001
            result["check_alone"] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
    model.close()
    return result


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", action="append", required=True, type=Path)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--sessions", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 48, 64])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--prompt-tokens", type=int, default=120)
    ap.add_argument("--audio-seconds", type=float, default=2.0)
    ap.add_argument("--reply-tokens", type=int, default=64)
    ap.add_argument("--frames", type=int, default=None)
    ap.add_argument("--chunk-frames", type=int, default=None,
                    help="codec frames of a reply's steady audio chunks (default: the model's)")
    ap.add_argument("--first-frames", type=int, default=None,
                    help="codec frames of a reply's first audio chunk (default: the model's)")
    ap.add_argument("--ramp-frames", type=int, nargs="*", default=None,
                    help="frames of the chunks between the first and the steady ones (with --chunk-frames)")
    ap.add_argument("--cache-tokens", type=int, default=1024, help="thinker context per session slot")
    ap.add_argument("--gather-ms", type=float, default=2.0)
    ap.add_argument("--pace-ms", type=float, default=0.0,
                    help="the talker's lead over real-time playback (0: as fast as the GPU goes, what "
                         "the GPU can make; the server's default paces: sweep pace_ms to compare)")
    ap.add_argument("--check-alone", action="store_true")
    ap.add_argument("--lookahead", type=int, default=12, help="steps a session queues ahead per stage")
    ap.add_argument("--dit-steps", type=int, default=10,
                    help="Qwen2.5's codec: flow-matching steps per window (a build setting: one run per value)")
    ap.add_argument("--codec-queued-pieces", type=int, default=OmniSettings().codec_queued_pieces,
                    help="the codec's window graphs in pieces, at most this many queued on the GPU at once "
                         "(0: each window one graph; a build setting, then swept with codec_queued)")
    ap.add_argument("--codec-shared-pool", type=int, choices=[0, 1], default=int(OmniSettings().codec_shared_pool),
                    help="the codec's window graphs in one memory pool (1) or a pool each (0; a build setting)")
    ap.add_argument("--dit-dtype", default="float32", choices=["float32", "bfloat16"],
                    help="Qwen2.5's codec: the DiT transformer's precision (a build setting: one run per value)")
    ap.add_argument("--modules-code-predictor", action="store_true",
                    help="Qwen3's code predictor through transformers' modules, not the lean layout (a build setting)")
    ap.add_argument("--profile", type=int, default=0, help="profile one more level of this many sessions")
    ap.add_argument("--sweep", nargs="*", default=[],
                    help="variants run after the default levels, e.g. switch:switch_ms=0.5 "
                         "(settings: " + ", ".join(sorted(SWEEP_KEYS)) + ")")
    ap.add_argument("--sweep-sessions", type=int, nargs="*", help="levels of the variants (default: --sessions)")
    ap.add_argument("--timeouts", type=float, nargs="*")
    ap.add_argument("--single", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--partial", type=Path, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.single:
        res = run_config(args.config[0], args)
        args.out.write_text(json.dumps(res, indent=1, default=float))
        return 0
    import torch

    report = {"host": platform.node(), "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
              "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "args": {k: str(v) for k, v in vars(args).items()},
              "models": []}
    for i, path in enumerate(args.config):
        part = args.out.with_suffix(f".{i}.json")
        cmd = [sys.executable, __file__, "--single", "--config", str(path), "--out", str(part), "--partial", str(part),
               "--device", args.device, "--dtype", args.dtype, "--prompt-tokens", str(args.prompt_tokens),
               "--audio-seconds", str(args.audio_seconds), "--reply-tokens", str(args.reply_tokens),
               "--cache-tokens", str(args.cache_tokens), "--gather-ms", str(args.gather_ms),
               "--lookahead", str(args.lookahead), "--profile", str(args.profile), "--pace-ms", str(args.pace_ms),
               "--dit-steps", str(args.dit_steps), "--dit-dtype", args.dit_dtype,
               "--codec-queued-pieces", str(args.codec_queued_pieces), "--codec-shared-pool", str(args.codec_shared_pool),
               "--sessions", *map(str, args.sessions)]
        if args.sweep:
            cmd += ["--sweep", *args.sweep]
        if args.sweep_sessions:
            cmd += ["--sweep-sessions", *map(str, args.sweep_sessions)]
        if args.frames:
            cmd += ["--frames", str(args.frames)]
        if args.chunk_frames:
            cmd += ["--chunk-frames", str(args.chunk_frames)]
        if args.ramp_frames:
            cmd += ["--ramp-frames", *map(str, args.ramp_frames)]
        if args.first_frames:
            cmd += ["--first-frames", str(args.first_frames)]
        if args.check_alone:
            cmd.append("--check-alone")
        if args.modules_code_predictor:
            cmd.append("--modules-code-predictor")
        budget = args.timeouts[i] if args.timeouts and i < len(args.timeouts) else None
        report["models"].append(run_isolated(cmd, part, path, budget))
        args.out.write_text(json.dumps(report, indent=1, default=float))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
