"""One response as three stages in async chunks: thinker ─▶ talker ─▶ codec (PCM out).

Each stage is an asyncio task; model calls run in worker threads; stages are joined by bounded
queues (backpressure, never unbounded buffering). Every chunk carries its response's epoch and
each stage drops a chunk whose epoch the session has fenced off (cancel, barge-in), so nothing of
a cancelled response crosses a stage boundary.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import numpy as np

from ..audio import Pcm, StreamResampler
from ..engines.base import ModelInfo, ModelSession, TalkerOutput, ThinkerOutput, ThinkRequest, ToolCallDelta
from ..observer import NullObserver, Observer, Stage

T = TypeVar("T")
_DONE = object()


@dataclass
class Chunk(Generic[T]):
    """An inter-stage message. ``segment_end`` closes the turn. There is no session-end flag: the
    thinker's context outlives the turn and is released when the runner closes the model session."""

    epoch: int
    payload: T | None = None
    segment_end: bool = False


@dataclass
class PipelineSettings:
    queue_size: int = 8
    #: max milliseconds of audio sent ahead of real time (None: as fast as produced)
    lead_ms: float | None = 1500.0
    #: max milliseconds per audio delta
    delta_ms: float = 100.0
    #: deadline for one model step (a stuck engine fails the response instead of hanging it)
    step_timeout_s: float = 60.0
    #: the first spoken segment of a reply may end after this many words (0: wait for a clause)
    first_segment_words: int = 3


@dataclass
class Sink:
    """Where a response's outputs go (the session mailbox, in order)."""

    text: Callable[[str], Awaitable[None]]
    audio: Callable[[Pcm, str], Awaitable[None]]
    usage: Callable[[int, int, int], Awaitable[None]]
    #: pieces of a function call (never spoken); None: the caller takes no calls
    call: Callable[[ToolCallDelta], Awaitable[None]] | None = None


class ResponsePipeline:
    """Runs one response. ``is_current()`` is the session's epoch fence for this response."""

    def __init__(
        self,
        model: ModelSession,
        info: ModelInfo,
        executor: concurrent.futures.Executor,
        settings: PipelineSettings,
        is_current: Callable[[], bool],
        observer: Observer | None = None,
    ) -> None:
        self.model = model
        self.observer: Observer = observer or NullObserver()
        self._clock = _PlayoutClock(settings.lead_ms)
        self.info = info
        self.executor = executor
        self.settings = settings
        self.is_current = is_current
        # The base clause splitter is pure text work, cheap enough for the loop; anything else
        # (an omni engine, a worker-process proxy that forwards it) runs in a thread.
        self._local_boundary = type(model).talk_boundary is ModelSession.talk_boundary or getattr(
            getattr(model, "_traits", None), "custom_talk_boundary", True) is False

    async def run(self, epoch: int, request: ThinkRequest, rate: int, sink: Sink) -> tuple[str, str | None]:
        """Audio goes to ``sink`` as PCM at ``rate`` (the listener's; encoding is the transport's).
        Returns (status, reason) when the reply is complete: ("completed"|"incomplete", reason)."""
        size = self.settings.queue_size
        thought: asyncio.Queue[Chunk[ThinkerOutput]] = asyncio.Queue(size)
        spoken: asyncio.Queue[Chunk[TalkerOutput]] = asyncio.Queue(size)
        counts = {"tokens": 0}
        started = time.monotonic()
        self._clock = _PlayoutClock(self.settings.lead_ms)
        tasks = [asyncio.create_task(self._thinker(epoch, request, thought, counts, sink))]
        if request.want_audio:
            tasks.append(asyncio.create_task(self._talker(epoch, request, thought, spoken)))
            tasks.append(asyncio.create_task(self._codec(epoch, spoken, rate, sink)))
        else:
            tasks.append(asyncio.create_task(self._text_only(epoch, thought, sink)))
        try:
            await asyncio.gather(*tasks)
        finally:
            request.cancelled.set()  # stops worker threads on every exit path
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        clock = self._clock
        if clock.sent_ms > 0:
            working = time.monotonic() - started - clock.slept_s
            self.observer.real_time_factor(max(working, 0.0) / (clock.sent_ms / 1000.0))
        limit = request.max_output_tokens
        if limit is not None and counts["tokens"] >= limit:
            return "incomplete", "max_output_tokens"
        return "completed", None

    # -- helpers --------------------------------------------------------------------------
    async def _iterate_in_thread(self, make: Callable[[], Iterator[T]], cancelled: threading.Event,
                                 out: Callable[[T], Awaitable[None]], stage: Stage) -> None:
        """Drive a blocking generator in a worker thread, handing each item to ``out`` with
        backpressure (the thread waits while the consumer is behind). Each step of the generator
        is timed as a step of ``stage`` (the waits on the consumer are not)."""
        loop = asyncio.get_running_loop()
        bridge: asyncio.Queue[Any] = asyncio.Queue(2)
        stop = threading.Event()  # this bridge's own stop; ``cancelled`` belongs to the response

        def put(value: Any) -> None:
            if stop.is_set() or loop.is_closed():
                return  # the consumer left, or the loop is gone (server shutdown): nobody reads it
            pending = bridge.put(value)
            try:
                future = asyncio.run_coroutine_threadsafe(pending, loop)
            except RuntimeError:  # the loop closed in between
                pending.close()
                return
            while True:
                try:
                    return future.result(0.05)
                except concurrent.futures.TimeoutError:
                    if stop.is_set():  # the consumer left: drop the value, free the thread
                        future.cancel()
                        return

        def produce() -> None:
            try:
                steps = iter(make())
                while True:
                    began = time.perf_counter()
                    try:
                        value = next(steps)
                    except StopIteration:
                        break
                    self.observer.stage_step(stage, time.perf_counter() - began)
                    if cancelled.is_set() or stop.is_set():
                        break
                    put(value)
            except BaseException as exc:  # noqa: BLE001 - re-raised on the loop side
                put(_Failure(exc))
                return
            put(_DONE)

        # A thread of its own, not one of the shared pool: a producer blocks while its consumer is
        # behind, and consumers need pool threads (decode): with more live replies than pool
        # threads, pooled producers starved the consumers and every reply stalled.
        threading.Thread(target=produce, name="stage-producer", daemon=True).start()
        try:
            while True:
                value = await asyncio.wait_for(bridge.get(), self.settings.step_timeout_s)
                if value is _DONE:
                    break
                if isinstance(value, _Failure):
                    raise value.exc
                await out(value)
        finally:
            stop.set()  # the worker thread leaves at its next step

    # -- stages ---------------------------------------------------------------------------
    async def _thinker(self, epoch: int, request: ThinkRequest, out: asyncio.Queue[Chunk[ThinkerOutput]], counts: dict[str, int], sink: Sink) -> None:
        async def forward(piece: ThinkerOutput) -> None:
            if not self.is_current():
                request.cancelled.set()
                return
            if piece.prompt_tokens is not None:
                cached = piece.prompt_tokens - (piece.prefilled_tokens or piece.prompt_tokens)
                await sink.usage(piece.prompt_tokens, counts["tokens"], cached)
                self.prompt_tokens, self.cached_tokens = piece.prompt_tokens, cached
            if piece.call is not None:  # a function call goes to the client, not to the talker
                # (not counted: a call cut by the token limit is reported incomplete by the session)
                if sink.call is not None:
                    await sink.call(piece.call)
                return
            counts["tokens"] += 1
            await out.put(Chunk(epoch, piece))

        self.prompt_tokens, self.cached_tokens = 0, 0
        try:
            await self._iterate_in_thread(lambda: self.model.think(request), request.cancelled, forward, "thinker")
        finally:
            await sink.usage(self.prompt_tokens, counts["tokens"], self.cached_tokens)
            await out.put(Chunk(epoch, segment_end=True))

    async def _text_only(self, epoch: int, inbox: asyncio.Queue[Chunk[ThinkerOutput]], sink: Sink) -> None:
        while True:
            chunk = await inbox.get()
            if chunk.segment_end:
                return
            if self.is_current() and chunk.payload is not None:
                await sink.text(chunk.payload.text)

    async def _talker(self, epoch: int, request: ThinkRequest, inbox: asyncio.Queue[Chunk[ThinkerOutput]], out: asyncio.Queue[Chunk[TalkerOutput]]) -> None:
        pending: list[ThinkerOutput] = []
        spoken_any = False

        async def forward(piece: TalkerOutput) -> None:
            if self.is_current():
                await out.put(Chunk(epoch, piece))

        async def speak(segment: list[ThinkerOutput], final: bool) -> None:
            await self._iterate_in_thread(
                lambda: self.model.talk(segment, request.voice, request.cancelled, final, request.speed), threading.Event(), forward,
                "talker",
            )

        if self.model.talks_live:
            try:
                await self._talk_live(request, inbox, forward)
            finally:
                await out.put(Chunk(epoch, segment_end=True))
            return
        try:
            while True:
                chunk = await inbox.get()
                if not self.is_current():
                    return
                final = chunk.segment_end
                if chunk.payload is not None:
                    pending.append(chunk.payload)
                while pending:
                    if self._local_boundary:
                        cut = self.model.talk_boundary(pending, final)
                        if cut <= 0 and not spoken_any:
                            cut = _eager_first_cut(pending, self.settings.first_segment_words)
                    else:  # an engine's own segmentation may call into a model (or a worker process)
                        cut = await asyncio.get_running_loop().run_in_executor(
                            self.executor, self.model.talk_boundary, list(pending), final
                        )
                    if cut <= 0:
                        break
                    segment, pending = pending[:cut], pending[cut:]
                    spoken_any = True
                    await speak(segment, final and not pending)
                if final:
                    return
        finally:
            await out.put(Chunk(epoch, segment_end=True))

    async def _talk_live(self, request: ThinkRequest, inbox: asyncio.Queue[Chunk[ThinkerOutput]],
                         forward: Callable[[TalkerOutput], Awaitable[None]]) -> None:
        """One talker call for the whole reply, fed with each thinker output as it arrives
        (``talk_more``): where the model runs in a worker process, a ``talk`` call per token
        cost a round trip, and the token's frame often the batched talker's next step. (The
        talker's step times then include its waits for the thinker: a chunk's time is the time
        to make it, as the listener sees it.)"""
        loop = asyncio.get_running_loop()
        speaking: asyncio.Task[None] | None = None
        first = True
        try:
            while True:
                chunk = await inbox.get()
                if not self.is_current():
                    return
                segment = [] if chunk.payload is None else [chunk.payload]
                while not inbox.empty():  # what else has arrived goes in the same hand-over
                    more = inbox.get_nowait()
                    if more.payload is not None:
                        segment.append(more.payload)
                    if more.segment_end:
                        chunk = more
                        break
                final = chunk.segment_end
                await asyncio.wait_for(loop.run_in_executor(
                    self.executor, self.model.talk_more, segment, request.voice, final, first), self.settings.step_timeout_s)
                first = False
                if speaking is None:
                    speaking = asyncio.create_task(self._iterate_in_thread(
                        lambda: self.model.talk_live(request.cancelled), threading.Event(), forward, "talker"))
                if final:
                    await speaking
                    return
                if speaking.done():
                    await speaking  # it failed (re-raised here) or the talker ended the reply itself
                    return
        finally:
            if speaking is not None and not speaking.done():
                speaking.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await speaking

    async def _codec(self, epoch: int, inbox: asyncio.Queue[Chunk[TalkerOutput]], rate: int, sink: Sink) -> None:
        loop = asyncio.get_running_loop()
        # resampled here, once per reply stream, so the deltas' durations are final: the
        # playback ledger and the lead clock count what the listener will hear
        resampler = StreamResampler(self.info.output_rate, rate)
        max_samples = max(int(rate * self.settings.delta_ms / 1000), 1)
        clock = self._clock
        while True:
            chunk = await inbox.get()
            if not self.is_current():
                return
            if chunk.segment_end:
                tail = resampler.flush()
                if len(tail):
                    await self._send(Pcm(tail, rate), "", sink, clock)
                return
            piece = chunk.payload
            assert piece is not None
            if piece.audio is not None:
                audio = piece.audio
            else:  # codes: the codec model decodes them off the loop
                audio = await asyncio.wait_for(
                    loop.run_in_executor(self.executor, self._decode, piece), self.settings.step_timeout_s
                )
            out = resampler.process(np.asarray(audio, dtype=np.int16))
            text = piece.text
            for start in range(0, len(out), max_samples):
                if not self.is_current():
                    return
                await self._send(Pcm(out[start : start + max_samples], rate), text, sink, clock)
                text = ""

    def _decode(self, piece: TalkerOutput) -> Any:
        began = time.perf_counter()
        audio = self.model.decode(piece)
        self.observer.stage_step("codec", time.perf_counter() - began)
        return audio

    async def _send(self, audio: Pcm, text: str, sink: Sink, clock: "_PlayoutClock") -> None:
        await clock.wait()
        await sink.audio(audio, text)
        clock.advance(audio.duration_ms)


def _eager_first_cut(pending: list[ThinkerOutput], words: int) -> int:
    """The reply's first segment may end after ``words`` words even without punctuation, so the
    first audio does not wait for a whole sentence (a small prosody cost, once per reply)."""
    if words <= 0:
        return 0
    text = ""
    for index, out in enumerate(pending):
        text += out.text
        # a word is complete once whitespace follows it
        if len(text.split()) > words or (len(text.split()) == words and text[-1:].isspace()):
            return index + 1
    return 0


class _Failure:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


class _PlayoutClock:
    """Keeps sending at most ``lead_ms`` ahead of real-time playback of what was sent."""

    def __init__(self, lead_ms: float | None) -> None:
        self.lead_ms = lead_ms
        self.start: float | None = None
        self.sent_ms = 0.0
        #: time spent waiting so as not to run ahead of playback
        self.slept_s = 0.0

    async def wait(self) -> None:
        if self.lead_ms is None or self.start is None:
            return
        ahead = self.sent_ms - 1000.0 * (time.monotonic() - self.start)
        if ahead > self.lead_ms:
            began = time.monotonic()
            await asyncio.sleep((ahead - self.lead_ms) / 1000.0)
            self.slept_s += time.monotonic() - began

    def advance(self, ms: float) -> None:
        if self.start is None:
            self.start = time.monotonic()
        self.sent_ms += ms
