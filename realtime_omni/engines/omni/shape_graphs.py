"""Codec windows as CUDA graphs, one per input shape (:class:`ShapeGraphs`).

A codec window is one fixed-shape run per window length and group of sessions; each shape's
graph is captured while the model loads and replayed afterwards (see :mod:`.graphs`).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any

from .graphs import StepGraph, graphs_available, is_probing


class ShapeGraphs:
    """Graphs of one computation keyed by input shape (codec windows).

    ``run(key, fn, inputs)`` returns ``fn(*inputs)`` (cloned). A key is captured the second time
    it is asked for with ``capture`` set, and only while the model warms up (:func:`probing`):
    a capture puts CUDA's default generator in capture state, so captures are kept away from
    replies running in other threads. Later calls copy ``inputs`` into the captured static
    tensors and replay. At most ``limit`` graphs are kept.

    ``shared_pool``: all shapes capture into one memory pool, so their graphs hold about what the
    largest needs instead of the sum of all; replays are then fenced one after another on the
    device (each clones its outputs before the next may run), whatever stream they come from.
    """

    def __init__(self, *, device: Any, enabled: bool = True, name: str = "window", limit: int = 16,
                 run_stream: Any = None, capture_stream: Any = None, pieces: bool = False,
                 queued: int = 0, shared_pool: bool = False) -> None:
        self.device = device
        self.shared_pool = shared_pool
        self._pool: Any = None
        self._fence: Any = None  # recorded after the last replay's clone (shared_pool)
        #: capture each shape in pieces (see :func:`piece_boundary`), at most ``queued`` of them
        #: on the device at once when replayed (0: all at once; read at each replay)
        self.pieces = pieces
        self.queued = queued
        self.run_stream = run_stream
        self.capture_stream = capture_stream
        self.enabled = enabled and graphs_available(device)
        self.name = name
        self.limit = limit
        self._graphs: OrderedDict[Hashable, tuple[tuple, StepGraph]] = OrderedDict()
        self._seen: set[Hashable] = set()
        self._failed: set[Hashable] = set()
        self._lock = threading.Lock()

    def run(self, key: Hashable, fn: Callable[..., Any], inputs: tuple, capture: bool = True) -> Any:
        if not self.enabled or key in self._failed:
            return fn(*inputs)
        with self._lock:
            entry = self._graphs.get(key)
            if entry is None:
                if not capture or not is_probing():
                    return fn(*inputs)
                if key not in self._seen:
                    self._seen.add(key)
                    return fn(*inputs)
                static = tuple(t.clone() for t in inputs)
                entry = (static, StepGraph(lambda: fn(*static), device=self.device, name=f"{self.name} {key}",
                                           kind=self.name, run_stream=self.run_stream,
                                           capture_stream=self.capture_stream, pieces=self.pieces,
                                           queued=lambda: self.queued, pool=self._shared()))
                self._graphs[key] = entry
                while len(self._graphs) > self.limit:
                    self._graphs.popitem(last=False)
            self._graphs.move_to_end(key)
            static, graph = entry
            if self._fence is not None:  # the last replay's memory is this one's (shared_pool;
                # waiting on a fence not yet recorded returns at once)
                self._current_stream().wait_event(self._fence)
            for dst, src in zip(static, inputs, strict=True):
                dst.copy_(src)
            out = _clone(graph())
            if graph.failed:
                self._failed.add(key)
                self._graphs.pop(key, None)
            elif self._fence is not None and graph.captured:
                self._fence.record()
            return out

    def _shared(self) -> Any:
        """The pool every shape captures into, and its fence (shared_pool); else None (a pool
        per graph, no fence)."""
        if self.shared_pool and self._pool is None:
            import torch

            self._pool, self._fence = torch.cuda.graph_pool_handle(), torch.cuda.Event()
        return self._pool

    def _current_stream(self) -> Any:
        import torch

        return torch.cuda.current_stream(self.device)

    def has(self, key: Hashable) -> bool:
        """Whether ``key`` replays a captured graph."""
        entry = self._graphs.get(key)
        return entry is not None and entry[1].captured

    @property
    def captured(self) -> int:
        return sum(1 for _, graph in self._graphs.values() if graph.captured)

    def captured_keys(self) -> list[Hashable]:
        with self._lock:
            return [key for key, (_, graph) in self._graphs.items() if graph.captured]


def _clone(out: Any) -> Any:
    import torch

    if isinstance(out, torch.Tensor):
        return out.clone()
    if isinstance(out, tuple):
        return tuple(_clone(o) for o in out)
    return out
