"""A real realtime_omni server on a loopback port, run in a background thread for tests."""

from __future__ import annotations

import socket
import threading
import time

import uvicorn

from realtime_omni.app import create_app
from realtime_omni.config import ServerSettings
from realtime_omni.engines.registry import ModelRegistry


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerThread:
    def __init__(self, registry: ModelRegistry, **settings) -> None:
        self.port = free_port()
        settings.setdefault("session_store", "none")
        self.settings = ServerSettings(host="127.0.0.1", port=self.port, **settings)
        self.app = create_app(self.settings, registry=registry)
        config = uvicorn.Config(
            self.app, host="127.0.0.1", port=self.port, log_level="warning", ws_max_size=32 * 1024 * 1024, lifespan="on"
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name=f"server-{self.port}", daemon=True)

    @property
    def http(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ws(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    @property
    def manager(self):  # type: ignore[no-untyped-def]
        return self.app.state.manager

    def __enter__(self) -> "ServerThread":
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("test server did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(15)
