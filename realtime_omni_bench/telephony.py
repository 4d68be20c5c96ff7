"""``realtime-omni bench telephony``: first audio over the Twilio Media Streams bridge.

A simulated carrier (:class:`SimulatedCarrier`) plays Twilio's part on
``/v1/telephony/twilio/stream``: ``connected`` + ``start``, then the caller's audio as 20 ms
μ-law ``media`` frames at real-time pace (silence between utterances, as a phone line does). It
plays the server's ``media`` back at real-time pace, echoes each ``mark`` when the audio before
it has played, and honours ``clear`` the way Twilio does (drops its queue, echoes the marks
still in it at once).

Per spoken turn (questions synthesized by the embedded Piper voice, resampled to 8 kHz, μ-law):

- ``first_audio_ms``: end of the caller's speech (last speech frame sent) → first ``media`` frame
  of the reply received;
- ``eot_ms``: end of speech → the server's end-of-turn decision
  (``input_audio_buffer.speech_stopped``, seen through the bridge's call hook; only when the
  benchmark starts the server itself, in-process, since Twilio's wire carries no JSON events);
- ``after_eot_ms``: end-of-turn decision → first ``media`` frame;
- ``clear_ms`` (one per call, ``--barge-in``): first frame of speech over a playing reply →
  ``clear`` received.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import collections
import contextlib
import itertools
import json
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from realtime_omni.audio import g711
from realtime_omni.audio.resample import resample_once

from .report import Report, command_line, summarize, write_report

FRAME_BYTES = 160
FRAME_S = 0.020
SILENCE_FRAME = b"\xff" * FRAME_BYTES
STREAM_PATH = "/v1/telephony/twilio/stream"

QUESTIONS = (
    "What is the capital of France?",
    "How many days are there in a week?",
    "What color is the sky on a clear day?",
    "Can you tell me a fun fact about cats?",
    "What is two plus two?",
    "What should I cook for dinner tonight?",
    "What is the tallest mountain in the world?",
    "How do plants make their food?",
    "What time of year is best for skiing?",
    "Why is the ocean salty?",
)
LONG_QUESTION = "Please tell me a long story about a dragon who lives in the mountains."
INTERRUPTION = "Stop, stop. Wait a moment please."
INSTRUCTIONS = "You are a friendly phone assistant. Answer in one or two short sentences."


# ------------------------------------------------------------------------------ audio helpers
def trim_silence(pcm: np.ndarray, threshold: int = 500) -> np.ndarray:
    """Cut leading/trailing near-silence (so "end of speech" is the last audible sample)."""
    loud = np.flatnonzero(np.abs(pcm.astype(np.int32)) > threshold)
    return pcm[loud[0] : loud[-1] + 1] if len(loud) else pcm[:0]


def to_ulaw8k(pcm: np.ndarray, rate: int) -> bytes:
    """int16 audio at ``rate`` → 8 kHz μ-law bytes (what a phone line carries)."""
    return g711.ulaw_encode(resample_once(pcm, rate, 8_000))


def from_ulaw8k(ulaw: bytes) -> np.ndarray:
    return g711.ulaw_decode(ulaw)


# ------------------------------------------------------------------------------ the carrier
class SimulatedCarrier:
    """Twilio's side of one bidirectional Media Stream, at real-time pace (see the module doc)."""

    def __init__(
        self,
        url: str,
        *,
        custom_parameters: dict[str, str] | None = None,
        echo_marks: bool = True,
        send_start: bool = True,
    ) -> None:
        self.url = url
        self.custom_parameters = dict(custom_parameters or {})
        self.echo_marks = echo_marks
        self.send_start = send_start
        self.stream_sid = "MZ" + uuid.uuid4().hex
        self.call_sid = "CA" + uuid.uuid4().hex
        #: (arrival time, μ-law payload) of every media frame received
        self.received: list[tuple[float, bytes]] = []
        #: (time its playout ended, μ-law payload) of every frame the "phone" played
        self.played: list[tuple[float, bytes]] = []
        self.payload_sizes: collections.Counter[int] = collections.Counter()
        self.stream_sids: set[str] = set()
        self.clears: list[float] = []
        self.marks_received: list[tuple[float, str]] = []
        self.marks_echoed: list[tuple[float, str]] = []
        self.other: list[dict[str, Any]] = []
        self.closed = asyncio.Event()
        self._mic: collections.deque[tuple[bytes, asyncio.Future[float] | None]] = collections.deque()
        self._queue: collections.deque[tuple[str, Any]] = collections.deque()
        self._wake = asyncio.Event()
        self._seq = itertools.count(1)
        self._chunk = itertools.count(1)
        self._tasks: list[asyncio.Task[None]] = []
        self._ws: Any = None
        self.media_paused = False

    # -- lifecycle ----------------------------------------------------------------------
    async def connect(self, sender: bool = True) -> "SimulatedCarrier":
        from websockets.asyncio.client import connect

        self._ws = await connect(self.url, max_size=2**22, ping_interval=None)
        await self.send({"event": "connected", "protocol": "Call", "version": "1.0.0"})
        if self.send_start:
            await self.start()
        self._tasks = [asyncio.create_task(self._receiver()), asyncio.create_task(self._player())]
        if sender:
            self._tasks.append(asyncio.create_task(self._sender()))
        return self

    async def start(self) -> None:
        await self.send({
            "event": "start", "sequenceNumber": str(next(self._seq)), "streamSid": self.stream_sid,
            "start": {
                "accountSid": "AC" + "0" * 32, "streamSid": self.stream_sid, "callSid": self.call_sid,
                "tracks": ["inbound"], "customParameters": self.custom_parameters,
                "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1},
            },
        })

    async def __aenter__(self) -> "SimulatedCarrier":
        return await self.connect()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def send(self, message: dict[str, Any] | str) -> None:
        await self._ws.send(message if isinstance(message, str) else json.dumps(message))

    async def stop(self) -> None:
        """Hang up as Twilio does: a ``stop`` message, then the socket closes."""
        with contextlib.suppress(Exception):
            await self.send({"event": "stop", "sequenceNumber": str(next(self._seq)), "streamSid": self.stream_sid,
                             "stop": {"accountSid": "AC" + "0" * 32, "callSid": self.call_sid}})
        await self.close()

    async def abort(self) -> None:
        """Drop the TCP connection without a ``stop`` or a close frame (a network failure)."""
        for task in self._tasks:
            task.cancel()
        if self._ws is not None:
            self._ws.transport.abort()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._ws is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._ws.close(), 5)
        for _, fut in self._mic:
            if fut is not None and not fut.done():
                fut.cancel()

    # -- caller side --------------------------------------------------------------------
    def say(self, ulaw: bytes) -> "asyncio.Future[float]":
        """Queue caller audio; the future gives the time its last frame was sent."""
        if len(ulaw) % FRAME_BYTES:
            ulaw += b"\xff" * (FRAME_BYTES - len(ulaw) % FRAME_BYTES)
        done: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        frames = [ulaw[i : i + FRAME_BYTES] for i in range(0, len(ulaw), FRAME_BYTES)]
        for index, frame in enumerate(frames):
            self._mic.append((frame, done if index == len(frames) - 1 else None))
        if not frames:
            done.set_result(time.monotonic())
        return done

    async def dtmf(self, digit: str) -> None:
        await self.send({"event": "dtmf", "streamSid": self.stream_sid, "sequenceNumber": str(next(self._seq)),
                         "dtmf": {"track": "inbound_track", "digit": digit}})

    def media_message(self, payload: bytes) -> str:
        chunk = next(self._chunk)
        return json.dumps({
            "event": "media", "sequenceNumber": str(next(self._seq)), "streamSid": self.stream_sid,
            "media": {"track": "inbound", "chunk": str(chunk), "timestamp": str(chunk * 20),
                      "payload": base64.b64encode(payload).decode()},
        })

    async def _sender(self) -> None:
        """20 ms frames forever: queued speech, else line silence."""
        due = time.monotonic()
        while True:
            if not self.media_paused:
                frame, done = self._mic.popleft() if self._mic else (SILENCE_FRAME, None)
                await self.send(self.media_message(frame))
                if done is not None and not done.done():
                    done.set_result(time.monotonic())
            due += FRAME_S
            now = time.monotonic()
            if due < now - 0.2:  # fell far behind (a stalled loop): resync instead of bursting
                due = now
            await asyncio.sleep(max(due - now, 0))

    # -- phone side ---------------------------------------------------------------------
    async def _receiver(self) -> None:
        try:
            async for raw in self._ws:
                now = time.monotonic()
                message = json.loads(raw)
                event = message.get("event")
                self.stream_sids.add(message.get("streamSid"))
                if event == "media":
                    payload = base64.b64decode(message["media"]["payload"])
                    self.payload_sizes[len(payload)] += 1
                    self.received.append((now, payload))
                    self._queue.append(("media", payload))
                elif event == "mark":
                    name = message["mark"]["name"]
                    self.marks_received.append((now, name))
                    self._queue.append(("mark", name))
                elif event == "clear":
                    self.clears.append(now)
                    kept = [entry for entry in self._queue if entry[0] == "mark"]
                    self._queue.clear()
                    for _, name in kept:  # Twilio echoes the marks of the dropped audio at once
                        await self._echo(name)
                else:
                    self.other.append(message)
                self._wake.set()
        except Exception:  # noqa: BLE001 - the server closed or dropped the socket
            pass
        finally:
            self.closed.set()

    async def _echo(self, name: str) -> None:
        if self.echo_marks:
            self.marks_echoed.append((time.monotonic(), name))
            with contextlib.suppress(Exception):
                await self.send({"event": "mark", "sequenceNumber": str(next(self._seq)), "streamSid": self.stream_sid,
                                 "mark": {"name": name}})

    async def _player(self) -> None:
        """Plays received frames at real-time pace; a mark is echoed when the audio before it has played."""
        clock: float | None = None
        while True:
            if not self._queue:
                self._wake.clear()
                await self._wake.wait()
                continue
            kind, value = self._queue.popleft()
            if kind == "mark":
                await self._echo(value)
                continue
            now = time.monotonic()
            if clock is None or clock < now:
                clock = now  # underrun (or first frame): playout restarts now
            clock += FRAME_S
            await asyncio.sleep(max(clock - time.monotonic(), 0))
            self.played.append((clock, value))

    # -- observations -------------------------------------------------------------------
    def first_media_after(self, t: float) -> float | None:
        return next((at for at, _ in self.received if at >= t), None)

    async def wait_media_after(self, t: float, timeout: float) -> float | None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = self.first_media_after(t)
            if found is not None:
                return found
            if self.closed.is_set():
                return None
            await asyncio.sleep(0.005)
        return None

    async def wait_played(self, after: float, ms: float, timeout: float) -> bool:
        """Until ``ms`` of audio received after ``after`` has played."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if sum(FRAME_S * 1000 for at, _ in self.played if at >= after) >= ms:
                return True
            await asyncio.sleep(0.01)
        return False

    async def wait_quiet(self, quiet_s: float = 1.0, timeout: float = 60.0) -> bool:
        """Until nothing was received for ``quiet_s`` and everything received has played."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            last = self.received[-1][0] if self.received else 0.0
            if not self._queue and time.monotonic() - last >= quiet_s:
                return True
            await asyncio.sleep(0.02)
        return False

    def played_audio(self, after: float = 0.0) -> bytes:
        return b"".join(payload for at, payload in self.played if at >= after)

    def received_audio(self, after: float = 0.0) -> bytes:
        return b"".join(payload for at, payload in self.received if at >= after)


# ------------------------------------------------------------------------------ in-process server
class InProcessServer:
    """The server on a free loopback port, in a thread of this process, so the benchmark can hook
    the bridge's calls and see the end-of-turn decision Twilio's wire does not carry."""

    def __init__(self, models: list[str], hook: Callable[[Any], Any] | None) -> None:
        from realtime_omni.engines.registry import ModelRegistry
        from realtime_omni.server_thread import ServerThread
        from realtime_omni.transports.twilio import set_call_hook

        self.registry = ModelRegistry()
        self.registry.load(models)
        self.thread = ServerThread(self.registry, models=models, session_store="none")
        self.port, self.app = self.thread.port, self.thread.app
        set_call_hook(self.app, hook)

    def __enter__(self) -> "InProcessServer":
        self.thread.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.thread.__exit__(*exc)
        self.registry.close()


# ------------------------------------------------------------------------------ the benchmark
class _Timeline:
    """Server-side event times per stream (filled by the call hook on the server's thread)."""

    WATCH = ("input_audio_buffer.speech_started", "input_audio_buffer.speech_stopped", "response.created",
             "conversation.item.input_audio_transcription.completed", "response.output_audio_transcript.done")

    def __init__(self) -> None:
        self.events: dict[str, list[tuple[float, str, str]]] = collections.defaultdict(list)
        self._lock = threading.Lock()

    def hook(self, call: Any) -> None:
        def listen(event: dict[str, Any]) -> None:
            if event.get("type") in self.WATCH:
                with self._lock:
                    self.events[call.stream_sid].append((time.monotonic(), event["type"], event.get("transcript") or ""))

        call.add_listener(listen)

    def first(self, stream_sid: str, kind: str, after: float) -> tuple[float, str] | tuple[None, None]:
        with self._lock:
            return next(((t, text) for t, k, text in self.events.get(stream_sid, []) if k == kind and t >= after),
                        (None, None))


def synthesize(texts: list[str]) -> dict[str, bytes]:
    """Caller utterances: Piper (the embedded voice) → trimmed → 8 kHz μ-law."""
    from realtime_omni.engines.embedded.tts_piper import PiperTTS

    tts = PiperTTS(threads=1)
    out = {}
    for text in texts:
        pcm = np.concatenate(list(tts.synthesize(text)))
        out[text] = to_ulaw8k(trim_silence(pcm), tts.sample_rate)
    return out


async def run_calls(
    stream_url: str, *, calls: int, turns: int, model: str | None, barge_in: bool, timeline: _Timeline | None,
    log: Callable[[str], None] = print,
) -> list[dict[str, Any]]:
    texts = list(QUESTIONS) + [LONG_QUESTION, INTERRUPTION]
    audio = await asyncio.to_thread(synthesize, texts)
    params = {"instructions": INSTRUCTIONS}
    if model:
        params["model"] = model
    samples: list[dict[str, Any]] = []
    asked = itertools.cycle(QUESTIONS)
    for call_index in range(calls):
        async with SimulatedCarrier(stream_url, custom_parameters=params) as carrier:
            await asyncio.sleep(0.6)  # line silence before the caller speaks
            for turn in range(turns):
                question = next(asked)
                end = await carrier.say(audio[question])
                first = await carrier.wait_media_after(end, timeout=30)
                sample: dict[str, Any] = {"call": call_index, "turn": turn, "question": question, "kind": "turn",
                                          "first_audio_ms": None if first is None else round(1000 * (first - end), 1)}
                await carrier.wait_quiet(0.8, timeout=60)
                if timeline is not None:
                    sid = carrier.stream_sid
                    stopped, _ = timeline.first(sid, "input_audio_buffer.speech_stopped", end - 2.0)
                    if stopped is not None:
                        sample["eot_ms"] = round(1000 * (stopped - end), 1)
                        if first is not None:
                            sample["after_eot_ms"] = round(1000 * (first - stopped), 1)
                        heard_at, heard = timeline.first(sid, "conversation.item.input_audio_transcription.completed", stopped)
                        if heard_at is not None:
                            sample["asr_ms"] = round(1000 * (heard_at - stopped), 1)
                            sample["transcript"] = heard
                        _, reply = timeline.first(sid, "response.output_audio_transcript.done", stopped)
                        sample["reply"] = reply
                samples.append(sample)
                log(f"call {call_index} turn {turn}: first audio {sample['first_audio_ms']} ms"
                    f" (end of turn {sample.get('eot_ms')} ms, transcript after {sample.get('asr_ms')} ms,"
                    f" first audio {sample.get('after_eot_ms')} ms after end of turn) {sample.get('transcript')!r}"
                    f" → {str(sample.get('reply'))[:60]!r}")
            if barge_in:
                end = await carrier.say(audio[LONG_QUESTION])
                first = await carrier.wait_media_after(end, timeout=30)
                if first is not None and await carrier.wait_played(first, 1200, timeout=20):
                    clears_before = len(carrier.clears)
                    spoken = carrier.say(audio[INTERRUPTION])
                    onset = time.monotonic()  # its first frame leaves within one 20 ms tick
                    await spoken
                    deadline = time.monotonic() + 5
                    while len(carrier.clears) == clears_before and time.monotonic() < deadline:
                        await asyncio.sleep(0.005)
                    cleared = carrier.clears[-1] if len(carrier.clears) > clears_before else None
                    sample = {"call": call_index, "kind": "barge_in",
                              "clear_ms": None if cleared is None else round(1000 * (cleared - onset), 1)}
                    if timeline is not None and cleared is not None:
                        vad_at, _ = timeline.first(carrier.stream_sid, "input_audio_buffer.speech_started", onset)
                        if vad_at is not None:
                            sample["vad_onset_ms"] = round(1000 * (vad_at - onset), 1)
                            sample["clear_after_vad_ms"] = round(1000 * (cleared - vad_at), 1)
                    samples.append(sample)
                    log(f"call {call_index} barge-in: clear after {sample['clear_ms']} ms"
                        f" (VAD onset {sample.get('vad_onset_ms')} ms, then {sample.get('clear_after_vad_ms')} ms)")
                await carrier.wait_quiet(0.8, timeout=60)
            sizes = dict(carrier.payload_sizes)
            if set(sizes) - {FRAME_BYTES}:
                log(f"warning: media payload sizes other than 160 bytes: {sizes}")
            await carrier.stop()
    return samples


def _plot(samples: list[dict[str, Any]]):  # type: ignore[no-untyped-def]
    def draw(fig) -> None:  # type: ignore[no-untyped-def]
        ax = fig.subplots()
        series = [("barge-in speech → clear", "clear_ms"), ("end-of-turn → transcript (ASR)", "asr_ms"),
                  ("end-of-turn → first audio", "after_eot_ms"), ("end of speech → end-of-turn", "eot_ms"),
                  ("end of speech → first audio", "first_audio_ms")]
        data = [[s[k] for s in samples if s.get(k) is not None] for _, k in series]
        labels = [label for (label, _), d in zip(series, data, strict=True) if d]
        data = [d for d in data if d]
        if data:
            ax.boxplot(data, vert=False, showmeans=True)
            ax.set_yticks(range(1, len(labels) + 1), labels)
        ax.set_xlabel("ms")
        ax.set_title("Telephony path (Twilio Media Streams, 8 kHz μ-law): latency per turn")
        ax.grid(axis="x", alpha=0.3)

    return draw


def _loadavg() -> list[float] | None:
    try:
        import os

        return [round(x, 2) for x in os.getloadavg()]
    except (AttributeError, OSError):
        return None


def run(
    *, url: str | None = None, calls: int = 10, turns: int = 2, model: str = "embedded", barge_in: bool = True,
    out: str | Path = "docs/benchmarks", name: str = "telephony", log: Callable[[str], None] = print,
) -> tuple[Report, dict[str, Path]]:
    started = time.monotonic()
    load_before = _loadavg()
    timeline: _Timeline | None = None
    server: InProcessServer | None = None
    if url is None:
        timeline = _Timeline()
        log(f"starting an in-process server with model {model} ...")
        server = InProcessServer([model], timeline.hook).__enter__()
        stream_url = f"ws://127.0.0.1:{server.port}{STREAM_PATH}"
    else:
        from . import ServerURL

        stream_url = ServerURL.parse(url).ws + STREAM_PATH
    try:
        samples = asyncio.run(run_calls(stream_url, calls=calls, turns=turns, model=model if url else None,
                                        barge_in=barge_in, timeline=timeline, log=log))
    finally:
        if server is not None:
            server.__exit__(None, None, None)
    turns_s = [s for s in samples if s["kind"] == "turn"]
    barges = [s for s in samples if s["kind"] == "barge_in"]
    summary = {
        "first_audio_ms": summarize(s.get("first_audio_ms") for s in turns_s),
        "eot_ms": summarize(s.get("eot_ms") for s in turns_s),
        "after_eot_ms": summarize(s.get("after_eot_ms") for s in turns_s),
        "asr_ms": summarize(s.get("asr_ms") for s in turns_s),
        "clear_ms": summarize(s.get("clear_ms") for s in barges),
        "vad_onset_ms": summarize(s.get("vad_onset_ms") for s in barges),
        "clear_after_vad_ms": summarize((s.get("clear_after_vad_ms") for s in barges), digits=2),
        "turns": len(turns_s),
        "turns_without_reply": sum(1 for s in turns_s if s.get("first_audio_ms") is None),
    }
    labels = {"first_audio_ms": "end of speech → first media frame", "eot_ms": "end of speech → end-of-turn decision",
              "after_eot_ms": "end-of-turn decision → first media frame",
              "asr_ms": "end-of-turn decision → transcript (ASR, inside the above)",
              "clear_ms": "barge-in: speech onset → clear",
              "vad_onset_ms": "barge-in: speech onset → speech_started (VAD)",
              "clear_after_vad_ms": "barge-in: speech_started → clear (the bridge)"}
    # The first turn of a call also pays for opening the session's model state (the embedded
    # thinker's own llama context), so it is shown apart from the later turns too.
    summary["first_audio_ms_first_turn"] = summarize(s.get("first_audio_ms") for s in turns_s if s["turn"] == 0)
    summary["first_audio_ms_later_turns"] = summarize(s.get("first_audio_ms") for s in turns_s if s["turn"] > 0)
    labels["first_audio_ms_first_turn"] = "… first turn of a call"
    labels["first_audio_ms_later_turns"] = "… later turns"
    order = ["first_audio_ms", "first_audio_ms_first_turn", "first_audio_ms_later_turns", "eot_ms", "after_eot_ms",
             "asr_ms", "clear_ms", "vad_onset_ms", "clear_after_vad_ms"]
    rows = [[labels[k], summary[k]["n"], summary[k]["p50"], summary[k]["p95"], summary[k]["min"], summary[k]["max"]]
            for k in order]
    fa, ae = summary["first_audio_ms"], summary["after_eot_ms"]
    headline = f"first audio p50 {fa['p50']} ms / p95 {fa['p95']} ms after end of speech"
    if ae["p50"] is not None:
        headline += f"; {ae['p50']} ms / {ae['p95']} ms after the end-of-turn decision"
    notes = [
        "Caller audio: Piper (en_US joe) questions, trimmed of silence, resampled to 8 kHz and μ-law encoded, sent as "
        "20 ms Twilio media frames at real-time pace; line silence (μ-law 0xFF) between utterances.",
        "End of speech = the moment the last speech frame was sent. The end-of-turn decision includes the server VAD's "
        "500 ms silence window (server_vad default).",
        "Times are measured on one clock: the simulated carrier and (in self-started mode) the server run in one process; "
        "model inference runs in worker threads, so the 20 ms send/playout loop stays on time.",
        "Barge-in: the interruption is spoken once ≥1.2 s of the reply has played; clear_ms runs from its first frame "
        "to the clear message (VAD onset needs ~64 ms of speech plus 32 ms frames).",
    ]
    notes.append(f"Load average (1/5/15 min) before the run: {load_before}, after: {_loadavg()}; other processes "
                 "on this 2-core machine add to model latencies.")
    if url is not None:
        notes.append("Server given by --url: the end-of-turn decision is not observable on Twilio's wire, so only "
                     "end of speech → first media is reported.")
    cmd = command_line()
    report = Report(
        name=name, benchmark="telephony", title="Telephony: first audio over the Twilio Media Streams bridge",
        command=cmd,
        config={"calls": calls, "turns_per_call": turns, "model": model, "barge_in": barge_in, "url": url,
                "server": "in-process (thread)" if url is None else url, "frame_ms": 20, "format": "audio/x-mulaw 8 kHz",
                "instructions": INSTRUCTIONS, "load_average_before": load_before, "load_average_after": _loadavg()},
        summary=summary, samples={"turns": turns_s, "barge_in": barges},
        columns=["metric", "n", "p50 ms", "p95 ms", "min ms", "max ms"], rows=rows, headline=headline,
        notes=notes, plot=_plot(samples), reproduce=[cmd],
    )
    report.duration_s = time.monotonic() - started
    return report, write_report(report, out)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--calls", type=int, default=10, help="phone calls to place (default: %(default)s)")
    parser.add_argument("--turns", type=int, default=2, help="spoken questions per call (default: %(default)s)")
    parser.add_argument("--model", default="embedded", help="model the calls use (default: %(default)s)")
    parser.add_argument("--no-barge-in", dest="barge_in", action="store_false",
                        help="skip the speak-over-the-reply measurement at the end of each call")


def main(args: argparse.Namespace) -> int:
    if args.url is None and args.server_cpus not in (None, "", "none", "all"):
        print("note: --server-cpus is ignored: the telephony benchmark runs its server in-process "
              "(to observe the end-of-turn decision)")
    run(url=args.url, calls=args.calls, turns=args.turns, model=args.model, barge_in=args.barge_in, out=args.out,
        name=args.name or "telephony")
    return 0
