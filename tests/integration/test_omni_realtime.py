"""The omni engine end to end over /v1/realtime: tiny random Qwen2.5-Omni / Qwen3-Omni
checkpoints (built in the test, loaded through the real-checkpoint path). The audio is noise; the
plumbing is what is tested: rate, framing, event order, epochs."""

from __future__ import annotations

import asyncio
import base64
import json

import numpy as np
import pytest
from openai import AsyncOpenAI

pytest.importorskip("transformers")

from realtime_omni.engines.omni import OmniModel  # noqa: E402
from realtime_omni.engines.registry import ModelRegistry  # noqa: E402
from realtime_omni.engines.settings import OmniSettings  # noqa: E402
from tests.engines.test_omni import CHUNKS, save_checkpoint  # noqa: E402
from tests.server import ServerThread  # noqa: E402

pytestmark = pytest.mark.asyncio(loop_scope="session")


@pytest.fixture(scope="module", params=["qwen2_5_omni", "qwen3_omni_moe"])
def omni_server(request, tmp_path_factory):
    import torch

    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp(request.param)
    save_checkpoint(request.param, root)
    model = OmniModel(root, OmniSettings(talker_do_sample=False, seed=0, talker_max_frames=48, **CHUNKS[request.param]),
                      model_id=request.param)
    registry = ModelRegistry()
    registry.add(model)
    model.load()
    with ServerThread(registry) as srv:
        yield srv, request.param
    registry.close()


def sdk(srv) -> AsyncOpenAI:
    return AsyncOpenAI(api_key="x", base_url=f"{srv.http}/v1", websocket_base_url=f"{srv.ws}/v1")


async def until_done(conn) -> list:
    """The events up to and with the next ``response.done``."""
    events = []
    while not events or events[-1].type != "response.done":
        events.append(await asyncio.wait_for(conn.recv(), 120))
    return events


def audio_bytes(events: list) -> int:
    return sum(len(base64.b64decode(e.delta)) for e in events if e.type == "response.output_audio.delta")


async def test_audio_in_audio_out_event_order_and_epochs(omni_server):
    srv, model_id = omni_server
    client = sdk(srv)
    async with client.realtime.connect(model=model_id) as conn:
        created = await conn.recv()
        assert "audio_in" in created.session.capabilities
        await conn.session.update(session={"type": "realtime", "max_output_tokens": 12,
                                           "audio": {"input": {"turn_detection": None}}})
        rng = np.random.default_rng(0)
        noise = (rng.standard_normal(24_000) * 3000).astype("<i2")
        for offset in range(0, len(noise), 480):
            await conn.input_audio_buffer.append(audio=base64.b64encode(noise[offset:offset + 480].tobytes()).decode())
        await conn.input_audio_buffer.commit()
        await conn.response.create()
        events = await until_done(conn)
        types = [e.type for e in events]
        order = ["input_audio_buffer.committed", "response.created", "response.output_item.added",
                 "response.content_part.added", "response.output_audio.delta", "response.output_audio.done",
                 "response.output_audio_transcript.done", "response.content_part.done", "response.output_item.done",
                 "response.done"]
        positions = [types.index(t) for t in order]
        assert positions == sorted(positions), types
        deltas = [base64.b64decode(e.delta) for e in events if e.type == "response.output_audio.delta"]
        assert all(len(d) % 2 == 0 for d in deltas)  # whole pcm16 samples at 24 kHz
        assert sum(len(d) for d in deltas) / 2 / 24_000 > 0.05
        assert events[-1].response.status in ("completed", "incomplete")
        assert events[-1].response.usage.input_tokens > 0

        # second turn: a cancel fences the epoch: nothing of the cancelled response follows
        await conn.conversation.item.create(item={"type": "message", "role": "user",
                                                  "content": [{"type": "input_text", "text": "again"}]})
        await conn.response.create(response={"max_output_tokens": 1000})
        rid = None
        while True:
            event = await asyncio.wait_for(conn.recv(), 120)
            if event.type == "response.created":
                rid = event.response.id
            if event.type == "response.output_audio.delta":
                break
        await conn.response.cancel()
        done = None
        late = []
        deadline = asyncio.get_running_loop().time() + 5
        while asyncio.get_running_loop().time() < deadline:
            try:
                event = await asyncio.wait_for(conn.recv(), 1.0)
            except asyncio.TimeoutError:
                break
            if done is not None and getattr(event, "response_id", None) == rid:
                late.append(event.type)
            if event.type == "response.done":
                done = event.response
        assert done is not None and done.status == "cancelled"
        assert late == []


async def test_concurrent_clients_share_the_batched_stages(omni_server):
    """Six clients over /v1/realtime with turns at the same time: each gets its whole reply, and
    their steps ran in shared batches (the engine's counters at /metrics)."""
    import httpx

    srv, model_id = omni_server

    def counter(text: str, name: str, stage: str) -> float:
        prefix = f'{name}{{model="{model_id}",stage="{stage}"}} '
        return sum(float(line[len(prefix):]) for line in text.splitlines() if line.startswith(prefix))

    async def scrape() -> str:
        async with httpx.AsyncClient() as http:
            return (await http.get(f"{srv.http}/metrics", timeout=10)).text

    before = await scrape()

    async def one(i: int) -> tuple[str, float]:
        client = sdk(srv)
        async with client.realtime.connect(model=model_id) as conn:
            await conn.recv()  # session.created
            await conn.session.update(session={"type": "realtime", "max_output_tokens": 8,
                                               "audio": {"input": {"turn_detection": None}}})
            await conn.conversation.item.create(item={"type": "message", "role": "user",
                                                      "content": [{"type": "input_text", "text": f"hello {i}"}]})
            await conn.response.create()
            events = await until_done(conn)
            return events[-1].response.status, audio_bytes(events) / 2 / 24_000

    results = await asyncio.gather(*(one(i) for i in range(6)))
    assert all(status in ("completed", "incomplete") and audio > 0 for status, audio in results), results
    after = await scrape()
    for stage in ("thinker", "talker"):
        steps = counter(after, "realtime_omni_engine_steps_total", stage) - counter(
            before, "realtime_omni_engine_steps_total", stage)
        rows = counter(after, "realtime_omni_engine_rows_total", stage) - counter(
            before, "realtime_omni_engine_rows_total", stage)
        assert steps > 0 and rows / steps > 1.0, (stage, steps, rows)
    # and what the sessions' own threads took of the interpreter, per stage, beside the frames
    frames_line = f'realtime_omni_engine_frames_total{{model="{model_id}"}} '
    frames = sum(float(line[len(frames_line):]) for line in after.splitlines() if line.startswith(frames_line)) - sum(
        float(line[len(frames_line):]) for line in before.splitlines() if line.startswith(frames_line))
    assert frames >= sum(audio for _, audio in results) * 12.5 - 6, frames  # 80 ms a frame (a final frame may be cut)
    for stage in ("thinker", "talker", "codec"):
        cpu = counter(after, "realtime_omni_engine_session_cpu_seconds_total", stage) - counter(
            before, "realtime_omni_engine_session_cpu_seconds_total", stage)
        assert 0 < cpu < 60, (stage, cpu)

    # the codec's windows by path (no CUDA graph on the CPU: every one eager), and, for Qwen2.5,
    # its passes of several window lengths (a count that only grows)
    def value(text: str, line_prefix: str) -> float:
        return sum(float(line[len(line_prefix):]) for line in text.splitlines() if line.startswith(line_prefix))

    eager = f'realtime_omni_engine_codec_windows_total{{model="{model_id}",path="eager"}} '
    graph = f'realtime_omni_engine_codec_windows_total{{model="{model_id}",path="graph"}} '
    assert value(after, eager) - value(before, eager) >= len(results) and value(after, graph) == value(before, graph) == 0
    mixed = f'realtime_omni_engine_codec_mixed_passes_total{{model="{model_id}"}} '
    assert (mixed in after) == (model_id == "qwen2_5_omni") and value(after, mixed) >= value(before, mixed)


async def test_a_session_beyond_the_models_slots_is_refused_with_a_code(tmp_path):
    """Admission control over /v1/realtime: with one slot, a second client gets
    ``session_limit_reached`` (close 1013) while the first one's session goes on."""
    await asyncio.to_thread(_refused_beyond_slots, tmp_path)


def _refused_beyond_slots(tmp_path) -> None:
    import json
    import time

    import httpx

    import torch
    from websockets.sync.client import connect

    torch.set_num_threads(1)
    save_checkpoint("qwen3_omni_moe", tmp_path)
    model = OmniModel(tmp_path, OmniSettings(talker_do_sample=False, seed=0, talker_max_frames=16, max_sessions=1,
                                             **CHUNKS["qwen3_omni_moe"]), model_id="tiny")
    registry = ModelRegistry()
    registry.add(model)
    model.load()
    try:
        with ServerThread(registry) as srv:
            url = f"{srv.ws}/v1/realtime?model=tiny"
            with connect(url) as first:
                assert json.loads(first.recv(timeout=30))["type"] == "session.created"
                with connect(url) as second:
                    error = json.loads(second.recv(timeout=30))
                    assert error["type"] == "error"
                    assert error["error"]["code"] == "session_limit_reached"
                    assert "capacity" in error["error"]["message"]
                first.send(json.dumps({"type": "session.update", "session": {"type": "realtime", "instructions": "hi"}}))
                assert json.loads(first.recv(timeout=30))["type"] == "session.updated"
                # the operator sees the slots and the batched stages in /metrics
                text = httpx.get(f"{srv.http}/metrics", timeout=10).text
                assert 'realtime_omni_engine_slots{model="tiny"} 1.0' in text
                assert 'realtime_omni_engine_slots_in_use{model="tiny"} 1.0' in text
                assert 'realtime_omni_engine_replies_speaking{model="tiny"} 0.0' in text  # no reply yet
                assert 'realtime_omni_engine_replies_paced{model="tiny"} 0.0' in text
                assert 'realtime_omni_engine_steps_total{model="tiny",stage="thinker"}' in text
                assert 'realtime_omni_engine_loop_seconds_total{model="tiny",phase="idle",stage="thinker"}' in text
                assert 'realtime_omni_engine_prefills_total{model="tiny",stage="thinker prefill"}' in text
                assert 'realtime_omni_engine_prefill_wait_seconds_total{model="tiny",stage="talker prefill"}' in text
                # counts since start are counters, the live count a gauge
                assert "# TYPE realtime_omni_sessions_opened_total counter" in text
                assert "# TYPE realtime_omni_sessions_active gauge" in text
            # the slot comes back when the first client leaves
            for _ in range(100):
                if model.batching.stats()["in_use"] == 0:
                    break
                time.sleep(0.05)
            with connect(url) as third:
                assert json.loads(third.recv(timeout=30))["type"] == "session.created"
    finally:
        registry.close()


async def test_a_turn_committed_by_hand_is_evaluated_before_the_reply_is_asked_for(omni_server):
    """An omni session evaluates a committed audio turn at once: a reply asked for a moment later
    finds it in the cache (reported as cached input tokens) and evaluates only its header."""
    srv, model_id = omni_server
    client = sdk(srv)
    async with client.realtime.connect(model=model_id) as conn:
        await conn.recv()
        await conn.session.update(session={"type": "realtime", "max_output_tokens": 4,
                                           "audio": {"input": {"turn_detection": None}}})
        noise = (np.random.default_rng(1).standard_normal(24_000) * 3000).astype("<i2")
        await conn.input_audio_buffer.append(audio=base64.b64encode(noise.tobytes()).decode())
        await conn.input_audio_buffer.commit()
        await asyncio.sleep(3)  # the user's turn is evaluated meanwhile (tens of ms here)
        await conn.response.create()
        event = (await until_done(conn))[-1]
        usage = event.response.usage
        header = 3  # <|im_start|>assistant\n
        assert usage.input_token_details.cached_tokens == usage.input_tokens - header > 10


@pytest.mark.parametrize("live", [True, False])
async def test_a_reply_takes_one_talker_call_fed_token_by_token(omni_server, monkeypatch, live):
    """The pipeline hands the omni talker each thinker token as it comes, in one talk_live call
    per reply (a talk call per token cost a worker round trip each); the reply is whole. With
    ``live_talker`` off, a talk call per hand-over as before."""
    from realtime_omni.engines.omni.session import OmniSession

    if not live:
        monkeypatch.setattr(OmniSession, "talks_live", False)

    calls = {"talk": 0, "talk_live": 0, "talk_more": 0}
    for name in calls:
        original = getattr(OmniSession, name)

        def counted(self, *args, _original=original, _name=name, **kwargs):
            calls[_name] += 1
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(OmniSession, name, counted)
    srv, model_id = omni_server
    client = sdk(srv)
    async with client.realtime.connect(model=model_id) as conn:
        await conn.recv()
        await conn.session.update(session={"type": "realtime", "max_output_tokens": 10,
                                           "audio": {"input": {"turn_detection": None}}})
        await conn.conversation.item.create(item={"type": "message", "role": "user",
                                                  "content": [{"type": "input_text", "text": "hello"}]})
        await conn.response.create()
        events = await until_done(conn)
        event, audio = events[-1], audio_bytes(events)
        assert event.response.status in ("completed", "incomplete") and audio > 0
    if not live:
        assert calls["talk"] >= 1 and calls["talk_live"] == calls["talk_more"] == 0
        return
    assert calls["talk"] == 0 and calls["talk_live"] == 1
    # the reply's outputs (10 tokens and the end mark) and the final hand-over, fewer when they queued
    assert 1 <= calls["talk_more"] <= 12


WEATHER_TOOL = {"type": "function", "name": "get_weather", "description": "Current weather of a city",
                "parameters": {"type": "object", "required": ["city"],
                               "properties": {"city": {"enum": ["paris", "rome", "oslo"]}}}}


async def test_a_function_call_its_output_and_the_spoken_answer_after_it(omni_server):
    """Through the SDK: a required call comes back as a ``function_call`` item with arguments
    streamed and valid, nothing spoken; its output and ``response.create`` then get a spoken
    answer that finds the call in the model's cache (cached input tokens)."""
    srv, model_id = omni_server
    client = sdk(srv)
    async with client.realtime.connect(model=model_id) as conn:
        created = await conn.recv()
        assert "tools" in created.session.capabilities
        await conn.session.update(session={"type": "realtime", "max_output_tokens": 120, "tools": [WEATHER_TOOL],
                                           "tool_choice": "required", "parallel_tool_calls": False,
                                           "audio": {"input": {"turn_detection": None}}})
        noise = (np.random.default_rng(2).standard_normal(24_000) * 3000).astype("<i2")
        await conn.input_audio_buffer.append(audio=base64.b64encode(noise.tobytes()).decode())
        await conn.input_audio_buffer.commit()
        await conn.response.create()
        events = await until_done(conn)
        event = events[-1]
        kinds = [e.type for e in events]
        assert "response.output_audio.delta" not in kinds
        (call,) = [o for o in event.response.output if o.type == "function_call"]
        assert call.name == "get_weather" and json.loads(call.arguments)["city"] in ("paris", "rome", "oslo")
        streamed = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
        assert streamed == call.arguments
        await conn.conversation.item.create(item={"type": "function_call_output", "call_id": call.call_id,
                                                  "output": '{"temperature": 21}'})
        await conn.session.update(session={"type": "realtime", "tool_choice": "none", "max_output_tokens": 6})
        await conn.response.create()
        events = await until_done(conn)
        event, audio = events[-1], audio_bytes(events)
        assert event.response.status in ("completed", "incomplete") and audio > 0  # (6 tokens: the limit)
        usage = event.response.usage
        # the call stayed in the cache: evaluated were only its closing, the output (a token per
        # byte with the test tokenizer) and the reply's header
        evaluated = usage.input_tokens - usage.input_token_details.cached_tokens
        output = len('<tool_response>\n{"temperature": 21}\n</tool_response>')
        assert output < evaluated <= output + 16


async def test_new_instructions_and_tools_are_evaluated_before_the_first_reply(omni_server):
    """A session.update that changes what every prompt opens with (instructions, tools) has the
    model evaluate it at once: the first reply after it finds it in the cache."""
    srv, model_id = omni_server
    client = sdk(srv)
    instructions = "Answer as a ship's captain would, in short sentences. " * 6
    async with client.realtime.connect(model=model_id) as conn:
        await conn.recv()
        await conn.session.update(session={"type": "realtime", "max_output_tokens": 4, "instructions": instructions,
                                           "tools": [WEATHER_TOOL], "audio": {"input": {"turn_detection": None}}})
        await asyncio.sleep(3)  # evaluated meanwhile (tens of ms here)
        await conn.conversation.item.create(item={"type": "message", "role": "user",
                                                  "content": [{"type": "input_text", "text": "Hello there."}]})
        await conn.response.create(response={"tool_choice": "none"})
        event = (await until_done(conn))[-1]
        usage = event.response.usage
        # a token per byte with the test tokenizer: the instructions alone are more than 300
        assert usage.input_token_details.cached_tokens > len(instructions.encode())
        assert usage.input_tokens - usage.input_token_details.cached_tokens < 40  # the user's turn, the header
