"""The omni engine's CUDA streams: each stage's GPU work on a stream of its own
(:func:`on_stream`), writes queued on a busy stage's stream without waiting for it
(:func:`queued_on`, from host rows pinned once: :class:`PinnedRows`), copies other threads may
read at once (:func:`settled_copies`), and the device time of a loop's steps
(:class:`DeviceSpans`). Off CUDA every helper runs the work as is.
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


@contextlib.contextmanager
def queued_on(stream: Any, *device_inputs: Any) -> Iterator[None]:
    """Queue writes to a stage's state on its stream, behind the steps already there, and return
    without waiting for them (``None``: run as is).

    For writes made under a stage's state lock: :func:`on_stream` would wait at exit for every
    step queued on the stream, holding the lock, and so the stage's loop, that long. Stream order
    alone puts the writes before any step queued after them. Host inputs must come through pinned
    memory kept until their copy has run (:class:`PinnedRows`, or the caching host allocator's
    blocks); ``device_inputs`` made on other streams are kept from reuse until the stream has read
    them.
    """
    if stream is None:
        yield
        return
    import torch

    stream.wait_stream(torch.cuda.current_stream(stream.device))
    for tensor in device_inputs:
        if tensor is not None:
            tensor.record_stream(stream)
    with torch.cuda.stream(stream):
        yield


class PinnedRows:
    """A bool mask row per slot on the host, pinned once on CUDA, to stage a slot's mask for a
    copy queued on a stage's stream (:func:`queued_on`): staging allocates nothing (pinning
    memory on demand costs a driver call, slow when dozens of replies start at once), and the
    pinned row lets the copy queue without waiting. A row is rewritten only once its last copy
    has run (a reply ago, as a rule: the wait is for a copy long done)."""

    def __init__(self, slots: int, width: int, device: Any) -> None:
        import torch

        self.cuda = torch.device(device).type == "cuda"
        self.rows = torch.zeros((slots, width), dtype=torch.bool, pin_memory=self.cuda)
        self._copied: dict[int, Any] = {}

    def stage(self, slot: int, ids: Any) -> None:
        """Row ``slot``: True at ``ids`` (those in range), False elsewhere. Outside any lock: it
        may wait for the row's last copy."""
        import numpy as np

        row = self._writable(slot)
        row[:] = False
        picked = np.fromiter((i for i in ids if 0 <= i < row.shape[0]), dtype=np.int64)
        row[picked] = True

    def stage_mask(self, slot: int, mask: Any) -> None:
        """Row ``slot``: ``mask`` (a bool array of the row's width). Outside any lock, as
        :meth:`stage`."""
        self._writable(slot)[:] = mask

    def _writable(self, slot: int) -> Any:
        """Row ``slot`` as a numpy view, once its last copy has run."""
        done = self._copied.pop(slot, None)
        if done is not None:
            done.synchronize()
        return self.rows[slot].numpy()

    def copy_to(self, target: Any, slot: int) -> None:
        """Queue the copy of row ``slot`` into ``target`` on the current stream."""
        import torch

        target.copy_(self.rows[slot], non_blocking=self.cuda)
        if self.cuda:
            event = torch.cuda.Event()
            event.record()
            self._copied[slot] = event


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
