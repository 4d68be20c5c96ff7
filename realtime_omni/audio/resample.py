"""Stateful band-limited resampling (libsoxr) for one direction of one stream."""

from __future__ import annotations

import numpy as np
import soxr


class StreamResampler:
    """Resamples consecutive int16 chunks of one stream without seams.

    soxr keeps filter history between calls, so chunk boundaries are inaudible; a new stream
    (or a barge-in flush) needs a fresh instance or :meth:`reset`.
    """

    def __init__(self, in_rate: int, out_rate: int, quality: str = "HQ") -> None:
        self.in_rate = in_rate
        self.out_rate = out_rate
        self._quality = quality
        self._stream = self._new_stream()

    def _new_stream(self) -> soxr.ResampleStream | None:
        if self.in_rate == self.out_rate:
            return None
        return soxr.ResampleStream(self.in_rate, self.out_rate, 1, dtype="int16", quality=self._quality)

    def process(self, pcm: np.ndarray, last: bool = False) -> np.ndarray:
        """Feed int16 mono samples; returns whatever output is ready (may be empty)."""
        if self._stream is None:
            return pcm.astype(np.int16, copy=False)
        return self._stream.resample_chunk(pcm.astype(np.int16, copy=False), last=last)

    def flush(self) -> np.ndarray:
        """Drain the filter tail at the end of a stream."""
        if self._stream is None:
            return np.zeros(0, dtype=np.int16)
        return self._stream.resample_chunk(np.zeros(0, dtype=np.int16), last=True)

    def reset(self) -> None:
        self._stream = self._new_stream()


def resample_once(pcm: np.ndarray, in_rate: int, out_rate: int) -> np.ndarray:
    """Resample a whole clip in one call (tests, offline tools)."""
    if in_rate == out_rate:
        return pcm.astype(np.int16, copy=False)
    return soxr.resample(pcm.astype(np.int16, copy=False), in_rate, out_rate, quality="HQ")
