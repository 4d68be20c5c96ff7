"""Model workers as Ray actors on a real local cluster (head + two worker nodes, loopback only).

Sessions reach the workers through a real server and real WebSocket clients: they spread by free
capacity, a full cluster refuses with ``session_limit_reached``, and a worker actor killed
mid-turn fails the response within 2 s while the next turn is answered by another worker.
The whole file takes about 30 s on 2 cores (one cluster for all tests; the embedded model loads
in ~6 s of it); it skips when Ray is not installed.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import signal
import time
import wave

import pytest
import websockets

from tests.ray_cluster import REPO, listening_outside_loopback, loopback_cluster, ray  # noqa: F401 (skips without ray)
from realtime_omni.engines.registry import ModelRegistry
from tests.engines import ray_talky
from tests.server import ServerThread

pytestmark = [pytest.mark.asyncio(loop_scope="session"), pytest.mark.timeout(180)]


@pytest.fixture(scope="module")
def cluster():
    with loopback_cluster(worker_nodes=2) as c:
        yield c


@pytest.fixture(scope="module")
def served(cluster):
    registry = ModelRegistry()
    registry.load(["echo", "talky"], extra={"talky": ray_talky.build}, ray_address=cluster.address)
    with ServerThread(registry) as srv:
        yield srv, registry
    registry.close()


async def recv(ws, timeout=20.0) -> dict:
    return json.loads(await asyncio.wait_for(ws.recv(), timeout))


async def until(ws, kind: str, timeout=20.0) -> tuple[dict, list[dict]]:
    seen = []
    while True:
        event = await recv(ws, timeout)
        seen.append(event)
        if event["type"] == kind:
            return event, seen


def reported(model) -> dict[str, int]:
    """Each live worker's own count of its sessions (asked now, not the gateway's view)."""
    return {w.worker_id: ray.get(w.handle.load_report.remote(), timeout=10)[0] for w in model.workers if not w.dead}


async def test_every_ray_port_listens_on_loopback_only(served):
    assert listening_outside_loopback() == []


async def test_sessions_spread_across_workers_and_leave_with_their_clients(served):
    srv, registry = served
    echo = registry.get("echo")
    assert len(echo.workers) == 2 and len({w.node_id for w in echo.workers}) == 2
    clients = []
    for _ in range(6):
        ws = await websockets.connect(f"{srv.ws}/v1/realtime?model=echo")
        assert (await recv(ws))["type"] == "session.created"
        clients.append(ws)
    assert sorted(echo.placement().values()) == [3, 3]
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and sorted(reported(echo).values()) != [3, 3]:
        await asyncio.sleep(0.1)
    assert sorted(reported(echo).values()) == [3, 3], "the workers themselves hold 3 sessions each"
    # the sessions work: audio in, the same audio out
    pcm = (b"\x10\x00" * 480)
    await clients[0].send(json.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm).decode()}))
    delta, _ = await until(clients[0], "response.output_audio.delta")
    assert base64.b64decode(delta["delta"])
    for ws in clients:
        await ws.close()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and (sum(echo.placement().values()) or sum(reported(echo).values())):
        await asyncio.sleep(0.1)
    assert sum(echo.placement().values()) == 0 and sum(reported(echo).values()) == 0


async def test_a_full_cluster_refuses_with_session_limit_reached(served):
    srv, registry = served
    talky = registry.get("talky")
    slots = ray_talky.MAX_SESSIONS * len(talky.workers)
    assert talky.info.max_sessions == slots
    clients = []
    for _ in range(slots):
        ws = await websockets.connect(f"{srv.ws}/v1/realtime?model=talky")
        assert (await recv(ws))["type"] == "session.created"
        clients.append(ws)
    assert sorted(talky.placement().values()) == [ray_talky.MAX_SESSIONS] * len(talky.workers)
    refused = await websockets.connect(f"{srv.ws}/v1/realtime?model=talky")
    event = await recv(refused)
    assert event["type"] == "error" and event["error"]["code"] == "session_limit_reached"
    with pytest.raises(websockets.ConnectionClosed) as closed:
        await recv(refused)
    assert closed.value.rcvd.code == 1013
    # a placed session answers with streamed audio from its worker
    ws = clients[0]
    await ws.send(json.dumps({"type": "conversation.item.create", "item": {
        "type": "message", "role": "user", "content": [{"type": "input_text", "text": "hello"}]}}))
    await ws.send(json.dumps({"type": "response.create", "response": {"max_output_tokens": 4}}))
    done, seen = await until(ws, "response.done")
    assert done["response"]["status"] in ("completed", "incomplete"), done
    assert any(e["type"] == "response.output_audio.delta" for e in seen)
    for ws in clients:
        await ws.close()
    # a slot frees when its session leaves
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and sum(talky.placement().values()):
        await asyncio.sleep(0.1)
    ws = await websockets.connect(f"{srv.ws}/v1/realtime?model=talky")
    assert (await recv(ws))["type"] == "session.created"
    await ws.close()


async def ask_for_a_long_text_reply(srv, text: str, tokens: int):
    """A talky session that asked for a text reply of ``tokens`` words; returns the socket."""
    ws = await websockets.connect(f"{srv.ws}/v1/realtime?model=talky")
    await recv(ws)
    await ws.send(json.dumps({"type": "session.update", "session": {"type": "realtime", "output_modalities": ["text"]}}))
    await ws.send(json.dumps({"type": "conversation.item.create", "item": {
        "type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}}))
    await ws.send(json.dumps({"type": "response.create", "response": {"max_output_tokens": tokens}}))
    return ws


async def test_a_cancelled_reply_stops_on_its_worker(served):
    srv, registry = served
    talky = registry.get("talky")
    ws = await ask_for_a_long_text_reply(srv, "talk for a while", 300)
    await until(ws, "response.output_text.delta")
    cancelled_at = time.monotonic()
    await ws.send(json.dumps({"type": "response.cancel"}))
    done, _ = await until(ws, "response.done", timeout=5.0)
    assert done["response"]["status"] == "cancelled" and time.monotonic() - cancelled_at < 1.0

    def streams_open() -> int:
        return sum(ray.get(w.handle.open_streams.remote(), timeout=10) for w in talky.workers if not w.dead)

    deadline = time.monotonic() + 2.0  # 300 words would take 9 s: the engine was told to stop
    while time.monotonic() < deadline and streams_open():
        await asyncio.sleep(0.05)
    assert streams_open() == 0
    await ws.close()


@pytest.fixture(scope="module")
def embedded(cluster):
    pytest.importorskip("faster_whisper", reason="the embedded engine is an optional extra")
    registry = ModelRegistry()
    registry.load(["embedded"], ray_address=cluster.address)  # ~7 s for two workers on 2 cores
    with ServerThread(registry) as srv:
        yield srv, registry
    registry.close()


async def test_a_spoken_turn_to_the_embedded_model_on_ray_with_the_vad_in_the_gateway(embedded):
    srv, registry = embedded
    model = registry.get("embedded")
    assert model._vad is not None, "Silero runs in the gateway: no actor call per audio frame"
    with wave.open(str(REPO / "media" / "question.wav"), "rb") as wav:
        assert wav.getframerate() == 24_000
        pcm = wav.readframes(wav.getnframes()) + b"\0\0" * 24_000  # then 1 s of silence
    ws = await websockets.connect(f"{srv.ws}/v1/realtime?model=embedded")
    await recv(ws)
    await ws.send(json.dumps({"type": "session.update", "session": {
        "type": "realtime", "max_output_tokens": 24, "audio": {"input": {"transcription": {"model": "whisper-1"}}}}}))
    for start in range(0, len(pcm), 1920):  # 40 ms of 24 kHz pcm16 per event
        await ws.send(json.dumps({"type": "input_audio_buffer.append",
                                  "audio": base64.b64encode(pcm[start:start + 1920]).decode()}))
    done, seen = await until(ws, "response.done", timeout=60.0)
    kinds = [e["type"] for e in seen]
    assert "input_audio_buffer.speech_stopped" in kinds and "response.output_audio.delta" in kinds, kinds
    assert done["response"]["status"] in ("completed", "incomplete"), done
    transcripts = [e["transcript"] for e in seen if e["type"] == "conversation.item.input_audio_transcription.completed"]
    assert transcripts and "france" in transcripts[0].lower(), kinds
    await ws.close()


async def test_a_worker_killed_mid_turn_fails_the_reply_within_2_s_and_another_worker_answers(served):
    srv, registry = served
    talky = registry.get("talky")
    ws = await ask_for_a_long_text_reply(srv, "a long story please", 200)
    first, _ = await until(ws, "response.output_text.delta")
    pid = int(first["delta"].strip().removeprefix("pid"))
    victim = next(w for w in talky.workers if w.pid == pid)
    os.kill(pid, signal.SIGKILL)
    killed_at = time.monotonic()
    done, seen = await until(ws, "response.done", timeout=5.0)
    took = time.monotonic() - killed_at
    print(f"\nworker {victim.worker_id} killed: response.done after {took * 1000:.0f} ms")
    assert took < 2.0
    assert done["response"]["status"] == "failed"
    assert any(e["type"] == "error" for e in seen)
    # the connection stays up; the next turn is served by the other worker, from the conversation
    await ws.send(json.dumps({"type": "response.create", "response": {"max_output_tokens": 3}}))
    done, seen = await until(ws, "response.done")
    assert done["response"]["status"] in ("completed", "incomplete"), done
    text = "".join(e["delta"] for e in seen if e["type"] == "response.output_text.delta")
    assert text.startswith("pid") and int(text.split()[0].removeprefix("pid")) != pid
    assert talky.replacements >= 1
    await ws.close()
    # the dead worker is replaced on its node
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not (talky.restarts >= 1 and len(talky.placement()) == 2):
        await asyncio.sleep(0.2)
    assert talky.restarts >= 1 and len(talky.placement()) == 2
    assert victim.node_id in {w.node_id for w in talky.workers if not w.dead}
