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


class _Mixer:
    """Every window one family, decoded in one pass that records the windows' owners."""

    def __init__(self, passes: list[list[int]]) -> None:
        self.passes = passes

    def family(self, key):
        return "all"

    def choose(self, group):
        return list(group)

    def run(self, inputs, lengths):
        self.passes.append(sorted(lengths))
        return [x for x, in inputs], False


def _codec(burst_s: float = 0.3):
    import torch

    from realtime_omni.engines.omni.batching.codec_windows import CodecBatcher
    from realtime_omni.engines.omni.shape_graphs import ShapeGraphs

    passes: list[list[int]] = []
    batcher = CodecBatcher(ShapeGraphs(device=torch.device("cpu")), None, gather_s=0.005, burst_s=burst_s)
    batcher.mixer = _Mixer(passes)

    def send(owner: int) -> threading.Thread:
        def alone(x):  # a window that finds no other in its pass decodes alone
            passes.append([owner])
            return x

        th = threading.Thread(target=batcher.run, args=(("w", owner), alone, (torch.zeros(1, 2),), False,
                                                        time.monotonic(), owner))
        th.start()
        return th

    return batcher, passes, send


@pytest.mark.parametrize("announced", [True, False], ids=["announced", "unannounced"])
def test_a_first_codec_window_waits_for_the_first_windows_announced_with_it(announced):
    """Replies whose talker prefills finished together (``expect_first``) send their first
    windows a talker step or two apart: the first one waits for the others (within the burst)
    and all decode in one pass. Unannounced, the first goes alone after the short gather."""
    batcher, passes, send = _codec()
    try:
        if announced:
            batcher.expect_first([1, 2])
        threads = [send(1)]
        time.sleep(0.1)  # a few talker steps later
        threads.append(send(2))
        for th in threads:
            th.join(5)
    finally:
        batcher.close()
    assert passes == ([[1, 2]] if announced else [[1], [2]])
    assert not batcher._announced


def test_a_first_codec_window_waits_only_for_peers_and_never_past_its_burst():
    """A reply announced a burst after the queued one is not its peer (its window comes that much
    later), nor is one announced so long ago that it must have been cancelled; and however many
    peers stay away, the wait ends with the burst."""
    from realtime_omni.engines.omni.batching import codec_windows

    batcher, passes, send = _codec(burst_s=0.2)
    try:
        batcher.expect_first([1])
        with batcher._cond:
            batcher._announced[7] = time.monotonic() - codec_windows.FIRST_WINDOW_S  # lapsed
            batcher._announced[8] = time.monotonic() + 0.5  # a later reply's
        began = time.monotonic()
        send(1).join(5)
        assert time.monotonic() - began < 0.15 and passes == [[1]]
        assert 7 not in batcher._announced and 8 in batcher._announced
        batcher.expect_first([2, 3])  # a peer that never comes: the wait is the burst's
        began = time.monotonic()
        send(2).join(5)
        assert 0.15 < time.monotonic() - began < 1.0 and passes == [[1], [2]]
    finally:
        batcher.close()


def test_without_a_burst_the_codec_expects_no_first_window():
    batcher, passes, send = _codec(burst_s=0.0)
    try:
        batcher.expect_first([1, 2])
        assert not batcher._announced
        began = time.monotonic()
        send(1).join(5)
        assert time.monotonic() - began < 0.15 and passes == [[1]]
    finally:
        batcher.close()


def test_a_dropped_codec_window_never_runs_and_the_loop_goes_on():
    """A window dropped while the codec gathers (its reply was cut) never decodes, its reader
    hears so at once, and the loop, left with nothing gathered, serves the next window."""
    import torch

    from realtime_omni.engines.omni.batching.mailbox import StepWithdrawn

    batcher, passes, send = _codec(burst_s=0.3)
    try:
        batcher.expect_first([1, 2])  # the loop waits for reply 2's first window meanwhile
        req = batcher.send(("w", 1), lambda x: (passes.append(["dropped"]), x)[1], (torch.zeros(1, 2),), False,
                           time.monotonic(), 1)
        time.sleep(0.05)
        batcher.drop(req)
        began = time.monotonic()
        with pytest.raises(StepWithdrawn):
            batcher.receive(req)
        assert time.monotonic() - began < 1.0
        time.sleep(0.4)  # past the burst: the loop ends its gathering with nothing queued
        send(3).join(5)
        assert batcher._thread.is_alive()
    finally:
        batcher.close()
    assert passes == [[3]]


def test_a_codec_pass_takes_one_window_of_each_reply():
    """A reply's next window, queued while the one before is decoded or read, waits for the next
    pass: in this one it would only lengthen the pass for the others. Windows of no named reply
    all go."""
    from realtime_omni.engines.omni.batching.codec_windows import WindowRequest, _one_per_reply

    def window(deadline: float, reply: str | None) -> WindowRequest:
        return WindowRequest(("w", 8), lambda x: x, (), False, deadline, reply=reply)

    a1, a2, b1, b2 = window(1.0, "a"), window(2.0, "a"), window(1.5, "b"), window(0.5, "b")
    loose = [window(3.0, None), window(3.0, None)]
    assert _one_per_reply([a2, b1, a1, *loose, b2]) == [b2, a1, *loose]
