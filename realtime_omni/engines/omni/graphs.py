"""CUDA graphs for the omni engine's fixed-shape steps.

A decode step of the thinker or the talker, a code-predictor frame and a codec window are each
a fixed-shape run of hundreds of small kernels. Launched one by one from Python they are bound
by launch cost and by the GIL that the three stage threads share, not by the GPU. A captured
graph replays the whole run with one launch.

Off CUDA (tests, CPU serving) or with graphs turned off, the very same step function runs
eagerly, so the code that the CPU tests check is the code that is captured. A step that cannot
be captured (a host sync inside, an unsupported kernel) is logged once and runs eagerly.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import traceback
from collections.abc import Callable, Iterator
from typing import Any

log = logging.getLogger(__name__)

#: per process: kind of step → whether it proved free of host syncs (see :func:`probing`)
_verdicts: dict[str, bool] = {}
_probing = threading.local()
_CAPTURE_LOCK = threading.RLock()


@contextlib.contextmanager
def probing() -> Iterator[None]:
    """Captures made inside this block first run their step once with CUDA's sync debugging set
    to raise, and remember per kind whether it passed; kinds that failed stay eager for good.

    A capture puts CUDA's default generator in capture state (a capture that fails half-way can
    leave it there), so steps are checked before they are captured, codec windows are captured
    only in here, and sampling always draws from per-session generators. The check flips a
    process-wide CUDA setting, so it runs only where nothing else uses the GPU: once, while the
    model loads.
    """
    _probing.on = True
    try:
        yield
    finally:
        _probing.on = False


def is_probing() -> bool:
    """Whether this thread is inside :func:`probing` (the model is warming up)."""
    return bool(getattr(_probing, "on", False))


def verdicts() -> dict[str, bool]:
    return dict(_verdicts)


_pieces = threading.local()


def piece_boundary() -> None:
    """Where a step captured in pieces (``StepGraph(pieces=True)``) ends one graph and begins the
    next; elsewhere (eager runs, steps captured whole) nothing happens. A codec pass captured
    whole queues thousands of kernels at once, and while they fill the device's queue the
    thinker's and talker's launches wait (up to 62 ms, Qwen2.5 on the H100), for passes of 2
    windows as for 16; the same pieces all queued at once hold them as long. A few queued at a
    time, their launches return within 15 ms (docs/benchmarks/omni-codec-pieces.md)."""
    split = getattr(_pieces, "split", None)
    if split is not None:
        split()


def _host_sync_in(step: Callable[[], Any]) -> str | None:
    """Run ``step`` with host syncs turned into errors; the offending frames, or None."""
    import torch

    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        step()
        return None
    except RuntimeError as exc:
        frames = [f for f in traceback.extract_tb(exc.__traceback__) if "/torch/" not in f.filename]
        where = " <- ".join(f"{f.filename.rsplit('/', 2)[-1]}:{f.lineno} {f.line}" for f in reversed(frames[-4:]))
        return f"{exc} at {where}"
    finally:
        torch.cuda.set_sync_debug_mode(0)


def pool_bytes(segments: list[dict[str, Any]]) -> int:
    """Bytes of the allocator's segments (``torch.cuda.memory_snapshot()``) that belong to CUDA
    graphs' private pools (a pool id other than ``(0, 0)``)."""
    return sum(int(seg.get("total_size", 0)) for seg in segments
               if tuple(seg.get("segment_pool_id", (0, 0))) != (0, 0))


def memory_line(device: Any) -> str | None:
    """What the load reports of the GPU's memory once every graph is captured (None off CUDA)."""
    import torch

    if not graphs_available(device):
        return None
    gib = 2**30
    pools = pool_bytes(torch.cuda.memory_snapshot())
    total = torch.cuda.get_device_properties(device).total_memory
    return (f"GPU memory after the load: {torch.cuda.memory_allocated(device) / gib:.1f} GiB allocated, "
            f"{torch.cuda.memory_reserved(device) / gib:.1f} GiB reserved of {total / gib:.1f} GiB, "
            f"{pools / gib:.2f} GiB of it in CUDA graph pools")


def graphs_available(device: Any) -> bool:
    import torch

    return torch.device(device).type == "cuda" and torch.cuda.is_available()


class StepGraph:
    """``step()`` reads static input tensors (owned by the caller, refreshed with ``copy_``/
    ``fill_`` before each call) and returns output tensors. The first call captures it; later
    calls replay. Outputs are the graph's own buffers: copy what must outlive the next call.

    ``save``/``restore`` undo the side effects of the eager warm-up runs (KV-cache lengths).
    """

    def __init__(self, step: Callable[[], Any], *, device: Any, enabled: bool = True, name: str = "step",
                 kind: str | None = None, save: Callable[[], Any] | None = None,
                 restore: Callable[[Any], None] | None = None, warmup: int = 2,
                 run_stream: Any = None, capture_stream: Any = None, pool: Any = None, pieces: bool = False,
                 queued: Callable[[], int] = lambda: 0) -> None:
        self.step = step
        self.device = device
        self.enabled = enabled and graphs_available(device)
        self.name = name
        self.kind = kind or name
        # One capture stream per stage: cuBLAS keeps a workspace per stream and bakes it into
        # the graph, so graphs of stages that replay concurrently must not share one (they did
        # on torch's default capture stream, and split-K GEMMs deadlocked on it).
        self.capture_stream = capture_stream
        # warm-ups run where the stage's replays run, so they never overlap one (on the capture
        # stream they would share the captured graphs' cuBLAS workspace)
        self.run_stream = run_stream
        self.save = save
        self.restore = restore
        self.warmup = warmup
        # graphs that never replay at the same time (one stage's buckets) may share their memory
        self.pool = pool
        #: capture as several graphs, split where the step calls :func:`piece_boundary`, and
        #: replay them with at most ``queued()`` on the device at once (0: all at once)
        self.pieces = pieces
        self.queued = queued
        self.graph: Any = None
        self.graphs: list[Any] = []
        self._events: list[Any] = []
        self.outputs: Any = None
        self.failed = False

    @property
    def captured(self) -> bool:
        return self.graph is not None

    def __call__(self) -> Any:
        self.ensure_captured()
        if len(self.graphs) > 1:
            self._replay_pieces()
            return self.outputs
        if self.graph is not None:
            self.graph.replay()
            return self.outputs
        return self.step()

    def _replay_pieces(self) -> None:
        """Each piece in turn; past ``queued()`` pieces on the device, wait for the oldest (the
        wait lets go of the interpreter, as a replay does)."""
        import torch

        depth = self.queued()
        if depth > 0 and len(self._events) < len(self.graphs):
            self._events = [torch.cuda.Event() for _ in self.graphs]
        for i, graph in enumerate(self.graphs):
            if depth > 0 and i >= depth:
                self._events[i - depth].synchronize()
            graph.replay()
            if depth > 0:
                self._events[i].record()

    def ensure_captured(self) -> None:
        if self.enabled and self.graph is None and not self.failed:
            self.capture()

    def capture(self) -> bool:
        with _CAPTURE_LOCK:  # one capture at a time in the process (sessions open concurrently)
            return self._capture()

    def _capture(self) -> bool:
        import torch

        if _verdicts.get(self.kind) is False:
            self.failed = True
            return False
        state = self.save() if self.save is not None else None
        if getattr(_probing, "on", False) and self.kind not in _verdicts:
            self.step()  # lazy set-up (cache allocation) happens once, outside the check
            if self.restore is not None:
                self.restore(state)
            problem = _host_sync_in(self.step)
            if self.restore is not None:
                self.restore(state)
            _verdicts[self.kind] = problem is None
            if problem is not None:
                self.failed = True
                log.warning("omni: %s stays eager, it syncs with the host: %s", self.kind, problem)
                return False
        try:
            side = self.run_stream or torch.cuda.Stream(self.device)
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side):
                for _ in range(self.warmup):
                    self.step()
                    if self.restore is not None:
                        self.restore(state)
            torch.cuda.current_stream(self.device).wait_stream(side)
            graphs, outputs = self._capture_graphs()
            self.graph, self.graphs, self.outputs = graphs[0], graphs, outputs
            return True
        except Exception as exc:  # noqa: BLE001 - any capture failure falls back to eager
            self.failed = True
            _verdicts[self.kind] = False
            self.graph = self.outputs = None
            self.graphs = []
            log.warning("omni: CUDA graph for %s not captured, running it eagerly (%s: %s)",
                        self.name, type(exc).__name__, exc)
            return False
        finally:
            if self.restore is not None:
                self.restore(state)

    def _capture_graphs(self) -> tuple[list[Any], Any]:
        """The step as one graph, or (``pieces``) as one per stretch between boundaries, all in
        one memory pool: a piece's outputs are the next one's inputs, and the pieces replay in
        the order they were captured."""
        import torch

        pool = self.pool
        if self.pieces and pool is None:
            pool = torch.cuda.graph_pool_handle()
        graphs: list[Any] = []
        capture: list[Any] = []

        def begin() -> None:
            graphs.append(torch.cuda.CUDAGraph())
            # thread_local: the other stage threads keep launching their own work meanwhile
            capture.append(torch.cuda.graph(graphs[-1], pool=pool, stream=self.capture_stream,
                                            capture_error_mode="thread_local"))
            capture[-1].__enter__()

        def split() -> None:
            capture[-1].__exit__(None, None, None)
            begin()

        begin()
        _pieces.split = split if self.pieces else None
        try:
            outputs = self.step()
        except BaseException as exc:
            _pieces.split = None
            capture[-1].__exit__(type(exc), exc, exc.__traceback__)
            raise
        _pieces.split = None
        capture[-1].__exit__(None, None, None)
        return graphs, outputs

    def release(self) -> None:
        self.graph = self.outputs = None
        self.graphs = []


class StaticDecoder:
    """One session's static KV cache for a transformers decoder, plus its captured one-token step.

    The cache lives as long as the session (``crop`` cuts it back, as after a barge-in); its
    length is a device tensor the graph reads, so one capture serves every position.

    With a ``pool`` the cache's storage is the session's ``slot`` row of the stage's shared
    :class:`~.batching.slots.SlotPool`, and its decode steps run in the stage's batches: those
    only count tokens here (:meth:`advance`), on the host, and the count reaches the device
    tensors the next time the session's own cache is used (:attr:`cache`).
    """

    def __init__(self, config: Any, max_len: int, device: Any, graphs: bool = True, name: str = "decoder",
                 run_stream: Any = None, capture_stream: Any = None, pool: Any = None, slot: int | None = None) -> None:
        from transformers.cache_utils import StaticCache

        self.device = device
        self._cache = StaticCache(config=config, max_cache_len=int(max_len))
        if pool is not None:
            pool.attach(self._cache, slot)
            max_len = pool.length
        self.max_len = int(max_len)
        self.slot = slot
        self.graphs = graphs
        self.name = name
        self.run_stream = run_stream
        self.capture_stream = capture_stream
        self.graph: StepGraph | None = None
        #: the static input tensors the bound step reads (set by the owner)
        self.inputs: tuple[Any, ...] = ()
        self._pending = 0  # tokens written by batched steps, not yet in the device lengths
        # the cache's length as the host knows it (None: ask the device). In a pool, where only
        # batched steps (counted by advance) and the owner's own use of the cache (which forgets
        # it) change it, a new cache is known to be empty: a session's first prefill then does
        # not wait on the device's queue to learn it (behind the other sessions' work). Alone,
        # its own captured step lengthens the cache on the device unseen, so the host never assumes.
        self._pooled = pool is not None
        self._host_length: int | None = 0 if self._pooled else None

    @property
    def cache(self) -> Any:
        """The session's own cache (prefill, crop, its own step), its lengths brought up to date."""
        self._flush()
        return self._cache

    def _flush(self) -> None:
        if self._pending and self._cache is not None:
            import torch

            with torch.inference_mode():
                for layer in self._cache.layers:
                    layer.cumulative_length.add_(self._pending)
        self._pending = 0
        self._host_length = None  # the owner may change the length through the cache now

    def write_position(self) -> int:
        """Where the next batched step writes this session's token (its current length)."""
        if self._host_length is None:
            self._host_length = int(self._cache.get_seq_length())
        return self._host_length

    def advance(self, tokens: int = 1) -> None:
        """A batched step (or prefill) wrote ``tokens`` tokens from :meth:`write_position` on."""
        self._host_length = self.write_position() + tokens
        self._pending += tokens

    @property
    def length(self) -> int:
        """Tokens in the cache (reads the device)."""
        return int(self.cache.get_seq_length())

    def crop(self, n: int) -> None:
        import torch

        # in a pool the host's count where it has one (no read of the device); else the device's
        have = self.write_position() if self._pooled else self.length
        cache = self.cache  # (the batched steps' tokens reach the device lengths first)
        if have > n:
            with torch.inference_mode():  # the lengths are inference tensors
                cache.crop(max(0, n) - have)
        if self._pooled:
            self._host_length = min(have, max(0, n))

    def capture_now(self, dummy: Callable[[], Any]) -> None:
        """Capture the bound step now (session open) rather than on its first use: ``dummy`` puts
        one throw-away token in the cache for the warm-ups to follow, and it is cut off again."""
        graph = self.graph
        if graph is None or not graph.enabled or graph.captured or graph.failed:
            return
        self.crop(0)
        dummy()
        graph.ensure_captured()
        self.crop(0)

    def bind(self, step: Callable[[], Any]) -> StepGraph:
        """Wrap ``step`` (one token through this cache, static inputs) as the replayed step."""
        self.graph = StepGraph(step, device=self.device, enabled=self.graphs, name=self.name,
                               save=self._save, restore=self._restore, run_stream=self.run_stream,
                               capture_stream=self.capture_stream)
        return self.graph

    def _save(self) -> list[Any]:
        return [layer.cumulative_length.clone() for layer in self.cache.layers]

    def _restore(self, state: list[Any] | None) -> None:
        import torch

        if state is None:
            return
        with torch.inference_mode():
            for layer, value in zip(self.cache.layers, state, strict=True):
                layer.cumulative_length.copy_(value)

    def release(self) -> None:
        if self.graph is not None:
            self.graph.release()
        self.graph = None
        self._cache = None
        self._pending = 0
        self._host_length = None
