"""Test servers: the package's ServerThread with test defaults (no session store on disk)."""

from __future__ import annotations

from realtime_omni.engines.registry import ModelRegistry
from realtime_omni.server_thread import ServerThread as _ServerThread
from realtime_omni.server_thread import free_port

__all__ = ["ServerThread", "free_port"]


class ServerThread(_ServerThread):
    def __init__(self, registry: ModelRegistry, **settings) -> None:
        settings.setdefault("session_store", "none")
        super().__init__(registry, **settings)
