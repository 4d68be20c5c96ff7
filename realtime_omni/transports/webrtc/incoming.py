"""The incoming side of a WebRTC call's media: the microphone, from RTP packets to the session.

aiortc hands each Opus packet to :class:`InlineAudioDecoder` (decoded to mono in the event loop,
not in a decoder thread per call), released on arrival by :class:`ImmediateAudioJitterBuffer`
when the call's jitter prefetch is 0; the decoder hands each frame straight to the call's
:class:`MicrophoneSink`, which resamples it (stateful soxr, low delay) to 24 kHz and puts the PCM
in the session's mailbox (:meth:`SessionRunner.submit_audio_nowait`), the same path as
``input_audio_buffer.append``. Where aiortc's own decoder runs, :func:`pump_audio_in` reads its
track into the same sink.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import av
import numpy as np
from aiortc.codecs import get_decoder
from aiortc.jitterbuffer import JitterBuffer, JitterFrame
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack
from aiortc.utils import uint16_gt
from av import AudioFrame, CodecContext, Packet

from ...audio import Pcm, StreamResampler
from ...session.runner import SessionRunner
from .pacing import RATE, TIME_BASE, WIRE_RATE

log = logging.getLogger(__name__)

#: soxr quality of the microphone's 48 → 24 kHz conversion (Opus decoders give 48 kHz). soxr's
#: HQ (the project's default) works in blocks: between 48 and 24 kHz it returns 0 samples for one
#: 20 ms frame and 830 for the next, holding back 13–27 ms on average. LQ returns every frame's
#: samples at once (0.4 ms held) at about the same CPU; its passband ends near 9.5 kHz, not 11.
CALL_RESAMPLER_QUALITY = "LQ"


def call_resampler(in_rate: int, out_rate: int) -> StreamResampler:
    """The microphone's resampler (low delay, see above)."""
    return StreamResampler(in_rate, out_rate, quality=CALL_RESAMPLER_QUALITY)


def frame_to_mono(frame: AudioFrame) -> np.ndarray:
    """A decoded audio frame → mono int16 samples (packed s16 stereo is averaged)."""
    if frame.format.name == "s16" and len(frame.layout.channels) == 1:
        # mono s16 (the inline decoder's output): the plane's bytes are the samples, no copy
        # through to_ndarray's stacking of planes
        return np.frombuffer(frame.planes[0], dtype=np.int16, count=frame.samples)
    data = frame.to_ndarray()
    if data.dtype == np.int16 and data.shape[0] == 1 and len(frame.layout.channels) == 2:
        # packed s16 stereo (what aiortc's Opus decoder gives): average the pairs in int32
        pairs = data.reshape(-1, 2).astype(np.int32)
        return ((pairs[:, 0] + pairs[:, 1]) >> 1).astype(np.int16)
    if frame.format.name != "s16":
        data = (np.clip(data, -1.0, 1.0) * 32767).astype(np.int16) if data.dtype.kind == "f" else data.astype(np.int16)
    channels = len(frame.layout.channels)
    if channels == 1:
        return data.reshape(-1).astype(np.int16, copy=False)
    if frame.format.is_planar:
        mixed = data.astype(np.int32).mean(axis=0)
    else:
        mixed = data.reshape(-1, channels).astype(np.int32).mean(axis=1)
    return mixed.astype(np.int16)


class InlineAudioDecoder:
    """Decodes a receiver's audio in the event loop, in place of aiortc's decoder thread.

    aiortc gives every receiver a thread: each 20 ms frame crosses a ``queue.Queue`` into it and
    comes back through ``run_coroutine_threadsafe`` (two thread switches, a GIL hand-over and a
    loop wake-up per frame per call; with tens of calls the threads also contend for the GIL
    with the loop). This object takes the place of the receiver's decoder queue: ``put`` decodes
    at once and hands the frames to the track's queue. Opus is decoded to mono (no downmix
    afterwards). aiortc's thread still starts, but ``get`` parks it until the receiver stops.
    """

    def __init__(self, frames: asyncio.Queue[Any], clock: Callable[[], float] = time.monotonic) -> None:
        self._frames = frames
        self._clock = clock  # arrival times, which back the silence put in for a pause
        #: where decoded frames go (None: the track's queue, for a reader of the track)
        self.sink: Callable[[AudioFrame], None] | None = None
        self._stopped = threading.Event()
        self._decoder: Any = None
        self._codec_name: str | None = None
        self._next_ts: int | None = None  # RTP timestamp the next Opus packet should carry
        self._last: tuple[int, float] | None = None  # the last Opus packet's RTP timestamp, arrival
        self._origin: float | None = None  # the first Opus packet's arrival
        self.errors = 0
        self.concealed_samples = 0  # silence put in place of lost packets and pauses (48 kHz)
        self.decoded_samples = 0

    @classmethod
    def install(cls, receiver: Any) -> InlineAudioDecoder | None:
        """Swap it into an aiortc ``RTCRtpReceiver`` that has not started (None: left as it was)."""
        name = "_RTCRtpReceiver__decoder_queue"
        track = getattr(receiver, "track", None)
        if (getattr(receiver, "_RTCRtpReceiver__decoder_thread", "missing") is not None
                or not hasattr(receiver, name) or not isinstance(getattr(track, "_queue", None), asyncio.Queue)):
            return None
        inline = cls(track._queue)
        setattr(receiver, name, inline)
        return inline

    # the receiver's side (the event loop)
    def put(self, item: Any) -> None:
        if item is None:  # the receiver stops: end the track, release the parked thread
            self._stopped.set()
            self._frames.put_nowait(None)
            return
        codec, encoded = item
        if not encoded.data:
            # a packet without payload (padding only): to the decoder an empty packet means
            # "flush, the stream has ended", after which it decodes nothing for the rest of the call
            self.errors += 1
            return
        if codec.name != self._codec_name:
            self._codec_name = codec.name
            self._decoder = _decoder_for(codec)
        if isinstance(self._decoder, _MonoOpusDecoder):
            self._conceal_gap(encoded.timestamp)
        try:
            frames = self._decoder.decode(encoded)
        except av.error.EOFError:  # the decoder ended all the same: a fresh one for what follows
            self.errors += 1
            self._decoder = _decoder_for(codec)
            return
        except av.FFmpegError as exc:
            self.errors += 1
            log.debug("audio decode failed: %s", exc)
            return
        for frame in frames:
            self.decoded_samples += frame.samples
            if self._next_ts is not None:
                self._next_ts = (self._next_ts + frame.samples) & 0xFFFFFFFF
            self._deliver(frame)

    def _deliver(self, frame: AudioFrame) -> None:
        if self.sink is not None:
            self.sink(frame)
        else:
            self._frames.put_nowait(frame)

    def _conceal_gap(self, timestamp: int) -> None:
        """Lost packets and pauses in sending (Opus DTX sends one packet per 400 ms of silence)
        leave a hole in the timeline: fill it with silence, so the session's audio clock (turn
        detection, item timestamps, truncation) stays in step with the caller's. Up to 200 ms
        (loss) is filled on the timestamps' word; a longer hole only as far as the packets'
        arrival times back it; and no hole beyond what keeps the delivered audio within
        :data:`TIMELINE_SLACK_SAMPLES` of the call's duration, so a hostile peer's timestamps
        cannot inflate the input. A jump the wall clock did not see (a new stream, a hostile
        peer) just resynchronises."""
        now = self._clock()
        expected, self._next_ts = self._next_ts, timestamp
        last, self._last = self._last, (timestamp, now)
        if self._origin is None:
            self._origin = now
        if expected is None or last is None:
            return
        gap = (timestamp - expected) & 0xFFFFFFFF
        if gap >= 1 << 31:  # behind the timeline (an old packet or a new stream): no hole
            return
        if gap > MAX_CONCEALED_SAMPLES:
            gap = min(gap, _wall_backed_gap(last, expected, now), MAX_PAUSE_SAMPLES)
        # and never ahead of the wall clock since the first packet by more than the slack: packets
        # that each claim a short loss cannot add up to more audio than the call has lasted
        ahead = self.decoded_samples + self.concealed_samples - round((now - self._origin) * RATE)
        gap = min(gap, TIMELINE_SLACK_SAMPLES - ahead)
        if gap > 0:
            silence = AudioFrame.from_ndarray(np.zeros((1, gap), dtype=np.int16), format="s16", layout="mono")
            silence.sample_rate = RATE
            silence.pts = expected
            silence.time_base = TIME_BASE
            self.concealed_samples += gap
            self._deliver(silence)

    # aiortc's decoder thread
    def get(self, *args: Any, **kwargs: Any) -> None:
        self._stopped.wait()
        return None


#: the longest run of lost audio filled with silence whatever the packets' arrival times say
#: (48 kHz samples: 200 ms, ten Opus packets; jitter may deliver the packet after a loss at once)
MAX_CONCEALED_SAMPLES = 10 * 960
#: the longest pause in sending filled with silence when the arrival times back it (DTX, a muted
#: or stalled sender): 10 s, the longest ``silence_duration_ms`` a session accepts, so a turn
#: still ends across one pause, while one packet never makes more than 10 s (960 KB) of audio
MAX_PAUSE_SAMPLES = 10 * RATE
#: network jitter allowed for on a pause's arrival times: the packet before it may have come late
PAUSE_JITTER_SAMPLES = 60 * RATE // 1000
#: how far the delivered audio (decoded and filled) may run ahead of the time since the first
#: packet before no more silence is put in: 1 s, more than a jitter buffer's burst at the start
TIMELINE_SLACK_SAMPLES = RATE


def _wall_backed_gap(last: tuple[int, float], expected: int, now: float) -> int:
    """How much of a hole the arrival times back (48 kHz samples): the time since the last
    packet arrived less that packet's own audio, plus jitter; 0 where the wall clock saw no
    hole beyond jitter (a timestamp jump, not a pause)."""
    last_ts, last_at = last
    seen = round((now - last_at) * RATE) - ((expected - last_ts) & 0xFFFFFFFF)
    return seen + PAUSE_JITTER_SAMPLES if seen > PAUSE_JITTER_SAMPLES else 0


class ImmediateAudioJitterBuffer(JitterBuffer):
    """Releases each audio packet as soon as it arrives, newer than the last one released.

    aiortc's buffer knows a frame is complete only when a packet of the next frame arrives, so
    even ``prefetch`` 0 or 1 holds every frame for one more packet time (20 ms). An Opus frame
    is one RTP packet: it is complete on arrival. A packet older than one already released (a
    reordered or duplicated packet) is dropped; the decoder fills the time of lost packets with
    silence. For a reordering path a prefetch of 2 or more keeps aiortc's buffer."""

    def __init__(self) -> None:
        super().__init__(capacity=16, prefetch=0)
        self._last: int | None = None

    def add(self, packet: Any) -> tuple[bool, JitterFrame | None]:
        seq = packet.sequence_number
        if self._last is not None and not uint16_gt(seq, self._last):
            return False, None
        self._last = seq
        return False, JitterFrame(data=packet._data, timestamp=packet.timestamp)


def _decoder_for(codec: Any) -> Any:
    """Opus decoded straight to mono; other codecs with aiortc's own decoder."""
    return _MonoOpusDecoder() if codec.name.lower() == "opus" else get_decoder(codec)


class _MonoOpusDecoder:
    def __init__(self) -> None:
        self.codec = CodecContext.create("libopus", "r")
        self.codec.format = "s16"
        self.codec.layout = "mono"
        self.codec.sample_rate = RATE

    def decode(self, encoded: Any) -> list[AudioFrame]:
        packet = Packet(encoded.data)
        packet.pts = encoded.timestamp
        packet.time_base = TIME_BASE
        return self.codec.decode(packet)  # type: ignore[return-value]


class AudioInputStats:
    def __init__(self) -> None:
        self.frames = 0
        self.dropped = 0
        self.last_at = 0.0


class MicrophoneSink:
    """Decoded microphone frames → the session, as each arrives: no queue and no task hop per
    frame. Never waits: when the session's mailbox is full (the session is stuck), frames are
    dropped and counted."""

    def __init__(self, runner: SessionRunner, stats: AudioInputStats) -> None:
        self._runner = runner
        self._stats = stats
        # 24 kHz, whatever the session's input format (that is the JSON channel's): a duplex
        # model (echo) then answers at the track's own rate with no further resampling, and the
        # low-delay call resampler keeps a live echo live (soxr HQ would hold back ~30 ms here)
        self._resampler: StreamResampler | None = None

    @property
    def closed(self) -> bool:
        return self._runner.closed.is_set()

    def __call__(self, frame: AudioFrame) -> None:
        stats = self._stats
        stats.frames += 1
        stats.last_at = time.monotonic()
        if self.closed:
            return
        resampler = self._resampler
        if resampler is None or resampler.in_rate != frame.sample_rate:
            resampler = self._resampler = call_resampler(frame.sample_rate, WIRE_RATE)
        pcm = resampler.process(frame_to_mono(frame))
        if len(pcm) and not self._runner.submit_audio_nowait(Pcm(pcm, WIRE_RATE)):
            stats.dropped += 1


async def pump_audio_in(track: MediaStreamTrack, sink: MicrophoneSink) -> None:
    """A microphone track (aiortc's own decoder behind it) → ``sink``, until the track ends."""
    while not sink.closed:
        try:
            frame = await track.recv()
        except MediaStreamError:
            return
        sink(frame)
