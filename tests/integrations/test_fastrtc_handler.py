"""The FastRTC handler against a real server: a spoken turn through ``receive``/``emit``.

FastRTC (and gradio) are an optional extra. Where they are not installed, the handler tests are
skipped (the module must still import, and say how to install them). Run them with fastrtc
installed, e.g. ``pip install -e '.[fastrtc]'`` or a venv that has it.
"""

from __future__ import annotations

import asyncio
import importlib.util
import time

import numpy as np
import pytest

from realtime_omni.audio.resample import resample_once
from realtime_omni_bench.telephony import trim_silence

HAVE_FASTRTC = importlib.util.find_spec("fastrtc") is not None
needs_fastrtc = pytest.mark.skipif(not HAVE_FASTRTC, reason="fastrtc is not installed (pip install 'realtime-omni[fastrtc]')")
on_session_loop = pytest.mark.asyncio(loop_scope="session")

MIC_RATE = 48_000  # what browsers capture and FastRTC hands to receive()
FRAME = MIC_RATE // 50  # 20 ms


def test_module_imports_without_fastrtc():
    module = importlib.import_module("realtime_omni.integrations.fastrtc_handler")
    if HAVE_FASTRTC:
        assert issubclass(module.RealtimeOmniHandler, importlib.import_module("fastrtc").AsyncStreamHandler)
    else:
        with pytest.raises(ImportError, match=r"realtime-omni\[fastrtc\]"):
            module.RealtimeOmniHandler  # noqa: B018


class Mic:
    """Feeds ``handler.receive`` 20 ms frames at real-time pace (speech queued, else silence)."""

    def __init__(self, handler) -> None:  # type: ignore[no-untyped-def]
        self.handler = handler
        self.queue: list[np.ndarray] = []
        self.task = asyncio.create_task(self._run())

    def say(self, pcm48k: np.ndarray) -> None:
        self.queue += [pcm48k[i : i + FRAME] for i in range(0, len(pcm48k), FRAME)]

    async def _run(self) -> None:
        due = time.monotonic()
        silence = np.zeros(FRAME, np.int16)
        while True:
            frame = self.queue.pop(0) if self.queue else silence
            if len(frame) < FRAME:
                frame = np.concatenate([frame, silence[: FRAME - len(frame)]])
            await self.handler.receive((MIC_RATE, frame.reshape(1, -1)))
            due += 0.02
            await asyncio.sleep(max(due - time.monotonic(), 0))

    async def close(self) -> None:
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)


@needs_fastrtc
@on_session_loop
async def test_spoken_turn_through_receive_and_emit(server, say, transcribe):
    from fastrtc import AdditionalOutputs

    from realtime_omni.integrations.fastrtc_handler import RealtimeOmniHandler

    template = RealtimeOmniHandler(server.http, instructions="You are a helpful assistant. Answer briefly.",
                                   input_sample_rate=MIC_RATE, output_sample_rate=48_000)
    handler = template.copy()  # FastRTC copies the template for each connection
    assert handler is not template and handler.url == template.url
    opened = server.manager.total_opened
    up = asyncio.create_task(handler.start_up())
    await asyncio.wait_for(handler.connected.wait(), 30)
    assert server.manager.total_opened == opened + 1
    mic = Mic(handler)
    try:
        mic.say(resample_once(trim_silence(say("What is the capital of France?", 22_050)), 22_050, MIC_RATE))
        audio: list[np.ndarray] = []
        said: list[dict] = []
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and not any(s["role"] == "assistant" for s in said):
            item = await handler.emit()
            if isinstance(item, tuple):
                rate, frame = item
                assert rate == 48_000 and frame.dtype == np.int16 and frame.shape[0] == 1
                audio.append(frame[0])
            elif isinstance(item, AdditionalOutputs):
                said.append(item.args[0])
        user = [s["content"] for s in said if s["role"] == "user"]
        assistant = [s["content"] for s in said if s["role"] == "assistant"]
        assert user and "capital" in user[0].lower(), said
        assert assistant and assistant[0].strip(), said
        reply = np.concatenate(audio)
        assert len(reply) > 48_000 * 0.5
        assert transcribe(reply, 48_000).strip(), f"reply audio not understood (model said {assistant[0]!r})"
    finally:
        await mic.close()
        await handler.shutdown()
        await asyncio.wait_for(up, 15)


@needs_fastrtc
@on_session_loop
async def test_barge_in_clears_the_output_queue(server, say):
    from realtime_omni.integrations.fastrtc_handler import RealtimeOmniHandler

    handler = RealtimeOmniHandler(server.http, instructions="You are a storyteller. Always tell a long story.",
                                  input_sample_rate=MIC_RATE)
    up = asyncio.create_task(handler.start_up())
    await asyncio.wait_for(handler.connected.wait(), 30)
    mic = Mic(handler)
    try:
        # Nobody calls emit(): the reply piles up in the queue, as if the player were behind.
        mic.say(resample_once(trim_silence(say("Tell me a long story about a dragon.", 22_050)), 22_050, MIC_RATE))
        deadline = time.monotonic() + 60
        while handler.stats["audio_frames"] < 10 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert handler.stats["audio_frames"] >= 10, "no reply audio"
        queued = handler.stats["audio_frames"]  # nobody emits: every reply frame so far is still queued
        mic.say(resample_once(trim_silence(say("Stop, wait a moment.", 22_050)), 22_050, MIC_RATE))
        deadline = time.monotonic() + 15
        while handler.stats["speech_started"] < 2 and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        assert handler.stats["speech_started"] >= 2
        assert handler.stats["cleared_frames"] >= queued > 0
        frames = [handler.output_queue.get_nowait() for _ in range(handler.output_queue.qsize())]
        assert not [f for f in frames if isinstance(f, tuple)]  # nothing of the old reply is left to play
    finally:
        await mic.close()
        await handler.shutdown()
        await asyncio.wait_for(up, 15)
