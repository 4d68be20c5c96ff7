"""Voice agents end to end: the official ``openai`` SDK calls a function on the embedded model.

A real server with the real SmolLM2 thinker; every event is parsed by the SDK's own models.
SmolLM2-135M seldom decides to call a function by itself, so the call is asked for with a named
``tool_choice`` where the test needs one; ``auto`` and ``none`` are tested for what they promise.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from tests.integration.test_realtime_sdk import TIMEOUT, audio_of, client, collect_until_done, configure

pytestmark = pytest.mark.asyncio(loop_scope="session")

WEATHER = {"type": "function", "name": "get_weather", "description": "Get the current weather for a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "the city"}},
                          "required": ["city"], "additionalProperties": False}}
NAMED = {"type": "function", "name": "get_weather"}
QUESTION = "What's the weather in Paris?"
FORECAST = "sunny and 31 degrees"


async def ask(conn, text: str = QUESTION) -> None:
    await conn.conversation.item.create(item={"type": "message", "role": "user",
                                              "content": [{"type": "input_text", "text": text}]})


async def expect_error(conn, send, code: str, param: str | None = None):
    await send()
    while True:
        event = await asyncio.wait_for(conn.recv(), TIMEOUT)
        if event.type == "error":
            assert (event.error.code, event.error.param if param else None) == (code, param), event.error
            return event.error


def uses_forecast(text: str) -> bool:
    text = text.lower()
    return "sunny" in text or "31" in text or "thirty" in text


async def test_weather_function_is_called_its_output_returned_and_the_answer_uses_it(server, transcribe):
    async with client(server).realtime.connect(model="embedded") as conn:
        created = await conn.recv()
        assert created.type == "session.created"
        await configure(conn, tools=[WEATHER], tool_choice="auto", audio={"input": {"turn_detection": None}})
        await ask(conn)
        await conn.response.create(response={"tool_choice": NAMED, "output_modalities": ["audio"]})
        events = await collect_until_done(conn)
        question_id = next(e.item.id for e in events if e.type == "conversation.item.added" and e.item.role == "user")
        types = [e.type for e in events]
        assert "response.output_audio.delta" not in types, "a call is not spoken"
        deltas = [e for e in events if e.type == "response.function_call_arguments.delta"]
        done = next(e for e in events if e.type == "response.function_call_arguments.done")
        assert deltas and "".join(d.delta for d in deltas) == done.arguments
        assert done.name == "get_weather"
        arguments = json.loads(done.arguments)
        assert isinstance(arguments["city"], str) and set(arguments) == {"city"}
        added = next(e for e in events if e.type == "response.output_item.added")
        assert added.item.type == "function_call" and added.item.call_id == done.call_id
        response = events[-1].response
        assert response.status == "completed"
        assert [(o.type, o.status) for o in response.output] == [("function_call", "completed")]

        await conn.conversation.item.create(item={"type": "function_call_output", "call_id": done.call_id,
                                                  "output": json.dumps({"forecast": FORECAST})})
        # the spoken answer, then (the model is tiny and samples) up to fifteen more text answers
        # out of band, until one uses the function's output. Those read only the question, the
        # call and its output, by reference (a first answer that went astray, in the context,
        # made all sixteen go astray once). They ask for the function's result without naming it:
        # it can only come from the conversation
        await conn.response.create()
        events = await collect_until_done(conn)
        output_id = next(e.item.id for e in events
                         if e.type == "conversation.item.added" and e.item.type == "function_call_output")
        spoken = "".join(e.delta for e in events if e.type == "response.output_audio_transcript.delta")
        assert events[-1].response.output[0].type == "message"
        assert len(transcribe(audio_of(events), 24_000).split()) >= 1, "the answer is speech"
        references = [{"type": "item_reference", "id": i} for i in (question_id, added.item.id, output_id)]
        answers = [spoken]
        for _ in range(15):
            if uses_forecast(answers[-1]):
                break
            await conn.response.create(response={"conversation": "none", "output_modalities": ["text"],
                                                 "input": references,
                                                 "instructions": "Tell the user what get_weather returned."})
            events = await collect_until_done(conn)
            answers.append("".join(e.delta for e in events if e.type == "response.output_text.delta"))
        assert uses_forecast(answers[-1]), answers


async def test_auto_lets_the_model_choose_and_none_never_calls(server):
    async with client(server).realtime.connect(model="embedded") as conn:
        await conn.recv()
        await configure(conn, tools=[WEATHER], tool_choice="auto", output_modalities=["text"],
                        audio={"input": {"turn_detection": None}})
        await ask(conn)
        await conn.response.create()
        events = await collect_until_done(conn)
        output = events[-1].response.output
        assert len(output) == 1 and output[0].type in ("message", "function_call")
        if output[0].type == "function_call":  # the model chose to call: a complete, valid call
            assert json.loads(output[0].arguments)["city"]
        else:
            assert output[0].content[0].text.strip()

        await conn.session.update(session={"type": "realtime", "tool_choice": "none"})
        for _ in range(2):
            await conn.response.create(response={"conversation": "none"})
            events = await collect_until_done(conn)
            assert not [e for e in events if e.type.startswith("response.function_call")]
            assert [o.type for o in events[-1].response.output] == ["message"]
            assert events[-1].response.output[0].content[0].text.strip()


async def test_required_calls_without_a_name_and_the_session_reports_its_tools(server):
    async with client(server).realtime.connect(model="embedded") as conn:
        await conn.recv()
        await conn.session.update(session={"type": "realtime", "tools": [WEATHER], "tool_choice": "required",
                                           "output_modalities": ["text"], "max_output_tokens": 60,
                                           "audio": {"input": {"turn_detection": None}}})
        while (event := await asyncio.wait_for(conn.recv(), TIMEOUT)).type != "session.updated":
            pass
        assert [t.name for t in event.session.tools] == ["get_weather"] and event.session.tool_choice == "required"
        await ask(conn)
        await conn.response.create()
        events = await collect_until_done(conn)
        calls = [o for o in events[-1].response.output if o.type == "function_call"]
        assert len(calls) == 1 and calls[0].name == "get_weather"
        assert isinstance(json.loads(calls[0].arguments)["city"], str)


async def test_hostile_tools_and_function_items_get_precise_errors(server):
    async with client(server).realtime.connect(model="embedded") as conn:
        await conn.recv()
        await configure(conn, audio={"input": {"turn_detection": None}})
        await expect_error(conn, lambda: conn.session.update(session={"type": "realtime", "tools": [
            {"type": "function", "name": "f", "parameters": {"type": "object", "properties": {"a": {"type": 7}}}}]}),
            "invalid_value", "session.tools.0.parameters.properties.a.type")
        await expect_error(conn, lambda: conn.session.update(session={"type": "realtime", "tools": [
            {"type": "mcp", "server_label": "x", "server_url": "http://127.0.0.1:9"}]}),
            "mcp_server_not_allowed", "session.tools.0.server_url")  # MCP is off until the operator lists servers
        await expect_error(conn, lambda: conn.session.update(session={"type": "realtime", "tools": [WEATHER],
                                                                      "tool_choice": {"type": "function", "name": "nope"}}),
                           "invalid_value", "session.tool_choice.name")
        await expect_error(conn, lambda: conn.conversation.item.create(item={
            "type": "function_call_output", "call_id": "call_never_made", "output": "{}"}), "item_not_found", "item.call_id")
        await expect_error(conn, lambda: conn.conversation.item.create(item={
            "type": "function_call", "name": "get_weather", "call_id": "c1", "arguments": "{" * 1_000_000}),
            "invalid_value", "item.arguments")
        # ...and the session goes on: a normal text turn
        await ask(conn, "Hello!")
        await conn.response.create(response={"output_modalities": ["text"]})
        events = await collect_until_done(conn)
        assert events[-1].response.status in ("completed", "incomplete")


async def test_clients_default_model_ids_are_served_by_the_default_model(server):
    import httpx

    for requested in ("gpt-realtime", "gpt-4o-realtime-preview-2024-12-17"):
        async with client(server).realtime.connect(model=requested) as conn:
            created = await asyncio.wait_for(conn.recv(), TIMEOUT)
            assert created.type == "session.created"
            assert created.session.model == "embedded"  # the model that serves...
            assert created.session.model_extra["requested_model"] == requested  # ...what was asked for
            # clients repeat their model id in session.update: the same model, so accepted
            await conn.session.update(session={"type": "realtime", "model": requested, "instructions": "Be brief."})
            updated = await asyncio.wait_for(conn.recv(), TIMEOUT)
            assert updated.type == "session.updated" and updated.session.instructions == "Be brief."
            await expect_error(conn, lambda: conn.session.update(session={"type": "realtime", "model": "echo"}),
                               "invalid_value", "session.model")
    async with httpx.AsyncClient(base_url=server.http) as http:
        models = {m["id"]: m for m in (await http.get("/v1/models")).json()["data"]}
    assert models["embedded"]["default"] and "gpt-realtime*" in models["embedded"]["aliases"]
    assert not models["echo"]["default"] and models["echo"]["aliases"] == []


async def test_beta_clients_get_conversation_created_and_response_metadata_round_trips(server):
    async with client(server).beta.realtime.connect(model="gpt-4o-realtime-preview-2024-12-17") as conn:
        first, second = await conn.recv(), await conn.recv()
        assert (first.type, second.type) == ("session.created", "conversation.created")
        assert second.conversation.object == "realtime.conversation" and second.conversation.id
        await conn.session.update(session={"modalities": ["text"], "turn_detection": None, "max_response_output_tokens": 20})
        await conn.conversation.item.create(item={"type": "message", "role": "user",
                                                  "content": [{"type": "input_text", "text": "Hello!"}]})
        # LiveKit's agent tags its response.create like this to find the response it asked for
        await conn.response.create(response={"metadata": {"client_event_id": "lk-42"}})
        created = done = None
        while done is None:
            event = await asyncio.wait_for(conn.recv(), TIMEOUT)
            if event.type == "response.created":
                created = event
            elif event.type == "response.done":
                done = event
        assert created.response.metadata == done.response.metadata == {"client_event_id": "lk-42"}
        assert done.response.output[0].content[0].text.strip()


async def test_idle_timeout_triggers_over_the_wire(server):
    import numpy as np

    from tests.integration.test_realtime_sdk import send_pcm

    async with client(server).realtime.connect(model="gpt-realtime") as conn:
        await conn.recv()
        await configure(conn, output_modalities=["text"], audio={"input": {"turn_detection": {
            "type": "server_vad", "idle_timeout_ms": 5000, "create_response": True}}})
        await expect_error(conn, lambda: conn.session.update(session={"type": "realtime", "audio": {"input": {
            "turn_detection": {"type": "server_vad", "idle_timeout_ms": 100}}}}),
            "invalid_value", "session.audio.input.turn_detection.idle_timeout_ms")
        await ask(conn, "Say hello.")
        await conn.response.create()
        await collect_until_done(conn)
        await send_pcm(conn, np.zeros(24_000 * 6, np.int16))
        events = await collect_until_done(conn)  # the nudge's response
        types = [e.type for e in events]
        fired = next(e for e in events if e.type == "input_audio_buffer.timeout_triggered")
        assert fired.audio_end_ms - fired.audio_start_ms >= 5000
        assert types.index("input_audio_buffer.timeout_triggered") < types.index("response.created")


async def test_a_call_cut_by_max_output_tokens_is_incomplete_and_not_done(server):
    async with client(server).realtime.connect(model="embedded") as conn:
        await conn.recv()
        await configure(conn, tools=[WEATHER], output_modalities=["text"], audio={"input": {"turn_detection": None}})
        await ask(conn)
        await conn.response.create(response={"tool_choice": NAMED, "max_output_tokens": 2})
        events = await collect_until_done(conn)
        assert "response.function_call_arguments.done" not in [e.type for e in events]
        response = events[-1].response
        assert (response.status, response.status_details.reason) == ("incomplete", "max_output_tokens")
        assert [(o.type, o.status) for o in response.output] == [("function_call", "incomplete")]
