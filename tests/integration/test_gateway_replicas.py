"""Gateway replicas that share sessions through Redis.

Two server processes (gateways) run at once against one real redis-server on loopback. A client
talks to the first; the first is killed (SIGKILL: no goodbye, no flush); the client reconnects
through the second with its resume token and carries on: the conversation it had is there, the
resume says exactly what (if anything) was lost, and the session belongs to the same API key on
every gateway. And while both gateways live, a client whose connection to the first dropped (or
hangs) and who comes back through the second moves its session there: the first lets its copy go
and writes its last changes, so one gateway at a time serves the session and writes its row.
"""

from __future__ import annotations

import asyncio
import json
import time

import pytest
import redis
import websockets

from realtime_omni.engines.registry import ModelRegistry
from realtime_omni_bench.hostile import ServerProcess

from ..server import ServerThread
from .test_persistence import item_event, recv_type

pytestmark = pytest.mark.asyncio(loop_scope="session")
KEY = "sk-gateway-test"


async def until(check, timeout: float = 10.0, what: str = "the condition"):
    deadline = time.monotonic() + timeout
    while not (value := check()):
        assert time.monotonic() < deadline, f"{what} did not come within {timeout} s"
        await asyncio.sleep(0.05)
    return value


def stored_items(url: str, session_id: str) -> int:
    with redis.Redis.from_url(url) as client:
        return int(client.hlen(f"realtime_omni:items:{session_id}"))


def stored_seq(url: str, session_id: str) -> int:
    with redis.Redis.from_url(url) as client:
        doc = client.get(f"realtime_omni:session:{session_id}")
    return int(json.loads(doc)["meta"]["last_seq"]) if doc else -1


def holder(url: str, session_id: str) -> str | None:
    with redis.Redis.from_url(url) as client:
        value = client.get(f"realtime_omni:holder:{session_id}")
    return value.decode() if value else None


async def test_a_session_carries_on_through_another_gateway_after_its_gateway_dies(redis_url):
    args = ("--model", "echo", "--session-store", redis_url, "--api-key", KEY)
    auth = {"Authorization": f"Bearer {KEY}"}
    lease = {"REALTIME_OMNI_STORE__LEASE_S": "2"}  # the dead gateway's leases lapse after 2 s
    with ServerProcess(*args, env=lease) as first, ServerProcess(*args, env=lease) as second:
        ws = await websockets.connect(f"ws://127.0.0.1:{first.port}/v1/realtime?model=echo", additional_headers=auth)
        created = await recv_type(ws, "session.created")
        token = created["session"]["resume_token"]
        await ws.send(json.dumps({"type": "session.update", "session": {"type": "realtime", "instructions": "Be brief."}}))
        await recv_type(ws, "session.updated")
        said: list[str] = []
        last_seq = created["sequence_number"]
        for index in range(30):
            await ws.send(item_event(f"note {index}", f"item_{index:03d}"))
            done = await recv_type(ws, "conversation.item.done")
            said.append(done["item"]["id"])
            last_seq = done["sequence_number"]
        sid = created["session"]["id"]
        await until(lambda: stored_items(redis_url, sid) == 30 and stored_seq(redis_url, sid) >= last_seq,
                    what="the 30 items and the sequence number the client saw, in Redis")
        first.proc.kill()
        first.proc.wait(10)
        ws.transport.abort()

        url = f"ws://127.0.0.1:{second.port}/v1/realtime?resume_token={token}&last_sequence_number={last_seq}"
        # another key cannot take the session over, on any gateway
        with pytest.raises(websockets.InvalidStatus) as refused:
            await websockets.connect(url, additional_headers={"Authorization": "Bearer sk-other"})
        assert refused.value.response.status_code == 401
        ws = await websockets.connect(url, additional_headers=auth)
        hello = json.loads(await asyncio.wait_for(ws.recv(), 10))
        assert hello["type"] == "session.resumed"
        assert hello["session"]["id"] == created["session"]["id"]
        assert hello["session"]["instructions"] == "Be brief."
        restored = hello["restored"]
        # committed before the gateway died: nothing lost, everything back
        assert restored["lost"] is None and hello["gap"] is False, restored
        assert restored["item_ids"] == said
        # the conversation goes on through the second gateway, numbered after what was seen
        await ws.send(item_event("after the failover", "item_after"))
        done = await recv_type(ws, "conversation.item.done")
        assert done["sequence_number"] > last_seq
        await ws.send(json.dumps({"type": "conversation.item.retrieve", "item_id": said[0]}))
        item = await recv_type(ws, "conversation.item.retrieved")
        assert item["item"]["content"][0]["text"] == "note 0"
        await ws.close()


OTHER_KEY = "sk-gateway-other"


async def refused(url: str, key: str) -> tuple[str, int]:
    """A resume the gateway answers with an error event and a close: the error's code, the close code."""
    ws = await websockets.connect(url, additional_headers={"Authorization": f"Bearer {key}"})
    event = json.loads(await asyncio.wait_for(ws.recv(), 15))
    assert event["type"] == "error", event
    with pytest.raises(websockets.ConnectionClosed) as closed:
        await asyncio.wait_for(ws.recv(), 10)
    return event["error"]["code"], closed.value.rcvd.code


def two_gateways(redis_url, second_limits: dict | None = None):
    """Two gateways (real servers in this process, so the test can look inside) on one Redis,
    both accepting two API keys."""
    registry = ModelRegistry()
    registry.load(["echo"])
    sections = {"models": ["echo"], "auth": {"api_keys": [KEY, OTHER_KEY]}, "session_store": redis_url,
                "store": {"resume_grace_s": 30, "lease_s": 2.0}}
    first = ServerThread(registry, **sections)
    second = ServerThread(registry, **sections, limits=second_limits or {})
    return registry, first, second


@pytest.fixture
def gateways(redis_url):
    registry, first, second = two_gateways(redis_url)
    with first, second:
        yield first, second
    registry.close()


async def open_with_items(gateway, count: int) -> tuple[websockets.ClientConnection, dict, list[str], int]:
    auth = {"Authorization": f"Bearer {KEY}"}
    ws = await websockets.connect(f"{gateway.ws}/v1/realtime?model=echo", additional_headers=auth)
    created = await recv_type(ws, "session.created")
    said, last_seq = [], created["sequence_number"]
    for index in range(count):
        await ws.send(item_event(f"note {index}", f"item_{index:03d}"))
        done = await recv_type(ws, "conversation.item.done")
        said.append(done["item"]["id"])
        last_seq = done["sequence_number"]
    return ws, created, said, last_seq


async def test_a_dropped_session_moves_to_the_gateway_its_client_comes_back_through(gateways, redis_url):
    first, second = gateways
    ws, created, said, last_seq = await open_with_items(first, 3)
    sid, token = created["session"]["id"], created["session"]["resume_token"]
    await until(lambda: holder(redis_url, sid) == first.manager.ownership.holder, what="the first gateway's lease")
    ws.transport.abort()  # the client's network drops; the first gateway keeps the session for a resume
    await until(lambda: first.manager.sessions[sid].detached_since is not None, what="the drop")

    url = f"{second.ws}/v1/realtime?resume_token={token}&last_sequence_number={last_seq}"
    # another key of the server's cannot take the session over: the first gateway keeps it
    assert await refused(url, OTHER_KEY) == ("resume_token_invalid", 1008)
    assert sid in first.manager.sessions and first.manager.ownership.moved_out == 0
    assert holder(redis_url, sid) == first.manager.ownership.holder

    ws = await websockets.connect(url, additional_headers={"Authorization": f"Bearer {KEY}"}, open_timeout=15)
    hello = json.loads(await asyncio.wait_for(ws.recv(), 10))
    assert hello["type"] == "session.resumed" and hello["session"]["id"] == sid
    # the first gateway wrote what it had and let its copy go before the second rebuilt it
    assert hello["restored"]["item_ids"] == said and hello["restored"]["lost"] is None
    assert sid not in first.manager.sessions and first.manager.ownership.moved_out == 1
    assert holder(redis_url, sid) == second.manager.ownership.holder
    # the second gateway serves and writes it now
    await ws.send(item_event("after the move", "item_after"))
    await recv_type(ws, "conversation.item.done")
    await until(lambda: stored_items(redis_url, sid) == 4, what="the fourth item in Redis")
    # ended for good through the second: its row and its lease go
    await ws.close()
    await until(lambda: stored_items(redis_url, sid) == 0 and holder(redis_url, sid) is None,
                what="the row and the lease to go")


async def test_a_session_still_attached_elsewhere_is_taken_over_by_its_token_holder(gateways, redis_url):
    first, second = gateways
    old, created, said, last_seq = await open_with_items(first, 2)
    sid, token = created["session"]["id"], created["session"]["resume_token"]
    await until(lambda: holder(redis_url, sid) == first.manager.ownership.holder, what="the first gateway's lease")
    # the first connection looks alive to the first gateway (half-dead): the token holder takes over
    url = f"{second.ws}/v1/realtime?resume_token={token}&last_sequence_number={last_seq}"
    ws = await websockets.connect(url, additional_headers={"Authorization": f"Bearer {KEY}"}, open_timeout=15)
    hello = json.loads(await asyncio.wait_for(ws.recv(), 10))
    assert hello["type"] == "session.resumed" and hello["restored"]["item_ids"] == said
    with pytest.raises(websockets.ConnectionClosed):  # the old connection was let go
        while True:
            await asyncio.wait_for(old.recv(), 10)
    assert sid not in first.manager.sessions
    await ws.close()


async def test_a_gateway_without_room_refuses_a_resume_before_the_holder_lets_go(redis_url):
    registry, first, second = two_gateways(redis_url, second_limits={"max_sessions": 1})
    with first, second:
        ws, created, said, last_seq = await open_with_items(first, 1)
        sid, token = created["session"]["id"], created["session"]["resume_token"]
        await until(lambda: holder(redis_url, sid) == first.manager.ownership.holder, what="the first gateway's lease")
        busy, *_ = await open_with_items(second, 0)  # the second gateway's only place
        url = f"{second.ws}/v1/realtime?resume_token={token}&last_sequence_number={last_seq}"
        assert await refused(url, KEY) == ("session_limit_reached", 1013)
        # nothing was asked of the first gateway: its client still talks to it
        assert first.manager.ownership.moved_out == 0 and holder(redis_url, sid) == first.manager.ownership.holder
        await ws.send(item_event("still here", "item_still"))
        await recv_type(ws, "conversation.item.done")
        await ws.close()
        await busy.close()
    registry.close()


async def test_a_gateway_whose_lease_was_taken_stops_its_copy_and_writes_nothing_more(gateways, redis_url):
    """As after a stall (a pause, a partition from Redis) longer than the lease, during which
    another gateway took the session: this copy's writes are fenced off, and it stops."""
    first, _second = gateways
    ws, created, said, last_seq = await open_with_items(first, 2)
    sid = created["session"]["id"]
    await until(lambda: holder(redis_url, sid) == first.manager.ownership.holder, what="the first gateway's lease")
    await until(lambda: stored_items(redis_url, sid) == 2, what="the two items in Redis")
    with redis.Redis.from_url(redis_url) as client:  # another process holds it now
        client.set(f"realtime_omni:holder:{sid}", "another-gateway", px=60_000)
    await ws.send(item_event("written nowhere", "item_late"))
    with pytest.raises(websockets.ConnectionClosed):  # its next renewal stops the copy
        while True:
            await asyncio.wait_for(ws.recv(), 10)
    await until(lambda: sid not in first.manager.sessions, what="the copy to stop")
    assert first.manager.ownership.lost == 1
    assert stored_items(redis_url, sid) == 2 and holder(redis_url, sid) == "another-gateway"


async def test_the_handover_benchmark_writes_its_report(tmp_path):
    """``realtime-omni bench handover`` (two gateway processes and a redis-server of its own)."""
    import shutil

    from realtime_omni_bench import handover

    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed (scripts/test.sh installs it)")
    paths = await asyncio.to_thread(handover.run, rounds=2, lease_s=1.0, out=str(tmp_path), name="handover")
    data = json.loads(paths["json"].read_text())
    assert data["summary"]["move_ms"]["n"] == 2 and data["summary"]["lease_s"] == 1.0
    assert all(ms > 0 for ms in data["samples"]["move_ms"]) and data["samples"]["failover_ms"] > 0
    assert paths["md"].exists() and paths["png"].exists()


async def test_two_resumes_at_once_through_another_gateway_take_over_one_after_the_other(gateways, redis_url):
    """A client retrying its resume while the first attempt is under way: the attempts rebuild
    the session once, and the later one takes it over from the earlier (as on one gateway)."""
    first, second = gateways
    old, created, said, last_seq = await open_with_items(first, 2)
    sid, token = created["session"]["id"], created["session"]["resume_token"]
    await until(lambda: holder(redis_url, sid) == first.manager.ownership.holder, what="the first gateway's lease")
    old.transport.abort()
    url = f"{second.ws}/v1/realtime?resume_token={token}&last_sequence_number={last_seq}"
    auth = {"Authorization": f"Bearer {KEY}"}
    both = await asyncio.gather(*(websockets.connect(url, additional_headers=auth, open_timeout=15) for _ in range(2)))
    hellos = [json.loads(await asyncio.wait_for(ws.recv(), 15)) for ws in both]
    assert [h["type"] for h in hellos] == ["session.resumed", "session.resumed"], hellos
    # one of them was let go by the other; the survivor talks to the session, rebuilt once
    open_ones = []
    for ws in both:
        try:
            await ws.send(item_event("who is there", f"item_{id(ws)}"))
            await recv_type(ws, "conversation.item.done")
            open_ones.append(ws)
        except (websockets.ConnectionClosed, asyncio.TimeoutError):
            pass
    assert len(open_ones) == 1
    assert list(second.manager.sessions) == [sid] and first.manager.ownership.moved_out == 1
    assert holder(redis_url, sid) == second.manager.ownership.holder
    await open_ones[0].close()
