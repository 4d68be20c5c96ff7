"""Reply audio through a model worker: Ray actors (streaming generators) vs the local worker process.

N sessions at once each stream a reply of ``--seconds`` of 20 ms audio chunks that the engine
makes in real time (the test engine ``tests/engines/ray_talky.py``); the consumer records how late
each chunk arrives against its real-time schedule. Ray runs as a loopback cluster of a CPU-less head
and two one-CPU worker nodes (``tests/ray_cluster.py``), so the sessions spread over two actors.

    python benchmarks/ray_streams.py --sessions 1 8 32 --seconds 3
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.ray_cluster import loopback_cluster  # noqa: E402  (sets Ray's environment first)
from realtime_omni.engines.worker import IsolatedModel  # noqa: E402
from realtime_omni.engines.placement import RayModel  # noqa: E402
from tests.engines.ray_talky import TalkyModel  # noqa: E402

CHUNK_MS = 20


def run(model, sessions: int, seconds: float) -> dict[str, float]:
    chunks = int(seconds * 1000 / CHUNK_MS)
    late: list[float] = []
    first: list[float] = []
    lock = threading.Lock()
    opened = [model.open_session() for _ in range(sessions)]

    def one(session) -> None:
        started = time.monotonic()
        mine = []
        for index, _out in enumerate(session.talk([], "v", threading.Event(), True)):
            mine.append((time.monotonic() - started) * 1000 - index * CHUNK_MS)
        with lock:
            first.append(mine[0])
            late.extend(x - mine[0] for x in mine[1:])

    threads = [threading.Thread(target=one, args=(s,)) for s in opened]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for s in opened:
        s.close()
    late.sort()
    assert len(late) == sessions * (chunks - 1), (len(late), sessions * chunks)
    return {"first": statistics.median(first), "p50": statistics.median(late),
            "p99": late[int(0.99 * (len(late) - 1))], "max": late[-1]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sessions", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--seconds", type=float, default=3.0)
    args = parser.parse_args()
    builder = functools.partial(TalkyModel, max_sessions=None, chunk_ms=CHUNK_MS,
                                chunks=int(args.seconds * 1000 / CHUNK_MS))
    rows = []
    local = IsolatedModel("talky", builder=builder)
    local.load()
    try:
        for n in args.sessions:
            rows.append(("local worker process", n, run(local, n, args.seconds)))
    finally:
        local.close()
    with loopback_cluster(worker_nodes=2) as cluster:
        model = RayModel("talky", cluster.address, builder=builder)
        model.load()
        try:
            for n in args.sessions:
                rows.append((f"Ray, {len(model.workers)} actors", n, run(model, n, args.seconds)))
        finally:
            model.close()
    print(f"\n20 ms chunks made in real time, {args.seconds:.0f} s per session. first: ms from the call to the "
          "first chunk (median of sessions); then each later chunk's lateness against the first's schedule, ms")
    print("| worker | sessions | first | p50 | p99 | max |\n|---|---:|---:|---:|---:|---:|")
    for name, n, r in rows:
        print(f"| {name} | {n} | {r['first']:.1f} | {r['p50']:.1f} | {r['p99']:.1f} | {r['max']:.1f} |")


if __name__ == "__main__":
    main()
