"""The session manager's writes to its store: what a shutdown waits for."""

from __future__ import annotations

import asyncio
import time

import pytest

from realtime_omni.engines.registry import ModelRegistry
from realtime_omni.session.manager import SessionManager
from realtime_omni.session.store import SQLiteStore, token_hash

pytestmark = pytest.mark.asyncio


class SlowStore(SQLiteStore):
    """The real SQLite store on a disk that takes 1.5 s per write."""

    def apply(self, changes, deleted, holder=None):
        time.sleep(1.5)
        return super().apply(changes, deleted, holder)


async def test_closing_the_writes_waits_for_the_batch_being_written(tmp_path):
    """What a shutdown does once the sessions are closed: the batch under way when the flusher
    stops lands before the store is closed and the sessions' leases go (another process could
    load a stale row otherwise)."""
    registry = ModelRegistry()
    registry.load(["echo"])
    path = tmp_path / "s.db"
    manager = SessionManager(registry, store=SlowStore(path))
    manager.start()
    reader = SQLiteStore(path)
    try:
        runner = manager.open("echo")
        deadline = time.monotonic() + 5
        while manager.persister._writing is None:  # the new session's first write, under way
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
        assert await manager.persister.close(timeout=5)
        assert reader.load(token_hash(runner.resume_token), 60) is not None
        assert await manager.persister.settled(runner.core.id, timeout=0.1)
    finally:
        reader.close()
        await manager.shutdown(timeout=5)
        registry.close()


class FailingStore(SQLiteStore):
    """The real SQLite store on a disk that refuses every write."""

    def apply(self, changes, deleted, holder=None):
        time.sleep(0.02)
        raise OSError("the disk is gone")


async def test_a_write_that_fails_is_never_taken_for_written(tmp_path):
    """A session's last changes whose write fails stay marked (retried), so nothing waiting for
    them (a handover's lease release, a shutdown) goes on as if they had landed."""
    registry = ModelRegistry()
    registry.load(["echo"])
    manager = SessionManager(registry, store=FailingStore(tmp_path / "s.db"))
    manager.persister.debounce_s = 0.0  # retried at once, again and again
    manager.start()
    try:
        runner = manager.open("echo")
        assert not await manager.persister.settled(runner.core.id, timeout=1.0)
        assert not await manager.persister.close(timeout=1.0)  # the shutdown says the rest is lost
    finally:
        await manager.shutdown(timeout=2)
        registry.close()
