"""The asyncio driver of one session: one mailbox, one task, engines in worker threads.

Transports put raw client text into :meth:`SessionRunner.submit` (media audio into
:meth:`SessionRunner.submit_audio`) and send what :meth:`SessionRunner.next_outgoing` yields from
their single writer task. Everything that changes the session happens on the runner's own task,
in the order it arrived: the mailbox holds typed inputs (:mod:`.inputs`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import secrets
import time
from collections.abc import Callable
from typing import Any, Literal

from ..audio import Pcm
from ..audio.end_of_turn import EndOfTurnModel
from ..engines.base import ModelSession, VADStream
from ..observer import NullObserver, Observer
from ..pipeline import PipelineSettings
from ..protocol import parse_client_event
from ..protocol.errors import ErrorCode, ProtocolError
from . import inputs as inp
from .core import Outgoing, RealtimeSession
from .journal import Journal
from .limits import EXPIRY_MESSAGES, DeadlineAlarm, RunnerLimits, TokenBucket, Wedged
from .link import ConnectionLink
from .memory import approx_bytes
from .meter import TurnMeter
from .performer import ActionPerformer
from .speculation import SpeculativeTurns

log = logging.getLogger(__name__)

#: an outgoing event fenced off after it was queued (skipped, never sent)
STALE = object()


class Outbox(asyncio.Queue["Outgoing | None"]):
    """The events a session has for its transport. ``on_put``, when a writer sets it, is called
    for each one queued: a writer that also waits on other things (a call's data channel and
    track) then wakes on one event instead of a task and a wait set per event."""

    def __init__(self, maxsize: int) -> None:
        super().__init__(maxsize)
        self.on_put: Callable[[], None] | None = None

    def _put(self, item: Outgoing | None) -> None:  # (asyncio.Queue's hook under put/put_nowait)
        super()._put(item)  # type: ignore[misc]
        if self.on_put is not None:
            self.on_put()


class SessionRunner(ConnectionLink):
    def __init__(
        self,
        core: RealtimeSession,
        model: ModelSession | None,
        executor: concurrent.futures.Executor,
        vad_executor: concurrent.futures.Executor,
        limits: RunnerLimits | None = None,
        pipeline: PipelineSettings | None = None,
        on_close: Callable[["SessionRunner"], None] | None = None,
        on_change: Callable[["SessionRunner", list[dict[str, Any]]], None] | None = None,
        observer: Observer | None = None,
        transport: str = "internal",
        end_of_turn: EndOfTurnModel | None = None,
    ) -> None:
        self.core = core
        #: semantic_vad's end-of-turn model (shared by all sessions), None without one
        self.end_of_turn = end_of_turn
        self.model = model
        self.executor = executor
        self.vad_executor = vad_executor
        self.limits = limits or RunnerLimits()
        self.pipeline_settings = pipeline or PipelineSettings()
        self._on_close = on_close
        self._on_change = on_change
        self.observer: Observer = observer or NullObserver()
        #: what carries this session (websocket, webrtc, twilio, ...), for metrics
        self.transport = transport
        self.meter = TurnMeter(self.observer)
        self.close_reason: str | None = None
        self.mailbox: asyncio.Queue[inp.SessionInput] = asyncio.Queue(self.limits.mailbox_size)
        self.outbox = Outbox(self.limits.outbox_size)
        self.vad: VADStream | None = None
        self._task: asyncio.Task[None] | None = None
        self.closed = asyncio.Event()
        self.started_at = time.monotonic()
        self.journal = Journal(self.limits.journal_events, max_bytes=self.limits.journal_bytes)
        #: bytes of the client frames in the mailbox / of the events in the outbox
        self.inbox_bytes = 0
        self.outbox_bytes = 0
        self._inbox_room = asyncio.Event()
        self._outbox_room = asyncio.Event()
        self.resume_token = secrets.token_urlsafe(24)
        self.detached_since: float | None = None
        self.detached = asyncio.Event()
        #: the event_id of the last client event this session processed (resume bookkeeping)
        self.last_client_event_id: str | None = None
        #: set by the attached transport: makes it let go of the session (a resume takes over)
        self.kick: Callable[[], None] | None = None
        #: digest of the API key the session belongs to (None: keys are off); set by the manager
        self.owner: str | None = None
        #: resumes of this session attach one at a time
        self.attach_lock = asyncio.Lock()
        #: rebuilt from the store after a restart (no second session.created)
        self.from_store = False
        #: another process sharing the store serves this session now: this copy writes nothing more
        self.superseded = False
        #: set when rebuilt from the store: what the first resume reports (persist.restoration)
        self.restored: dict[str, Any] | None = None
        self._drain: asyncio.Task[None] | None = None
        self._bucket = TokenBucket(self.limits.max_events_per_s)
        self._alarm = DeadlineAlarm(self._ring)
        #: when the last client event or audio was accepted (the idle clock)
        self.last_client = time.monotonic()
        #: the lifetime limit (monotonic clock)
        self.deadline = self.started_at + self.limits.max_session_s
        #: replies prepared during a pause (composed: it reads this runner through SpeculationHost)
        self.speculation = SpeculativeTurns(self)
        #: performs the core's actions and owns the tasks they start (composed, like speculation)
        self.actions = ActionPerformer(self)

    @property
    def speculations_adopted(self) -> int:
        """Prepared replies this session used (for the metrics)."""
        return self.speculation.adopted

    # ------------------------------------------------------------ transport-facing API
    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"session-{self.core.id}")

    async def submit(self, raw: str | bytes) -> None:
        """Queue one client frame (raw JSON). Waits while the mailbox is full (backpressure),
        but never past the session's end."""
        if self.closed.is_set():
            return
        if not self._bucket.take():
            await self._offer(inp.RateLimited())
            return
        if await self._offer(inp.ClientEvent(raw)):
            self.last_client = time.monotonic()

    async def submit_audio(self, audio: Pcm) -> None:
        """Queue input audio from a media track (same path as ``input_audio_buffer.append``),
        as PCM at whatever rate the transport has it: the session's input format is for the
        JSON channel only, and the rate travels with the samples."""
        if await self._offer(inp.AudioIn(audio)):
            self.last_client = time.monotonic()

    async def _offer(self, message: inp.SessionInput) -> bool:
        """Put ``message`` in the mailbox, waiting while it is full until the session closes
        (a transport blocked here must still see its session end). False: not delivered."""
        if self.closed.is_set():
            return False
        size = inp.payload_bytes(message)
        # bytes first: one 15 MiB frame after another would fill memory long before the count
        while size and self.inbox_bytes and self.inbox_bytes + size > self.limits.queue_bytes:
            self._inbox_room.clear()
            if not await _first(self._inbox_room.wait(), self.closed.wait()) or self.closed.is_set():
                return False
        self.inbox_bytes += size
        try:
            self.mailbox.put_nowait(message)
            return True
        except asyncio.QueueFull:
            pass
        put = asyncio.ensure_future(self.mailbox.put(message))
        closed = asyncio.ensure_future(self.closed.wait())
        try:
            await asyncio.wait({put, closed}, return_when=asyncio.FIRST_COMPLETED)
        finally:  # the caller cancelled too (a send timeout, a kick): its bytes leave the count
            closed.cancel()
            if not put.done():
                put.cancel()  # a cancelled Queue.put puts nothing
            delivered = put.done() and not put.cancelled()
            if not delivered:
                self.inbox_bytes -= size
                self._inbox_room.set()
        return delivered

    def submit_image(self, rgb: Any) -> bool:
        """Offer a camera frame; dropped (False) when the mailbox is busy: newest wins later."""
        if not self.core.sees:
            return False
        return self._offer_nowait(inp.Image(rgb))

    def submit_audio_nowait(self, audio: Pcm) -> bool:
        """:meth:`submit_audio` for a caller that cannot wait (a media callback): False, and
        nothing queued, when the mailbox is full in events or bytes."""
        if not self._offer_nowait(inp.AudioIn(audio)):
            return False
        self.last_client = time.monotonic()
        return True

    def _offer_nowait(self, message: inp.SessionInput) -> bool:
        if self.closed.is_set():
            return False
        size = inp.payload_bytes(message)
        if self.inbox_bytes and self.inbox_bytes + size > self.limits.queue_bytes:
            return False
        try:
            self.mailbox.put_nowait(message)
        except asyncio.QueueFull:
            return False
        self.inbox_bytes += size
        return True

    async def next_outgoing(self) -> Outgoing | None:
        """The next event to send; None when the session is over. Stale audio is skipped."""
        while True:
            out = self._take(await self.outbox.get())
            if out is not STALE:
                return out  # type: ignore[return-value]

    def next_outgoing_nowait(self) -> Outgoing | None | Literal["empty"]:
        """As :meth:`next_outgoing` without waiting: ``"empty"`` when nothing is queued (a
        writer then takes a queued event without a task and a wait set per event)."""
        while True:
            try:
                out = self._take(self.outbox.get_nowait())
            except asyncio.QueueEmpty:
                return "empty"
            if out is not STALE:
                return out  # type: ignore[return-value]

    def _take(self, out: Outgoing | None) -> Outgoing | None | object:
        if out is None:
            return None
        self.outbox_bytes -= out.nbytes
        self._outbox_room.set()
        if out.epoch is not None and out.epoch != self.core.epoch:
            return STALE  # fenced off by a cancel/barge-in after it was queued
        self.meter.handed_over(out.event, time.monotonic())
        self.journal.record(out)
        return out

    async def close(self, reason: str = "client_closed") -> None:
        """Request a clean close; returns when everything the session held is released."""
        if self._task is None:
            return
        self.close_reason = self.close_reason or reason
        if not self.closed.is_set():
            try:
                self.mailbox.put_nowait(inp.Close(reason))
            except asyncio.QueueFull:
                self._task.cancel()
        # The task may be blocked on a full outbox whose writer is gone: bounded wait, then cancel.
        done, _ = await asyncio.wait({self._task}, timeout=2.0)
        if not done:
            self._task.cancel()
            await asyncio.wait({self._task}, timeout=10.0)

    # ------------------------------------------------------------ the session task
    async def _run(self) -> None:
        try:
            if self.model is not None:
                self.vad = self.model.new_vad() if self.core.has_vad else None
            self.core.resume_token = self.resume_token
            self.core.rate_limits = self._bucket.report
            if not self.from_store:  # a session rebuilt from the store was created long ago
                self.core.start()
            await self._flush()
            deadline = self.deadline
            warn_at: float | None = deadline - self.limits.expiry_warning_s
            while not self.core.closed:
                # Deadlines are checked on every turn of the loop, so a busy session expires too.
                now = time.monotonic()
                if warn_at is not None and now >= warn_at:
                    warn_at = None
                    self.core.warn_expiring(max(int(deadline - now), 0))
                    await self._flush()
                code = self._expired(now)
                if code is not None:
                    self.core.error(ProtocolError(code, EXPIRY_MESSAGES[code], type="session_error"))
                    self.close_reason = code
                    self.core.close(code)
                    await self._flush()
                    break
                self._alarm.arm(min(self._expires_at(), warn_at or deadline), now)
                message = await self.mailbox.get()
                size = inp.payload_bytes(message)
                if size:
                    self.inbox_bytes -= size
                    self._inbox_room.set()
                await self._handle(message)
                if isinstance(message, inp.ClientEvent | inp.AudioIn):
                    self.meter.audio_arrived(self.core.input_received_ms, time.monotonic())
                await self._flush()
        except Wedged as exc:
            # Nobody takes what the session sends (a client that never reads, a writer stuck on
            # a dead peer) and a limit passed meanwhile: it ends here, whatever its outbox holds.
            log.info("session %s ended by %s while its outbox was full", self.core.id, exc.reason)
            self.close_reason = self.close_reason or exc.reason
        except asyncio.CancelledError:
            pass
        except Exception:  # noqa: BLE001 - a bug here must not take the server down
            log.exception("session %s crashed", self.core.id)
        finally:
            await self._release()

    def _ring(self) -> None:
        """The deadline timer: wake the session task. A full mailbox needs no wake (the loop
        looks at the deadlines before each message, and arms the timer again)."""
        try:
            self.mailbox.put_nowait(inp.Alarm())
        except asyncio.QueueFull:
            pass

    async def _handle(self, message: inp.SessionInput) -> None:
        core = self.core
        match message:
            case inp.ClientEvent(raw):
                try:
                    event = parse_client_event(raw, self.limits.max_event_bytes)
                except ProtocolError as exc:
                    core.error(exc)
                    return
                core.receive(event)
                if event.event_id:
                    self.last_client_event_id = event.event_id
            case inp.AudioIn(audio):
                core.append_audio(audio)
            case inp.RateLimited():
                core.error(ProtocolError(
                    ErrorCode.RATE_LIMIT_EXCEEDED,
                    f"more than {self.limits.max_events_per_s:.0f} events per second; this event was dropped",
                    type="rate_limit_error"))
            case inp.Image(rgb):
                core.append_image(rgb)
            case inp.Alarm():
                pass  # the loop looks at the deadlines before each message
            case inp.Sync(done):
                if not done.done():
                    done.set_result(None)
            case inp.PlaybackCut(response_id):
                core.playback_cut(response_id)
            case inp.TurnEndVerdict(check, complete, probability):
                core.on_turn_end_verdict(check, complete, probability)
            case inp.Transcript(item_id, text, error):
                core.on_transcription(item_id, text, error)
            case inp.McpToolsListed(item_id, tools, error):
                core.on_mcp_tools_listed(item_id, tools, error)
            case inp.McpCallDone(response_id, epoch, item_id, output, error):
                core.on_mcp_call_done(response_id, epoch, item_id, output, error)
            case inp.ResponseText() | inp.ResponseAudio() | inp.ResponseCall() | inp.ResponseUsage() | inp.ResponseEnd():
                inp.deliver(core, message)
            case inp.Close(reason):
                self.close_reason = self.close_reason or reason
                core.close(reason)

    async def _flush(self) -> None:
        """Send what the core emitted and perform what it asked, until both are empty (an
        action may emit more, e.g. adopting a prepared reply)."""
        changed: list[dict[str, Any]] = []
        while True:
            events = self.core.drain_events()
            for out in events:
                if out.event["type"] in _STATE_CHANGES:
                    changed.append(out.event)
                await self._emit(out)
            actions = self.core.drain_actions()
            if not events and not actions:
                break
            for action in actions:
                await self.actions.perform(action)
        if changed and self._on_change is not None:
            self._on_change(self, changed)

    def _expires_at(self) -> float:
        return min(self.deadline, self.last_client + self.limits.idle_timeout_s)

    def _expired(self, now: float) -> ErrorCode | None:
        """``session_expired`` or ``session_idle_timeout`` once a limit has passed, else None."""
        if now >= self.deadline:
            return ErrorCode.SESSION_EXPIRED
        if now >= self.last_client + self.limits.idle_timeout_s:
            return ErrorCode.SESSION_IDLE_TIMEOUT
        return None

    async def _emit(self, out: Outgoing) -> None:
        """Queue one event for the writer. A full outbox (in events or bytes) is waited on only
        until the session's idle or lifetime limit (then :class:`Wedged`), never for ever."""
        out.nbytes = approx_bytes(out.event) + (out.audio.nbytes if out.audio is not None else 0)
        while self.outbox_bytes and self.outbox_bytes + out.nbytes > self.limits.queue_bytes:
            self._outbox_room.clear()
            await self._until_expiry(self._outbox_room.wait)
        try:
            self.outbox.put_nowait(out)
        except asyncio.QueueFull:
            await self._until_expiry(lambda: self.outbox.put(out))
        self.outbox_bytes += out.nbytes

    async def _until_expiry(self, wait: Callable[[], Any]) -> None:
        """Await ``wait()`` until it completes, or raise :class:`Wedged` once a limit passes."""
        while True:
            now = time.monotonic()
            reason = self._expired(now)
            if reason is not None:
                raise Wedged(reason)
            try:
                await asyncio.wait_for(wait(), self._expires_at() - now)
                return
            except asyncio.TimeoutError:
                continue  # the idle clock may have moved meanwhile: look again

    async def _release(self) -> None:
        """Free everything on every exit path: tasks, model state, the writer. :meth:`close`
        may cancel this midway (a model slow to close): what follows the waits still runs."""
        self.closed.set()
        self._alarm.cancel()
        try:
            if self._drain is not None and self._drain is not asyncio.current_task():
                self._drain.cancel()
            self.speculation.drop()
            self.core.close()
            tasks = self.actions.running()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            if self.model is not None:
                model, self.model = self.model, None
                # not the model pool (it may be saturated); shielded: a cancel stops the wait, not the close
                await asyncio.shield(asyncio.to_thread(_close_model, model))
        finally:
            if self.model is not None:  # cancelled before it got there: closed off the loop all the same
                model, self.model = self.model, None
                try:
                    asyncio.get_running_loop().run_in_executor(None, _close_model, model)
                except RuntimeError:  # the loop's executor is gone (the server is stopping)
                    _close_model(model)
            # Wake the writer after what is queued (the oldest events give way if it is full).
            while True:
                try:
                    self.outbox.put_nowait(None)
                    break
                except asyncio.QueueFull:
                    self.outbox.get_nowait()
            if self._on_close is not None:
                self._on_close(self)


def _close_model(model: ModelSession) -> None:
    try:
        model.close()
    except Exception:  # noqa: BLE001
        log.exception("closing model session failed")


async def _first(*waits: Any) -> bool:
    """Wait for the first of several coroutines; the rest are cancelled. True when one finished."""
    tasks = [asyncio.ensure_future(w) for w in waits]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
    return bool(done)


# Events after which the stored state is out of date (session/persist.py says what each touches).
_STATE_CHANGES = frozenset({
    "session.updated", "conversation.item.added", "conversation.item.done", "conversation.item.deleted",
    "conversation.item.truncated", "conversation.item.input_audio_transcription.completed",
    "response.output_item.done", "response.done",
})
