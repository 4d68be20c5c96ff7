"""Hostile clients on real sockets, and a real server process to point them at (for the tests
and ``benchmarks/hardening.py``).

A :class:`RawClient` speaks just enough WebSocket (RFC 6455 handshake, masked text frames) to
do what a well-behaved library never does: flood events without ever reading a byte back, then
drop the TCP connection with a reset instead of a close frame.
"""

from __future__ import annotations

import base64
import os
import re
import signal
import socket
import struct
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from realtime_omni.server_thread import free_port

#: the folder holding this copy of the package: the server process imports the same code
REPO = Path(__file__).resolve().parent.parent


class RawClient:
    def __init__(self, port: int, path: str = "/v1/realtime?model=echo", headers: dict[str, str] | None = None) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        # a small receive buffer: the server's sends back up after a few frames, as with a slow reader
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        key = base64.b64encode(os.urandom(16)).decode()
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        self.sock.sendall(
            f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n{extra}\r\n".encode())
        head = b""
        while b"\r\n\r\n" not in head:
            data = self.sock.recv(1)  # byte by byte: nothing after the headers is read
            if not data:
                raise ConnectionError("closed during the handshake")
            head += data
        status = head.split(b"\r\n", 1)[0]
        if b" 101 " not in status:
            raise ConnectionError(status.decode())

    def send_text(self, text: str, timeout: float = 2.0) -> bool:
        """One masked text frame; False when the server stopped taking bytes within ``timeout``."""
        payload = text.encode()
        n = len(payload)
        if n < 126:
            head = struct.pack("!BB", 0x81, 0x80 | n)
        elif n < 1 << 16:
            head = struct.pack("!BBH", 0x81, 0x80 | 126, n)
        else:
            head = struct.pack("!BBQ", 0x81, 0x80 | 127, n)
        mask = os.urandom(4)
        masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload)) if n < 4096 else _mask(payload, mask)
        self.sock.settimeout(timeout)
        try:
            self.sock.sendall(head + mask + masked)
        except (socket.timeout, OSError):
            return False
        return True

    def flood(self, text: str, count: int, timeout: float = 2.0) -> int:
        """Send up to ``count`` frames until the server pushes back; returns how many went."""
        for sent in range(count):
            if not self.send_text(text, timeout):
                return sent
        return count

    def abort(self) -> None:
        """Drop the connection with a TCP reset (no close frame, no FIN)."""
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.sock.close()


def _mask(payload: bytes, mask: bytes) -> bytes:
    import numpy as np

    data = np.frombuffer(payload, np.uint8)
    key = np.resize(np.frombuffer(mask, np.uint8), data.size)
    return (data ^ key).tobytes()


class ServerProcess:
    """``python -m realtime_omni serve`` in a process of its own, settings from the environment."""

    def __init__(self, *args: str, env: dict[str, str] | None = None) -> None:
        self.args = args
        self.port = free_port()
        environ = {**os.environ, **(env or {}), "PYTHONPATH": str(REPO)}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "realtime_omni", "serve", "--port", str(self.port), "--no-isolate-models",
             "--log-level", "warning", *args],
            cwd=REPO, env=environ, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"{self.http}/health", timeout=1).read()
                break
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.kill()
                    raise RuntimeError(f"server did not start: {self.output()}") from None
                time.sleep(0.1)

    @property
    def http(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def rss_mb(self) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        raise RuntimeError("no VmRSS")

    def metric(self, name: str) -> float:
        """The sum of ``name``'s samples over all its labels (0 for a declared family with none)."""
        body = urllib.request.urlopen(f"{self.http}/metrics", timeout=5).read().decode()
        samples = re.findall(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", body, re.M)
        if not samples and f"# TYPE {name} " not in body:
            raise KeyError(name)
        return sum(float(v) for v in samples)

    def wait_metric(self, name: str, value: float, timeout: float) -> float:
        """Seconds until ``name`` reads ``value`` (raises after ``timeout``)."""
        start = time.monotonic()
        while True:
            current = self.metric(name)
            if current == value:
                return time.monotonic() - start
            if time.monotonic() - start > timeout:
                raise AssertionError(f"{name} is {current} after {timeout} s, expected {value}")
            time.sleep(0.1)

    def terminate(self, timeout: float) -> float:
        """SIGTERM; seconds until the process exited (raises, and kills it, past ``timeout``)."""
        start = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"the server was still running {timeout} s after SIGTERM") from None
        return time.monotonic() - start

    def output(self) -> str:
        if self.proc.poll() is None:
            return ""
        assert self.proc.stdout is not None
        return self.proc.stdout.read().decode(errors="replace")

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def __enter__(self) -> "ServerProcess":
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()
