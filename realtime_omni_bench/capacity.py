"""``realtime-omni bench capacity``: how many real-time passthrough sessions one server core holds.

N concurrent ``/v1/realtime`` sessions on the ``echo`` model (``turn_detection: null``: every
appended chunk comes straight back as a ``response.output_audio.delta``) each send 20 ms pcm16
24 kHz chunks at real-time pace for ``--seconds``. Every chunk starts with a marker (a magic
sample and its sequence number) so each echoed delta is matched to its send time:

- added latency: send → echo received, p50/p95/p99 per level;
- missing audio: chunks never echoed (%), and late ones (echo above ``--late-ms``: an underrun
  for a listener with that much jitter buffer);
- server CPU per session, from ``/proc/<server pid>/stat`` (utime + stime) over the sending window.

By default the benchmark starts its own server pinned to one core (``--server-cpus 0``) and runs
its clients on another (``--client-cpus 1``). Clients are plain ``websockets`` connections with
precomputed frames and a string scan for the delta marker: the ``openai`` SDK's per-event
parsing would saturate the client core long before the server's.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import math
import os
import random
import struct
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from . import (
    ServerProcess,
    ServerURL,
    SystemCPU,
    cpu_seconds,
    parse_cpus,
    pinned,
    sched_seconds,
)
from .report import Report, command_line, summarize, write_report

RATE = 24_000
CHUNK_MS = 20
CHUNK_SAMPLES = RATE * CHUNK_MS // 1000
MAGIC = 0x5A5A
DEFAULT_LADDER = (10, 50, 100, 200)
SAMPLE_KEEP = 4000  # raw latency samples kept per level in the JSON (uniform subsample)

# The chunk body after the 3 marker samples: a quiet 440 Hz tone. 477 samples = 954 bytes, a
# multiple of 3, so its base64 is the same string whatever marker precedes it.
_t = np.arange(3, CHUNK_SAMPLES) / RATE
_BODY = (0.05 * 32767 * np.sin(2 * np.pi * 440 * _t)).astype("<i2").tobytes()
_BODY_B64 = base64.b64encode(_BODY).decode()
_APPEND_HEAD = '{"type":"input_audio_buffer.append","audio":"'


def marker_b64(seq: int) -> str:
    return base64.b64encode(struct.pack("<hhh", MAGIC, seq // 32768, seq % 32768)).decode()


def append_message(seq: int) -> str:
    """The ``input_audio_buffer.append`` frame of chunk ``seq`` (a 20 ms pcm16 chunk)."""
    return _APPEND_HEAD + marker_b64(seq) + _BODY_B64 + '"}'


def chunk_pcm(seq: int) -> bytes:
    return struct.pack("<hhh", MAGIC, seq // 32768, seq % 32768) + _BODY


def decode_marker(delta_b64_head: str) -> int | None:
    """Sequence number from the first 8 base64 characters of an echoed delta (None: no marker)."""
    try:
        magic, hi, lo = struct.unpack("<hhh", base64.b64decode(delta_b64_head[:8]))
    except (ValueError, struct.error):
        return None
    if magic != MAGIC or hi < 0 or lo < 0:
        return None
    return hi * 32768 + lo


def _delta_head(text: str) -> str | None:
    """The start of the ``delta`` of an audio-delta event without parsing the whole JSON."""
    if "response.output_audio.delta" not in text[:160]:
        return None
    at = text.find('"delta"')
    if at < 0:
        return None
    at = text.index('"', text.index(":", at) + 1) + 1
    return text[at : at + 8]


@dataclass
class EchoClient:
    index: int
    chunks: int
    sent: np.ndarray = field(init=False)
    latency: np.ndarray = field(init=False)
    send_lag: np.ndarray = field(init=False)
    error: str | None = None
    server_errors: dict[str, int] = field(default_factory=dict)
    unmatched: int = 0
    duplicates: int = 0
    out_of_order: int = 0
    received: int = 0
    last_seq: int = -1
    done: asyncio.Event = field(default_factory=asyncio.Event)
    all_echoed: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        self.sent = np.full(self.chunks, np.nan)
        self.latency = np.full(self.chunks, np.nan)
        self.send_lag = np.full(self.chunks, np.nan)

    def on_message(self, text: str, now: float) -> None:
        head = _delta_head(text)
        if head is None:
            event = json.loads(text)
            kind = event.get("type")
            if kind == "error":
                code = (event.get("error") or {}).get("code") or "error"
                self.server_errors[code] = self.server_errors.get(code, 0) + 1
            elif kind == "response.done":
                self.done.set()
            return
        seq = decode_marker(head)
        if seq is None or seq >= self.chunks or math.isnan(self.sent[seq]):
            self.unmatched += 1
            return
        if not math.isnan(self.latency[seq]):
            self.duplicates += 1
            return
        if seq < self.last_seq:
            self.out_of_order += 1
        self.last_seq = max(self.last_seq, seq)
        self.latency[seq] = now - self.sent[seq]
        self.received += 1
        if self.received == self.chunks:
            self.all_echoed.set()


async def _run_client(client: EchoClient, url: str, model: str, t0_box: asyncio.Future[float], offset: float,
                      opened: asyncio.Semaphore, ready: asyncio.Event, counter: list[int], total: int, grace_s: float) -> None:
    from websockets.asyncio.client import connect

    perf = time.perf_counter
    try:
        async with opened:
            ws = await connect(f"{url}?model={model}", compression=None, max_size=None, ping_interval=None,
                               open_timeout=60, close_timeout=5)
            first = json.loads(await asyncio.wait_for(ws.recv(), 30))
            if first.get("type") != "session.created":
                raise RuntimeError(f"expected session.created, got {first.get('type')}: {first.get('error')}")
    except Exception as exc:  # noqa: BLE001 - counted as a failed session
        client.error = f"{type(exc).__name__}: {exc}"
        counter[0] += 1
        if counter[0] == total:
            ready.set()
        return
    counter[0] += 1
    if counter[0] == total:
        ready.set()

    async def receive() -> None:
        async for message in ws:
            client.on_message(message if isinstance(message, str) else message.decode(), perf())

    receiver = asyncio.create_task(receive())
    try:
        t0 = await t0_box
        due = t0 + offset
        sent, lag, send = client.sent, client.send_lag, ws.send
        for seq in range(client.chunks):
            delay = due - perf()
            if delay > 0:
                await asyncio.sleep(delay)
            now = perf()
            sent[seq] = now
            lag[seq] = now - due
            await send(append_message(seq))
            due += CHUNK_MS / 1000
        try:
            await asyncio.wait_for(client.all_echoed.wait(), grace_s)
        except TimeoutError:
            pass
        # end the echo response cleanly (every response.created gets its response.done)
        await ws.send('{"type":"response.cancel"}')
        try:
            await asyncio.wait_for(client.done.wait(), 5)
        except TimeoutError:
            pass
    except Exception as exc:  # noqa: BLE001
        client.error = f"{type(exc).__name__}: {exc}"
    finally:
        await ws.close()
        receiver.cancel()
        await asyncio.gather(receiver, return_exceptions=True)


async def _wait_sessions(url: ServerURL, expected: int, timeout: float) -> int | None:
    """Wait until the server reports ``expected`` live sessions; returns the last count seen."""
    deadline = time.monotonic() + timeout
    seen = None
    while time.monotonic() < deadline:
        state = await asyncio.to_thread(url.ready, 2.0)
        seen = None if state is None else state.get("sessions")
        if seen is None or seen == expected:
            return seen
        await asyncio.sleep(0.1)
    return seen


async def run_level(url: ServerURL, sessions: int, seconds: float, *, model: str = "echo", server_pid: int | None = None,
                    late_ms: float = 100.0, grace_s: float = 3.0, connect_concurrency: int = 32) -> dict[str, Any]:
    chunks = round(seconds * 1000 / CHUNK_MS)
    clients = [EchoClient(i, chunks) for i in range(sessions)]
    loop = asyncio.get_running_loop()
    t0_box: asyncio.Future[float] = loop.create_future()
    ready = asyncio.Event()
    counter = [0]
    opened = asyncio.Semaphore(connect_concurrency)
    # spread the sessions' send instants over the 20 ms period, like independent callers
    offsets = [CHUNK_MS / 1000 * i / sessions for i in range(sessions)]
    open_started = time.perf_counter()
    tasks = [
        asyncio.create_task(_run_client(c, url.realtime, model, t0_box, offsets[i], opened, ready, counter, sessions, grace_s))
        for i, c in enumerate(clients)
    ]
    await asyncio.wait_for(ready.wait(), 120 + sessions)
    open_s = time.perf_counter() - open_started
    t0 = time.perf_counter() + 0.2
    await asyncio.sleep(max(t0 - time.perf_counter(), 0))
    cpu0 = cpu_seconds(server_pid) if server_pid else None
    loop0 = sched_seconds(server_pid) if server_pid else None
    me0 = sched_seconds(os.getpid())
    client_cpu0 = time.process_time()
    machine = SystemCPU(server_pid)
    t0_box.set_result(t0)
    await asyncio.sleep(max(t0 + seconds - time.perf_counter(), 0))
    cpu1 = cpu_seconds(server_pid) if server_pid else None
    loop1 = sched_seconds(server_pid) if server_pid else None
    me1 = sched_seconds(os.getpid())
    client_cpu1 = time.process_time()
    load = machine.stop()
    window = time.perf_counter() - t0
    await asyncio.gather(*tasks)
    leftover = await _wait_sessions(url, 0, 60.0)  # let an overloaded server drain before the next level

    ok = [c for c in clients if c.error is None]
    failed = [c.error for c in clients if c.error is not None]
    sent_n = int(sum(np.count_nonzero(~np.isnan(c.sent)) for c in ok))
    lat = np.concatenate([c.latency[~np.isnan(c.latency)] for c in ok]) * 1000 if ok else np.zeros(0)
    echoed = int(lat.size)
    lag = np.concatenate([c.send_lag[~np.isnan(c.send_lag)] for c in ok]) * 1000 if ok else np.zeros(0)
    server_cpu_pct = None if cpu0 is None or cpu1 is None else 100.0 * (cpu1 - cpu0) / window
    # echoes that arrived inside the CPU window: the server's cost per chunk it actually handled,
    # which holds even when other processes share its core (the %-of-core figure does not)
    in_window = 0
    for c in ok:
        arrived = c.sent + c.latency
        in_window += int(np.count_nonzero((arrived >= t0) & (arrived <= t0 + window)))
    us_per_chunk = None if server_cpu_pct is None or not in_window else 1e6 * (cpu1 - cpu0) / in_window
    per_core = None if not us_per_chunk else int(1e6 / us_per_chunk / (1000 / CHUNK_MS))
    errors: dict[str, int] = {}
    for c in ok:
        for code, n in c.server_errors.items():
            errors[code] = errors.get(code, 0) + n
    stats = summarize(lat.tolist(), (50, 95, 99), digits=2)
    rng = random.Random(sessions)
    keep = lat.tolist() if lat.size <= SAMPLE_KEEP else rng.sample(lat.tolist(), SAMPLE_KEEP)
    per_session = []
    for c in ok:
        got = c.latency[~np.isnan(c.latency)] * 1000
        per_session.append({
            "sent": int(np.count_nonzero(~np.isnan(c.sent))), "echoed": int(got.size),
            "p50_ms": round(float(np.percentile(got, 50)), 2) if got.size else None,
            "p99_ms": round(float(np.percentile(got, 99)), 2) if got.size else None,
            "max_ms": round(float(got.max()), 2) if got.size else None,
        })
    hist_edges = [0, 1, 2, 3, 5, 7.5, 10, 15, 20, 30, 50, 75, 100, 150, 200, 300, 500, 1000, 2000, 5000, math.inf]
    hist = np.histogram(lat, bins=hist_edges)[0].tolist() if lat.size else [0] * (len(hist_edges) - 1)
    return {
        "sessions": sessions,
        "sessions_ok": len(ok),
        "sessions_failed": len(failed),
        "failures": sorted(set(failed))[:5],
        "seconds": seconds,
        "connect_s": round(open_s, 2),
        "chunks_sent": sent_n,
        "chunks_echoed": echoed,
        "missing_pct": round(100.0 * (sent_n - echoed) / sent_n, 3) if sent_n else None,
        "late_pct": round(100.0 * float(np.count_nonzero(lat > late_ms)) / sent_n, 3) if sent_n else None,
        "unmatched_deltas": sum(c.unmatched for c in ok),
        "duplicates": sum(c.duplicates for c in ok),
        "out_of_order": sum(c.out_of_order for c in ok),
        "server_errors": errors,
        "latency_ms": stats,
        "server_cpu_pct": None if server_cpu_pct is None else round(server_cpu_pct, 1),
        "server_cpu_pct_per_session": None if server_cpu_pct is None else round(server_cpu_pct / max(len(ok), 1), 3),
        # the event-loop thread: % of the window it was runnable but waiting for the CPU (starved)
        "server_loop_runqueue_wait_pct": None if loop0 is None or loop1 is None else round(100.0 * (loop1[1] - loop0[1]) / window, 1),
        "client_loop_runqueue_wait_pct": None if me0 is None or me1 is None else round(100.0 * (me1[1] - me0[1]) / window, 1),
        "server_cpu_us_per_chunk": None if us_per_chunk is None else round(us_per_chunk, 1),
        "projected_sessions_per_core": per_core,
        "client_cpu_pct": round(100.0 * (client_cpu1 - client_cpu0) / window, 1),
        "client_send_lag_ms": summarize(lag.tolist(), (50, 99), digits=2),
        "sessions_left_after_close": leftover,
        "machine_load": load,
        "latency_histogram": {"edges_ms": [e if math.isfinite(e) else None for e in hist_edges], "counts": hist},
        "latency_samples_ms": [round(v, 3) for v in keep],
        "per_session": per_session,
    }


def _plot(levels: list[dict[str, Any]]):  # type: ignore[no-untyped-def]
    def draw(fig) -> None:  # type: ignore[no-untyped-def]
        ax1, ax2, ax3 = fig.subplots(1, 3)
        xs = [lv["sessions"] for lv in levels]
        for key, style in (("p50", "o-"), ("p95", "s--"), ("p99", "^:")):
            ax1.plot(xs, [lv["latency_ms"][key] for lv in levels], style, label=key)
        ax1.set_xlabel("concurrent sessions")
        ax1.set_ylabel("added latency, send → echo (ms)")
        ax1.set_yscale("log")
        ax1.grid(True, which="both", alpha=0.3)
        ax1.legend()
        ax1.set_title("echo latency")
        for lv in levels:
            data = np.sort(np.asarray(lv["latency_samples_ms"]))
            if data.size:
                ax2.plot(data, np.linspace(0, 1, data.size), label=f"{lv['sessions']} sessions")
        ax2.set_xscale("log")
        ax2.set_xlabel("added latency (ms)")
        ax2.set_ylabel("fraction of chunks")
        ax2.grid(True, which="both", alpha=0.3)
        ax2.legend(fontsize=7)
        ax2.set_title("latency CDF")
        cpu = [lv["server_cpu_pct"] for lv in levels]
        if all(c is not None for c in cpu):
            ax3.plot(xs, cpu, "o-", color="tab:red", label="server CPU (% of one core)")
        ax3.plot(xs, [lv["missing_pct"] or 0 for lv in levels], "s--", color="tab:purple", label="missing audio (%)")
        ax3.plot(xs, [lv["late_pct"] or 0 for lv in levels], "^:", color="tab:orange", label="late chunks (%)")
        ax3.plot(xs, [lv["client_cpu_pct"] for lv in levels], "x-", color="tab:gray", label="client CPU (% of one core)")
        starved = [lv.get("server_loop_runqueue_wait_pct") for lv in levels]
        if all(v is not None for v in starved):
            ax3.plot(xs, starved, "d-.", color="black", label="server loop starved (% of time)")
        ax3.set_xlabel("concurrent sessions")
        ax3.set_ylabel("%")
        ax3.grid(True, alpha=0.3)
        ax3.legend(fontsize=7)
        ax3.set_title("load")

    return draw


def run(
    sessions: list[int] | None = None,
    seconds: float = 20.0,
    *,
    url: str | None = None,
    out: str | Path = "docs/benchmarks",
    name: str = "capacity",
    model: str = "echo",
    server_cpus: str | None = "0",
    client_cpus: str | None = "1",
    server_pid: int | None = None,
    late_ms: float = 100.0,
    command: str | None = None,
    title: str | None = None,
    log=print,  # type: ignore[no-untyped-def]
) -> tuple[Report, dict[str, Path]]:
    ladder = list(sessions or DEFAULT_LADDER)
    started = time.monotonic()
    server: ServerProcess | None = None
    server_cmd = None
    pin_server = parse_cpus(server_cpus) if url is None else None
    pin_client = parse_cpus(client_cpus)
    if pin_server is not None and pin_client is not None and pin_server & pin_client:
        pin_client = None  # overlapping sets: do not pin the clients
    if url is None:
        server = ServerProcess(models=(model,), cpus=pin_server, max_sessions=max(10_000, 2 * max(ladder)))
        target = server.start()
        log(f"server: {' '.join(server.argv)}")
        server_pid = server.pid
        server_cmd = server.argv
    else:
        target = ServerURL.parse(url)
        if target.ready() is None:
            raise RuntimeError(f"no server answering {target.http}/ready")
    server_ready = target.ready()  # what the server says of itself (models, workers)
    levels: list[dict[str, Any]] = []
    try:
        with pinned(pin_client):
            try:
                import uvloop

                loop_factory = uvloop.new_event_loop
                loop_name = "uvloop"
            except ImportError:  # pragma: no cover
                loop_factory, loop_name = None, "asyncio"
            with asyncio.Runner(loop_factory=loop_factory) as runner:
                for n in ladder:
                    log(f"capacity: {n} sessions × {seconds:g} s ...")
                    level = runner.run(run_level(target, n, seconds, model=model, server_pid=server_pid, late_ms=late_ms))
                    lat = level["latency_ms"]
                    log(f"  p50 {lat['p50']} ms  p99 {lat['p99']} ms  missing {level['missing_pct']}%  late {level['late_pct']}%  "
                        f"server CPU {level['server_cpu_pct']}%  client CPU {level['client_cpu_pct']}%  failed {level['sessions_failed']}")
                    levels.append(level)
    finally:
        if server is not None:
            server.stop()

    columns = ["sessions", "ok", "p50 ms", "p95 ms", "p99 ms", "max ms", "missing %", f"late >{late_ms:g} ms %",
               "server CPU % (1 core)", "CPU %/session", "server µs/chunk", "→ sessions/core", "server loop starved %",
               "client CPU %", "client loop starved %", "client send lag p99 ms", "other procs (cores)"]
    rows = [[
        lv["sessions"], lv["sessions_ok"], lv["latency_ms"]["p50"], lv["latency_ms"]["p95"], lv["latency_ms"]["p99"],
        lv["latency_ms"]["max"], lv["missing_pct"], lv["late_pct"], lv["server_cpu_pct"], lv["server_cpu_pct_per_session"],
        lv["server_cpu_us_per_chunk"], lv["projected_sessions_per_core"], lv["server_loop_runqueue_wait_pct"], lv["client_cpu_pct"], lv["client_loop_runqueue_wait_pct"], lv["client_send_lag_ms"]["p99"], lv["machine_load"].get("other_processes_cores"),
    ] for lv in levels]
    healthy = [lv for lv in levels if lv["sessions_failed"] == 0 and (lv["missing_pct"] or 0) == 0
               and (lv["late_pct"] or 0) < 1.0]
    best = max((lv["sessions"] for lv in healthy), default=0)
    top = levels[-1] if levels else None
    headline = f"{best} of {max(ladder)} sessions clean (no missing audio, <1% late chunks)"
    if top is not None and top["latency_ms"]["p50"] is not None:
        headline += f"; at {top['sessions']}: p50 {top['latency_ms']['p50']:.1f} ms, p99 {top['latency_ms']['p99']:.1f} ms, missing {top['missing_pct']}%"
    if top is not None and top.get("server_cpu_us_per_chunk"):
        headline += (f"; server cost {top['server_cpu_us_per_chunk']:.0f} µs CPU per 20 ms chunk "
                     f"(≈{top['projected_sessions_per_core']} sessions per dedicated core)")
    others = [lv["machine_load"].get("other_processes_cores") for lv in levels]
    others = [o for o in others if o is not None]
    if others and max(others) > 0.5:
        headline += f"; machine shared: other processes used {min(others):.1f}–{max(others):.1f} of its cores"
    notes = [
        "Latency is added latency: client send of a 20 ms chunk → its echo received (loopback), no playout buffer.",
        f"Missing: chunks sent but never echoed within 3 s after the last send. Late: echoed more than {late_ms:g} ms after sending.",
        ("Server CPU: utime+stime of the server process from /proc over the sending window; 100% = one core saturated. "
         "µs/chunk: that CPU time divided by the chunks echoed inside the window (one append in, one delta out); "
         "→ sessions/core: how many 50-chunk/s sessions that cost fits in one whole core (a projection, which holds "
         "when other processes take part of the server's core). Server loop starved: the share of the window the "
         "server's event-loop thread was runnable but waiting for a CPU (/proc/<pid>/schedstat), i.e. CPU taken by "
         "other processes; latency at such levels measures the machine, not the server."),
    ]
    if pin_server is not None:
        notes.append(f"Server pinned to CPU(s) {sorted(pin_server)}; clients pinned to {sorted(pin_client) if pin_client else 'any CPU'}.")
    saturated = [lv["sessions"] for lv in levels if lv["client_cpu_pct"] > 90]
    if saturated:
        notes.append(f"The client core was above 90% at {saturated} sessions: latency there includes client-side queueing.")
    busy = [(lv["sessions"], lv["machine_load"].get("other_processes_cores")) for lv in levels]
    busy = [(n, c) for n, c in busy if c is not None and c > 0.2]
    if busy:
        notes.append("Other processes on this machine used CPU during the run (cores, by level): "
                     + ", ".join(f"{n}: {c:.2f}" for n, c in busy) + "; numbers at those levels may be disturbed.")
    cmd = command or command_line()
    report = Report(
        name=name,
        benchmark="capacity",
        title=title or f"Capacity: concurrent real-time {model} sessions over /v1/realtime",
        command=cmd,
        config={
            "ladder": ladder, "seconds": seconds, "chunk_ms": CHUNK_MS, "rate": RATE, "format": "audio/pcm (pcm16)",
            "model": model, "url": url, "server_command": server_cmd, "server_ready": server_ready, "server_cpus": sorted(pin_server) if pin_server else None,
            "client_cpus": sorted(pin_client) if pin_client else None, "late_ms": late_ms, "client": f"websockets ({loop_name})",
        },
        summary={"max_healthy_sessions": best, "levels": [{k: v for k, v in lv.items() if k not in (
            "latency_samples_ms", "per_session", "latency_histogram")} for lv in levels]},
        samples={"levels": [{"sessions": lv["sessions"], "latency_samples_ms": lv["latency_samples_ms"],
                             "latency_histogram": lv["latency_histogram"], "per_session": lv["per_session"]} for lv in levels]},
        columns=columns,
        rows=rows,
        headline=headline,
        notes=notes,
        plot=_plot(levels),
        reproduce=[cmd],
    )
    report.duration_s = time.monotonic() - started
    paths = write_report(report, out)
    return report, paths


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sessions", default=",".join(str(n) for n in DEFAULT_LADDER),
                        help="comma-separated ladder of concurrent sessions (default: %(default)s)")
    parser.add_argument("--seconds", type=float, default=20.0, help="seconds of audio per level (default: %(default)s)")
    parser.add_argument("--model", default="echo", help="model to open (default: %(default)s; must echo)")
    parser.add_argument("--client-cpus", default="1", help="CPUs for the client processes ('none': no pinning; default: %(default)s)")
    parser.add_argument("--server-pid", type=int, help="with --url: the server's pid, to report its CPU use")
    parser.add_argument("--late-ms", type=float, default=100.0, help="an echo later than this counts as late (default: %(default)s)")


def main(args: argparse.Namespace) -> int:
    ladder = [int(x) for x in str(args.sessions).split(",") if x.strip()]
    run(ladder, args.seconds, url=args.url, out=args.out, name=args.name or "capacity", model=args.model,
        server_cpus=args.server_cpus, client_cpus=args.client_cpus, server_pid=args.server_pid, late_ms=args.late_ms)
    return 0
