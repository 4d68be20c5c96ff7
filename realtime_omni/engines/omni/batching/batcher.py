"""One loop per stage that runs the pending step of every live session as one batched forward.

Sessions keep their own threads and their own streaming logic; where they used to run their
one-token step alone, they hand its inputs to the stage's :class:`StepBatcher` and wait. The
batcher's thread takes everything pending, waits a moment for the other sessions that are in
the middle of a reply (``gather_s``), writes the rows into the static inputs of the smallest
batch bucket that holds them, replays that bucket's CUDA graph (eager off CUDA) and hands each
session its own row of the outputs.

Rows are slots: the stage keeps per-session state (KV in a :class:`~.slots.SlotPool`) in row
``slot``, and a row without work in a step writes to the scratch column. The queues need no
bound of their own: a session waits for its step, so it has at most one request pending.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..device_copy import to_device
from ..graphs import StepGraph, graphs_available
from ..streams import DeviceSpans, on_stream
from .mailbox import Done, Mailbox

log = logging.getLogger(__name__)

DEFAULT_BUCKETS = (1, 2, 4, 8, 12, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128)


@dataclass(frozen=True)
class RowInput:
    """Shape (without the batch axis) and dtype name of one per-row input of a step."""

    shape: tuple[int, ...]
    dtype: str

    @property
    def torch_dtype(self) -> Any:
        import torch

        return getattr(torch, self.dtype)


#: ``make(bucket, columns, write_pos, inputs)`` returns the step of ``bucket`` rows attending over
#: the first ``columns`` cache columns: a zero-argument function that reads the static
#: ``write_pos`` / ``inputs`` tensors and returns a tuple of outputs whose first axis is the row
StepFactory = Callable[[int, int, Any, tuple[Any, ...]], Callable[[], tuple[Any, ...]]]


#: the types a host value of a step's input may have (``type``, not ``isinstance``: checked per
#: value of every row, in the sessions' threads)
_NUMBERS = frozenset({int, float, bool})


@dataclass(eq=False)
class _Request:
    inputs: tuple[Any, ...]
    slot: int | None
    write_pos: int
    done: Done = field(default_factory=Done)
    result: tuple[Any, ...] | None = None  # the whole batch's outputs (this request's: ``row``)
    error: BaseException | None = None
    row: int = -1


@dataclass
class _Bucket:
    size: int
    columns: int
    write_pos: Any
    inputs: tuple[Any, ...]
    graph: StepGraph


class Activity:
    """How many sessions are in the middle of a reply on a stage (the batch to wait for)."""

    def __init__(self) -> None:
        self._n = 0
        self._paused = 0  # sessions mid-reply holding their next step back (paced)
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def streaming(self) -> Iterator[None]:
        with self._lock:
            self._n += 1
        try:
            yield
        finally:
            with self._lock:
                self._n -= 1

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Inside :meth:`streaming`: a session that holds its next step back on purpose (paced
        ahead of its listener) is not waited for meanwhile."""
        with self._lock:
            self._n -= 1
            self._paused += 1
        try:
            yield
        finally:
            with self._lock:
                self._n += 1
                self._paused -= 1

    @property
    def count(self) -> int:
        return self._n

    @property
    def paused_count(self) -> int:
        return self._paused


class StepBatcher(Mailbox):
    """One stage's step loop: ``make`` builds the step of each batch bucket (``capacity`` rows at
    most, one per session slot); ``scratch`` is the cache column rows without work write to.
    ``column_buckets``: how many cache columns a step may attend over (the stage's
    :meth:`~.slots.SlotPool.column_buckets`); a step takes the smallest that holds its rows'
    writes, and each (rows, columns) pair is its own captured graph. Default: everything up to
    the scratch column."""

    def __init__(
        self,
        name: str,
        make: StepFactory,
        row_inputs: Sequence[RowInput],
        *,
        capacity: int,
        device: Any,
        scratch: int = 0,
        stream: Any = None,
        graph_streams: dict[str, Any] | None = None,
        graphs: bool = True,
        gather_s: float = 0.002,
        buckets: Sequence[int] = DEFAULT_BUCKETS,
        activity: Activity | None = None,
        step_timeout_s: float = 60.0,
        state_lock: Any = None,
        column_buckets: Sequence[int] = (),
        host_outputs: Sequence[int] = (),
    ) -> None:
        self.name = name
        self.make = make
        self.row_inputs = tuple(row_inputs)
        self.capacity = int(capacity)
        self.device = device
        self.scratch = int(scratch)
        self.stream = stream
        self.graph_streams = graph_streams or {}
        self.graphs = graphs
        self.gather_s = float(gather_s)
        self.sizes = sorted({b for b in buckets if b < self.capacity} | {self.capacity})
        self.column_buckets = sorted({int(c) for c in column_buckets if 0 < c <= self.scratch}
                                     | {self.scratch + 1})
        self.activity = activity or Activity()
        self.step_timeout_s = step_timeout_s
        #: outputs the sessions read on the host (sampled ids): the loop reads them back once per
        #: step, so no session waits on the device for its own row
        self.host_outputs = frozenset(host_outputs)
        #: held while a step runs: a step rewrites the per-slot state of every row it spans (rows
        #: without work get their own values back), so a session loading its slot's state must not
        #: land between that read and that write (on CUDA both are ordered on the stage's stream
        #: anyway; on the CPU they race)
        self.state_lock = state_lock if state_lock is not None else threading.Lock()
        #: hand a step's results over only once the next step is launched, so the device runs
        #: that step while the woken sessions take the interpreter (the model's setting
        #: ``pipelined_steps``; measured on the H200 in docs/benchmarks/omni-capacity.md)
        self.pipelined = False
        #: after a prefill batch, how long a step waits for those sessions' first steps
        #: (:meth:`~.mailbox.Mailbox.expect`): a step or two of their threads coming round
        self.expect_s = 0.03
        self._held: list[_Request] = []  # run and complete, handed over after the next launch
        super().__init__()
        self.spans = DeviceSpans(graphs_available(device))
        self._buckets: dict[tuple[int, int], _Bucket] = {}
        self._graph_pool: Any = None  # one memory pool for the stage's graphs, which never overlap
        self._bucket_lock = threading.Lock()
        self.step_ms: dict[int, float] = {}  # bucket -> moving average of a step's wall time
        self.columns_steps: collections.Counter[int] = collections.Counter()  # steps per column bucket
        # where the loop's time goes: waiting for sessions' rows, staging and launching a step on
        # the host, waiting for the device to finish it
        self.phase_s = {"idle": 0.0, "host": 0.0, "device_wait": 0.0, "cpu": 0.0}
        self._start()

    # -- what sessions call -------------------------------------------------------------------

    def step(self, inputs: tuple[Any, ...], slot: int | None, write_pos: int = 0) -> tuple[Any, ...]:
        """Run one step for one row; blocks until the batch that carries it has run. Returns
        this row's outputs (see :meth:`result`)."""
        return self.result(self.submit(inputs, slot, write_pos))

    def submit(self, inputs: tuple[Any, ...], slot: int | None, write_pos: int = 0) -> _Request:
        """Queue one step without waiting (see :class:`Lookahead`). A slot's steps run in the
        order they were queued, one per batch; :meth:`result` waits for one."""
        if slot is None or not 0 <= slot < self.capacity:
            raise ValueError(f"{self.name}: a step needs a slot in 0..{self.capacity - 1}")
        return self._enqueue(_Request(self._row(inputs), slot, int(write_pos)))

    def _row(self, inputs: tuple[Any, ...]) -> tuple[Any, ...]:
        """One row's inputs, checked here, in the session's thread: a tensor of the step's shape and
        dtype (reshaped and cast only where it is not), or host values as a list (a number where
        the shape is ``(1,)``), which the loop turns into one tensor per step for all rows."""
        import torch

        if len(inputs) != len(self.row_inputs):
            raise ValueError(f"{self.name}: a step takes {len(self.row_inputs)} inputs, not {len(inputs)}")
        row = []
        for x, spec in zip(inputs, self.row_inputs, strict=True):
            if isinstance(x, torch.Tensor):
                if x.dtype != spec.torch_dtype or x.shape != spec.shape:
                    x = x.reshape(spec.shape).to(dtype=spec.torch_dtype)
            else:
                x = [x] if isinstance(x, (int, float)) else list(x)
                if len(spec.shape) != 1 or len(x) != spec.shape[0]:
                    raise ValueError(f"{self.name}: {len(x)} values for an input of shape {spec.shape}")
                if not _NUMBERS.issuperset(map(type, x)):  # one bad row must not fail the batch
                    raise ValueError(f"{self.name}: an input's host values must be numbers")
            row.append(x)
        return tuple(row)

    def result(self, req: _Request) -> tuple[Any, ...]:
        """This request's row of its step's outputs (picked here, in the session's thread): host
        outputs as Python values, the others as views of the step's device tensors."""
        outputs = self._await(req)
        row = req.row  # (set with the outputs)
        return tuple([o[row] for o in outputs])

    def warm(self) -> None:
        """Build every bucket and capture its graph now (the model is loading, nothing else runs)."""
        import torch

        for size in self.sizes:
            for columns in self.column_buckets:
                bucket = self._bucket(size, columns)
                with torch.inference_mode(), on_stream(self.stream):
                    bucket.graph.ensure_captured()

    def close(self) -> None:
        super().close()
        if self._thread.is_alive():  # a step still running past the join: leave its graph be
            log.warning("omni: %s loop still running at close; its graphs are not released", self.name)
            return
        for bucket in self._buckets.values():
            bucket.graph.release()
        self._buckets.clear()

    def stats(self) -> dict[str, Any]:
        return {**super().stats(), "step_ms": dict(sorted(self.step_ms.items())),
                "columns_steps": dict(sorted(self.columns_steps.items())), "phase_s": dict(self.phase_s),
                # a copy first: the loop may add a bucket meanwhile (graphs not warmed at load)
                "graphs": sum(1 for b in list(self._buckets.values()) if b.graph.captured)}

    # -- the loop -------------------------------------------------------------------------------

    def _loop(self) -> None:
        cpu = time.thread_time()
        while True:
            now = time.thread_time()  # the loop thread's CPU time (interpreter and driver calls)
            self.phase_s["cpu"] += now - cpu
            cpu = now
            waited = time.perf_counter()
            with self._cond:
                if self._held and not self._queue:  # no next step to launch first: hand them over now
                    self._hand_over()
                # the sessions mid-reply will submit soon: give them a moment to join this step;
                # the sessions of a prefill batch that just ended (``expect``), up to ``expect_s``
                self._await_work()
                expect_s = self.expect_s if self._expected else 0.0
                if not self._gathered(self.gather_s, self._all_queued, expect_s, self._expecting):
                    self._hand_over()  # closing: what already ran is still theirs
                    return
                take, self._queue = self._take(self._queue)
            self.phase_s["idle"] += time.perf_counter() - waited
            if take:
                self._run(take)

    def _all_queued(self, _queued: int) -> bool:
        """Every session mid-reply, and every one expected, has a step queued."""
        return self._queued_slots() >= self.activity.count and not self._expecting()

    def _queued_slots(self) -> int:
        """Sessions with a step queued (a session may queue several ahead: it counts once)."""
        return len({req.slot for req in self._queue})

    @staticmethod
    def _take(queue: list[_Request]) -> tuple[list[_Request], list[_Request]]:
        seen: set[int | None] = set()
        take, rest = [], []
        for req in queue:  # one step per slot per batch (a session never has two pending)
            (rest if req.slot in seen else take).append(req)
            seen.add(req.slot)
        return take, rest

    def columns_for(self, take: Sequence[_Request]) -> int:
        """The smallest column bucket holding every write of ``take`` (rows without work write
        to the scratch column, outside every bucket but the last, and read nothing they keep)."""
        last = max(req.write_pos for req in take)
        return next((c for c in self.column_buckets if c > last), self.column_buckets[-1])

    def _bucket(self, size: int, columns: int) -> _Bucket:
        with self._bucket_lock:
            bucket = self._buckets.get((size, columns))
            if bucket is not None:
                return bucket
            import torch

            if self._graph_pool is None and self.graphs and graphs_available(self.device):
                self._graph_pool = torch.cuda.graph_pool_handle()
            with torch.inference_mode():
                write_pos = torch.full((size,), self.scratch, dtype=torch.long, device=self.device)
                inputs = tuple(torch.zeros((size, *spec.shape), dtype=getattr(torch, spec.dtype), device=self.device)
                               for spec in self.row_inputs)
                fn = self.make(size, columns, write_pos, inputs)
            graph = StepGraph(fn, device=self.device, enabled=self.graphs, name=f"{self.name} batch {size} × {columns}",
                              kind=f"{self.name} batch", pool=self._graph_pool, **self.graph_streams)
            bucket = self._buckets[size, columns] = _Bucket(size, columns, write_pos, inputs, graph)
            return bucket

    def _run(self, take: list[_Request]) -> None:
        import torch

        started = time.perf_counter()
        size = 0
        try:
            rows = [req.slot for req in take]
            need = max(rows) + 1
            size = next(s for s in self.sizes if s >= need)
            bucket = self._bucket(size, self.columns_for(take))
            self.columns_steps[bucket.columns] += 1
            with torch.inference_mode(), on_stream(self.stream):
                span = self.spans.begin(self.stream)
                write = [self.scratch] * size  # rows without work write to the scratch column
                for req, row in zip(take, rows, strict=True):
                    write[row] = req.write_pos
                # through pinned memory: a pageable copy waits for the stream, where the last
                # step may still run, and gives the interpreter away while it waits
                bucket.write_pos.copy_(to_device(torch.tensor(write, dtype=torch.long), self.device))
                device_index = to_device(torch.tensor(rows, dtype=torch.long), self.device)
                for k, buf in enumerate(bucket.inputs):
                    buf.index_copy_(0, device_index, self._stacked(k, take, buf.dtype))
                with self.state_lock:
                    outputs = tuple(self._read_back(o) if i in self.host_outputs else o.clone()
                                    for i, o in enumerate(bucket.graph()))
                self.spans.end(span, self.stream)
                launched = time.perf_counter()
                self.launches.append((started, launched))
                self._hand_over()  # the last step's sessions, while the device runs this one
            # complete (leaving the stream waited for it): host outputs become Python values once,
            # for every row, instead of one device read per session
            outputs = tuple(o.tolist() if i in self.host_outputs else o for i, o in enumerate(outputs))
            self.phase_s["host"] += launched - started
            self.phase_s["device_wait"] += time.perf_counter() - launched
            for req, row in zip(take, rows, strict=True):
                req.result, req.row = outputs, row
        except BaseException as exc:  # noqa: BLE001 - every waiting session gets the error
            log.exception("omni %s: batched step failed", self.name)
            for req in take:
                req.error = exc
        finally:
            elapsed = self._count(len(take), started)
            self._hand_over()  # (when the step failed before its launch)
            if self.pipelined and not any(req.error is not None for req in take):
                self._held = take
            else:
                for req in take:
                    req.done.set()
        if size:
            ms = 1000 * elapsed
            self.step_ms[size] = ms if size not in self.step_ms else 0.9 * self.step_ms[size] + 0.1 * ms

    def _stacked(self, k: int, take: list[_Request], dtype: Any) -> Any:
        """Input ``k`` of every row of a step as one ``dtype`` tensor on the device: host values
        in one call, copied through pinned memory (:func:`~..device_copy.to_device`)."""
        import torch

        values = [req.inputs[k] for req in take]
        if all(isinstance(v, list) for v in values):
            return to_device(torch.tensor(values, dtype=dtype), self.device)
        spec = self.row_inputs[k]
        return torch.stack([to_device(torch.tensor(v, dtype=spec.torch_dtype) if isinstance(v, list) else v, self.device)
                            for v in values]).to(dtype)

    def _read_back(self, output: Any) -> Any:
        """A host copy of a step output, queued on the stage's stream behind the step (pinned
        memory, so the copy does not hold the loop up)."""
        if output.device.type != "cuda":
            return output.clone()
        import torch

        host = torch.empty(output.shape, dtype=output.dtype, pin_memory=True)
        return host.copy_(output, non_blocking=True)

    def _hand_over(self) -> None:
        held, self._held = self._held, []
        for req in held:
            req.done.set()


class Lookahead:
    """One session's steps queued ahead on one stage, consumed in order.

    Where a session knows its next inputs before it has read the last outputs (the talker's
    parts, the thinker's token chained on the device), it keeps ``depth`` steps queued, so the
    stage's loop finds every live session's next row waiting at each step instead of catching
    the sessions in waves as their threads come round. ``drain`` drops what is still queued and
    waits for a step already running, so nothing writes the slot after the session moved on.
    """

    def __init__(self, batcher: StepBatcher, slot: int, depth: int) -> None:
        self.batcher = batcher
        self.slot = slot
        self.depth = max(1, int(depth))
        self._queued: collections.deque[tuple[_Request, Any]] = collections.deque()

    def __len__(self) -> int:
        return len(self._queued)

    @property
    def room(self) -> int:
        return self.depth - len(self._queued)

    def push(self, inputs: tuple[Any, ...], write_pos: int, note: Any = None) -> None:
        self._queued.append((self.batcher.submit(inputs, self.slot, write_pos), note))

    def pop(self) -> tuple[tuple[Any, ...], Any]:
        """The oldest queued step's outputs (waiting for it) and the note pushed with it."""
        req, note = self._queued.popleft()
        try:
            return self.batcher.result(req), note
        except BaseException:
            self.drain()
            raise

    def drain(self) -> None:
        reqs = [req for req, _ in self._queued]
        self._queued.clear()
        if reqs:
            self.batcher.withdraw(reqs)
