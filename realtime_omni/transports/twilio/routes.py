"""HTTP and WebSocket endpoints of the Twilio bridge.

``POST /v1/telephony/twilio/voice`` is the number's voice webhook: it answers TwiML that connects
the call to ``/v1/telephony/twilio/stream`` (a bidirectional Media Stream). Query parameters of the
webhook URL (``?instructions=...&voice=...&model=...``) become ``<Parameter>`` elements, which
Twilio hands back in the stream's ``start.customParameters``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qsl

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import BaseRoute, Route, WebSocketRoute
from starlette.websockets import WebSocket

from ...config import ServerSettings
from ...security import Guard
from ..bodies import BodyTooLarge, read_body
from . import messages as tw
from .call import STREAM_TOKEN_PARAMETER, TwilioCall

log = logging.getLogger(__name__)

VOICE_PATH = "/v1/telephony/twilio/voice"
STREAM_PATH = "/v1/telephony/twilio/stream"
#: how long the stream token in a TwiML answer stays valid (Twilio connects within seconds)
STREAM_TOKEN_TTL_S = 60.0
MAX_PARAMETERS = 32
MAX_PARAMETER_CHARS = 4096


def set_call_hook(app: Starlette, hook: Callable[[TwilioCall], Any] | None) -> None:
    """Run ``hook(call)`` when each call's stream starts (e.g. ``call.add_listener(...)``)."""
    app.state.twilio_call_hook = hook


def auth_token(app: Starlette) -> str | None:
    """The Twilio auth token of the app's settings; when set, webhooks must be signed with it."""
    settings: ServerSettings | None = getattr(app.state, "settings", None)
    secret = settings.transports.twilio.auth_token if settings is not None else None
    return secret.get_secret_value() if secret is not None else None


def _first(value: str | None) -> str | None:
    return value.split(",")[0].strip() if value else None


def public_base(request: Request) -> tuple[str, str]:
    """(scheme, host) as the caller's side sees this server, proxies included."""
    scheme = (_first(request.headers.get("x-forwarded-proto")) or request.url.scheme).lower()
    host = _first(request.headers.get("x-forwarded-host")) or request.headers.get("host") or request.url.netloc
    return scheme, host.strip()


#: Twilio's webhook form is a few kilobytes
MAX_WEBHOOK_BYTES = 64 * 1024


async def twilio_voice(request: Request) -> Response:
    scheme, host = public_base(request)
    root = request.scope.get("root_path", "")
    token = auth_token(request.app)
    guard: Guard = request.app.state.guard
    if guard.enabled and not token:
        # Twilio cannot present an API key: its signature is what authenticates the webhook
        return PlainTextResponse("telephony on a server with API keys needs the setting transports.twilio.auth_token "
                                 "(REALTIME_OMNI_TWILIO_AUTH_TOKEN)", status_code=403)
    if token:
        form: dict[str, str] = {}
        if request.method == "POST" and request.headers.get("content-type", "").startswith("application/x-www-form-urlencoded"):
            try:
                body = await read_body(request, MAX_WEBHOOK_BYTES)
            except BodyTooLarge as exc:
                return PlainTextResponse(str(exc), status_code=413)
            form = dict(parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True))
        url = f"{scheme}://{host}{root}{request.url.path}" + (f"?{request.url.query}" if request.url.query else "")
        if not tw.valid_signature(token, request.headers.get("x-twilio-signature", ""), url, form):
            log.warning("twilio voice webhook: bad signature for %s", url)
            return PlainTextResponse("invalid Twilio signature", status_code=403)
    parameters = {
        k: v for k, v in list(request.query_params.items())[:MAX_PARAMETERS] if v and len(k) + len(v) <= MAX_PARAMETER_CHARS
    }
    parameters.pop(STREAM_TOKEN_PARAMETER, None)
    if token:  # a signed request: its stream may open one session
        parameters[STREAM_TOKEN_PARAMETER] = guard.issue_secret({}, STREAM_TOKEN_TTL_S).value
    ws_scheme = "wss" if scheme in ("https", "wss") else "ws"
    twiml = tw.connect_stream_twiml(f"{ws_scheme}://{host}{root}{STREAM_PATH}", parameters)
    return Response(twiml, media_type="application/xml")


async def twilio_stream(websocket: WebSocket) -> None:
    hook = getattr(websocket.app.state, "twilio_call_hook", None)
    guard: Guard = websocket.app.state.guard
    # authenticated telephony (a Twilio token, or API keys): the stream needs the webhook's token
    redeem = guard.redeem_secret if (guard.enabled or auth_token(websocket.app)) else None
    await TwilioCall(websocket, websocket.app.state.manager, hook, redeem).run()


def twilio_routes() -> list[BaseRoute]:
    return [
        Route(VOICE_PATH, twilio_voice, methods=["GET", "POST"]),
        WebSocketRoute(STREAM_PATH, twilio_stream),
    ]
