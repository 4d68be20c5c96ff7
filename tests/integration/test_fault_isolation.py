"""A model worker killed mid-turn fails only the affected response; the server goes on."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from pathlib import Path

import httpx
import pytest
import websockets

from realtime_omni.engines.registry import ModelRegistry
from tests.server import ServerThread

pytestmark = pytest.mark.asyncio(loop_scope="session")


def children_of(pid: int) -> set[int]:
    kids = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            kids.add(int(stat.parent.name))
    return kids


@pytest.fixture(scope="module")
def isolated():
    before = children_of(os.getpid())
    registry = ModelRegistry()
    registry.load(["embedded"], isolate=True)
    with ServerThread(registry) as srv:
        yield srv, registry.get("embedded")
    registry.close()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and children_of(os.getpid()) - before - _resource_trackers():
        time.sleep(0.1)
    assert not (children_of(os.getpid()) - before - _resource_trackers()), "the model worker must not outlive the registry"


def _resource_trackers() -> set[int]:
    # multiprocessing's resource tracker (one per server process) is not a model worker
    return {pid for pid in children_of(os.getpid()) if b"resource_tracker" in Path(f"/proc/{pid}/cmdline").read_bytes()}


async def recv(ws, timeout=60.0) -> dict:
    return json.loads(await asyncio.wait_for(ws.recv(), timeout))


async def test_sigkill_of_the_worker_mid_turn_fails_the_response_and_recovers(isolated):
    srv, model = isolated
    async with httpx.AsyncClient(base_url=srv.http) as http:
        assert (await http.get("/ready")).status_code == 200
    ws = await websockets.connect(f"{srv.ws}/v1/realtime?model=embedded")
    await recv(ws)
    await ws.send(json.dumps({"type": "session.update", "session": {"type": "realtime", "output_modalities": ["text"],
                                                                    "audio": {"input": {"turn_detection": None}}}}))
    await ws.send(json.dumps({"type": "conversation.item.create", "item": {"type": "message", "role": "user", "content": [
        {"type": "input_text", "text": "Tell me a very long story about the sea."}]}}))
    await ws.send(json.dumps({"type": "response.create", "response": {"max_output_tokens": 400}}))
    while (await recv(ws))["type"] != "response.output_text.delta":
        pass
    old_pid = model.pid
    os.kill(old_pid, signal.SIGKILL)
    killed_at = time.monotonic()
    events = []
    while True:
        event = await recv(ws)
        events.append(event)
        if event["type"] == "response.done":
            break
    assert time.monotonic() - killed_at < 2.0
    assert event["response"]["status"] == "failed"
    assert any(e["type"] == "error" and e["error"]["code"] == "server_error" for e in events)
    # the worker comes back (new pid) and the next turn of the same session works
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (model.ready and model.pid != old_pid):
        await asyncio.sleep(0.1)
    assert model.ready and model.pid != old_pid and model.restarts >= 1
    async with httpx.AsyncClient(base_url=srv.http) as http:
        ready = (await http.get("/ready")).json()
        assert ready["status"] == "ready" and ready["worker_restarts"]["embedded"] >= 1
    await ws.send(json.dumps({"type": "response.create", "response": {"max_output_tokens": 20}}))
    while (event := await recv(ws))["type"] != "response.done":
        pass
    assert event["response"]["status"] in ("completed", "incomplete")
    await ws.close()
