"""The worker actors of a :class:`~.model.RayModel`: where they go (one per node with a CPU, or
one per GPU), how they start and are awaited, and the monitor that polls their own session
counts, replaces dead ones and starts workers on nodes that joined the cluster later.
A mixin of ``RayModel`` (which keeps placement and the calls).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid
from typing import Any

from ..settings import EngineSettings
from ..worker import protocol as p
from ..worker.protocol import (
    WorkerClosed,
    WorkerCrashed,
    WorkerError,
    WorkerUnavailable,
)
from .session import Worker

log = logging.getLogger(__name__)

#: concurrent calls one worker actor runs (streams hold a thread each while they run)
ACTOR_CONCURRENCY = 256


def _ray() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise RuntimeError("placing model workers on Ray needs the optional extra: "
                           "pip install 'realtime-omni[ray]'") from exc
    return ray


class WorkerPool:
    # provided by RayModel
    name: str
    builder: Any
    engines: EngineSettings | None
    load_timeout_s: float
    call_timeout_s: float
    poll_s: float
    discover_s: float
    workers: list[Worker]
    restarts: int
    joined: int
    _lock: threading.Lock
    _closing: threading.Event
    _starting: dict[str, int]
    _actor_cls: Any

    def _wants_gpu(self) -> bool:
        return self.name.startswith("omni:")

    def _slots(self) -> list[tuple[str, dict[str, float]]]:
        """(node id, actor resources) for every worker to start: one per GPU for GPU engines on
        nodes that have GPUs, else one per node with a CPU (echo asks for no CPU)."""
        ray = _ray()
        slots: list[tuple[str, dict[str, float]]] = []
        for node in ray.nodes():
            if not node.get("Alive"):
                continue
            res = node.get("Resources", {})
            if self._wants_gpu() and res.get("GPU", 0) >= 1:
                slots += [(node["NodeID"], {"num_gpus": 1})] * int(res["GPU"])
            elif res.get("CPU", 0) >= 1:
                slots.append((node["NodeID"], {"num_cpus": 0 if self.name == "echo" else 1}))
        return slots

    def _spawn(self, node_id: str, resources: dict[str, float]) -> Worker:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        worker_id = f"{self.name}-{uuid.uuid4().hex[:8]}"
        handle = self._actor_cls.options(
            name=None, max_concurrency=ACTOR_CONCURRENCY, max_restarts=0,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
            **resources,
        ).remote(self.name, self.builder, worker_id, self.engines)
        return Worker(worker_id=worker_id, node_id=node_id, handle=handle, resources=resources)

    def _await(self, worker: Worker) -> None:
        """Wait (bounded: an actor whose resources are taken waits forever) until it is loaded."""
        ray = _ray()
        ref = worker.handle.describe.remote()
        deadline = time.monotonic() + self.load_timeout_s
        while not ray.wait([ref], timeout=min(15.0, max(0.0, deadline - time.monotonic())))[0]:
            if time.monotonic() >= deadline:
                raise WorkerUnavailable(f"model {self.name!r} worker {worker.worker_id} did not start within "
                                        f"{self.load_timeout_s:.0f} s (its node's {worker.resources} taken?)")
            log.warning("model %s: worker %s on node %s not up yet: still loading, or waiting for %s on that node",
                        self.name, worker.worker_id, worker.node_id[:8], worker.resources)
        described = ray.get(ref, timeout=self.call_timeout_s)
        worker.info = p.loads(described["info"])
        worker.traits = described["traits"]
        worker.pid = described["pid"]
        worker.reported_at = time.monotonic()

    def _lost(self, worker: Worker, exc: BaseException | None = None) -> WorkerError:
        if self._closing.is_set():
            return WorkerClosed(f"model {self.name!r} was closed during the call")
        if not worker.dead:
            log.error("model %s: worker %s (pid %d) died: %s", self.name, worker.worker_id, worker.pid, exc)
        worker.dead = True
        return WorkerCrashed(f"model {self.name!r} worker actor {worker.worker_id} died during the call")

    def _unreachable(self, worker: Worker) -> WorkerError:
        """Ray says the actor is unavailable for now (ActorUnavailableError: a network blip or
        its node restarting), not dead: the call fails, the worker keeps its sessions and slot."""
        if self._closing.is_set():
            return WorkerClosed(f"model {self.name!r} was closed during the call")
        return WorkerUnavailable(f"model {self.name!r} worker actor {worker.worker_id} is unreachable for now")

    def _watch(self) -> None:
        """Poll each worker's load (its own count of live sessions); replace dead workers; start
        workers on nodes that joined the cluster since."""
        ray = _ray()
        next_discovery = time.monotonic() + self.discover_s
        while not self._closing.wait(self.poll_s):
            if time.monotonic() >= next_discovery:
                next_discovery = time.monotonic() + self.discover_s
                with contextlib.suppress(Exception):  # the cluster's view is unreachable for now
                    self._discover()
            with self._lock:
                workers = list(self.workers)
            refs = {w: w.handle.load_report.remote() for w in workers if not w.dead}
            for worker, ref in refs.items():
                try:
                    live, _limit = ray.get(ref, timeout=max(2.0, self.poll_s))
                except ray.exceptions.ActorDiedError as exc:
                    self._lost(worker, exc)
                    continue
                except Exception:  # noqa: BLE001 - slow or unreachable for now: look again later
                    continue
                worker.reported_live, worker.reported_at = live, time.monotonic()
            for worker in workers:
                if worker.dead and not self._closing.is_set():
                    self._replace(worker)

    def _replace(self, dead: Worker) -> None:
        """A new actor where the dead one was (if its node is still up); the dead one's sessions
        move on their next call, so this may take as long as a model load."""
        with self._lock:
            if dead not in self.workers:
                return
            self.workers.remove(dead)
        with contextlib.suppress(Exception):  # if only thought dead, it must not keep its GPU
            _ray().kill(dead.handle, no_restart=True)
        nodes = {node_id for node_id, _ in self._slots()}
        if dead.node_id not in nodes:
            log.error("model %s: node %s of worker %s is gone; not replacing it", self.name, dead.node_id[:8],
                      dead.worker_id)
            return
        self._start_in_background(dead.node_id, dead.resources, replaces=dead)

    def _discover(self) -> None:
        """Start a worker in every slot of the cluster that has none: nodes that joined after the
        load (or GPUs they brought). Dead workers' slots are :meth:`_replace`'s."""
        wanted: dict[str, list[dict[str, float]]] = {}
        for node_id, resources in self._slots():
            wanted.setdefault(node_id, []).append(resources)
        with self._lock:
            held: dict[str, int] = dict(self._starting)
            for worker in self.workers:
                held[worker.node_id] = held.get(worker.node_id, 0) + 1
        for node_id, slots in wanted.items():
            for resources in slots[held.get(node_id, 0):]:
                log.info("model %s: node %s joined the cluster; starting a worker there", self.name, node_id[:8])
                self._start_in_background(node_id, resources, replaces=None)

    def _start_in_background(self, node_id: str, resources: dict[str, float], replaces: Worker | None) -> None:
        """Start a worker and let it serve once loaded (which may take as long as a model load)."""
        worker = self._spawn(node_id, resources)
        with self._lock:
            self._starting[node_id] = self._starting.get(node_id, 0) + 1

        def wait() -> None:
            try:
                self._await(worker)
            except Exception as exc:  # noqa: BLE001
                log.error("model %s: worker %s on node %s failed to start: %s", self.name, worker.worker_id,
                          node_id[:8], exc)
                with contextlib.suppress(Exception):
                    _ray().kill(worker.handle, no_restart=True)
                return
            finally:
                with self._lock:
                    self._starting[node_id] -= 1
                    if not self._starting[node_id]:
                        del self._starting[node_id]
            with self._lock:
                closing = self._closing.is_set()
                if not closing:
                    self.workers.append(worker)
            if closing:  # the model closed while this one loaded: nobody else will stop it
                with contextlib.suppress(Exception):
                    _ray().kill(worker.handle, no_restart=True)
                return
            with self._lock:
                if replaces is None:
                    self.joined += 1
                else:
                    self.restarts += 1
            if replaces is None:
                log.warning("model %s: worker %s serves on node %s, which joined the cluster", self.name,
                            worker.worker_id, node_id[:8])
            else:
                log.warning("model %s: worker %s replaced %s on node %s", self.name, worker.worker_id,
                            replaces.worker_id, node_id[:8])

        threading.Thread(target=wait, name=f"ray-{self.name}-start", daemon=True).start()
