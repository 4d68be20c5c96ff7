"""End to end: the official ``openai`` SDK against a running server on the embedded models.

Speech is synthesized at test time by the embedded Piper voice; replies are checked by the
embedded Whisper. Nothing is mocked.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time

import numpy as np
import pytest
from openai import AsyncOpenAI

from realtime_omni.audio import g711

pytestmark = pytest.mark.asyncio(loop_scope="session")

QUESTION = "What is the capital of France?"
TIMEOUT = 60.0


def client(server) -> AsyncOpenAI:
    return AsyncOpenAI(api_key="test", base_url=f"{server.http}/v1", websocket_base_url=f"{server.ws}/v1")


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


async def send_pcm(conn, pcm: np.ndarray, rate: int = 24_000, chunk_ms: int = 20, realtime: bool = False, encode=None) -> None:
    step = rate * chunk_ms // 1000
    start = time.monotonic()
    for index, offset in enumerate(range(0, len(pcm), step)):
        piece = pcm[offset : offset + step]
        data = encode(piece) if encode else piece.astype("<i2").tobytes()
        await conn.input_audio_buffer.append(audio=b64(data))
        if realtime:
            delay = start + (index + 1) * chunk_ms / 1000 - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)


async def collect_until_done(conn, timeout: float = TIMEOUT) -> list:
    """All events up to and including the next response.done."""
    events = []
    deadline = time.monotonic() + timeout
    while True:
        event = await asyncio.wait_for(conn.recv(), max(deadline - time.monotonic(), 0.1))
        events.append(event)
        if event.type == "response.done":
            return events


def audio_of(events, fmt: str = "pcm") -> np.ndarray:
    data = b"".join(base64.b64decode(e.delta) for e in events if e.type == "response.output_audio.delta")
    if fmt == "pcmu":
        return g711.ulaw_decode(data)
    return np.frombuffer(data, dtype="<i2")


async def configure(conn, **session) -> None:
    await conn.session.update(session={"type": "realtime", "max_output_tokens": 40, **session})
    while (await asyncio.wait_for(conn.recv(), TIMEOUT)).type != "session.updated":
        pass


async def test_spoken_turn_with_server_vad(server, say, transcribe):
    adopted_before = server.manager.speculations_adopted + sum(r.speculations_adopted for r in server.manager.sessions.values())
    speech = say(QUESTION)
    silence = np.zeros(24_000, np.int16)
    async with client(server).realtime.connect(model="embedded") as conn:
        assert (await conn.recv()).type == "session.created"
        await configure(conn, audio={"input": {"transcription": {"model": "whisper-1"}}})
        await send_pcm(conn, np.concatenate([silence[:4800], speech, silence]))
        events = await collect_until_done(conn)
        types = [e.type for e in events]
        for expected in ["input_audio_buffer.speech_started", "input_audio_buffer.speech_stopped",
                         "input_audio_buffer.committed", "conversation.item.input_audio_transcription.completed",
                         "response.created", "response.output_audio.delta", "response.output_audio_transcript.delta"]:
            assert expected in types, expected
        transcript = next(e for e in events if e.type == "conversation.item.input_audio_transcription.completed").transcript
        # the question's words came through (the last word's sound varies with Piper's sampling
        # and where the turn was cut: once in a full run the ASR heard "France" as "friends")
        assert "capital" in transcript.lower() and len(transcript.split()) >= 4
        done = events[-1].response
        assert done.status in ("completed", "incomplete")
        reply = audio_of(events)
        assert len(reply) / 24_000 >= 0.5
        heard = transcribe(reply, 24_000)
        assert len(heard.split()) >= 1, "the reply audio should be intelligible speech"
        # the reply was prepared during the pause and released at the end-of-turn decision
        adopted = sum(r.speculations_adopted for r in server.manager.sessions.values()) + server.manager.speculations_adopted
        assert adopted == adopted_before + 1


async def test_manual_commit_without_turn_detection(server, say):
    async with client(server).realtime.connect(model="embedded") as conn:
        await conn.recv()
        await configure(conn, audio={"input": {"turn_detection": None, "transcription": {"model": "whisper-1"}}})
        await send_pcm(conn, say(QUESTION))
        await conn.input_audio_buffer.commit()
        await conn.response.create()
        events = await collect_until_done(conn)
        types = [e.type for e in events]
        assert "input_audio_buffer.speech_started" not in types
        assert types.index("input_audio_buffer.committed") < types.index("response.created")
        transcript = next(e for e in events if e.type == "conversation.item.input_audio_transcription.completed").transcript
        assert "france" in transcript.lower()
        assert len(audio_of(events)) > 0


async def test_text_in_audio_and_transcript_out_then_text_only(server):
    async with client(server).realtime.connect(model="embedded") as conn:
        await conn.recv()
        await configure(conn, audio={"input": {"turn_detection": None}})
        await conn.conversation.item.create(item={"type": "message", "role": "user",
                                                  "content": [{"type": "input_text", "text": "Say hello to me."}]})
        await conn.response.create()
        events = await collect_until_done(conn)
        limits = next(e for e in events if e.type == "rate_limits.updated")
        assert limits.rate_limits[0].name == "requests" and limits.rate_limits[0].remaining > 0
        transcript = "".join(e.delta for e in events if e.type == "response.output_audio_transcript.delta")
        assert transcript.strip()
        assert len(audio_of(events)) > 0
        final = events[-1].response.output[0].content[0]
        assert final.transcript == transcript

        await conn.response.create(response={"output_modalities": ["text"]})
        events = await collect_until_done(conn)
        types = [e.type for e in events]
        assert "response.output_text.delta" in types
        assert "response.output_audio.delta" not in types
        text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
        assert text.strip() and events[-1].response.output[0].content[0].text == text


async def test_barge_in_cancels_and_nothing_of_the_old_response_follows(server, say):
    async with client(server).realtime.connect(model="embedded") as conn:
        await conn.recv()
        await configure(conn, max_output_tokens=120)
        await conn.conversation.item.create(item={"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": "Tell me a long story about a dragon and a knight."}]})
        await conn.response.create()
        response_id = None
        while True:
            event = await asyncio.wait_for(conn.recv(), TIMEOUT)
            if event.type == "response.created":
                response_id = event.response.id
            if event.type == "response.output_audio.delta":
                break
        sender = asyncio.create_task(send_pcm(conn, np.concatenate([say("Stop, wait a moment."), np.zeros(24_000, np.int16)]), realtime=True))
        after_done = []
        done = None
        deadline = time.monotonic() + TIMEOUT
        while time.monotonic() < deadline:
            event = await asyncio.wait_for(conn.recv(), TIMEOUT)
            if done is not None and getattr(event, "response_id", None) == response_id:
                after_done.append(event.type)
            if event.type == "response.done" and event.response.id == response_id:
                done = event.response
            if done is not None and event.type == "input_audio_buffer.speech_stopped":
                break
        await sender
        assert done is not None and done.status == "cancelled"
        assert done.status_details.reason == "turn_detected"
        assert after_done == []


async def test_bad_input_gets_errors_and_the_session_goes_on(server):
    async with client(server).realtime.connect(model="embedded") as conn:
        await conn.recv()
        await configure(conn, audio={"input": {"turn_detection": None}})

        async def expect_error(send, code: str) -> None:
            await send()
            while True:
                event = await asyncio.wait_for(conn.recv(), TIMEOUT)
                if event.type == "error":
                    assert event.error.code == code, (code, event.error)
                    return

        await expect_error(lambda: conn.send_raw("{this is not json"), "invalid_json")
        await expect_error(lambda: conn.send_raw('{"type": "session.update", "session": ' + "[" * 100_000
                                                 + "]" * 100_000 + "}"), "invalid_json")
        await expect_error(lambda: conn.send_raw('{"type": "response.create", "response": {"temperature": NaN}}'),
                           "invalid_json")
        await expect_error(lambda: conn.send_raw(json.dumps({"type": "no.such.event"})), "unknown_event_type")
        await expect_error(lambda: conn.send_raw(json.dumps({"type": "input_audio_buffer.append", "audio": 12})), "invalid_event")
        await expect_error(lambda: conn.send_raw(json.dumps({"type": "input_audio_buffer.append", "audio": "%%%notbase64"})), "invalid_base64")
        await expect_error(lambda: conn.send_raw(json.dumps({"type": "input_audio_buffer.append", "audio": "A" * (16 * 1024 * 1024)})), "event_too_large")
        await expect_error(lambda: conn.send_raw(json.dumps({"type": "session.update", "session": {
            "type": "realtime", "audio": {"input": {"format": {"type": "audio/pcm", "rate": 44100}}}}})), "unsupported_audio_format")
        await expect_error(lambda: conn.conversation.item.retrieve(item_id="item_missing"), "item_not_found")
        await expect_error(lambda: conn.conversation.item.delete(item_id="item_missing"), "item_not_found")

        # response.create while one is active, then truncate beyond the item's audio
        await conn.conversation.item.create(item={"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": "Hello!"}]})
        await conn.response.create()
        await expect_error(lambda: conn.response.create(), "conversation_already_has_active_response")
        events = await collect_until_done(conn)
        item_id = events[-1].response.output[0].id
        await expect_error(lambda: conn.conversation.item.truncate(item_id=item_id, content_index=0, audio_end_ms=10**6), "invalid_truncate")

        # ...and a normal turn still works
        await conn.response.create()
        events = await collect_until_done(conn)
        assert events[-1].response.status in ("completed", "incomplete")
        assert len(audio_of(events)) > 0


async def test_g711_ulaw_in_and_out(server, say, transcribe):
    async with client(server).realtime.connect(model="embedded") as conn:
        await conn.recv()
        await configure(conn, audio={
            "input": {"format": {"type": "audio/pcmu"}, "transcription": {"model": "whisper-1"}},
            "output": {"format": {"type": "audio/pcmu"}}})
        speech = say(QUESTION, rate=8000)
        await send_pcm(conn, np.concatenate([speech, np.zeros(8000, np.int16)]), rate=8000, encode=g711.ulaw_encode)
        events = await collect_until_done(conn)
        transcript = next(e for e in events if e.type == "conversation.item.input_audio_transcription.completed").transcript
        assert "france" in transcript.lower()
        reply = audio_of(events, "pcmu")
        assert len(reply) / 8000 >= 0.5
        assert len(transcribe(reply, 8000).split()) >= 1


async def test_models_and_health(server):
    import httpx

    async with httpx.AsyncClient(base_url=server.http) as http:
        models = (await http.get("/v1/models")).json()
        assert models["object"] == "list"
        assert {m["id"] for m in models["data"]} >= {"embedded", "echo"}
        assert (await http.get("/health")).json()["status"] == "ok"


async def test_unknown_model_is_rejected_with_an_error(server):
    async with client(server).realtime.connect(model="no-such-model") as conn:
        event = await asyncio.wait_for(conn.recv(), TIMEOUT)
        assert event.type == "error" and event.error.code == "model_not_found"
