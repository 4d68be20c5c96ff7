"""``/v1/realtime`` over WebSocket: JSON text frames in both directions.

One reader (this handler) feeds the session mailbox; one writer task owns every send.
"""

from __future__ import annotations

import asyncio
import json
import logging

from starlette.websockets import WebSocket, WebSocketDisconnect, WebSocketState

from ..protocol.beta import to_beta
from ..session.manager import SessionLimitError, SessionManager, UnknownModelError
from ..session.runner import SessionRunner

log = logging.getLogger(__name__)

SEND_TIMEOUT_S = 30.0


async def realtime_websocket(websocket: WebSocket) -> None:
    manager: SessionManager = websocket.app.state.manager
    beta = "realtime=v1" in websocket.headers.get("openai-beta", "")
    subprotocols = websocket.scope.get("subprotocols") or []
    # Browsers cannot set headers; OpenAI's convention puts them in subprotocols.
    beta = beta or "openai-beta.realtime-v1" in subprotocols
    await websocket.accept(subprotocol="realtime" if "realtime" in subprotocols else None)
    try:
        runner = manager.open(websocket.query_params.get("model"))
    except (SessionLimitError, UnknownModelError) as exc:
        code = "session_limit_reached" if isinstance(exc, SessionLimitError) else "model_not_found"
        error = {"type": "error", "event_id": "event_reject", "error": {
            "type": "invalid_request_error", "code": code, "message": str(exc), "param": "model" if code == "model_not_found" else None, "event_id": None}}
        await websocket.send_text(json.dumps(error))
        await websocket.close(code=1013 if code == "session_limit_reached" else 1008, reason=code)
        return
    writer = asyncio.create_task(_writer(websocket, runner, beta))
    try:
        while True:
            message = await websocket.receive()
            if message["type"] == "websocket.disconnect":
                break
            raw = message.get("text")
            if raw is None:
                raw = message.get("bytes") or b""
            await runner.submit(raw)
            if runner.closed.is_set():
                break
    except WebSocketDisconnect:
        pass
    finally:
        await runner.close("client_disconnected")
        try:
            await asyncio.wait_for(writer, SEND_TIMEOUT_S)
        except (asyncio.TimeoutError, Exception):  # noqa: BLE001
            writer.cancel()
        if websocket.client_state is WebSocketState.CONNECTED:
            try:
                await websocket.close()
            except RuntimeError:
                pass


async def _writer(websocket: WebSocket, runner: SessionRunner, beta: bool) -> None:
    """The only task that sends on this connection."""
    try:
        while True:
            out = await runner.next_outgoing()
            if out is None:
                break
            event = to_beta(out.event) if beta else out.event
            if event is None:
                continue
            await asyncio.wait_for(websocket.send_text(json.dumps(event)), SEND_TIMEOUT_S)
            runner.mark_sent(out)
    except (WebSocketDisconnect, RuntimeError, asyncio.TimeoutError, ConnectionError):
        await runner.close("client_disconnected")
    if websocket.client_state is WebSocketState.CONNECTED:
        try:
            await websocket.close()
        except RuntimeError:
            pass
