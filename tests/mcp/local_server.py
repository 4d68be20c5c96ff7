"""A real MCP server (the ``mcp`` package's, streamable HTTP) on a loopback port, in a thread."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager


#: how each call of the ``slow`` tool went ("started", then "cancelled" or "finished")
SLOW_CALLS: list[str] = []


def weather_server():  # noqa: ANN201 - the mcp package's server type
    from mcp.server.mcpserver import MCPServer
    from mcp.types import ToolAnnotations

    server = MCPServer("weather")

    @server.tool(description="The current weather in a city")
    def get_weather(city: str) -> str:
        return f"Sunny and 21 degrees in {city}"

    @server.tool(description="The local time in a city", annotations=ToolAnnotations(readOnlyHint=True))
    def get_time(city: str) -> str:
        return f"It is 10:30 in {city}"

    @server.tool(description="Always fails")
    def explode() -> str:
        raise RuntimeError("the tool broke")

    @server.tool(description="Answers after a few seconds")
    async def slow() -> str:
        import asyncio

        SLOW_CALLS.append("started")
        try:
            await asyncio.sleep(3)
        except asyncio.CancelledError:
            SLOW_CALLS.append("cancelled")
            raise
        SLOW_CALLS.append("finished")
        return "late"

    @server.tool(description="Answers with far too much text")
    def flood() -> str:
        return "x" * 300_000

    return server


@contextmanager
def running(server=None) -> Iterator[str]:  # noqa: ANN001
    """Serve on 127.0.0.1 and yield the endpoint URL (``http://127.0.0.1:PORT/mcp``)."""
    import uvicorn

    app = (server or weather_server()).streamable_http_app()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, log_level="warning", lifespan="on")
    web = uvicorn.Server(config)
    thread = threading.Thread(target=web.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not web.started:
        if time.monotonic() > deadline:
            raise RuntimeError("the MCP server did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        web.should_exit = True
        thread.join(10)
        sock.close()


def free_url() -> str:
    """A loopback URL where nothing listens."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    return f"http://127.0.0.1:{port}/mcp"
