"""The capacity benchmark end to end at a tiny level: it starts an echo server, runs 3 real-time
sessions for 2 s and writes its report (JSON, markdown, plot, index) into a temporary folder."""

from __future__ import annotations

import argparse
import json

from realtime_omni_bench import capacity
from realtime_omni_bench.cli import BENCHMARKS, add_bench_parser
from realtime_omni_bench.report import percentile, summarize, update_index


def test_capacity_bench_writes_a_sane_report(tmp_path):
    _report, paths = capacity.run([3], 2.0, out=tmp_path, name="cap-test", command="realtime-omni bench capacity --sessions 3 --seconds 2",
                                 log=lambda _msg: None)
    for kind in ("json", "md", "png", "index"):
        assert paths[kind].exists() and paths[kind].stat().st_size > 0, kind
    assert paths["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    data = json.loads(paths["json"].read_text())
    assert data["benchmark"] == "capacity"
    assert data["command"].startswith("realtime-omni bench capacity")
    assert data["machine"]["cores"] >= 1 and data["machine"]["python"]
    assert "commit" in data["git"] and "date" in data
    (level,) = data["summary"]["levels"]
    assert level["sessions"] == 3 and level["sessions_ok"] == 3 and level["sessions_failed"] == 0
    assert level["chunks_sent"] == 3 * 100  # 2 s of 20 ms chunks per session
    assert level["chunks_echoed"] == level["chunks_sent"]
    assert level["missing_pct"] == 0.0
    assert level["unmatched_deltas"] == 0 and level["duplicates"] == 0
    lat = level["latency_ms"]
    assert 0 < lat["p50"] <= lat["p99"] < 5000
    assert level["server_cpu_pct"] is not None and level["server_cpu_pct"] >= 0
    assert level["sessions_left_after_close"] == 0  # the server released every session
    (samples,) = data["samples"]["levels"]
    assert len(samples["latency_samples_ms"]) == 300 and min(samples["latency_samples_ms"]) > 0

    md = paths["md"].read_text()
    assert "| sessions |" in md and "cap-test.png" in md and "## Reproduce" in md
    index = paths["index"].read_text()
    assert "[Capacity" in index and "cap-test.md" in index


def test_index_lists_only_report_json(tmp_path):
    (tmp_path / "other.json").write_text('{"not": "a report"}')
    (tmp_path / "broken.json").write_text("{")
    text = update_index(tmp_path).read_text()
    assert "No reports yet" in text


def test_statistics():
    assert percentile([], 50) is None
    assert percentile([5.0], 99) == 5.0
    assert percentile([1, 2, 3, 4], 50) == 2.5
    s = summarize([1, 2, 3, None, 4])
    assert s["n"] == 4 and s["p50"] == 2.5 and s["min"] == 1 and s["max"] == 4


def test_cli_has_sub_benchmarks_and_a_registry():
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command")
    add_bench_parser(sub)
    args = parser.parse_args(["bench", "capacity", "--sessions", "3", "--seconds", "1", "--url", "http://127.0.0.1:1"])
    assert args.bench == "capacity" and args.sessions == "3" and args.seconds == 1.0 and args.server_cpus == "0"
    args = parser.parse_args(["bench", "latency", "--turns", "2", "--out", "x"])
    assert args.turns == 2 and args.out == "x" and args.url is None
    assert {"latency", "capacity"} <= set(BENCHMARKS)


def test_marker_round_trip():
    import base64

    for seq in (0, 1, 32767, 32768, 100_000):
        msg = capacity.append_message(seq)
        audio = json.loads(msg)["audio"]
        assert len(base64.b64decode(audio)) == capacity.CHUNK_SAMPLES * 2
        assert capacity.decode_marker(audio[:8]) == seq
        assert base64.b64decode(audio) == capacity.chunk_pcm(seq)
    assert capacity.decode_marker(base64.b64encode(b"\0" * 6).decode()) is None


def test_webrtc_impairment_drops_rtp_in_both_directions_and_passes_rtcp():
    import asyncio
    from types import SimpleNamespace

    from realtime_omni_bench.webrtc import impair

    passed = {"out": 0, "in": 0, "rtcp": 0}

    async def send_rtp(data: bytes) -> None:
        passed["rtcp" if data[1] == 200 else "out"] += 1

    async def handle_rtp(data: bytes, arrival_time_ms: int) -> None:
        passed["in"] += 1

    transport = SimpleNamespace(_send_rtp=send_rtp, _handle_rtp_data=handle_rtp)
    client = SimpleNamespace(pc=SimpleNamespace(getSenders=lambda: [SimpleNamespace(transport=transport)]))
    impair(client, 0.0, seed=1)
    assert transport._send_rtp is send_rtp  # no loss: nothing is wrapped
    impair(client, 0.1, seed=1)
    rtp, rtcp = bytes([0x80, 111]) + bytes(10), bytes([0x80, 200]) + bytes(6)  # Opus RTP, an RTCP sender report

    async def traffic() -> None:
        for _ in range(2000):
            await transport._send_rtp(rtp)
            await transport._handle_rtp_data(rtp, 0)
            await transport._send_rtp(rtcp)

    asyncio.run(traffic())
    assert passed["rtcp"] == 2000  # control packets always pass
    for direction in ("out", "in"):
        assert 1700 <= passed[direction] <= 1900, passed  # about 10 % dropped each way


def test_webrtc_jitter_delays_and_reorders_rtp_but_loses_none():
    import asyncio
    from types import SimpleNamespace

    from realtime_omni_bench.webrtc import impair

    arrived: list[int] = []

    async def send_rtp(data: bytes) -> None:
        arrived.append(int.from_bytes(data[2:4], "big"))

    async def handle_rtp(data: bytes, arrival_time_ms: int) -> None:
        pass

    transport = SimpleNamespace(_send_rtp=send_rtp, _handle_rtp_data=handle_rtp)
    client = SimpleNamespace(pc=SimpleNamespace(getSenders=lambda: [SimpleNamespace(transport=transport)]))
    impair(client, 0.0, seed=3, jitter_ms=30)

    async def traffic() -> None:
        for seq in range(100):
            await transport._send_rtp(bytes([0x80, 111]) + seq.to_bytes(2, "big") + bytes(8))
            await asyncio.sleep(0.002)
        await asyncio.sleep(0.1)  # the last delayed ones

    asyncio.run(traffic())
    assert sorted(arrived) == list(range(100))  # every packet arrives
    assert arrived != sorted(arrived)  # some overtook others
