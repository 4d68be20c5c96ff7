"""The server's end of one worker's pipe: sends under a lock, one reader thread, calls by id.

A :class:`Channel` lives exactly as long as one worker process. The reader thread routes each
reply to the queue of the call it answers; when the pipe reaches EOF (the worker died, however it
died) every call still pending gets :data:`CRASHED` at once, and the channel refuses new calls.
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from . import protocol as p

log = logging.getLogger(__name__)

#: put into a pending call's queue when its worker dies
CRASHED = (None,)


class ChannelDead(Exception):
    """This channel's worker is gone; the caller may wait for the next one."""


class Call:
    __slots__ = ("id", "queue")

    def __init__(self, call_id: int) -> None:
        self.id = call_id
        self.queue: queue.SimpleQueue[tuple[Any, ...]] = queue.SimpleQueue()


class Channel:
    def __init__(self, conn: Connection, pid: int, on_control: Callable[[tuple[Any, ...] | None], None]) -> None:
        self.conn = conn
        self.pid = pid
        self._on_control = on_control
        self._send_lock = threading.Lock()
        self._lock = threading.Lock()
        self._pending: dict[int, Call] = {}
        self._ids = itertools.count(1)
        self.dead = threading.Event()
        self._reader = threading.Thread(target=self._read, name=f"worker-{pid}-reader", daemon=True)

    def start(self) -> None:
        self._reader.start()

    # -- calls --------------------------------------------------------------------------------
    def open_call(self) -> Call:
        with self._lock:
            if self.dead.is_set():
                raise ChannelDead
            call = Call(next(self._ids))
            self._pending[call.id] = call
            return call

    def forget(self, call: Call) -> None:
        with self._lock:
            self._pending.pop(call.id, None)

    def send(self, msg: tuple[Any, ...]) -> None:
        """Raises :class:`ChannelDead` when the worker is gone."""
        data = p.dumps(msg)
        try:
            with self._send_lock:
                self.conn.send_bytes(data)
        except (OSError, ValueError) as exc:  # BrokenPipe, or our end already closed
            raise ChannelDead from exc

    def post(self, msg: tuple[Any, ...]) -> bool:
        """Best-effort send (control messages); False when the worker is gone."""
        try:
            self.send(msg)
            return True
        except ChannelDead:
            return False

    # -- reader -------------------------------------------------------------------------------
    def _read(self) -> None:
        pending = self._pending
        try:
            while True:
                msg = p.loads(self.conn.recv_bytes())
                op = msg[0]
                if op == p.ITEM:
                    call = pending.get(msg[1])
                    if call is not None:
                        call.queue.put(msg)
                elif op in (p.RESULT, p.END, p.ERROR):
                    with self._lock:
                        call = pending.pop(msg[1], None)
                    if call is not None:
                        call.queue.put(msg)
                else:
                    self._on_control(msg)
        except (EOFError, OSError):
            pass
        except BaseException:  # noqa: BLE001 - a protocol bug: treat the worker as lost
            log.exception("model worker %d: reader failed", self.pid)
        finally:
            self._die()

    def _die(self) -> None:
        with self._lock:
            self.dead.set()
            calls = list(self._pending.values())
            self._pending.clear()
        for call in calls:
            call.queue.put(CRASHED)
        try:
            self._on_control(None)
        finally:
            # under the send lock: no sender may be between its closed-check and its write when
            # the fd number is released (it could be reused by an unrelated open meanwhile)
            with self._send_lock:
                self.conn.close()
