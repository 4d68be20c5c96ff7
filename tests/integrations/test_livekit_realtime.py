"""LiveKit Agents' OpenAI realtime plugin, unmodified, against a real server on the embedded models.

The plugin's ``RealtimeModel`` needs no LiveKit server: its session is a WebSocket client of the
realtime API, which LiveKit's ``AgentSession`` drives through ``update_chat_ctx``, ``update_tools``
and ``generate_reply``. These tests call those methods as it does, with only the API key and the
base URL changed from the defaults; nothing is mocked.

livekit-agents lives in ``.venv-livekit``, which ``scripts/test.sh`` builds and runs this module
in. In the main environment the module is skipped with the reason.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
from typing import Any

import numpy as np
import pytest

from realtime_omni_bench.telephony import trim_silence

HAVE_LIVEKIT = importlib.util.find_spec("livekit") is not None and importlib.util.find_spec("livekit.plugins") is not None
pytestmark = [
    pytest.mark.skipif(not HAVE_LIVEKIT, reason="livekit-agents is not installed: scripts/test.sh runs this in .venv-livekit"),
    pytest.mark.asyncio(loop_scope="session"),
]

TIMEOUT = 120.0  # two CPU cores, shared: the embedded models are slow there


async def open_session(server) -> tuple[Any, Any, list[Any]]:
    from livekit.plugins.openai.realtime import RealtimeModel

    # default model id ("gpt-realtime", served by the default model through the alias), voice,
    # modalities and turn detection
    model = RealtimeModel(api_key="test", base_url=f"{server.http}/v1")
    session = model.session()
    errors: list[Any] = []
    session.on("error", errors.append)
    return model, session, errors


async def close(model: Any, session: Any) -> None:
    await session.aclose()
    await model.aclose()


async def reply_of(generation: Any) -> tuple[str, np.ndarray, list[Any]]:
    """The text, the audio (24 kHz int16) and the function calls of one generation."""
    text: list[str] = []
    audio: list[np.ndarray] = []
    calls: list[Any] = []

    async def message(msg: Any) -> None:
        async def read_text() -> None:
            async for piece in msg.text_stream:
                text.append(str(piece))

        async def read_audio() -> None:
            async for frame in msg.audio_stream:
                assert frame.sample_rate == 24_000 and frame.num_channels == 1
                audio.append(np.frombuffer(bytes(frame.data), np.int16))

        await asyncio.gather(read_text(), read_audio())

    async def messages() -> None:
        async for msg in generation.message_stream:
            await message(msg)

    async def functions() -> None:
        async for call in generation.function_stream:
            calls.append(call)

    await asyncio.wait_for(asyncio.gather(messages(), functions()), TIMEOUT)
    return "".join(text), np.concatenate(audio) if audio else np.zeros(0, np.int16), calls


async def test_generate_reply_speaks_and_writes(server, transcribe):
    model, session, errors = await open_session(server)
    try:
        await session.update_instructions("You are a helpful assistant. Answer briefly.")
        chat = session.chat_ctx.copy()
        chat.add_message(role="user", content="What is the capital of France?")
        await asyncio.wait_for(session.update_chat_ctx(chat), 30)
        text, audio, calls = await reply_of(await session.generate_reply())
        assert not errors, errors
        assert not calls and text.strip(), (text, calls)
        assert len(audio) > 24_000 // 2, f"only {len(audio)} samples of reply audio"
        assert transcribe(audio, 24_000).strip(), f"reply audio not understood (model said {text!r})"
    finally:
        await close(model, session)


async def test_a_spoken_turn_is_heard_transcribed_and_answered(server, say, transcribe):
    from livekit import rtc

    model, session, errors = await open_session(server)
    generations: asyncio.Queue[Any] = asyncio.Queue()
    heard: list[str] = []
    session.on("generation_created", generations.put_nowait)
    session.on("input_audio_transcription_completed", lambda ev: heard.append(ev.transcript) if ev.is_final else None)
    try:
        await session.update_instructions("You are a helpful assistant. Answer briefly.")
        # as AgentSession forwards the room's microphone: 10 ms frames (48 kHz; the plugin resamples)
        rate = 48_000
        speech = trim_silence(say("What is the capital of France?", rate))
        pcm = np.concatenate([np.zeros(rate // 2, np.int16), speech, np.zeros(rate * 2, np.int16)])
        step = rate // 100
        for index, offset in enumerate(range(0, len(pcm), step)):
            piece = pcm[offset : offset + step]
            session.push_audio(rtc.AudioFrame(piece.tobytes(), rate, 1, len(piece)))
            if index % 25 == 24:
                await asyncio.sleep(0.125)  # about twice real time
        # default semantic_vad with create_response: the server answers by itself
        generation = await asyncio.wait_for(generations.get(), TIMEOUT)
        assert not generation.user_initiated
        text, audio, calls = await reply_of(generation)
        assert not errors, errors
        assert heard and "capital" in heard[0].lower(), heard
        assert not calls and text.strip(), (text, calls)
        assert transcribe(audio, 24_000).strip(), f"reply audio not understood (model said {text!r})"
    finally:
        await close(model, session)


async def test_a_function_tool_is_called_and_its_output_answered(server):
    from livekit.agents import llm

    @llm.function_tool
    async def get_weather(city: str) -> dict[str, Any]:
        """Get the current weather in a city.

        Args:
            city: The city, e.g. Paris
        """
        return {"city": city, "conditions": "sunny", "temperature_celsius": 23}

    model, session, errors = await open_session(server)
    try:
        await session.update_instructions("You are a weather assistant. Call get_weather to look up the weather, "
                                          "then tell the user the result in one short sentence.")
        await asyncio.wait_for(session.update_tools([get_weather]), 30)
        chat = session.chat_ctx.copy()
        chat.add_message(role="user", content="What's the weather like in Paris right now?")
        await asyncio.wait_for(session.update_chat_ctx(chat), 30)
        # the small embedded model does not call tools on its own: this reply must call one
        text, audio, calls = await reply_of(await session.generate_reply(tool_choice="required"))
        assert not errors, errors
        assert len(calls) == 1 and calls[0].name == "get_weather", calls
        assert not len(audio), "a call came with speech"
        arguments = json.loads(calls[0].arguments)
        assert "paris" in arguments["city"].lower(), arguments
        # run it as AgentSession does (the tool's own code), and hand the output back in the context
        result = await get_weather(**arguments)
        chat = session.chat_ctx.copy()
        assert any(item.type == "function_call" and item.call_id == calls[0].call_id for item in chat.items), chat.items
        chat.items.append(llm.FunctionCallOutput(call_id=calls[0].call_id, name="get_weather",
                                                 output=json.dumps(result), is_error=False))
        await asyncio.wait_for(session.update_chat_ctx(chat), 30)
        text, audio, calls = await reply_of(await session.generate_reply(tool_choice="none"))
        assert not errors, errors
        assert not calls and text.strip(), (text, calls)
        assert len(audio) > 24_000 // 2
        outputs = [item for item in session.chat_ctx.items if item.type == "function_call_output"]
        assert [json.loads(o.output) for o in outputs] == [result]
    finally:
        await close(model, session)
