"""Listing and calling the tools of a remote MCP server (streamable HTTP), with the ``mcp`` package.

Each listing or call opens its own connection and closes it: a voice session calls a tool now
and then, and nothing is held open between turns. Every request has a deadline and follows no redirect to
another origin (the URL was checked against the operator's list: httpx follows none, and the
``mcp`` transport only 307/308 within the same origin); what comes back is bounded before it
reaches the session, and each HTTP reply is cut past :data:`MAX_REPLY_BYTES` as it streams in. Failures become :class:`McpFailure` with
the error object the Realtime protocol puts on an ``mcp_call`` item.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .servers import McpServer

#: what one tool call may return to the model (characters of text)
MAX_OUTPUT_CHARS = 64 * 1024
#: tools kept from one server's listing
MAX_LISTED_TOOLS = 128
#: bytes one HTTP reply of an MCP server may have: read as it streams in, cut past this (a server
#: that streams gigabytes is stopped at the limit, not at the deadline)
MAX_REPLY_BYTES = 4 * 1024 * 1024


class ReplyTooLarge(Exception):
    """An MCP server's reply passed :data:`MAX_REPLY_BYTES`."""


class McpFailure(Exception):
    """A listing or call that failed; ``error`` is the protocol's error object."""

    def __init__(self, error: dict[str, Any]) -> None:
        super().__init__(error.get("message", ""))
        self.error = error


@dataclass(frozen=True)
class ListedTool:
    name: str
    description: str
    input_schema: dict[str, Any]
    read_only: bool
    annotations: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "description": self.description, "input_schema": self.input_schema,
                "annotations": self.annotations}


@asynccontextmanager
async def _client(server: McpServer, timeout_s: float) -> AsyncIterator[Any]:
    import httpx2
    import mcp
    from mcp.client.streamable_http import streamable_http_client

    http = httpx2.AsyncClient(headers=server.headers, timeout=httpx2.Timeout(timeout_s), follow_redirects=False,
                              transport=_capped_transport(httpx2.AsyncHTTPTransport(), MAX_REPLY_BYTES))
    async with http, mcp.Client(streamable_http_client(server.url, http_client=http),
                                read_timeout_seconds=timeout_s) as client:
        yield client


def _capped_transport(inner: Any, limit: int) -> Any:
    """``inner`` with every response body counted as it streams and cut past ``limit`` bytes."""
    import httpx2

    class CappedStream(httpx2.AsyncByteStream):
        def __init__(self, stream: Any) -> None:
            self.stream, self.seen = stream, 0

        async def __aiter__(self) -> AsyncIterator[bytes]:
            async for chunk in self.stream:
                self.seen += len(chunk)
                if self.seen > limit:
                    raise ReplyTooLarge(f"the MCP server's reply passed {limit} bytes")
                yield chunk

        async def aclose(self) -> None:
            await self.stream.aclose()

    class CappedTransport(httpx2.AsyncBaseTransport):
        async def handle_async_request(self, request: Any) -> Any:
            response = await inner.handle_async_request(request)
            return httpx2.Response(response.status_code, headers=response.headers, extensions=response.extensions,
                                   stream=CappedStream(response.stream))

        async def aclose(self) -> None:
            await inner.aclose()

    return CappedTransport()


def _reraise_cancel(exc: BaseException) -> None:
    """A cancellation wrapped in a task group's exception group is still a cancellation."""
    if isinstance(exc, BaseExceptionGroup):
        cancelled, _rest = exc.split(asyncio.CancelledError)
        if cancelled is not None:
            raise asyncio.CancelledError from exc


#: annotations kept from a listed tool (hints only: a title or other text is not echoed)
_HINTS = ("readOnlyHint", "destructiveHint", "idempotentHint", "openWorldHint")


def _failure(exc: BaseException) -> McpFailure:
    """Whatever went wrong, as the protocol's error object (an exception group: its first)."""
    import httpx2
    import mcp

    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    match exc:
        case McpFailure():
            return exc
        case ReplyTooLarge():
            return McpFailure({"type": "http_error", "code": 502, "message": str(exc)})
        case httpx2.HTTPStatusError():
            return McpFailure({"type": "http_error", "code": exc.response.status_code,
                               "message": f"the MCP server answered HTTP {exc.response.status_code}"})
        case mcp.MCPError():
            return McpFailure({"type": "protocol_error", "code": int(exc.error.code),
                               "message": str(exc.error.message)[:500]})
        case TimeoutError():
            return McpFailure({"type": "http_error", "code": 504, "message": "the MCP server did not answer in time"})
    return McpFailure({"type": "http_error", "code": 502,
                       "message": f"the MCP server could not be reached ({type(exc).__name__})"})


async def list_tools(server: McpServer, timeout_s: float) -> list[ListedTool]:
    """The server's tools (all pages, at most :data:`MAX_LISTED_TOOLS`)."""
    try:
        async with asyncio.timeout(timeout_s):
            tools: list[ListedTool] = []
            async with _client(server, timeout_s) as client:
                cursor = None
                while len(tools) < MAX_LISTED_TOOLS:
                    page = await client.list_tools(cursor=cursor)
                    for tool in page.tools:
                        given = tool.annotations.model_dump(by_alias=True, exclude_none=True) if tool.annotations else {}
                        annotations = {k: bool(given[k]) for k in _HINTS if k in given} or None
                        read_only = bool((annotations or {}).get("readOnlyHint"))
                        tools.append(ListedTool(tool.name, tool.description or "", dict(tool.input_schema or {}),
                                                read_only, annotations))
                    cursor = page.next_cursor
                    if not cursor:
                        break
            return tools[:MAX_LISTED_TOOLS]
    except (Exception, BaseExceptionGroup) as exc:  # noqa: BLE001 - reported on the item, never raised past here
        _reraise_cancel(exc)
        raise _failure(exc) from None


async def call_tool(server: McpServer, name: str, arguments: dict[str, Any], timeout_s: float) -> str:
    """The tool's result as text (its text parts, or its structured content as JSON)."""
    try:
        async with asyncio.timeout(timeout_s):
            async with _client(server, timeout_s) as client:
                result = await client.call_tool(name, arguments)
    except (Exception, BaseExceptionGroup) as exc:  # noqa: BLE001
        _reraise_cancel(exc)
        raise _failure(exc) from None
    texts = [block.text for block in getattr(result, "content", None) or () if getattr(block, "type", "") == "text"]
    output = "\n".join(texts)
    structured = getattr(result, "structured_content", None)
    if not output and structured is not None:
        output = json.dumps(structured)
    if getattr(result, "is_error", False):
        raise McpFailure({"type": "tool_execution_error", "message": output[:2000] or "the tool failed"})
    return output[:MAX_OUTPUT_CHARS]
