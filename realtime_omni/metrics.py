"""Prometheus metrics (``GET /metrics``): the :class:`~realtime_omni.observer.Observer` that
records what the sessions report, plus gauges read from the live state at scrape time.

Names follow Prometheus conventions: ``realtime_omni_`` prefix, base units (seconds), counters
ending in ``_total``. Each app has a registry of its own (several servers can share a process).
"""

from __future__ import annotations

import asyncio
from collections import Counter as Tally
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from .observer import Stage

if TYPE_CHECKING:
    from .session.manager import SessionManager

#: turn latencies: 25 ms (what a fast barge-in takes) up to 10 s (a stuck reply)
LATENCY_BUCKETS = (0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0)
#: one model step: a token of a small LLM on a GPU (<1 ms) up to a long TTS chunk on a CPU
STEP_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
#: real-time factor: 1.0 is exactly real time; above it the listener runs out of audio
RTF_BUCKETS = (0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.8, 1.0, 1.5, 2.0, 4.0)


class Metrics:
    """Records what the server reports (an :class:`~realtime_omni.observer.Observer`) and
    renders it, with the live gauges of a :class:`SessionManager`, for ``/metrics``."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.first_audio = Histogram(
            "realtime_omni_time_to_first_audio_seconds", "response.created to the response's first audio handed to the transport",
            registry=r, buckets=LATENCY_BUCKETS)
        self.speech_end = Histogram(
            "realtime_omni_speech_end_to_first_audio_seconds",
            "End of the user's speech (when that audio arrived) to the reply's first audio handed to the transport",
            registry=r, buckets=LATENCY_BUCKETS)
        self.barge = Histogram(
            "realtime_omni_barge_in_seconds",
            "Start of the user's speech over a reply (when that audio arrived) to the last audio of the reply handed to"
            " the transport (0: none followed)", registry=r, buckets=LATENCY_BUCKETS)
        self.barge_cancel = Histogram(
            "realtime_omni_barge_in_cancel_seconds",
            "Start of the user's speech over a reply (when that audio arrived) to the reply's cancellation sent",
            registry=r, buckets=LATENCY_BUCKETS)
        self.steps = Histogram(
            "realtime_omni_stage_step_seconds", "One model step of a pipeline stage (thinker token, talker chunk, codec decode)",
            ["stage"], registry=r, buckets=STEP_BUCKETS)
        self.rtf = Histogram(
            "realtime_omni_response_real_time_factor",
            "Per reply: pipeline time (pacing excluded) per second of audio produced; below 1 keeps up",
            registry=r, buckets=RTF_BUCKETS)
        self.opened = Counter("realtime_omni_sessions_opened", "Sessions opened", ["transport"], registry=r)
        self.closed = Counter("realtime_omni_sessions_closed", "Sessions ended, by close reason",
                              ["transport", "reason"], registry=r)
        self.detached = Counter("realtime_omni_session_disconnects", "Connections lost with the session kept for a resume",
                                ["transport"], registry=r)
        self.resumed = Counter("realtime_omni_session_resumes", "Sessions resumed with their token", ["transport"], registry=r)
        self.responses = Counter("realtime_omni_responses", "Responses ended (response.done), by status", ["status"],
                                 registry=r)
        self.errors = Counter("realtime_omni_errors", "Error events sent to clients, by code", ["code"], registry=r)

    # ------------------------------------------------------------------ Observer
    def session_opened(self, transport: str) -> None:
        self.opened.labels(transport).inc()

    def session_closed(self, transport: str, reason: str) -> None:
        self.closed.labels(transport, reason).inc()

    def session_detached(self, transport: str) -> None:
        self.detached.labels(transport).inc()

    def session_resumed(self, transport: str) -> None:
        self.resumed.labels(transport).inc()

    def response_done(self, status: str) -> None:
        self.responses.labels(status).inc()

    def error_sent(self, code: str) -> None:
        self.errors.labels(code).inc()

    def time_to_first_audio(self, seconds: float) -> None:
        self.first_audio.observe(seconds)

    def speech_end_to_first_audio(self, seconds: float) -> None:
        self.speech_end.observe(seconds)

    def barge_in(self, stopped_s: float, cancelled_s: float) -> None:
        self.barge.observe(stopped_s)
        self.barge_cancel.observe(cancelled_s)

    def stage_step(self, stage: Stage, seconds: float) -> None:
        self.steps.labels(stage).observe(seconds)

    def real_time_factor(self, ratio: float) -> None:
        self.rtf.observe(ratio)

    # ------------------------------------------------------------------ scrape
    def render(self, manager: "SessionManager | None", engine_stats: dict | None = None) -> tuple[bytes, str]:
        registry = CollectorRegistry()
        registry.register(_Recorded(self.registry))
        if manager is not None:
            registry.register(_LiveCollector(manager))
        if engine_stats:
            registry.register(_EngineCollector(engine_stats))
        return generate_latest(registry), CONTENT_TYPE_LATEST


class _Recorded:
    """The recorded instruments, next to the per-scrape collectors."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry

    def collect(self) -> Iterator[Metric]:
        yield from self.registry.collect()


class _LiveCollector:
    """Gauges read from the live sessions at scrape time."""

    def __init__(self, manager: "SessionManager") -> None:
        self.manager = manager

    def collect(self) -> Iterator[Metric]:
        runners = list(self.manager.sessions.values())
        active = GaugeMetricFamily("realtime_omni_sessions_active", "Live sessions, by transport", labels=["transport"])
        for transport, count in sorted(Tally(r.transport for r in runners).items()):
            active.add_metric([transport], count)
        depth = GaugeMetricFamily("realtime_omni_queue_depth",
                                  "Items waiting in the sessions' queues, summed over live sessions", labels=["queue"])
        depth.add_metric(["mailbox"], sum(r.mailbox.qsize() for r in runners))
        depth.add_metric(["outbox"], sum(r.outbox.qsize() for r in runners))
        deepest = GaugeMetricFamily("realtime_omni_queue_depth_max",
                                    "The fullest queue of one session, as a fraction of its bound", labels=["queue"])
        deepest.add_metric(["mailbox"], max((_fill(r.mailbox) for r in runners), default=0.0))
        deepest.add_metric(["outbox"], max((_fill(r.outbox) for r in runners), default=0.0))
        adopted = CounterMetricFamily("realtime_omni_speculations_adopted", "Replies prepared during a pause and used")
        adopted.add_metric([], self.manager.speculations_adopted + sum(r.speculations_adopted for r in runners))
        yield from (active, depth, deepest, adopted)
        persister = getattr(self.manager, "persister", None)
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


def _fill(queue: "asyncio.Queue[Any]") -> float:
    """How full a bounded queue is (0..1); an unbounded one counts as empty."""
    return queue.qsize() / queue.maxsize if queue.maxsize > 0 else 0.0


class _EngineCollector:
    """Per model: its session slots, and per batched stage the steps, rows and busy time; per
    decode loop its wall time by phase (idle: no row queued; host: staging and launching a step;
    device_wait: waiting for the step's kernels)."""

    def __init__(self, stats: dict[str, dict[str, dict[str, float]]]) -> None:
        self.stats = stats

    def collect(self) -> Iterator[Metric]:
        slots = GaugeMetricFamily("realtime_omni_engine_slots", "Session slots of the model's batched stages",
                                  labels=["model"])
        used = GaugeMetricFamily("realtime_omni_engine_slots_in_use", "Session slots in use", labels=["model"])
        capacity = GaugeMetricFamily("realtime_omni_engine_realtime_capacity",
                                     "Sessions the batched steps keep in real time, all speaking at once (measured "
                                     "at load; admission refuses sessions beyond it)", labels=["model"])
        speaking = GaugeMetricFamily("realtime_omni_engine_replies_speaking", "Replies the talker is speaking now",
                                     labels=["model"])
        paced = GaugeMetricFamily("realtime_omni_engine_replies_paced",
                                  "Replies held back because they are ahead of their listener (pace_lead_ms): "
                                  "few while many speak means no GPU time to spare", labels=["model"])
        session_cpu = CounterMetricFamily(
            "realtime_omni_engine_session_cpu_seconds", "CPU time the sessions' own threads took per stage (not the "
            "batched loops): divided by the frames, the interpreter time a session needs per frame",
            labels=["model", "stage"])
        frames = CounterMetricFamily("realtime_omni_engine_frames", "Code frames the sessions' talkers made",
                                     labels=["model"])
        steps = CounterMetricFamily("realtime_omni_engine_steps", "Batched steps run", labels=["model", "stage"])
        rows = CounterMetricFamily("realtime_omni_engine_rows", "Session rows carried by batched steps",
                                   labels=["model", "stage"])
        busy = CounterMetricFamily("realtime_omni_engine_busy_seconds", "Wall time spent in batched steps",
                                   labels=["model", "stage"])
        loop = CounterMetricFamily("realtime_omni_engine_loop_seconds", "A decode loop's wall time by phase",
                                   labels=["model", "stage", "phase"])
        prefills = CounterMetricFamily("realtime_omni_engine_prefills", "Prefills of new turns finished",
                                       labels=["model", "stage"])
        waited = CounterMetricFamily("realtime_omni_engine_prefill_wait_seconds",
                                     "Time new turns' prefills waited for a batch to start (divide by prefills: "
                                     "the mean wait; it grows when many turns end at once)", labels=["model", "stage"])
        prefill_time = CounterMetricFamily("realtime_omni_engine_prefill_seconds",
                                           "Time from a prefill's request to its result, waiting included",
                                           labels=["model", "stage"])
        windows = CounterMetricFamily("realtime_omni_engine_codec_windows",
                                      "Codec windows decoded, by path: a CUDA graph captured at load, or eagerly "
                                      "(several times the device time)", labels=["model", "path"])
        mixed = CounterMetricFamily("realtime_omni_engine_codec_mixed_passes",
                                    "Codec passes that decoded windows of several lengths together", labels=["model"])
        for model, stages in self.stats.items():
            for stage, values in stages.items():
                if stage == "slots":
                    slots.add_metric([model], values.get("total", 0))
                    used.add_metric([model], values.get("in_use", 0))
                    if "realtime_capacity" in values:
                        capacity.add_metric([model], values["realtime_capacity"])
                    if "speaking" in values:
                        speaking.add_metric([model], values["speaking"])
                        paced.add_metric([model], values.get("paced", 0))
                    continue
                if stage == "session threads":
                    for role in ("thinker", "talker", "codec"):
                        session_cpu.add_metric([model, role], values.get(f"{role}_cpu_s", 0.0))
                    frames.add_metric([model], values.get("frames", 0))
                    continue
                steps.add_metric([model, stage], values.get("steps", 0))
                rows.add_metric([model, stage], values.get("rows", 0))
                busy.add_metric([model, stage], values.get("busy_s", 0.0))
                for phase in _LOOP_PHASES:
                    if f"{phase}_s" in values:
                        loop.add_metric([model, stage, phase], values[f"{phase}_s"])
                if "requests" in values:
                    prefills.add_metric([model, stage], values["requests"])
                    waited.add_metric([model, stage], values.get("wait_s", 0.0))
                    prefill_time.add_metric([model, stage], values.get("latency_s", 0.0))
                if "graph_rows" in values:
                    windows.add_metric([model, "graph"], values["graph_rows"])
                    windows.add_metric([model, "eager"], values.get("eager_rows", 0))
                if "mixed_passes" in values:
                    mixed.add_metric([model], values["mixed_passes"])
        yield from (slots, used, capacity, speaking, paced, session_cpu, frames, steps, rows, busy, loop, prefills,
                    waited, prefill_time, windows, mixed)


_LOOP_PHASES = ("idle", "host", "device_wait")
