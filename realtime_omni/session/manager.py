"""SessionManager: the registry of live sessions, their limits, and clean shutdown."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging

from ..engines.registry import ModelRegistry
from ..pipeline import PipelineSettings
from .core import RealtimeSession
from .runner import RunnerLimits, SessionRunner

log = logging.getLogger(__name__)


class SessionLimitError(Exception):
    """The server is at its session cap (HTTP 503 / WebSocket close 1013)."""


class UnknownModelError(Exception):
    """``?model=`` names no loaded model (HTTP 400)."""


class SessionManager:
    def __init__(
        self,
        registry: ModelRegistry,
        *,
        max_sessions: int = 100,
        limits: RunnerLimits | None = None,
        pipeline: PipelineSettings | None = None,
        model_threads: int = 4,
    ) -> None:
        self.registry = registry
        self.max_sessions = max_sessions
        self.limits = limits or RunnerLimits()
        self.pipeline = pipeline or PipelineSettings()
        # Models never run on the event loop: heavy steps (ASR/LLM/TTS) and the per-frame VAD get
        # separate pools so a long synthesis cannot delay barge-in detection.
        self.executor = concurrent.futures.ThreadPoolExecutor(model_threads, thread_name_prefix="model")
        self.vad_executor = concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix="vad")
        self.sessions: dict[str, SessionRunner] = {}
        self.total_opened = 0

    def open(self, model_name: str | None) -> SessionRunner:
        """Create and start a session (call on the event loop)."""
        if len(self.sessions) >= self.max_sessions:
            raise SessionLimitError(f"server is at its limit of {self.max_sessions} concurrent sessions")
        model = self.registry.get(model_name)
        if model is None:
            known = ", ".join(m.id for m in self.registry.infos())
            raise UnknownModelError(f"unknown model {model_name!r}; available: {known}")
        model_session = model.open_session()
        core = RealtimeSession(model.info, has_vad=_has_vad(model_session), max_session_seconds=self.limits.max_session_s)
        runner = SessionRunner(
            core, model_session, self.executor, self.vad_executor, self.limits, self.pipeline, on_close=self._forget
        )
        self.sessions[core.id] = runner
        self.total_opened += 1
        runner.start()
        return runner

    def _forget(self, runner: SessionRunner) -> None:
        self.sessions.pop(runner.core.id, None)

    async def shutdown(self, timeout: float = 10.0) -> None:
        runners = list(self.sessions.values())
        if runners:
            await asyncio.wait_for(
                asyncio.gather(*(r.close("server_shutdown") for r in runners), return_exceptions=True), timeout
            )
        self.executor.shutdown(wait=False, cancel_futures=True)
        self.vad_executor.shutdown(wait=False, cancel_futures=True)


def _has_vad(model_session) -> bool:  # type: ignore[no-untyped-def]
    # A ModelSession that keeps the base implementation has no VAD.
    from ..engines.base import ModelSession

    return type(model_session).new_vad is not ModelSession.new_vad
