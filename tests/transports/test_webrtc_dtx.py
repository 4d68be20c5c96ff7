"""The WebRTC microphone decoder fills pauses in sending (Opus DTX) with silence as far as the
packets' arrival times back them: real Opus packets, as aiortc's receiver hands them over
(codec parameters and a ``JitterFrame``), and a clock the test moves."""

from __future__ import annotations

import asyncio

import av
import numpy as np
from aiortc.jitterbuffer import JitterFrame
from aiortc.rtcrtpparameters import RTCRtpCodecParameters

from realtime_omni.transports.webrtc.incoming import MAX_PAUSE_SAMPLES, InlineAudioDecoder

OPUS = RTCRtpCodecParameters(mimeType="audio/opus", clockRate=48_000, channels=2, payloadType=111)
PACKET = 960  # 20 ms at 48 kHz
WRAP = 1 << 32


class Clock:
    """A monotonic clock the test moves (seconds)."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def opus_packets(count: int) -> list[bytes]:
    """``count`` real 20 ms Opus packets of a 440 Hz tone (what a microphone's speech would be)."""
    encoder = av.CodecContext.create("libopus", "w")
    encoder.sample_rate, encoder.layout, encoder.format = 48_000, "mono", "s16"
    tone = (8000 * np.sin(2 * np.pi * 440 * np.arange(PACKET * count) / 48_000)).astype(np.int16)
    payloads: list[bytes] = []
    for k in range(count):
        pcm = av.AudioFrame.from_ndarray(tone[None, k * PACKET : (k + 1) * PACKET], format="s16", layout="mono")
        pcm.sample_rate, pcm.pts = 48_000, k * PACKET
        payloads += [bytes(p) for p in encoder.encode(pcm)]
    assert len(payloads) == count
    return payloads


class Call:
    """One receiver's decoder fed packets at RTP timestamps and arrival times the test sets."""

    def __init__(self, start_ts: int = 1000) -> None:
        self.clock = Clock()
        self.frames: asyncio.Queue = asyncio.Queue()
        self.decoder = InlineAudioDecoder(self.frames, clock=self.clock)
        self.payloads = iter(opus_packets(200))
        self.ts = start_ts  # the next packet's RTP timestamp
        self.first_ts = start_ts

    def send(self, after_ts: int = PACKET, after_s: float = 0.020) -> None:
        """The next packet, ``after_ts`` samples of RTP time and ``after_s`` seconds after the last."""
        self.ts = (self.ts + after_ts) % WRAP
        self.clock.now += after_s
        self.decoder.put((OPUS, JitterFrame(data=next(self.payloads), timestamp=self.ts)))

    def first(self) -> None:
        self.decoder.put((OPUS, JitterFrame(data=next(self.payloads), timestamp=self.ts)))

    def heard(self) -> int:
        """Samples delivered so far (decoded and filled), 48 kHz."""
        total = 0
        while not self.frames.empty():
            total += self.frames.get_nowait().samples
        return total

    def span(self) -> int:
        """The RTP time from the first packet's start to the end of the last one."""
        return (self.ts - self.first_ts) % WRAP + PACKET


def test_a_dtx_pause_keeps_the_callers_timeline() -> None:
    """Speech in 20 ms packets, then DTX (one packet per 400 ms of silence, arriving 400 ms
    apart), then speech again: the session hears as much time as the caller spoke and paused,
    so an end of turn by silence duration comes on time."""
    call = Call()
    call.first()
    for _ in range(25):  # 0.5 s of speech
        call.send()
    for _ in range(10):  # 4 s of DTX silence
        call.send(after_ts=20 * PACKET, after_s=0.400)
    for _ in range(10):  # speech again
        call.send()
    heard = call.heard()
    assert abs(heard - call.span()) <= PACKET, (heard, call.span())
    assert call.decoder.concealed_samples >= 10 * 19 * PACKET


def test_a_jittered_dtx_pause_is_filled_within_the_tolerance() -> None:
    """A DTX packet that comes 50 ms late (and the one after it 50 ms early) still fills its
    pause: the tolerance covers the jitter, and the timeline ends within one packet."""
    call = Call()
    call.first()
    for _ in range(5):
        call.send()
    for late in (0.05, -0.05, 0.0, 0.03, -0.03):
        call.send(after_ts=20 * PACKET, after_s=0.400 + late)
    heard = call.heard()
    assert abs(heard - call.span()) <= 2 * PACKET, (heard, call.span())


def test_a_timestamp_jump_without_a_pause_only_resynchronises() -> None:
    """A hostile (or new) stream jumps its timestamps by 10 s while its packets keep coming
    every 20 ms: nothing is filled, the decoder resynchronises. A jump larger than the pause
    the packets show is filled only as far as the pause (plus jitter)."""
    call = Call()
    call.first()
    for _ in range(5):
        call.send()
    call.send(after_ts=10 * 48_000, after_s=0.020)
    assert call.decoder.concealed_samples == 0
    call.send()
    call.send(after_ts=10 * 48_000, after_s=0.500)  # 480 ms not heard by the wall clock
    filled = call.decoder.concealed_samples
    assert 480 * 48 <= filled <= (480 + 60) * 48, filled


def test_a_packet_from_the_past_fills_nothing() -> None:
    """A timestamp behind the timeline (an old packet, a new stream) is no hole, however long
    the wall clock waited for it."""
    call = Call()
    call.first()
    for _ in range(5):
        call.send()
    call.send(after_ts=WRAP - 20 * PACKET, after_s=1.0)
    assert call.decoder.concealed_samples == 0


def test_a_pause_beyond_the_cap_fills_the_cap() -> None:
    """A sender silent for 30 s (and the wall clock agrees) gets at most 10 s of silence."""
    call = Call()
    call.first()
    call.send()
    call.send(after_ts=30 * 48_000, after_s=30.0)
    assert call.decoder.concealed_samples == MAX_PAUSE_SAMPLES


def test_lost_packets_are_filled_even_when_the_next_arrives_at_once() -> None:
    """Up to 200 ms of lost packets are filled on the timestamps' word: jitter can deliver the
    packet after a loss right behind the one before it."""
    call = Call()
    call.first()
    call.send()
    call.send(after_ts=4 * PACKET, after_s=0.001)  # 3 lost
    call.send(after_ts=11 * PACKET, after_s=0.0)  # 10 lost: 200 ms, the bound
    assert call.decoder.concealed_samples == 13 * PACKET
    assert abs(call.heard() - call.span()) <= PACKET


def test_the_timeline_survives_the_timestamps_wrapping() -> None:
    """RTP timestamps wrap at 2**32: a loss and a DTX pause across the wrap are filled as any."""
    loss = Call(start_ts=WRAP - 2 * PACKET)
    loss.first()
    loss.send(after_ts=4 * PACKET, after_s=0.001)  # 3 lost, across the wrap
    assert loss.ts == 2 * PACKET and loss.decoder.concealed_samples == 3 * PACKET
    pause = Call(start_ts=WRAP - 5 * PACKET)
    pause.first()
    pause.send()
    pause.send(after_ts=20 * PACKET, after_s=0.400)  # a DTX pause across the wrap
    assert pause.ts == 16 * PACKET and pause.decoder.concealed_samples == 19 * PACKET
    for call in (loss, pause):
        assert call.heard() == call.span()


def test_packets_that_each_claim_a_short_loss_add_up_to_no_more_than_the_call_lasted() -> None:
    """A hostile peer steps each 20 ms packet's timestamp by 200 ms (a "loss" of 180 ms, filled on
    the timestamps' word) while sending in real time: the delivered audio stays within a second
    of the call's duration instead of growing ten times as fast."""
    call = Call()
    call.first()
    for _ in range(150):  # 3 s of packets
        call.send(after_ts=10 * PACKET, after_s=0.020)
    heard_s = call.heard() / 48_000
    assert 3.0 <= heard_s <= 3.0 + 1.0 + 0.03, heard_s  # the call's 3 s, and the slack (1 s) at most
    # the same stream played honestly afterwards is delivered whole again
    before = call.heard()
    for _ in range(40):
        call.send()
    assert call.heard() - before == 40 * PACKET
