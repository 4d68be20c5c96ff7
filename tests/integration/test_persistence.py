"""Persistence that keeps up and is honest after a crash.

A real server process with its SQLite store: large items are written incrementally (each item
once, not the whole conversation per change) and the store has caught up moments after the
client leaves; after SIGKILL, a resume says exactly which sequence numbers' effects were lost
and which cannot be replayed, lists the restored conversation, and sends no second
``session.created``.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from pathlib import Path

import pytest
import websockets

from realtime_omni_bench.hostile import ServerProcess

pytestmark = pytest.mark.asyncio(loop_scope="session")
KIB = 1024


async def recv_type(ws, kind: str, seen: list | None = None) -> dict:
    while True:
        event = json.loads(await asyncio.wait_for(ws.recv(), 30))
        if seen is not None:
            seen.append(event)
        if event["type"] == kind:
            return event


def item_event(text: str, item_id: str) -> str:
    return json.dumps({"type": "conversation.item.create", "item": {
        "id": item_id, "type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}})


def stored_items(db: Path, session_id: str) -> int:
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        return int(conn.execute("SELECT COUNT(*) FROM session_items WHERE session_id = ?", (session_id,)).fetchone()[0])


def written_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/io").read_text().splitlines():
        if line.startswith("wchar:"):
            return int(line.split()[1])
    raise RuntimeError("no wchar")


async def test_large_items_are_written_once_and_the_store_keeps_up(tmp_path):
    db = tmp_path / "sessions.db"
    count, size = 48, 256 * KIB
    with ServerProcess("--model", "echo", "--session-store", f"sqlite:///{db}") as server:
        ws = await websockets.connect(f"ws://127.0.0.1:{server.port}/v1/realtime?model=echo", max_size=None)
        created = await recv_type(ws, "session.created")
        sid = created["session"]["id"]
        before = written_bytes(server.proc.pid)
        for index in range(count):
            await ws.send(item_event(chr(ord("a") + index % 26) * size, f"item_{index:03d}"))
        for _ in range(count):
            await recv_type(ws, "conversation.item.done")
        ws.transport.abort()  # the client leaves; the session waits for a resume
        left = time.monotonic()
        while stored_items(db, sid) < count:
            assert time.monotonic() - left < 5, f"store backlog: {stored_items(db, sid)} of {count} items after 5 s"
            await asyncio.sleep(0.05)
        caught_up = time.monotonic() - left
        await asyncio.sleep(0.5)
        written = written_bytes(server.proc.pid) - before
        assert server.metric("realtime_omni_store_backlog_sessions") == 0
    payload = count * size
    print(f"store caught up {caught_up:.2f} s after the client left; wrote {written / 2**20:.1f} MiB "
          f"for {payload / 2**20:.1f} MiB of items ({written / payload:.2f}x)")
    # whole snapshots per change wrote sum(1..48) x 256 KiB = 294 MiB (24x); each item once is ~2x
    # (SQLite writes a page to its WAL, then to the database at the checkpoint)
    assert written < 4 * payload


async def test_a_token_survives_a_sigkill_right_after_session_created(tmp_path):
    """The resume token in session.created is already in the store: a crash of the server the
    moment after still leaves the session resumable (before, the first write waited for the
    store's 0.2 s debounce, and a kill in between left a token that nothing knew)."""
    db = tmp_path / "sessions.db"
    args = ("--model", "echo", "--session-store", f"sqlite:///{db}")
    with ServerProcess(*args) as first:
        ws = await websockets.connect(f"ws://127.0.0.1:{first.port}/v1/realtime?model=echo")
        created = await recv_type(ws, "session.created")
        first.proc.kill()
        first.proc.wait(10)
        ws.transport.abort()
    token, seq = created["session"]["resume_token"], created["sequence_number"]
    with ServerProcess(*args) as second:
        ws = await websockets.connect(
            f"ws://127.0.0.1:{second.port}/v1/realtime?resume_token={token}&last_sequence_number={seq}")
        hello = json.loads(await asyncio.wait_for(ws.recv(), 10))
        assert hello["type"] == "session.resumed", hello
        assert hello["session"]["id"] == created["session"]["id"]
        await ws.close()


async def test_after_sigkill_a_resume_says_exactly_what_was_lost(tmp_path):
    db = tmp_path / "sessions.db"
    args = ("--model", "echo", "--session-store", f"sqlite:///{db}")
    with ServerProcess(*args) as first:
        ws = await websockets.connect(f"ws://127.0.0.1:{first.port}/v1/realtime?model=echo")
        created = await recv_type(ws, "session.created")
        token = created["session"]["resume_token"]
        seen_items: list[str] = []
        last_seq = created["sequence_number"]
        for index in range(400):
            await ws.send(item_event(f"note {index}", f"item_{index:04d}"))
            done = await recv_type(ws, "conversation.item.done")
            seen_items.append(done["item"]["id"])
            last_seq = done["sequence_number"]
        first.proc.kill()  # SIGKILL right after the last event: the store may be behind
        first.proc.wait(10)
        ws.transport.abort()
    with ServerProcess(*args) as second:
        ws = await websockets.connect(
            f"ws://127.0.0.1:{second.port}/v1/realtime?resume_token={token}&last_sequence_number={last_seq}")
        hello = json.loads(await asyncio.wait_for(ws.recv(), 10))
        assert hello["type"] == "session.resumed", hello
        restored = hello["restored"]
        stored = restored["stored_sequence_number"]
        kept = restored["item_ids"]
        print(f"client saw #{last_seq}, store had #{stored}: {len(kept)} of {len(seen_items)} items restored")
        assert hello["gap"] is (stored != last_seq)
        assert restored["lost"] == ([stored + 1, last_seq] if last_seq > stored else None)
        assert restored["not_replayed"] == ([last_seq + 1, stored] if stored > last_seq else None)
        # the restored conversation is what the client saw, cut where the store stopped
        assert kept == seen_items[:len(kept)]
        if restored["lost"] is None:
            assert kept == seen_items
        # what is listed is there; nothing is announced twice
        probe = kept[-1] if kept else "item_none"
        await ws.send(json.dumps({"type": "conversation.item.retrieve", "item_id": probe}))
        after: list = []
        answer = await recv_type(ws, "conversation.item.retrieved" if kept else "error", after)
        assert "session.created" not in [e["type"] for e in after]
        assert answer["sequence_number"] > max(last_seq, stored)
        await ws.close()
