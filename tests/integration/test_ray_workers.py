"""Model workers on a changing Ray cluster (real local clusters on loopback; about 25 s on 2
cores): a node that joins after the model loaded gets a worker of its own and new sessions go
there; a worker full by its own count refuses a session, which goes to a worker with room."""

from __future__ import annotations

import time

import numpy as np
import pytest

from tests.ray_cluster import listening_outside_loopback, loopback_cluster, ray  # noqa: F401 (skips without ray)
from realtime_omni.audio import Pcm
from realtime_omni.engines.placement import RayModel

pytestmark = pytest.mark.timeout(180)


def test_a_node_that_joins_later_gets_a_worker_and_new_sessions():
    with loopback_cluster(worker_nodes=1) as cluster:
        model = RayModel("echo", cluster.address, poll_s=0.2, discover_s=0.5)
        model.load()
        sessions = []
        try:
            assert len(model.placement()) == 1 and model.joined == 0
            (first,) = model.workers
            node = cluster.add_node(num_cpus=1, node_ip_address="127.0.0.1", object_store_memory=80 * 2**20,
                                    resources={"late": 1})
            deadline = time.monotonic() + 60
            while len(model.placement()) < 2 and time.monotonic() < deadline:
                time.sleep(0.2)
            assert len(model.placement()) == 2, "no worker started on the node that joined"
            assert model.joined == 1 and model.restarts == 0
            late = next(w for w in model.workers if w is not first)
            assert late.node_id == node.node_id and late.node_id != first.node_id
            # placement by free capacity: the new, empty worker takes sessions at once
            sessions = [model.open_session() for _ in range(2)]
            assert {s.worker.worker_id for s in sessions} == {first.worker_id, late.worker_id}
            on_late = next(s for s in sessions if s.worker is late)
            heard = on_late.listen(Pcm(np.arange(480, dtype=np.int16), 24_000))  # echo: it works there
            assert heard is not None and np.array_equal(heard.samples, np.arange(480, dtype=np.int16))
            time.sleep(1.5)  # later discoveries start nothing more: every slot has its worker
            assert len(model.placement()) == 2 and model.joined == 1
            assert listening_outside_loopback() == []
        finally:
            for session in sessions:
                session.close()
            model.close()


def test_a_worker_full_by_its_own_count_refuses_and_the_session_goes_elsewhere():
    """Whoever else fills a worker (another gateway sharing it, a count that fell behind), it
    serves at most its model's max_sessions; the refused session, which holds no context yet,
    is placed on a worker with room."""
    from realtime_omni.engines.base import ModelAtCapacity, ThinkRequest, TurnMessage
    from tests.engines import ray_talky

    with loopback_cluster(worker_nodes=2) as cluster:
        # poll_s: the gateway's view of the workers' own counts stays behind for the whole test
        model = RayModel("talky", cluster.address, builder=ray_talky.build, poll_s=60.0)
        model.load()
        sessions = []
        try:
            full, spare = model.workers
            for key in ("elsewhere-1", "elsewhere-2"):  # sessions this gateway does not know about
                ray.get(full.handle.open.remote(key), timeout=30)
            assert ray.get(full.handle.load_report.remote(), timeout=30) == (2, ray_talky.MAX_SESSIONS)
            sessions = [model.open_session() for _ in range(2)]  # this gateway sees two empty workers
            moved = next(s for s in sessions if s.worker is full)
            request = ThinkRequest("", [TurnMessage("user", "hi")], 8, "alloy", False)
            words = [o.text for o in moved.think(request)]
            assert words and moved.worker is spare and model.readmissions == 1
            assert ray.get(full.handle.load_report.remote(), timeout=30)[0] == ray_talky.MAX_SESSIONS
            assert ray.get(spare.handle.load_report.remote(), timeout=30)[0] == 2
            # every worker is full now, by the gateway's count too: a new session is refused at once
            with pytest.raises(ModelAtCapacity):
                model.open_session()
        finally:
            for session in sessions:
                session.close()
            model.close()
