"""The ASGI application: routes, model loading at startup, clean shutdown."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from pathlib import Path

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Mount, Route, WebSocketRoute
from starlette.staticfiles import StaticFiles

from . import __version__, metrics
from .config import ServerSettings
from .engines.registry import ModelRegistry
from .pipeline import PipelineSettings
from .protocol import strict_json
from .protocol.errors import ErrorCode
from .security import AuthError, Guard
from .transports.bodies import BodyTooLarge, read_body
from .session.manager import SessionManager
from .session.runner import RunnerLimits
from .session.store import open_store
from .transports.twilio import twilio_routes
from .transports import webrtc
from .transports.websocket import realtime_websocket

log = logging.getLogger(__name__)
_STARTED = int(time.time())


async def health(request: Request) -> JSONResponse:
    return JSONResponse({"status": "ok", "version": __version__})


async def ready(request: Request) -> JSONResponse:
    manager: SessionManager | None = getattr(request.app.state, "manager", None)
    if manager is None:
        return JSONResponse({"status": "loading"}, status_code=503)
    down = manager.registry.not_ready()
    restarts = {m.info.id: m.restarts for m in manager.registry.models.values() if hasattr(m, "restarts")}
    body = {"status": "degraded" if down else "ready", "models": [m.id for m in manager.registry.infos()],
            "not_ready": down, "worker_restarts": restarts, "sessions": len(manager.sessions)}
    return JSONResponse(body, status_code=503 if down else 200)


async def list_models(request: Request) -> JSONResponse:
    try:
        request.app.state.guard.check_api_key(request.headers)
    except AuthError as exc:
        return JSONResponse(exc.body(), status_code=exc.status)
    manager: SessionManager = request.app.state.manager
    data = [
        {"id": info.id, "object": "model", "created": _STARTED, "owned_by": info.owned_by,
         "capabilities": sorted(info.capabilities), "default": info.id == manager.registry.default,
         "aliases": manager.registry.aliases_of(info.id)}
        for info in manager.registry.infos()
    ]
    return JSONResponse({"object": "list", "data": data})


#: a client-secret request carries session settings: instructions, tools, a few kilobytes
MAX_SECRET_REQUEST_BYTES = 1024 * 1024


def _invalid(status: int, code: ErrorCode, message: str) -> JSONResponse:
    return JSONResponse({"error": {"type": "invalid_request_error", "code": code, "message": message}},
                        status_code=status)


async def client_secrets(request: Request) -> JSONResponse:
    """Mint a short-lived, single-use secret so a browser never sees the API key."""
    guard: Guard = request.app.state.guard
    try:
        owner = guard.check_api_key(request.headers)
        guard.check_origin(request.headers)
    except AuthError as exc:
        return JSONResponse(exc.body(), status_code=exc.status)
    try:
        raw = await read_body(request, MAX_SECRET_REQUEST_BYTES)
        body = strict_json.loads(raw) if raw else {}
        session = dict(body.get("session") or {})
        ttl = (body.get("expires_after") or {}).get("seconds")
        ttl = float(ttl) if ttl is not None else None
    except BodyTooLarge as exc:
        return _invalid(413, ErrorCode.REQUEST_TOO_LARGE, str(exc))
    except (ValueError, AttributeError, TypeError):
        return _invalid(400, ErrorCode.INVALID_JSON, "body must be a JSON object")
    if ttl is not None and not 10 <= ttl <= 7200:
        return _invalid(400, ErrorCode.INVALID_VALUE, "expires_after.seconds must be between 10 and 7200")
    session.pop("type", None)
    secret = guard.issue_secret(session, ttl, owner)
    return JSONResponse({"value": secret.value, "expires_at": int(secret.expires_at),
                         "session": {"type": "realtime", **session}})


async def metrics_endpoint(request: Request) -> Response:
    manager = request.app.state.manager
    try:  # engine counters come from the model workers: off the loop, with a deadline
        stats = await asyncio.wait_for(asyncio.to_thread(manager.registry.stats), 2.0)
    except (TimeoutError, asyncio.TimeoutError):
        stats = {}
    body, content_type = request.app.state.metrics.render(manager, stats)
    return Response(body, media_type=content_type)


def create_app(settings: ServerSettings | None = None, registry: ModelRegistry | None = None) -> Starlette:
    """Build the app. Pass ``registry`` to serve already-loaded models (tests, benchmarks)."""
    settings = settings or ServerSettings()

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        reg = registry
        if reg is None:
            reg = ModelRegistry()
            await asyncio.to_thread(reg.load, settings.serving.models, None, settings.serving.isolate,
                                    settings.serving.ray_address, settings.engines)
        reg.aliases = dict(settings.serving.aliases)
        reg.check_aliases()
        lim = settings.limits
        limits = RunnerLimits(
            idle_timeout_s=lim.idle_timeout_s, max_session_s=lim.max_session_s,
            max_event_bytes=lim.max_event_bytes, max_events_per_s=lim.max_events_per_s,
            expiry_warning_s=lim.expiry_warning_s, max_session_bytes=lim.max_session_bytes,
            journal_bytes=lim.journal_bytes, queue_bytes=lim.queue_bytes,
        )
        app.state.loop = asyncio.get_running_loop()
        #: set by the server (server_thread.DrainingServer) when it starts shutting down
        app.state.draining = asyncio.Event()
        lead = lim.output_lead_ms if lim.output_lead_ms >= 0 else None
        store = await asyncio.to_thread(open_store, settings.store.url, settings.store.ttl_s)
        app.state.manager = SessionManager(
            reg, max_sessions=lim.max_sessions, limits=limits,
            pipeline=PipelineSettings(lead_ms=lead), model_threads=settings.serving.threads,
            store=store, resume_grace_s=settings.store.resume_grace_s, persist_ttl_s=settings.store.ttl_s,
            observer=app.state.metrics,
            store_transcripts=settings.store.transcripts,
        )
        app.state.manager.start()
        log.info("realtime-omni ready on ws://%s:%d/v1/realtime", settings.server.host, settings.server.port)
        try:
            yield
        finally:
            # uvicorn has had half of shutdown_timeout_s for the connections; this is the rest
            deadline = asyncio.get_running_loop().time() + settings.server.shutdown_timeout_s / 2
            try:
                async with asyncio.timeout_at(deadline - settings.server.shutdown_timeout_s / 4):
                    await webrtc.shutdown(app)
            except TimeoutError:
                log.warning("shutdown: WebRTC calls did not hang up in time; going on")
            await app.state.manager.shutdown(max(deadline - asyncio.get_running_loop().time(), 0.5))
            if registry is None:
                reg.close()

    routes = [
        Route("/health", health),
        Route("/ready", ready),
        Route("/v1/models", list_models),
        Route("/metrics", metrics_endpoint),
        Route("/v1/realtime/client_secrets", client_secrets, methods=["POST"]),
        WebSocketRoute("/v1/realtime", realtime_websocket),
        *twilio_routes(),
        *webrtc.routes(),
    ]
    web_dir = Path(settings.server.web_dir) if settings.server.web_dir else Path(__file__).resolve().parent.parent / "web"
    if web_dir.is_dir():
        routes.append(Mount("/", StaticFiles(directory=web_dir, html=True), name="web"))
    app = Starlette(routes=routes, lifespan=lifespan)
    app.state.settings = settings
    app.state.metrics = metrics.Metrics()
    auth = settings.auth
    app.state.guard = Guard(list(auth.api_keys), auth.allowed_origins, auth.client_secret_ttl_s)
    return app
