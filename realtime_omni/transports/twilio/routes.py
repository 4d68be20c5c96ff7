"""HTTP and WebSocket endpoints of the Twilio bridge.

``POST /v1/telephony/twilio/voice`` is the number's voice webhook: it answers TwiML that connects
the call to ``/v1/telephony/twilio/stream`` (a bidirectional Media Stream). Query parameters of the
webhook URL (``?instructions=...&voice=...&model=...``) become ``<Parameter>`` elements, which
Twilio hands back in the stream's ``start.customParameters``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Annotated, Any
from urllib.parse import parse_qsl

from fastapi import APIRouter, Depends
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.websockets import WebSocket

from ...config import ServerSettings
from ...http.access import allowed_origin
from ...http.bodies import read_body
from ...http.errors import ApiError
from ...http.schemas import refusals
from ...protocol.errors import ErrorCode
from ...security import STREAM_SECRET, Guard
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


router = APIRouter(tags=["telephony"])
_TWIML: dict[int | str, dict[str, Any]] = {200: {"content": {"application/xml": {}}, "description": "TwiML"}}


async def twilio_signature(request: Request) -> str | None:
    """Dependency of the webhook: Twilio presents no API key and no Origin; its signature over the
    URL and the form is what authenticates it. Returns the Twilio auth token (None: telephony
    unsigned, only on a server without keys); 403 for a bad signature, 413 past the form limit."""
    token = auth_token(request.app)
    guard: Guard = request.app.state.guard
    if guard.enabled and not token:
        raise ApiError(403, ErrorCode.TELEPHONY_NOT_CONFIGURED, "telephony on a server with API keys needs the setting "
                       "transports.twilio.auth_token (REALTIME_OMNI_TWILIO_AUTH_TOKEN)")
    if token:
        form: dict[str, str] = {}
        if request.method == "POST" and request.headers.get("content-type", "").startswith("application/x-www-form-urlencoded"):
            body = await read_body(request, MAX_WEBHOOK_BYTES)
            form = dict(parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True))
        scheme, host = public_base(request)
        root = request.scope.get("root_path", "")
        url = f"{scheme}://{host}{root}{request.url.path}" + (f"?{request.url.query}" if request.url.query else "")
        if not tw.valid_signature(token, request.headers.get("x-twilio-signature", ""), url, form):
            log.warning("twilio voice webhook: bad signature for %s", url)
            raise ApiError(403, ErrorCode.INVALID_SIGNATURE, "invalid Twilio signature")
    return token


@router.get(VOICE_PATH, response_class=Response, responses={**_TWIML, **refusals(403, 413)})
@router.post(VOICE_PATH, response_class=Response, responses={**_TWIML, **refusals(403, 413)})
async def twilio_voice(request: Request, token: Annotated[str | None, Depends(twilio_signature)]) -> Response:
    scheme, host = public_base(request)
    root = request.scope.get("root_path", "")
    guard: Guard = request.app.state.guard
    parameters = {
        k: v for k, v in list(request.query_params.items())[:MAX_PARAMETERS] if v and len(k) + len(v) <= MAX_PARAMETER_CHARS
    }
    parameters.pop(STREAM_TOKEN_PARAMETER, None)
    if token:  # a signed request: its stream may open one session
        parameters[STREAM_TOKEN_PARAMETER] = guard.issue_secret({}, STREAM_TOKEN_TTL_S, purpose=STREAM_SECRET).value
    ws_scheme = "wss" if scheme in ("https", "wss") else "ws"
    twiml = tw.connect_stream_twiml(f"{ws_scheme}://{host}{root}{STREAM_PATH}", parameters)
    return Response(twiml, media_type="application/xml")


# the stream's own credential is the webhook's single-use token (checked by TwilioCall); Twilio
# sends no Origin, a browser page of a foreign origin is refused like on every other route
@router.websocket(STREAM_PATH, dependencies=[Depends(allowed_origin)])
async def twilio_stream(websocket: WebSocket) -> None:
    hook = getattr(websocket.app.state, "twilio_call_hook", None)
    guard: Guard = websocket.app.state.guard
    # authenticated telephony (a Twilio token, or API keys): the stream needs the webhook's token
    redeem = guard.redeem_secret if (guard.enabled or auth_token(websocket.app)) else None
    await TwilioCall(websocket, websocket.app.state.manager, hook, redeem).run()
