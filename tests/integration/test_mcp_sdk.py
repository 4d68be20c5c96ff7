"""MCP tools end to end: the official ``openai`` SDK names a real MCP server (the ``mcp``
package's, on loopback) in its session; the server lists its tools, the embedded model calls
one, the server runs it and the model answers with the result, in audio."""

from __future__ import annotations

import asyncio
import json

import pytest

pytest.importorskip("mcp")

from realtime_omni.server_thread import ServerThread  # noqa: E402
from tests.integration.test_realtime_sdk import TIMEOUT, audio_of, client, collect_until_done, configure  # noqa: E402
from tests.mcp.local_server import running  # noqa: E402

pytestmark = pytest.mark.asyncio(loop_scope="session")


@pytest.fixture(scope="module")
def mcp_url():
    with running() as url:
        yield url


@pytest.fixture(scope="module")
def mcp_server(registry, mcp_url):
    with ServerThread(registry, mcp_allowed_urls=[mcp_url], mcp_timeout_s=10.0) as srv:
        yield srv


async def until(conn, kind: str) -> list:
    events = []
    while True:
        event = await asyncio.wait_for(conn.recv(), TIMEOUT)
        events.append(event)
        if event.type == kind:
            return events


async def test_the_model_calls_an_mcp_tool_and_answers_with_its_result(mcp_server, mcp_url):
    tool = {"type": "mcp", "server_label": "clock", "server_url": mcp_url, "require_approval": "never",
            "allowed_tools": ["get_time"], "authorization": "a-token"}
    async with client(mcp_server).realtime.connect(model="embedded") as conn:
        assert (await conn.recv()).type == "session.created"
        await conn.session.update(session={"type": "realtime", "max_output_tokens": 40, "tools": [tool],
                                           "audio": {"input": {"turn_detection": None}}})
        events = await until(conn, "mcp_list_tools.completed")
        listed = next(e.item for e in events if e.type == "conversation.item.done")
        assert listed.type == "mcp_list_tools" and [t.name for t in listed.tools] == ["get_time"]
        updated = next(e for e in events if e.type == "session.updated")
        assert updated.session.tools[0].server_label == "clock"
        await conn.conversation.item.create(item={"type": "message", "role": "user",
                                                  "content": [{"type": "input_text", "text": "What time is it in Oslo?"}]})
        await conn.response.create(response={"tool_choice": {"type": "mcp", "server_label": "clock", "name": "get_time"},
                                             "output_modalities": ["audio"]})
        first = await collect_until_done(conn)
        types = [e.type for e in first]
        assert "response.mcp_call_arguments.done" in types and "response.mcp_call.completed" in types, types
        done = first[-1].response
        call = next(item for item in done.output if item.type == "mcp_call")
        assert set(json.loads(call.arguments)) == {"city"}
        assert call.output.startswith("It is 10:30 in "), call
        answer = await collect_until_done(conn)  # the model goes on by itself
        ended = answer[-1].response
        assert ended.status == "completed" or ended.status_details.reason == "max_output_tokens", ended
        assert len(audio_of(answer)) > 0, "the answer is spoken"


async def test_an_mcp_server_the_operator_did_not_list_is_refused_and_the_session_goes_on(mcp_server, mcp_url):
    async with client(mcp_server).realtime.connect(model="embedded") as conn:
        assert (await conn.recv()).type == "session.created"
        await conn.session.update(session={"type": "realtime", "tools": [
            {"type": "mcp", "server_label": "x", "server_url": "http://169.254.169.254/latest"}]})
        error = next(e for e in await until(conn, "error") if e.type == "error").error
        assert (error.code, error.param) == ("mcp_server_not_allowed", "session.tools.0.server_url")
        await configure(conn, instructions="still here")


async def test_a_cancelled_response_stops_its_running_mcp_call(mcp_server, mcp_url):
    """``response.cancel`` while the MCP server runs a call: the response ends at once and the
    call is cancelled on the server too (it never finishes there)."""
    from tests.mcp.local_server import SLOW_CALLS

    SLOW_CALLS.clear()
    tool = {"type": "mcp", "server_label": "slowpoke", "server_url": mcp_url, "require_approval": "never",
            "allowed_tools": ["slow"]}
    async with client(mcp_server).realtime.connect(model="embedded") as conn:
        await conn.recv()
        await conn.session.update(session={"type": "realtime", "max_output_tokens": 40, "tools": [tool],
                                           "output_modalities": ["text"], "audio": {"input": {"turn_detection": None}}})
        await until(conn, "mcp_list_tools.completed")
        await conn.conversation.item.create(item={"type": "message", "role": "user",
                                                  "content": [{"type": "input_text", "text": "Take your time."}]})
        await conn.response.create(response={"tool_choice": {"type": "mcp", "server_label": "slowpoke", "name": "slow"}})
        await until(conn, "response.mcp_call.in_progress")
        for _ in range(100):  # the call has reached the server
            if SLOW_CALLS:
                break
            await asyncio.sleep(0.02)
        await conn.response.cancel()
        done = (await until(conn, "response.done"))[-1]
        assert done.response.status == "cancelled"
        await asyncio.sleep(4)  # longer than the tool takes
    assert SLOW_CALLS == ["started", "cancelled"]
