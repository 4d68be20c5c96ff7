"""Prometheus metrics (``GET /metrics``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
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


class _SessionCollector:
    """Live sessions (a gauge) and what happened since start (counters)."""

    def __init__(self, manager: "SessionManager") -> None:
        self.manager = manager

    def collect(self):
        manager = self.manager
        active = GaugeMetricFamily("realtime_omni_sessions_active", "Live sessions")
        active.add_metric([], len(manager.sessions))
        opened = CounterMetricFamily("realtime_omni_sessions_opened", "Sessions opened since start")
        opened.add_metric([], manager.total_opened)
        adopted = CounterMetricFamily("realtime_omni_speculations_adopted", "Replies prepared during a pause and used")
        adopted.add_metric([], manager.speculations_adopted
                           + sum(r.speculations_adopted for r in manager.sessions.values()))
        yield from (active, opened, adopted)
        persister = getattr(manager, "persister", None)
        if persister is not None:
            backlog = GaugeMetricFamily("realtime_omni_store_backlog_sessions",
                                        "Sessions with changes not yet written to the session store")
            backlog.add_metric([], persister.backlog)
            age = GaugeMetricFamily("realtime_omni_store_backlog_age_seconds",
                                    "Age of the oldest change not yet written to the session store")
            age.add_metric([], persister.oldest_change_age())
            written = CounterMetricFamily("realtime_omni_store_items_written", "Conversation items written to the store")
            written.add_metric([], persister.items_written)
            yield from (backlog, age, written)


def render(manager: "SessionManager", engine_stats: dict | None = None) -> tuple[bytes, str]:
    registry = CollectorRegistry()
    registry.register(_SessionCollector(manager))
    if engine_stats:
        registry.register(_EngineCollector(engine_stats))
    return generate_latest(registry), CONTENT_TYPE_LATEST
