"""The outgoing side of a WebRTC call's media: the paced assistant track and its Opus packets.

Incoming (the microphone): see :mod:`.incoming`. The clock, the rates and the packet length:
:mod:`.pacing`; the Opus encoder: :mod:`.opus`.

Outgoing: :class:`OutgoingAudioTrack` is what aiortc's sender pulls from. It produces 20 ms of mono
audio (40 or 60 with ``packet_ms``) at the session's 24 kHz per tick (two, three) of the loop's shared :class:`~.pacing.FrameClock` (one timer
for every call, not a sleep per track), encoded at that rate (Opus takes 24 kHz input as is: no
resampling on the way out), with ``pts`` advancing by exactly 960 of the 48 kHz RTP clock each
frame, so RTP timestamps never jump: silence fills the gaps between responses and any underrun. It
hands aiortc an Opus ``av.Packet`` it encoded itself (:class:`~.opus.OpusPacketEncoder`, mono):
aiortc then only packs it, which skips its per-frame thread-pool hop, its stereo encode behind a
resampler FIFO and its pure-Python RFC 6465 audio level (about 0.5 ms of CPU per frame). It is the
playback truth of the call: it reports the milliseconds of each response that actually went out into
the session's :class:`~realtime_omni.session.playback.PlaybackLedger` frame by frame, and it tells
the writer when a response starts, stops and is cleared (``output_audio_buffer.*``).
"""

from __future__ import annotations

import asyncio
import fractions
import logging
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack
from av import AudioFrame, Packet

from ...audio import Pcm, StreamResampler
from ...session.runner import SessionRunner
from .opus import SERVER_OPUS, OpusPacketEncoder
from .pacing import CLOCK_FRAME, FRAME_MS, RATE, TRACK_RATE, WIRE_RATE, frame_clock

log = logging.getLogger(__name__)


# live streams (echo): the playout buffer's window, the cushion it keeps above one frame, and the
# least spare audio worth skipping
LIVE_WINDOW = 25  # frames (0.5 s)
LIVE_CUSHION = TRACK_RATE * 5 // 1000  # 5 ms
LIVE_SPARE = TRACK_RATE * 10 // 1000  # 10 ms



def server_event(kind: str, **fields: Any) -> dict[str, Any]:
    return {"type": kind, "event_id": f"event_{uuid.uuid4().hex[:20]}", **fields}


@dataclass
class _Chunk:
    response_id: str
    epoch: int
    pcm: np.ndarray  # int16 at TRACK_RATE
    pos: int = 0


class OutgoingAudioTrack(MediaStreamTrack):
    """The assistant's voice: a bounded queue of response audio, paced at 20 ms per frame.

    ``packet_ms`` (20, 40 or 60) is the audio in each Opus packet: 40 ms halves the packets, and
    so the per-packet work of RTP, SRTP and the sockets, for 20 ms more delay on the way out. With
    ``packet_length`` (see :class:`PacketLength`) the track asks it again whenever its encoder has
    settled on silence, and changes length there, where the change cannot be heard.

    ``notify`` receives ``output_audio_buffer.started/stopped/cleared`` events; it must not send
    anything itself (the call's single writer does), only queue.
    """

    kind = "audio"

    def __init__(
        self,
        runner: SessionRunner,
        notify: Callable[[dict[str, Any]], None],
        max_queue_ms: float = 5000.0,
        live_max_ms: float | None = None,
        packet_ms: int = FRAME_MS,
        packet_length: Callable[[], int] | None = None,
    ) -> None:
        super().__init__()
        self._packet_length = packet_length
        self._encoders: dict[int, OpusPacketEncoder] = {}
        self._encoder: OpusPacketEncoder | None = None
        self._use(packet_ms)
        #: a live stream (the echo model) arrives at real time, not ahead of it: every late input
        #: frame would leave 20 ms more backlog for good. Past ``live_max_ms`` the oldest audio is
        #: skipped back to two frames of cushion (a playout buffer that shrinks, not only grows).
        self._live_max = None if live_max_ms is None else int(TRACK_RATE * live_max_ms / 1000)
        # ... and below that cap, a playout buffer that follows the input: the least audio queued
        # at a frame's send time over the last LIVE_WINDOW frames is cushion that was never
        # needed; past LIVE_SPARE of it, it is skipped (every frame of it is latency for good).
        self._live_low: int | None = None
        self._live_seen = 0
        self.skipped_ms = 0.0
        self._runner = runner
        self._notify = notify
        self._max_samples = int(TRACK_RATE * max_queue_ms / 1000)
        self._chunks: deque[_Chunk] = deque()
        self._queued = 0
        self._room = asyncio.Event()
        self._room.set()
        self._tick: int | None = None  # the clock tick of the next frame
        self._pts = 0  # RTP time of the next packet
        self._playing: str | None = None  # response whose audio is audible now (started, not stopped)
        self._complete: dict[str, None] = {}  # responses all of whose audio has been queued (ordered)
        #: the frame that went out last: what the listener hears now (the avatar's mouth follows
        #: its loudness; silence, a barge-in and a hang-up all bring it to 0). A reference, no copy.
        self.last_frame: np.ndarray = self._silence
        # counters (benchmarks, metrics)
        self.frames_sent = 0
        self.audio_frames_sent = 0
        self.underruns = 0
        self.cleared = 0
        self.late_frames = 0

    def _use(self, packet_ms: int) -> None:
        """From the next packet on, ``packet_ms`` of audio per packet (its own encoder)."""
        if packet_ms not in (20, 40, 60):
            raise ValueError(f"packet_ms must be 20, 40 or 60, not {packet_ms}")
        self.packet_ms = packet_ms
        self._frame = TRACK_RATE * packet_ms // 1000  # samples of one packet
        self._ticks = packet_ms // FRAME_MS  # clock ticks per packet
        self._silence = np.zeros(self._frame, dtype=np.int16)
        self._encoder = self._encoders.get(packet_ms)

    @property
    def level(self) -> float:
        """Loudness (0..1) of the frame that went out last; computed when asked (the avatar asks
        15 times a second), not for every frame of every call."""
        frame = self.last_frame
        if frame is self._silence:
            return 0.0
        return min(1.0, float(np.sqrt(np.mean(frame.astype(np.float32) ** 2))) / 6000.0)

    # ------------------------------------------------------------------ writer side
    @property
    def queued_ms(self) -> float:
        return 1000.0 * self._queued / TRACK_RATE

    async def push(self, pcm24k: np.ndarray, response_id: str, epoch: int) -> None:
        """Queue one audio delta (24 kHz int16). Waits while the queue is full (backpressure)."""
        if self.readyState != "live":
            return
        while self._queued >= self._max_samples:
            self._room.clear()
            await self._room.wait()
            if self.readyState != "live":
                return
        if len(pcm24k):
            self._chunks.append(_Chunk(response_id, epoch, pcm24k))
            self._queued += len(pcm24k)

    def finish(self, response_id: str) -> None:
        """All of ``response_id``'s audio is queued; ``stopped`` follows once the last frame has
        gone out."""
        self._complete[response_id] = None
        while len(self._complete) > 16:  # bounded: only recent responses matter
            del self._complete[next(iter(self._complete))]
        if self._playing == response_id and not any(c.response_id == response_id for c in self._chunks):
            self._stop_playing()

    def clear(self, response_id: str | None = None, *, announce: bool = True) -> bool:
        """Drop everything queued at once (barge-in). Returns True when audio was cut short.

        The frame clock keeps running, so timestamps stay continuous. ``announce`` False: the
        caller already has the ``output_audio_buffer.cleared`` event in hand.
        """
        cut = self._playing is not None or self._queued > 0
        rid = self._playing or (self._chunks[0].response_id if self._chunks else None) or response_id
        self._chunks.clear()
        self._queued = 0
        self._room.set()
        self._playing = None
        if cut:
            self.cleared += 1
            if announce:
                self._notify(server_event("output_audio_buffer.cleared", response_id=rid))
        return cut

    @property
    def playing(self) -> str | None:
        return self._playing

    # ------------------------------------------------------------------ internals
    def _stop_playing(self) -> None:
        rid, self._playing = self._playing, None
        self._notify(server_event("output_audio_buffer.stopped", response_id=rid))

    def _fence(self) -> None:
        """Epoch fence at send time: audio of an epoch the session has moved past is stale."""
        if self._chunks and self._runner.is_stale(self._chunks[0].epoch):
            self.clear()

    def _follow_live(self) -> None:
        assert self._live_max is not None
        if self._queued > self._live_max:
            self._skip_backlog(self._queued - self._frame * 2)
            self._live_low, self._live_seen = None, 0
            return
        self._live_low = self._queued if self._live_low is None else min(self._live_low, self._queued)
        self._live_seen += 1
        if self._live_seen >= LIVE_WINDOW:
            spare = self._live_low - self._frame - LIVE_CUSHION
            if spare >= LIVE_SPARE:
                self._skip_backlog(spare)
            self._live_low, self._live_seen = None, 0

    def _skip_backlog(self, excess: int) -> None:
        self.skipped_ms += 1000.0 * excess / TRACK_RATE
        while excess > 0 and self._chunks:
            chunk = self._chunks[0]
            n = min(excess, len(chunk.pcm) - chunk.pos)
            chunk.pos += n
            excess -= n
            self._queued -= n
            if chunk.pos >= len(chunk.pcm):
                self._chunks.popleft()

    def _next_samples(self) -> np.ndarray:
        self._fence()
        if self._live_max is not None:
            self._follow_live()
        if not self._chunks:
            if self._playing is not None and self._playing not in self._complete:
                self.underruns += 1  # the response is still being produced: silence gap
            return self._silence
        if self._queued < self._frame and self._chunks[-1].response_id not in self._complete:
            # Less than a frame while more is coming: one clean 20 ms gap now (the stream then
            # runs one frame later) rather than a frame torn by zeros in the middle.
            if self._playing is not None:
                self.underruns += 1
            return self._silence
        out: np.ndarray | None = None
        filled = 0
        played: dict[str, int] = {}
        while filled < self._frame and self._chunks:
            chunk = self._chunks[0]
            if chunk.response_id != self._playing:
                if self._playing is not None:
                    self._stop_playing()
                self._playing = chunk.response_id
                self._notify(server_event("output_audio_buffer.started", response_id=chunk.response_id))
            n = min(self._frame - filled, len(chunk.pcm) - chunk.pos)
            if n == self._frame:  # the whole frame from one chunk: a view, no copy
                out = chunk.pcm[chunk.pos : chunk.pos + n]
            else:
                if out is None:
                    out = np.zeros(self._frame, dtype=np.int16)
                out[filled : filled + n] = chunk.pcm[chunk.pos : chunk.pos + n]
            filled += n
            chunk.pos += n
            played[chunk.response_id] = played.get(chunk.response_id, 0) + n
            if chunk.pos >= len(chunk.pcm):
                self._chunks.popleft()
        self._queued -= filled
        if self._queued < self._max_samples:
            self._room.set()
        for rid, samples in played.items():
            self._runner.played(rid, 1000.0 * samples / TRACK_RATE)  # playback truth: what went out
        if self._playing is not None and self._playing in self._complete and not self._chunks:
            self._stop_playing()
        elif filled < self._frame and self._playing not in self._complete:
            self.underruns += 1
        self.audio_frames_sent += 1
        assert out is not None  # the queue held audio: the loop ran
        return out

    async def recv(self) -> Packet | AudioFrame:
        if self.readyState != "live":
            raise MediaStreamError
        if self._packet_length is not None and (self._encoder is None or self._encoder.settled):
            wanted = self._packet_length()
            if wanted != self.packet_ms:
                self._use(wanted)
        clock = frame_clock()
        now = clock.current()
        if self._tick is None:
            self._tick = now + 1
        if self._tick > now:
            while self._tick > clock.tick:
                await clock.next_tick()
        elif now - self._tick > 5:
            # this track fell behind the clock (its sender stalled): skip ahead instead of
            # bursting frames to catch up. pts still advance by one frame, so RTP timestamps
            # stay continuous.
            self.late_frames += 1
            self._tick = now
        self._tick += self._ticks
        if self.readyState != "live":
            raise MediaStreamError
        samples = self.last_frame = self._next_samples()
        pts = self._pts
        self._pts += CLOCK_FRAME * self._ticks
        self.frames_sent += 1
        if self._encoder is None:
            self._encoder = self._encoders[self.packet_ms] = OpusPacketEncoder(**SERVER_OPUS, frame_ms=self.packet_ms)
        packet = self._encoder.encode(samples, pts)
        if packet is not None:
            return packet
        # the encoder held the frame back (never seen with libopus): hand aiortc the raw frame
        frame = AudioFrame.from_ndarray(samples.reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate = TRACK_RATE
        frame.pts = pts * TRACK_RATE // RATE
        frame.time_base = fractions.Fraction(1, TRACK_RATE)
        return frame

    def stop(self) -> None:
        super().stop()
        self._chunks.clear()
        self._queued = 0
        self._room.set()


def at_track_rate(audio: Pcm, resamplers: dict[int, StreamResampler]) -> np.ndarray:
    """An output delta → 24 kHz int16 for the track (audio/pcm's rate needs no work; a
    telephony-format response at 8 kHz goes through one stream per rate)."""
    if audio.rate == WIRE_RATE:
        return audio.samples
    resampler = resamplers.get(audio.rate)
    if resampler is None:
        resampler = resamplers[audio.rate] = StreamResampler(audio.rate, WIRE_RATE)
    return resampler.process(audio.samples)
