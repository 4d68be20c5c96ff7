"""Media edges of a WebRTC call: the incoming microphone track and the outgoing paced track.

Incoming: aiortc decodes Opus to ``av.AudioFrame`` (48 kHz, s16, stereo); :func:`pump_audio_in`
downmixes, resamples (stateful soxr) to the session's input rate and feeds
:meth:`SessionRunner.submit_audio` — the same path as ``input_audio_buffer.append``.

Outgoing: :class:`OutgoingAudioTrack` is what aiortc's sender pulls from. It produces one 20 ms,
48 kHz mono frame per tick of its own clock, with ``pts`` advancing by exactly 960 each frame, so
RTP timestamps never jump: silence fills the gaps between responses and any underrun. It is the
playback truth of the call: it reports the milliseconds of each response that actually went out
into the session's :class:`~realtime_omni.session.playback.PlaybackLedger` frame by frame, and it
tells the writer when a response starts, stops and is cleared (``output_audio_buffer.*``).
"""

from __future__ import annotations

import asyncio
import fractions
import logging
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack
from av import AudioFrame

from ...audio import AudioFormat, StreamResampler
from ...session.runner import SessionRunner

log = logging.getLogger(__name__)

RATE = 48_000
FRAME_MS = 20
FRAME_SAMPLES = RATE * FRAME_MS // 1000  # 960
TIME_BASE = fractions.Fraction(1, RATE)
WIRE_RATE = 24_000  # the session's audio/pcm rate


def server_event(kind: str, **fields: Any) -> dict[str, Any]:
    return {"type": kind, "event_id": f"event_{uuid.uuid4().hex[:20]}", **fields}


@dataclass
class _Chunk:
    response_id: str
    epoch: int
    pcm: np.ndarray  # int16 at 48 kHz
    pos: int = 0


class OutgoingAudioTrack(MediaStreamTrack):
    """The assistant's voice: a bounded queue of response audio, paced at 20 ms per frame.

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
    ) -> None:
        super().__init__()
        #: a live stream (the echo model) arrives at real time, not ahead of it: every late input
        #: frame would leave 20 ms more backlog for good. Past ``live_max_ms`` the oldest audio is
        #: skipped back to two frames of cushion (a playout buffer that shrinks, not only grows).
        self._live_max = None if live_max_ms is None else int(RATE * live_max_ms / 1000)
        self.skipped_ms = 0.0
        self._runner = runner
        self._notify = notify
        self._max_samples = int(RATE * max_queue_ms / 1000)
        self._chunks: deque[_Chunk] = deque()
        self._queued = 0
        self._room = asyncio.Event()
        self._room.set()
        self._resampler = StreamResampler(WIRE_RATE, RATE)
        self._resampler_rid: str | None = None
        self._resampler_epoch = 0
        self._start: float | None = None
        self._frames = 0
        self._playing: str | None = None  # response whose audio is audible now (started, not stopped)
        self._complete: dict[str, None] = {}  # responses all of whose audio has been queued (ordered)
        self._silence = np.zeros(FRAME_SAMPLES, dtype=np.int16)
        # counters (benchmarks, metrics)
        self.frames_sent = 0
        self.audio_frames_sent = 0
        self.underruns = 0
        self.cleared = 0
        self.late_frames = 0

    # ------------------------------------------------------------------ writer side
    @property
    def queued_ms(self) -> float:
        return 1000.0 * self._queued / RATE

    async def push(self, pcm24k: np.ndarray, response_id: str, epoch: int) -> None:
        """Queue one audio delta (24 kHz int16). Waits while the queue is full (backpressure)."""
        if self.readyState != "live":
            return
        while self._queued >= self._max_samples:
            self._room.clear()
            await self._room.wait()
            if self.readyState != "live":
                return
        if response_id != self._resampler_rid:
            self._flush_resampler()
            self._resampler.reset()
            self._resampler_rid, self._resampler_epoch = response_id, epoch
        self._append(response_id, epoch, self._resampler.process(pcm24k))

    def finish(self, response_id: str) -> None:
        """All of ``response_id``'s audio is queued: drain the resampler; ``stopped`` follows
        once the last frame has gone out."""
        if response_id == self._resampler_rid:
            self._flush_resampler()
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
        self._resampler.reset()
        self._resampler_rid = None
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
    def _flush_resampler(self) -> None:
        if self._resampler_rid is not None:
            tail = self._resampler.flush()
            if len(tail):
                self._append(self._resampler_rid, self._resampler_epoch, tail)
            self._resampler_rid = None

    def _append(self, response_id: str, epoch: int, pcm48k: np.ndarray) -> None:
        if len(pcm48k):
            self._chunks.append(_Chunk(response_id, epoch, pcm48k))
            self._queued += len(pcm48k)

    def _stop_playing(self) -> None:
        rid, self._playing = self._playing, None
        self._notify(server_event("output_audio_buffer.stopped", response_id=rid))

    def _fence(self) -> None:
        """Epoch fence at send time: audio of an epoch the session has moved past is stale."""
        epoch = self._runner.core.epoch
        if self._chunks and self._chunks[0].epoch != epoch:
            self.clear()

    def _skip_backlog(self) -> None:
        assert self._live_max is not None
        excess = self._queued - FRAME_SAMPLES * 2
        self.skipped_ms += 1000.0 * excess / RATE
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
        if self._live_max is not None and self._queued > self._live_max:
            self._skip_backlog()
        if not self._chunks:
            if self._playing is not None and self._playing not in self._complete:
                self.underruns += 1  # the response is still being produced: silence gap
            return self._silence
        if self._queued < FRAME_SAMPLES and self._chunks[-1].response_id not in self._complete:
            # Less than a frame while more is coming: one clean 20 ms gap now (the stream then
            # runs one frame later) rather than a frame torn by zeros in the middle.
            if self._playing is not None:
                self.underruns += 1
            return self._silence
        out = np.zeros(FRAME_SAMPLES, dtype=np.int16)
        filled = 0
        ledger = self._runner.core.ledger
        played: dict[str, int] = {}
        while filled < FRAME_SAMPLES and self._chunks:
            chunk = self._chunks[0]
            if chunk.response_id != self._playing:
                if self._playing is not None:
                    self._stop_playing()
                self._playing = chunk.response_id
                self._notify(server_event("output_audio_buffer.started", response_id=chunk.response_id))
            n = min(FRAME_SAMPLES - filled, len(chunk.pcm) - chunk.pos)
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
            ledger.mark_sent(rid, 1000.0 * samples / RATE)  # playback truth: what went out
        if self._playing is not None and self._playing in self._complete and not self._chunks:
            self._stop_playing()
        elif filled < FRAME_SAMPLES and self._playing not in self._complete:
            self.underruns += 1
        self.audio_frames_sent += 1
        return out

    async def recv(self) -> AudioFrame:
        if self.readyState != "live":
            raise MediaStreamError
        now = time.monotonic()
        if self._start is None:
            self._start = now
        due = self._start + self._frames * FRAME_MS / 1000.0
        if due > now:
            await asyncio.sleep(due - now)
        elif now - due > 0.1:
            # The loop stalled: re-anchor the clock instead of bursting frames to catch up.
            # pts still advance by one frame, so RTP timestamps stay continuous.
            self.late_frames += 1
            self._start = now - self._frames * FRAME_MS / 1000.0
        if self.readyState != "live":
            raise MediaStreamError
        samples = self._next_samples()
        # Packed stereo (both channels equal): aiortc's Opus encoder works in stereo, and its
        # mono→stereo upmix would cost a resampler pass and 3 dB of level.
        frame = AudioFrame.from_ndarray(np.repeat(samples, 2).reshape(1, -1), format="s16", layout="stereo")
        frame.sample_rate = RATE
        frame.pts = self._frames * FRAME_SAMPLES
        frame.time_base = TIME_BASE
        self._frames += 1
        self.frames_sent += 1
        return frame

    def stop(self) -> None:
        super().stop()
        self._chunks.clear()
        self._queued = 0
        self._room.set()


def decode_wire(wire: bytes, fmt: AudioFormat, resamplers: dict[str, StreamResampler]) -> np.ndarray:
    """An output delta in the response's wire format → 24 kHz int16 (audio/pcm needs no work)."""
    pcm = fmt.decode(wire)
    if fmt.rate == WIRE_RATE:
        return pcm
    resampler = resamplers.setdefault(fmt.value, StreamResampler(fmt.rate, WIRE_RATE))
    return resampler.process(pcm)


def frame_to_mono(frame: AudioFrame) -> np.ndarray:
    """A decoded audio frame → mono int16 samples (packed s16 stereo is averaged)."""
    data = frame.to_ndarray()
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


class AudioInputStats:
    def __init__(self) -> None:
        self.frames = 0
        self.dropped = 0
        self.last_at = 0.0


async def pump_audio_in(track: MediaStreamTrack, runner: SessionRunner, stats: AudioInputStats) -> None:
    """Microphone → session, until the track ends. Never lets aiortc's frame queue grow: when
    the session's mailbox is full (the session is stuck), frames are dropped and counted."""
    resampler: StreamResampler | None = None
    key: tuple[int, int] | None = None
    while True:
        try:
            frame = await track.recv()
        except MediaStreamError:
            return
        stats.frames += 1
        stats.last_at = time.monotonic()
        if runner.closed.is_set():
            return
        fmt = runner.core.config.input_format
        if key != (frame.sample_rate, fmt.rate):
            key = (frame.sample_rate, fmt.rate)
            resampler = StreamResampler(frame.sample_rate, fmt.rate)
        assert resampler is not None
        pcm = resampler.process(frame_to_mono(frame))
        if not len(pcm):
            continue
        if runner.mailbox.full():
            stats.dropped += 1
            continue
        await runner.submit_audio(fmt.encode(pcm))
