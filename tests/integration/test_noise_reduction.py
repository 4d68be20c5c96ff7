"""audio.input.noise_reduction over a real WebSocket: a real server on loopback serving the echo
model, which plays back what the session heard, so the denoiser's effect comes back on the wire."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Iterator

import numpy as np
import pytest
import websockets

from realtime_omni.audio.denoise import available
from realtime_omni.engines.registry import ModelRegistry
from tests.helpers import assert_valid_server_event
from tests.server import ServerThread

pytestmark = [pytest.mark.asyncio(loop_scope="session"),
              pytest.mark.skipif(not available(), reason="needs pyrnnoise (the 'denoise' extra)")]
TIMEOUT = 30.0


@pytest.fixture(scope="module")
def echo_server() -> Iterator[ServerThread]:
    registry = ModelRegistry()
    registry.load(["echo"])
    with ServerThread(registry, models=["echo"]) as srv:
        yield srv
    registry.close()


async def recv(ws) -> dict:
    event = json.loads(await asyncio.wait_for(ws.recv(), TIMEOUT))
    assert_valid_server_event(event)
    return event


async def recv_type(ws, kind: str) -> dict:
    while (event := await recv(ws))["type"] != kind:
        pass
    return event


async def echo_of(ws, pcm: np.ndarray, lag_ms: int = 0) -> np.ndarray:
    """Send ``pcm`` (24 kHz) in 20 ms chunks; collect echoed audio until all of it but ``lag_ms``
    came back."""
    for start in range(0, len(pcm), 480):
        chunk = base64.b64encode(pcm[start:start + 480].tobytes()).decode()
        await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": chunk}))
    got = b""
    while len(got) < 2 * (len(pcm) - 24 * lag_ms):
        event = await recv(ws)
        if event["type"] == "response.output_audio.delta":
            got += base64.b64decode(event["delta"])
    return np.frombuffer(got, np.int16)


async def test_near_field_is_reported_and_the_echo_comes_back_quieter(echo_server):
    tone = 2000 * np.sin(2 * np.pi * 200 * np.arange(24_000) / 24_000)
    noise = np.random.default_rng(4).normal(0, 2000, 24_000)
    noisy = np.clip(tone + noise, -32768, 32767).astype(np.int16)
    async with websockets.connect(f"{echo_server.ws}/v1/realtime?model=echo") as ws:
        await recv_type(ws, "session.created")
        # as heard without noise reduction: the same samples back
        assert np.array_equal(await echo_of(ws, noisy), noisy)
        await ws.send(json.dumps({"type": "session.update", "session": {
            "type": "realtime", "audio": {"input": {"noise_reduction": {"type": "near_field"}}}}}))
        updated = await recv_type(ws, "session.updated")
        assert updated["session"]["audio"]["input"]["noise_reduction"] == {"type": "near_field"}
        # the denoiser holds back under 40 ms (a frame and two resamplers)
        heard = (await echo_of(ws, noisy, lag_ms=40)).astype(np.float64)
    # a steady tone is not speech to RNNoise either: what comes back is far quieter overall
    assert heard.std() < 0.5 * noisy.std(), f"rms {noisy.std():.0f} -> {heard.std():.0f}"


async def test_a_bad_type_is_an_error_event_and_the_session_goes_on(echo_server):
    async with websockets.connect(f"{echo_server.ws}/v1/realtime?model=echo") as ws:
        await recv_type(ws, "session.created")
        await ws.send(json.dumps({"type": "session.update", "session": {
            "type": "realtime", "audio": {"input": {"noise_reduction": {"type": "anechoic"}}}}}))
        error = await recv_type(ws, "error")
        assert error["error"]["code"] == "invalid_event"
        assert error["error"]["param"] == "session.audio.input.noise_reduction.type"
        await ws.send(json.dumps({"type": "session.update", "session": {
            "type": "realtime", "audio": {"input": {"noise_reduction": {"type": "far_field"}}}}}))
        updated = await recv_type(ws, "session.updated")
        assert updated["session"]["audio"]["input"]["noise_reduction"] == {"type": "far_field"}
