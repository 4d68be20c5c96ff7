"""Codec windows of many sessions decoded together.

Each session's codec stream renders windows of codes (left context + new chunk). In steady
streaming most sessions render windows of the same shape (and, for Qwen2.5, the same speaker), so
the :class:`CodecBatcher` gathers the windows pending at the same moment, groups them by shape
key, and decodes each group as one batch. A group of one takes the single-window path (a CUDA
graph when its shape was captured at load); larger groups run eagerly in one pass.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

from ..graphs import ShapeGraphs, on_stream
from .batcher import Mailbox

log = logging.getLogger(__name__)


@dataclass(eq=False)
class WindowRequest:
    key: Hashable
    fn: Callable[..., Any]
    inputs: tuple[Any, ...]  # each with a leading batch axis of 1
    steady: bool
    urgent: bool = False  # the first window of a reply: its listener is waiting for any audio
    done: threading.Event = field(default_factory=threading.Event)
    result: Any = None
    error: BaseException | None = None


class CodecBatcher(Mailbox):
    name = "codec"

    def __init__(self, windows: ShapeGraphs, stream: Any, *, gather_s: float = 0.003,
                 step_timeout_s: float = 60.0) -> None:
        super().__init__()
        self.windows = windows
        self.stream = stream
        self.gather_s = gather_s
        self.step_timeout_s = step_timeout_s
        self._start()

    def run(self, key: Hashable, fn: Callable[..., Any], inputs: tuple[Any, ...], steady: bool,
            urgent: bool = False) -> Any:
        """``fn(*inputs)`` for this window, decoded with the other sessions' windows of the same
        key; returns this window's output (batch axis of 1). ``urgent`` groups go first."""
        return self._submit(WindowRequest(key, fn, tuple(inputs), steady, urgent))

    def _loop(self) -> None:
        while True:
            with self._cond:
                if not self._gathered(self.gather_s):
                    return
                take, self._queue = self._queue, []
            groups: dict[Hashable, list[WindowRequest]] = {}
            for req in take:
                groups.setdefault(req.key, []).append(req)
            # first windows of replies first: their listeners hear nothing yet, the others are
            # still playing earlier chunks
            for group in sorted(groups.values(), key=lambda g: not any(r.urgent for r in g)):
                self._run(group)

    def _run(self, group: list[WindowRequest]) -> None:
        import torch

        started = time.perf_counter()
        try:
            with torch.inference_mode(), on_stream(self.stream):
                first = group[0]
                if len(group) == 1:
                    first.result = self.windows.run(first.key, first.fn, first.inputs, capture=first.steady)
                else:
                    inputs = tuple(torch.cat(parts, dim=0) for parts in zip(*(r.inputs for r in group), strict=True))
                    out = first.fn(*inputs)
                    for b, req in enumerate(group):
                        req.result = out[b : b + 1].clone()
        except BaseException as exc:  # noqa: BLE001 - every waiting session gets the error
            log.exception("omni: batched codec windows failed")
            for req in group:
                req.error = exc
        finally:
            self._count(len(group), started)
            for req in group:
                req.done.set()
