"""A realtime_omni server on a loopback port, in a background thread of this process.

For tests, benchmarks that need to look inside the server, and applications that embed it.
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

import uvicorn

from .app import create_app
from .config import ServerSettings
from .config_sources import nest_flat, validate
from .engines.registry import ModelRegistry


class DrainingServer(uvicorn.Server):
    """uvicorn's server, telling the app first when it goes down (``app.state.draining``), so
    connection handlers let go of their clients at once (close 1012, the session kept for the
    lifespan to close) instead of waiting for the graceful timeout to cancel them."""

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        draining = getattr(getattr(self.config.app, "state", None), "draining", None)
        if draining is not None:
            draining.set()
        await super().shutdown(sockets)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


class ServerThread:
    """``with ServerThread(registry, **settings) as srv:`` serves ``registry``'s loaded models on
    ``srv.http`` / ``srv.ws`` until the block ends. ``settings`` are sections (``limits={...}``)
    or flat names (``max_sessions=3``, see ``config_sources.FLAT_NAMES``); the environment is
    not read."""

    def __init__(self, registry: ModelRegistry, host: str = "127.0.0.1", **settings: Any) -> None:
        self.port = free_port(host)
        self.host = host
        tree = nest_flat(settings)
        tree.setdefault("server", {}).update(host=host, port=self.port)
        self.settings: ServerSettings = validate(tree)
        self.app = create_app(self.settings, registry=registry)
        config = uvicorn.Config(
            self.app, host=host, port=self.port, log_level="warning", ws_max_size=32 * 1024 * 1024, lifespan="on",
            timeout_graceful_shutdown=self.settings.server.shutdown_timeout_s / 2,
        )
        self.server = DrainingServer(config)
        self.thread = threading.Thread(target=self.server.run, name=f"server-{self.port}", daemon=True)

    @property
    def http(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def ws(self) -> str:
        return f"ws://{self.host}:{self.port}"

    @property
    def manager(self) -> Any:
        return self.app.state.manager

    def __enter__(self) -> "ServerThread":
        self.thread.start()
        deadline = time.monotonic() + 60
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the server did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(30)
