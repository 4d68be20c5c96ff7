"""Per-session memory is bounded in bytes: conversation and instructions (a clear
``session_memory_exceeded`` error, and the session goes on), the resume journal (the oldest
events leave; a resume says so), and deleted items leave the journal too.

Real servers on loopback (a server process where its RSS is measured), real WebSocket clients.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
import websockets

from realtime_omni_bench.hostile import ServerProcess
from tests.server import ServerThread

pytestmark = pytest.mark.asyncio(loop_scope="session")
MIB = 1024 * 1024


async def recv_type(ws, kind: str, seen: list | None = None, timeout: float = 30.0) -> dict:
    while True:
        event = json.loads(await asyncio.wait_for(ws.recv(), timeout))
        if seen is not None:
            seen.append(event)
        if event["type"] == kind or (event["type"] == "error" and kind != "error"):
            return event


def text_item(text: str, item_id: str | None = None) -> str:
    item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}
    if item_id:
        item["id"] = item_id
    return json.dumps({"type": "conversation.item.create", "item": item})


async def test_a_client_past_its_byte_budget_gets_a_clear_error_and_the_session_goes_on(registry):
    with ServerThread(registry, max_session_bytes=4 * MIB) as srv:
        async with websockets.connect(f"{srv.ws}/v1/realtime?model=echo", max_size=None) as ws:
            await recv_type(ws, "session.created")
            accepted = 0
            for index in range(8):
                await ws.send(text_item("x" * MIB, f"item_big_{index}"))
                event = await recv_type(ws, "conversation.item.done")
                if event["type"] == "error":
                    break
                accepted += 1
            assert accepted == 3, "4 MiB hold three 1 MiB items, not a fourth"
            assert event["error"]["code"] == "session_memory_exceeded"
            assert event["error"]["param"] == "item"
            assert "4194304" in event["error"]["message"]
            # instructions count too
            await ws.send(json.dumps({"type": "session.update", "session": {"type": "realtime", "instructions": "y" * MIB}}))
            refused = await recv_type(ws, "session.updated")
            assert refused["type"] == "error" and refused["error"]["param"] == "session.instructions"
            # the session goes on: deleting makes room again
            await ws.send(json.dumps({"type": "conversation.item.delete", "item_id": "item_big_0"}))
            await recv_type(ws, "conversation.item.deleted")
            await ws.send(text_item("x" * MIB, "item_big_again"))
            assert (await recv_type(ws, "conversation.item.done"))["type"] == "conversation.item.done"


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


async def test_server_memory_stays_flat_while_a_client_sends_large_items():
    env = {"REALTIME_OMNI_MAX_SESSION_BYTES": str(8 * MIB), "REALTIME_OMNI_JOURNAL_BYTES": str(4 * MIB)}
    with ServerProcess("--model", "echo", "--session-store", "none", env=env) as server:
        async with websockets.connect(f"ws://127.0.0.1:{server.port}/v1/realtime?model=echo", max_size=None) as ws:
            await recv_type(ws, "session.created")
            refused = 0

            async def send(count: int) -> None:
                nonlocal refused
                for _ in range(count):
                    await ws.send(text_item("z" * MIB))
                    if (await recv_type(ws, "conversation.item.done"))["type"] == "error":
                        refused += 1

            await send(12)  # warm-up: past the budget already, allocator pools settled
            before = _rss_mb(server.proc.pid)
            await send(96)
            after = _rss_mb(server.proc.pid)
        print(f"server RSS {before:.0f} -> {after:.0f} MB over 96 more 1 MiB items ({refused} refused)")
        assert refused >= 96
        assert after - before < 32, "unbounded, the server kept every item (about 1 MiB of RSS each)"


async def test_the_journal_keeps_no_deleted_item_and_replays_in_order(registry):
    with ServerThread(registry, resume_grace_s=10.0) as srv:
        ws = await websockets.connect(f"{srv.ws}/v1/realtime?model=echo", max_size=None)
        created = await recv_type(ws, "session.created")
        token = created["session"]["resume_token"]
        await ws.send(text_item("the secret is swordfish", "item_secret"))
        await recv_type(ws, "conversation.item.done")
        await ws.send(json.dumps({"type": "conversation.item.delete", "item_id": "item_secret"}))
        deleted = await recv_type(ws, "conversation.item.deleted")
        ws.transport.abort()
        resumed = await websockets.connect(
            f"{srv.ws}/v1/realtime?resume_token={token}&last_sequence_number={created['sequence_number']}", max_size=None)
        hello = json.loads(await asyncio.wait_for(resumed.recv(), 10))
        assert hello["type"] == "session.resumed" and hello["gap"] is False
        replay = [json.loads(await asyncio.wait_for(resumed.recv(), 10)) for _ in range(hello["replayed"])]
        await resumed.close()
        assert [e["type"] for e in replay] == ["conversation.item.added", "conversation.item.done", "conversation.item.deleted"]
        assert [e["sequence_number"] for e in replay] == list(range(created["sequence_number"] + 1, deleted["sequence_number"] + 1))
        assert "swordfish" not in json.dumps(replay)
        assert replay[0]["item"]["id"] == "item_secret" and replay[0]["item"]["content"] == []


async def test_the_journal_is_bounded_in_bytes_and_a_resume_past_it_reports_the_gap(registry):
    with ServerThread(registry, resume_grace_s=10.0, journal_bytes=MIB) as srv:
        ws = await websockets.connect(f"{srv.ws}/v1/realtime?model=echo", max_size=None)
        created = await recv_type(ws, "session.created")
        token = created["session"]["resume_token"]
        for _ in range(4):  # 4 items, each echoed twice (added, done): ~4 MiB of events
            await ws.send(text_item("w" * (512 * 1024)))
            await recv_type(ws, "conversation.item.done")
        runner = next(iter(srv.manager.sessions.values()))
        assert runner.journal.nbytes <= MIB
        ws.transport.abort()
        resumed = await websockets.connect(
            f"{srv.ws}/v1/realtime?resume_token={token}&last_sequence_number={created['sequence_number']}", max_size=None)
        hello = json.loads(await asyncio.wait_for(resumed.recv(), 10))
        await resumed.close()
        assert hello["type"] == "session.resumed"
        assert hello["gap"] is True
        assert hello["replayed"] < 8


async def test_items_the_full_conversation_lets_go_are_announced_and_leave_the_journal(registry):
    from realtime_omni.session.conversation import MAX_ITEMS

    # the items go out in one burst: past the default event rate (500 per second, 2 s of burst)
    # when the server reads them late, which is not what this test is about
    with ServerThread(registry, resume_grace_s=10.0, max_events_per_s=100_000.0) as srv:
        ws = await websockets.connect(f"{srv.ws}/v1/realtime?model=echo", max_size=None)
        created = await recv_type(ws, "session.created")
        token = created["session"]["resume_token"]
        for index in range(MAX_ITEMS):
            await ws.send(text_item(f"note {index} swordfish" if index == 0 else f"note {index}", f"item_{index:05d}"))
        for _ in range(MAX_ITEMS):
            assert (await recv_type(ws, "conversation.item.done"))["type"] == "conversation.item.done"
        await ws.send(text_item("one too many", "item_last"))
        seen: list = []
        await recv_type(ws, "conversation.item.done", seen)
        deleted = [e for e in seen if e["type"] == "conversation.item.deleted"]
        assert [e["item_id"] for e in deleted] == ["item_00000"]
        ws.transport.abort()
        resumed = await websockets.connect(
            f"{srv.ws}/v1/realtime?resume_token={token}&last_sequence_number={created['sequence_number']}", max_size=None)
        hello = json.loads(await asyncio.wait_for(resumed.recv(), 10))
        replay = [json.loads(await asyncio.wait_for(resumed.recv(), 10)) for _ in range(hello["replayed"])]
        await resumed.close()
        assert hello["gap"] is False
        assert replay[0]["item"]["id"] == "item_00000" and "swordfish" not in json.dumps(replay)
