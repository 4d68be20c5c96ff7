"""A :class:`VoiceModel` whose engine runs in a supervised worker process.

``IsolatedModel("embedded")`` behaves like the model the registry builder ``"embedded"`` makes,
but a crash of that engine (segfault, OOM kill, abort in native code) kills only the worker: the
calls in flight raise :class:`WorkerCrashed` (so the pipeline fails just those responses), the
supervisor restarts the worker, and sessions re-open their engine state on the new worker at
their next call (the thinker gets the whole conversation in every ThinkRequest; VAD restarts).

Every method here is called from a worker thread of the server (never the event loop), except
the ones that must not block and therefore never touch the pipe: ``open_session``, ``new_vad``,
``VADStream.reset`` and, for engines that keep the base implementation, ``talk_boundary``.
"""

from __future__ import annotations

import itertools
import queue
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from ..base import (
    ModelAtCapacity,
    ModelInfo,
    VoiceModel,
)
from ..settings import EngineSettings
from . import protocol as p
from .channel import CRASHED, ChannelDead
from .protocol import WorkerClosed, WorkerCrashed, WorkerError, WorkerTimeout, WorkerUnavailable
from .remote import RemoteSession, RemoteVADStream
from .supervisor import Supervisor

__all__ = [
    "IsolatedModel",
    "IsolatedSession",
    "IsolatedVADSession",
    "WorkerClosed",
    "WorkerCrashed",
    "WorkerError",
    "WorkerUnavailable",
]

#: how often a waiting stream consumer looks at its ``cancelled`` Event
CANCEL_POLL_S = 0.02


class IsolatedModel(VoiceModel):
    """Runs ``BUILDERS[name]`` (or ``builder``) in a child process started with "spawn".

    ``builder`` must be picklable by reference (a module-level function or class) because the
    child builds the model itself; nothing is loaded in this process.
    """

    def __init__(
        self,
        name: str,
        builder: Callable[[], VoiceModel] | None = None,
        *,
        engines: EngineSettings | None = None,
        call_wait_s: float = 60.0,
        call_timeout_s: float = 120.0,
        load_timeout_s: float = 600.0,
        stream_window: int = 8,
        cancel_grace_s: float = 5.0,
        shutdown_grace_s: float = 3.0,
        strip_unheard_audio: bool = True,
    ) -> None:
        self.name = name
        #: how long a call waits for a (re)starting worker before WorkerUnavailable
        self.call_wait_s = call_wait_s
        #: how long a call waits for the worker's answer (twice the pipeline's step deadline):
        #: a worker stuck in an engine call must not hold its callers' threads for ever
        self.call_timeout_s = call_timeout_s
        self.load_timeout_s = load_timeout_s
        #: items a streamed call may have in flight (sent, not yet consumed) per call
        self.stream_window = max(2, stream_window)
        #: after a cancel, how long a stream waits for the worker to confirm it stopped
        self.cancel_grace_s = cancel_grace_s
        #: cascade thinkers (``info.hears_audio`` False) read transcripts: drop the turns' audio
        #: instead of pickling the whole conversation's audio into every think call
        self.strip_unheard_audio = strip_unheard_audio
        self._supervisor = Supervisor(name, builder, engines, shutdown_grace_s=shutdown_grace_s)
        self._keys = itertools.count(1)
        self._open: set[int] = set()  # keys of the sessions open here (admission control)
        self._open_lock = threading.Lock()
        self._posts: queue.SimpleQueue[tuple[IsolatedSession, tuple[Any, ...]] | None] | None = None
        self._post_lock = threading.Lock()

    # -- VoiceModel -----------------------------------------------------------------------------
    @property
    def info(self) -> ModelInfo:  # type: ignore[override]
        """The worker's ``model.info`` (known once loaded; a placeholder with the id before)."""
        return self._supervisor.info or ModelInfo(id=self.name)

    @property
    def traits(self) -> p.Traits:
        traits = self._supervisor.traits
        if traits is None:
            raise RuntimeError(f"model {self.name!r} is not loaded")
        return traits

    def load(self, progress: Callable[[str], None] = lambda _msg: None) -> None:
        self._supervisor.start(progress, self.load_timeout_s)

    def open_session(self) -> IsolatedSession:
        """Never blocks (called on the event loop): the worker opens the session asynchronously,
        and again on its own at the session's first call if it has been restarted since."""
        cls = IsolatedVADSession if self.traits.has_vad else IsolatedSession
        limit = self.info.max_sessions
        with self._open_lock:
            if limit is not None and len(self._open) >= limit:
                raise ModelAtCapacity(f"all {limit} session slots of model {self.name!r} are in use")
            session = cls(self, next(self._keys))
            self._open.add(session.key)
        self._post(session, (p.OPEN, session.key))
        return session

    def stats(self) -> dict[str, dict[str, float]]:
        """The worker's engine counters; empty while it is down or restarting."""
        try:
            return self._call(p.NO_SESSION, "stats", (), wait_s=0.0)
        except WorkerError:
            return {}

    def close(self) -> None:
        self._supervisor.close()
        if self._posts is not None:
            self._posts.put(None)

    # -- supervision, for /ready and tests --------------------------------------------------------
    @property
    def ready(self) -> bool:
        """The worker is up with its model loaded (False while it restarts, and once closed)."""
        return self._supervisor.ready

    @property
    def restarts(self) -> int:
        return self._supervisor.restarts

    @property
    def pid(self) -> int | None:
        """The current worker's pid (it may still be loading; see ``ready``)."""
        return self._supervisor.pid

    @property
    def last_restart_s(self) -> float | None:
        """Seconds from the last crash being noticed to the replacement being ready."""
        return self._supervisor.last_restart_s

    def wait_ready(self, timeout: float = 60.0) -> bool:
        return self._supervisor.wait_ready(timeout)

    def ping(self) -> float:
        """One round trip through the worker's reader thread (no model call); seconds."""
        channel = self._supervisor.channel(self.call_wait_s)
        started = time.perf_counter()
        call = channel.open_call()
        try:
            channel.send((p.PING, call.id))
        except ChannelDead as exc:
            channel.forget(call)
            raise self._lost() from exc
        if self._answer(channel, call, "ping") is CRASHED:
            raise self._lost()
        return time.perf_counter() - started

    # -- RPC ------------------------------------------------------------------------------------
    def _lost(self) -> WorkerError:
        if self._supervisor.closing:
            return WorkerClosed(f"model {self.name!r} was closed during the call")
        return WorkerCrashed(f"model {self.name!r} worker process died during the call")

    def _begin(self, op: int, key: int, method: str, args: tuple[Any, ...], wait_s: float | None, *extra: Any):  # type: ignore[no-untyped-def]
        """Send one call to a ready worker (waiting up to ``wait_s`` for one); (channel, call)."""
        blob = p.dumps(args)
        wait = self.call_wait_s if wait_s is None else wait_s
        while True:
            channel = self._supervisor.channel(wait)
            if key != p.NO_SESSION and method != "close":
                with self._open_lock:
                    if key not in self._open:
                        # closed while this call waited for a restarting worker: the new
                        # worker would open the session anew, and nothing would close it
                        raise WorkerClosed(f"model {self.name!r}: the session was closed")
            try:
                call = channel.open_call()
            except ChannelDead:
                continue  # died between the two lines: wait for the next worker
            try:
                channel.send((op, call.id, key, method, blob, *extra))
            except ChannelDead as exc:
                channel.forget(call)
                raise self._lost() from exc
            return channel, call

    def _answer(self, channel: Any, call: Any, method: str) -> Any:
        """The worker's answer to ``call``, within :attr:`call_timeout_s`."""
        try:
            return call.queue.get(timeout=self.call_timeout_s)
        except queue.Empty:
            channel.forget(call)  # an answer that comes later finds no call: dropped
            raise WorkerTimeout(f"model {self.name!r} did not answer {method!r} within "
                                f"{self.call_timeout_s:.0f} s") from None

    def _call(self, key: int, method: str, args: tuple[Any, ...], wait_s: float | None = None) -> Any:
        channel, call = self._begin(p.CALL, key, method, args, wait_s)
        msg = self._answer(channel, call, method)
        if msg is CRASHED:
            raise self._lost()
        if msg[0] == p.RESULT:
            return p.loads(msg[2])
        raise p.unpack_exception(msg[2], msg[3])

    def _stream(self, key: int, method: str, args: tuple[Any, ...], cancelled: threading.Event) -> Iterator[Any]:
        """Items of a generator running in the worker, with a credit window and cancellation."""
        if cancelled.is_set():
            return  # cancelled before it started (engines check first too): no round trip
        window = self.stream_window
        channel, call = self._begin(p.STREAM, key, method, args, None, window)
        get = call.queue.get
        batch = max(1, window // 2)
        consumed = 0
        cancel_deadline: float | None = None
        finished = False
        try:
            while True:
                if cancel_deadline is None and cancelled.is_set():
                    channel.post((p.CANCEL, call.id))
                    cancel_deadline = time.monotonic() + self.cancel_grace_s
                if channel.dead.is_set():
                    raise self._lost()  # don't hand out what is buffered: the reply is lost
                try:
                    msg = get(timeout=CANCEL_POLL_S)
                except queue.Empty:
                    if cancel_deadline is not None and time.monotonic() > cancel_deadline:
                        return  # the engine ignores cancellation: leave it running there
                    continue
                if msg is CRASHED:
                    raise self._lost()
                op = msg[0]
                if op == p.ITEM:
                    if cancel_deadline is not None:
                        continue  # produced before the worker saw the cancel
                    item = p.loads(msg[2])
                    yield item
                    consumed += 1
                    if consumed >= batch:
                        channel.post((p.CREDIT, call.id, consumed))
                        consumed = 0
                elif op == p.END:
                    finished = True
                    return
                else:
                    finished = True
                    raise p.unpack_exception(msg[2], msg[3])
        finally:
            if not finished:
                channel.forget(call)
                channel.post((p.CANCEL, call.id))  # no-op when the worker already finished it

    # -- fire-and-forget messages (from the event loop) ------------------------------------------
    def _post(self, session: IsolatedSession, msg: tuple[Any, ...]) -> None:
        if self._posts is None:
            with self._post_lock:
                if self._posts is None:
                    self._posts = queue.SimpleQueue()
                    threading.Thread(target=self._poster, name=f"worker-{self.name}-poster", daemon=True).start()
        self._posts.put((session, msg))

    def _poster(self) -> None:
        assert self._posts is not None
        while True:
            entry = self._posts.get()
            if entry is None:
                return
            session, msg = entry
            channel = self._supervisor.current()
            if channel is not None and not session.closed:
                channel.post(msg)


class IsolatedSession(RemoteSession):
    """A session whose engine state lives in the worker under ``key``."""

    def __init__(self, owner: IsolatedModel, key: int) -> None:
        super().__init__(key, owner.traits, owner.strip_unheard_audio and not owner.info.hears_audio)
        self._owner = owner

    def _call(self, method: str, args: tuple[Any, ...]) -> Any:
        return self._owner._call(self.key, method, args)

    def _call_now(self, method: str, args: tuple[Any, ...]) -> Any:
        return self._owner._call(self.key, method, args, wait_s=0.0)

    def _stream(self, method: str, args: tuple[Any, ...], cancelled: threading.Event) -> Iterator[Any]:
        return self._owner._stream(self.key, method, args, cancelled)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            # never wait for a restarting worker: a new one holds no state for this session
            self._call_now("close", ())
        except WorkerError:
            pass
        finally:  # the slot is free once the worker has let the session go (or is gone)
            with self._owner._open_lock:
                self._owner._open.discard(self.key)


class IsolatedVADSession(IsolatedSession):
    """For engines with a VAD: a distinct class because the session manager decides "has VAD"
    from ``type(session).new_vad``."""

    def new_vad(self) -> RemoteVADStream:
        self._check()
        return RemoteVADStream(self, next(self._vad_keys), self._traits.vad_frame_samples)
