"""WebRTC transport end to end: a real aiortc client against a real server over loopback.

Nothing is mocked: the server runs uvicorn in a thread with the real session core and models;
the client is aiortc with an audio track and the ``oai-events`` data channel, exactly as a
browser would connect. Only host candidates on 127.0.0.1 are used (no STUN).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import subprocess
import sys
import textwrap
import time

import av
import httpx
import numpy as np
import pytest
from aiortc import RTCPeerConnection

from realtime_omni.engines.registry import ModelRegistry
from realtime_omni_bench.webrtc_client import WebRTCClient

from ..helpers import assert_valid_server_event
from ..server import ServerThread

FAST = {"webrtc_peer_timeout_s": 2.0, "webrtc_datachannel_timeout_s": 1.5, "webrtc_connect_timeout_s": 5.0,
        "resume_grace_s": 1.0}
NO_VAD = {"type": "realtime", "audio": {"input": {"turn_detection": None}}}


@contextlib.contextmanager
def own_echo_server(**settings):
    """A server of the echo model with these settings (on top of FAST), for one test or module."""
    registry = ModelRegistry()
    registry.load(["echo"])
    try:
        with ServerThread(registry, models=["echo"], **{**FAST, **settings}) as srv:
            yield srv
    finally:
        registry.close()


@pytest.fixture(scope="module")
def echo_server():
    with own_echo_server() as srv:
        yield srv


def the_peer(server):
    """The server's one call (tests that open a single call look at its peer)."""
    (peer,) = server.app.state.webrtc_calls.calls.values()
    return peer


def live_calls(server) -> int:
    return len(server.app.state.webrtc_calls.calls) if hasattr(server.app.state, "webrtc_calls") else 0


def open_peer_connections() -> int:
    """RTCPeerConnections in this process (server's and clients') not yet closed."""
    gc.collect()
    return sum(1 for o in gc.get_objects() if isinstance(o, RTCPeerConnection) and o.connectionState != "closed")


async def wait_until(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.05)


def chirp(seconds: float = 1.0, rate: int = 48_000) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    f0, f1 = 300.0, 3000.0
    phase = 2 * np.pi * (f0 * t + (f1 - f0) * t * t / (2 * seconds))
    envelope = np.minimum(1.0, np.minimum(t, seconds - t) / 0.02)
    return (np.sin(phase) * envelope * 9000).astype(np.int16)


def best_alignment(received: np.ndarray, sent: np.ndarray) -> tuple[int, float]:
    """(lag in samples, normalised correlation) of ``sent`` inside ``received`` (FFT)."""
    n = len(received) + len(sent)
    size = 1 << (n - 1).bit_length()
    corr = np.fft.irfft(np.fft.rfft(received.astype(np.float64), size) * np.conj(np.fft.rfft(sent.astype(np.float64), size)), size)
    corr = corr[: len(received) - len(sent) + 1]
    lag = int(np.argmax(np.abs(corr)))
    window = received[lag : lag + len(sent)].astype(np.float64)
    return lag, float(abs(corr[lag]) / (np.linalg.norm(sent) * np.linalg.norm(window) + 1e-9))


def assert_echo(got: np.ndarray, sent: np.ndarray, *, peak: float, share: float) -> None:
    """``got`` holds ``sent`` 0-400 ms later, judged in 100 ms pieces: client and server share
    one process (its GIL, its garbage collector) here, so a pause can blur a few pieces or skip a
    frame and shift the rest; an echo that is not what was sent matches none of them."""
    pieces = [best_alignment(got, sent[i : i + 4800]) + (i,) for i in range(0, len(sent) - 4800 + 1, 4800)]
    peaks = sorted(p for _, p, _ in pieces)
    assert sum(p > peak for p in peaks) >= share * len(peaks), f"echo does not match what was sent (correlations {peaks})"
    delays = sorted((lag - i) / 48 for lag, p, i in pieces if p > peak)
    # a skipped frame moves the later pieces earlier by its 20 ms (a few at most)
    assert 0 < delays[len(delays) // 2] < 400 and delays[0] > -100, f"echo delays {delays} ms"


def rms(pcm: np.ndarray) -> float:
    return float(np.sqrt(np.mean(pcm.astype(np.float64) ** 2))) if len(pcm) else 0.0


# ---------------------------------------------------------------------------------- (a) echo
async def test_echo_audio_round_trip_and_events(echo_server) -> None:
    client = WebRTCClient(echo_server.http, model="echo", session=NO_VAD)
    await client.connect()
    try:
        created = await client.wait_for("session.created")
        assert "echo" in created["session"]["capabilities"]
        updated = await client.wait_for("session.updated")  # the multipart 'session' was applied first
        assert updated["session"]["audio"]["input"]["turn_detection"] is None
        assert updated["session"]["audio"]["input"]["format"] == {"type": "audio/pcm", "rate": 24000}

        sent = chirp(1.0)
        await asyncio.sleep(1.0)  # let both ends settle: codecs, jitter buffers, the echo stream
        started = await client.wait_for("output_audio_buffer.started", timeout=5)
        peer = the_peer(echo_server)
        played_before = peer.runner.core.ledger.sent_ms(started["response_id"])
        t0 = t_started = time.monotonic()
        client.source.play(sent)
        await asyncio.sleep(1.6)
        got = client.audio_since(t0)

        # the audio came back on the server's track: same level, and the same signal
        assert rms(got) > 0.5 * rms(sent), (rms(got), rms(sent))
        assert_echo(got, sent, peak=0.9, share=0.4)

        # events on oai-events: the GA flow, validated by the SDK's models; no audio deltas on it
        types = [e["type"] for e in client.events]
        assert "response.created" in types and started["response_id"]
        assert "response.output_audio.delta" not in types
        for event in client.events:
            assert_valid_server_event(event)

        # playback truth: the track reported what it played (the echo of silence included) into
        # the session's ledger, frame by frame, in step with the wall clock
        elapsed = 1000 * (time.monotonic() - t_started)
        played = peer.runner.core.ledger.sent_ms(started["response_id"]) - played_before
        # never ahead of the wall clock; behind it only by underruns (a loaded 2-core machine)
        assert 0.5 * elapsed < played < elapsed + 100, (played, elapsed)
        # the track plays the audio: the resume journal keeps none of it (only its numbers)
        assert peer.audio_deltas > 50 and len(peer.runner.journal) < 30, (peer.audio_deltas, len(peer.runner.journal))

        # a client event goes through the same session core and is answered on the channel
        client.send({"type": "output_audio_buffer.clear", "event_id": "evt_clear"})
        cleared = await client.wait_for("output_audio_buffer.cleared")
        assert cleared["response_id"] == started["response_id"]
        client.send({"type": "no.such.event"})
        error = await client.wait_for("error")
        assert error["error"]["code"] == "unknown_event_type"
    finally:
        await client.close()
    await wait_until(lambda: live_calls(echo_server) == 0 and not echo_server.manager.sessions)


async def test_forty_ms_packets_carry_the_same_echo_in_half_the_packets() -> None:
    sizes: list[int] = []
    with own_echo_server(webrtc_audio_packet_ms=40) as server:
        client = WebRTCClient(server.http, model="echo", session=NO_VAD,
                              on_frame_received=lambda at, pcm: sizes.append(len(pcm)))
        await client.connect()
        try:
            await client.wait_for("output_audio_buffer.started", timeout=5)
            await asyncio.sleep(0.5)
            sent = chirp(1.0)
            t0 = time.monotonic()
            client.source.play(sent)
            await asyncio.sleep(1.6)
            got = client.audio_since(t0)
            assert rms(got) > 0.5 * rms(sent), (rms(got), rms(sent))
            assert_echo(got, sent, peak=0.8, share=0.4)
            assert the_peer(server).track.packet_ms == 40
        finally:
            await client.close()
    # each received packet is 40 ms: 1920 samples once decoded at 48 kHz
    assert len(sizes) > 20 and set(sizes[5:]) == {1920}, sorted(set(sizes))


def test_packet_length_follows_the_call_count_with_hysteresis() -> None:
    from realtime_omni.transports.webrtc.pacing import PacketLength

    live = [0]
    auto = PacketLength(lambda: live[0], busy_calls=8)
    seen = []
    for calls in (1, 7, 8, 12, 7, 6, 5, 8):
        live[0] = calls
        seen.append(auto())
    assert seen == [20, 20, 40, 40, 40, 40, 20, 40]  # 40 from 8 calls, 20 again below 6
    assert PacketLength(lambda: 100, fixed=20)() == 20


async def test_auto_packets_grow_when_the_server_gets_busy_and_the_echo_goes_on() -> None:
    sizes: list[int] = []
    with own_echo_server(webrtc_audio_busy_calls=2) as server:
        first = WebRTCClient(server.http, model="echo", session=NO_VAD,
                             on_frame_received=lambda at, pcm: sizes.append(len(pcm)))
        second = WebRTCClient(server.http, model="echo", session=NO_VAD)
        await first.connect()
        try:
            await first.wait_for("output_audio_buffer.started", timeout=5)
            await asyncio.sleep(0.5)
            peer = the_peer(server)
            assert peer.track.packet_ms == 20 and set(sizes[-10:]) == {960}  # one call: 20 ms
            await second.connect()  # two calls: busy
            await wait_until(lambda: peer.track.packet_ms == 40, timeout=5)  # at its next silence
            await asyncio.sleep(0.5)
            assert set(sizes[-5:]) == {1920}
            sent = chirp(1.0)
            t0 = time.monotonic()
            first.source.play(sent)
            await asyncio.sleep(1.6)
            assert_echo(first.audio_since(t0), sent, peak=0.8, share=0.4)
            listed = httpx.get(f"{server.http}/v1/realtime/calls", timeout=5).json()["data"]
            assert sorted(c["audio_packet_ms"] for c in listed) == [40, 40]
        finally:
            await second.close()
            await first.close()


def test_an_opus_packet_of_any_other_length_is_refused() -> None:
    from realtime_omni.config_sources import SettingsError, load_settings

    assert load_settings(environ={"REALTIME_OMNI_WEBRTC_AUDIO_PACKET_MS": "60"}).transports.webrtc.audio_packet_ms == 60
    assert load_settings(environ={}).transports.webrtc.audio_packet_ms == "auto"
    for hostile in ("30", "0", "-20", "1e9", "forty", "AUTO", "auto "):
        with pytest.raises(SettingsError, match="audio_packet_ms"):
            load_settings(environ={"REALTIME_OMNI_WEBRTC_AUDIO_PACKET_MS": hostile})


async def test_second_data_channel_is_refused_with_an_error_event(echo_server) -> None:
    client = WebRTCClient(echo_server.http, model="echo", session=NO_VAD)
    await client.connect()
    try:
        await client.wait_for("session.updated")
        extra = client.pc.createDataChannel("oai-events")  # a second one with the same label
        error = await client.wait_for("error", timeout=5)
        assert error["error"]["code"] == "unsupported_data_channel"
        await wait_until(lambda: extra.readyState == "closed", 5)
        # the call goes on
        client.source.play(chirp(0.3))
        await client.wait_for("output_audio_buffer.started", timeout=5)
    finally:
        await client.close()


async def test_a_data_channel_flood_is_bounded_and_the_call_goes_on(echo_server) -> None:
    """Hostile input on ``oai-events``: hundreds of events at once, broken JSON, deep nesting and
    binary frames. The server refuses what it cannot take with error events, its inbox stays
    bounded, and the call answers the next valid event."""
    client = WebRTCClient(echo_server.http, model="echo", session=NO_VAD)
    await client.connect()
    try:
        await client.wait_for("session.updated")
        peer = the_peer(echo_server)
        before = peer.events_received
        bound = peer._inbox.maxsize
        deepest = 0
        for i in range(600):
            client.send({"type": "input_audio_buffer.clear", "event_id": f"evt_{i}"})
            if i % 200 == 0:
                client.channel.send("{not json")
                client.channel.send("[" * 100_000 + "]" * 100_000)
                client.channel.send(b"\x00\xff binary")
            if i % 100 == 0:
                await asyncio.sleep(0)  # let the server's loop run, as a network would
                deepest = max(deepest, peer._inbox.qsize())
        await wait_until(lambda: peer.events_received - before >= 600, 60)
        assert deepest <= bound
        codes = {e["error"]["code"] for e in client.events if e["type"] == "error"}
        assert {"invalid_json", "rate_limit_exceeded"} & codes, codes
        for event in client.events:
            assert_valid_server_event(event)
        # the session is alive and still answers, in order, after the flood
        client.send({"type": "session.update", "event_id": "evt_after",
                     "session": {"type": "realtime", "instructions": "still here"}})
        updated = await client.wait_for("session.updated", timeout=90,
                                        where=lambda e: e["session"].get("instructions") == "still here")
        assert updated["session"]["instructions"] == "still here"
        assert live_calls(echo_server) == 1 and peer.pc.connectionState == "connected"
    finally:
        await client.close()
    await wait_until(lambda: live_calls(echo_server) == 0 and not echo_server.manager.sessions)


async def test_lost_packets_keep_the_callers_timeline(echo_server) -> None:
    """10 % of the caller's RTP packets are dropped on the way (in the test peer, before they
    reach the network): the server fills each hole with silence, so the audio the session
    receives lasts as long as what was sent, and the call goes on."""
    import random

    from aiortc.rtp import is_rtcp

    client = WebRTCClient(echo_server.http, model="echo", session=NO_VAD)
    await client.connect()
    try:
        await client.wait_for("session.updated")
        peer = the_peer(echo_server)
        decoder = peer.decoder
        assert decoder is not None
        transport = client.pc.getSenders()[0].transport
        send_rtp = transport._send_rtp
        rng = random.Random(7)
        counts = {"sent": 0, "dropped": 0, "lossy": False}

        async def counted(data: bytes) -> None:
            if is_rtcp(data):
                return await send_rtp(data)
            counts["sent"] += 1
            if counts["lossy"] and rng.random() < 0.1:
                counts["dropped"] += 1
                return None
            return await send_rtp(data)

        transport._send_rtp = counted
        await asyncio.sleep(0.3)
        start_samples = decoder.decoded_samples + decoder.concealed_samples
        start_sent = counts["sent"]
        counts["lossy"] = True
        client.source.play(chirp(2.0))
        await asyncio.sleep(2.5)
        counts["lossy"] = False
        sent = counts["sent"] - start_sent
        await asyncio.sleep(0.3)  # the packets still in flight arrive; nothing more is counted
        transport._send_rtp = send_rtp
        got = decoder.decoded_samples + decoder.concealed_samples - start_samples
        assert counts["sent"] - start_sent >= sent  # (packets sent while settling, below)
        got -= (counts["sent"] - start_sent - sent) * 960
        assert counts["dropped"] >= 0.05 * sent, counts
        assert decoder.concealed_samples >= 0.8 * counts["dropped"] * 960
        # the timeline the session sees matches the caller's (within 3 packets in flight)
        assert abs(got - sent * 960) <= 3 * 960, (got, sent * 960, counts)
        client.send({"type": "output_audio_buffer.clear"})
        await client.wait_for("output_audio_buffer.cleared", timeout=10)
    finally:
        await client.close()


def test_a_hostile_timestamp_jump_is_not_filled() -> None:
    """Silence fills at most 200 ms: a peer that jumps its RTP timestamps by hours gets no
    hours of audio; the decoder resynchronises instead."""
    from types import SimpleNamespace

    from realtime_omni.transports.webrtc.incoming import InlineAudioDecoder

    frames: asyncio.Queue = asyncio.Queue()
    decoder = InlineAudioDecoder(frames)
    codec = SimpleNamespace(name="opus")
    encoder = av.CodecContext.create("libopus", "w")
    encoder.sample_rate, encoder.layout, encoder.format = 48_000, "mono", "s16"
    pcm = av.AudioFrame.from_ndarray(np.zeros((1, 960), np.int16), format="s16", layout="mono")
    pcm.sample_rate = 48_000
    payload = bytes(next(iter(encoder.encode(pcm))))
    for timestamp in (0, 960, 960 + 3 * 960, 2**31):  # in order, a 2-packet hole, a jump by hours
        decoder.put((codec, SimpleNamespace(data=payload, timestamp=timestamp)))
    assert decoder.concealed_samples == 2 * 960
    assert decoder.decoded_samples == 4 * 960


def test_a_packet_without_payload_does_not_deafen_the_call() -> None:
    """An RTP packet with no payload (padding only) would tell the Opus decoder the stream has
    ended, after which it decodes nothing; it is skipped, and the packets after it are heard."""
    from types import SimpleNamespace

    from realtime_omni.transports.webrtc.incoming import InlineAudioDecoder

    frames: asyncio.Queue = asyncio.Queue()
    decoder = InlineAudioDecoder(frames)
    codec = SimpleNamespace(name="opus")
    encoder = av.CodecContext.create("libopus", "w")
    encoder.sample_rate, encoder.layout, encoder.format = 48_000, "mono", "s16"
    tone = (8000 * np.sin(2 * np.pi * 440 * np.arange(960 * 6) / 48_000)).astype(np.int16)
    payloads = []
    for k in range(6):
        pcm = av.AudioFrame.from_ndarray(tone[None, k * 960 : (k + 1) * 960], format="s16", layout="mono")
        pcm.sample_rate, pcm.pts = 48_000, k * 960
        payloads += [bytes(p) for p in encoder.encode(pcm)]
    decoder.put((codec, SimpleNamespace(data=payloads[0], timestamp=0)))
    decoder.put((codec, SimpleNamespace(data=b"", timestamp=960)))  # the empty one
    for k, payload in enumerate(payloads[1:], start=1):
        decoder.put((codec, SimpleNamespace(data=payload, timestamp=k * 960)))
    heard = []
    while not frames.empty():
        heard.append(frames.get_nowait().to_ndarray().reshape(-1))
    audio = np.concatenate(heard)
    assert len(audio) >= 5 * 960 and np.abs(audio[-960:]).max() > 1000  # the tone after it is heard


# ---------------------------------------------------------------------------------- (c) leaks
async def test_hangup_and_peer_loss_release_everything(echo_server) -> None:
    base_pcs = open_peer_connections()
    # 1. hang-up by DELETE
    client = WebRTCClient(echo_server.http, model="echo", session=NO_VAD)
    await client.connect()
    await client.wait_for("session.created")
    assert live_calls(echo_server) == 1 and len(echo_server.manager.sessions) == 1
    assert open_peer_connections() == base_pcs + 2  # ours and the server's
    assert await client.hangup() == 200
    await wait_until(lambda: live_calls(echo_server) == 0 and not echo_server.manager.sessions)
    await client.close(hangup=False)
    await wait_until(lambda: open_peer_connections() == base_pcs)

    # 2. hang-up with POST .../hangup, then the call id is gone
    client = WebRTCClient(echo_server.http, model="echo", session=NO_VAD)
    await client.connect()
    async with httpx.AsyncClient() as http:
        r = await http.post(f"{echo_server.http}/v1/realtime/calls/{client.call_id}/hangup")
        assert r.status_code == 200
        r = await http.delete(f"{echo_server.http}/v1/realtime/calls/{client.call_id}")
        assert r.status_code == 404 and r.json()["error"]["code"] == "call_not_found"
    await client.close(hangup=False)
    await wait_until(lambda: live_calls(echo_server) == 0 and open_peer_connections() == base_pcs)

    # 3. the client just closes its peer connection (no HTTP hang-up)
    client = WebRTCClient(echo_server.http, model="echo", session=NO_VAD)
    await client.connect()
    await client.close(hangup=False)
    await wait_until(lambda: live_calls(echo_server) == 0 and not echo_server.manager.sessions)
    await wait_until(lambda: open_peer_connections() == base_pcs)

    # 4. abrupt loss: the client process is killed mid-call (no DTLS close, no hang-up)
    script = textwrap.dedent(f"""
        import asyncio, sys
        from realtime_omni_bench.webrtc_client import WebRTCClient
        async def main():
            c = WebRTCClient({echo_server.http!r}, model="echo", session={NO_VAD!r})
            await c.connect()
            print("connected", flush=True)
            await asyncio.sleep(60)
        asyncio.run(main())
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 30)
        assert line.strip() == "connected"
        await wait_until(lambda: live_calls(echo_server) == 1)
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()
    # the server notices the silence (webrtc_peer_timeout_s=2) and releases the call
    await wait_until(lambda: live_calls(echo_server) == 0 and not echo_server.manager.sessions, 15)
    await wait_until(lambda: open_peer_connections() == base_pcs)


async def test_a_lost_call_resumes_with_a_new_offer(echo_server) -> None:
    client = WebRTCClient(echo_server.http, model="echo", session=NO_VAD)
    await client.connect()
    created = await client.wait_for("session.created")
    token = created["session"]["resume_token"]
    client.send({"type": "session.update", "session": {"type": "realtime", "instructions": "remember me"}})
    updated = await client.wait_for("session.updated")
    session_id = created["session"]["id"]
    await client.close(hangup=False)  # the peer is lost, not hung up
    await wait_until(lambda: live_calls(echo_server) == 0)
    assert session_id in echo_server.manager.sessions  # kept for the grace period

    again = WebRTCClient(f"{echo_server.http}", model="echo")
    again.post_offer = _with_query(again.post_offer, echo_server.http,
                                   {"resume_token": token, "last_sequence_number": updated["sequence_number"]})
    await again.connect()
    resumed = await again.wait_for("session.resumed")
    assert resumed["session"]["id"] == session_id and resumed["session"]["instructions"] == "remember me"
    assert resumed["gap"] is False
    await again.close()
    await wait_until(lambda: not echo_server.manager.sessions)

    # a token nobody holds any more
    stale = WebRTCClient(echo_server.http, model="echo")
    stale.post_offer = _with_query(stale.post_offer, echo_server.http, {"resume_token": token})
    with pytest.raises(ConnectionError, match="resume_token_invalid"):
        await stale.connect()
    await stale.close(hangup=False)


async def test_a_resume_replays_more_than_a_thousand_missed_events_whole(echo_server) -> None:
    """A resume from the start of a long session replays every journaled event before anything
    else, session.resumed first: the replay waiting for the data channel is not cut to the
    buffer of events a call makes before its channel opens."""
    client = WebRTCClient(echo_server.http, model="echo", session=NO_VAD)
    await client.connect()
    created = await client.wait_for("session.created")
    for index in range(700):  # two events each (added, done)
        client.send({"type": "conversation.item.create", "item": {
            "type": "message", "role": "user", "id": f"item_{index}",
            "content": [{"type": "input_text", "text": f"note {index}"}]}})
    await client.wait_for("conversation.item.done", 60, where=lambda e: e["item"]["id"] == "item_699")
    await client.close(hangup=False)
    await wait_until(lambda: live_calls(echo_server) == 0)

    again = WebRTCClient(f"{echo_server.http}", model="echo")
    again.post_offer = _with_query(again.post_offer, echo_server.http,
                                   {"resume_token": created["session"]["resume_token"], "last_sequence_number": 0})
    await again.connect()
    last = await again.wait_for("conversation.item.done", 60, where=lambda e: e["item"]["id"] == "item_699")
    assert again.events[0]["type"] == "session.resumed" and again.events[0]["gap"] is False
    replayed = [e["item"]["id"] for e in again.events[: again.events.index(last) + 1]
                if e["type"] == "conversation.item.done"]
    assert replayed == [f"item_{index}" for index in range(700)]
    await again.close()
    await wait_until(lambda: not echo_server.manager.sessions)


async def _unanswerable_offer() -> str:
    """A well-formed offer (audio, data channel, ICE, DTLS) whose only audio codec nobody has."""
    from aiortc import RTCPeerConnection

    pc = RTCPeerConnection()
    try:
        pc.addTransceiver("audio")
        pc.createDataChannel("oai-events")
        await pc.setLocalDescription(await pc.createOffer())
        lines = []
        for line in pc.localDescription.sdp.splitlines():
            if line.startswith("m=audio"):
                lines += [" ".join(line.split(" ")[:3] + ["96"]), "a=rtpmap:96 bogus/48000/2"]
            elif not line.startswith(("a=rtpmap:", "a=fmtp:", "a=rtcp-fb:")):
                lines.append(line)
        return "\r\n".join(lines) + "\r\n"
    finally:
        await pc.close()


async def test_a_resume_whose_offer_cannot_be_answered_keeps_the_session(echo_server) -> None:
    """A resume offer the server cannot answer is refused (400 invalid_offer); the session stays
    resumable, and the client's next, good offer resumes it."""
    client = WebRTCClient(echo_server.http, model="echo", session=NO_VAD)
    await client.connect()
    created = await client.wait_for("session.created")
    token, session_id = created["session"]["resume_token"], created["session"]["id"]
    await client.close(hangup=False)
    await wait_until(lambda: live_calls(echo_server) == 0)

    async with httpx.AsyncClient(timeout=30) as http:
        refused = await http.post(f"{echo_server.http}/v1/realtime/calls", params={"resume_token": token},
                                  content=await _unanswerable_offer(), headers={"content-type": "application/sdp"})
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "invalid_offer"
    await wait_until(lambda: live_calls(echo_server) == 0)
    assert session_id in echo_server.manager.sessions

    again = WebRTCClient(f"{echo_server.http}", model="echo")
    again.post_offer = _with_query(again.post_offer, echo_server.http, {"resume_token": token})
    await again.connect()
    resumed = await again.wait_for("session.resumed")
    assert resumed["session"]["id"] == session_id
    await again.close()
    await wait_until(lambda: not echo_server.manager.sessions)


async def test_a_resume_while_the_first_call_lives_takes_the_session_over(echo_server) -> None:
    first = WebRTCClient(echo_server.http, model="echo", session=NO_VAD)
    await first.connect()
    created = await first.wait_for("session.created")
    await first.wait_for("session.updated")
    again = WebRTCClient(echo_server.http, model="echo")
    again.post_offer = _with_query(again.post_offer, echo_server.http,
                                   {"resume_token": created["session"]["resume_token"]})
    try:
        await again.connect()
        resumed = await again.wait_for("session.resumed")
        assert resumed["session"]["id"] == created["session"]["id"]
        await wait_until(lambda: live_calls(echo_server) == 1)  # the first call was hung up
        # the session's events and audio now go to the new call (its writer, its track)
        again.send({"type": "no.such.event"})
        assert (await again.wait_for("error"))["error"]["code"] == "unknown_event_type"
        await asyncio.sleep(0.5)
        sent = chirp(1.0)
        t0 = time.monotonic()
        again.source.play(sent)
        await asyncio.sleep(1.5)
        assert rms(again.audio_since(t0)) > 0.5 * rms(sent)
    finally:
        await again.close()
        await first.close(hangup=False)
    await wait_until(lambda: live_calls(echo_server) == 0 and not echo_server.manager.sessions)


def _with_query(post_offer, base: str, params: dict):
    async def post(sdp: str):
        async with httpx.AsyncClient(timeout=30.0) as http:
            r = await http.post(f"{base}/v1/realtime/calls", params={"model": "echo", **params}, content=sdp,
                                headers={"Content-Type": "application/sdp"})
        return r.status_code, r.text, r.headers
    return post


# ---------------------------------------------------------------------------------- (d) bad input
async def test_bad_offers_get_clear_errors_and_the_server_goes_on(echo_server) -> None:
    url = f"{echo_server.http}/v1/realtime/calls"
    async with httpx.AsyncClient() as http:
        r = await http.post(url, content="hello", headers={"Content-Type": "application/sdp"})
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_sdp"
        r = await http.post(url, content="v=0\r\nthis is not sdp\r\n", headers={"Content-Type": "application/sdp"})
        assert r.status_code == 400 and r.json()["error"]["code"] in ("invalid_sdp", "missing_audio")
        r = await http.post(url, content="{}", headers={"Content-Type": "application/json"})
        assert r.status_code == 415 and r.json()["error"]["code"] == "unsupported_media_type"
        r = await http.delete(f"{url}/rtc_nosuchcall")
        assert r.status_code == 404 and r.json()["error"]["code"] == "call_not_found"
        r = await http.post(f"{url}/rtc_nosuchcall/hangup")
        assert r.status_code == 404 and r.json()["error"]["code"] == "call_not_found"

    async def offer_of(client: WebRTCClient) -> str:
        from realtime_omni.transports.webrtc.ice import gather_on

        offer = await client.pc.createOffer()
        await gather_on(client.pc, ["127.0.0.1"])
        await client.pc.setLocalDescription(offer)
        return client.pc.localDescription.sdp

    # no audio m-line (a data channel only)
    no_audio = WebRTCClient(echo_server.http, model="echo", audio=False)
    no_audio.pc.createDataChannel("oai-events")
    status, body, _ = await no_audio.post_offer(await offer_of(no_audio))
    assert status == 400 and '"missing_audio"' in body
    await no_audio.pc.close()

    # no data channel at all
    no_channel = WebRTCClient(echo_server.http, model="echo", data_channel=False)
    no_channel.pc.addTransceiver(no_channel.source, direction="sendrecv")
    status, body, _ = await no_channel.post_offer(await offer_of(no_channel))
    assert status == 400 and '"missing_data_channel"' in body
    await no_channel.pc.close()

    # unknown model, invalid session object
    bad_model = WebRTCClient(echo_server.http, model="nope")
    with pytest.raises(ConnectionError, match="model_not_found"):
        await bad_model.connect()
    await bad_model.pc.close()
    bad_session = WebRTCClient(echo_server.http, model="echo", session={"type": "realtime", "audio": {"input": {"format": {"type": "audio/flac"}}}})
    with pytest.raises(ConnectionError, match="400"):
        await bad_session.connect()
    await bad_session.pc.close()

    # a data channel with another label, and no oai-events: the call is dropped after a timeout
    wrong_label = WebRTCClient(echo_server.http, model="echo", data_channel=False)
    wrong_label.pc.createDataChannel("chat")
    await wrong_label.connect()
    await wait_until(lambda: live_calls(echo_server) == 0 and not echo_server.manager.sessions, 10)
    await wrong_label.close(hangup=False)

    assert live_calls(echo_server) == 0 and not echo_server.manager.sessions
    # the server still serves a good call
    good = WebRTCClient(echo_server.http, model="echo", session=NO_VAD)
    await good.connect()
    try:
        good.source.play(chirp(0.4))
        await good.wait_for("output_audio_buffer.started", timeout=5)
    finally:
        await good.close()
    async with httpx.AsyncClient() as http:
        r = await http.get(f"{echo_server.http}/v1/realtime/ice")
        assert r.status_code == 200 and r.json()["ice_servers"] == []


# ---------------------------------------------------------------------------------- (b) embedded
@pytest.fixture(scope="module")
def embedded_server(registry):
    with ServerThread(registry, **FAST) as srv:
        yield srv


async def test_spoken_turn_and_barge_in_over_webrtc(embedded_server, say) -> None:
    session = {"type": "realtime", "instructions": "You are a storyteller. Always answer with a long story.",
               "audio": {"input": {"transcription": {"model": "whisper-1"}}}}
    client = WebRTCClient(embedded_server.http, model="embedded", session=session)
    await client.connect()
    try:
        await client.wait_for("session.updated")
        await asyncio.sleep(0.3)
        start = len(client.events)
        client.source.play(say("Please tell me a long story about a brave little dragon.", 48_000))
        client.source.play(np.zeros(48_000, dtype=np.int16))
        transcript = await client.wait_for("conversation.item.input_audio_transcription.completed", 30, start)
        assert "dragon" in transcript["transcript"].lower(), transcript
        await client.wait_for("response.output_audio_transcript.delta", 30, start)
        started = await client.wait_for("output_audio_buffer.started", 30, start)
        t_started = time.monotonic()
        await asyncio.sleep(0.8)
        speaking = client.audio_since(t_started + 0.1)
        assert rms(speaking) > 300, f"no assistant audio on the track (rms {rms(speaking):.0f})"

        # barge-in: the user talks over the assistant; its audio must stop
        mark = len(client.events)
        client.source.play(say("Stop! Wait a moment, I have another question for you.", 48_000))
        cleared = await client.wait_for("output_audio_buffer.cleared", 15, mark)
        t_cleared = time.monotonic()
        assert cleared["response_id"] == started["response_id"]
        await client.wait_for("input_audio_buffer.speech_started", 1, mark)
        done = await client.wait_for("response.done", 5, mark, where=lambda e: e["response"]["id"] == started["response_id"])
        assert done["response"]["status"] in ("cancelled", "completed")
        await asyncio.sleep(0.5)
        after = client.audio_since(t_cleared + 0.15)
        assert rms(after) < 0.1 * rms(speaking), f"audio kept playing after the barge-in ({rms(after):.0f} vs {rms(speaking):.0f})"
        for event in client.events:
            assert_valid_server_event(event)
    finally:
        await client.close()
    await wait_until(lambda: live_calls(embedded_server) == 0)



# ---------------------------------------------------------------------------------- video
async def test_video_to_a_model_that_cannot_see_costs_nothing(echo_server) -> None:
    from aiortc.mediastreams import VideoStreamTrack

    client = WebRTCClient(echo_server.http, model="echo", session=NO_VAD)
    camera = VideoStreamTrack()
    client.pc.addTransceiver(camera, direction="sendonly")
    await client.connect()
    try:
        video = [m for m in client.pc.remoteDescription.sdp.split("m=")[1:] if m.startswith("video")]
        assert video and "a=inactive" in video[0], "the answer should refuse video for a model without image_in"
        client.source.play(chirp(0.3))
        await client.wait_for("output_audio_buffer.started", timeout=5)
        peer = the_peer(echo_server)
        assert peer.video.frames_seen == 0 and peer.video.latest() is None
    finally:
        camera.stop()
        await client.close()
    await wait_until(lambda: live_calls(echo_server) == 0)


def test_video_sampler_keeps_only_the_newest_sample() -> None:
    from av import VideoFrame

    from realtime_omni.transports.webrtc.video import VideoSampler

    sampler = VideoSampler(fps=1000.0)
    for shade in (10, 20, 30):
        sampler.offer(VideoFrame.from_ndarray(np.full((16, 16, 3), shade, np.uint8), format="rgb24"))
        time.sleep(0.002)
    image, _ = sampler.latest()
    assert image.shape == (16, 16, 3) and abs(int(image.mean()) - 30) <= 2  # newest wins, no queue
    assert sampler.latest() is None  # nothing new since
    slow = VideoSampler(fps=1.0)
    for _ in range(30):
        slow.offer(VideoFrame.from_ndarray(np.zeros((8, 8, 3), np.uint8), format="rgb24"))
    assert slow.frames_seen == 30 and slow.frames_sampled == 1
    blind = VideoSampler(enabled=False)
    blind.offer(VideoFrame.from_ndarray(np.zeros((8, 8, 3), np.uint8), format="rgb24"))
    assert blind.latest() is None


def test_opus_encoder_reuses_one_packet_for_silence_and_settles_after_sound() -> None:
    from av import CodecContext, Packet

    from realtime_omni.transports.webrtc.opus import OpusPacketEncoder
    from realtime_omni.transports.webrtc.pacing import CLOCK_FRAME, FRAME_SAMPLES

    encoder = OpusPacketEncoder()  # 24 kHz samples: the session's, encoded as they are
    tone = (np.sin(np.arange(FRAME_SAMPLES) / 5) * 8000).astype(np.int16)
    hiss = np.full(FRAME_SAMPLES, 3, np.int16)  # within SILENCE_PEAK: goes out as silence
    frames = [tone] * 5 + [hiss] * 20 + [tone] * 3 + [hiss] * 20
    packets = [encoder.encode(f, i * CLOCK_FRAME) for i, f in enumerate(frames)]
    assert all(p is not None for p in packets)
    assert [p.pts for p in packets] == [i * CLOCK_FRAME for i in range(len(frames))]  # RTP time is ours (48 kHz)
    # after each sound, silence goes through libopus only until its packet stops changing
    assert encoder.reused >= 20 and encoder.encoded + encoder.reused == len(frames)
    decoder = CodecContext.create("libopus", "r")
    decoder.format, decoder.layout, decoder.sample_rate = "s16", "mono", 48_000
    pcm = np.concatenate([f.to_ndarray().reshape(-1) for p in packets for f in decoder.decode(Packet(bytes(p)))])
    heard = pcm.reshape(len(frames), -1)
    assert heard.shape[1] == CLOCK_FRAME  # any Opus decoder plays it back at 48 kHz
    assert np.abs(heard[2]).max() > 4000  # the tone is audible
    assert np.abs(heard[15:25]).max() == 0 and np.abs(heard[40:]).max() == 0  # silence is silent


async def test_a_microphone_aiortc_decodes_reaches_the_session_through_the_same_sink() -> None:
    """Where the inline decoder cannot be put in, aiortc's own decoded track (here: its 8 kHz
    test tone track, silence) is read into the same MicrophoneSink: resampled, into the mailbox."""
    from aiortc.mediastreams import AudioStreamTrack

    from realtime_omni.session.manager import SessionManager
    from realtime_omni.transports.webrtc.incoming import AudioInputStats, MicrophoneSink, pump_audio_in

    registry = ModelRegistry()
    registry.load(["echo"])
    manager = SessionManager(registry)
    try:
        runner = manager.open("echo", transport="webrtc")
        stats = AudioInputStats()
        track = AudioStreamTrack()
        pump = asyncio.ensure_future(pump_audio_in(track, MicrophoneSink(runner, stats)))
        await asyncio.sleep(0.6)
        track.stop()
        await asyncio.wait_for(pump, 2)  # the track's end ends the pump
        assert stats.frames >= 20 and stats.dropped == 0
        echoed: list[float] = []  # the echo session says back what it got: its audio deltas, in ms

        def drain() -> float:
            while not isinstance(out := runner.next_outgoing_nowait(), str) and out is not None:
                if out.audio is not None:
                    echoed.append(out.audio.duration_ms)
            return sum(echoed)

        await wait_until(lambda: drain() >= 20 * stats.frames - 40, timeout=2)  # every frame arrived
        await runner.close()
        sink = MicrophoneSink(runner, stats)
        assert sink.closed  # a closed session takes nothing more
        before = stats.frames
        sink(await AudioStreamTrack().recv())
        assert stats.frames == before + 1 and runner.mailbox.empty()
    finally:
        await manager.shutdown()
        registry.close()


def test_immediate_jitter_buffer_releases_each_packet_on_arrival() -> None:
    from aiortc.rtp import RtpPacket

    from realtime_omni.transports.webrtc.incoming import ImmediateAudioJitterBuffer

    def packet(seq: int) -> RtpPacket:
        p = RtpPacket(sequence_number=seq, timestamp=seq * 960)
        p._data = bytes([seq % 256])  # type: ignore[attr-defined]
        return p

    buffer = ImmediateAudioJitterBuffer()
    released = [buffer.add(packet(seq))[1] for seq in (65534, 65535, 0, 2, 1, 2, 3)]
    got = [None if f is None else f.timestamp // 960 for f in released]
    assert got == [65534, 65535, 0, 2, None, None, 3]  # wraps; late and duplicate packets dropped


async def test_one_frame_clock_tick_wakes_every_track() -> None:
    from realtime_omni.transports.webrtc.pacing import frame_clock

    clock = frame_clock()
    assert frame_clock() is clock  # one per loop
    first, second = clock.next_tick(), clock.next_tick()
    assert first is second  # one future (and one timer) for all waiters
    start = time.monotonic()
    tick = clock.tick
    await first
    assert clock.tick == tick + 1 and time.monotonic() - start < 0.1


async def test_a_caller_who_asks_for_video_sees_a_face_that_speaks_the_reply(echo_server) -> None:
    """The avatar track: negotiated when the offer receives video, paced at its frame rate, its
    mouth open while the reply is heard and closed in silence (measured on the decoded frames)."""
    from aiortc.mediastreams import MediaStreamError

    client = WebRTCClient(echo_server.http, model="echo", session=NO_VAD)
    client.pc.addTransceiver("video", direction="recvonly")
    seen: list[tuple[float, float]] = []  # (arrival, share of the mouth box that is mouth)
    reader: list[asyncio.Task] = []

    async def read(track) -> None:
        peer = the_peer(echo_server)
        top, bottom, left, right = peer.avatar.mouth_box
        while True:
            try:
                frame = await track.recv()
            except MediaStreamError:
                return
            mouth = frame.to_ndarray(format="rgb24")[top:bottom, left:right]
            seen.append((time.monotonic(), float(np.mean(mouth[..., 1] < 110))))  # lips and inside: dark green

    client.pc.on("track", lambda track: reader.append(asyncio.ensure_future(read(track))) if track.kind == "video" else None)
    await client.connect()
    try:
        video = [m for m in client.pc.remoteDescription.sdp.split("m=")[1:] if m.startswith("video")]
        assert video and "a=sendonly" in video[0], "the answer should send video to a caller who receives it"
        await wait_until(lambda: len(seen) >= 3, timeout=15)  # in silence: a still picture, kept fresh
        quiet_start = seen[0][0]
        quiet = [share for _, share in seen]
        started = time.monotonic()
        client.source.play(chirp(1.5))
        await client.wait_for("output_audio_buffer.started", timeout=5)
        await asyncio.sleep(1.0)
        speaking = [share for t, share in seen if t > started]
        await wait_until(lambda: seen[-1][0] > started + 2.2, timeout=5)  # the chirp has played by now
        after = [share for t, share in seen if t > started + 2.2]
        assert max(quiet) < 0.25 and max(speaking) > 2 * max(quiet) + 0.15, (quiet, speaking)
        assert after and min(after) < 0.25, after
        # while the mouth moves, frames come at the frame rate (15 fps); a still picture is sent
        # again about once a second (a chirp's steady loudness holds the mouth still too)
        moving = [t for (t, share), (_, before) in zip(seen[1:], seen) if abs(share - before) > 0.01]
        gaps = sorted(b - a for a, b in zip(moving, moving[1:]) if b - a < 0.5)
        # (the 90th percentile: late in the suite this process's heap is large, and one pause of
        # its collector can hold a frame back; a track paced slower than ~10 fps fails either way)
        assert len(gaps) >= 5 and gaps[int(0.9 * (len(gaps) - 1))] < 0.2, moving
        still = [t for t, _ in seen if t < started]
        assert 0.5 <= (len(still) - 1) / (still[-1] - quiet_start) <= 2.5, still
    finally:
        for task in reader:
            task.cancel()
        await client.close()
    await wait_until(lambda: live_calls(echo_server) == 0)


async def test_no_video_is_sent_to_a_caller_who_does_not_ask(echo_server) -> None:
    client = WebRTCClient(echo_server.http, model="echo", session=NO_VAD)
    await client.connect()
    try:
        assert "m=video" not in client.pc.remoteDescription.sdp
        peer = the_peer(echo_server)
        assert peer.avatar is None
    finally:
        await client.close()
    await wait_until(lambda: live_calls(echo_server) == 0)
