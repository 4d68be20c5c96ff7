"""Stored sessions: every way a session ends removes its row (or keeps it for a restart, then
purges it), and transcripts can be kept out of the store.

Real servers (a server process where it is killed), the real SQLite file read as an operator
would, real WebSocket and simulated-carrier (Twilio) clients.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from pathlib import Path

import pytest
import websockets

from realtime_omni_bench.telephony import SimulatedCarrier
from realtime_omni.transports.twilio import STREAM_PATH
from realtime_omni_bench.hostile import ServerProcess
from tests.server import ServerThread

pytestmark = pytest.mark.asyncio(loop_scope="session")


def rows(db: Path) -> int:
    """Stored sessions; none may leave items behind."""
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        sessions = int(conn.execute("SELECT COUNT(*) FROM session_meta").fetchone()[0])
        orphans = conn.execute("SELECT COUNT(*) FROM session_items WHERE session_id NOT IN (SELECT id FROM session_meta)")
        assert orphans.fetchone()[0] == 0
        return sessions


async def until_rows(db: Path, count: int, timeout: float) -> float:
    start = time.monotonic()
    while True:
        current = rows(db)
        if current == count:
            return time.monotonic() - start
        if time.monotonic() - start > timeout:
            raise AssertionError(f"{current} stored sessions after {timeout} s, expected {count}")
        await asyncio.sleep(0.1)


async def recv_type(ws, kind: str) -> dict:
    while True:
        event = json.loads(await asyncio.wait_for(ws.recv(), 30))
        if event["type"] == kind:
            return event


ITEM = json.dumps({"type": "conversation.item.create", "item": {
    "type": "message", "role": "user", "content": [{"type": "input_text", "text": "the password is swordfish"}]}})


async def _websocket_session(srv, ending: str) -> None:
    ws = await websockets.connect(f"{srv.ws}/v1/realtime?model=echo")
    await recv_type(ws, "session.created")
    await ws.send(ITEM)
    await recv_type(ws, "conversation.item.done")
    await until_rows(srv.db, 1, timeout=5)
    if ending == "client_closed":
        await ws.close()
    elif ending == "idle":
        await recv_type(ws, "error")  # session_idle_timeout
        await ws.close()
    else:  # the network drops it; nobody resumes
        ws.transport.abort()


async def _phone_call(srv, ending: str) -> None:
    carrier = SimulatedCarrier(srv.ws + STREAM_PATH, custom_parameters={"model": "echo"})
    await carrier.connect()
    await until_rows(srv.db, 1, timeout=5)
    if ending == "twilio_stop":
        await carrier.stop()
        await carrier.close()
    else:
        await carrier.abort()


@pytest.mark.parametrize("ending", ["client_closed", "idle", "dropped", "twilio_stop", "twilio_dropped"])
async def test_every_ending_removes_the_stored_session(registry, tmp_path, ending):
    db = tmp_path / "sessions.db"
    settings = {"session_store": f"sqlite:///{db}", "resume_grace_s": 0.5}
    if ending == "idle":
        settings["idle_timeout_s"] = 1.0
    with ServerThread(registry, **settings) as srv:
        srv.db = db
        if ending.startswith("twilio"):
            await _phone_call(srv, ending)
        else:
            await _websocket_session(srv, ending)
        await until_rows(db, 0, timeout=10)
        assert srv.manager.sessions == {}


async def test_rows_left_by_a_killed_server_are_purged_after_their_ttl(tmp_path):
    db = tmp_path / "sessions.db"
    args = ("--model", "echo", "--session-store", f"sqlite:///{db}")
    env = {"REALTIME_OMNI_PERSIST_TTL_S": "2"}
    with ServerProcess(*args, env=env) as first:
        ws = await websockets.connect(f"ws://127.0.0.1:{first.port}/v1/realtime?model=echo")
        await recv_type(ws, "session.created")
        await ws.send(ITEM)
        await recv_type(ws, "conversation.item.done")
        await until_rows(db, 1, timeout=5)
        first.kill()  # SIGKILL: no ending is ever recorded
        ws.transport.abort()
    assert rows(db) == 1
    with ServerProcess(*args, env=env):
        took = await until_rows(db, 0, timeout=10)
    print(f"the killed server's session was purged {took:.1f} s after the restart (TTL 2 s)")


async def test_transcripts_can_be_kept_out_of_the_store(registry, tmp_path):
    db = tmp_path / "sessions.db"
    settings = {"session_store": f"sqlite:///{db}", "store_transcripts": False}
    with ServerThread(registry, **settings) as first:
        ws = await websockets.connect(f"{first.ws}/v1/realtime?model=embedded")
        created = await recv_type(ws, "session.created")
        await ws.send(json.dumps({"type": "session.update", "session": {"type": "realtime", "instructions": "Be brief."}}))
        await ws.send(ITEM)
        done = await recv_type(ws, "conversation.item.done")
        # what was said reaches calls too: their arguments and outputs stay out as well (the
        # embedded model calls functions: echo takes no call items)
        for item in ({"type": "function_call", "call_id": "call_1", "name": "remember",
                      "arguments": json.dumps({"secret": "swordfish"})},
                     {"type": "function_call_output", "call_id": "call_1", "output": "stored swordfish"}):
            await ws.send(json.dumps({"type": "conversation.item.create", "item": item}))
            added = await recv_type(ws, "conversation.item.done")
            assert added["item"]["type"] == item["type"]
        await until_rows(db, 1, timeout=5)
        await asyncio.sleep(0.5)  # the snapshot after the item is written off the loop
        ws.transport.abort()
    stored = b"".join(path.read_bytes() for path in tmp_path.iterdir() if path.name.startswith("sessions.db"))
    assert b"swordfish" not in stored
    assert b"Be brief." in stored  # settings are still kept
    with ServerThread(registry, **settings) as second:  # a restart: the item's shape survives
        token = created["session"]["resume_token"]
        ws = await websockets.connect(f"{second.ws}/v1/realtime?resume_token={token}&last_sequence_number=1")
        assert (await recv_type(ws, "session.resumed"))["session"]["instructions"] == "Be brief."
        await ws.send(json.dumps({"type": "conversation.item.retrieve", "item_id": done["item"]["id"]}))
        item = (await recv_type(ws, "conversation.item.retrieved"))["item"]
        assert item["content"] == [{"type": "input_text"}]
        await ws.close()


async def test_a_live_session_is_not_purged_however_quiet(registry, tmp_path):
    db = tmp_path / "sessions.db"
    with ServerThread(registry, session_store=f"sqlite:///{db}", persist_ttl_s=1.0) as srv:
        ws = await websockets.connect(f"{srv.ws}/v1/realtime?model=echo")
        await recv_type(ws, "session.created")
        await ws.send(ITEM)
        await recv_type(ws, "conversation.item.done")
        await until_rows(db, 1, timeout=5)
        await asyncio.sleep(2.5)  # past the TTL, several purges later: still live, still stored
        assert rows(db) == 1
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
            assert conn.execute("SELECT COUNT(*) FROM session_items").fetchone()[0] == 1
        await ws.close()
        await until_rows(db, 0, timeout=5)


async def test_a_session_ended_by_its_client_is_not_rebuilt_from_its_row_before_the_delete(registry, tmp_path):
    """A client closes its session and resumes at once, before the store's delete is written:
    the ended session stays ended (resume_token_invalid), it is not rebuilt from the row."""
    db = tmp_path / "sessions.db"
    with ServerThread(registry, session_store=f"sqlite:///{db}", resume_grace_s=5.0) as srv:
        ws = await websockets.connect(f"{srv.ws}/v1/realtime?model=echo")
        created = await recv_type(ws, "session.created")
        await ws.send(ITEM)
        await recv_type(ws, "conversation.item.done")
        await until_rows(db, 1, timeout=5)
        await ws.close()  # client_closed: the session ends for good
        while srv.manager.sessions:
            await asyncio.sleep(0.005)
        token = created["session"]["resume_token"]
        again = await websockets.connect(f"{srv.ws}/v1/realtime?resume_token={token}")
        event = json.loads(await asyncio.wait_for(again.recv(), 10))
        assert event["type"] == "error" and event["error"]["code"] == "resume_token_invalid"
        await again.close()
        await until_rows(db, 0, timeout=10)
        assert srv.manager.sessions == {}
