"""``/v1/realtime`` over WebSocket: JSON text frames in both directions.

One reader (this handler) feeds the session mailbox; one writer task owns every send. A clean
close (code 1000) ends the session; a dropped connection leaves it resumable for the grace
period (``?resume_token=...&last_sequence_number=N`` on a new connection).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

from fastapi import APIRouter
from starlette.websockets import WebSocket, WebSocketDisconnect, WebSocketState

from ..http.access import Opener
from ..protocol.beta import beta_followers, to_beta
from ..protocol.errors import ErrorCode
from ..protocol.server_events import event_text
from ..session.core import Outgoing
from ..session.manager import ResumeError, SessionLimitError, SessionManager, UnknownModelError
from ..session.runner import SessionRunner

log = logging.getLogger(__name__)

SEND_TIMEOUT_S = 30.0
#: how long a closing session's last events and close frame may take to leave
CLOSE_FLUSH_S = 2.0
NORMAL_CLOSURE = 1000


def _error(code: ErrorCode, message: str, param: str | None = None) -> dict[str, Any]:
    return {"type": "error", "event_id": f"event_{code}", "error": {
        "type": "invalid_request_error", "code": code, "message": message, "param": param, "event_id": None}}


router = APIRouter()


@router.websocket("/v1/realtime")
async def realtime_websocket(websocket: WebSocket, admission: Opener) -> None:
    """A refused opener (key, client secret, Origin) gets an HTTP 401/403 with a JSON error body
    instead of the upgrade: the dependency raises, the app's handler answers the denial."""
    manager: SessionManager = websocket.app.state.manager
    bound_session, owner = admission.session, admission.owner
    subprotocols = websocket.scope.get("subprotocols") or []
    # Browsers cannot set headers; OpenAI's convention puts them in subprotocols.
    beta = "realtime=v1" in websocket.headers.get("openai-beta", "") or "openai-beta.realtime-v1" in subprotocols
    await websocket.accept(subprotocol="realtime" if "realtime" in subprotocols else None)

    query = websocket.query_params
    token = query.get("resume_token") or websocket.headers.get("x-resume-token")
    replay: list[Outgoing] = []
    try:
        if token:
            last_seq = int(query.get("last_sequence_number") or websocket.headers.get("x-last-sequence-number") or 0)
            runner, replay, gap = await manager.resume(token, last_seq, owner, transport="websocket")
        else:
            # ?intent=transcription (OpenAI's URL for transcription sessions) opens one directly
            kind = "transcription" if query.get("intent") == "transcription" else "realtime"
            runner = manager.open(query.get("model"), owner=owner, transport="websocket", session_type=kind)
    except (SessionLimitError, UnknownModelError, ResumeError, ValueError) as exc:
        code = {SessionLimitError: ErrorCode.SESSION_LIMIT_REACHED, UnknownModelError: ErrorCode.MODEL_NOT_FOUND,
                ResumeError: ErrorCode.RESUME_TOKEN_INVALID}.get(type(exc), ErrorCode.INVALID_VALUE)
        await websocket.send_text(json.dumps(_error(code, str(exc), "model" if code is ErrorCode.MODEL_NOT_FOUND else None)))
        await websocket.close(code=1013 if code is ErrorCode.SESSION_LIMIT_REACHED else 1008, reason=code)
        return
    runner.journal.keep_audio = True  # this client plays the audio: a resume replays what it missed
    # from here on the session is this connection's: a later resume may take it over (kick), and
    # whatever fails (the client gone before session.resumed reached it) detaches or closes it
    kicked = asyncio.Event()
    runner.kick = kicked.set
    draining: asyncio.Event = getattr(websocket.app.state, "draining", None) or asyncio.Event()
    tasks: tuple[asyncio.Task, ...] = ()
    clean = False
    try:
        if token:
            await websocket.send_text(json.dumps(runner.resumed_event(len(replay), gap)))
        else:
            await manager.stored(runner)  # before session.created hands out the resume token
            if bound_session:
                await runner.submit(json.dumps({"type": "session.update", "session": {"type": "realtime", **bound_session}}))
        sending = SendClock()
        writer = asyncio.create_task(_writer(websocket, runner, beta, replay, sending))
        reader = asyncio.create_task(_reader(websocket, runner))
        stuck = asyncio.create_task(_cancel_when_stuck(writer, sending))
        kick_wait = asyncio.create_task(kicked.wait())
        ended = asyncio.create_task(runner.closed.wait())
        going_down = asyncio.create_task(draining.wait())
        tasks = (reader, writer, stuck, kick_wait, ended, going_down)
        # Whichever comes first: the client leaves (reader), the peer stops taking bytes or is
        # gone (writer; stuck: one send outlasted SEND_TIMEOUT_S), a resume takes over (kick),
        # or the session ends on its own (idle, lifetime, error) — the reader may be blocked on
        # a full mailbox and never notice — or the server goes down (the session is kept: the
        # lifespan closes it as server_shutdown).
        await asyncio.wait(set(tasks), return_when=asyncio.FIRST_COMPLETED)
        if ended.done() and not writer.done():
            # let the last events (the reason it ended) reach a client that still reads
            await asyncio.wait({writer}, timeout=CLOSE_FLUSH_S)
        if reader.done() and not reader.cancelled() and reader.exception() is None:
            clean = reader.result()
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if kicked.is_set():
            runner.detach(manager.resume_grace_s)  # a resuming connection takes over at once
        elif clean or runner.closed.is_set() or (manager.resume_grace_s <= 0 and not draining.is_set()):
            await runner.close("client_closed")
        elif draining.is_set():
            pass  # the lifespan closes it as server_shutdown: its stored row stays for a resume
        else:
            runner.detach(manager.resume_grace_s)  # dropped or dead peer: resumable for the grace
        if websocket.client_state is WebSocketState.CONNECTED:
            # 4000: taken over by a resume; 1001: the session was kept for a resume (the peer
            # stopped taking what it was sent); 1000: the session is over
            # 1012: the server is restarting (resume afterwards)
            code = 4000 if kicked.is_set() else 1000 if runner.closed.is_set() else 1012 if draining.is_set() else 1001
            await _close(websocket, code)


async def _close(websocket: WebSocket, code: int) -> None:
    """Send a close frame, but never wait on a peer that does not read (the server drops it)."""
    try:
        async with asyncio.timeout(CLOSE_FLUSH_S):
            await websocket.close(code=code)
    except (RuntimeError, TimeoutError, ConnectionError, WebSocketDisconnect):
        pass


async def _reader(websocket: WebSocket, runner: SessionRunner) -> bool:
    """Feeds the mailbox in wire order; returns True when the client closed cleanly."""
    try:
        while True:
            message = await websocket.receive()
            if message["type"] == "websocket.disconnect":
                return message.get("code") == NORMAL_CLOSURE
            raw = message.get("text")
            if raw is None:
                raw = message.get("bytes") or b""
            await runner.submit(raw)
            if runner.closed.is_set():
                return True
    except WebSocketDisconnect as exc:
        return exc.code == NORMAL_CLOSURE


class SendClock:
    """When the writer's send in progress began (None: it is not sending). A watcher looks at
    it every few seconds: a timer around each send cost every audio chunk one to create and
    cancel, for a limit of tens of seconds."""

    __slots__ = ("since",)

    def __init__(self) -> None:
        self.since: float | None = None


async def _cancel_when_stuck(writer: asyncio.Task[None], sending: SendClock, limit_s: float = SEND_TIMEOUT_S) -> None:
    """Cancel ``writer`` once one send has taken more than ``limit_s`` (a peer that stopped
    reading: its socket buffer is full). Returns when it did, or when the writer ended."""
    while not writer.done():
        await asyncio.sleep(limit_s / 4)
        since = sending.since
        if since is not None and time.monotonic() - since > limit_s:
            writer.cancel()
            return


async def _writer(websocket: WebSocket, runner: SessionRunner, beta: bool, replay: list[Outgoing],
                  sending: SendClock) -> None:
    """The only task that sends on this connection (replayed events first)."""

    async def send(out: Outgoing) -> None:
        # the JSON edge: an audio delta's PCM becomes the output format, in base64, here
        wire = out.json_event()
        event = to_beta(wire) if beta else wire
        if event is not None:
            sending.since = time.monotonic()
            await websocket.send_text(event_text(event))
            for follower in beta_followers(out.event) if beta else ():
                await websocket.send_text(event_text(follower))
            sending.since = None

    try:
        for out in replay:
            await send(out)
        while True:
            out = await runner.next_outgoing()
            if out is None:
                break
            await send(out)
            runner.mark_sent(out)
    except (WebSocketDisconnect, RuntimeError, ConnectionError):
        return  # a dead or stuck peer: the handler detaches the session (resumable)
    if websocket.client_state is WebSocketState.CONNECTED:
        await _close(websocket, NORMAL_CLOSURE)
