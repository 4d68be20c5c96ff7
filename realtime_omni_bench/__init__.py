"""``realtime-omni bench``: reproducible benchmarks of a running (or self-started) server.

Sub-benchmarks live in their own modules (``latency``, ``capacity``; others register in
:data:`realtime_omni_bench.cli.BENCHMARKS`) and write their reports through
:mod:`realtime_omni_bench.report` under ``docs/benchmarks/`` by default.

This module holds what they share: starting a server subprocess on a free port (optionally
pinned to some CPUs), reading its CPU time from ``/proc``, and URL helpers.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from urllib.parse import urlparse

from realtime_omni.server_thread import free_port

__all__ = [
    "ServerProcess",
    "ServerURL",
    "SystemCPU",
    "cpu_seconds",
    "free_port",
    "parse_cpus",
    "pinned",
    "process_tree",
    "sched_seconds",
    "tree_cpu_seconds",
]


def parse_cpus(spec: str | None) -> set[int] | None:
    """``"0"``, ``"0,1"``, ``"0-3"`` → a CPU set; ``None``/``""``/``"none"``/``"all"`` → no pinning.

    CPUs this process may not use are dropped; if none is left the result is ``None``
    (a one-core machine cannot separate server and clients, so nothing is pinned).
    """
    if spec is None or spec.strip().lower() in ("", "none", "all"):
        return None
    cpus: set[int] = set()
    for part in spec.split(","):
        part = part.strip()
        if "-" in part:
            lo, hi = part.split("-", 1)
            cpus.update(range(int(lo), int(hi) + 1))
        elif part:
            cpus.add(int(part))
    try:
        allowed = os.sched_getaffinity(0)
    except AttributeError:  # not Linux
        return None
    cpus &= allowed
    return cpus or None


@contextlib.contextmanager
def pinned(cpus: set[int] | None) -> Iterator[set[int] | None]:
    """Pin this process (the benchmark clients) to ``cpus`` for the duration of the block."""
    if cpus is None or not hasattr(os, "sched_setaffinity"):
        yield None
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    try:
        yield cpus
    finally:
        os.sched_setaffinity(0, before)


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of a process (all its threads) from ``/proc/<pid>/stat``."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    # fields[0] is field 3 (state); utime and stime are fields 14 and 15
    utime, stime = int(fields[11]), int(fields[12])
    return (utime + stime) / os.sysconf("SC_CLK_TCK")


def process_tree(pid: int) -> list[int]:
    """``pid`` and all its descendants (e.g. the server's model worker processes)."""
    children: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return [pid]
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    tree, todo = [], [pid]
    while todo:
        current = todo.pop()
        tree.append(current)
        todo.extend(children.get(current, []))
    return tree


def tree_cpu_seconds(pid: int) -> float | None:
    """:func:`cpu_seconds` summed over ``pid`` and its live descendants."""
    values = [cpu_seconds(p) for p in process_tree(pid)]
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def sched_seconds(pid: int, all_threads: bool = False) -> tuple[float, float] | None:
    """(seconds on a CPU, seconds runnable but waiting for one) from ``/proc/<pid>/schedstat``:
    the main thread (the event loop), or the sum over all threads. A large wait means the process
    was starved of CPU by others, not slow by itself."""
    paths = [f"/proc/{pid}/schedstat"]
    if all_threads:
        try:
            paths = [f"/proc/{pid}/task/{tid}/schedstat" for tid in os.listdir(f"/proc/{pid}/task")]
        except OSError:
            return None
    run = wait = 0
    for path in paths:
        try:
            with open(path, encoding="ascii") as f:
                fields = f.read().split()
        except OSError:
            continue
        run, wait = run + int(fields[0]), wait + int(fields[1])
    return run / 1e9, wait / 1e9


def _system_busy_seconds() -> float | None:
    """CPU seconds all cores spent busy since boot (``/proc/stat``: everything but idle/iowait)."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    busy = sum(fields[:8]) - idle  # user nice system idle iowait irq softirq steal
    return busy / os.sysconf("SC_CLK_TCK")


class SystemCPU:
    """Whole-machine CPU use over a window, and how much of it was neither server (with its worker
    processes) nor client:
    the background load of a shared machine, reported next to the results it may disturb."""

    def __init__(self, server_pid: int | None = None) -> None:
        self.server_pid = server_pid
        self._start = self._sample()

    def _sample(self) -> tuple[float, float | None, float | None, float, tuple[float, float] | None]:
        sched = None
        if self.server_pid:
            stats = [sched_seconds(p, all_threads=True) for p in process_tree(self.server_pid)]
            stats = [st for st in stats if st is not None]
            sched = (sum(st[0] for st in stats), sum(st[1] for st in stats)) if stats else None
        return (time.monotonic(), _system_busy_seconds(), tree_cpu_seconds(self.server_pid) if self.server_pid else None,
                time.process_time(), sched)

    def stop(self) -> dict[str, float | None]:
        t1, busy1, srv1, cli1, sched1 = self._sample()
        t0, busy0, srv0, cli0, sched0 = self._start
        wall = max(t1 - t0, 1e-9)
        out: dict[str, float | None] = {"wall_s": round(wall, 2), "loadavg_1m": round(os.getloadavg()[0], 2)}
        out["all_cores_busy"] = None if busy0 is None or busy1 is None else round((busy1 - busy0) / wall, 2)
        out["server_cores"] = None if srv0 is None or srv1 is None else round((srv1 - srv0) / wall, 2)
        out["client_cores"] = round((cli1 - cli0) / wall, 2)
        if out["all_cores_busy"] is not None:
            other = out["all_cores_busy"] - (out["server_cores"] or 0.0) - out["client_cores"]
            out["other_processes_cores"] = round(max(other, 0.0), 2)
        if sched0 is not None and sched1 is not None:
            # summed over the server's threads: seconds per second spent runnable but not running
            out["server_runqueue_wait_cores"] = round((sched1[1] - sched0[1]) / wall, 2)
        return out


@dataclass(frozen=True)
class ServerURL:
    """One server address in the forms the clients need."""

    http: str  # http://host:port (no trailing slash)

    @classmethod
    def parse(cls, url: str) -> ServerURL:
        """Accepts ``http(s)://host:port``, ``ws(s)://host:port`` with or without ``/v1[/realtime]``."""
        parsed = urlparse(url if "://" in url else f"http://{url}")
        scheme = {"ws": "http", "wss": "https"}.get(parsed.scheme, parsed.scheme)
        return cls(f"{scheme}://{parsed.netloc}")

    @property
    def ws(self) -> str:
        return "ws" + self.http[len("http") :]

    @property
    def realtime(self) -> str:
        """The ``/v1/realtime`` WebSocket endpoint."""
        return f"{self.ws}/v1/realtime"

    @property
    def api_base(self) -> str:
        """``base_url`` for the ``openai`` SDK."""
        return f"{self.http}/v1"

    @property
    def ws_api_base(self) -> str:
        """``websocket_base_url`` for the ``openai`` SDK (it appends ``/realtime``)."""
        return f"{self.ws}/v1"

    def ready(self, timeout: float = 2.0) -> dict | None:
        import json

        try:
            with urllib.request.urlopen(f"{self.http}/ready", timeout=timeout) as resp:
                return json.loads(resp.read())
        except (urllib.error.URLError, OSError, ValueError):
            return None


@dataclass
class ServerProcess:
    """``realtime-omni serve`` in a subprocess on a free port; use as a context manager.

    ``cpus`` pins it (``taskset -c`` when available, else ``sched_setaffinity``) so a benchmark
    can keep the server and its clients on different cores.
    """

    models: Sequence[str] = ("echo",)
    cpus: set[int] | None = None
    host: str = "127.0.0.1"
    port: int = 0
    extra_args: Sequence[str] = ()
    log_level: str = "warning"
    max_sessions: int = 10_000
    ready_timeout_s: float = 300.0
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None
    argv: list[str] = field(default_factory=list)
    _log: object = None

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    @property
    def url(self) -> ServerURL:
        return ServerURL(f"http://{self.host}:{self.port}")

    def command(self) -> list[str]:
        argv = [sys.executable, "-m", "realtime_omni", "serve", "--host", self.host, "--port", str(self.port)]
        for model in self.models:
            argv += ["--model", model]
        argv += ["--log-level", self.log_level, "--max-sessions", str(self.max_sessions), *self.extra_args]
        if self.cpus is not None and shutil.which("taskset"):
            argv = ["taskset", "-c", ",".join(str(c) for c in sorted(self.cpus)), *argv]
        return argv

    def start(self) -> ServerURL:
        if not self.port:
            self.port = free_port(self.host)
        self.argv = self.command()
        # kept open for the subprocess's whole life; closed (and removed) by stop()
        self._log = tempfile.NamedTemporaryFile(prefix="realtime-omni-bench-server-", suffix=".log", delete=False)  # noqa: SIM115
        preexec = None
        if self.cpus is not None and self.argv[0] != "taskset":
            cpus = set(self.cpus)
            preexec = lambda: os.sched_setaffinity(0, cpus)
        self.proc = subprocess.Popen(
            self.argv,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **self.env},
            preexec_fn=preexec,  # noqa: PLW1509
        )
        deadline = time.monotonic() + self.ready_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                tail = self.log_tail()
                self.stop()
                raise RuntimeError(f"server exited with code {self.proc.returncode}:\n{tail}")
            if self.url.ready(timeout=1.0):
                return self.url
            time.sleep(0.2)
        tail = self.log_tail()
        self.stop()
        raise RuntimeError(f"server not ready after {self.ready_timeout_s:.0f} s:\n{tail}")

    def log_tail(self, lines: int = 40) -> str:
        if self._log is None:
            return ""
        try:
            with open(self._log.name, encoding="utf-8", errors="replace") as f:  # type: ignore[attr-defined]
                return "".join(f.readlines()[-lines:])
        except OSError:
            return ""

    def stop(self, timeout: float = 15.0) -> None:
        proc = self.proc
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGINT)  # uvicorn: graceful shutdown
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        if self._log is not None:
            self._log.close()  # type: ignore[attr-defined]
            with contextlib.suppress(OSError):
                os.unlink(self._log.name)  # type: ignore[attr-defined]
            self._log = None

    def __enter__(self) -> ServerProcess:  # noqa: PYI034 - a dataclass with no subclasses
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
