"""The server's own HTTP endpoints: liveness, readiness, models, metrics, client secrets."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Annotated

from fastapi import APIRouter, Depends
from starlette.requests import Request
from starlette.responses import Response

from . import __version__
from .http.access import KeyHolder, Owner, metrics_reader
from .http.bodies import JsonBody
from .http.docs import json_body_doc
from .http.errors import ApiError
from .http.schemas import ClientSecret, ClientSecretRequest, Health, ModelList, Readiness, refusals
from .protocol.client_events import parse_client_event
from .protocol.errors import ErrorCode, ProtocolError
from .session.manager import SessionManager

_STARTED = int(time.time())
#: a client-secret request carries session settings: instructions, tools, a few kilobytes
MAX_SECRET_REQUEST_BYTES = 1024 * 1024
#: OpenAI's range for a client secret's lifetime
SECRET_TTL_RANGE_S = (10.0, 7200.0)

router = APIRouter()


# HEAD too: load balancers probe with it (Starlette's routes answered it; FastAPI's do not on their own)
@router.head("/health", include_in_schema=False)
@router.get("/health", response_model=Health, tags=["operations"])
async def health() -> Health:
    """Liveness: open to anyone, constant."""
    return Health(version=__version__)


@router.head("/ready", include_in_schema=False, response_model=Readiness, response_model_exclude_none=True)
@router.get("/ready", response_model=Readiness, response_model_exclude_none=True, tags=["operations"],
            responses={503: {"model": Readiness}})
async def ready(request: Request, response: Response, detailed: KeyHolder) -> Readiness:
    """Open to anyone; models, restarts and session counts only for a key holder when keys are on."""
    manager: SessionManager | None = getattr(request.app.state, "manager", None)
    if manager is None:
        response.status_code = 503
        return Readiness(status="loading")
    down = manager.registry.not_ready()
    response.status_code = 503 if down else 200
    status = "degraded" if down else "ready"
    if not detailed:
        return Readiness(status=status)
    restarts = {m.info.id: m.restarts for m in manager.registry.models.values() if hasattr(m, "restarts")}
    return Readiness(status=status, models=[m.id for m in manager.registry.infos()], not_ready=down,
                     worker_restarts=restarts, sessions=len(manager.sessions))


@router.get("/v1/models", response_model=ModelList, responses=refusals(401, 403), tags=["models"])
async def list_models(request: Request, owner: Owner) -> ModelList:
    registry = request.app.state.manager.registry
    return ModelList.model_validate({"data": [
        {"id": info.id, "created": _STARTED, "owned_by": info.owned_by,
         "capabilities": sorted(info.capabilities), "default": info.id == registry.default,
         "aliases": registry.aliases_of(info.id)}
        for info in registry.infos()
    ]})


@router.get("/metrics", dependencies=[Depends(metrics_reader)], responses=refusals(401, 403),
            response_class=Response, tags=["operations"])
async def metrics(request: Request) -> Response:
    """Prometheus text. Needs a key when keys are on, unless ``metrics_public``."""
    manager = request.app.state.manager
    try:  # engine counters come from the model workers: off the loop, with a deadline
        stats = await asyncio.wait_for(asyncio.to_thread(manager.registry.stats), 2.0)
    except TimeoutError:
        stats = {}
    body, content_type = request.app.state.metrics.render(manager, stats)
    return Response(body, media_type=content_type)


@router.post("/v1/realtime/client_secrets", response_model=ClientSecret, tags=["realtime"],
             responses=refusals(400, 401, 403, 413, 422, 429), openapi_extra=json_body_doc(ClientSecretRequest))
async def client_secrets(
    request: Request, owner: Owner,
    body: Annotated[ClientSecretRequest, Depends(JsonBody(ClientSecretRequest, MAX_SECRET_REQUEST_BYTES))],
) -> ClientSecret:
    """Mint a short-lived, single-use secret so a browser never sees the API key."""
    ttl = body.expires_after.seconds if body.expires_after else None
    low, high = SECRET_TTL_RANGE_S
    if ttl is not None and not low <= ttl <= high:
        raise ApiError(400, ErrorCode.INVALID_VALUE, f"expires_after.seconds must be between {low:g} and {high:g}",
                       "expires_after.seconds")
    session = dict(body.session or {})
    session.pop("type", None)
    try:  # the settings a secret opens with are checked now, as a session.update would be
        parse_client_event(json.dumps({"type": "session.update", "session": {"type": "realtime", **session}}))
    except ProtocolError as exc:
        raise ApiError(400, exc.code, exc.message, exc.param or "session") from None
    secret = request.app.state.guard.issue_secret(session, ttl, owner)
    return ClientSecret(value=secret.value, expires_at=int(secret.expires_at), session={"type": "realtime", **session})
