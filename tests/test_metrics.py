"""What an operator scrapes from /metrics: turn latencies, counters by reason, live gauges.

The turn meter is fed events by hand (it is sans-I/O); the end-to-end test runs a real server,
speaks to it with speech synthesized by the embedded Piper voice, interrupts the reply, and reads
the histograms back from /metrics.
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
import websockets
from prometheus_client.parser import text_string_to_metric_families

from realtime_omni.engines.registry import ModelRegistry
from realtime_omni.metrics import Metrics
from realtime_omni.session.manager import SessionManager
from realtime_omni.session.meter import TurnMeter

TIMEOUT = 60.0


def _value(metrics: Metrics, name: str, **labels: str) -> float:
    value = metrics.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


def _created(rid: str) -> dict:
    return {"type": "response.created", "response": {"id": rid}}


def _audio(rid: str) -> dict:
    return {"type": "response.output_audio.delta", "response_id": rid}


def _done(rid: str, status: str) -> dict:
    return {"type": "response.done", "response": {"id": rid, "status": status}}


def test_turn_meter_places_speech_by_when_its_audio_arrived():
    metrics = Metrics()
    meter = TurnMeter(metrics)
    # audio arrives in 20 ms chunks at t = 0.02 .. 2.00 (stream ms 20 .. 2000)
    for i in range(1, 101):
        meter.audio_arrived(20.0 * i, 0.02 * i)
    # the VAD decides at t = 2.1 that speech ended at stream 1500 ms (arrived at t = 1.5)
    meter.handed_over({"type": "input_audio_buffer.speech_stopped", "audio_end_ms": 1500}, 2.1)
    meter.handed_over(_created("r1"), 2.2)
    meter.handed_over(_audio("r1"), 2.5)
    meter.handed_over(_audio("r1"), 2.6)  # only the first audio counts
    assert _value(metrics, "realtime_omni_time_to_first_audio_seconds_count") == 1
    assert _value(metrics, "realtime_omni_time_to_first_audio_seconds_sum") == pytest.approx(0.3)
    assert _value(metrics, "realtime_omni_speech_end_to_first_audio_seconds_sum") == pytest.approx(1.0)
    # the user speaks over the reply: speech from stream 1900 ms (arrived at t = 1.9)...
    meter.handed_over({"type": "input_audio_buffer.speech_started", "audio_start_ms": 1900}, 2.7)
    meter.handed_over(_done("r1", "cancelled"), 2.75)
    # ...the last audio of the reply went out at t = 2.6: 0.7 s of barge-in; cancelled 0.85 s in
    assert _value(metrics, "realtime_omni_barge_in_seconds_sum") == pytest.approx(0.7)
    assert _value(metrics, "realtime_omni_barge_in_cancel_seconds_sum") == pytest.approx(0.85)
    assert _value(metrics, "realtime_omni_responses_total", status="cancelled") == 1
    # a response made without a spoken turn has no speech-end latency
    meter.handed_over(_created("r2"), 3.0)
    meter.handed_over(_audio("r2"), 3.1)
    meter.handed_over(_done("r2", "completed"), 3.2)
    meter.handed_over({"type": "error", "error": {"code": "invalid_json"}}, 3.3)
    assert _value(metrics, "realtime_omni_time_to_first_audio_seconds_count") == 2
    assert _value(metrics, "realtime_omni_speech_end_to_first_audio_seconds_count") == 1
    assert _value(metrics, "realtime_omni_barge_in_seconds_count") == 1
    assert _value(metrics, "realtime_omni_errors_total", code="invalid_json") == 1


def _families(text: str) -> dict:
    return {f.name: f for f in text_string_to_metric_families(text)}


def _sample(families: dict, family: str, sample: str, **labels: str) -> float:
    return sum(s.value for s in families[family].samples
               if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items()))


async def _recv(ws) -> dict:
    return json.loads(await asyncio.wait_for(ws.recv(), TIMEOUT))


async def _send_pcm(ws, pcm: np.ndarray, realtime: bool) -> None:
    step = 480  # 20 ms at 24 kHz
    start = time.monotonic()
    for index, offset in enumerate(range(0, len(pcm), step)):
        data = base64.b64encode(pcm[offset:offset + step].astype("<i2").tobytes()).decode()
        await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": data}))
        delay = start + (index + 1) * 0.02 - time.monotonic()
        if realtime and delay > 0:
            await asyncio.sleep(delay)


@pytest.mark.asyncio(loop_scope="session")
async def test_a_spoken_turn_and_a_barge_in_show_in_the_latency_histograms(server, say):
    async with httpx.AsyncClient() as http:
        before = _families((await http.get(f"{server.http}/metrics", timeout=10)).text)
    silence = np.zeros(24_000, np.int16)
    async with websockets.connect(f"{server.ws}/v1/realtime?model=embedded", max_size=None) as ws:
        assert (await _recv(ws))["type"] == "session.created"
        await ws.send(json.dumps({"type": "session.update", "session": {"type": "realtime", "max_output_tokens": 120}}))
        while (await _recv(ws))["type"] != "session.updated":
            pass
        # a spoken question, answered with audio
        await _send_pcm(ws, np.concatenate([silence[:4800], say("Tell me a long story about a dragon."), silence]),
                        realtime=False)
        while (await _recv(ws))["type"] != "response.output_audio.delta":
            pass
        # spoken over the reply: the server stops it
        sender = asyncio.create_task(_send_pcm(ws, np.concatenate([say("Stop, wait a moment."), silence]), True))
        statuses = []
        while "cancelled" not in statuses:
            event = await _recv(ws)
            if event["type"] == "response.done":
                statuses.append(event["response"]["status"])
        # the interruption is answered in full (short, so the paced reply ends soon)
        await ws.send(json.dumps({"type": "session.update", "session": {"type": "realtime", "max_output_tokens": 12}}))
        while len(statuses) < 2:
            event = await _recv(ws)
            if event["type"] == "response.done":
                statuses.append(event["response"]["status"])
        assert statuses[1] in ("completed", "incomplete"), statuses
        await sender
        async with httpx.AsyncClient() as http:
            during = (await http.get(f"{server.http}/metrics", timeout=10)).text
    after = _families(during)
    assert "# TYPE realtime_omni_time_to_first_audio_seconds histogram" in during
    assert "# TYPE realtime_omni_responses_total counter" in during
    for family in ("realtime_omni_time_to_first_audio_seconds", "realtime_omni_speech_end_to_first_audio_seconds",
                   "realtime_omni_barge_in_seconds", "realtime_omni_barge_in_cancel_seconds",
                   "realtime_omni_response_real_time_factor"):
        count = _sample(after, family, family + "_count") - _sample(before, family, family + "_count")
        assert count >= 1, family
        if family != "realtime_omni_barge_in_seconds":  # 0 is honest there: no audio may have followed
            assert _sample(after, family, family + "_sum") > _sample(before, family, family + "_sum"), family
    for stage in ("thinker", "talker"):
        name = "realtime_omni_stage_step_seconds"
        assert _sample(after, name, name + "_count", stage=stage) > _sample(before, name, name + "_count", stage=stage)
    cancelled = _sample(after, "realtime_omni_responses", "realtime_omni_responses_total", status="cancelled")
    assert cancelled >= 1 + _sample(before, "realtime_omni_responses", "realtime_omni_responses_total", status="cancelled")
    # the session was live when scraped, on the websocket transport
    assert _sample(after, "realtime_omni_sessions_active", "realtime_omni_sessions_active", transport="websocket") >= 1
    assert _sample(after, "realtime_omni_sessions_opened", "realtime_omni_sessions_opened_total", transport="websocket") >= 1
    assert "realtime_omni_queue_depth" in after


def test_the_grafana_dashboard_queries_only_metrics_the_server_exports():
    registry = ModelRegistry()
    registry.load(["echo"])
    manager = SessionManager(registry)
    try:
        stats = {"tiny": {"slots": {"total": 4, "in_use": 1, "speaking": 1, "paced": 0}, "thinker": {
            "steps": 3, "rows": 5, "busy_s": 0.1, "idle_s": 0.2, "host_s": 0.05, "device_wait_s": 0.05}}}
        text, _ = Metrics().render(manager, stats)
    finally:
        asyncio.run(manager.shutdown())
        registry.close()
    exported = set()
    for family in text_string_to_metric_families(text.decode()):
        suffixes = {"histogram": ("_bucket", "_count", "_sum"), "counter": ("_total",)}.get(family.type, ("",))
        exported.update(family.name + suffix for suffix in suffixes)
    dashboard = json.loads((Path(__file__).parent.parent / "docs" / "grafana" / "realtime-omni.json").read_text())
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel.get("targets", [])]
    assert len(exprs) >= 15
    queried = {name for expr in exprs for name in re.findall(r"\brealtime_omni_[a-z_]+", expr)}
    assert queried and queried <= exported, queried - exported
    # every latency histogram an operator needs has a panel
    for name in ("time_to_first_audio_seconds", "speech_end_to_first_audio_seconds", "barge_in_seconds",
                 "stage_step_seconds", "response_real_time_factor"):
        assert f"realtime_omni_{name}_bucket" in queried, name


def test_lost_connections_resumes_and_close_reasons_are_counted(registry):
    from .server import ServerThread

    def scrape(srv) -> dict:
        return _families(httpx.get(f"{srv.http}/metrics", timeout=10).text)

    async def scenario(srv) -> None:
        ws = await websockets.connect(f"{srv.ws}/v1/realtime?model=echo")
        token = (await _recv(ws))["session"]["resume_token"]
        ws.transport.abort()  # a network failure, not a goodbye: the session waits for a resume
        deadline = time.monotonic() + 10
        while not any(r.detached_since for r in srv.manager.sessions.values()):
            assert time.monotonic() < deadline, "the server did not notice the lost connection"
            await asyncio.sleep(0.05)
        async with websockets.connect(f"{srv.ws}/v1/realtime?resume_token={token}&last_sequence_number=1") as again:
            assert (await _recv(again))["type"] == "session.resumed"
            await again.send("{not json")
            while (await _recv(again))["type"] != "error":
                pass
        deadline = time.monotonic() + 10
        while srv.manager.sessions:
            assert time.monotonic() < deadline, "the session did not close"
            await asyncio.sleep(0.05)

    with ServerThread(registry, resume_grace_s=5.0) as srv:
        asyncio.run(scenario(srv))
        after = scrape(srv)
    labels = {"transport": "websocket"}
    assert _sample(after, "realtime_omni_session_disconnects", "realtime_omni_session_disconnects_total", **labels) == 1
    assert _sample(after, "realtime_omni_session_resumes", "realtime_omni_session_resumes_total", **labels) == 1
    assert _sample(after, "realtime_omni_sessions_opened", "realtime_omni_sessions_opened_total", **labels) == 1
    assert _sample(after, "realtime_omni_sessions_closed", "realtime_omni_sessions_closed_total", reason="client_closed",
                   **labels) == 1
    assert _sample(after, "realtime_omni_errors", "realtime_omni_errors_total", code="invalid_json") == 1
    assert _sample(after, "realtime_omni_sessions_active", "realtime_omni_sessions_active") == 0
