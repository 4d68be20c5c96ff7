"""semantic_vad end to end with the ``openai`` SDK: the end-of-turn model ends a finished turn
at a short pause, and an unfinished one only after the eagerness window. Audio is sent faster
than real time, so the windows are counted in audio, not in wall-clock time."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from tests.integration.test_realtime_sdk import TIMEOUT, client, send_pcm
from tests.integration.test_transcription_sessions import events_until

pytestmark = pytest.mark.asyncio(loop_scope="session")


async def test_a_finished_turn_ends_early_and_an_unfinished_one_waits(server, say):
    assert server.manager.end_of_turn is not None, "the end-of-turn model did not load (see the server log)"
    silence = lambda seconds: np.zeros(int(24_000 * seconds), np.int16)  # noqa: E731
    async with client(server).realtime.connect(model="embedded") as conn:
        await conn.recv()
        await conn.session.update(session={"type": "realtime", "max_output_tokens": 20, "audio": {"input": {
            "transcription": {"model": "whisper-1"}, "turn_detection": {"type": "semantic_vad", "eagerness": "low"}}}})
        updated = (await events_until(conn, lambda e, _s: e.type == "session.updated"))[-1]
        assert updated.session.audio.input.turn_detection.type == "semantic_vad"
        # low eagerness waits 4 s for a turn the model does not call finished; 3 s follow here
        await send_pcm(conn, np.concatenate([silence(0.2), say("What is the capital of France?"), silence(3)]))
        first = await events_until(conn, lambda e, _s: e.type == "response.done")
        assert any(e.type == "input_audio_buffer.speech_stopped" for e in first), "the model did not end the turn"
        # an unfinished phrase and the same 3 s: the turn stays open...
        await send_pcm(conn, np.concatenate([say("Tell me about the, um"), silence(3)]))
        started = await events_until(conn, lambda e, _s: e.type == "input_audio_buffer.speech_started")
        more: list = []
        with pytest.raises(TimeoutError):
            await events_until(conn, lambda e, seen: more.append(e) or e.type == "input_audio_buffer.speech_stopped",
                               timeout=6.0)
        assert started and not any(e.type == "input_audio_buffer.speech_stopped" for e in more)
        # ...until the window has passed in silence
        await send_pcm(conn, silence(1.5))
        stopped = await events_until(conn, lambda e, _s: e.type == "input_audio_buffer.speech_stopped", timeout=TIMEOUT)
        assert stopped[-1].audio_end_ms > 0
    await asyncio.sleep(0)
