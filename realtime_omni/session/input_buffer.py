"""The input audio buffer: PCM in at any rate, 16 kHz samples held until commit or clear."""

from __future__ import annotations

import numpy as np

from ..audio import Pcm, StreamResampler

MODEL_RATE = 16_000


class InputAudioBuffer:
    """Holds uncommitted input at 16 kHz and tracks stream time in milliseconds.

    Bounded: past ``max_seconds`` the oldest audio is dropped, so a client that never commits
    cannot grow memory without limit.
    """

    def __init__(self, max_seconds: float = 300.0) -> None:
        # one stream per input rate: JSON audio (24 or 8 kHz) and a call's microphone (48 kHz)
        # may interleave without resetting each other's filter history
        self._resamplers: dict[int, StreamResampler] = {}
        self._chunks: list[np.ndarray] = []
        self._samples = 0
        self._max_samples = int(max_seconds * MODEL_RATE)
        #: samples at 16 kHz received since the stream began (the clock for audio_*_ms)
        self.stream_samples = 0
        #: stream position (samples) where the current buffer begins
        self.buffer_start = 0

    def append(self, audio: Pcm) -> np.ndarray:
        """Resample to 16 kHz (the one conversion input audio gets); returns the new samples."""
        resampler = self._resamplers.get(audio.rate)
        if resampler is None:
            resampler = self._resamplers[audio.rate] = StreamResampler(audio.rate, MODEL_RATE)
        pcm = resampler.process(audio.samples)
        self._hold(pcm)
        return pcm

    def _hold(self, pcm: np.ndarray) -> None:
        if len(pcm):
            self._chunks.append(pcm)
            self._samples += len(pcm)
            self.stream_samples += len(pcm)
            excess = self._samples - self._max_samples
            while excess > 0 and self._chunks:  # the oldest samples go, only as many as needed
                head = self._chunks[0]  # (after a peek, one chunk holds the whole buffer)
                drop = min(len(head), excess)
                if drop == len(head):
                    self._chunks.pop(0)
                else:
                    self._chunks[0] = head[drop:]
                self._samples -= drop
                self.buffer_start += drop
                excess -= drop

    def end_streams(self) -> np.ndarray:
        """The client says its audio so far is complete (a manual commit): what each resampler
        still holds back (its filter delay: about 20 ms from 24 kHz, 60 ms from 8 kHz) joins the
        buffer, and the next audio starts a fresh stream. Returns those samples."""
        tails = []
        for resampler in self._resamplers.values():
            tails.append(resampler.flush())
            self._hold(tails[-1])
            resampler.reset()
        return np.concatenate(tails) if tails else np.zeros(0, dtype=np.int16)

    @property
    def duration_ms(self) -> float:
        return 1000.0 * self._samples / MODEL_RATE

    @property
    def now_ms(self) -> int:
        return int(1000 * self.stream_samples / MODEL_RATE)

    def peek(self, start_ms: float | None = None, end_ms: float | None = None) -> np.ndarray:
        """The buffered audio between the stream positions given (the buffer is unchanged)."""
        audio = np.concatenate(self._chunks) if self._chunks else np.zeros(0, dtype=np.int16)
        if len(self._chunks) > 1:
            self._chunks = [audio]  # keep it joined: the next peek or take is a copy-free slice
        offset = self.buffer_start
        lo = 0 if start_ms is None else max(int(start_ms * MODEL_RATE / 1000) - offset, 0)
        hi = len(audio) if end_ms is None else max(int(end_ms * MODEL_RATE / 1000) - offset, lo)
        return audio[lo:hi]

    def take(self, start_ms: float | None = None, end_ms: float | None = None) -> np.ndarray:
        """Remove the buffered audio and return the part between the stream positions given."""
        audio = self.peek(start_ms, end_ms)
        self.clear()
        return audio

    def clear(self, streams: bool = False) -> None:
        """Drop the buffered audio (``streams``: and what the resamplers hold back of it, so
        none of it reaches the next turn)."""
        if streams:
            for resampler in self._resamplers.values():
                resampler.reset()
        self._chunks.clear()
        self._samples = 0
        self.buffer_start = self.stream_samples
