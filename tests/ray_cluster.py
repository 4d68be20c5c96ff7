"""A real multi-node Ray cluster on loopback for tests (Ray's ``cluster_utils``).

Every node binds 127.0.0.1 (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` plus ``node_ip_address``;
measured in the project's note on Ray), temp files go to a fresh ``RAY_TMPDIR``, usage stats are
off. The head has no CPU, so model workers land on the worker nodes only.
"""

from __future__ import annotations

import atexit
import contextlib
import ipaddress
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

# Ray reads some of these when it is imported: set them first. One temp folder per test run.
_TMP = tempfile.mkdtemp(prefix="ray-")
atexit.register(shutil.rmtree, _TMP, True)
ENV = {
    "RAY_TMPDIR": _TMP,
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
}
os.environ.update(ENV)

ray = pytest.importorskip("ray", reason="Ray placement tests need ray: pip install 'realtime-omni[ray]'")
from ray.cluster_utils import Cluster  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
LOOPBACK = ipaddress.ip_network("127.0.0.0/8")


@contextlib.contextmanager
def loopback_cluster(worker_nodes: int = 2, cpus_per_node: int = 2) -> Iterator[Cluster]:
    """A CPU-less head and ``worker_nodes`` nodes of ``cpus_per_node`` logical CPUs each (a CPU
    model's worker actor takes one: two models need two, or the second one's actors wait)."""
    env = {
        **ENV,
        # actor processes import this checkout (and tests.*), not whatever is installed
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    }
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    cluster = None
    try:
        cluster = Cluster(initialize_head=True, head_node_args={
            "num_cpus": 0, "include_dashboard": False, "object_store_memory": 80 * 2**20,
            "node_ip_address": "127.0.0.1",
        })
        for index in range(worker_nodes):
            cluster.add_node(num_cpus=cpus_per_node, node_ip_address="127.0.0.1", object_store_memory=80 * 2**20,
                             resources={f"worker_{index}": 1})
        ray.init(address=cluster.address, _node_ip_address="127.0.0.1", namespace="realtime_omni_tests",
                 log_to_driver=False)
        yield cluster
    finally:
        with contextlib.suppress(Exception):
            ray.shutdown()
        if cluster is not None:
            with contextlib.suppress(Exception):
                cluster.shutdown()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        shutil.rmtree(_TMP, ignore_errors=True)


def listening_outside_loopback(pids: set[int] | None = None) -> list[str]:
    """TCP listening sockets (``ss -ltnp``) bound outside 127.0.0.0/8, of Ray's processes (or of
    ``pids``): ``["addr:port process", ...]``."""
    out = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, check=True).stdout
    bad = []
    for line in out.splitlines():
        fields = line.split()
        if len(fields) < 4:
            continue
        local, proc = fields[3], " ".join(fields[5:])
        host = local.rsplit(":", 1)[0].strip("[]")
        if pids is not None and not any(f"pid={pid}," in proc for pid in pids):
            continue
        if pids is None and not any(name in proc for name in ("ray", "gcs_server", "raylet", "python", "default_worker")):
            continue
        try:
            address = ipaddress.ip_address(host)
            address = getattr(address, "ipv4_mapped", None) or address  # [::ffff:127.0.0.1]
            if not address.is_loopback:
                bad.append(f"{local} {proc}")
        except ValueError:  # "*" and other wildcards
            bad.append(f"{local} {proc}")
    return bad
