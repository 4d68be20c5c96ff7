"""Function calling in the sans-I/O core: tools settings, function_call items, their events."""

import json

import pytest

from realtime_omni.engines.base import ModelInfo, ToolCallDelta
from realtime_omni.protocol import ProtocolError
from realtime_omni.session import actions as act
from tests.session.test_core import CASCADE, Driver

AGENT = ModelInfo(id="agent", capabilities=frozenset({"audio_in", "text_in", "audio_out", "text_out", "tools"}))
WEATHER = {"type": "function", "name": "get_weather", "description": "Weather of a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
CLOCK = {"type": "function", "name": "get_time", "description": "The time", "parameters": {"type": "object"}}


def agent(**session) -> Driver:
    d = Driver(AGENT, has_vad=False)
    d.send(type="session.update", session={"type": "realtime", "tools": [WEATHER, CLOCK], **session})
    d.take()
    return d


def errors_of(d: Driver) -> list[dict]:
    return [e["error"] for e in d.take() if e["type"] == "error"]


def start(d: Driver, **response) -> act.StartResponse:
    new = d.send(type="response.create", **({"response": response} if response else {}))
    return next(a for a in new if isinstance(a, act.StartResponse))


def call(d: Driver, action: act.StartResponse, name: str, *deltas: str) -> None:
    d.s.on_response_call(action.response_id, action.epoch, ToolCallDelta(name=name))
    for delta in deltas:
        d.s.on_response_call(action.response_id, action.epoch, ToolCallDelta(name=name, delta=delta))
    d.s.on_response_call(action.response_id, action.epoch, ToolCallDelta(name=name, done=True, arguments="".join(deltas)))
    d.s.on_response_end(action.response_id, action.epoch)
    d.pump()


def test_tools_and_tool_choice_are_kept_and_reported():
    d = Driver(AGENT, has_vad=False)
    d.take()
    d.send(type="session.update", session={"type": "realtime", "tools": [WEATHER], "tool_choice": "required"})
    session = d.events[-1]["session"]
    assert [t["name"] for t in session["tools"]] == ["get_weather"]
    assert session["tools"][0]["parameters"]["required"] == ["city"]
    assert session["tool_choice"] == "required"
    d.send(type="session.update", session={"type": "realtime", "tool_choice": {"type": "function", "name": "get_weather"}})
    assert d.events[-1]["session"]["tool_choice"] == {"type": "function", "name": "get_weather"}


def test_the_request_carries_tools_and_the_choice():
    d = agent(tool_choice="auto")
    action = start(d)
    assert [t.name for t in action.request.tools] == ["get_weather", "get_time"]
    assert (action.request.tool_choice, action.request.tool_name) == ("auto", None)
    d.s.on_response_end(action.response_id, action.epoch)
    d.pump()
    action = start(d, tool_choice={"type": "function", "name": "get_time"})  # per response
    assert (action.request.tool_choice, action.request.tool_name) == ("required", "get_time")
    d.s.on_response_end(action.response_id, action.epoch)
    d.pump()
    action = start(d, tools=[CLOCK], tool_choice="none")
    assert [t.name for t in action.request.tools] == ["get_time"] and action.request.tool_choice == "none"


def test_a_function_call_streams_as_items_and_argument_deltas():
    d = agent()
    action = start(d)
    types = d.types()
    # the model may call instead of speaking: no message item is announced before it decides
    assert "response.output_item.added" not in types
    call(d, action, "get_weather", '{"city": ', '"Paris"}')
    events = d.take()
    types = [e["type"] for e in events]
    assert types == ["response.created", "response.output_item.added", "conversation.item.added",
                     "response.function_call_arguments.delta", "response.function_call_arguments.delta",
                     "response.function_call_arguments.done", "response.output_item.done", "conversation.item.done",
                     "response.done"]
    added = events[1]["item"]
    assert added["type"] == "function_call" and added["name"] == "get_weather" and added["status"] == "in_progress"
    done_args = events[5]
    assert done_args["arguments"] == '{"city": "Paris"}' and done_args["call_id"] == added["call_id"]
    assert "".join(e["delta"] for e in events if e["type"].endswith("arguments.delta")) == done_args["arguments"]
    output = events[-1]["response"]["output"]
    assert [o["type"] for o in output] == ["function_call"] and output[0]["status"] == "completed"
    assert json.loads(output[0]["arguments"]) == {"city": "Paris"}


def test_function_output_then_response_reaches_the_model_as_a_tool_turn():
    d = agent()
    d.send(type="conversation.item.create", item={"type": "message", "role": "user",
                                                 "content": [{"type": "input_text", "text": "Weather in Paris?"}]})
    action = start(d)
    call(d, action, "get_weather", '{"city": "Paris"}')
    call_id = d.take()[-1]["response"]["output"][0]["call_id"]
    d.send(type="conversation.item.create", item={"type": "function_call_output", "call_id": call_id,
                                                 "output": '{"forecast": "sunny"}'})
    added = d.events[0]
    assert added["type"] == "conversation.item.added" and added["item"]["type"] == "function_call_output"
    action = start(d)
    roles = [(m.role, m.text, m.call.name if m.call else None, m.tool_name) for m in action.request.messages]
    assert roles == [("user", "Weather in Paris?", None, None), ("assistant", "", "get_weather", None),
                     ("tool", '{"forecast": "sunny"}', None, "get_weather")]
    d.s.on_response_text(action.response_id, action.epoch, "It is sunny.")
    d.s.on_response_end(action.response_id, action.epoch)
    d.pump()
    done = d.events[-1]["response"]
    assert [o["type"] for o in done["output"]] == ["message"] and done["output"][0]["content"][0]["transcript"] == "It is sunny."


def test_an_empty_reply_with_tools_is_still_one_message():
    d = agent()
    action = start(d)
    d.s.on_response_end(action.response_id, action.epoch)
    d.pump()
    assert [o["type"] for o in d.events[-1]["response"]["output"]] == ["message"]


def test_cancel_while_arguments_stream_leaves_an_incomplete_call():
    d = agent()
    action = start(d)
    d.s.on_response_call(action.response_id, action.epoch, ToolCallDelta(name="get_weather"))
    d.s.on_response_call(action.response_id, action.epoch, ToolCallDelta(name="get_weather", delta='{"ci'))
    d.pump()
    d.take()
    d.send(type="response.cancel")
    types = d.types()
    assert "response.function_call_arguments.done" not in types
    done = d.events[-1]["response"]
    assert done["status"] == "cancelled" and done["output"][0]["status"] == "incomplete"
    # an unfinished call is not shown to the model as made
    action = start(d)
    assert all(m.call is None for m in action.request.messages)


def test_tool_choice_none_announces_the_message_at_once():
    d = agent(tool_choice="none")
    start(d)
    assert "response.output_item.added" in d.types()


@pytest.mark.parametrize("tools, choice, param, code", [
    ([{"type": "function", "name": "f", "parameters": "not a schema"}], None, "session.tools.0.parameters", "invalid_value"),
    ([{"type": "function", "name": "f", "parameters": {"type": "string"}}], None, "session.tools.0.parameters.type", "invalid_value"),
    ([{"type": "function", "name": "f", "parameters": {"type": "object", "properties": {"a": {"type": "banana"}}}}],
     None, "session.tools.0.parameters.properties.a.type", "invalid_value"),
    ([{"type": "function", "name": "f", "parameters": {"type": "object", "properties": {"a": {"$ref": "http://evil/x"}}}}],
     None, "session.tools.0.parameters", "invalid_value"),
    ([{"type": "function", "name": "f", "parameters": {"type": "object", "description": "x" * 20_000}}],
     None, "session.tools.0.parameters", "invalid_value"),
    ([{"type": "function", "name": "no spaces allowed", "parameters": {"type": "object"}}], None, "session.tools.0.name", "invalid_value"),
    ([WEATHER, WEATHER], None, "session.tools.1.name", "invalid_value"),
    ([{"type": "mcp", "server_label": "x", "server_url": "http://127.0.0.1:1"}], None, "session.tools.0.server_url",
     "mcp_server_not_allowed"),
    ([{"type": "function", "description": "no name"}], None, "session.tools.0", "invalid_value"),
    ([WEATHER], {"type": "function", "name": "missing"}, "session.tool_choice.name", "invalid_value"),
    ([WEATHER] * 0 + [dict(WEATHER, name=f"f{i}") for i in range(129)], None, "session.tools", "invalid_value"),
    ([{"type": "function", "name": "f", "parameters": {"type": "object", "properties": {
        "s": {"type": "string", "minLength": 10**8}}}}], None, "session.tools.0.parameters.properties.s.minLength", "invalid_value"),
    ([{"type": "function", "name": "f", "parameters": {"type": "object", "properties": {"a": {"type": "array", "items": {
        "type": "string", "pattern": "^(a{1,100000})$"}}}}}], None, "session.tools.0.parameters.properties.a.items.pattern",
     "invalid_value"),
])
def test_bad_tools_are_refused_with_the_field_named(tools, choice, param, code):
    d = Driver(AGENT, has_vad=False)
    d.take()
    session = {"type": "realtime", "tools": tools}
    if choice is not None:
        session["tool_choice"] = choice
    d.send(type="session.update", session=session)
    errors = errors_of(d)
    assert [(e["code"], e["param"]) for e in errors] == [(code, param)], errors
    # the session goes on with its old settings
    d.send(type="session.update", session={"type": "realtime", "instructions": "ok"})
    assert d.events[-1]["session"]["tools"] == []


def test_required_may_come_before_the_tools_but_a_response_needs_one():
    # pipecat's order: its configured tool_choice on connect, its tools when the conversation starts
    d = Driver(AGENT, has_vad=False)
    d.take()
    d.send(type="session.update", session={"type": "realtime", "tool_choice": "required"})
    assert d.events[-1]["type"] == "session.updated" and d.events[-1]["session"]["tool_choice"] == "required"
    d.send(type="response.create")
    assert [(e["code"], e["param"]) for e in errors_of(d)] == [("invalid_value", "response.tool_choice")]
    # a turn detection response has nothing to call: it answers in words
    assert d.s.preview_request("hello").tool_choice == "none"
    d.send(type="session.update", session={"type": "realtime", "tools": [WEATHER]})
    assert d.events[-1]["session"]["tool_choice"] == "required"
    assert start(d).request.tool_choice == "required"


def test_a_model_that_cannot_call_functions_says_so():
    d = Driver(CASCADE, has_vad=False)
    d.take()
    d.send(type="session.update", session={"type": "realtime", "tools": [WEATHER]})
    assert [(e["code"], e["param"]) for e in errors_of(d)] == [("unsupported_feature", "session.tools")]
    d.send(type="response.create", response={"tools": [WEATHER]})
    assert [(e["code"], e["param"]) for e in errors_of(d)] == [("unsupported_feature", "response.tools")]
    d.send(type="conversation.item.create", item={"type": "function_call_output", "call_id": "c", "output": "x"})
    assert [(e["code"], e["param"]) for e in errors_of(d)] == [("unsupported_feature", "item.type")]


def test_hostile_function_items_get_precise_errors():
    d = agent()
    d.send(type="conversation.item.create", item={"type": "function_call_output", "call_id": "call_unknown", "output": "x"})
    assert [(e["code"], e["param"]) for e in errors_of(d)] == [("item_not_found", "item.call_id")]
    d.send(type="conversation.item.create", item={"type": "function_call", "name": "get_weather",
                                                 "arguments": "x" * 300_000, "call_id": "c1"})
    assert [(e["code"], e["param"]) for e in errors_of(d)] == [("invalid_value", "item.arguments")]
    d.send(type="conversation.item.create", item={"type": "function_call", "name": "get_weather",
                                                 "arguments": '{"city": "Rome"}', "call_id": "c1"})
    assert d.events[0]["item"]["type"] == "function_call"
    d.take()
    d.send(type="conversation.item.create", item={"type": "function_call_output", "call_id": "c1", "output": "y" * 300_000})
    assert [(e["code"], e["param"]) for e in errors_of(d)] == [("invalid_value", "item.output")]
    with pytest.raises(ProtocolError) as missing:  # the schema's own error, naming the field
        d.send(type="conversation.item.create", item={"type": "function_call_output", "output": "y"})
    assert (missing.value.code, missing.value.param) == ("invalid_event", "item.call_id")
    # a replayed call and its output both reach the model
    d.send(type="conversation.item.create", item={"type": "function_call_output", "call_id": "c1", "output": "rainy"})
    action = start(d)
    assert [(m.role, m.call.arguments if m.call else m.text) for m in action.request.messages] == [
        ("assistant", '{"city": "Rome"}'), ("tool", "rainy")]


def test_response_input_may_carry_function_items():
    d = agent()
    action = start(d, input=[
        {"type": "function_call", "name": "get_weather", "arguments": "{}", "call_id": "c9"},
        {"type": "function_call_output", "call_id": "c9", "output": "snow"}])
    assert [m.role for m in action.request.messages] == ["assistant", "tool"]


def test_tools_in_all_beyond_the_limit_are_refused():
    d = Driver(AGENT, has_vad=False)
    d.take()
    big = [{"type": "function", "name": f"f{i}", "description": "d" * 4000,
            "parameters": {"type": "object", "description": "x" * 15_000}} for i in range(8)]
    d.send(type="session.update", session={"type": "realtime", "tools": big})
    assert [(e["code"], e["param"]) for e in errors_of(d)] == [("invalid_value", "session.tools")]


def test_tools_and_function_items_survive_a_snapshot():
    d = agent(tool_choice={"type": "function", "name": "get_time"})
    action = start(d)
    call(d, action, "get_weather", '{"city": "Oslo"}')
    call_id = d.take()[-1]["response"]["output"][0]["call_id"]
    d.send(type="conversation.item.create", item={"type": "function_call_output", "call_id": call_id, "output": "cold"})
    snapshot = json.loads(json.dumps(d.s.snapshot()))  # what a store keeps is JSON
    restored = Driver(AGENT, has_vad=False)
    restored.s.restore(snapshot)
    assert restored.s.config.tools == d.s.config.tools and restored.s.config.tool_choice == d.s.config.tool_choice
    assert [i.to_dict() for i in restored.s.conversation] == [i.to_dict() for i in d.s.conversation]
    action = start(restored)
    assert [(m.role, m.call.arguments if m.call else m.text) for m in action.request.messages] == [
        ("assistant", '{"city": "Oslo"}'), ("tool", "cold")]


def test_a_response_that_ends_inside_a_call_is_incomplete():
    d = agent()
    action = start(d, max_output_tokens=3)
    d.s.on_response_call(action.response_id, action.epoch, ToolCallDelta(name="get_weather", delta='{"ci'))
    d.s.on_response_end(action.response_id, action.epoch)  # the thinker ran out of tokens
    d.pump()
    done = d.events[-1]["response"]
    assert (done["status"], done["status_details"]["reason"]) == ("incomplete", "max_output_tokens")
    assert done["output"][0]["status"] == "incomplete"
    assert "response.function_call_arguments.done" not in d.types()


def test_parallel_tool_calls_is_kept_reported_and_carried_per_response():
    d = agent()
    action = start(d)
    assert action.request.parallel_tool_calls is True  # the protocol's default
    d.s.on_response_end(action.response_id, action.epoch)
    d.pump()
    d.send(type="session.update", session={"type": "realtime", "parallel_tool_calls": False})
    assert d.events[-1]["session"]["parallel_tool_calls"] is False
    action = start(d)
    assert action.request.parallel_tool_calls is False
    d.s.on_response_end(action.response_id, action.epoch)
    d.pump()
    assert start(d, parallel_tool_calls=True).request.parallel_tool_calls is True  # per response


def test_several_calls_in_one_response_are_items_of_their_own():
    d = agent()
    action = start(d)
    for name, args in (("get_weather", '{"city": "Paris"}'), ("get_time", "{}")):
        d.s.on_response_call(action.response_id, action.epoch, ToolCallDelta(name=name))
        d.s.on_response_call(action.response_id, action.epoch, ToolCallDelta(name=name, done=True, arguments=args))
    d.s.on_response_end(action.response_id, action.epoch)
    d.pump()
    output = d.take()[-1]["response"]["output"]
    assert [(o["type"], o["name"], o["arguments"]) for o in output] == [
        ("function_call", "get_weather", '{"city": "Paris"}'), ("function_call", "get_time", "{}")]
    assert output[0]["call_id"] != output[1]["call_id"]


@pytest.mark.parametrize("value", ["maybe", 2, [True], {"a": 1}])
def test_a_parallel_tool_calls_that_is_not_a_boolean_is_refused_with_its_field(value):
    d = agent(parallel_tool_calls=False)
    with pytest.raises(ProtocolError) as refused:  # (the transport sends it as an error event)
        d.send(type="session.update", session={"type": "realtime", "parallel_tool_calls": value})
    assert (refused.value.code, refused.value.param) == ("invalid_event", "session.parallel_tool_calls")
    d.send(type="session.update", session={"type": "realtime", "parallel_tool_calls": None})  # null: unchanged
    assert d.events[-1]["session"]["parallel_tool_calls"] is False
