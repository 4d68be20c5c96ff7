"""Codec windows of many sessions decoded together.

Each session's codec stream renders windows of codes (left context + new chunk). In steady
streaming most sessions render windows of the same shape, whatever their speaker (Qwen2.5's
speaker is an input of the window), so the :class:`CodecBatcher` gathers the windows pending at
the same moment, groups them by shape key, and decodes each group as one batch. A group of one
takes the single-window path (a CUDA graph when its shape was captured at load). A larger group
is padded (with copies of its first window) to the next batch bucket whose graph was captured at
load for that key (every window shape of a reply, from the first to the steady one) and replays
it; a small group of a shape captured only alone (a reply's last window) replays that graph
window by window; other groups run eagerly in one pass. Eager codec passes are thousands of
small launches, each taking the interpreter lock the thinker's and the talker's loops also need.

Where a ``mixer`` is set (Qwen2.5, :mod:`..codec_mixing`), windows of several lengths are one
group, decoded in one pass where its cost model says so, and a window or a larger group of a
shape without graphs of its own replays the mixer's graphs (padded to a captured length) instead
of running eagerly; and a reply's first window waits, within the burst, for the first windows of
the replies the talker prefilled with it (:meth:`CodecBatcher.expect_first`).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..shape_graphs import ShapeGraphs
from ..streams import DeviceSpans, on_stream
from .mailbox import Done, Mailbox

log = logging.getLogger(__name__)


@dataclass(eq=False)
class WindowRequest:
    key: Hashable
    fn: Callable[..., Any]
    inputs: tuple[Any, ...]  # each with a leading batch axis of 1
    steady: bool
    #: when its listener needs this window's audio (``time.monotonic``): a reply's first window
    #: now, a later one when playback from the first audio reaches it; inf: no listener waits
    deadline: float = math.inf
    #: the talker slot of the reply whose first window this is (None: a later window)
    owner: int | None = None
    #: when that reply's first window was announced (:meth:`CodecBatcher.expect_first`)
    announced: float | None = None
    #: the reply (its codec stream) this window is of: a pass takes one window of each reply
    reply: Hashable | None = None
    done: Done = field(default_factory=Done)
    result: Any = None
    error: BaseException | None = None


#: batch sizes a group of same-shape windows is padded to (capped by the session slots)
GROUP_BUCKETS = (2, 4, 8, 16, 32)
#: a group without a graph of its own whose shape replays alone: up to this many windows are
#: replayed one by one rather than run eagerly together. An eager pass costs five or more replays
#: of one window (Qwen2.5 on the H200: its DiT alone 682 ms eager, 876-1214 ms for groups of 8-32,
#: the whole window replayed 145 ms; docs/benchmarks/omni-qwen25-codec.md) and holds the
#: interpreter lock for its thousands of launches. A reply's last window is such a shape: its
#: lengths are captured for one window, not for groups.
ALONE_REPLAYS = 4
#: how long an announced first window is waited for at most (a reply cancelled before its first
#: window never sends it)
FIRST_WINDOW_S = 1.0


def _one_per_reply(group: list[WindowRequest]) -> list[WindowRequest]:
    """The windows of ``group`` a pass takes: each reply's earliest. A reply whose next window is
    queued before the one it follows has been read decodes it in the next pass: in this one it
    would only lengthen the pass for everyone else."""
    seen: set[Hashable] = set()
    taken = []
    for req in sorted(group, key=lambda r: r.deadline):
        if req.reply is None or req.reply not in seen:
            taken.append(req)
            if req.reply is not None:
                seen.add(req.reply)
    return taken


class CodecBatcher(Mailbox):
    name = "codec"

    def __init__(self, windows: ShapeGraphs, stream: Any, *, gather_s: float = 0.003,
                 step_timeout_s: float = 60.0, max_rows: int = 64, burst_s: float = 0.0) -> None:
        super().__init__()
        self.windows = windows
        self.stream = stream
        self.gather_s = gather_s
        #: with windows of several lengths decoding together (``mixer``): after a pass, wait
        #: for the windows its sessions send next (each arrival ``gather_s`` more, up to this
        #: long) instead of starting at once on those left queued. A session has one window in
        #: flight, so sessions whose replies started a step apart otherwise take turns: a pass for
        #: one group while the other's windows queue, then the reverse, each pass costing nearly
        #: what one for both would (0: start at once)
        self.burst_s = burst_s
        self.step_timeout_s = step_timeout_s
        self.buckets = tuple(b for b in GROUP_BUCKETS if b <= max(2, max_rows))
        #: pad groups to a bucket even without a captured graph (tests check the padding on CPU)
        self.pad_groups = False
        self.padded_rows = 0  # rows of copies run to fill buckets
        #: windows decoded by a captured graph, and eagerly (a shape or bucket not captured at load)
        self.graph_rows = 0
        self.eager_rows = 0
        self._shapes: dict[Hashable, tuple[Callable[..., Any], tuple[Any, ...]]] = {}
        self.spans = DeviceSpans(stream is not None)
        #: decodes windows of different lengths in one pass (Qwen2.5: ``codec_mixing``); ``mix``
        #: turns it off and on (windows of one shape per pass when off)
        self.mixer: Any = None
        self.mix = True
        #: talker slots of replies whose first window is on its way -> when it was announced
        self._announced: dict[int, float] = {}
        self._start()

    def remember(self, key: Hashable, fn: Callable[..., Any], inputs: tuple[Any, ...]) -> None:
        """While the model warms up: a window shape replies render (see :meth:`capture_groups`)."""
        self._shapes.setdefault(key, (fn, tuple(inputs)))

    def capture_groups(self) -> list[Hashable]:
        """At load (inside :func:`~..graphs.probing`): capture every group bucket of each window
        shape a reply renders (replies that start together render them in step); returns the keys."""
        if not self.windows.enabled or not self._shapes:
            return []
        keys = list(self._shapes)
        import torch

        with torch.inference_mode(), on_stream(self.stream):
            for key in keys:
                fn, inputs = self._shapes[key]
                for size in self.buckets:
                    padded = tuple(t.expand(size, *t.shape[1:]).contiguous() for t in inputs)
                    for _ in range(2):  # a shape is captured on its second use
                        self.windows.run((key, size), fn, padded, capture=True)
        self._shapes.clear()
        return keys

    def run(self, key: Hashable, fn: Callable[..., Any], inputs: tuple[Any, ...], steady: bool,
            deadline: float = math.inf, owner: int | None = None) -> Any:
        """``fn(*inputs)`` for this window, decoded with the other sessions' windows of the same
        key; returns this window's output (batch axis of 1). The group needed soonest (its
        earliest ``deadline``) goes first. ``owner``: the talker slot of the reply whose first
        window this is."""
        return self.receive(self.send(key, fn, inputs, steady, deadline, owner))

    def send(self, key: Hashable, fn: Callable[..., Any], inputs: tuple[Any, ...], steady: bool,
             deadline: float = math.inf, owner: int | None = None, reply: Hashable | None = None) -> WindowRequest:
        """:meth:`run`'s first half: queue the window; :meth:`receive` waits for its output.
        ``reply``: what names the reply the window is of (a reply's next window may be queued
        while the one before waits: it goes in a later pass, not the same one)."""
        return self._enqueue(WindowRequest(key, fn, tuple(inputs), steady, deadline, owner, reply=reply))

    def receive(self, req: WindowRequest) -> Any:
        return self._await(req)

    def drop(self, req: WindowRequest) -> None:
        """A queued window nobody will read (its reply was cut): it never runs. One already in a
        pass finishes there; this does not wait for it. A reader still waiting for a dropped
        window gets :class:`~.mailbox.StepWithdrawn`."""
        self.withdraw([req], wait=False)

    def expect_first(self, owners: Sequence[int]) -> None:
        """The replies of these talker slots have just been prefilled by the talker: their first
        windows follow a first chunk's frames later. Replies that start together reach the codec
        a talker step or two apart (the first decode steps take the sessions whose threads came
        round first); a pass that took only the first comers would keep the others waiting for
        it, their first audio a whole pass later, and the two cohorts taking turns from then on.
        So a pass with a first window waits (up to ``burst_s``) for the first windows announced
        at most ``burst_s`` after its own: those are about as far along."""
        if self.burst_s <= 0:
            return
        now = time.monotonic()
        with self._cond:
            for owner in owners:
                self._announced[int(owner)] = now
            self._cond.notify_all()

    def _enqueue(self, req: WindowRequest) -> WindowRequest:
        if req.owner is not None:
            with self._cond:
                req.announced = self._announced.pop(req.owner, None)
        return super()._enqueue(req)

    def _expecting(self) -> bool:
        """Under ``_cond``: whether a queued first window's peers (announced at most ``burst_s``
        after it, within :data:`FIRST_WINDOW_S`) are still to come."""
        if not self._announced:
            return False
        latest = max((r.announced for r in self._queue if r.announced is not None), default=None)
        if latest is None:
            return False
        now = time.monotonic()
        self._announced = {o: t for o, t in self._announced.items() if now - t < FIRST_WINDOW_S}
        return any(t <= latest + self.burst_s for t in self._announced.values())

    def _loop(self) -> None:
        carried = False  # windows left queued by the last pass: taken at once (mixing: after a burst)
        while True:
            with self._cond:
                self._await_work()
                burst = self.burst_s if self.mixer is not None and self.mix else 0.0
                if not self._gathered(self.gather_s, lambda _n, now=carried and not burst: now, burst,
                                      self._expecting):
                    return
                if not self._queue:  # every window gathered was dropped meanwhile (replies cut)
                    carried = False
                    continue
                groups: dict[Hashable, list[WindowRequest]] = {}
                for req in self._queue:
                    groups.setdefault(self._family(req.key), []).append(req)
                # earliest deadline first: a reply's first window (its listener hears nothing
                # yet), then the windows of replies about to run dry (the second and third
                # chunks, due 160-480 ms after the first audio), before those of replies seconds
                # ahead. One group per pass: the others stay queued, so a window that arrives
                # while this group runs (a new reply's first) is weighed against them, not
                # behind them, and windows of their shape that arrive meanwhile join them.
                group = _one_per_reply(min(groups.values(), key=lambda g: min(r.deadline for r in g)))
                if len({r.key for r in group}) > 1:  # several lengths: those worth one pass
                    group = self.mixer.choose(sorted(group, key=lambda r: r.deadline))
                chosen = {id(r) for r in group}
                self._queue = [r for r in self._queue if id(r) not in chosen]
                carried = bool(self._queue)
            self._run(group)

    def _family(self, key: Hashable) -> Hashable:
        """What a window decodes with: windows of its family (any length), or of its own shape."""
        family = self.mixer.family(key) if self.mixer is not None and self.mix else None
        return key if family is None else family

    def _run(self, group: list[WindowRequest]) -> None:
        import torch

        started = time.perf_counter()
        try:
            with torch.inference_mode(), on_stream(self.stream):
                span = self.spans.begin(self.stream)
                first = group[0]
                if len({req.key for req in group}) > 1:
                    self._run_mixed(group)
                elif len(group) == 1:
                    self._run_one(first)
                else:
                    self._run_group(group)
                self.spans.end(span, self.stream)
                self.launches.append((started, time.perf_counter()))
        except BaseException as exc:  # noqa: BLE001 - every waiting session gets the error
            log.exception("omni: batched codec windows failed")
            for req in group:
                req.error = exc
        finally:
            self._count(len(group), started)
            for req in group:
                req.done.set()

    def _run_mixed(self, group: list[WindowRequest]) -> None:
        """Windows of several lengths (one family): the neediest first, a bucket at a time."""
        top = self.buckets[-1]
        group = sorted(group, key=lambda r: r.deadline)
        for lo in range(0, len(group), top):
            part = group[lo : lo + top]
            if len({req.key for req in part}) == 1:
                self._run_group(part) if len(part) > 1 else self._run_one(part[0])
            else:
                self._mix(part)

    def _mix(self, part: list[WindowRequest]) -> None:
        outputs, replayed = self.mixer.run([req.inputs for req in part], [req.key[-1] for req in part])
        for req, out in zip(part, outputs, strict=True):
            req.result = out
        self._tally(replayed, len(part))

    def _mixes(self, key: Hashable) -> bool:
        """Whether a group of ``key`` without a graph of its own replays the mixer's instead
        (its length padded to a captured one; on the GPU only: elsewhere nothing replays)."""
        return (self.mixer is not None and self.mix and self.windows.enabled
                and self.mixer.family(key) is not None)

    def _run_one(self, req: WindowRequest) -> None:
        """One window: its own graph; else (a length no reply schedule renders: after a replay
        from a barge-in, a gap upstream) the mixer's, padded; else eagerly."""
        own = self.windows.has(req.key)
        if not own and self._mixes(req.key):
            self._mix([req])
            return
        self._tally(own, 1)
        req.result = self.windows.run(req.key, req.fn, req.inputs, capture=req.steady)

    def _run_group(self, group: list[WindowRequest]) -> None:
        import torch

        top = self.buckets[-1]
        if len(group) > top:  # more windows than the largest bucket: a bucket at a time
            for lo in range(0, len(group), top):
                part = group[lo : lo + top]
                if len(part) == 1:
                    self._tally(self.windows.has(part[0].key), 1)
                    part[0].result = self.windows.run(part[0].key, part[0].fn, part[0].inputs, capture=False)
                else:
                    self._run_group(part)
            return
        first = group[0]
        size = next((b for b in self.buckets if b >= len(group)
                     and (self.pad_groups or self.windows.has((first.key, b)))), None)
        if size is None and len(group) <= ALONE_REPLAYS and self.windows.has(first.key):
            for req in group:
                self._tally(True, 1)
                req.result = self.windows.run(req.key, req.fn, req.inputs, capture=False)
            return
        if size is None and self._mixes(first.key):  # (replies that end together: their last windows)
            self._mix(group)
            return
        rows = [r.inputs for r in group]
        if size is not None and size > len(group):
            rows += [first.inputs] * (size - len(group))  # copies of a real window, discarded
            self.padded_rows += size - len(group)
        inputs = tuple(torch.cat(parts, dim=0) for parts in zip(*rows, strict=True))
        self._tally(size is not None and self.windows.has((first.key, size)), len(group))
        out = first.fn(*inputs) if size is None else self.windows.run((first.key, size), first.fn, inputs, capture=False)
        for b, req in enumerate(group):
            req.result = out[b : b + 1].clone()

    def _tally(self, graph: bool, rows: int) -> None:
        if graph:
            self.graph_rows += rows
        else:
            self.eager_rows += rows

    def stats(self) -> dict[str, Any]:
        mixed = self.mixer.stats() if self.mixer is not None else {}
        return {**super().stats(), "graph_rows": self.graph_rows, "eager_rows": self.eager_rows,
                "padded_rows": self.padded_rows, **mixed}
