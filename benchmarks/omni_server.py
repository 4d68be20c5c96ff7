#!/usr/bin/env python
"""N live omni sessions through the real server: ``/v1/realtime`` WebSocket clients, one spoken turn each.

The server runs as its own process (``realtime-omni serve --model omni:<dir>``, the model in its
supervised worker process, as an operator runs it). For each N, N clients connect, configure the
session (no server turn detection: the turn ends when the client commits), send the same spoken
question (pcm16 24 kHz, base64 at the WebSocket edge as any client does), and then all ask for a
reply at the same moment. Recorded per client, from the ``response.create`` it sent:

- time to first audio (the first ``response.output_audio.delta``);
- underruns: a delta that arrives after a listener who started playing at the first audio would
  have needed it (and the total gap);
- audio seconds received and the reply's duration;
- the engine's batched stages (steps, rows per step) from ``/metrics``.

    python benchmarks/omni_server.py --model-dir DIR --sessions 8 32 --speech turn.npy --out server.json

``DIR`` holds a checkpoint, or only a ``config.json`` with ``--random-weights`` (real-size shapes,
random bf16 weights: what the GPU reports use). The speech is read from ``--speech`` (int16 .npy
at 24 kHz) or synthesized with the embedded Piper voice when that is installed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import base64
import json
import os
import platform
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np

RATE = 24_000
QUESTION = "Could you tell me, in a few sentences, what the weather is usually like in spring?"


def percentile(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


def speech(path: str | None) -> np.ndarray:
    if path:
        return np.load(path).astype(np.int16)
    from realtime_omni_bench.latency import synthesize_speech

    return synthesize_speech([QUESTION])[QUESTION]


def start_server(args: argparse.Namespace) -> subprocess.Popen:
    env = dict(os.environ)
    env.update({
        "REALTIME_OMNI_OMNI_DEVICE": args.device,
        "REALTIME_OMNI_OMNI_MAX_SESSIONS": str(args.slots),
        "REALTIME_OMNI_OMNI_MAX_NEW_TOKENS": str(args.reply_tokens),
        "REALTIME_OMNI_OMNI_TALKER_MAX_FRAMES": str(args.frames),
        "REALTIME_OMNI_OMNI_CACHE_TOKENS": str(args.cache_tokens),
        "REALTIME_OMNI_OMNI_RANDOM_WEIGHTS": "1" if args.random_weights else "0",
        "REALTIME_OMNI_OMNI_LOOKAHEAD_STEPS": str(args.lookahead),
        # the run measures what the GPU makes of N sessions, past the capacity estimated at load too
        "REALTIME_OMNI_ENGINES__OMNI__REALTIME_ADMISSION": args.realtime_admission,
    })
    if args.pace_ms is not None:
        env["REALTIME_OMNI_OMNI_PACE_LEAD_MS"] = str(args.pace_ms)
    cmd = [sys.executable, "-m", "realtime_omni", "serve", "--host", "127.0.0.1", "--port", str(args.port),
           "--model", f"omni:{args.model_dir}", "--max-sessions", str(args.slots + 8), "--session-store", "none",
           "--log-level", "warning"]
    return subprocess.Popen(cmd, env=env, start_new_session=True)


def wait_ready(port: int, proc: subprocess.Popen, timeout: float) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode} while loading")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/ready", timeout=2) as resp:
                if resp.status == 200:
                    return time.monotonic() - started
        except OSError:
            pass
        time.sleep(1.0)
    raise TimeoutError(f"the server was not ready within {timeout:.0f} s")


def engine_counters(port: int) -> dict[str, float]:
    """``realtime_omni_engine_*`` samples of /metrics, keyed by name and labels."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    out = {}
    for line in text.splitlines():
        m = re.match(r"^(realtime_omni_engine_\w+)(\{[^}]*\})?\s+([-+0-9.eE]+)$", line)
        if m:
            out[m.group(1) + (m.group(2) or "")] = float(m.group(3))
    return out


class Client:
    def __init__(self, index: int) -> None:
        self.index = index
        self.asked: float | None = None
        self.deltas: list[tuple[float, int]] = []  # (arrival, samples)
        self.done: float | None = None
        self.status = ""
        self.error = ""

    def summary(self) -> dict:
        if self.asked is None or not self.deltas:
            return {"ttfa_ms": None, "underruns": 0, "gap_ms": 0.0, "gaps": [], "audio_s": 0.0, "status": self.status,
                    "error": self.error}
        first = self.deltas[0][0]
        clock, count, gap, played = first, 0, 0.0, 0.0
        gaps = []  # (seconds into the reply's audio where the listener ran dry, ms of silence)
        for arrival, samples in self.deltas:
            late = arrival - clock
            if late > 0.001:
                count += 1
                gap += late
                gaps.append((played, 1000 * late))
                clock = arrival
            clock += samples / RATE
            played += samples / RATE
        audio = sum(s for _, s in self.deltas) / RATE
        return {"ttfa_ms": 1000 * (first - self.asked), "underruns": count, "gap_ms": 1000 * gap, "gaps": gaps,
                "audio_s": audio, "reply_s": (self.done or self.deltas[-1][0]) - self.asked,
                "status": self.status, "error": self.error}


#: where in a reply the listener ran dry: seconds of audio played before the gap
GAP_PLACES = (("first 0.5 s", 0.5), ("0.5-1.5 s", 1.5), ("later", float("inf")))


def gaps_at(rows: list[dict]) -> dict[str, dict[str, float]]:
    """The clients' gaps by where in the reply they fell: how many, and the longest (ms)."""
    out = {name: {"count": 0, "ms_max": 0.0} for name, _ in GAP_PLACES}
    for row in rows:
        for at, ms in row["gaps"]:
            name = next(n for n, limit in GAP_PLACES if at < limit)
            out[name]["count"] += 1
            out[name]["ms_max"] = max(out[name]["ms_max"], ms)
    return out


async def run_client(client: Client, url: str, pcm: np.ndarray, ready: asyncio.Barrier, go: asyncio.Event,
                     timeout: float, delay_s: float = 0.0) -> None:
    import websockets

    joined = False  # a client refused before the barrier still joins it, so the others go on
    try:
        async with websockets.connect(url, max_size=None, open_timeout=60) as ws:
            created = json.loads(await asyncio.wait_for(ws.recv(), 60))
            if created.get("type") == "error":  # refused (session_limit_reached: the admission)
                client.error = created.get("error", {}).get("code", "error")
                return
            if created.get("type") != "session.created":
                raise RuntimeError(f"expected session.created, got {created.get('type')}: {created}")
            await ws.send(json.dumps({"type": "session.update", "session": {
                "type": "realtime", "audio": {"input": {"turn_detection": None}}}}))
            raw = pcm.astype("<i2").tobytes()
            step = RATE // 10 * 2  # 100 ms per append
            for offset in range(0, len(raw), step):
                await ws.send(json.dumps({"type": "input_audio_buffer.append",
                                          "audio": base64.b64encode(raw[offset:offset + step]).decode()}))
            await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
            joined = True
            await ready.wait()
            await go.wait()
            await asyncio.sleep(delay_s)  # staggered arrivals: replies that start while others play
            client.asked = time.perf_counter()
            await ws.send(json.dumps({"type": "response.create"}))
            deadline = time.monotonic() + timeout
            while True:
                msg = await asyncio.wait_for(ws.recv(), max(1.0, deadline - time.monotonic()))
                now = time.perf_counter()
                if '"response.output_audio.delta"' in msg[:80]:
                    event = json.loads(msg)
                    client.deltas.append((now, len(base64.b64decode(event["delta"])) // 2))
                    continue
                event = json.loads(msg)
                if event["type"] == "error":
                    client.error = event.get("error", {}).get("code", "error")
                elif event["type"] == "response.done":
                    client.done = now
                    client.status = event["response"]["status"]
                    return
    except Exception as exc:  # noqa: BLE001 - one client's failure is a result of the level
        client.error = client.error or f"{type(exc).__name__}: {exc}"
    finally:
        if not joined:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(ready.wait(), 120)


async def run_level(port: int, n: int, pcm: np.ndarray, timeout: float, arrive_ms: float = 0.0) -> dict:
    """N clients; all ask for their reply at once, or with ``arrive_ms`` client i asks
    ``i * arrive_ms`` after the first."""
    clients = [Client(i) for i in range(n)]
    ready = asyncio.Barrier(n + 1)
    go = asyncio.Event()
    url = f"ws://127.0.0.1:{port}/v1/realtime"
    before = engine_counters(port)
    tasks = [asyncio.create_task(run_client(c, url, pcm, ready, go, timeout, c.index * arrive_ms / 1000))
             for c in clients]
    try:
        await asyncio.wait_for(ready.wait(), 120)
    except (TimeoutError, asyncio.BrokenBarrierError):
        pass
    started = time.perf_counter()
    go.set()
    await asyncio.gather(*tasks)
    wall = time.perf_counter() - started
    after = engine_counters(port)
    rows = [c.summary() for c in clients]
    ttfa = [r["ttfa_ms"] for r in rows if r["ttfa_ms"] is not None]
    audio = sum(r["audio_s"] for r in rows)
    diff = {k: after[k] - before.get(k, 0.0) for k in after if "_total" in k}
    return {
        "sessions": n, "arrive_ms": arrive_ms, "wall_s": wall, "answered": len(ttfa),
        "refused": sum(1 for r in rows if r["error"] == "session_limit_reached"), "errors": sorted({r["error"] for r in rows if r["error"]}),
        "ttfa_ms": {"p50": percentile(ttfa, 50), "p95": percentile(ttfa, 95), "max": max(ttfa) if ttfa else None},
        "sessions_with_underruns": sum(1 for r in rows if r["underruns"]),
        "gap_ms_p95": percentile([r["gap_ms"] for r in rows], 95),
        "gaps_at": gaps_at(rows),
        "audio_s_per_session": audio / n, "audio_s_per_wall_s": audio / wall if wall else 0.0,
        "engine": diff, "clients": rows,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--random-weights", action="store_true")
    ap.add_argument("--sessions", nargs="+", default=["8", "32"],
                    help="levels: N (all ask at once) or N@MS (one asks every MS milliseconds)")
    ap.add_argument("--pace-ms", type=float, default=None,
                    help="the engine's pace_lead_ms (default: the server's own default)")
    ap.add_argument("--slots", type=int, default=48)
    ap.add_argument("--reply-tokens", type=int, default=64)
    ap.add_argument("--frames", type=int, default=64, help="longest spoken reply in codec frames")
    ap.add_argument("--cache-tokens", type=int, default=1024)
    ap.add_argument("--lookahead", type=int, default=12, help="steps a session queues ahead per stage")
    ap.add_argument("--realtime-admission", default="off", choices=["auto", "on", "off"],
                    help="the engine's admission by its measured real-time capacity (the server's default: auto)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--speech", default=None, help="int16 .npy at 24 kHz (default: synthesized with Piper)")
    ap.add_argument("--port", type=int, default=8765)
    ap.add_argument("--load-timeout", type=float, default=300)
    ap.add_argument("--reply-timeout", type=float, default=120)
    ap.add_argument("--out", default="omni-server.json")
    args = ap.parse_args()
    pcm = speech(args.speech)
    result: dict = {"model_dir": args.model_dir, "random_weights": args.random_weights, "speech_s": len(pcm) / RATE,
                    "reply_tokens": args.reply_tokens, "frames": args.frames, "slots": args.slots,
                    "cache_tokens": args.cache_tokens, "lookahead": args.lookahead, "pace_ms": args.pace_ms, "host": platform.node(), "levels": []}
    proc = start_server(args)
    try:
        result["load_s"] = wait_ready(args.port, proc, args.load_timeout)
        print(f"server ready after {result['load_s']:.0f} s", flush=True)
        # the engine's measured real-time capacity (admission auto/on), as the gauge gives it
        result["realtime_capacity"] = {k: v for k, v in engine_counters(args.port).items() if "realtime_capacity" in k}
        print(f"real-time capacity: {result['realtime_capacity']}", flush=True)
        asyncio.run(run_level(args.port, 1, pcm, args.reply_timeout))  # warm-up: first reply of the process
        for spec in args.sessions:
            n, _, arrive = spec.partition("@")
            level = asyncio.run(run_level(args.port, int(n), pcm, args.reply_timeout, float(arrive or 0)))
            result["levels"].append(level)
            print(json.dumps({k: v for k, v in level.items() if k not in ("clients", "engine")}), flush=True)
            Path(args.out).write_text(json.dumps(result, indent=1))
    finally:
        proc.send_signal(signal.SIGTERM)  # the server stops its model worker itself
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
    Path(args.out).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
