"""The Twilio Media Streams bridge, end to end: a simulated carrier places real phone calls.

The carrier (:class:`realtime_omni_bench.telephony.SimulatedCarrier`) speaks Twilio's wire protocol
over a real socket to a real server running the embedded models: caller speech is synthesized by
Piper, resampled to 8 kHz and μ-law encoded, and sent in 20 ms frames at real-time pace; the reply
is played back at real-time pace, marks are echoed as Twilio does, and the reply is checked by
Whisper. Nothing is mocked.
"""

from __future__ import annotations

import asyncio
import base64
import json
import threading
import time
import xml.etree.ElementTree as ET
from typing import Any

import httpx
import pytest
from pydantic import SecretStr

from realtime_omni.audio import g711
from realtime_omni_bench.telephony import SimulatedCarrier, to_ulaw8k, trim_silence
from realtime_omni.transports.twilio import STREAM_PATH, VOICE_PATH, CarrierPlayback, set_call_hook
from realtime_omni.transports.twilio import messages as tw
from tests.helpers import assert_valid_server_event

on_session_loop = pytest.mark.asyncio(loop_scope="session")

QUESTION = "What is the capital of France?"
LONG_QUESTION = "Please tell me a long story about a brave dragon who lives in the mountains."
INTERRUPTION = "Stop, stop. Wait a moment please."
INSTRUCTIONS = "You are a friendly phone assistant."


# ------------------------------------------------------------------------------ helpers
class Calls:
    """The server's side of each call, via the bridge's call hook (runs on the server's loop)."""

    def __init__(self) -> None:
        self.calls: dict[str, Any] = {}
        self.events: dict[str, list[tuple[float, dict[str, Any]]]] = {}
        self.loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()

    def hook(self, call) -> None:  # type: ignore[no-untyped-def]
        self.loop = asyncio.get_running_loop()
        sid = call.stream_sid
        with self._lock:
            self.calls[sid] = call
            self.events[sid] = []

        def listen(event: dict[str, Any]) -> None:
            with self._lock:
                self.events[sid].append((time.monotonic(), event))

        call.add_listener(listen)

    def of(self, sid: str, kind: str) -> list[dict[str, Any]]:
        with self._lock:
            return [e for _, e in self.events.get(sid, []) if e["type"] == kind]

    def timed(self, sid: str, kind: str) -> list[tuple[float, dict[str, Any]]]:
        with self._lock:
            return [(t, e) for t, e in self.events.get(sid, []) if e["type"] == kind]

    async def wait_for(self, sid: str, kind: str, timeout: float = 60.0, count: int = 1) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = self.of(sid, kind)
            if len(found) >= count:
                return found
            await asyncio.sleep(0.02)
        seen = [e["type"] for _, e in self.events.get(sid, [])][-30:]
        raise AssertionError(f"no {kind} for {sid} within {timeout} s; saw {seen}")

    async def on_server(self, fn):  # type: ignore[no-untyped-def]
        """Run ``fn()`` on the server's event loop (where the session lives) and return its result."""
        assert self.loop is not None

        async def call():  # type: ignore[no-untyped-def]
            return fn()

        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(call(), self.loop))


@pytest.fixture
def calls(server):
    recorder = Calls()
    set_call_hook(server.app, recorder.hook)
    yield recorder
    set_call_hook(server.app, None)


@pytest.fixture(scope="module")
def ulaw(say):
    """Text → trimmed Piper speech as 8 kHz μ-law (what a phone line carries)."""
    cache: dict[str, bytes] = {}

    def _ulaw(text: str) -> bytes:
        if text not in cache:
            cache[text] = to_ulaw8k(trim_silence(say(text, 22_050)), 22_050)
        return cache[text]

    return _ulaw


def stream_url(server) -> str:  # type: ignore[no-untyped-def]
    return server.ws + STREAM_PATH


async def released(server, calls: Calls, stream_sid: str, timeout: float = 15.0) -> bool:  # type: ignore[no-untyped-def]
    """The call's session left the server's registry (everything it held was released)."""
    session_id = calls.calls[stream_sid].runner.core.id
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if session_id not in server.manager.sessions:
            return True
        await asyncio.sleep(0.05)
    return False


def words(text: str) -> list[str]:
    return [w for w in "".join(c.lower() if c.isalnum() else " " for c in text).split() if w]


# ------------------------------------------------------------------------------ sans-I/O pieces
def test_playback_frames_marks_and_clear():
    playback = CarrierPlayback()
    frames, name = playback.frames("resp_1", b"\x01" * 400)  # 2.5 frames: the half waits
    assert [len(f) for f in frames] == [160, 160] and name == "resp_1:40"
    frames, name = playback.frames("resp_1", b"\x02" * 100)  # 80 + 100 = 180: one frame
    assert [len(f) for f in frames] == [160] and frames[0] == b"\x01" * 80 + b"\x02" * 80 and name == "resp_1:60"
    frames, name = playback.frames("resp_1", b"", final=True)  # the 20-byte tail, padded
    assert frames == [b"\x02" * 20 + b"\xff" * 140] and name == "resp_1:80"
    assert playback.busy
    assert playback.on_mark("resp_1:40") == ("resp_1", 40.0)
    assert playback.on_mark("resp_1:40") is None  # echoed twice: ignored
    assert playback.on_mark("bogus") is None and playback.on_mark("resp_9:20") is None
    cut = playback.clear()
    assert set(cut) == {"resp_1"} and cut["resp_1"].heard_ms == 40.0 and not playback.busy
    # Twilio echoes the cleared marks at once: they were not heard.
    assert playback.on_mark("resp_1:60") is None and playback.on_mark("resp_1:80") is None
    assert playback.heard_ms("resp_1") == 40.0
    # heard never exceeds the real audio (padding excluded): 500 bytes = 62.5 ms
    assert playback.on_mark(playback.frames("resp_2", b"\x00" * 500, final=True)[1]) == ("resp_2", 62.5)


def test_playback_state_stays_bounded_when_the_carrier_never_echoes_a_mark():
    """A stream peer that ignores marks: a long call's marks and responses stay bounded, the
    newest marks are still known, and the call still counts as busy."""
    from realtime_omni.transports.twilio.playback import MAX_PENDING_MARKS, MAX_TRACKS

    playback = CarrierPlayback()
    for n in range(MAX_PENDING_MARKS + 500):  # one long reply, a mark per 20 ms frame
        playback.frames("resp_long", b"\x01" * 160)
    track = playback._tracks["resp_long"]
    assert len(track.pending) == MAX_PENDING_MARKS
    newest = f"resp_long:{(MAX_PENDING_MARKS + 500) * 20}"
    assert newest in track.pending and "resp_long:20" not in track.pending
    for n in range(3 * MAX_TRACKS):  # many replies, none echoed
        playback.frames(f"resp_{n}", b"\x01" * 160, final=True)
    assert len(playback._tracks) <= MAX_TRACKS + 1 and playback.busy
    assert playback.on_mark(f"resp_{3 * MAX_TRACKS - 1}:20") == (f"resp_{3 * MAX_TRACKS - 1}", 20.0)


def test_messages_parse_and_build():
    with pytest.raises(tw.TwilioMessageError):
        tw.parse("not json")
    with pytest.raises(tw.TwilioMessageError):
        tw.parse("[1, 2]")
    with pytest.raises(tw.TwilioMessageError):
        tw.parse(b'{"event": "media"}')
    with pytest.raises(tw.TwilioMessageError):
        tw.parse_media({"event": "media", "media": {"payload": "!!!notbase64"}})
    with pytest.raises(tw.TwilioMessageError):
        tw.parse_media({"event": "media", "media": {"payload": ""}})
    with pytest.raises(tw.TwilioMessageError):
        tw.parse_media({"event": "media", "media": {"payload": base64.b64encode(b"\0" * 20_000).decode()}})
    odd = {"event": "media", "media": {"payload": base64.b64encode(b"\x7f" * 161).decode()}}
    assert tw.parse_media(odd) == ("inbound", b"\x7f" * 161)
    assert tw.parse_dtmf({"event": "dtmf", "dtmf": {"digit": "#"}}) == "#"
    with pytest.raises(tw.TwilioMessageError):
        tw.parse_dtmf({"event": "dtmf", "dtmf": {"digit": "55"}})
    assert json.loads(tw.clear("MZ1")) == {"event": "clear", "streamSid": "MZ1"}
    assert json.loads(tw.mark("MZ1", "r:20")) == {"event": "mark", "streamSid": "MZ1", "mark": {"name": "r:20"}}
    media = json.loads(tw.media("MZ1", b"\xff" * 160))
    assert media["event"] == "media" and base64.b64decode(media["media"]["payload"]) == b"\xff" * 160
    assert tw.media_format_problem({"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1}) is None
    assert tw.media_format_problem({"encoding": "audio/x-l16", "sampleRate": 16000}) is not None
    # hostile values are a clear refusal (close 1003), never an exception (was: 1011 and a traceback)
    for bad in ("fast", None, [8000], {"hz": 8000}, "NaN", True, 1e400):
        assert "sample rate" in tw.media_format_problem({"encoding": "audio/x-mulaw", "sampleRate": bad})
    assert "channels" in tw.media_format_problem({"encoding": "audio/x-mulaw", "channels": "two"})


# ------------------------------------------------------------------------------ the voice webhook
@on_session_loop
async def test_voice_webhook_twiml(server, monkeypatch):
    async with httpx.AsyncClient(base_url=server.http) as http:
        resp = await http.post(VOICE_PATH, params={"instructions": 'Be brief & "kind"', "voice": "joe"},
                               headers={"host": "abc.example.ngrok.app", "x-forwarded-proto": "https"},
                               data={"CallSid": "CA123", "From": "+15550001111"})
        assert resp.status_code == 200 and resp.headers["content-type"].startswith("application/xml")
        root = ET.fromstring(resp.text)
        stream = root.find("./Connect/Stream")
        assert root.tag == "Response" and stream is not None
        assert stream.get("url") == f"wss://abc.example.ngrok.app{STREAM_PATH}"
        params = {p.get("name"): p.get("value") for p in stream.findall("Parameter")}
        assert params == {"instructions": 'Be brief & "kind"', "voice": "joe"}

        resp = await http.get(VOICE_PATH)  # plain http, no proxy: ws://
        stream = ET.fromstring(resp.text).find("./Connect/Stream")
        assert stream is not None and stream.get("url") == f"ws://127.0.0.1:{server.port}{STREAM_PATH}"

        # With an auth token configured, only requests Twilio signed are answered. The route reads
        # the app's settings on each request (the environment plays no part once the server runs).
        monkeypatch.setenv("REALTIME_OMNI_TWILIO_AUTH_TOKEN", "not-the-token")
        monkeypatch.setattr(server.settings.transports.twilio, "auth_token", SecretStr("secret-token"))
        form = {"CallSid": "CA123", "From": "+15550001111"}
        assert (await http.post(VOICE_PATH, data=form)).status_code == 403
        signature = tw.request_signature("secret-token", f"http://127.0.0.1:{server.port}{VOICE_PATH}", form)
        resp = await http.post(VOICE_PATH, data=form, headers={"x-twilio-signature": signature})
        assert resp.status_code == 200 and "<Stream" in resp.text


# ------------------------------------------------------------------------------ calls
@on_session_loop
async def test_echo_call_framing(server, calls, ulaw):
    """Framing on the echo model: 160-byte frames with our streamSid, a mark per delta, all echoed."""
    speech = ulaw("Hello there, this is a test call.")
    async with SimulatedCarrier(stream_url(server), custom_parameters={"model": "echo"}) as carrier:
        await calls.wait_for(carrier.stream_sid, "session.updated")
        assert calls.calls[carrier.stream_sid].runner.core.id in server.manager.sessions
        end = await carrier.say(speech)
        carrier.media_paused = True  # the echo model echoes line silence too: stop it to drain
        await carrier.wait_quiet(0.3, timeout=10)
        await asyncio.sleep(0.3)
        assert set(carrier.payload_sizes) == {160}
        assert carrier.stream_sids == {carrier.stream_sid}
        # the echo returns the caller's μ-law bytes unchanged
        assert speech in carrier.received_audio()
        assert carrier.marks_received and len(carrier.marks_echoed) == len(carrier.marks_received)
        call = calls.calls[carrier.stream_sid]
        session = calls.of(carrier.stream_sid, "session.updated")[-1]["session"]
        assert session["audio"]["input"]["format"]["type"] == "audio/pcmu"
        assert session["audio"]["output"]["format"]["type"] == "audio/pcmu"
        rid = calls.of(carrier.stream_sid, "response.created")[0]["response"]["id"]
        heard = await calls.on_server(lambda: call.runner.core.ledger.sent_ms(rid))
        assert heard == pytest.approx(1000 * len(carrier.played_audio()) / 8000, abs=120)
        assert end > 0
    assert await released(server, calls, carrier.stream_sid)


@on_session_loop
async def test_phone_call_with_the_embedded_model(server, calls, ulaw, transcribe):
    """A spoken question over 8 kHz μ-law gets a spoken answer Whisper can understand."""
    async with SimulatedCarrier(stream_url(server), custom_parameters={"instructions": INSTRUCTIONS}) as carrier:
        sid = carrier.stream_sid
        session = (await calls.wait_for(sid, "session.updated"))[-1]["session"]
        assert session["audio"]["input"]["turn_detection"]["type"] == "server_vad"
        assert session["instructions"] == INSTRUCTIONS
        await asyncio.sleep(0.5)
        end = await carrier.say(ulaw(QUESTION))
        first = await carrier.wait_media_after(end, timeout=60)
        assert first is not None, "no reply audio"
        done = (await calls.wait_for(sid, "response.done", timeout=90))[0]["response"]
        await carrier.wait_quiet(1.0, timeout=60)
        await asyncio.sleep(0.3)

        # narrowband VAD + ASR: the 8 kHz question was detected and transcribed
        assert calls.of(sid, "input_audio_buffer.speech_started") and calls.of(sid, "input_audio_buffer.speech_stopped")
        asked = calls.of(sid, "conversation.item.input_audio_transcription.completed")[0]["transcript"]
        assert {"capital", "france"} <= set(words(asked)), asked

        # telephony framing
        assert set(carrier.payload_sizes) == {160}, carrier.payload_sizes
        assert carrier.stream_sids == {sid}
        assert not carrier.clears

        # the reply, as the caller heard it, is speech
        heard = g711.ulaw_decode(carrier.played_audio(end))
        assert len(heard) > 8000 * 0.5
        text = transcribe(heard, 8_000)
        assert words(text), f"reply not understood; the model said {done['output'][0]['content'][0].get('transcript')!r}"

        # marks drove playback truth: the ledger holds what the phone played of this response
        assert done["status"] == "completed"
        call = calls.calls[sid]
        ledger_ms = await calls.on_server(lambda: call.runner.core.ledger.sent_ms(done["id"]))
        assert ledger_ms == pytest.approx(1000 * len(heard) / 8000, abs=40)
        await carrier.stop()
    assert await released(server, calls, sid)


@on_session_loop
async def test_barge_in_clears_the_carrier_and_truncates(server, calls, ulaw):
    """Speaking over the reply: `clear` at once, nothing stale plays, the item keeps what was heard."""
    async with SimulatedCarrier(stream_url(server), custom_parameters={
            "instructions": "You are a storyteller. Always answer with a long story of at least five sentences."}) as carrier:
        sid = carrier.stream_sid
        await calls.wait_for(sid, "session.updated")
        await asyncio.sleep(0.5)
        end = await carrier.say(ulaw(LONG_QUESTION))
        first = await carrier.wait_media_after(end, timeout=60)
        assert first is not None
        created = (await calls.wait_for(sid, "response.created"))[0]["response"]["id"]
        assert await carrier.wait_played(first, 1200, timeout=30), "reply shorter than 1.2 s"
        spoken_at = time.monotonic()
        interrupted = carrier.say(ulaw(INTERRUPTION))
        deadline = time.monotonic() + 10
        while not carrier.clears and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert carrier.clears, "no clear after speaking over the reply"
        cleared_at = carrier.clears[0]
        # The bridge sends clear as soon as the session's VAD reports speech (VAD onset itself,
        # on 2 busy cores while the reply is being generated, is measured by the benchmark).
        started = [t for t, _ in calls.timed(sid, "input_audio_buffer.speech_started") if t > spoken_at]
        assert started and cleared_at - started[0] < 0.15
        assert cleared_at - spoken_at < 2.5
        await interrupted
        echoed_before = [int(name.rsplit(":", 1)[1]) for t, name in carrier.marks_echoed
                         if t < cleared_at and name.startswith(created)]
        received_ms = 20 * sum(1 for t, _ in carrier.received if first <= t < cleared_at)

        # the interrupted reply ends: cancelled by the session, or truncated by the bridge
        await calls.wait_for(sid, "telephony.clear")
        done = [e["response"] for e in calls.of(sid, "response.done") if e["response"]["id"] == created]
        truncated = calls.of(sid, "conversation.item.truncated")
        deadline = time.monotonic() + 10
        while not done and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
            done = [e["response"] for e in calls.of(sid, "response.done") if e["response"]["id"] == created]
        assert done
        full_text = "".join(e["delta"] for e in calls.of(sid, "response.output_audio_transcript.delta")
                            if e["response_id"] == created)
        if done[0]["status"] == "completed":  # generated in full before the caller spoke
            truncated = (await calls.wait_for(sid, "conversation.item.truncated"))
        else:
            assert done[0]["status"] == "cancelled" and done[0]["status_details"]["reason"] == "turn_detected"

        call = calls.calls[sid]
        item_id = done[0]["output"][0]["id"]

        def item_state():  # type: ignore[no-untyped-def]
            item = call.runner.core.conversation.get(item_id)
            return item.audio_ms, item.content[0].get("transcript") or "", item.status

        audio_ms, transcript, status = await calls.on_server(item_state)
        heard_ms = max(echoed_before, default=0)
        assert audio_ms <= heard_ms + 100  # at most one mark (one delta) in flight when the caller spoke
        assert audio_ms < received_ms, (audio_ms, received_ms)
        assert len(transcript) < len(full_text), (transcript, full_text)
        if truncated:
            assert truncated[0]["audio_end_ms"] == int(audio_ms)
        else:
            assert status == "incomplete"

        # nothing stale plays: no media between the clear and the next reply's first audio
        await calls.wait_for(sid, "input_audio_buffer.speech_stopped", count=2, timeout=30)
        next_created = [t for t, e in calls.timed(sid, "response.created") if e["response"]["id"] != created]
        cutoff = next_created[0] if next_created else time.monotonic()
        stale = [t for t, _ in carrier.received if cleared_at + 0.05 < t < cutoff]
        assert not stale, f"{len(stale)} frames arrived after the clear"
        await carrier.stop()


@on_session_loop
async def test_dtmf_reaches_model_context_and_application(server, calls):
    async with SimulatedCarrier(stream_url(server), custom_parameters={"model": "echo"}) as carrier:
        sid = carrier.stream_sid
        await calls.wait_for(sid, "session.updated")
        await carrier.dtmf("5")
        await carrier.dtmf("xx")  # invalid: ignored
        await carrier.dtmf("#")
        dtmf = await calls.wait_for(sid, "telephony.dtmf", count=2, timeout=10)
        assert [e["digit"] for e in dtmf] == ["5", "#"]
        assert dtmf[0]["call_sid"] == carrier.call_sid and dtmf[0]["stream_sid"] == sid
        ga = await calls.wait_for(sid, "input_audio_buffer.dtmf_event_received", count=2, timeout=10)
        for event in ga:
            assert_valid_server_event(event)
        assert [e["event"] for e in ga] == ["5", "#"] and abs(ga[0]["received_at"] - time.time()) < 60
        await calls.wait_for(sid, "conversation.item.done", count=2, timeout=10)
        call = calls.calls[sid]
        texts = await calls.on_server(lambda: [(i.role, i.text()) for i in call.runner.core.conversation])
        assert ("user", "[DTMF 5]") in texts and ("user", "[DTMF #]") in texts
        assert call.stats["bad_frame"] == 1
        await carrier.stop()


@on_session_loop
async def test_bad_input_is_ignored_and_the_call_goes_on(server, calls, ulaw):
    opened = server.manager.total_opened
    carrier = SimulatedCarrier(stream_url(server), custom_parameters={"model": "echo"}, send_start=False)
    await carrier.connect(sender=False)
    try:
        # before start: media, DTMF, garbage — no session is opened, the socket stays up
        await carrier.send(carrier.media_message(b"\xff" * 160))
        await carrier.dtmf("1")
        for junk in ["not json", "[1, 2, 3]", '{"no_event": 1}', '{"event": 42}', '{"event": "bogus"}', "{}"]:
            await carrier.send(junk)
        await carrier._ws.send(b"\x00\x01binary")
        await asyncio.sleep(0.3)
        assert server.manager.total_opened == opened and not carrier.closed.is_set()

        await carrier.start()
        await calls.wait_for(carrier.stream_sid, "session.updated")
        await carrier.start()  # a second start is ignored
        bad = [
            {"event": "media", "streamSid": carrier.stream_sid, "media": {"payload": "%%% not base64 %%%"}},
            {"event": "media", "streamSid": carrier.stream_sid, "media": {"payload": ""}},
            {"event": "media", "streamSid": carrier.stream_sid, "media": {"payload": base64.b64encode(b"\0" * 40_000).decode()}},
            {"event": "media", "streamSid": carrier.stream_sid, "media": {}},
            {"event": "media", "streamSid": carrier.stream_sid, "media": "nope"},
            {"event": "mark", "streamSid": carrier.stream_sid, "mark": {"name": "resp_unknown:100"}},
            {"event": "mark", "streamSid": carrier.stream_sid, "mark": {}},
            {"event": "dtmf", "streamSid": carrier.stream_sid, "dtmf": {"digit": None}},
            {"event": "start", "start": "nope"},
        ]
        for message in bad:
            await carrier.send(message)
        await carrier.send("x" * 300_000)  # over the frame size limit
        # odd-length μ-law payloads are fine (one byte per sample)
        odd = ulaw("Testing one two three.")[:1601]
        await carrier.send(carrier.media_message(odd))
        deadline = time.monotonic() + 10
        while len(carrier.received_audio()) < 1600 and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        assert carrier.received_audio()[:1600] == odd[:1600]
        assert set(carrier.payload_sizes) == {160}
        call = calls.calls[carrier.stream_sid]
        assert call.stats["bad_frame"] >= 8 and call.stats["second_start"] == 2  # the real one and {"start": "nope"}
        assert server.manager.total_opened == opened + 1
        await carrier.stop()
    finally:
        await carrier.close()
    assert await released(server, calls, carrier.stream_sid)
    async with httpx.AsyncClient(base_url=server.http) as http:
        assert (await http.get("/health")).status_code == 200


@on_session_loop
async def test_stop_mid_response_frees_everything(server, calls, ulaw):
    async with SimulatedCarrier(stream_url(server), custom_parameters={
            "instructions": "You are a storyteller. Always answer with a long story."}) as carrier:
        sid = carrier.stream_sid
        await calls.wait_for(sid, "session.updated")
        await asyncio.sleep(0.3)
        end = await carrier.say(ulaw(LONG_QUESTION))
        assert await carrier.wait_media_after(end, timeout=60) is not None
        await carrier.stop()  # the caller hangs up while the reply plays
    assert await released(server, calls, sid)
    ended = await calls.wait_for(sid, "telephony.call.ended", timeout=10)
    assert ended[0]["reason"] == "twilio_stop"
    done = calls.of(sid, "response.done")
    assert len(done) == len(calls.of(sid, "response.created"))  # every response ended exactly once
    # the server goes on: a new call works
    async with SimulatedCarrier(stream_url(server), custom_parameters={"model": "echo"}) as carrier:
        await calls.wait_for(carrier.stream_sid, "session.updated")
        await carrier.stop()
    assert await released(server, calls, carrier.stream_sid)


@on_session_loop
@pytest.mark.parametrize("model", ["echo", "embedded"])
async def test_abrupt_disconnect_frees_the_session(server, calls, ulaw, model):
    carrier = SimulatedCarrier(stream_url(server), custom_parameters={"model": model})
    await carrier.connect()
    await calls.wait_for(carrier.stream_sid, "session.updated")
    await carrier.say(ulaw("Hello, can you hear me?"))
    await asyncio.sleep(0.5)
    assert calls.calls[carrier.stream_sid].runner.core.id in server.manager.sessions
    await carrier.abort()  # no stop, no close frame
    assert await released(server, calls, carrier.stream_sid)
    ended = await calls.wait_for(carrier.stream_sid, "telephony.call.ended", timeout=10)
    assert ended[0]["reason"] == "client_disconnected"


@on_session_loop
async def test_unknown_model_hangs_up_cleanly(server, calls):
    opened = server.manager.total_opened
    carrier = SimulatedCarrier(stream_url(server), custom_parameters={"model": "no-such-model"})
    await carrier.connect(sender=False)
    await asyncio.wait_for(carrier.closed.wait(), 10)
    assert carrier._ws.close_code == 1008
    await carrier.close()
    assert server.manager.total_opened == opened and carrier.stream_sid not in calls.calls


@on_session_loop
async def test_authenticated_telephony_needs_the_webhooks_stream_token(registry, monkeypatch):
    """With API keys and a Twilio token set, a stream opens a session only with the single-use
    token that a Twilio-signed voice webhook put in its TwiML; anyone else is hung up (1008)."""
    from tests.server import ServerThread

    with ServerThread(registry, api_keys=["sk-test"]) as srv:
        url = srv.ws + STREAM_PATH
        async with httpx.AsyncClient(base_url=srv.http) as http:
            # API keys without a Twilio token: the webhook cannot be authenticated, so it is refused
            assert (await http.post(VOICE_PATH, data={"CallSid": "CA1"})).status_code == 403
            srv.settings.transports.twilio.auth_token = "secret-token"  # type: ignore[assignment]
            form = {"CallSid": "CA1"}
            path = f"{VOICE_PATH}?model=echo&stream_token=ek_forged"  # a token in the query is dropped
            signature = tw.request_signature("secret-token", f"http://127.0.0.1:{srv.port}{path}", form)
            twiml = await http.post(path, data=form, headers={"x-twilio-signature": signature})
            assert twiml.status_code == 200, twiml.text
        stream = ET.fromstring(twiml.text).find("./Connect/Stream")
        params = {p.get("name"): p.get("value") for p in stream.findall("Parameter")}
        token = params["stream_token"]
        assert token.startswith("ek_") and token != "ek_forged" and params["model"] == "echo"

        opened = srv.manager.total_opened
        for bad in ({"model": "echo"}, {"model": "echo", "stream_token": "ek_forged"}):
            intruder = SimulatedCarrier(url, custom_parameters=bad)
            await intruder.connect(sender=False)
            await asyncio.wait_for(intruder.closed.wait(), 10)
            assert intruder._ws.close_code == 1008
            await intruder.close()
        assert srv.manager.total_opened == opened  # no session for them

        carrier = SimulatedCarrier(url, custom_parameters=params)
        await carrier.connect(sender=False)
        deadline = time.monotonic() + 10
        while srv.manager.total_opened == opened and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert srv.manager.total_opened == opened + 1
        await carrier.close()
        # the token is single-use: a replay is hung up
        replay = SimulatedCarrier(url, custom_parameters=params)
        await replay.connect(sender=False)
        await asyncio.wait_for(replay.closed.wait(), 10)
        assert replay._ws.close_code == 1008
        await replay.close()
