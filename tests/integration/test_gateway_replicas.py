"""Gateway replicas that share sessions through Redis.

Two server processes (gateways) run at once against one real redis-server on loopback. A client
talks to the first; the first is killed (SIGKILL: no goodbye, no flush); the client reconnects
through the second with its resume token and carries on: the conversation it had is there, the
resume says exactly what (if anything) was lost, and the session belongs to the same API key on
every gateway.
"""

from __future__ import annotations

import asyncio
import json

import pytest
import websockets

from realtime_omni_bench.hostile import ServerProcess

from .test_persistence import item_event, recv_type

pytestmark = pytest.mark.asyncio(loop_scope="session")
KEY = "sk-gateway-test"


async def test_a_session_carries_on_through_another_gateway_after_its_gateway_dies(redis_url):
    args = ("--model", "echo", "--session-store", redis_url, "--api-key", KEY)
    auth = {"Authorization": f"Bearer {KEY}"}
    with ServerProcess(*args) as first, ServerProcess(*args) as second:
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
        await asyncio.sleep(1.0)  # the store writes every 0.2 s: these items are committed (room for a busy machine)
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
