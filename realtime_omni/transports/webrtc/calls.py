"""HTTP signalling of the GA WebRTC flow (``/v1/realtime/calls``), and the registry of live calls.

``POST /v1/realtime/calls[?model=]`` takes the SDP offer (``application/sdp``, or
``multipart/form-data`` with ``sdp`` and an optional ``session`` JSON object applied as a
``session.update`` before anything else) and answers ``201`` with the SDP answer and
``Location: /v1/realtime/calls/{call_id}``. ``DELETE /v1/realtime/calls/{call_id}`` (or ``POST
.../hangup``) ends the call. ``GET /v1/realtime/ice`` tells browsers which ICE servers to use.
Every refusal is a JSON ``{"error": {...}}`` with a ``code``.
"""

from __future__ import annotations

import asyncio
import json
import logging
from email import policy
from email.parser import BytesParser
from typing import Any

from aiortc import sdp as aiortc_sdp
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ...protocol import parse_client_event
from ...protocol.errors import ErrorCode, ProtocolError
from ...security import AuthError
from ...session.manager import (
    ResumeError,
    SessionLimitError,
    SessionManager,
    UnknownModelError,
)
from ..bodies import BodyTooLarge, read_body
from .ice import local_addresses, parse_ice_servers
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
        datachannel_timeout_s=rtc.datachannel_timeout_s,
        connect_timeout_s=rtc.connect_timeout_s,
        peer_timeout_s=rtc.peer_timeout_s,
        max_queue_ms=rtc.max_queue_ms,
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


def error(status: int, code: ErrorCode, message: str, param: str | None = None) -> JSONResponse:
    kind = "invalid_request_error" if status < 500 else "server_error"
    return JSONResponse({"error": {"type": kind, "code": code, "message": message, "param": param}}, status_code=status)


class _BadRequest(Exception):
    def __init__(self, code: ErrorCode, message: str, param: str | None = None, status: int = 400) -> None:
        super().__init__(message)
        self.code, self.message, self.param, self.status = code, message, param, status


def _parse_body(content_type: str, body: bytes) -> tuple[str, dict[str, Any] | None]:
    """(offer SDP, session object or None) from either request shape."""
    media_type = content_type.split(";")[0].strip().lower()
    if media_type == "multipart/form-data":
        message = BytesParser(policy=policy.HTTP).parsebytes(
            b"Content-Type: " + content_type.encode("latin-1") + b"\r\n\r\n" + body
        )
        if not message.is_multipart():
            raise _BadRequest(ErrorCode.INVALID_MULTIPART, "malformed multipart/form-data body")
        fields: dict[str, bytes] = {}
        for part in message.iter_parts():
            name = part.get_param("name", header="content-disposition")
            if isinstance(name, str):
                fields[name] = part.get_payload(decode=True) or b""
        if "sdp" not in fields:
            raise _BadRequest(ErrorCode.MISSING_SDP, "multipart body has no 'sdp' field", param="sdp")
        sdp_text = fields["sdp"].decode("utf-8", "replace")
        session = None
        if fields.get("session"):
            try:
                session = json.loads(fields["session"])
            except ValueError as exc:
                raise _BadRequest(ErrorCode.INVALID_SESSION, f"'session' is not valid JSON: {exc}", param="session") from None
            if not isinstance(session, dict):
                raise _BadRequest(ErrorCode.INVALID_SESSION, "'session' must be a JSON object", param="session")
        return sdp_text, session
    if media_type in ("application/sdp", "text/plain", ""):
        return body.decode("utf-8", "replace"), None
    raise _BadRequest(
        ErrorCode.UNSUPPORTED_MEDIA_TYPE, f"send the SDP offer as application/sdp or multipart/form-data, not {media_type!r}",
        status=415,
    )


def _check_offer(sdp_text: str) -> None:
    """Refuse what can never become a call, before a session is opened for it."""
    if not sdp_text.lstrip().startswith("v=0"):
        raise _BadRequest(ErrorCode.INVALID_SDP, "the body is not an SDP offer (it must start with v=0)", param="sdp")
    try:
        description = aiortc_sdp.SessionDescription.parse(sdp_text)
    except Exception as exc:  # noqa: BLE001 - any parse failure is the client's
        raise _BadRequest(ErrorCode.INVALID_SDP, f"the SDP offer could not be parsed: {exc}", param="sdp") from None
    kinds = [m.kind for m in description.media]
    if "audio" not in kinds:
        raise _BadRequest(ErrorCode.MISSING_AUDIO, "the offer has no audio m-line; add an audio transceiver", param="sdp")
    if "application" not in kinds:
        raise _BadRequest(
            ErrorCode.MISSING_DATA_CHANNEL, "the offer has no data channel; create the 'oai-events' data channel before the offer",
            param="sdp",
        )
    for media in description.media:
        if not (media.ice and media.ice.usernameFragment and media.ice.password):
            raise _BadRequest(ErrorCode.INVALID_SDP, f"the {media.kind} m-line has no ICE credentials", param="sdp")
        if not (media.dtls and media.dtls.fingerprints):
            raise _BadRequest(ErrorCode.INVALID_SDP, f"the {media.kind} m-line has no DTLS fingerprint", param="sdp")


async def create_call(request: Request) -> Response:
    manager: SessionManager = request.app.state.manager
    reg = registry(request.app)
    bound: dict[str, Any] | None = None
    owner: str | None = None
    guard = getattr(request.app.state, "guard", None)
    if guard is not None:  # API key or single-use client secret (ek_...), and the Origin allow-list
        try:
            bound, owner = guard.admit_owned(request.headers)
        except AuthError as exc:
            return error(exc.status, exc.code, exc.message)
    try:  # the size is checked before the body is read, and while it is
        body = await read_body(request, MAX_OFFER_BYTES)
    except BodyTooLarge:
        return error(413, ErrorCode.OFFER_TOO_LARGE, f"the offer exceeds {MAX_OFFER_BYTES} bytes")
    try:
        offer, session = _parse_body(request.headers.get("content-type", ""), body)
        _check_offer(offer)
        if bound:  # the settings a client secret was minted with come first; the call's own win
            session = {"type": "realtime", **bound, **(session or {})}
        update = None
        if session is not None:
            update = json.dumps({"type": "session.update", "session": session})
            parse_client_event(update)  # the same validation as the data channel's, before any work
    except _BadRequest as exc:
        return error(exc.status, exc.code, exc.message, exc.param)
    except ProtocolError as exc:
        return error(400, exc.code, exc.message, f"session.{exc.param}" if exc.param else "session")
    model = request.query_params.get("model") or (session or {}).get("model")
    token = request.query_params.get("resume_token")
    preface: list[dict[str, Any]] = []
    try:
        if token:  # a new offer carrying the token resumes the session of a lost call
            last_seq = int(request.query_params.get("last_sequence_number") or 0)
            runner, replay, gap = await manager.resume(token, last_seq, owner, transport="webrtc")
            # missed events go on the data channel first; missed audio is stale and is not replayed
            missed = [o.event for o in replay if o.event["type"] != "response.output_audio.delta"]
            preface = [runner.resumed_event(len(missed), gap), *missed]
        else:
            runner = manager.open(model, owner=owner, transport="webrtc")
    except SessionLimitError as exc:
        return error(503, ErrorCode.SESSION_LIMIT_REACHED, str(exc))
    except UnknownModelError as exc:
        return error(400, ErrorCode.MODEL_NOT_FOUND, str(exc), param="model")
    except (ResumeError, ValueError) as exc:
        return error(404, ErrorCode.RESUME_TOKEN_INVALID, str(exc), param="resume_token")
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
        await peer.hangup("invalid_offer")
        log.info("call refused: %s", exc)
        message = str(exc) or type(exc).__name__
        if isinstance(exc, asyncio.TimeoutError):
            return error(500, ErrorCode.ANSWER_TIMEOUT, "the answer could not be created in time")
        return error(400, ErrorCode.INVALID_OFFER, f"the offer could not be applied: {message}", param="sdp")
    return Response(
        answer, status_code=201, media_type="application/sdp", headers={"Location": f"/v1/realtime/calls/{peer.id}"}
    )


def _caller(request: Request) -> str | None | JSONResponse:
    """The calling key's digest (None when keys are off), or the 401 to answer."""
    guard = getattr(request.app.state, "guard", None)
    if guard is None:
        return None
    try:
        return guard.check_api_key(request.headers)
    except AuthError as exc:
        return error(exc.status, exc.code, exc.message)


def _visible(peer: Peer, caller: str | None) -> bool:
    return caller is None or peer.owner == caller


def _call_or_404(request: Request) -> Peer | JSONResponse:
    caller = _caller(request)
    if isinstance(caller, JSONResponse):
        return caller
    call_id = request.path_params["call_id"]
    peer = registry(request.app).calls.get(call_id)
    if peer is None or not _visible(peer, caller):  # another key's call is not there for this one
        return error(404, ErrorCode.CALL_NOT_FOUND, f"no live call {call_id!r}", param="call_id")
    return peer


async def hangup_call(request: Request) -> Response:
    peer = _call_or_404(request)
    if isinstance(peer, JSONResponse):
        return peer
    await peer.hangup("hangup")
    return JSONResponse({"id": peer.id, "object": "realtime.call", "status": "ended"})


async def get_call(request: Request) -> Response:
    peer = _call_or_404(request)
    if isinstance(peer, JSONResponse):
        return peer
    return JSONResponse(peer.info())


async def list_calls(request: Request) -> Response:
    caller = _caller(request)
    if isinstance(caller, JSONResponse):
        return caller
    reg = registry(request.app)
    mine = [p.info() for p in reg.calls.values() if _visible(p, caller)]
    return JSONResponse({"object": "list", "data": mine, "total_opened": reg.total_opened})


async def ice_config(request: Request) -> Response:
    """ICE servers for browsers (the same list the server uses; empty: host candidates only)."""
    return JSONResponse({"object": "realtime.ice_config", "ice_servers": registry(request.app).options.ice_servers})


def routes() -> list[Route]:
    return [
        Route("/v1/realtime/calls", create_call, methods=["POST"]),
        Route("/v1/realtime/calls", list_calls, methods=["GET"]),
        Route("/v1/realtime/calls/{call_id}", get_call, methods=["GET"]),
        Route("/v1/realtime/calls/{call_id}", hangup_call, methods=["DELETE"]),
        Route("/v1/realtime/calls/{call_id}/hangup", hangup_call, methods=["POST"]),
        Route("/v1/realtime/ice", ice_config, methods=["GET"]),
    ]
