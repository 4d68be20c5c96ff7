"""A voice agent whose tools live on an MCP server, over the Realtime API with the ``openai`` SDK.

The server lists the MCP server's tools, runs the call the model makes and the model answers
with the result; the client only names the server. Three shells (``pip install -e '.[embedded,mcp]'``):

    python examples/mcp_tools.py serve-tools                  # a demo MCP server on 127.0.0.1:8931
    REALTIME_OMNI_MCP_ALLOWED_URLS='["http://127.0.0.1:8931/mcp"]' realtime-omni serve
    python examples/mcp_tools.py ask "What time is it in Oslo?"

The server contacts only the MCP servers its operator lists (``tools.mcp_allowed_urls``). The
embedded model (SmolLM2-135M) is too small to decide to call a tool on its own, so the call is
asked for by name (``tool_choice``); ``--approve`` shows the approval round trip instead of
``require_approval: "never"``.
"""

from __future__ import annotations

import argparse
import asyncio
import os

MCP_URL = "http://127.0.0.1:8931/mcp"


def serve_tools(port: int) -> None:
    """A demo MCP server (the ``mcp`` package's) with one tool."""
    import uvicorn
    from mcp.server.mcpserver import MCPServer
    from mcp.types import ToolAnnotations

    server = MCPServer("clock")

    @server.tool(description="The local time in a city", annotations=ToolAnnotations(readOnlyHint=True))
    def get_time(city: str) -> str:
        return f"It is 10:30 in {city}"  # a real server looks it up

    uvicorn.run(server.streamable_http_app(), host="127.0.0.1", port=port, log_level="warning")


async def until(conn, kind: str) -> list:  # type: ignore[no-untyped-def]
    events = []
    async for event in conn:
        events.append(event)
        if event.type == "error":
            print("error:", event.error.code, event.error.message)
        if event.type == kind:
            return events
    return events


def transcript(events: list) -> str:
    return "".join(e.delta for e in events if e.type == "response.output_audio_transcript.delta")


async def ask(question: str, url: str, mcp_url: str, approve: bool) -> None:
    from openai import AsyncOpenAI

    ws_url = url.replace("http", "ws", 1)
    client = AsyncOpenAI(api_key=os.environ.get("OPENAI_API_KEY", "local"), base_url=f"{url}/v1",
                         websocket_base_url=f"{ws_url}/v1")
    tool = {"type": "mcp", "server_label": "clock", "server_url": mcp_url,
            "require_approval": "always" if approve else "never"}
    async with client.realtime.connect(model="gpt-realtime") as conn:
        await until(conn, "session.created")
        await conn.session.update(session={"type": "realtime", "tools": [tool], "max_output_tokens": 60,
                                           "audio": {"input": {"turn_detection": None}}})
        listed = await until(conn, "mcp_list_tools.completed")
        if listed[-1].type != "mcp_list_tools.completed":
            raise SystemExit("the MCP server's tools could not be listed")
        names = [t.name for e in listed if e.type == "conversation.item.done" for t in e.item.tools]
        print("tools:", ", ".join(names))
        await conn.conversation.item.create(item={"type": "message", "role": "user",
                                                  "content": [{"type": "input_text", "text": question}]})
        choice = {"type": "mcp", "server_label": "clock", "name": "get_time"}
        await conn.response.create(response={"tool_choice": choice})
        first = await until(conn, "response.done")
        request = next((item for item in first[-1].response.output if item.type == "mcp_approval_request"), None)
        if request is not None:
            print(f"approval asked: {request.name}({request.arguments}): approved")
            await conn.conversation.item.create(item={"type": "mcp_approval_response", "id": f"ok_{request.id}",
                                                      "approval_request_id": request.id, "approve": True})
            await conn.response.create()
            answer = await until(conn, "response.done")
            calls = answer[-1].response.output
        else:
            calls = first[-1].response.output
            answer = await until(conn, "response.done")  # the model goes on by itself with the result
        for item in calls:
            if item.type == "mcp_call":
                print(f"called {item.name}({item.arguments}) -> {item.output or item.error}")
        print("answer:", transcript(answer).strip() or "(no transcript)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    tools = sub.add_parser("serve-tools", help="run the demo MCP server")
    tools.add_argument("--port", type=int, default=8931)
    client = sub.add_parser("ask", help="ask a question that needs the MCP tool")
    client.add_argument("question", nargs="?", default="What time is it in Oslo?")
    client.add_argument("--url", default="http://127.0.0.1:8000", help="the realtime-omni server")
    client.add_argument("--mcp-url", default=MCP_URL)
    client.add_argument("--approve", action="store_true", help="require approval, and give it")
    args = parser.parse_args()
    if args.command == "serve-tools":
        serve_tools(args.port)
    else:
        asyncio.run(ask(args.question, args.url, args.mcp_url, args.approve))


if __name__ == "__main__":
    main()
