"""MCP tools in the sans-I/O core, against a real MCP server on loopback: listing, calls made
by the model, approvals, failures, and hostile settings and items."""

import asyncio
import json

import pytest

pytest.importorskip("mcp")

from realtime_omni.engines.base import ToolCallDelta  # noqa: E402
from realtime_omni.mcp.client import McpFailure, call_tool, list_tools  # noqa: E402
from realtime_omni.protocol import ProtocolError  # noqa: E402
from realtime_omni.session import actions as act  # noqa: E402
from tests.mcp.local_server import free_url, running  # noqa: E402
from tests.session.test_core import Driver  # noqa: E402
from tests.session.test_tools import AGENT, WEATHER, errors_of, start  # noqa: E402


@pytest.fixture(scope="module")
def url():
    with running() as endpoint:
        yield endpoint


def perform(d: Driver) -> None:
    """Run the MCP actions the core asked for, for real, and feed their results back."""
    while True:
        todo = [a for a in d.actions if isinstance(a, act.ListMcpTools | act.CallMcpTool)]
        d.actions = [a for a in d.actions if a not in todo]
        d.performed = [*getattr(d, "performed", []), *todo]
        if not todo:
            return
        for action in todo:
            match action:
                case act.ListMcpTools(item_id, server, timeout):
                    try:
                        d.s.on_mcp_tools_listed(item_id, tuple(asyncio.run(list_tools(server, timeout))), None)
                    except McpFailure as exc:
                        d.s.on_mcp_tools_listed(item_id, (), exc.error)
                case act.CallMcpTool(rid, epoch, item_id, server, tool, arguments, timeout):
                    try:
                        output, error = asyncio.run(call_tool(server, tool, json.loads(arguments), timeout)), None
                    except McpFailure as exc:
                        output, error = "", exc.error
                    d.s.on_mcp_call_done(rid, epoch, item_id, output, error)
            d.pump()


def session(url: str, allowed: tuple[str, ...] | None = None, functions: tuple[dict, ...] = (), **tool) -> Driver:
    d = Driver(AGENT, has_vad=False)
    d.s.config.mcp_urls = (url,) if allowed is None else allowed
    d.take()
    server = {"type": "mcp", "server_label": "weather", "server_url": url, **tool}
    d.send(type="session.update", session={"type": "realtime", "tools": [*functions, server]})
    return d


def model_calls(d: Driver, action: act.StartResponse, name: str, arguments: str, end: bool = True) -> None:
    rid, epoch = action.response_id, action.epoch
    d.s.on_response_call(rid, epoch, ToolCallDelta(name=name))
    d.s.on_response_call(rid, epoch, ToolCallDelta(name=name, delta=arguments))
    d.s.on_response_call(rid, epoch, ToolCallDelta(name=name, done=True, arguments=arguments))
    if end:
        d.s.on_response_end(rid, epoch)
    d.pump()


def test_a_server_is_listed_and_its_tools_offered(url):
    d = session(url, functions=(WEATHER,), authorization="secret-token", headers={"X-Tenant": "a"})
    events = d.take()
    assert [e["type"] for e in events] == ["session.updated", "conversation.item.added", "mcp_list_tools.in_progress"]
    reported = events[0]["session"]["tools"][1]
    assert reported["server_label"] == "weather" and "authorization" not in reported and "headers" not in reported
    perform(d)
    events = d.take()
    # the server's get_weather has the name of the session's own function: left out, and said so
    assert [e["type"] for e in events] == ["conversation.item.done", "mcp_list_tools.completed", "error"]
    assert "get_weather" in events[2]["error"]["message"]
    listed = events[0]["item"]
    assert listed["type"] == "mcp_list_tools" and [t["name"] for t in listed["tools"]] == ["get_time", "explode", "slow",
                                                                                            "flood"]
    action = start(d)
    assert [t.name for t in action.request.tools] == ["get_weather", "get_time", "explode", "slow", "flood"]
    assert action.request.tools[0].description == WEATHER["description"]  # the function, not the server's tool


def test_allowed_tools_filter_what_the_model_sees(url):
    d = session(url, allowed_tools={"read_only": True})
    perform(d)
    assert [t.name for t in start(d).request.tools] == ["get_time"]  # the one read-only tool


def test_a_call_runs_on_the_server_and_the_reply_goes_on_with_its_result(url):
    d = session(url, require_approval="never", allowed_tools=["get_time"])
    perform(d)
    d.take()
    action = start(d)
    model_calls(d, action, "get_time", '{"city": "Oslo"}')
    types = d.types()
    assert types[-4:] == ["conversation.item.added", "response.mcp_call_arguments.delta",
                          "response.mcp_call_arguments.done", "response.mcp_call.in_progress"]
    assert "response.done" not in types  # it ends once the call has returned
    d.take()
    perform(d)
    events = d.take()
    types = [e["type"] for e in events]
    assert types[:4] == ["response.mcp_call.completed", "response.output_item.done", "conversation.item.done",
                         "response.done"]
    done = events[3]["response"]
    assert done["status"] == "completed" and done["output"][0]["output"] == "It is 10:30 in Oslo"
    assert "response.created" in types  # the model answers with the result, by itself
    follow = [a for a in d.actions if isinstance(a, act.StartResponse)][-1]
    call, result = follow.request.messages[-2:]
    assert call.call.name == "get_time" and result.role == "tool" and result.text == "It is 10:30 in Oslo"


def test_a_tool_that_needs_approval_runs_once_approved(url):
    d = session(url)  # require_approval: "always" by default
    perform(d)
    d.take()
    model_calls(d, start(d), "get_weather", '{"city": "Lima"}')
    events = d.take()
    request = next(e["item"] for e in events if e["type"] == "response.output_item.added")
    assert request["type"] == "mcp_approval_request" and json.loads(request["arguments"]) == {"city": "Lima"}
    assert events[-1]["type"] == "response.done" and not [a for a in d.actions if isinstance(a, act.CallMcpTool)]
    d.send(type="conversation.item.create", item={"type": "mcp_approval_response", "id": f"apr_{len(d.events)}", "approval_request_id": request["id"],
                                                  "approve": True})
    before = len([a for a in d.actions if isinstance(a, act.StartResponse)])
    d.send(type="response.create")
    assert len([a for a in d.actions if isinstance(a, act.StartResponse)]) == before  # the call runs first
    perform(d)
    events = d.take()
    call = next(e["item"] for e in events if e["type"] == "response.output_item.done")
    assert call["type"] == "mcp_call" and call["approval_request_id"] == request["id"]
    assert call["output"] == "Sunny and 21 degrees in Lima"
    answer = [a for a in d.actions if isinstance(a, act.StartResponse)][-1]
    assert answer.request.messages[-1].text == "Sunny and 21 degrees in Lima"
    # answered once only; a response after it runs nothing again
    d.send(type="conversation.item.create", item={"type": "mcp_approval_response", "id": f"apr_{len(d.events)}", "approval_request_id": request["id"],
                                                  "approve": True})
    assert [e["code"] for e in errors_of(d)] == ["invalid_value"]


def test_a_refused_approval_runs_nothing(url):
    d = session(url)
    perform(d)
    model_calls(d, start(d), "get_weather", '{"city": "Rome"}')
    request = next(e["item"] for e in d.take() if e["type"] == "response.output_item.added")
    d.send(type="conversation.item.create", item={"type": "mcp_approval_response", "id": f"apr_{len(d.events)}", "approval_request_id": request["id"],
                                                  "approve": False, "reason": "not now"})
    d.send(type="response.create")
    assert not [a for a in d.actions if isinstance(a, act.CallMcpTool)]
    assert isinstance(d.actions[-1], act.StartResponse)
    call, refusal = d.actions[-1].request.messages[-2:]  # the model reads that it was declined, and why
    assert call.call.name == "get_weather" and refusal.text == "the user declined this call: not now"


def test_failures_are_reported_on_the_item_and_the_session_goes_on(url):
    d = session(url, require_approval="never")
    perform(d)
    d.take()
    model_calls(d, start(d), "explode", "{}")
    perform(d)
    events = d.take()
    failed = next(e["item"] for e in events if e["type"] == "response.output_item.done")
    assert "response.mcp_call.failed" in [e["type"] for e in events]
    assert failed["error"]["type"] == "tool_execution_error" and failed["output"] is None
    # a server that is not there: the listing fails with an error event, nothing is offered
    gone = free_url()
    d = session(gone)
    perform(d)
    events = d.take()
    assert "mcp_list_tools.failed" in [e["type"] for e in events]
    assert [e["error"]["code"] for e in events if e["type"] == "error"] == ["mcp_list_tools_failed"]
    assert [t.name for t in start(d).request.tools] == []


def test_a_cancel_while_a_call_runs_closes_it_and_does_not_go_on(url):
    d = session(url, require_approval="never")
    perform(d)
    d.take()
    action = start(d)
    model_calls(d, action, "get_time", '{"city": "Oslo"}', end=False)
    d.send(type="response.cancel")
    events = d.take()
    failed = next(e["item"] for e in events if e["type"] == "response.output_item.done")
    assert failed["error"]["message"].startswith("the response ended")
    perform(d)  # the result comes back late: dropped
    assert "response.created" not in d.types()


@pytest.mark.parametrize("tool, param, code", [
    ({"server_url": "http://10.0.0.1/mcp"}, "session.tools.1.server_url", "mcp_server_not_allowed"),
    ({"server_url": "file:///etc/passwd"}, "session.tools.1.server_url", "invalid_value"),
    ({"server_url": "http://user:pw@127.0.0.1/mcp"}, "session.tools.1.server_url", "invalid_value"),
    ({"server_label": "has space"}, "session.tools.1.server_label", "invalid_value"),
    ({"connector_id": "connector_gmail"}, "session.tools.1.connector_id", "unsupported_feature"),
    ({"headers": {"X-A": "b\r\nInjected: 1"}}, "session.tools.1.headers.X-A", "invalid_value"),
    ({"headers": {f"h{i}": "v" for i in range(40)}}, "session.tools.1.headers", "invalid_value"),
    # what the SDK's schema refuses is refused when the event is read (the runner sends the error)
    ({"require_approval": "sometimes"}, None, "invalid_event"),
    ({"allowed_tools": {"tool_names": "get_time"}}, None, "invalid_event"),
    ({"allowed_tools": [f"t{i}" for i in range(200)]}, "session.tools.1.allowed_tools", "invalid_value"),
    ({"server_description": "x" * 5000}, "session.tools.1.server_description", "invalid_value"),
])
def test_hostile_mcp_settings_are_refused_with_the_field_named(url, tool, param, code):
    try:
        d = session(url, functions=(WEATHER,), **tool)
        got = [(e["code"], e["param"]) for e in errors_of(d)]
    except ProtocolError as exc:
        d, got = None, [(exc.code, None)]
    assert got == [(code, param)]
    if d is None:
        return
    assert not [a for a in d.actions if isinstance(a, act.ListMcpTools)]


def test_hostile_mcp_items_and_choices(url):
    d = session(url)
    perform(d)
    d.take()
    d.send(type="conversation.item.create", item={"type": "mcp_approval_response", "id": f"apr_{len(d.events)}", "approval_request_id": "nope",
                                                  "approve": True})
    d.send(type="conversation.item.create", item={"type": "mcp_call", "id": "x", "server_label": "weather",
                                                  "name": "get_time", "arguments": "{}"})
    d.send(type="response.create", response={"tool_choice": {"type": "mcp", "server_label": "other"}})
    d.send(type="response.create", response={"tool_choice": {"type": "mcp", "server_label": "weather", "name": "nope"}})
    d.send(type="response.create", response={"tools": [{"type": "mcp", "server_label": "b", "server_url": url}]})
    codes = [e["code"] for e in errors_of(d)]
    assert codes == ["item_not_found", "unsupported_feature", "invalid_value", "invalid_value", "unsupported_feature"]
    # two servers of one label, a server URL the operator did not list
    d.send(type="session.update", session={"type": "realtime", "tools": [
        {"type": "mcp", "server_label": "a", "server_url": url}, {"type": "mcp", "server_label": "a", "server_url": url}]})
    assert [e["code"] for e in errors_of(d)] == ["invalid_value"]


def test_a_named_mcp_choice_narrows_the_tools(url):
    d = session(url, require_approval="never")
    perform(d)
    action = start(d, tool_choice={"type": "mcp", "server_label": "weather", "name": "get_time"})
    assert [t.name for t in action.request.tools] == ["get_weather", "get_time", "explode", "slow", "flood"]
    assert (action.request.tool_choice, action.request.tool_name) == ("required", "get_time")
    d.s.on_response_end(action.response_id, action.epoch)
    d.pump()
    d = session(url, functions=(WEATHER,), require_approval="never")
    perform(d)
    action = start(d, tool_choice={"type": "mcp", "server_label": "weather"})
    assert [t.name for t in action.request.tools] == ["get_time", "explode", "slow", "flood"]  # the server's only
    assert (action.request.tool_choice, action.request.tool_name) == ("required", None)


def test_mcp_is_off_unless_the_operator_lists_the_server(url):
    d = session(url, allowed=())
    assert [e["code"] for e in errors_of(d)] == ["mcp_server_not_allowed"]
    d = session(url + "x", allowed=(url,))  # a prefix must end at a path boundary
    assert [e["code"] for e in errors_of(d)] == ["mcp_server_not_allowed"]


def test_a_slow_tool_times_out_and_a_flood_is_cut(url):
    d = session(url, require_approval="never")
    d.s.mcp_timeout_s = 0.5
    perform(d)
    d.take()
    model_calls(d, start(d), "slow", "{}")
    perform(d)
    failed = next(e["item"] for e in d.take() if e["type"] == "response.output_item.done")
    assert failed["error"] == {"type": "http_error", "code": 504, "message": "the MCP server did not answer in time"}
    d.s.mcp_timeout_s = 10.0
    action = [a for a in d.actions if isinstance(a, act.StartResponse)][-1]  # the reply that went on
    d.s.on_response_end(action.response_id, action.epoch)
    d.pump()
    d.take()
    model_calls(d, start(d), "flood", "{}")
    perform(d)
    done = next(e["item"] for e in d.take() if e["type"] == "response.output_item.done")
    assert done["error"] is None and len(done["output"]) == 64 * 1024


def test_a_stored_session_keeps_no_token_and_lists_again(url):
    d = session(url, authorization="secret-token", headers={"X-Key": "also-secret"})
    perform(d)
    snapshot = json.dumps(d.s.snapshot())
    assert "secret" not in snapshot and url in snapshot
    again = Driver(AGENT, has_vad=False)
    again.s.config.mcp_urls = (url,)
    again.s.restore(json.loads(snapshot))
    again.pump()
    assert [e["type"] for e in again.take()][-2:] == ["conversation.item.added", "mcp_list_tools.in_progress"]
    perform(again)
    assert again.types()[-1] == "mcp_list_tools.completed"
    assert [t.name for t in start(again).request.tools] == ["get_weather", "get_time", "explode", "slow", "flood"]


def test_an_approved_call_runs_once_even_outside_the_conversation(url):
    d = session(url)
    perform(d)
    model_calls(d, start(d), "get_weather", '{"city": "Kyiv"}')
    request = next(e["item"] for e in d.take() if e["type"] == "response.output_item.added")
    d.send(type="conversation.item.create", item={"type": "mcp_approval_response", "id": "apr_1",
                                                  "approval_request_id": request["id"], "approve": True})
    d.send(type="response.create", response={"conversation": "none"})  # out of band: its call item stays out
    perform(d)
    ran = [a for a in d.performed if isinstance(a, act.CallMcpTool)]
    assert len(ran) == 1
    action = [a for a in d.actions if isinstance(a, act.StartResponse)][-1]
    d.s.on_response_end(action.response_id, action.epoch)
    d.pump()
    assert "response.created" not in [e["type"] for e in d.take()[-3:]]  # out of band: no reply of its own after
    d.send(type="response.create")
    perform(d)
    assert len([a for a in d.performed if isinstance(a, act.CallMcpTool)]) == 1  # not again


def test_a_hostile_listing_is_bounded_and_the_session_goes_on(url):
    from realtime_omni.mcp.client import ListedTool

    d = session(url, require_approval="never")
    listing = next(a for a in d.actions if isinstance(a, act.ListMcpTools))
    d.actions.clear()
    deep: dict = {"type": "object"}
    for _ in range(200):  # past the schema checker's recursion
        deep = {"type": "object", "properties": {"a": deep}}
    tools = (ListedTool("deep", "", deep, False), ListedTool("bad name!", "", {"type": "object"}, False),
             ListedTool("big", "x" * 4000, {"type": "object", "description": "y" * 15000}, False),
             *(ListedTool(f"t{i}", "z" * 4000, {"type": "object"}, False) for i in range(40)),
             ListedTool("ok", "fine", {"type": "object"}, True))
    d.s.on_mcp_tools_listed(listing.item_id, tools, None)
    d.pump()
    errors = [e["error"] for e in d.take() if e["type"] == "error"]
    assert len(errors) == 1 and "'deep'" in errors[0]["message"] and "'bad name!'" in errors[0]["message"]
    offered = [t.name for t in start(d).request.tools]
    assert "deep" not in offered and "bad name!" not in offered and "big" in offered
    # past the budget of all tools together (128 KiB) the big ones are left out, and said so; a
    # small one after them still fits
    assert "would pass" in errors[0]["message"] and "ok" in offered
    assert 20 < len(offered) < 40


def test_a_function_declared_later_keeps_its_name(url):
    d = session(url, require_approval="never", allowed_tools=["get_time"])
    perform(d)
    clock = {"type": "function", "name": "get_time", "description": "the client's own clock",
             "parameters": {"type": "object"}}
    d.send(type="session.update", session={"type": "realtime", "tools": [clock, {"type": "mcp", "server_label": "weather",
            "server_url": url, "require_approval": "never", "allowed_tools": ["get_time"]}]})
    perform(d)
    action = start(d, tools=[clock])
    assert [t.description for t in action.request.tools] == ["the client's own clock"]
    model_calls(d, action, "get_time", "{}")
    assert "response.function_call_arguments.done" in d.types()
    assert not [a for a in d.actions if isinstance(a, act.CallMcpTool)]


@pytest.mark.parametrize("tool", [
    {"headers": {"Host": "internal.example"}}, {"headers": {"Proxy-Authorization": "x"}},
    {"headers": {"Mcp-Session-Id": "x"}}, {"server_url_suffix": "/../admin"}, {"server_url_suffix": "/%2e%2e/admin"},
])
def test_headers_and_paths_that_would_leave_the_allowed_server_are_refused(url, tool):
    tool = dict(tool)
    if "server_url_suffix" in tool:
        tool["server_url"] = url + tool.pop("server_url_suffix")
    d = session(url, functions=(WEATHER,), **tool)
    codes = [e["code"] for e in errors_of(d)]
    assert codes in (["invalid_value"], ["mcp_server_not_allowed"])
    assert not [a for a in d.actions if isinstance(a, act.ListMcpTools)]


def test_a_reply_larger_than_the_cap_is_cut_while_it_streams(url, monkeypatch):
    """An MCP server's reply is counted as it arrives and stopped past the byte cap, with a
    coded error, not read whole until the deadline (here the 300 kB flood against a 100 kB cap)."""
    import time

    from realtime_omni.mcp import client

    from realtime_omni.mcp.servers import McpServer

    monkeypatch.setattr(client, "MAX_REPLY_BYTES", 100_000)
    server = McpServer(label="local", url=url)
    began = time.monotonic()
    with pytest.raises(McpFailure) as info:
        asyncio.run(call_tool(server, "flood", {}, 10.0))
    assert time.monotonic() - began < 5.0
    assert info.value.error["code"] == 502 and "100000 bytes" in info.value.error["message"]
    assert asyncio.run(call_tool(server, "get_time", {"city": "Kyiv"}, 10.0))  # the next call is unaffected
