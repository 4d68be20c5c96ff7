"""The ASGI application (FastAPI): routers, error shape, model loading at startup, clean shutdown.

Routes live with what they serve (:mod:`.endpoints`, :mod:`.transports`); who may call each is a
dependency from :mod:`.http.access`. The OpenAPI document is served by :mod:`.http.docs`.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
from collections.abc import AsyncIterator
from pathlib import Path

from fastapi import FastAPI
from starlette.staticfiles import StaticFiles

from . import __version__, endpoints, metrics
from .audio.end_of_turn import EndOfTurnModel
from .config import ServerSettings
from .engines.registry import ModelRegistry
from .http import docs
from .http.errors import install_error_handlers
from .http.schemas import ClientSecretRequest
from .pipeline import PipelineSettings
from .security import Guard
from .session.manager import SessionManager
from .session.runner import RunnerLimits
from .session.store import open_store
from .transports import webrtc
from .transports.twilio import twilio_router
from .transports.websocket import router as websocket_router

log = logging.getLogger(__name__)


def create_app(settings: ServerSettings | None = None, registry: ModelRegistry | None = None) -> FastAPI:
    """Build the app. Pass ``registry`` to serve already-loaded models (tests, benchmarks)."""
    settings = settings or ServerSettings()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
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
            mcp_allowed_urls=tuple(settings.tools.mcp_allowed_urls), mcp_timeout_s=settings.tools.mcp_timeout_s,
        )
        app.state.loop = asyncio.get_running_loop()
        #: set by the server (server_thread.DrainingServer) when it starts shutting down
        app.state.draining = asyncio.Event()
        lead = lim.output_lead_ms if lim.output_lead_ms >= 0 else None
        store = await asyncio.to_thread(open_store, settings.store.url, settings.store.ttl_s)
        end_of_turn = None
        if settings.serving.end_of_turn_model and any("vad" in info.capabilities for info in reg.infos()):
            end_of_turn = await asyncio.to_thread(EndOfTurnModel.load, settings.engines.embedded.cache_dir, log.info)
        app.state.manager = SessionManager(
            reg, max_sessions=lim.max_sessions, limits=limits,
            pipeline=PipelineSettings(lead_ms=lead), model_threads=settings.serving.threads,
            store=store, resume_grace_s=settings.store.resume_grace_s, persist_ttl_s=settings.store.ttl_s,
            observer=app.state.metrics,
            store_transcripts=settings.store.transcripts, end_of_turn=end_of_turn,
            lease_s=settings.store.lease_s,
        )
        app.state.manager.start()
        if registry is None:  # a serving process (not an app around a caller's models)
            # What start-up built (modules, models: ~200 k objects) lives as long as the process:
            # out of the collector's sight, a full collection no longer stops the loop for 80–170 ms
            # with 50 calls live (every call's audio halts meanwhile), but for what calls hold.
            gc.collect()  # (before the first call: a pause nobody hears)
            gc.freeze()
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

    app = FastAPI(title="realtime-omni", version=__version__, lifespan=lifespan,
                  openapi_url=None, docs_url=None, redoc_url=None)  # served keyed by http.docs
    install_error_handlers(app)
    app.include_router(endpoints.router)
    app.include_router(websocket_router)
    app.include_router(webrtc.router)
    app.include_router(twilio_router)
    app.include_router(docs.router)
    app.openapi = docs.with_body_models(app, [ClientSecretRequest])  # type: ignore[method-assign]
    web_dir = Path(settings.server.web_dir) if settings.server.web_dir else Path(__file__).resolve().parent.parent / "web"
    if web_dir.is_dir():  # last: a mount at / would shadow any route added after it
        app.mount("/", StaticFiles(directory=web_dir, html=True), name="web")
    app.state.settings = settings
    app.state.metrics = metrics.Metrics()
    auth = settings.auth
    app.state.guard = Guard(list(auth.api_keys), auth.allowed_origins, auth.client_secret_ttl_s)
    return app
