"""Spawns the worker process, watches it, restarts it when it dies, and stops it on close.

One long-lived supervisor thread owns the worker process from spawn to reap. It must be the
thread that spawns: on Linux the worker asks for ``PR_SET_PDEATHSIG``, which fires when the
*thread* that forked it exits, so a worker spawned from a short-lived thread (a thread pool's)
would be killed with it.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from ..base import ModelInfo, VoiceModel
from ..settings import EngineSettings
from . import protocol as p
from .channel import Channel
from .process import worker_main

log = logging.getLogger(__name__)

_POLL_S = 0.1  # the supervisor thread's own wake-up period (never the event loop's)


class Supervisor:
    def __init__(
        self,
        name: str,
        builder: Callable[[], VoiceModel] | None = None,
        engines: EngineSettings | None = None,
        *,
        shutdown_grace_s: float = 3.0,
        max_backoff_s: float = 30.0,
    ) -> None:
        self.name = name
        self.builder = builder
        #: handed to every (re)started worker: a worker's settings never come from its environment
        self.engines = engines
        self.shutdown_grace_s = shutdown_grace_s
        self.max_backoff_s = max_backoff_s
        self._ctx = multiprocessing.get_context("spawn")
        self._cond = threading.Condition()
        self._channel: Channel | None = None  # the ready worker's, None while down
        self._process: multiprocessing.process.BaseProcess | None = None
        self._closing = False
        self._thread: threading.Thread | None = None
        self._progress: Callable[[str], None] = lambda _msg: None
        self._first: dict[str, Any] = {}  # the first load's outcome
        self._first_done = threading.Event()
        #: a restarted worker that does not report READY within this is killed and started again
        self._load_timeout_s = 600.0
        self.info: ModelInfo | None = None
        self.traits: p.Traits | None = None
        self.restarts = 0
        #: seconds the last (re)start took from spawn to READY
        self.last_start_s: float | None = None
        #: monotonic time of the last crash seen, and how long its restart took until READY
        self.last_crash_at: float | None = None
        self.last_restart_s: float | None = None

    # -- public -------------------------------------------------------------------------------
    def start(self, progress: Callable[[str], None], timeout: float) -> None:
        """Spawn the worker and wait for its first load; raises if that load fails."""
        with self._cond:
            if self._thread is not None:
                raise RuntimeError("worker already started")
            self._progress = progress
            self._load_timeout_s = timeout
            self._thread = threading.Thread(target=self._run, name=f"worker-{self.name}-supervisor", daemon=True)
            self._thread.start()
        if not self._first_done.wait(timeout):
            self.close()
            raise p.WorkerUnavailable(f"model {self.name!r} did not load within {timeout:.0f} s")
        if "error" in self._first:
            self.close()
            raise RuntimeError(f"model {self.name!r} failed to load in its worker:\n{self._first['error']}")

    def channel(self, timeout: float) -> Channel:
        """The ready worker's channel, waiting up to ``timeout`` s while it (re)starts."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                if self._closing:
                    raise p.WorkerClosed(f"model {self.name!r} is closed")
                channel = self._channel
                if channel is not None and not channel.dead.is_set():
                    return channel
                left = deadline - time.monotonic()
                if left <= 0:
                    raise p.WorkerUnavailable(f"model {self.name!r} worker is not up (restarting?)")
                self._cond.wait(left)

    def current(self) -> Channel | None:
        """The ready worker's channel now, or None (never waits)."""
        channel = self._channel
        return channel if channel is not None and not channel.dead.is_set() else None

    @property
    def ready(self) -> bool:
        return self.current() is not None

    @property
    def closing(self) -> bool:
        return self._closing

    @property
    def pid(self) -> int | None:
        process = self._process
        return process.pid if process is not None else None

    def wait_ready(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        with self._cond:
            while self.current() is None and not self._closing:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
            return self.current() is not None

    def close(self) -> None:
        """Stop the worker (SHUTDOWN, then SIGTERM, then SIGKILL) and reap it; idempotent."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(self.shutdown_grace_s + 10.0)

    # -- the supervisor thread ----------------------------------------------------------------
    def _run(self) -> None:
        process: multiprocessing.process.BaseProcess | None = None
        channel: Channel | None = None
        failures = 0  # consecutive short-lived workers, for the restart backoff
        try:
            while not self._closing:
                started = time.monotonic()
                process, channel, control = self._spawn()
                outcome = self._await_load(control, started + self._load_timeout_s)
                if outcome[0] == "ready":
                    _, info, traits = outcome
                    self.last_start_s = time.monotonic() - started
                    if self.last_crash_at is not None:
                        self.last_restart_s = time.monotonic() - self.last_crash_at
                    with self._cond:
                        self.info, self.traits = info, traits
                        self._channel = channel
                        self._cond.notify_all()
                    log.info("model %s: worker pid %d ready in %.1f s", self.name, process.pid, self.last_start_s)
                    if not self._first_done.is_set():
                        self._first_done.set()
                    while not channel.dead.wait(_POLL_S) and not self._closing:
                        pass
                    with self._cond:
                        self._channel = None
                        self._cond.notify_all()
                elif outcome[0] == "failed" and not self._first_done.is_set():
                    self._first["error"] = outcome[1]
                    self._first_done.set()
                    return  # a model that cannot load at all is not restarted
                elif outcome[0] == "failed":
                    log.error("model %s: worker failed to reload:\n%s", self.name, outcome[1])
                elif outcome[0] == "hung":
                    log.error("model %s: worker pid %d did not load within %.0f s; killing it", self.name,
                              process.pid, self._load_timeout_s)
                    process.kill()  # reaped below, and another started
                if self._closing:
                    return
                # the worker died (or failed to reload): reap it and start another
                self.last_crash_at = time.monotonic()
                self._reap(process, 5.0)
                log.error(
                    "model %s: worker pid %d exited (code %s); restarting",
                    self.name, process.pid, process.exitcode,
                )
                failures = failures + 1 if time.monotonic() - started < 30.0 else 0
                if not self._first_done.is_set():  # died while loading the first time
                    self._first["error"] = f"worker exited with code {process.exitcode} while loading"
                    self._first_done.set()
                    return
                if failures > 1 and self._sleep(min(0.5 * 2 ** (failures - 2), self.max_backoff_s)):
                    return
                self.restarts += 1
        except BaseException:  # noqa: BLE001
            log.exception("model %s: supervisor failed", self.name)
            self._first.setdefault("error", "supervisor failed")
            self._first_done.set()
        finally:
            with self._cond:
                self._closing = True  # no one waits for a worker that will not come
                self._channel = None
                self._cond.notify_all()
            if process is not None:
                self._stop(process, channel)

    def _spawn(self) -> tuple[multiprocessing.process.BaseProcess, Channel, queue.SimpleQueue[Any]]:
        control: queue.SimpleQueue[Any] = queue.SimpleQueue()
        ours, theirs = self._ctx.Pipe(duplex=True)
        process = self._ctx.Process(
            target=worker_main,
            args=(theirs, self.name, self.builder, os.getpid(), self.engines),
            name=f"model-worker-{self.name}",
            daemon=True,
        )
        process.start()
        theirs.close()  # only the worker holds its end now: its death is our EOF
        assert process.pid is not None
        with self._cond:
            self._process = process
        channel = Channel(ours, process.pid, control.put)
        channel.start()
        return process, channel, control

    def _await_load(self, control: queue.SimpleQueue[Any], deadline: float) -> tuple[Any, ...]:
        while True:
            try:
                msg = control.get(timeout=_POLL_S)
            except queue.Empty:
                if self._closing:
                    return ("closing",)
                if time.monotonic() > deadline and self._first_done.is_set():  # a restart that hangs
                    return ("hung",)
                continue
            if msg is None:
                return ("died",)
            if msg[0] == p.PROGRESS:
                try:
                    self._progress(msg[1])
                except Exception:  # noqa: BLE001
                    log.exception("progress callback failed")
            elif msg[0] == p.READY:
                return ("ready", p.loads(msg[1]), msg[2])
            elif msg[0] == p.LOAD_FAILED:
                return ("failed", msg[1])

    def _sleep(self, seconds: float) -> bool:
        """Backoff between restarts; True when closing interrupted it."""
        deadline = time.monotonic() + seconds
        with self._cond:
            while not self._closing:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
        return True

    def _reap(self, process: multiprocessing.process.BaseProcess, timeout: float) -> None:
        process.join(timeout)
        if process.exitcode is None:
            process.kill()
            process.join()

    def _stop(self, process: multiprocessing.process.BaseProcess, channel: Channel | None) -> None:
        if process.exitcode is None and channel is not None:
            channel.post((p.SHUTDOWN,))
            process.join(self.shutdown_grace_s)
        if process.exitcode is None:
            process.terminate()
            process.join(2.0)
        if process.exitcode is None:
            process.kill()
            process.join()
        else:
            process.join()
        if channel is not None:
            channel.dead.wait(1.0)  # the reader sees EOF and fails what was pending
