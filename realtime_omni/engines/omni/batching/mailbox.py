"""Requests from session threads to one loop thread (a stage's batcher, its prefills, the codec).

A session submits a request and waits for it with a deadline; the loop waits for work, lets the
requests that arrive together meet, runs them and marks each one done (or failed). Requests
announced ahead (:meth:`Mailbox.expect`: the sessions of a prefill batch that just ended) are
waited for a little longer. Closing fails every request still waiting.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from ..streams import DeviceSpans


class Done:
    """A request's completion, set once by the loop (or by a close or withdrawal) and waited for
    by its session: a lock taken at creation and released by :meth:`set`. Every step of every
    session makes one, and ``threading.Event`` (a Python-level condition around a lock) costs
    several times as much to make, set and wait for, under the interpreter lock all sessions share."""

    __slots__ = ("_lock", "_set")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lock.acquire()
        self._set = False

    def is_set(self) -> bool:
        return self._set

    def set(self) -> None:
        if not self._set:
            self._set = True
            try:
                self._lock.release()
            except RuntimeError:  # (two sets at once: one release is enough)
                pass

    def wait(self, timeout: float) -> bool:
        """True once set (at once if it already is), False after ``timeout`` seconds."""
        if self._set:
            return True
        if not self._lock.acquire(timeout=max(0.0, timeout)):
            return self._set
        try:
            self._lock.release()  # (for any other waiter)
        except RuntimeError:
            pass
        return True


class BatcherClosed(RuntimeError):
    """The stage's loop has stopped (the model is closing)."""


class StepWithdrawn(RuntimeError):
    """A queued step was dropped by its session before it ran."""


class Mailbox:
    """Requests from session threads to one loop thread: submit and wait (with a deadline); the
    loop waits for work, lets requests that arrive together meet, and counts what it ran. On
    close every waiting request fails with :class:`BatcherClosed`."""

    name = "batcher"
    step_timeout_s = 60.0
    #: how long the idle loop sleeps between looks at its closing (new work wakes it at once)
    idle_wait_s = 0.5
    #: the latest steps kept in :attr:`timeline`
    timeline_steps = 4096
    #: how long a batch may wait for the requests announced by :meth:`expect` (0: it expects none)
    expect_s = 0.0

    def __init__(self) -> None:
        self._queue: list[Any] = []
        self._cond = threading.Condition()
        self._closed = False
        self.steps = 0
        self.rows = 0
        self.busy_s = 0.0
        #: (start, end, rows) of the latest steps on ``time.perf_counter``'s clock: how the loops
        #: took turns in a burst, which the totals do not show
        self.timeline: deque[tuple[float, float, int]] = deque(maxlen=self.timeline_steps)
        #: (start, launched) of the latest steps: when the host had queued a step's work (a launch
        #: that blocks, the driver waiting for room, shows here and not on the device)
        self.launches: deque[tuple[float, float]] = deque(maxlen=self.timeline_steps)
        self.spans = DeviceSpans(False)  # a loop on CUDA turns it on
        #: slots whose request is on its way (see :meth:`expect`) -> until when to wait for them
        self._expected: dict[int, float] = {}
        self._thread = threading.Thread(target=self._loop, name=f"batch-{self.name}", daemon=True)

    def _start(self) -> None:
        self._thread.start()

    def _submit(self, req: Any) -> Any:
        return self._await(self._enqueue(req))

    def _enqueue(self, req: Any) -> Any:
        with self._cond:
            if self._closed:
                raise BatcherClosed(f"{self.name} batcher is closed")
            self._queue.append(req)
            self._cond.notify_all()
        return req

    def _await(self, req: Any) -> Any:
        if not req.done.wait(self.step_timeout_s):
            with self._cond:  # if it has not started, it never will: nobody reads it any more
                self._queue = [r for r in self._queue if r is not req]
            raise TimeoutError(f"{self.name}: no batched step within {self.step_timeout_s:.0f} s")
        if req.error is not None:
            raise req.error
        assert req.result is not None
        return req.result

    def withdraw(self, reqs: Sequence[Any], wait: bool = True) -> None:
        """Drop requests a session no longer wants: those still queued never run (their waiters
        get :class:`StepWithdrawn`), and this returns once those already in a running batch have
        finished (their writes are done; ``wait=False``: at once)."""
        with self._cond:
            dropped = {id(r) for r in reqs}
            queued = [r for r in self._queue if id(r) in dropped]
            self._queue = [r for r in self._queue if id(r) not in dropped]
        for req in queued:
            req.error = StepWithdrawn(f"{self.name}: step withdrawn")
            req.done.set()
        if not wait:
            return
        end = time.monotonic() + self.step_timeout_s  # one deadline for all of them
        for req in reqs:
            if not req.done.wait(max(0.0, end - time.monotonic())):
                raise TimeoutError(f"{self.name}: a running step did not finish within {self.step_timeout_s:.0f} s")

    def expect(self, slots: Sequence[int], within_s: float = 0.25) -> None:
        """Requests of ``slots`` will come within ``within_s``: a batch that starts meanwhile waits
        for them (up to ``expect_s`` after its first request). The sessions of a burst of turns,
        whose prefills ran in one batch, reach the next step a step or two apart (the first
        batch takes those whose threads came round first); batched apart, their replies stay a
        step apart from then on and take turns at the codec."""
        if self.expect_s <= 0:
            return
        until = time.monotonic() + within_s
        with self._cond:
            for slot in slots:
                self._expected[int(slot)] = until
            self._cond.notify_all()

    def unexpect(self, slot: int) -> None:
        """The request expected of ``slot`` will not come (its reply ended or was cut)."""
        if self._expected:
            with self._cond:
                if self._expected.pop(int(slot), None) is not None:
                    self._cond.notify_all()

    def _expecting(self) -> bool:
        """Under ``_cond``: whether an expected request has neither come nor expired."""
        if not self._expected:
            return False
        now, queued = time.monotonic(), {req.slot for req in self._queue}
        self._expected = {s: t for s, t in self._expected.items() if t > now and s not in queued}
        return bool(self._expected)

    def _await_work(self) -> None:
        """Under ``_cond``: until a request is queued (or the mailbox closes). A loop that reads its
        settings for :meth:`_gathered` reads them after this: an :meth:`expect` made while it
        was idle counts."""
        while not self._queue and not self._closed:
            self._cond.wait(self.idle_wait_s)

    def _gathered(self, gather_s: float, enough: Callable[[int], bool] = lambda _n: False,
                  burst_s: float = 0.0, expecting: Callable[[], bool] = lambda: False) -> bool:
        """Under ``_cond``: wait for work, then up to ``gather_s`` more for others to join (or
        until ``enough(queued)``). With ``burst_s``: each request that joins waits ``gather_s``
        again, up to ``burst_s`` after the first, so a burst whose requests keep coming (turns
        ending together, prepared one after another on their threads) meets in one batch instead
        of leaving its stragglers for the next; while ``expecting()`` (requests known to be on
        their way), the wait lasts the whole burst. False once closed. What was gathered may be
        withdrawn meanwhile: a loop finds its queue empty then (and may hand over held results
        before it waits again)."""
        self._await_work()
        first = time.monotonic()
        deadline, seen = first + gather_s, len(self._queue)
        while not self._closed and not enough(len(self._queue)):
            limit = max(deadline, first + burst_s) if expecting() else deadline
            left = limit - time.monotonic()
            if left <= 0:
                break
            self._cond.wait(left)
            if len(self._queue) > seen:  # someone joined: wait for the next one (within the burst)
                seen = len(self._queue)
                deadline = max(deadline, min(first + burst_s, time.monotonic() + gather_s))
        return not self._closed

    def _count(self, rows: int, started: float) -> float:
        ended = time.perf_counter()
        elapsed = ended - started
        self.timeline.append((started, ended, rows))
        self.steps += 1
        self.rows += rows
        self.busy_s += elapsed
        return elapsed

    def stats(self) -> dict[str, Any]:
        return {"steps": self.steps, "rows": self.rows, "busy_s": self.busy_s,
                "mean_rows": self.rows / self.steps if self.steps else 0.0,
                "device_s": self.spans.seconds, "device_steps": self.spans.count}

    def steps_since(self, since: float) -> list[tuple[float, float, int]]:
        """The kept steps that started at or after ``since`` (``time.perf_counter``)."""
        return [step for step in list(self.timeline) if step[0] >= since]

    def close(self) -> None:
        with self._cond:
            self._closed = True
            pending, self._queue = self._queue, []
            self._cond.notify_all()
        for req in pending:
            req.error = BatcherClosed(f"{self.name} batcher is closed")
            req.done.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def _loop(self) -> None:
        raise NotImplementedError
