"""Prometheus metrics (``GET /metrics``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Gauge, generate_latest

if TYPE_CHECKING:
    from .session.manager import SessionManager


def render(manager: "SessionManager") -> tuple[bytes, str]:
    registry = CollectorRegistry()
    Gauge("realtime_omni_sessions_active", "Live sessions", registry=registry).set(len(manager.sessions))
    Gauge("realtime_omni_sessions_opened_total", "Sessions opened since start", registry=registry).set(manager.total_opened)
    Gauge("realtime_omni_speculations_adopted_total", "Replies prepared during a pause and used", registry=registry).set(
        manager.speculations_adopted + sum(r.speculations_adopted for r in manager.sessions.values()))
    return generate_latest(registry), CONTENT_TYPE_LATEST
