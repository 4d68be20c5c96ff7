"""Audio is PCM inside the server; wire formats exist only at the WebSocket edge.

A real server on loopback with the echo model (it says back what it heard) and a plain
WebSocket client: what goes in as a wire format must come back out the same, with the same
duration, after being decoded to PCM on the way in and encoded again on the way out.
"""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

import numpy as np
import pytest
import websockets

from realtime_omni.audio import AudioFormat, g711
from realtime_omni.engines.registry import ModelRegistry

from ..server import ServerThread

#: one delta per append: 20 ms
CHUNK_MS = 20
#: what a streaming resampler may still hold back as filter delay (soxr HQ, 8 → 24 kHz: ~21 ms)
RESAMPLER_HOLD_MS = 40


@pytest.fixture(scope="module")
def echo_server():
    registry = ModelRegistry()
    registry.load(["echo"])
    with ServerThread(registry, models=["echo"]) as srv:
        yield srv
    registry.close()


def speech_like(rate: int, seconds: float) -> np.ndarray:
    """A quiet, wobbling tone: small negative samples too (μ-law's "negative zero", 0x7F)."""
    t = np.arange(int(rate * seconds)) / rate
    return (np.sin(2 * np.pi * 220 * t) * (2 + 4000 * t / seconds)).astype(np.int16)


async def echo(server: ServerThread, fmt_in: AudioFormat, fmt_out: AudioFormat, chunks: list[bytes]) -> list[dict[str, Any]]:
    """Append ``chunks`` (wire bytes in ``fmt_in``) to an echo session; returns the deltas
    that come back once the echo has had them all."""
    async with websockets.connect(f"{server.ws}/v1/realtime?model=echo") as ws:
        await ws.send(json.dumps({"type": "session.update", "session": {"type": "realtime", "audio": {
            "input": {"turn_detection": None, "format": {"type": fmt_in.value}},
            "output": {"format": {"type": fmt_out.value}}}}}))
        for chunk in chunks:
            await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(chunk).decode()}))
        sent_ms = sum(len(c) for c in chunks) * 1000 / (fmt_in.bytes_per_sample * fmt_in.rate)
        deltas: list[dict[str, Any]] = []
        got_ms = 0.0
        # resampling (the μ-law → pcm case) holds its filter delay back until more comes
        held_ms = RESAMPLER_HOLD_MS if fmt_in.rate != fmt_out.rate else 0.0
        while got_ms < sent_ms - held_ms:
            event = json.loads(await asyncio.wait_for(ws.recv(), 10))
            assert event["type"] != "error", event
            if event["type"] == "response.output_audio.delta":
                deltas.append(event)
                got_ms += fmt_out.duration_ms(len(base64.b64decode(event["delta"])))
        return deltas


@pytest.mark.parametrize("fmt", [AudioFormat.PCMU, AudioFormat.PCMA], ids=["pcmu", "pcma"])  # ids: the enum's encode() shadows str's
async def test_telephony_format_round_trips_through_pcm_byte_for_byte(echo_server, fmt: AudioFormat) -> None:
    pcm = speech_like(8000, 1.0)
    wire = fmt.encode(pcm)
    if fmt is AudioFormat.PCMU:
        assert b"\x7f" in wire and b"\xff" in wire  # both zeros travel, and must come back apart
    step = 8000 * CHUNK_MS // 1000
    chunks = [wire[i : i + step] for i in range(0, len(wire), step)]
    deltas = await echo(echo_server, fmt, fmt, chunks)
    back = [base64.b64decode(d["delta"]) for d in deltas]
    assert back == chunks  # same bytes, same framing: decoded to PCM inside, encoded at the edge
    assert sum(fmt.duration_ms(len(b)) for b in back) == pytest.approx(1000.0)


async def test_ulaw_in_pcm_out_keeps_the_duration(echo_server) -> None:
    pcm = speech_like(8000, 1.0)
    wire = g711.ulaw_encode(pcm)
    chunks = [wire[i : i + 160] for i in range(0, len(wire), 160)]
    deltas = await echo(echo_server, AudioFormat.PCMU, AudioFormat.PCM, chunks)
    samples = sum(len(base64.b64decode(d["delta"])) // 2 for d in deltas)
    # one resampling, 8 → 24 kHz, on the way out: three samples per input sample, less the
    # filter delay the stream still holds
    assert 24_000 * (1 - RESAMPLER_HOLD_MS / 1000) <= samples <= 24_000


async def test_pcm16_deltas_are_the_input_bytes(echo_server) -> None:
    """audio/pcm needs no resampling and no transcoding: each delta is the append it echoes,
    byte for byte, as before audio became PCM inside."""
    pcm = speech_like(24_000, 0.5)
    wire = AudioFormat.PCM.encode(pcm)
    step = 2 * 24_000 * CHUNK_MS // 1000
    chunks = [wire[i : i + step] for i in range(0, len(wire), step)]
    deltas = await echo(echo_server, AudioFormat.PCM, AudioFormat.PCM, chunks)
    assert [base64.b64decode(d["delta"]) for d in deltas] == chunks
