"""Which gateway holds a live session: the lease bookkeeping against a real redis-server."""

from __future__ import annotations

import asyncio
import time

import pytest
import redis

from realtime_omni.session.ownership import Ownership
from realtime_omni.session.store import RedisStore

pytestmark = pytest.mark.asyncio


class SlowRenewals(RedisStore):
    """The real Redis store whose renewals take half a second (a busy lease thread)."""

    def hold(self, *args, **kwargs):
        time.sleep(0.5)
        return super().hold(*args, **kwargs)


async def test_a_session_released_while_a_renewal_runs_is_not_held_again(redis_url):
    store = SlowRenewals(redis_url, ttl_s=60)
    live = {"sess_1"}
    let_go: list = []

    async def record(sid, write):
        let_go.append((sid, write))

    ownership = Ownership(store, 5.0, lambda: set(live), record)
    try:
        await ownership.renew()
        assert ownership.held == {"sess_1"}
        renewal = asyncio.create_task(ownership.renew())
        await asyncio.sleep(0.1)  # the renewal is under way: the session ends and its lease goes
        live.clear()
        ownership.letting_go("sess_1")
        await ownership.release(["sess_1"])
        await renewal
        assert ownership.held == set() and ownership.pending == set() and let_go == []
        with redis.Redis.from_url(redis_url) as client:  # nor left held in Redis for its lease
            assert client.get("realtime_omni:holder:sess_1") is None
    finally:
        await ownership.close(1.0)
        store.close()
