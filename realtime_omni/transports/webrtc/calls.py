"""HTTP signalling of the GA WebRTC flow (``/v1/realtime/calls``), and the registry of live calls.

``POST /v1/realtime/calls[?model=]`` takes the SDP offer (``application/sdp``, or
``multipart/form-data`` with ``sdp`` and an optional ``session`` JSON object applied as a
``session.update`` before anything else) and answers ``201`` with the SDP answer and
``Location: /v1/realtime/calls/{call_id}``. ``DELETE /v1/realtime/calls/{call_id}`` (or ``POST
.../hangup``) ends the call. ``GET /v1/realtime/ice`` tells browsers which ICE servers to use.
Every refusal is a JSON ``{"error": {...}}`` with a ``code``; who may call each route is the
dependency it declares (:mod:`realtime_omni.http.access`). The offer's body: :mod:`.offer`.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response

from ...config import ServerSettings
from ...http.access import Opener, Owner, allowed_origin
from ...http.bodies import LimitedBody
from ...http.errors import ApiError, api_error
from ...http.schemas import CallEnded, CallInfo, CallList, IceConfig, refusals
from ...protocol import parse_client_event
from ...protocol.errors import ErrorCode, ProtocolError
from ...session.manager import (
    ResumeError,
    SessionLimitError,
    SessionManager,
    UnknownModelError,
)
from .ice import local_addresses, parse_ice_servers
from .offer import BadOffer, check_offer, parse_body
from .pacing import PacketLength
from .peer import Peer, WebRTCOptions, new_call_id

log = logging.getLogger(__name__)

MAX_OFFER_BYTES = 256 * 1024
ANSWER_TIMEOUT_S = 15.0


class CallRegistry:
    """The live calls of one app; each removes itself when it ends."""

    def __init__(self, options: WebRTCOptions) -> None:
        self.options = options
        self.calls: dict[str, Peer] = {}
        self.total_opened = 0
        options.packet_length = PacketLength.from_setting(options.audio_packet_ms, options.audio_busy_calls,
                                                          lambda: len(self.calls))

    def add(self, peer: Peer) -> None:
        self.calls[peer.id] = peer
        self.total_opened += 1

    def forget(self, peer: Peer) -> None:
        self.calls.pop(peer.id, None)

    async def close_all(self, reason: str = "server_shutdown", timeout: float = 15.0) -> None:
        peers = list(self.calls.values())
        if peers:
            await asyncio.wait([p.hangup(reason) for p in peers], timeout=timeout)


def options_from_settings(settings: ServerSettings | None) -> WebRTCOptions:
    settings = settings if settings is not None else ServerSettings()  # an app built without any
    rtc = settings.transports.webrtc
    return WebRTCOptions(
        ice_servers=parse_ice_servers(rtc.ice_servers),
        local_addresses=local_addresses(rtc.ice_addresses or None, settings.server.host),
        jitter_prefetch=rtc.jitter_prefetch,
        video_fps=rtc.video_fps,
        avatar=rtc.avatar,
        avatar_size=(rtc.avatar_width, rtc.avatar_height),
        avatar_fps=rtc.avatar_fps,
        datachannel_timeout_s=rtc.datachannel_timeout_s,
        connect_timeout_s=rtc.connect_timeout_s,
        peer_timeout_s=rtc.peer_timeout_s,
        max_queue_ms=rtc.max_queue_ms,
        audio_packet_ms=rtc.audio_packet_ms,
        audio_busy_calls=rtc.audio_busy_calls,
    )


def registry(app: Starlette) -> CallRegistry:
    reg: CallRegistry | None = getattr(app.state, "webrtc_calls", None)
    if reg is None:
        reg = CallRegistry(options_from_settings(getattr(app.state, "settings", None)))
        app.state.webrtc_calls = reg
    return reg


async def shutdown(app: Starlette) -> None:
    """Hang up every call (the app's lifespan calls this before the sessions are shut down)."""
    reg: CallRegistry | None = getattr(app.state, "webrtc_calls", None)
    if reg is not None:
        await reg.close_all()


_OFFER_DOC = {"requestBody": {"required": True, "content": {
    "application/sdp": {"schema": {"type": "string"}},
    "multipart/form-data": {"schema": {"type": "object", "required": ["sdp"], "properties": {
        "sdp": {"type": "string"}, "session": {"type": "string", "description": "a JSON session object"}}}},
}}}
_ANSWER_DOC: dict[int | str, dict[str, Any]] = {
    201: {"description": "the SDP answer; Location names the call", "content": {"application/sdp": {"schema": {"type": "string"}}}},
    **refusals(400, 401, 403, 404, 413, 415, 422, 500, 503),
}
#: call ids are ``rtc_`` and 24 hex digits; anything much longer is not one
CallId = Annotated[str, Path(max_length=64)]

router = APIRouter(prefix="/v1/realtime", tags=["webrtc"])


@router.post("/calls", status_code=201, response_class=Response, responses=_ANSWER_DOC, openapi_extra=_OFFER_DOC)
async def create_call(
    request: Request,
    admission: Opener,  # an API key or a single-use client secret (ek_...), and the Origin allow-list
    body: Annotated[bytes, Depends(LimitedBody(MAX_OFFER_BYTES, ErrorCode.OFFER_TOO_LARGE))],
    model: str | None = None,
    resume_token: str | None = None,
    last_sequence_number: Annotated[int, Query(ge=0)] = 0,
) -> Response:
    """Take an SDP offer, answer it, and run a session on the call."""
    manager: SessionManager = request.app.state.manager
    reg = registry(request.app)
    bound, owner = admission.session, admission.owner
    try:
        offer, session = parse_body(request.headers.get("content-type", ""), body)
        check_offer(offer)
        if bound:  # the settings a client secret was minted with come first; the call's own win
            session = {"type": "realtime", **bound, **(session or {})}
        update = None
        if session is not None:
            update = json.dumps({"type": "session.update", "session": session})
            parse_client_event(update)  # the same validation as the data channel's, before any work
    except BadOffer as exc:
        return api_error(exc.status, exc.code, exc.message, exc.param)
    except ProtocolError as exc:
        return api_error(400, exc.code, exc.message, exc.param or "session")  # (its param names the session's field)
    model = model or (session or {}).get("model")
    preface: list[dict[str, Any]] = []
    try:
        if resume_token:  # a new offer carrying the token resumes the session of a lost call
            runner, replay, gap = await manager.resume(resume_token, last_sequence_number, owner, transport="webrtc")
            # missed events go on the data channel first; missed audio is stale and is not replayed
            missed = [o.event for o in replay if o.event["type"] != "response.output_audio.delta"]
            preface = [runner.resumed_event(len(missed), gap), *missed]
        else:
            runner = manager.open(model, owner=owner, transport="webrtc")
    except SessionLimitError as exc:
        return api_error(503, ErrorCode.SESSION_LIMIT_REACHED, str(exc))
    except UnknownModelError as exc:
        return api_error(400, ErrorCode.MODEL_NOT_FOUND, str(exc), param="model")
    except (ResumeError, ValueError) as exc:
        return api_error(404, ErrorCode.RESUME_TOKEN_INVALID, str(exc), param="resume_token")
    if not resume_token:
        await manager.stored(runner)  # before the answer and session.created hand out the token
    if update is not None:
        await runner.submit(update)  # first in the mailbox: before any audio or client event
    peer = Peer(new_call_id(), runner, reg.options, reg.forget)
    peer.owner = owner  # the key it belongs to: only that key lists, inspects or hangs it up
    peer.resume_grace_s = manager.resume_grace_s
    peer.preface(preface)
    reg.add(peer)
    try:
        answer = await asyncio.wait_for(peer.answer(offer), ANSWER_TIMEOUT_S)
    except Exception as exc:  # noqa: BLE001 - a bad offer fails this call only
        # a resumed session outlives a bad offer: detached again, for the client's next offer
        await peer.hangup("resume_offer_failed" if resume_token else "invalid_offer")
        log.info("call refused: %s", exc)
        message = str(exc) or type(exc).__name__
        if isinstance(exc, asyncio.TimeoutError):
            return api_error(500, ErrorCode.ANSWER_TIMEOUT, "the answer could not be created in time")
        return api_error(400, ErrorCode.INVALID_OFFER, f"the offer could not be applied: {message}", param="sdp")
    return Response(
        answer, status_code=201, media_type="application/sdp", headers={"Location": f"/v1/realtime/calls/{peer.id}"}
    )


def _visible(peer: Peer, caller: str | None) -> bool:
    return caller is None or peer.owner == caller


def _call_or_404(request: Request, call_id: str, caller: str | None) -> Peer:
    peer = registry(request.app).calls.get(call_id)
    if peer is None or not _visible(peer, caller):  # another key's call is not there for this one
        raise ApiError(404, ErrorCode.CALL_NOT_FOUND, f"no live call {call_id!r}", param="call_id")
    return peer


@router.get("/calls", response_model=CallList, responses=refusals(401, 403))
async def list_calls(request: Request, caller: Owner) -> CallList:
    """The calling key's live calls (all of them when keys are off)."""
    reg = registry(request.app)
    mine = [p.info() for p in reg.calls.values() if _visible(p, caller)]
    return CallList.model_validate({"data": mine, "total_opened": reg.total_opened})


@router.get("/calls/{call_id}", response_model=CallInfo, responses=refusals(401, 403, 404, 422))
async def get_call(request: Request, call_id: CallId, caller: Owner) -> CallInfo:
    return CallInfo.model_validate(_call_or_404(request, call_id, caller).info())


@router.delete("/calls/{call_id}", response_model=CallEnded, responses=refusals(401, 403, 404, 422))
@router.post("/calls/{call_id}/hangup", response_model=CallEnded, responses=refusals(401, 403, 404, 422))
async def hangup_call(request: Request, call_id: CallId, caller: Owner) -> CallEnded:
    peer = _call_or_404(request, call_id, caller)
    await peer.hangup("hangup")
    return CallEnded(id=peer.id)


@router.get("/ice", response_model=IceConfig, dependencies=[Depends(allowed_origin)])
async def ice_config(request: Request) -> IceConfig:
    """ICE servers for browsers (the same list the server uses; empty: host candidates only)."""
    return IceConfig(ice_servers=registry(request.app).options.ice_servers)
