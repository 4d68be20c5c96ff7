"""The loop side of the omni engine's batching: how requests from session threads meet in a batch
(``Mailbox``), on a loop that only records its batches (no model)."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import pytest

pytest.importorskip("torch")

from realtime_omni.engines.omni.batching.mailbox import BatcherClosed, Done, Mailbox  # noqa: E402


@dataclass(eq=False)
class _Request:
    done: Done = field(default_factory=Done)
    result: tuple = ()
    error: BaseException | None = None


class _Recorder(Mailbox):
    """Takes everything gathered as one batch and records its size."""

    name = "recorder"
    step_timeout_s = 5.0

    def __init__(self, gather_s: float, burst_s: float, expected: int = 0) -> None:
        super().__init__()
        self.gather_s, self.burst_s = gather_s, burst_s
        self.expected = expected  # requests known to be on their way (a batch waits for them)
        self.batches: list[int] = []
        self.gathered_s: list[float] = []
        self._start()

    def _loop(self) -> None:
        while True:
            with self._cond:
                began = time.monotonic()
                if not self._gathered(self.gather_s, burst_s=self.burst_s,
                                      expecting=lambda: len(self._queue) < self.expected):
                    return
                self.gathered_s.append(time.monotonic() - began)
                take, self._queue = self._queue, []
            self.batches.append(len(take))
            self._count(len(take), time.perf_counter())
            for req in take:
                req.done.set()


def _arrive(loop: _Recorder, n: int, every_s: float) -> None:
    """``n`` requests, one every ``every_s`` at least, as turns prepared one after another."""
    reqs = []
    for _ in range(n):
        reqs.append(loop._enqueue(_Request()))
        time.sleep(every_s)
    for req in reqs:
        loop._await(req)


@pytest.mark.parametrize("burst_s, batches", [(0.0, "several"), (2.0, "one"), (0.06, "several")])
def test_a_burst_of_requests_that_keep_coming_meets_in_one_batch_up_to_its_bound(burst_s, batches):
    """Twelve requests 10 ms apart (110 ms or more from first to last) against a 50 ms gather:
    alone the gather cuts them into several batches; with a burst bound each arrival waits for
    the next, so they meet in one, unless the bound (60 ms) ends the burst first."""
    loop = _Recorder(gather_s=0.05, burst_s=burst_s)
    try:
        _arrive(loop, 12, 0.01)
        assert sum(loop.batches) == 12
        assert (len(loop.batches) == 1) == (batches == "one"), loop.batches
        assert len(loop.timeline) == len(loop.batches)
    finally:
        loop.close()


def test_a_lone_request_waits_only_the_gather_and_a_closed_loop_refuses_more():
    loop = _Recorder(gather_s=0.02, burst_s=2.0)
    began = time.monotonic()
    _arrive(loop, 1, 0.0)
    assert time.monotonic() - began < 1.0  # the burst bound does not hold up a request alone
    loop.close()
    with pytest.raises(BatcherClosed):
        loop._enqueue(_Request())


def test_a_done_flag_wakes_every_waiter_once_set_and_times_out_while_unset():
    done = Done()
    began = time.monotonic()
    assert done.wait(0.05) is False and not done.is_set()
    assert time.monotonic() - began >= 0.04
    woken: list[bool] = []
    waiters = [threading.Thread(target=lambda: woken.append(done.wait(5.0))) for _ in range(3)]
    for thread in waiters:
        thread.start()
    time.sleep(0.05)
    assert woken == []  # nobody passes before the set
    done.set()
    done.set()  # a second set changes nothing
    for thread in waiters:
        thread.join(5.0)
    assert woken == [True, True, True] and done.is_set()
    assert done.wait(0.0) is True  # set stays set


def test_a_batch_waits_the_whole_burst_for_requests_known_to_be_on_their_way_and_no_longer():
    """Four requests, then (40 ms later, past the 10 ms gather) twelve more that the loop was told
    to expect: one batch of sixteen, which starts once the last has come (not at the burst's end).
    Told nothing, the first four go alone. (The talker's prefill is told which sessions of a
    thinker prefill batch will come.)"""
    for expected, batches in ((16, [16]), (0, [4, 12])):
        loop = _Recorder(gather_s=0.01, burst_s=2.0 if expected else 0.0, expected=expected)
        try:
            first = [loop._enqueue(_Request()) for _ in range(4)]
            time.sleep(0.04)
            late = [loop._enqueue(_Request()) for _ in range(12)]
            for req in first + late:
                loop._await(req)
        finally:
            loop.close()
        assert loop.batches == batches
        if expected:  # it started about 40 ms after the first, far from the 2 s burst
            assert loop.gathered_s[0] < 1.0
