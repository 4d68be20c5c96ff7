"""The omni engine's CUDA streams: each stage's GPU work on a stream of its own
(:func:`on_stream`), copies other threads may read at once (:func:`settled_copies`), and the
device time of a loop's steps (:class:`DeviceSpans`). Off CUDA every helper runs the work as is.
"""

from __future__ import annotations

import collections
import contextlib
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def on_stream(stream: Any) -> Iterator[None]:
    """Run a stage's GPU work on its own CUDA stream (``None``: as is).

    The thinker, the talker and the codec each get a stream so that their kernels overlap on the
    GPU instead of queueing behind each other on the default stream. Entering waits for work
    already queued on the current stream (inputs made there); leaving waits for the stage's
    work, so what it produced is complete for every other stream and thread.
    """
    if stream is None:
        yield
        return
    import torch

    stream.wait_stream(torch.cuda.current_stream(stream.device))
    try:
        with torch.cuda.stream(stream):
            yield
    finally:
        # also on errors: the caller may free what the stage's queued kernels still use
        stream.synchronize()


def settled_copies(stream: Any, tensors: tuple[Any, ...]) -> tuple[Any, ...]:
    """Own copies of ``tensors`` (views of a step's batch output that the step has finished
    writing), complete when this returns: made on ``stream``, where nothing long is queued, and
    waited for at once (a wait for two small copies, not for a step), so that any stream or
    thread may read them. Copies queued on a busy stage's stream instead would be read unfinished
    by work on other streams (the talker prompt's first rows are built on the session thread's
    stream). ``None``: plain copies."""
    if stream is None:
        return tuple(t.clone() for t in tensors)
    import torch

    with torch.cuda.stream(stream):
        copies = tuple(t.clone() for t in tensors)
        done = torch.cuda.Event(blocking=True) if sleeping_waits.on else None
        if done is not None:
            done.record(stream)
    if done is not None:
        done.synchronize()
    else:
        stream.synchronize()
    return copies


class _SleepingWaits:
    """Whether a session thread's wait for its copies (:func:`settled_copies`, once per reply
    token) sleeps on a blocking event, or spins on its core as ``Stream.synchronize`` does with
    one CUDA context on a many-core host. A spin holds no interpreter lock, but it is the
    thread's CPU time, which the capacity's host term counts as the interpreter's; under load
    the copy queues behind the stages' steps and the spin lasts as long. Process-wide; the
    capacity benchmark compares both (``--sweep ...:sleeping_waits=0``)."""

    on = True


sleeping_waits = _SleepingWaits()


class DeviceSpans:
    """Device time of a loop's steps, from CUDA events recorded around each one, read once both
    have completed (no host sync). Off CUDA it stays at zero."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.seconds = 0.0
        self.count = 0
        self._open: collections.deque[tuple[Any, Any]] = collections.deque(maxlen=4096)

    def begin(self, stream: Any) -> Any:
        if not self.enabled or stream is None:
            return None
        import torch

        event = torch.cuda.Event(enable_timing=True)
        event.record(stream)
        return event

    def end(self, begin: Any, stream: Any) -> None:
        if begin is None:
            return
        import torch

        event = torch.cuda.Event(enable_timing=True)
        event.record(stream)
        self._open.append((begin, event))
        while self._open and self._open[0][1].query():
            start, stop = self._open.popleft()
            self.seconds += start.elapsed_time(stop) / 1000.0
            self.count += 1


def same_device(a: Any, b: Any) -> bool:
    """``cuda`` and ``cuda:0`` are one device (a generator made for ``cuda`` reports ``cuda:0``)."""
    import torch

    a, b = torch.device(a), torch.device(b)
    return a.type == b.type and (a.index or 0) == (b.index or 0)
