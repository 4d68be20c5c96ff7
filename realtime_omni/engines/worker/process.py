"""The worker process: loads one real :class:`VoiceModel` and serves calls on its sessions.

Started by the supervisor with multiprocessing's "spawn" context; :func:`worker_main` is the
process target. One reader thread takes messages off the pipe and hands each call to a thread
pool (model calls block for up to seconds; cancel and credit messages must get through while they
run). Sessions are opened on first use by key, so after a restart a session from the dead worker
transparently gets fresh state here at its next call.

The worker never outlives the server: it exits on pipe EOF, on SHUTDOWN, when its parent pid
changes, and (Linux) by ``PR_SET_PDEATHSIG`` when the thread that spawned it exits.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import ctypes
import os
import signal
import sys
import threading
import time
import traceback
import typing
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection
from typing import Any

from ..base import ModelAtCapacity, ModelSession, VADStream, VoiceModel
from ..settings import EngineSettings
from . import protocol as p

#: the worker runs this many calls at once at most (threads are created on demand)
MAX_CALL_THREADS = 256
#: session keys remembered as closed, so a late OPEN cannot resurrect a closed session
_CLOSED_MEMORY = 65_536


def worker_main(
    conn: Connection,
    name: str,
    builder: Callable[[], VoiceModel] | None,
    parent_pid: int,
    engines: EngineSettings | None = None,
) -> None:
    """Process target: never returns normally (``os._exit``), so no interpreter teardown can hang."""
    _die_with_parent(parent_pid)
    # Ctrl-C in a terminal signals the whole process group: the server decides when we stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    host = WorkerHost(conn)
    host.start()
    threading.Thread(target=_watch_parent, args=(parent_pid, host), name="parent-watch", daemon=True).start()
    try:
        if builder is None:
            from ..builders import resolve_builder

            builder = resolve_builder(name, engines=engines)
        model = builder()
        model.load(host.progress)
        traits = session_traits(model)
    except BaseException:  # noqa: BLE001 - reported to the server, which decides what to do
        with contextlib.suppress(Exception):
            host.send((p.LOAD_FAILED, traceback.format_exc()))
        _exit(1)
    host.serve(model)
    with contextlib.suppress(OSError):  # the server is gone: the reader has seen EOF already
        host.send((p.READY, p.dumps(model.info), traits, os.getpid()))
    host.stopped.wait()
    host.shutdown()
    _exit(0)


def session_traits(model: VoiceModel) -> p.Traits:
    """Which :class:`ModelSession` methods the engine overrides.

    Uses the class ``open_session`` is annotated to return when that is a concrete subclass (no
    session is opened: the embedded one creates a Llama per session); otherwise opens and closes
    one probe session.
    """
    cls: type | None = None
    with contextlib.suppress(Exception):
        hinted = typing.get_type_hints(type(model).open_session).get("return")
        if isinstance(hinted, type) and issubclass(hinted, ModelSession) and hinted is not ModelSession:
            cls = hinted
    frame = VADStream.frame_samples
    if cls is None:
        probe = model.open_session()
        cls = type(probe)
        try:
            if cls.new_vad is not ModelSession.new_vad:
                vad = probe.new_vad()
                frame = vad.frame_samples if vad is not None else frame
        finally:
            probe.close()
    return p.Traits(
        has_vad=cls.new_vad is not ModelSession.new_vad,
        custom_talk_boundary=cls.talk_boundary is not ModelSession.talk_boundary,
        custom_decode=cls.decode is not ModelSession.decode,
        vad_frame_samples=frame,
        talks_every_output=bool(cls.talks_every_output),
        # a model may decide it from its settings (omni: live_talker), else the session class does
        talks_live=bool(getattr(model, "talks_live", cls.talks_live)),
    )


class _Entry:
    """One session's state in this worker: the engine session and its VAD streams."""

    __slots__ = ("lock", "session", "vads", "closed", "admitted")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.session: ModelSession | None = None
        self.vads: dict[int, VADStream] = {}
        self.closed = False
        #: counted against max_sessions from admission on, while its engine session opens
        self.admitted = False


class _Stream:
    """Flow control of one streamed call: the producer spends credits, the server returns them."""

    __slots__ = ("cond", "credits", "cancelled")

    def __init__(self, window: int) -> None:
        self.cond = threading.Condition(threading.Lock())
        self.credits = window
        self.cancelled = threading.Event()

    def credit(self, n: int) -> None:
        with self.cond:
            self.credits += n
            self.cond.notify()

    def cancel(self) -> None:
        self.cancelled.set()
        with self.cond:
            self.cond.notify()

    def acquire(self) -> bool:
        """Wait for a credit; False when the call was cancelled meanwhile."""
        with self.cond:
            while self.credits <= 0 and not self.cancelled.is_set():
                self.cond.wait()
            if self.cancelled.is_set():
                return False
            self.credits -= 1
            return True


class WorkerHost:
    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self._send_lock = threading.Lock()
        self._lock = threading.Lock()
        self.model: VoiceModel | None = None
        self._sessions: dict[int, _Entry] = {}
        self._closed_keys: collections.OrderedDict[int, None] = collections.OrderedDict()
        self._streams: dict[int, _Stream] = {}
        self._pool = concurrent.futures.ThreadPoolExecutor(MAX_CALL_THREADS, thread_name_prefix="call")
        self.stopped = threading.Event()
        self.parent_gone = False
        #: calls run on the reader thread itself: one thread hand-off less per call (VAD frames
        #: are ~0.1-0.3 ms of work, 31 per second per session; a cancel waits at most one)
        # per-frame calls answered on the reader thread, in arrival order (VAD, a duplex model hearing)
        self.inline_methods: frozenset[str] = frozenset({"vad", "listen"})

    # -- channel ------------------------------------------------------------------------------
    def start(self) -> None:
        threading.Thread(target=self._read, name="worker-reader", daemon=True).start()

    def serve(self, model: VoiceModel) -> None:
        self.model = model

    def send(self, msg: tuple[Any, ...]) -> None:
        data = p.dumps(msg)
        with self._send_lock:
            self.conn.send_bytes(data)

    def progress(self, text: str) -> None:
        with contextlib.suppress(Exception):
            self.send((p.PROGRESS, str(text)))

    def _read(self) -> None:
        try:
            while True:
                msg = p.loads(self.conn.recv_bytes())
                op = msg[0]
                if op == p.CALL:
                    if msg[3] in self.inline_methods and self._is_open(msg[2]):
                        self._run_call(msg[1], msg[2], msg[3], msg[4])
                    else:
                        self._pool.submit(self._run_call, msg[1], msg[2], msg[3], msg[4])
                elif op == p.STREAM:
                    stream = _Stream(msg[5])
                    with self._lock:
                        self._streams[msg[1]] = stream
                    self._pool.submit(self._run_stream, msg[1], msg[2], msg[3], msg[4], stream)
                elif op == p.CREDIT:
                    stream = self._streams.get(msg[1])
                    if stream is not None:
                        stream.credit(msg[2])
                elif op == p.CANCEL:
                    stream = self._streams.get(msg[1])
                    if stream is not None:
                        stream.cancel()
                elif op == p.OPEN:
                    self._pool.submit(self._open, msg[1])
                elif op == p.PING:
                    self.send((p.RESULT, msg[1], _NONE_BLOB))
                elif op == p.SHUTDOWN:
                    break
        except (EOFError, OSError):
            self.parent_gone = True  # the server is gone (or closed its end): nothing to serve
        except BaseException:  # noqa: BLE001
            traceback.print_exc()
        finally:
            self.stopped.set()
            if self.model is None:
                _exit(0)  # stopped while still loading: nothing to release

    def shutdown(self) -> None:
        """Stop running calls and release the model, bounded (then the process exits anyway)."""
        with self._lock:
            streams = list(self._streams.values())
            entries = list(self._sessions.values())
        for stream in streams:
            stream.cancel()
        if self.parent_gone:
            return  # nobody waits for a clean release; exit now

        def release() -> None:
            for entry in entries:
                with contextlib.suppress(Exception):
                    if entry.session is not None:
                        entry.session.close()
            if self.model is not None:
                with contextlib.suppress(Exception):
                    self.model.close()

        done = threading.Thread(target=release, name="release", daemon=True)
        done.start()
        done.join(2.0)

    # -- sessions -----------------------------------------------------------------------------
    def _is_open(self, key: int) -> bool:
        """The session's engine session is open (a per-frame call on the reader thread cannot
        wait for an open, which may be slow, while every other stream's credits and cancels wait
        behind it: the first call of a session goes to the pool)."""
        with self._lock:
            entry = self._sessions.get(key)
            return entry is not None and entry.session is not None

    def _entry(self, key: int, create: bool) -> _Entry | None:
        with self._lock:
            if key in self._closed_keys:
                raise RuntimeError("model session is closed")
            entry = self._sessions.get(key)
            if entry is None and create:
                entry = self._sessions[key] = _Entry()
            return entry

    def _session(self, key: int) -> tuple[_Entry, ModelSession]:
        entry = self._entry(key, create=True)
        assert entry is not None and self.model is not None
        with entry.lock:
            if entry.closed:
                raise RuntimeError("model session is closed")
            if entry.session is None:
                self._admit(key, entry)
                try:
                    entry.session = self.model.open_session()
                except BaseException:
                    with self._lock:
                        entry.admitted = False
                    raise
            return entry, entry.session

    def _admit(self, key: Any, entry: _Entry) -> None:
        """This worker is the authority on its own capacity: whoever placed a session here
        (a gateway whose count is behind), it never serves more than its model's max_sessions."""
        limit = self.model.info.max_sessions if self.model is not None else None
        if limit is None:
            return
        with self._lock:  # counted and reserved in one step: two opens at once cannot both fit
            serving = sum(1 for other in self._sessions.values() if other is not entry and other.admitted)
            if serving >= limit:
                self._sessions.pop(key, None)  # refused: it holds nothing here
                raise ModelAtCapacity(f"this worker serves {serving} sessions, its most")
            entry.admitted = True

    def _open(self, key: int) -> None:
        with contextlib.suppress(Exception):
            self._session(key)

    def _close(self, key: int) -> None:
        with self._lock:
            self._closed_keys[key] = None
            while len(self._closed_keys) > _CLOSED_MEMORY:
                self._closed_keys.popitem(last=False)
            entry = self._sessions.pop(key, None)
        if entry is None:
            return
        with entry.lock:
            entry.closed = True
            session, entry.session = entry.session, None
            entry.vads.clear()
        if session is not None:
            session.close()

    # -- calls --------------------------------------------------------------------------------
    def _run_call(self, call_id: int, key: int, method: str, blob: bytes) -> None:
        try:
            args = p.loads(blob)
            value = self._dispatch(key, method, args)
            reply = (p.RESULT, call_id, p.dumps(value))
        except BaseException as exc:  # noqa: BLE001 - every failure goes back to its caller
            reply = (p.ERROR, call_id, p.pack_exception(exc), traceback.format_exc())
        with contextlib.suppress(OSError):
            self.send(reply)

    def dispatch(self, key: Any, method: str, args: tuple[Any, ...]) -> Any:
        """Run one call on session ``key`` (opened on first use) and return its value.

        Also the entry point of the Ray actor (:mod:`..placement.actor`), which serves the same
        calls without a pipe."""
        return self._dispatch(key, method, args)

    def stream_items(self, key: Any, method: str, args: tuple[Any, ...], cancelled: threading.Event) -> Iterator[Any]:
        """The engine's iterator for a streamed call (``think``, ``talk``, ``talk_live``) on session ``key``."""
        _entry, session = self._session(key)
        if method == "think":
            (request,) = args
            request.cancelled = cancelled
            return session.think(request)
        if method == "talk":
            segment, voice, final, speed = args
            return session.talk(segment, voice, cancelled, final, speed)
        if method == "talk_live":
            return session.talk_live(cancelled)
        raise ValueError(f"unknown worker stream {method!r}")

    @property
    def live_sessions(self) -> int:
        """Sessions open here (opened by a call or OPEN, not closed yet)."""
        with self._lock:
            return sum(1 for entry in self._sessions.values() if entry.session is not None)

    def open(self, key: Any) -> None:
        """Open session ``key`` now (calls open it lazily too)."""
        self._session(key)

    def close_session(self, key: Any) -> None:
        self._close(key)

    def _dispatch(self, key: int, method: str, args: tuple[Any, ...]) -> Any:
        if method == "vad":
            vad_key, pcm, reset = args
            entry, session = self._session(key)
            vad = entry.vads.get(vad_key)
            if vad is None:
                vad = session.new_vad()
                if vad is None:
                    raise RuntimeError("this model has no VAD")
                entry.vads[vad_key] = vad
            elif reset:
                vad.reset()
            return vad.probabilities(pcm)
        if method == "stats" and key == p.NO_SESSION:
            return self.model.stats()
        if method == "close":
            return self._close(key)
        if method == "confirm":
            entry = self._entry(key, create=False)
            if entry is None or entry.session is None:
                return None  # state from a dead worker: nothing here to cut back
            return entry.session.confirm(*args)
        if method in ("transcribe", "decode", "talk_boundary", "listen", "prefill", "talk_more"):
            _entry, session = self._session(key)
            return getattr(session, method)(*args)
        raise ValueError(f"unknown worker call {method!r}")

    def _run_stream(self, call_id: int, key: int, method: str, blob: bytes, stream: _Stream) -> None:
        items: Iterator[Any] | None = None
        try:
            items = self.stream_items(key, method, p.loads(blob), stream.cancelled)
            for item in items:
                if not stream.acquire():
                    break
                self.send((p.ITEM, call_id, p.dumps(item)))
            reply: tuple[Any, ...] = (p.END, call_id)
        except BaseException as exc:  # noqa: BLE001
            reply = (p.ERROR, call_id, p.pack_exception(exc), traceback.format_exc())
        finally:
            close = getattr(items, "close", None)
            if close is not None:
                with contextlib.suppress(Exception):
                    close()
            with self._lock:
                self._streams.pop(call_id, None)
        with contextlib.suppress(OSError):
            self.send(reply)


_NONE_BLOB = p.dumps(None)


def _die_with_parent(parent_pid: int) -> None:
    """Linux: SIGKILL this process when the spawning thread's process dies."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(Exception):
            libc = ctypes.CDLL(None, use_errno=True)
            PR_SET_PDEATHSIG = 1
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent_pid:  # died before prctl took effect
        _exit(0)


def _watch_parent(parent_pid: int, host: WorkerHost) -> None:
    while not host.stopped.is_set():
        if os.getppid() != parent_pid:
            host.parent_gone = True
            _exit(0)
        time.sleep(1.0)


def _exit(code: int) -> None:
    """Exit without interpreter teardown (an engine thread stuck in native code cannot hang it),
    after multiprocessing's own finalizers: they unlink named semaphores that libraries create
    here (tqdm's lock, via faster-whisper), which the resource tracker would otherwise report as
    leaked when the server exits."""
    with contextlib.suppress(Exception):
        from multiprocessing import util

        util._run_finalizers(0)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)
