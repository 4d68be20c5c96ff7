"""The model worker as a Ray actor: one loaded :class:`VoiceModel` serving many sessions.

:class:`ModelWorker` is a plain class; :mod:`.model` turns it into a Ray actor (threaded, with
``max_concurrency`` calls at once) and places one per node or GPU. It serves the same calls as the
local worker process (:class:`~..worker.process.WorkerHost` does the work; no pipe here): session
state lives under a key chosen by the gateway, sessions open lazily at their first call, and
every engine error travels back as a picklable blob so the gateway re-raises the engine's own
exception. Streamed calls (``think``, ``talk``) are Ray streaming generators: one actor call per
response stage, items flow back as they are made, with Ray's backpressure bounding what is in
flight, so media never costs one actor call per audio frame.

Imports nothing from Ray at module level: the gateway imports this module only when placement is
on, and the actor process gets Ray from its own runtime.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from typing import Any

from ..base import VoiceModel
from ..settings import EngineSettings
from ..worker import protocol as p
from ..worker.process import WorkerHost, session_traits

log = logging.getLogger(__name__)

#: messages of a streamed call (first element of each item the generator yields); ITEM only
#: travels inside the actor, between the engine's thread and the generator
ITEM, ITEMS, END, ERROR = "item", "items", "end", "error"


def _put(q: queue.Queue[tuple[Any, ...]], msg: tuple[Any, ...], cancelled: threading.Event | None) -> bool:
    """Put into a bounded queue, giving up (False) when ``cancelled`` is set meanwhile."""
    while True:
        try:
            q.put(msg, timeout=0.05)
            return True
        except queue.Full:
            if cancelled is not None and cancelled.is_set():
                return False


class ModelWorker:
    """Loads the model named ``name`` (or built by ``builder``) and serves session calls.

    ``engines`` travels with the actor's arguments: a node's environment configures nothing."""

    def __init__(
        self, name: str, builder: Callable[[], VoiceModel] | None, worker_id: str, engines: EngineSettings | None = None
    ) -> None:
        started = time.monotonic()
        self.worker_id = worker_id
        if builder is None:
            from ..builders import resolve_builder

            builder = resolve_builder(name, engines=engines)
        model = builder()
        model.load(lambda msg: log.info("[%s] %s", name, msg))
        self.model = model
        self.traits = session_traits(model)
        self.host = WorkerHost(None)  # type: ignore[arg-type]  # no pipe: the actor is the channel
        self.host.serve(model)
        self._streams: dict[str, threading.Event] = {}
        self._lock = threading.Lock()
        self.load_s = time.monotonic() - started

    # -- placement --------------------------------------------------------------------------------
    def describe(self) -> dict[str, Any]:
        """What the gateway needs once: the model's info and session traits, where this runs."""
        node_id = ""
        with contextlib.suppress(Exception):
            import ray

            node_id = ray.get_runtime_context().get_node_id()
        return {"info": p.dumps(self.model.info), "traits": self.traits, "pid": os.getpid(),
                "node_id": node_id, "worker_id": self.worker_id, "load_s": self.load_s}

    def load_report(self) -> tuple[int, int | None]:
        """(sessions open here, sessions this worker serves at most; None: no limit)."""
        return self.host.live_sessions, self.model.info.max_sessions

    def open(self, key: str) -> tuple[int, int | None]:
        with contextlib.suppress(Exception):
            self.host.open(key)
        return self.load_report()

    def close(self, key: str) -> tuple[int, int | None]:
        with contextlib.suppress(Exception):
            self.host.close_session(key)
        return self.load_report()

    # -- calls ------------------------------------------------------------------------------------
    def call(self, key: str, method: str, blob: bytes) -> tuple[bool, bytes, str]:
        """(True, value) or (False, exception, traceback text): engine errors are replies."""
        try:
            return True, p.dumps(self.host.dispatch(key, method, p.loads(blob))), ""
        except BaseException as exc:  # noqa: BLE001 - every failure goes back to its caller
            return False, p.pack_exception(exc), traceback.format_exc()

    def stream(self, stream_id: str, key: str, method: str, blob: bytes,
               window: int = 8) -> Iterator[tuple[Any, ...]]:
        """A streaming generator: ``(ITEMS, [blob, ...])*`` then ``(END,)`` or ``(ERROR, exc, tb)``.

        The engine runs in a thread of its own ahead of this generator by at most ``window``
        items; each yield carries every item made since the last one, so a consumer that keeps
        up gets one item per object and one that falls behind catches up in larger objects (a
        Ray object costs about as much CPU whatever its size, measured at ~1.4 ms)."""
        cancelled = threading.Event()
        with self._lock:
            self._streams[stream_id] = cancelled
        made: queue.Queue[tuple[Any, ...]] = queue.Queue(maxsize=max(1, window))

        def produce() -> None:
            items: Iterator[Any] | None = None
            try:
                items = self.host.stream_items(key, method, p.loads(blob), cancelled)
                for item in items:
                    if cancelled.is_set() or not _put(made, (ITEM, p.dumps(item)), cancelled):
                        break
                final: tuple[Any, ...] = (END,)
            except BaseException as exc:  # noqa: BLE001
                final = (ERROR, p.pack_exception(exc), traceback.format_exc())
            finally:
                close = getattr(items, "close", None)
                if close is not None:
                    with contextlib.suppress(Exception):
                        close()
            _put(made, final, None)

        producer = threading.Thread(target=produce, name=f"stream-{stream_id[:8]}", daemon=True)
        producer.start()
        try:
            while True:
                batch: list[bytes] = []
                msg = made.get()
                while True:
                    if msg[0] != ITEM:
                        if batch:
                            yield (ITEMS, batch)
                        yield msg
                        return
                    batch.append(msg[1])
                    try:
                        msg = made.get_nowait()
                    except queue.Empty:
                        break
                yield (ITEMS, batch)
        finally:
            cancelled.set()  # the consumer went away (or the stream ended): stop the engine
            with self._lock:
                self._streams.pop(stream_id, None)

    def cancel(self, stream_id: str) -> None:
        """Stop a streamed call at the engine's next step (engines poll their cancel Event)."""
        with self._lock:
            event = self._streams.get(stream_id)
        if event is not None:
            event.set()

    def open_streams(self) -> int:
        """Streamed calls running here now (tests: a cancelled reply must stop its engine)."""
        with self._lock:
            return len(self._streams)

    def ping(self) -> int:
        return os.getpid()
