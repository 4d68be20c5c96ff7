"""Shared test helpers (no fakes of real components: pure functions only)."""

from __future__ import annotations

import asyncio
import typing
from typing import Any

import pydantic
from openai.types.realtime import RealtimeServerEvent

# The SDK's union discriminates by "type" through its own metadata; dispatch by type here.
_ADAPTERS = {
    typing.get_args(model.model_fields["type"].annotation)[0]: pydantic.TypeAdapter(model)
    for model in typing.get_args(typing.get_args(RealtimeServerEvent)[0])
}

# Extension events (not in OpenAI's schema) are checked by hand.
EXTENSION_EVENTS = {"session.expiring", "session.resumed"}


def assert_valid_server_event(event: dict[str, Any]) -> None:
    """Every server event must validate against the official SDK's typed models."""
    if event["type"] in EXTENSION_EVENTS:
        return
    assert event["type"] in _ADAPTERS, f"unknown server event type {event['type']}"
    _ADAPTERS[event["type"]].validate_python(event)


async def raw_http(base: str, head: str, body: bytes = b"", timeout: float = 10.0) -> tuple[int, bytes]:
    """One request written by hand (what httpx refuses to send: a lying length, raw header bytes);
    returns the status and what followed the status line."""
    from urllib.parse import urlsplit

    url = urlsplit(base)
    reader, writer = await asyncio.open_connection(url.hostname, url.port)
    try:
        writer.write(head.encode("latin-1") + b"\r\n\r\n" + body)
        await writer.drain()
        status_line = await asyncio.wait_for(reader.readline(), timeout)
        rest = await asyncio.wait_for(reader.read(65536), timeout)
        return int(status_line.split()[1]), rest
    finally:
        writer.close()
