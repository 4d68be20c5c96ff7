"""Transcription sessions end to end with the official ``openai`` SDK: the input is detected,
committed and transcribed turn by turn, and nothing answers. Piper speaks, Whisper transcribes."""

from __future__ import annotations

import asyncio
import json
import time

import numpy as np
import pytest
import websockets

from tests.integration.test_realtime_sdk import TIMEOUT, client, send_pcm

pytestmark = pytest.mark.asyncio(loop_scope="session")

FIRST, SECOND = "What is the capital of France?", "How many legs does a spider have?"


async def events_until(conn, done, timeout: float = TIMEOUT) -> list:
    """Events up to the one for which ``done(event, seen)`` is true."""
    seen: list = []
    deadline = time.monotonic() + timeout
    while not seen or not done(seen[-1], seen):
        seen.append(await asyncio.wait_for(conn.recv(), max(deadline - time.monotonic(), 0.1)))
    return seen


def completed(count: int):
    return lambda _event, seen: sum(e.type == "conversation.item.input_audio_transcription.completed" for e in seen) >= count


async def test_intent_transcription_transcribes_every_turn_and_never_answers(server, say):
    silence = np.zeros(24_000, np.int16)
    async with client(server).realtime.connect(model="embedded", extra_query={"intent": "transcription"}) as conn:
        created = await conn.recv()
        assert created.type == "session.created" and created.session.type == "transcription"
        assert created.session.audio.input.transcription.model
        await send_pcm(conn, np.concatenate([silence[:4800], say(FIRST), silence, say(SECOND), silence]))
        events = await events_until(conn, completed(2))
        # a response.create is refused with a code, and the session goes on
        await conn.response.create()
        refused = await events_until(conn, lambda e, _seen: e.type == "error")
        assert refused[-1].error.code == "unsupported_feature"
        await conn.input_audio_buffer.clear()
        assert (await events_until(conn, lambda e, _s: e.type == "input_audio_buffer.cleared"))[-1]
    types = [e.type for e in events]
    assert not any(t.startswith("response.") for t in types + [e.type for e in refused]), "nothing answers"
    assert types.count("input_audio_buffer.committed") == 2
    finals = [e for e in events if e.type == "conversation.item.input_audio_transcription.completed"]
    deltas = [e for e in events if e.type == "conversation.item.input_audio_transcription.delta"]
    assert "capital" in finals[0].transcript.lower() and "spider" in finals[1].transcript.lower()
    for final in finals:  # each transcript's deltas come first and add up to it
        mine = [d for d in deltas if d.item_id == final.item_id]
        assert mine and "".join(d.delta for d in mine) == final.transcript
        assert types.index("conversation.item.input_audio_transcription.delta") < types.index(final.type)
        assert final.usage.seconds > 1.0


async def test_a_realtime_session_becomes_a_transcription_session_and_back(server, say):
    silence = np.zeros(24_000, np.int16)
    async with client(server).realtime.connect(model="embedded") as conn:
        assert (await conn.recv()).session.type == "realtime"
        await conn.session.update(session={"type": "transcription",
                                           "audio": {"input": {"transcription": {"model": "whisper-1"}}}})
        updated = (await events_until(conn, lambda e, _s: e.type == "session.updated"))[-1]
        assert updated.session.type == "transcription"
        assert updated.session.audio.input.transcription.model == "whisper-1"
        await send_pcm(conn, np.concatenate([silence[:4800], say(FIRST), silence]))
        events = await events_until(conn, completed(1))
        assert not any(e.type.startswith("response.") for e in events)
        await conn.session.update(session={"type": "realtime", "max_output_tokens": 30})
        assert (await events_until(conn, lambda e, _s: e.type == "session.updated"))[-1].session.type == "realtime"
        await send_pcm(conn, np.concatenate([say(SECOND), silence]))
        answered = await events_until(conn, lambda e, _s: e.type == "response.done")
        assert answered[-1].response.status in ("completed", "incomplete")
        transcript = [e for e in answered if e.type == "conversation.item.input_audio_transcription.completed"]
        assert transcript and "spider" in transcript[0].transcript.lower()


async def test_what_a_transcription_session_cannot_do_is_refused_clearly(server):
    async with client(server).realtime.connect(model="embedded") as conn:
        await conn.recv()
        await conn.session.update(session={"type": "transcription", "include": ["item.input_audio_transcription.logprobs"]})
        error = (await events_until(conn, lambda e, _s: e.type == "error"))[-1]
        assert (error.error.code, error.error.param) == ("unsupported_feature", "session.include")
        await conn.session.update(session={"type": "realtime", "instructions": "still here"})
        assert (await events_until(conn, lambda e, _s: e.type == "session.updated"))[-1].session.instructions == "still here"
    # the echo model does not transcribe: no transcription session on it
    async with client(server).realtime.connect(model="echo") as conn:
        await conn.recv()
        await conn.session.update(session={"type": "transcription"})
        error = (await events_until(conn, lambda e, _s: e.type == "error"))[-1]
        assert (error.error.code, error.error.param) == ("unsupported_feature", "session.type")
    async with websockets.connect(f"{server.ws}/v1/realtime?model=echo&intent=transcription") as ws:
        refused = json.loads(await asyncio.wait_for(ws.recv(), TIMEOUT))
        assert refused["type"] == "error" and "does not transcribe" in refused["error"]["message"]


async def test_a_beta_client_updates_and_hears_about_its_transcription_session(server):
    headers = {"OpenAI-Beta": "realtime=v1"}
    async with websockets.connect(f"{server.ws}/v1/realtime?model=embedded", additional_headers=headers) as ws:
        assert json.loads(await ws.recv())["type"] == "session.created"
        await ws.send(json.dumps({"type": "transcription_session.update", "session": {
            "input_audio_format": "g711_ulaw", "input_audio_transcription": {"model": "whisper-1", "language": "en"},
            "turn_detection": {"type": "server_vad", "silence_duration_ms": 400}}}))
        while (event := json.loads(await asyncio.wait_for(ws.recv(), TIMEOUT)))["type"] != "transcription_session.updated":
            assert event["type"] != "error", event
    session = event["session"]
    assert session["object"] == "realtime.transcription_session"
    assert session["input_audio_format"] == "g711_ulaw"
    assert session["input_audio_transcription"]["language"] == "en"
    assert session["turn_detection"]["silence_duration_ms"] == 400
