"""Prometheus metrics (``GET /metrics``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Gauge, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

if TYPE_CHECKING:
    from .session.manager import SessionManager


class _EngineCollector:
    """Per model: its session slots, and per batched stage the steps, rows and busy time."""

    def __init__(self, stats: dict[str, dict[str, dict[str, float]]]) -> None:
        self.stats = stats

    def collect(self):
        slots = GaugeMetricFamily("realtime_omni_engine_slots", "Session slots of the model's batched stages",
                                  labels=["model"])
        used = GaugeMetricFamily("realtime_omni_engine_slots_in_use", "Session slots in use", labels=["model"])
        steps = CounterMetricFamily("realtime_omni_engine_steps", "Batched steps run", labels=["model", "stage"])
        rows = CounterMetricFamily("realtime_omni_engine_rows", "Session rows carried by batched steps",
                                   labels=["model", "stage"])
        busy = CounterMetricFamily("realtime_omni_engine_busy_seconds", "Wall time spent in batched steps",
                                   labels=["model", "stage"])
        for model, stages in self.stats.items():
            for stage, values in stages.items():
                if stage == "slots":
                    slots.add_metric([model], values.get("total", 0))
                    used.add_metric([model], values.get("in_use", 0))
                    continue
                steps.add_metric([model, stage], values.get("steps", 0))
                rows.add_metric([model, stage], values.get("rows", 0))
                busy.add_metric([model, stage], values.get("busy_s", 0.0))
        yield from (slots, used, steps, rows, busy)


def render(manager: "SessionManager", engine_stats: dict | None = None) -> tuple[bytes, str]:
    registry = CollectorRegistry()
    if engine_stats:
        registry.register(_EngineCollector(engine_stats))
    Gauge("realtime_omni_sessions_active", "Live sessions", registry=registry).set(len(manager.sessions))
    Gauge("realtime_omni_sessions_opened_total", "Sessions opened since start", registry=registry).set(manager.total_opened)
    Gauge("realtime_omni_speculations_adopted_total", "Replies prepared during a pause and used", registry=registry).set(
        manager.speculations_adopted + sum(r.speculations_adopted for r in manager.sessions.values()))
    return generate_latest(registry), CONTENT_TYPE_LATEST
