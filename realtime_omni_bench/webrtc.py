"""``realtime-omni bench webrtc``: WebRTC calls (``/v1/realtime/calls``) at real time.

Two parts, both with real aiortc clients over loopback (host candidates on 127.0.0.1):

- **capacity** (``echo`` model, ``turn_detection: null``): N concurrent calls each send a 60 ms
  tone burst every 500 ms on their microphone track and detect its echo on the server's track.
  Added latency = echo onset on the client's received track − burst onset on its sent track
  (the whole round trip: client Opus encode, server jitter buffer + decode, 48→24 kHz, session,
  outgoing track pacing, encode, client jitter buffer + decode). Missing audio = bursts never
  echoed; underruns = 20 ms silences the server's tracks had to insert (``GET /v1/realtime/calls``).
  Server CPU per session from ``/proc/<pid>/stat`` with the server pinned to one core.
- **first audio** (``--turns``, default model ``embedded``): spoken questions (Piper) on the
  track; per turn, ``input_audio_buffer.speech_stopped`` → first audible assistant frame on the
  client's track, ``output_audio_buffer.started`` → that frame (the transport's share), and the
  barge-in stop time: first voiced frame of the user talking over the reply → last audible
  frame of the reply.

aiortc's receive jitter buffer waits for 4 packets (80 ms) before it decodes the first frame; the
bench runs the server with 0 (``REALTIME_OMNI_WEBRTC_JITTER_PREFETCH``: each packet decoded on
arrival, ``--server-prefetch``, the server's default) and its clients with 1 (``--client-prefetch``),
so the numbers show what the server adds rather than a playout buffer. With ``--loss``, give the
clients 0 too: after a lost packet aiortc's buffer holds on to about 300 ms of audio.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np

from . import ServerProcess, ServerURL, SystemCPU, cpu_seconds, parse_cpus, pinned
from .report import Report, command_line, summarize, write_report

RATE = 48_000
FRAME = 960
PERIOD_FRAMES = 25  # a burst every 500 ms
BURST_FRAMES = 3  # 60 ms of tone
THRESHOLD = 2000  # |sample| that counts as the burst's onset
DEFAULT_LADDER = (1, 10, 25, 40)
_TONE = (np.sin(2 * np.pi * 1000 * np.arange(BURST_FRAMES * FRAME) / RATE) * 12000).astype(np.int16)
NO_VAD = {"type": "realtime", "audio": {"input": {"turn_detection": None}}}


def _http_json(url: str, timeout: float = 5.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310 - local URL
        return json.loads(resp.read())


# ------------------------------------------------------------------------------ capacity
class BurstProbe:
    """Sent and received burst onsets of one call."""

    def __init__(self) -> None:
        self.sent: list[float] = []
        self.received: list[float] = []
        self.client_skipped = 0  # frames the client was too late to send (its process stalled)
        self._in_burst = False
        self._last_rx = 0.0
        self.gaps = 0  # received-frame gaps > 60 ms (the client's playout would stall)

    def make_frame(self, index: int) -> np.ndarray:
        phase = index % PERIOD_FRAMES
        if phase < BURST_FRAMES:
            return _TONE[phase * FRAME : (phase + 1) * FRAME]
        return np.zeros(FRAME, dtype=np.int16)

    def on_sent(self, index: int, at: float, samples: np.ndarray) -> None:
        if index % PERIOD_FRAMES == 0:
            self.sent.append(at)

    def on_received(self, at: float, pcm: np.ndarray) -> None:
        if self._last_rx and at - self._last_rx > 0.06:
            self.gaps += 1
        self._last_rx = at
        loud = np.flatnonzero(np.abs(pcm) > THRESHOLD)
        if loud.size and not self._in_burst:
            self._in_burst = True
            # a listener hears a packet from its arrival: the onset at its offset in the packet,
            # dated back by one 20 ms frame (the convention of every report here, for 20 ms
            # packets: the time the onset would have left a sender pacing 20 ms frames). A 40 ms
            # packet's onset then counts the 20 ms more it waited to be sent whole.
            self.received.append(at + (loud[0] - FRAME) / RATE)
        elif not loud.size:
            self._in_burst = False

    def latencies(self, t_from: float, t_to: float) -> tuple[list[float], int, int]:
        """(latencies in ms, bursts sent in the window, bursts matched)."""
        sent = [s for s in self.sent if t_from <= s <= t_to]
        out: list[float] = []
        j = 0
        received = sorted(self.received)
        for s in sent:
            while j < len(received) and received[j] < s:
                j += 1
            if j < len(received) and received[j] - s < PERIOD_FRAMES * FRAME / RATE:
                out.append(1000 * (received[j] - s))
                j += 1
        return out, len(sent), len(out)


def impair(client: Any, loss: float, seed: int, jitter_ms: float = 0.0) -> None:
    """A poor network at the client, in both directions, without root or a network namespace:
    drop a share ``loss`` (0..1) of the call's RTP packets, and delay each one by a uniform
    0..``jitter_ms`` (so packets also arrive out of order). Outgoing packets are impaired before
    they reach the socket, incoming ones before the client's jitter buffer. RTCP passes as is."""
    import random

    from aiortc.rtp import is_rtcp

    if loss <= 0 and jitter_ms <= 0:
        return
    rng = random.Random(seed)
    transport = client.pc.getSenders()[0].transport
    send_rtp, handle_rtp = transport._send_rtp, transport._handle_rtp_data
    late: set[asyncio.Task[None]] = set()

    async def later(coro: Any) -> None:
        await asyncio.sleep(rng.uniform(0.0, jitter_ms) / 1000.0)
        await coro

    async def deliver(coro: Any) -> None:
        if jitter_ms <= 0:
            await coro
            return
        task = asyncio.create_task(later(coro))  # the caller goes on: packets overtake each other
        late.add(task)
        task.add_done_callback(late.discard)

    async def send(data: bytes) -> None:
        if is_rtcp(data):
            await send_rtp(data)
        elif rng.random() >= loss:
            await deliver(send_rtp(data))

    async def handle(data: bytes, arrival_time_ms: int) -> None:
        if rng.random() >= loss:
            await deliver(handle_rtp(data, arrival_time_ms))

    transport._send_rtp, transport._handle_rtp_data = send, handle


async def _open_call(url: ServerURL, probe: BurstProbe, prefetch: int | None, loss: float = 0.0,
                     seed: int = 0, jitter_ms: float = 0.0) -> Any:
    from .webrtc_client import PcmSource, WebRTCClient

    client = WebRTCClient(url.http, model="echo", session=NO_VAD, jitter_prefetch=prefetch, keep_audio_s=0.1,
                          on_frame_sent=probe.on_sent, on_frame_received=probe.on_received)

    class Source(PcmSource):
        async def recv(self):  # type: ignore[no-untyped-def]
            probe.client_skipped += self.catch_up()
            self.play(probe.make_frame(self._index))
            return await super().recv()

    client.source = Source(probe.on_sent)
    await client.connect(timeout=30)
    impair(client, loss, seed, jitter_ms)
    return client


async def run_level(url: ServerURL, sessions: int, seconds: float, *, server_pid: int | None, prefetch: int | None,
                    connect_concurrency: int = 4, loss: float = 0.0, jitter_ms: float = 0.0,
                    log=print) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    probes = [BurstProbe() for _ in range(sessions)]
    clients: list[Any] = []
    failures: list[str] = []
    gate = asyncio.Semaphore(connect_concurrency)
    started = time.perf_counter()

    async def open_one(probe: BurstProbe) -> None:
        async with gate:
            try:
                clients.append(await _open_call(url, probe, prefetch, loss, seed=len(clients) + 1,
                                                jitter_ms=jitter_ms))
            except Exception as exc:  # noqa: BLE001 - counted
                failures.append(f"{type(exc).__name__}: {exc}")

    await asyncio.gather(*(open_one(p) for p in probes))
    connect_s = time.perf_counter() - started
    await asyncio.sleep(1.5)  # warm-up: every call is sending and echoing
    t0 = time.monotonic()
    skipped0 = sum(p.client_skipped for p in probes)
    cpu0 = cpu_seconds(server_pid) if server_pid else None
    client_cpu0 = time.process_time()
    machine = SystemCPU(server_pid)
    await asyncio.sleep(seconds)
    t1 = time.monotonic()
    skipped = sum(p.client_skipped for p in probes) - skipped0
    cpu1 = cpu_seconds(server_pid) if server_pid else None
    client_cpu1 = time.process_time()
    load = machine.stop()
    await asyncio.sleep(1.0)  # the last bursts' echoes
    try:
        calls = (await asyncio.to_thread(_http_json, f"{url.http}/v1/realtime/calls"))["data"]
    except Exception:  # noqa: BLE001
        calls = []
    await asyncio.gather(*(c.close() for c in clients), return_exceptions=True)
    lat: list[float] = []
    sent = matched = gaps = 0
    ok = [p for p, _ in zip(probes, clients)]
    per_call_missing = []
    for probe in probes:
        values, n_sent, n_matched = probe.latencies(t0, t1 - 0.6)
        lat += values
        sent += n_sent
        matched += n_matched
        gaps += probe.gaps
        per_call_missing.append(n_sent - n_matched)
    window = t1 - t0
    server_pct = None if cpu0 is None or cpu1 is None else 100.0 * (cpu1 - cpu0) / window
    underruns = sum(c.get("underruns", 0) for c in calls)
    out_frames = sum(c.get("audio_out_frames", 0) for c in calls)
    deadline = time.monotonic() + 15
    left = None
    while time.monotonic() < deadline:
        left = len((await asyncio.to_thread(_http_json, f"{url.http}/v1/realtime/calls"))["data"])
        if left == 0:
            break
        await asyncio.sleep(0.2)
    return {
        "sessions": sessions,
        "loss_pct": round(100.0 * loss, 2),
        "jitter_ms": jitter_ms,
        "sessions_ok": len(clients),
        "sessions_failed": len(failures),
        "failures": sorted(set(failures))[:5],
        "connect_s": round(connect_s, 2),
        "seconds": seconds,
        "bursts_sent": sent,
        "bursts_echoed": matched,
        "missing_pct": round(100.0 * (sent - matched) / sent, 3) if sent else None,
        "latency_ms": summarize(lat, (50, 95, 99), digits=1),
        "underruns": underruns,
        "underrun_pct": round(100.0 * underruns / out_frames, 3) if out_frames else None,
        "client_rx_gaps": gaps,
        "client_frames_skipped": skipped,  # in the measured window
        # the server's packet length per call when the level ended (with "auto", by its call count)
        "packet_ms": "/".join(str(ms) for ms in sorted({c.get("audio_packet_ms") for c in calls} - {None})) or None,
        "missing_per_call": per_call_missing,
        "server_cpu_pct": None if server_pct is None else round(server_pct, 1),
        "server_cpu_pct_per_session": None if server_pct is None else round(server_pct / max(len(clients), 1), 2),
        "client_cpu_pct": round(100.0 * (client_cpu1 - client_cpu0) / window, 1),
        "calls_left_after_close": left,
        "machine_load": load,
        "latency_samples_ms": [round(v, 1) for v in lat[:4000]],
        "ok_probes": len(ok),
    }


# ------------------------------------------------------------------------------ first audio
QUESTIONS = (
    "What is the capital of France?",
    "Tell me something interesting about the ocean.",
    "How many legs does a spider have?",
    "What color is the sky on a clear day?",
    "Can you name a famous painter?",
)


def _say(texts: list[str]) -> list[np.ndarray]:
    from realtime_omni.audio.resample import resample_once
    from realtime_omni.engines.embedded.tts_piper import PiperTTS

    tts = PiperTTS(threads=1)
    out = []
    for text in texts:
        pcm = np.concatenate(list(tts.synthesize(text)))
        out.append(resample_once(pcm, tts.sample_rate, RATE))
    return out


async def run_turns(url: ServerURL, model: str, turns: int, prefetch: int | None, log=print) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    from .webrtc_client import WebRTCClient

    speech = _say([QUESTIONS[i % len(QUESTIONS)] for i in range(turns)])
    frames: list[tuple[float, float]] = []  # (arrival, rms) of received frames

    def on_rx(at: float, pcm: np.ndarray) -> None:
        frames.append((at, float(np.sqrt(np.mean(pcm.astype(np.float64) ** 2)))))

    client = WebRTCClient(url.http, model=model, jitter_prefetch=prefetch, on_frame_received=on_rx,
                          session={"type": "realtime", "audio": {"input": {"transcription": {"model": "whisper-1"}}}})
    await client.connect(timeout=30)
    results: list[dict[str, Any]] = []
    barge: list[float] = []
    try:
        await client.wait_for("session.updated", 10)
        await asyncio.sleep(0.5)
        for index in range(turns):
            mark = len(client.events)
            sent_at = time.monotonic()
            client.source.play(speech[index])
            await client.wait_for("input_audio_buffer.speech_stopped", 30, mark)
            t_stop = time.monotonic()
            await client.wait_for("output_audio_buffer.started", 30, mark)
            t_started = time.monotonic()
            first = None
            deadline = time.monotonic() + 5
            while first is None and time.monotonic() < deadline:
                first = next((at for at, level in frames if at >= t_stop and level > 300), None)
                await asyncio.sleep(0.01)
            turn = {"turn": index, "speech_s": round(len(speech[index]) / RATE, 2),
                    "speech_end_to_stopped_ms": round(1000 * (t_stop - sent_at) - 1000 * len(speech[index]) / RATE, 1),
                    "stopped_to_started_event_ms": round(1000 * (t_started - t_stop), 1),
                    "stopped_to_first_audio_ms": None if first is None else round(1000 * (first - t_stop), 1),
                    "started_event_to_audio_ms": None if first is None else round(1000 * (first - t_started), 1)}
            if index < turns - 1:
                # barge in after a second of reply: the next question talks over it
                await asyncio.sleep(1.0)
                t_barge = time.monotonic()
                client.source.play(speech[index + 1][: RATE // 2])  # only the first 0.5 s here
                try:
                    cleared = await client.wait_for("output_audio_buffer.cleared", 5, mark)
                except TimeoutError:
                    cleared = None
                await asyncio.sleep(0.4)
                loud = [at for at, level in frames if t_barge <= at and level > 300]
                if cleared is not None and loud:
                    turn["barge_in_stop_ms"] = round(1000 * (max(loud) - t_barge), 1)
                    barge.append(turn["barge_in_stop_ms"])
                client.source.clear()
                await client.wait_for("response.done", 10, mark)
                await asyncio.sleep(1.5)  # the cut-off question is its own (short) turn: let it pass
                await _quiet(client, 20)
            results.append(turn)
            log(f"  turn {index}: {turn}")
    finally:
        await client.close()
    return {
        "model": model,
        "turns": results,
        "stopped_to_first_audio_ms": summarize([t["stopped_to_first_audio_ms"] for t in results]),
        "started_event_to_audio_ms": summarize([t["started_event_to_audio_ms"] for t in results]),
        "barge_in_stop_ms": summarize(barge),
    }


async def _quiet(client: Any, timeout: float) -> None:
    """Wait until no response is active and the track has stopped playing."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        types = [e["type"] for e in client.events[-40:]]
        created = max((i for i, t in enumerate(types) if t == "response.created"), default=-1)
        done = max((i for i, t in enumerate(types) if t in ("output_audio_buffer.stopped", "output_audio_buffer.cleared")), default=-1)
        if created <= done:
            await asyncio.sleep(0.5)
            types2 = [e["type"] for e in client.events[-5:]]
            if "response.created" not in types2:
                return
        await asyncio.sleep(0.2)


# ------------------------------------------------------------------------------ CLI
def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sessions", default=",".join(map(str, DEFAULT_LADDER)),
                        help="comma-separated concurrent call counts (echo capacity; '' to skip)")
    parser.add_argument("--seconds", type=float, default=15.0, help="measured seconds per level")
    parser.add_argument("--turns", type=int, default=0, help="spoken turns for first-audio latency (0: skip)")
    parser.add_argument("--model", default="embedded", help="model of the spoken turns")
    parser.add_argument("--client-cpus", default="1", help="CPUs of the benchmark's clients")
    parser.add_argument("--client-prefetch", type=int, default=1,
                        help="the clients' aiortc jitter-buffer prefetch in frames (aiortc's default: 4; 0: on arrival)")
    parser.add_argument("--loss", default="0",
                        help="comma-separated RTP packet loss in %% (each direction, dropped in the clients), each run "
                             "at every call count (default: %(default)s)")
    parser.add_argument("--jitter-ms", type=float, default=0.0,
                        help="each RTP packet delayed by a uniform 0..this many ms, each direction (reorders them)")
    parser.add_argument("--compare", nargs="*", default=[], metavar="REPORT.json",
                        help="earlier webrtc reports drawn beside this run (read before this run writes)")
    parser.add_argument("--packet-ms", default="auto", choices=("20", "40", "60", "auto"),
                        help="audio per Opus packet the server sends (REALTIME_OMNI_WEBRTC_AUDIO_PACKET_MS; "
                             "auto: 20 ms below --busy-calls calls, 40 from there)")
    parser.add_argument("--busy-calls", type=int, default=32,
                        help="with --packet-ms auto, the calls from which packets hold 40 ms (default: %(default)s)")
    parser.add_argument("--server-prefetch", type=int, default=0,
                        help="the server's (REALTIME_OMNI_WEBRTC_JITTER_PREFETCH; 0: decode each packet on arrival)")


def main(args: argparse.Namespace) -> int:
    ladder = [int(x) for x in args.sessions.split(",") if x.strip()]
    losses = [float(x) for x in args.loss.split(",") if x.strip()] or [0.0]
    if any(not 0 <= x <= 50 for x in losses):
        raise SystemExit("--loss: each value is a percentage from 0 to 50")
    if not 0 <= args.jitter_ms <= 500:
        raise SystemExit("--jitter-ms: from 0 to 500")
    name = args.name or "webrtc"
    pin_server = parse_cpus(args.server_cpus) if args.url is None else None
    pin_client = parse_cpus(args.client_cpus)
    if pin_server and pin_client and pin_server & pin_client:
        pin_client = None
    earlier = _earlier(args.compare)  # before this run may overwrite one of them
    started = time.monotonic()
    levels: list[dict[str, Any]] = []
    turns: dict[str, Any] | None = None
    server_argv: list[str] | None = None
    env = {"REALTIME_OMNI_WEBRTC_JITTER_PREFETCH": str(args.server_prefetch), "REALTIME_OMNI_SESSION_STORE": "none",
           "REALTIME_OMNI_WEBRTC_AUDIO_PACKET_MS": args.packet_ms,
           "REALTIME_OMNI_WEBRTC_AUDIO_BUSY_CALLS": str(args.busy_calls)}
    with pinned(pin_client):
        if ladder:
            server = ServerProcess(models=("echo",), cpus=pin_server, env=env) if args.url is None else None
            target = server.start() if server else ServerURL.parse(args.url)
            server_argv = server.argv if server else None
            try:
                for loss, n in ((loss, n) for loss in losses for n in ladder):
                    print(f"webrtc capacity: {n} calls × {args.seconds:g} s, {loss:g} % packet loss ...", flush=True)
                    level = asyncio.run(run_level(target, n, args.seconds, server_pid=server.pid if server else None,
                                                  prefetch=args.client_prefetch, loss=loss / 100,
                                                  jitter_ms=args.jitter_ms))
                    lat = level["latency_ms"]
                    print(f"  p50 {lat['p50']} ms  p99 {lat['p99']} ms  missing {level['missing_pct']}%  underruns "
                          f"{level['underrun_pct']}%  server CPU {level['server_cpu_pct']}% "
                          f"({level['server_cpu_pct_per_session']}%/call)  client CPU {level['client_cpu_pct']}%  "
                          f"failed {level['sessions_failed']}", flush=True)
                    levels.append(level)
            finally:
                if server:
                    server.stop()
        if args.turns > 0:
            server = ServerProcess(models=(args.model,), cpus=None, env=env) if args.url is None else None
            target = server.start() if server else ServerURL.parse(args.url)
            try:
                print(f"webrtc first audio: {args.turns} spoken turns on {args.model} ...", flush=True)
                turns = asyncio.run(run_turns(target, args.model, args.turns, args.client_prefetch))
            finally:
                if server:
                    server.stop()

    columns = ["calls", "packet ms", "loss %", "ok", "client rx gaps", "client frames skipped", "p50 ms", "p95 ms", "p99 ms", "missing %", "underruns %", "server CPU % (1 core)",
               "CPU %/call", "client CPU %", "other procs (cores)"]
    rows = [[lv["sessions"], lv["packet_ms"], lv["loss_pct"], lv["sessions_ok"], lv["client_rx_gaps"], lv["client_frames_skipped"], lv["latency_ms"]["p50"], lv["latency_ms"]["p95"], lv["latency_ms"]["p99"],
             lv["missing_pct"], lv["underrun_pct"], lv["server_cpu_pct"], lv["server_cpu_pct_per_session"],
             lv["client_cpu_pct"], lv["machine_load"].get("other_processes_cores")] for lv in levels]
    healthy = [lv for lv in levels if lv["sessions_failed"] == 0 and (lv["missing_pct"] or 0) < 0.5 and not lv["loss_pct"]]
    best = max((lv["sessions"] for lv in healthy), default=0)
    headline = f"{best} WebRTC echo calls at real time"
    if levels:
        top = max(healthy or levels, key=lambda lv: lv["sessions"])
        headline += (f"; at {top['sessions']}: round trip p50 {top['latency_ms']['p50']} ms, p99 {top['latency_ms']['p99']} ms, "
                     f"{top['server_cpu_pct_per_session']}% of a core per call")
    impaired = [lv for lv in levels if lv["loss_pct"] or lv["jitter_ms"]]
    if impaired:  # a run on a poor network: how the worst level fared, not a capacity claim
        worst = max(impaired, key=lambda lv: (lv["latency_ms"]["p99"] or 0))
        network = f"RTP loss {', '.join(f'{x:g}' for x in losses)} %" + (
            f", jitter 0–{args.jitter_ms:g} ms" if args.jitter_ms else "")
        headline = (f"Poor network ({network}, each way): {sum(lv['sessions_failed'] for lv in levels)} calls failed; "
                    f"worst level {worst['sessions']} "
                    f"calls at {worst['loss_pct']:g} % loss: round trip p50 {worst['latency_ms']['p50']} ms, p99 "
                    f"{worst['latency_ms']['p99']} ms, {worst['missing_pct']} % of bursts never echoed")
    if turns:
        headline += f"; first audio after speech_stopped p50 {turns['stopped_to_first_audio_ms']['p50']} ms"
    sections = []
    if turns:
        sections.append(("First audio over WebRTC (" + turns["model"] + ")", "```\n" + json.dumps(
            {k: turns[k] for k in ("stopped_to_first_audio_ms", "started_event_to_audio_ms", "barge_in_stop_ms")}, indent=1)
            + "\n```"))
    report = Report(
        name=name, benchmark="webrtc", title="WebRTC calls: round-trip latency, capacity, first audio",
        command=command_line(), config={"ladder": ladder, "loss_pct": losses, "jitter_ms": args.jitter_ms,
                                        "seconds": args.seconds, "client_prefetch": args.client_prefetch,
                                        "server_prefetch": args.server_prefetch, "server_cpus": args.server_cpus,
                                        "packet_ms": args.packet_ms, "busy_calls": args.busy_calls,
                                        "client_cpus": args.client_cpus, "server": server_argv},
        summary={"levels": [{k: v for k, v in lv.items() if k != "latency_samples_ms"} for lv in levels], "turns": turns},
        samples={"latency_ms": {_level_key(lv): lv["latency_samples_ms"] for lv in levels}},
        columns=columns, rows=rows, headline=headline, sections=sections,
        notes=["Round trip = burst onset sent on the client's track → its echo's onset on the client's received track: "
               "both directions of Opus/RTP, both jitter buffers, the session and the paced outgoing track.",
               "With packet loss: that share of RTP packets is dropped in each direction inside the clients (before "
               "sending, before their jitter buffer); with jitter (`--jitter-ms`), each packet is delayed by a uniform "
               "0..jitter ms there too, so they also arrive out of order. Client rx gaps counts received-audio gaps "
               "over 60 ms.",
               "The clients run in one process on their own core; when its CPU nears 100 % the latency it reports grows "
               "with its own lag.",
               f"The server is pinned to CPU(s) {args.server_cpus}: the spoken turns' ASR, LLM and TTS share that one core "
               "(the WebSocket latency benchmark runs its server on both cores)."],
        plot=_plot(levels, earlier) if levels else None,
    )
    report.duration_s = time.monotonic() - started
    paths = write_report(report, Path(args.out))
    print(f"report: {', '.join(str(p) for p in paths.values())}")
    return 0


def _level_key(level: dict[str, Any]) -> str:
    return str(level["sessions"]) if not level.get("loss_pct") else f"{level['sessions']}@{level['loss_pct']:g}%"


#: FastRTC's echo calls, measured on this machine with this harness before issue 16 (25 calls:
#: 3–5 % of a core each, round trip p50 122 ms): drawn as a reference point
FASTRTC_25 = {"calls": 25, "p50_ms": 122.0, "cpu_pct_per_call": 4.0}


def _earlier(paths: list[str]) -> list[dict[str, Any]]:
    """Earlier webrtc reports to draw beside this run: label, calls, p50 and CPU per call."""
    out = []
    for path in paths:
        data = json.loads(Path(path).read_text())
        levels = [lv for lv in data["summary"]["levels"] if not lv.get("loss_pct")]
        commit = (data.get("git") or {}).get("commit") or "?"
        label = f"{Path(path).stem} ({str(commit)[:7]}, {data['config'].get('packet_ms', 20)} ms packets)"
        out.append({"label": label, "calls": [lv["sessions"] for lv in levels],
                    "p50": [lv["latency_ms"]["p50"] for lv in levels],
                    "cpu": [lv["server_cpu_pct_per_session"] or 0 for lv in levels]})
    return out


def _plot(levels: list[dict[str, Any]], earlier: list[dict[str, Any]]):  # type: ignore[no-untyped-def]
    """Latency and costs against the call count, one line per packet-loss setting; earlier
    reports and FastRTC's point in gray beside them."""
    by_loss: dict[float, list[dict[str, Any]]] = {}
    for lv in levels:
        by_loss.setdefault(lv.get("loss_pct") or 0.0, []).append(lv)

    def draw(fig) -> None:  # type: ignore[no-untyped-def]
        ax1, ax2, ax3 = fig.subplots(1, 3)
        for loss, group in by_loss.items():
            xs = [lv["sessions"] for lv in group]
            tag = f" ({loss:g} % loss)" if len(by_loss) > 1 else ""
            for key, style in (("p50", "o-"), ("p95", "s--"), ("p99", "^:")):
                ax1.plot(xs, [lv["latency_ms"][key] for lv in group], style, label=key + tag)
            if not loss:
                ax2.plot(xs, [lv["server_cpu_pct"] or 0 for lv in group], "o-", color="tab:red",
                         label="server CPU (% of one core)")
                ax2.plot(xs, [lv["client_cpu_pct"] for lv in group], "x-", color="tab:gray",
                         label="client CPU (% of one core)")
            ax2.plot(xs, [lv["missing_pct"] or 0 for lv in group], "s--", label="missing bursts (%)" + tag)
        for old, style in zip(earlier, ("--", ":", "-.")):
            ax1.plot(old["calls"], old["p50"], "x" + style, color="tab:gray", label="p50, " + old["label"])
            ax3.plot(old["calls"], old["cpu"], "x" + style, color="tab:gray", label=old["label"])
        if not by_loss or 0.0 in by_loss:
            ax1.plot([FASTRTC_25["calls"]], [FASTRTC_25["p50_ms"]], "D", color="black", label="FastRTC p50 (25 calls)")
            ax3.plot([FASTRTC_25["calls"]], [FASTRTC_25["cpu_pct_per_call"]], "D", color="black", label="FastRTC (25 calls)")
            current = by_loss.get(0.0, [])
            ax3.plot([lv["sessions"] for lv in current], [lv["server_cpu_pct_per_session"] or 0 for lv in current],
                     "o-", color="tab:red", label="this run")
        ax3.axhline(1.3, color="tab:green", lw=0.8, ls=":", label="target (75 calls on one core)")
        ax3.set_xlabel("concurrent WebRTC calls")
        ax3.set_ylabel("server CPU per call (% of one core)")
        ax3.set_ylim(bottom=0)
        ax3.grid(True, alpha=0.3)
        ax3.legend(fontsize=7)
        ax1.set_xlabel("concurrent WebRTC calls")
        ax1.set_ylabel("round trip through the server (ms)")
        ax1.grid(True, alpha=0.3)
        ax1.legend(fontsize=7)
        ax2.set_xlabel("concurrent WebRTC calls")
        ax2.grid(True, alpha=0.3)
        ax2.legend(fontsize=7)

    return draw
