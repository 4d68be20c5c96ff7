"""Pipecat's own OpenAI Realtime service, unmodified, against a real server on the embedded models.

The service is built as an application would build it, with only the API key and the base URL
changed from its defaults, and runs in a real pipecat pipeline (context aggregators, a worker, a
runner); nothing is mocked on either side. Speech is synthesized by the embedded Piper voice.

pipecat-ai pins packages of its own, so it lives in ``.venv-pipecat``, which ``scripts/test.sh``
builds and runs this module in. In the main environment the module is skipped with the reason.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest

from realtime_omni_bench.telephony import trim_silence

if TYPE_CHECKING:
    from pipecat.frames.frames import Frame
    from pipecat.processors.frame_processor import FrameDirection

HAVE_PIPECAT = importlib.util.find_spec("pipecat") is not None
pytestmark = [
    pytest.mark.skipif(not HAVE_PIPECAT, reason="pipecat-ai is not installed: scripts/test.sh runs this in .venv-pipecat"),
    pytest.mark.asyncio(loop_scope="session"),
]

RATE = 24_000  # what the service sends and receives (OPENAI_SAMPLE_RATE)
FRAME = RATE // 50  # 20 ms
TIMEOUT = 120.0  # two CPU cores, shared: the embedded models are slow there


@dataclass
class Heard:
    """What the service put into the pipeline, and what went wrong on the way."""

    audio: bytearray = field(default_factory=bytearray)
    text: list[str] = field(default_factory=list)
    user: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    items: list[Any] = field(default_factory=list)  # conversation items the server reported added
    responses_done: int = 0
    changed: asyncio.Event = field(default_factory=asyncio.Event)


def make_recorder(heard: Heard) -> Any:
    """A pass-through processor that notes the frames it sees, where a transport would sit."""
    from pipecat.frames.frames import LLMFullResponseEndFrame, TranscriptionFrame, TTSAudioRawFrame, TTSTextFrame
    from pipecat.processors.frame_processor import FrameProcessor

    class Recorder(FrameProcessor):
        async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
            await super().process_frame(frame, direction)
            if isinstance(frame, TTSAudioRawFrame):
                assert frame.sample_rate == RATE and frame.num_channels == 1
                heard.audio += frame.audio
            elif isinstance(frame, TTSTextFrame):
                heard.text.append(frame.text)
            elif isinstance(frame, TranscriptionFrame):
                heard.user.append(frame.text)
            elif isinstance(frame, LLMFullResponseEndFrame):
                heard.responses_done += 1
            heard.changed.set()
            await self.push_frame(frame, direction)

    return Recorder()


@dataclass
class Agent:
    """A running pipecat pipeline around the service."""

    worker: Any
    runner: Any
    run: asyncio.Task[None]
    heard: Heard

    async def queue(self, *frames: Frame) -> None:
        await self.worker.queue_frames(list(frames))

    async def until(self, done: Callable[[Heard], bool], what: str, timeout: float = TIMEOUT) -> None:
        deadline = time.monotonic() + timeout
        while not done(self.heard):
            assert not self.heard.errors, self.heard.errors
            assert not self.run.done(), f"the pipeline stopped while waiting for {what}"
            self.heard.changed.clear()
            try:
                await asyncio.wait_for(self.heard.changed.wait(), max(deadline - time.monotonic(), 0.01))
            except TimeoutError:
                pytest.fail(f"no {what} within {timeout:.0f} s; heard text {''.join(self.heard.text)!r}, "
                            f"user {self.heard.user!r}, items {[i.type for i in self.heard.items]}")
        assert not self.heard.errors, self.heard.errors

    async def close(self) -> None:
        await self.runner.cancel()
        await asyncio.wait_for(self.run, 30)


async def start_agent(server, instructions: str, messages: list[dict[str, Any]], tools: Any = None,
                      functions: dict[str, Callable[[Any], Awaitable[None]]] | None = None,
                      session: Any = None) -> Agent:
    from pipecat.pipeline.pipeline import Pipeline
    from pipecat.pipeline.worker import PipelineParams, PipelineWorker
    from pipecat.processors.aggregators.llm_context import LLMContext
    from pipecat.processors.aggregators.llm_response_universal import LLMContextAggregatorPair
    from pipecat.services.openai.realtime.llm import OpenAIRealtimeLLMService
    from pipecat.workers.runner import WorkerRunner

    heard = Heard()
    # Defaults everywhere but the key and the URL: the model id is pipecat's own default
    # (a gpt-realtime id, which the server maps to its default model).
    settings = OpenAIRealtimeLLMService.Settings(system_instruction=instructions)
    if session is not None:
        settings.session_properties = session
    llm = OpenAIRealtimeLLMService(api_key="test", base_url=f"{server.ws}/v1/realtime", settings=settings)

    @llm.event_handler("on_conversation_item_created")
    async def on_item(_llm: Any, _item_id: str, item: Any) -> None:
        heard.items.append(item)

    for name, handler in (functions or {}).items():
        llm.register_function(name, handler)
    context = LLMContext(messages, tools) if tools is not None else LLMContext(messages)
    pair = LLMContextAggregatorPair(context)
    # the service pushes the user's transcript upstream and its reply downstream: listen on both sides
    pipeline = Pipeline([pair.user(), make_recorder(heard), llm, make_recorder(heard), pair.assistant()])
    worker = PipelineWorker(pipeline, params=PipelineParams(audio_in_sample_rate=RATE, audio_out_sample_rate=RATE))

    @worker.event_handler("on_pipeline_error")
    async def on_error(_worker: Any, frame: Any) -> None:
        heard.errors.append(str(frame.error))
        heard.changed.set()

    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(worker)
    run = asyncio.create_task(runner.run())
    return Agent(worker, runner, run, heard)


async def test_a_spoken_turn_gets_spoken_and_written_reply(server, say, transcribe):
    from pipecat.frames.frames import InputAudioRawFrame
    from pipecat.services.openai.realtime import events

    # the user's transcript is opt-in, in OpenAI's API as in pipecat (its default transcription model)
    session = events.SessionProperties(audio=events.AudioConfiguration(
        input=events.AudioInput(transcription=events.InputAudioTranscription())))
    agent = await start_agent(server, "You are a helpful assistant. Answer briefly.", [], session=session)
    try:
        speech = trim_silence(say("What is the capital of France?", RATE))
        pcm = np.concatenate([np.zeros(RATE // 2, np.int16), speech, np.zeros(RATE * 2, np.int16)])
        frames = [InputAudioRawFrame(pcm[i : i + FRAME].astype("<i2").tobytes(), RATE, 1)
                  for i in range(0, len(pcm), FRAME)]
        for i in range(0, len(frames), 25):  # half a second at a time, at about real time
            await agent.queue(*frames[i : i + 25])
            await asyncio.sleep(0.25)
        await agent.until(lambda h: h.responses_done >= 1 and len(h.audio) > 0, "spoken reply")
        heard = agent.heard
        assert heard.user and "capital" in heard.user[0].lower(), heard.user
        reply_text = "".join(heard.text).strip()
        assert reply_text, "no transcript of the reply came through pipecat"
        reply = np.frombuffer(bytes(heard.audio), "<i2")
        assert len(reply) > RATE // 2, f"only {len(reply)} samples of reply audio"
        assert transcribe(reply, RATE).strip(), f"reply audio not understood (model said {reply_text!r})"
    finally:
        await agent.close()


WEATHER_TOOL = {
    "name": "get_weather",
    "description": "Get the current weather in a city.",
    "properties": {"city": {"type": "string", "description": "The city, e.g. Paris"}},
    "required": ["city"],
}


async def test_a_registered_function_is_called_and_its_result_spoken(server):
    from pipecat.adapters.llm.schemas.function_schema import FunctionSchema
    from pipecat.adapters.llm.schemas.tools_schema import ToolsSchema
    from pipecat.frames.frames import LLMRunFrame, LLMUpdateSettingsFrame
    from pipecat.services.llm_service import FunctionCallParams
    from pipecat.services.openai.realtime import events
    from pipecat.services.openai.realtime.llm import OpenAIRealtimeLLMService

    calls: list[tuple[str, dict[str, Any]]] = []

    async def get_weather(params: FunctionCallParams) -> None:
        calls.append((params.function_name, dict(params.arguments)))
        # The call was forced (tool_choice "required"); the answer must be spoken, so the handler
        # turns calls off before it hands the result back ("auto" would let the tiny model copy the
        # call it sees in the conversation). The service takes frames in order: this session.update
        # reaches the server before the response.create that the result leads to.
        await params.llm.queue_frame(LLMUpdateSettingsFrame(delta=OpenAIRealtimeLLMService.Settings(
            session_properties=events.SessionProperties(tool_choice="none"))))
        await params.result_callback({"city": params.arguments.get("city"), "conditions": "sunny",
                                      "temperature_celsius": 23})

    tools = ToolsSchema(standard_tools=[FunctionSchema(**WEATHER_TOOL)])
    agent = await start_agent(
        server, "You are a weather assistant. Call get_weather to look up the weather, "
        "then tell the user the result in one short sentence.",
        [{"role": "user", "content": "What's the weather like in Paris right now?"}],
        tools, {"get_weather": get_weather},
        # the small embedded model does not call tools reliably on its own: force the first call
        session=events.SessionProperties(tool_choice="required"))
    try:
        await agent.queue(LLMRunFrame())
        await agent.until(lambda h: bool(calls) or h.responses_done >= 1, "function call")
        assert calls, f"the model answered without calling the function: {''.join(agent.heard.text)!r}"
        assert not agent.heard.audio, "a forced call came with speech"
        name, arguments = calls[0]
        assert name == "get_weather"
        assert "paris" in str(arguments.get("city", "")).lower(), arguments
        # The result goes back through pipecat (function_call_output), the assistant aggregator asks
        # for the next response, and the model speaks the answer.
        await agent.until(lambda h: len(h.audio) > 0 and h.responses_done >= 2, "answer after the function result")
        call_ids = [i.call_id for i in agent.heard.items if i.type == "function_call"]
        outputs = [i for i in agent.heard.items if i.type == "function_call_output"]
        assert len(call_ids) == 1 and [o.call_id for o in outputs] == call_ids, agent.heard.items
        assert json.loads(outputs[0].output) == {"city": arguments["city"], "conditions": "sunny",
                                                 "temperature_celsius": 23}
        # the answer is spoken, with its transcript; what it says is up to a 135M-parameter model,
        # which often ignores the result, so the words are not checked
        assert "".join(agent.heard.text).strip(), "no transcript of the answer came through pipecat"
        assert len(np.frombuffer(bytes(agent.heard.audio), "<i2")) > RATE // 2
        assert len(calls) == 1, f"the function was called again: {calls}"
    finally:
        await agent.close()
