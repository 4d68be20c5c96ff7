"""A :class:`VoiceModel` whose engine runs as model-worker actors on a Ray cluster.

``RayModel("embedded", "auto")`` connects to a Ray cluster, starts one :class:`~.actor.ModelWorker`
actor per node (one per GPU for GPU engines) and proxies every session call to its session's
worker, in the shape of the local worker process (:mod:`..worker.proxy`), so the session and
pipeline layers do not change:

* **Placement and admission.** A new session goes to the live worker with the most free
  capacity: ``max_sessions`` of the worker's model minus its live sessions, as the workers report
  them (polled every ``poll_s``) and as this gateway has placed them since. No free slot anywhere:
  :class:`ModelAtCapacity` (the server's ``session_limit_reached``). A session keeps its worker for
  its whole life (its context lives there).
* **Media.** ``think`` and ``talk`` are Ray streaming generators (one actor call per response
  stage, backpressure of ``stream_window`` items). Audio travels inside the whole utterance
  (``transcribe``, ``think``), never one actor call per 20 ms frame. Engines with a VAD that can
  run beside the audio (``gateway_vad``, e.g. Silero for ``embedded``) run it in the gateway.
* **Nodes that join later.** Every ``discover_s`` the monitor compares the cluster's nodes with
  the workers; a slot without one (a node that joined, a GPU it brought) gets a worker, which
  serves once its model is loaded.
* **Failures.** A worker that dies fails the calls in flight at once (:class:`WorkerCrashed`; the
  pipeline ends the response with an error event); a replacement actor starts on the same node;
  the session's next call re-places it on the live worker with the most free capacity, where its
  context is rebuilt from the conversation that every ``ThinkRequest`` carries (a re-prefill,
  logged and counted in ``replacements``).

Every blocking method is called from a worker thread of the server, except ``open_session``,
``new_vad`` and the base ``talk_boundary``, which never wait for the cluster.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

from ..base import (
    ModelAtCapacity,
    ModelInfo,
    VoiceModel,
)
from ..settings import EngineSettings
from ..worker import protocol as p
from ..worker.protocol import (
    WorkerUnavailable,
)
from .actor import END, ITEMS, ModelWorker
from .pool import WorkerPool, _ray
from .session import RaySession, RayVADSession, Worker

log = logging.getLogger(__name__)

#: how often the gateway's cancel watcher looks at the ``cancelled`` Event of every open stream
CANCEL_POLL_S = 0.02
#: how long a stream consumer blocks for the next object before it looks around (a shorter wait
#: costs CPU per stream: waking 32 consumers every 20 ms made p99 chunk lateness 185 ms vs 27 ms)
STREAM_WAIT_S = 0.25
class RayModel(WorkerPool, VoiceModel):
    """Model ``name`` served by worker actors on the Ray cluster at ``address``."""

    def __init__(
        self,
        name: str,
        address: str | None = "auto",
        builder: Callable[[], VoiceModel] | None = None,
        *,
        engines: EngineSettings | None = None,
        gateway_vad: Callable[[], Any] | None = None,
        call_timeout_s: float = 60.0,
        load_timeout_s: float = 600.0,
        stream_window: int = 8,
        cancel_grace_s: float = 5.0,
        poll_s: float = 0.5,
        discover_s: float = 5.0,
        strip_unheard_audio: bool = True,
        init_kwargs: dict[str, Any] | None = None,
    ) -> None:
        self.name = name
        self.address = address
        self.builder = builder
        #: the engines' settings each actor builds its model with (defaults when None)
        self.engines = engines
        self.gateway_vad = gateway_vad
        self.call_timeout_s = call_timeout_s
        self.load_timeout_s = load_timeout_s
        self.stream_window = max(2, stream_window)
        self.cancel_grace_s = cancel_grace_s
        self.poll_s = poll_s
        #: how often the cluster is looked at for nodes that joined after the load
        self.discover_s = discover_s
        self.strip_unheard_audio = strip_unheard_audio
        self.init_kwargs = dict(init_kwargs or {})
        self.workers: list[Worker] = []
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._monitor: threading.Thread | None = None
        self._started_ray = False
        self._info: ModelInfo | None = None
        self._traits: p.Traits | None = None
        self._vad: Any = None
        self._actor_cls: Any = None
        #: open streams: id → (the pipeline's cancel Event, worker); the watcher tells the worker
        self._cancels: dict[str, tuple[threading.Event, Worker]] = {}
        self._watcher: threading.Thread | None = None
        #: sessions moved to another worker after theirs died (context rebuilt there)
        self.replacements = 0
        #: worker actors started again after one died
        self.restarts = 0
        #: worker actors started on nodes that joined the cluster after the load
        self.joined = 0
        #: sessions a worker refused as full (by its own count) and that went to another one
        self.readmissions = 0
        #: node id → workers being started there (replacements and newcomers), not yet serving
        self._starting: dict[str, int] = {}

    # -- VoiceModel -----------------------------------------------------------------------------
    @property
    def info(self) -> ModelInfo:  # type: ignore[override]
        """The workers' ``model.info``; ``max_sessions`` is the whole cluster's (None: unlimited)."""
        if self._info is None:
            return ModelInfo(id=self.name)
        with self._lock:
            limits = [w.info.max_sessions for w in self.workers if not w.dead and w.info is not None]
        total = None if not limits or any(x is None for x in limits) else sum(limits)  # type: ignore[misc]
        return dataclasses.replace(self._info, max_sessions=total)

    @property
    def traits(self) -> p.Traits:
        if self._traits is None:
            raise RuntimeError(f"model {self.name!r} is not loaded")
        return self._traits

    def load(self, progress: Callable[[str], None] = lambda _msg: None) -> None:
        ray = _ray()
        if not ray.is_initialized():
            progress(f"connecting to the Ray cluster at {self.address}")
            ray.init(address=self.address, namespace="realtime_omni", **self.init_kwargs)
            self._started_ray = True
        self._actor_cls = ray.remote(ModelWorker)
        slots = self._slots()
        if not slots:
            raise RuntimeError(f"no Ray node can host a {self.name!r} worker (need a node with "
                               f"{'a GPU' if self._wants_gpu() else 'a CPU'})")
        progress(f"starting {len(slots)} model worker actor(s) on {len({n for n, _ in slots})} node(s)")
        workers = [self._spawn(node_id, resources) for node_id, resources in slots]
        try:
            for worker in workers:
                self._await(worker)
        except BaseException:
            for worker in workers:
                with contextlib.suppress(Exception):
                    ray.kill(worker.handle, no_restart=True)
            raise
        with self._lock:
            self.workers = workers
        first = workers[0]
        self._info, self._traits = first.info, first.traits
        if self._traits is not None and self._traits.has_vad and self.gateway_vad is not None:
            self._vad = self.gateway_vad()  # VAD beside the audio: no actor call per frame
        for worker in workers:
            progress(f"worker {worker.worker_id} (pid {worker.pid}) on node {worker.node_id[:8]} ready")
        self._monitor = threading.Thread(target=self._watch, name=f"ray-{self.name}-monitor", daemon=True)
        self._monitor.start()

    def open_session(self) -> RaySession:
        """Never blocks (called on the event loop): picks the worker, tells it asynchronously."""
        cls = RayVADSession if self.traits.has_vad else RaySession
        key = uuid.uuid4().hex
        try:
            worker = self._place(key)
        except WorkerUnavailable as exc:  # every worker is down: refuse like a full cluster
            raise ModelAtCapacity(str(exc)) from exc
        session = cls(self, key, worker)
        with contextlib.suppress(Exception):
            worker.handle.open.remote(key)  # fire and forget: calls open the session lazily too
        return session

    def stats(self) -> dict[str, dict[str, float]]:
        """The live workers' engine counters, summed (``placement()``, ``replacements`` and
        ``restarts`` tell where the sessions are)."""
        ray = _ray()
        totals: dict[str, dict[str, float]] = {}
        with self._lock:
            workers = [w for w in self.workers if not w.dead]
        refs = [w.handle.call.remote(p.NO_SESSION, "stats", p.dumps(())) for w in workers]
        for ref in refs:
            with contextlib.suppress(Exception):
                ok, blob, _tb = ray.get(ref, timeout=2.0)
                if ok:
                    for group, values in p.loads(blob).items():
                        bucket = totals.setdefault(group, {})
                        for k, v in values.items():
                            bucket[k] = bucket.get(k, 0.0) + float(v)
        return totals

    def close(self) -> None:
        if self._closing.is_set():
            return
        self._closing.set()
        if self._monitor is not None:
            self._monitor.join(5.0)
        with contextlib.suppress(Exception):
            ray = _ray()
            with self._lock:
                workers, self.workers = self.workers, []
            for worker in workers:
                with contextlib.suppress(Exception):
                    ray.kill(worker.handle, no_restart=True)
            if self._started_ray:
                ray.shutdown()

    @property
    def ready(self) -> bool:
        with self._lock:
            return not self._closing.is_set() and any(not w.dead for w in self.workers)

    def placement(self) -> dict[str, int]:
        """Live workers → sessions on each (as reported, or as placed here when more)."""
        with self._lock:
            return {w.worker_id: w.live for w in self.workers if not w.dead}

    # -- workers --------------------------------------------------------------------------------
    def _place(self, key: str, exclude: Worker | None = None, avoid: frozenset[str] = frozenset()) -> Worker:
        with self._lock:
            live = [w for w in self.workers if not w.dead and w is not exclude and w.worker_id not in avoid]
            if not live:
                raise WorkerUnavailable(f"model {self.name!r} has no live worker on the Ray cluster")
            best = max(live, key=lambda w: (w.free(), -w.live))
            if best.free() <= 0:
                limit = sum(w.info.max_sessions or 0 for w in live if w.info is not None)
                raise ModelAtCapacity(f"all {limit} session slots of model {self.name!r} on "
                                      f"{len(live)} Ray worker(s) are in use")
            best.placed.add(key)
            return best

    def _release(self, worker: Worker, key: str) -> None:
        with self._lock:
            worker.placed.discard(key)

    def _refused(self, session: RaySession, worker: Worker) -> Worker:
        """``worker`` is full by its own count (a count here was behind): take the session, which
        holds no context yet, to another worker with room, or raise :class:`ModelAtCapacity`."""
        session.refused_by.add(worker.worker_id)
        with self._lock:
            if worker.info is not None and worker.info.max_sessions is not None:
                worker.reported_live = max(worker.reported_live, worker.info.max_sessions)  # until the next poll
        self._release(worker, session.key)
        new = self._place(session.key, avoid=frozenset(session.refused_by))
        session.worker = new
        self.readmissions += 1
        log.info("model %s: worker %s was full; session %s placed on %s instead", self.name, worker.worker_id,
                 session.key[:8], new.worker_id)
        return new

    # -- RPC --------------------------------------------------------------------------------------
    def _call(self, session: RaySession, method: str, args: tuple[Any, ...], *, move: bool = True,
              timeout: float | None = None) -> Any:
        ray = _ray()
        worker = session.worker_for_call() if move else session.worker
        while True:
            if worker.dead:
                raise self._lost(worker)
            try:
                ok, blob, tb = ray.get(worker.handle.call.remote(session.key, method, p.dumps(args)),
                                       timeout=self.call_timeout_s if timeout is None else timeout)
            except ray.exceptions.GetTimeoutError as exc:
                raise WorkerUnavailable(f"model {self.name!r} worker {worker.worker_id} did not answer in time") from exc
            except ray.exceptions.ActorUnavailableError as exc:  # for now (a network blip): not dead
                raise self._unreachable(worker) from exc
            except ray.exceptions.RayActorError as exc:
                raise self._lost(worker, exc) from exc
            if ok:
                session.admitted = True
                return p.loads(blob)
            error = p.unpack_exception(blob, tb)
            if not isinstance(error, ModelAtCapacity) or session.admitted or not move:
                raise error
            worker = self._refused(session, worker)  # raises ModelAtCapacity when no worker has room

    def _stream(self, session: RaySession, method: str, args: tuple[Any, ...],
                cancelled: threading.Event) -> Iterator[Any]:
        """Items of a streamed engine call, with cancellation; the generator's backpressure bounds
        what the worker produces ahead of this consumer. A worker full by its own count refuses
        a new session before its first item: the stream then starts on another worker."""
        if cancelled.is_set():
            return
        worker = session.worker_for_call()
        while True:
            started = False
            try:
                for item in self._stream_on(worker, session, method, args, cancelled):
                    started = session.admitted = True
                    yield item
                session.admitted = True
                return
            except ModelAtCapacity:
                if started or session.admitted:
                    raise
                worker = self._refused(session, worker)

    def _stream_on(self, worker: Worker, session: RaySession, method: str, args: tuple[Any, ...],
                   cancelled: threading.Event) -> Iterator[Any]:
        ray = _ray()
        stream_id = uuid.uuid4().hex
        gen = worker.handle.stream.options(
            num_returns="streaming", _generator_backpressure_num_objects=self.stream_window,
        ).remote(stream_id, session.key, method, p.dumps(args), self.stream_window)
        self._watch_cancel(stream_id, cancelled, worker)
        cancel_deadline: float | None = None
        finished = False
        try:
            while True:
                if cancel_deadline is None and cancelled.is_set():
                    cancel_deadline = time.monotonic() + self.cancel_grace_s  # the watcher told the worker
                try:
                    ref = gen._next_sync(timeout_s=STREAM_WAIT_S)
                except StopIteration:
                    finished = True
                    raise self._lost(worker) from None  # ended without END: the actor went away
                except ray.exceptions.ActorUnavailableError as exc:
                    raise self._unreachable(worker) from exc
                except ray.exceptions.RayActorError as exc:
                    raise self._lost(worker, exc) from exc
                if ref.is_nil():
                    if cancel_deadline is not None and time.monotonic() > cancel_deadline:
                        return  # the engine ignores cancellation: leave it running there
                    if worker.dead:
                        raise self._lost(worker)
                    continue
                try:
                    msg = ray.get(ref, timeout=self.call_timeout_s)
                except ray.exceptions.ActorUnavailableError as exc:
                    raise self._unreachable(worker) from exc
                except ray.exceptions.RayActorError as exc:
                    raise self._lost(worker, exc) from exc
                kind = msg[0]
                if kind == ITEMS:
                    for item in msg[1]:
                        if cancel_deadline is not None or cancelled.is_set():
                            break  # made before the worker saw the cancel
                        yield p.loads(item)
                elif kind == END:
                    finished = True
                    return
                else:
                    finished = True
                    raise p.unpack_exception(msg[1], msg[2])
        finally:
            with self._lock:
                self._cancels.pop(stream_id, None)
            if not finished:
                with contextlib.suppress(Exception):
                    worker.handle.cancel.remote(stream_id)

    def _watch_cancel(self, stream_id: str, cancelled: threading.Event, worker: Worker) -> None:
        with self._lock:
            self._cancels[stream_id] = (cancelled, worker)
            if self._watcher is None:
                self._watcher = threading.Thread(target=self._cancel_watcher, name=f"ray-{self.name}-cancels",
                                                 daemon=True)
                self._watcher.start()

    def _cancel_watcher(self) -> None:
        """One thread for all streams: a cancelled response's worker is told within ~20 ms (its
        generator then ends, which wakes the consumer), without every consumer polling."""
        while not self._closing.wait(CANCEL_POLL_S):
            with self._lock:
                due = [(sid, w) for sid, (ev, w) in self._cancels.items() if ev.is_set()]
                for sid, _w in due:
                    del self._cancels[sid]
            for sid, worker in due:
                with contextlib.suppress(Exception):
                    worker.handle.cancel.remote(sid)
