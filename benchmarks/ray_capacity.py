"""Capacity of model workers on Ray: one worker against two, the embedded model, spoken turns.

A loopback Ray cluster (``tests/ray_cluster.py``: a CPU-less head, one node of one logical CPU per
worker) serves ``embedded`` through :class:`~realtime_omni.engines.placement.RayModel`, the
gateway's path. Each worker actor is pinned to a core of its own (``sched_setaffinity`` on its
pid) with one thread per component, so a worker is one core's worth of capacity, as a worker
per box would be. N sessions at once each repeat a spoken turn for ``--seconds``: transcription
of a question synthesized by Piper (4 words), a reply of at most ``--tokens`` tokens, spoken.
Per level: turns answered per minute, and time to first audio (from the turn's start) p50 / p95.

    python benchmarks/ray_capacity.py --workers 1 2 --sessions 1 2 4 8 --seconds 30

On a machine with fewer cores than workers + 1 the gateway (this process) and the workers
share cores, and the comparison says little; the numbers in docs/deployment.md say where
they were taken.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.ray_cluster import loopback_cluster  # noqa: E402  (sets Ray's environment first)
from realtime_omni.engines.base import ThinkRequest, TurnMessage  # noqa: E402
from realtime_omni.engines.placement import RayModel  # noqa: E402
from realtime_omni.engines.settings import EmbeddedSettings, EngineSettings  # noqa: E402

QUESTION = "What time is it?"


def question_audio() -> "object":
    """The spoken question, 16 kHz int16 (Piper's 22.05 kHz resampled with soxr)."""
    import numpy as np
    import soxr

    from realtime_omni.engines.embedded.tts_piper import PiperTTS

    tts = PiperTTS(threads=1)
    pcm = np.concatenate(list(tts.synthesize(QUESTION)))
    return soxr.resample(pcm, tts.sample_rate, 16_000).astype(np.int16)


def one_turn(session, pcm16k, tokens: int, rate: int) -> tuple[float | None, float]:
    """(seconds to the first audio, audio seconds spoken) of one turn, as the pipeline makes it."""
    started = time.monotonic()
    text = session.transcribe(pcm16k)
    request = ThinkRequest(instructions="Answer in one short sentence.",
                           messages=[TurnMessage(role="user", text=text or QUESTION)],
                           max_output_tokens=tokens, voice="alloy", want_audio=True)
    first: float | None = None
    spoken = 0.0
    pending = []
    outputs = list(session.think(request))
    for index in range(len(outputs) + 1):
        final = index == len(outputs)
        if not final:
            pending.append(outputs[index])
        cut = session.talk_boundary(pending, final)
        if cut <= 0:
            continue
        segment, pending = pending[:cut], pending[cut:]
        for out in session.talk(segment, "alloy", threading.Event(), final and not pending):
            if out.audio is not None and len(out.audio):
                if first is None:
                    first = time.monotonic() - started
                spoken += len(out.audio) / rate
    return first, spoken


def run_level(model: RayModel, sessions: int, seconds: float, pcm16k, tokens: int) -> dict:
    firsts: list[float] = []
    turns = 0
    errors: list[str] = []
    lock = threading.Lock()
    opened = [model.open_session() for _ in range(sessions)]
    where = [s.worker.worker_id for s in opened]
    deadline = time.monotonic() + seconds

    def loop(session) -> None:
        nonlocal turns
        while time.monotonic() < deadline:
            try:
                first, _spoken = one_turn(session, pcm16k, tokens, model.info.output_rate)
            except Exception as exc:  # noqa: BLE001 - counted, reported
                with lock:
                    errors.append(f"{type(exc).__name__}: {exc}")
                return
            if time.monotonic() > deadline + 5:
                return  # a turn that ran long past the window is not counted
            with lock:
                turns += 1
                if first is not None:
                    firsts.append(first)

    started = time.monotonic()
    threads = [threading.Thread(target=loop, args=(s,)) for s in opened]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - started
    for s in opened:
        s.close()
    firsts.sort()
    return {
        "sessions": sessions, "turns": turns, "turns_per_min": round(60.0 * turns / wall, 1),
        "first_audio_p50_ms": round(1000 * statistics.median(firsts)) if firsts else None,
        "first_audio_p95_ms": round(1000 * firsts[int(0.95 * (len(firsts) - 1))]) if firsts else None,
        "errors": errors[:3], "workers_used": len({w for w in where if w}),
    }


def pin_workers(model: RayModel) -> list[int]:
    """Each worker actor's process on a core of its own (0, 1, ...), every thread of it (a
    thread keeps its own mask: the process's alone would leave the pools made at load free);
    returns the pids."""
    pids = []
    for index, worker in enumerate(model.workers):
        core = {index % os.cpu_count()}
        for tid in os.listdir(f"/proc/{worker.pid}/task"):
            os.sched_setaffinity(int(tid), core)
        pids.append(worker.pid)
    return pids


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--sessions", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--tokens", type=int, default=16, help="longest reply in tokens")
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    args = parser.parse_args()
    pcm16k = question_audio()
    engines = EngineSettings(embedded=EmbeddedSettings(threads=1))
    results = []
    for workers in args.workers:
        with loopback_cluster(worker_nodes=workers, cpus_per_node=1) as cluster:
            model = RayModel("embedded", cluster.address, engines=engines)
            began = time.monotonic()
            model.load()
            print(f"{workers} worker(s) loaded in {time.monotonic() - began:.0f} s; pids {pin_workers(model)}",
                  flush=True)
            try:
                for warm in [model.open_session() for _ in range(workers)]:  # every worker's path once
                    one_turn(warm, pcm16k, args.tokens, model.info.output_rate)
                    warm.close()
                for n in args.sessions:
                    level = {"workers": workers, **run_level(model, n, args.seconds, pcm16k, args.tokens)}
                    print(json.dumps(level), flush=True)
                    results.append(level)
            finally:
                model.close()
    print("\n| workers | sessions | turns / min | first audio p50 / p95 (ms) |\n|---:|---:|---:|---|")
    for r in results:
        print(f"| {r['workers']} | {r['sessions']} | {r['turns_per_min']} | "
              f"{r['first_audio_p50_ms']} / {r['first_audio_p95_ms']} |")
    if args.out is not None:
        args.out.write_text(json.dumps({"command": " ".join(sys.argv), "cpus": os.cpu_count(),
                                        "results": results}, indent=1) + "\n")


if __name__ == "__main__":
    main()
