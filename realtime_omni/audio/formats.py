"""Wire audio formats of the Realtime API and their codecs."""

from __future__ import annotations

import enum

import numpy as np

from . import g711
from .pcm import Pcm
from .resample import resample_once


class AudioFormat(str, enum.Enum):
    """The three formats the Realtime API defines; values are the GA type names."""

    PCM = "audio/pcm"
    PCMU = "audio/pcmu"
    PCMA = "audio/pcma"

    @property
    def rate(self) -> int:
        return 24_000 if self is AudioFormat.PCM else 8_000

    @property
    def bytes_per_sample(self) -> int:
        return 2 if self is AudioFormat.PCM else 1

    def decode(self, data: bytes) -> np.ndarray:
        """Wire bytes → int16 samples at :attr:`rate`. Raises ValueError on a torn sample."""
        if self is AudioFormat.PCM:
            if len(data) % 2:
                raise ValueError("audio/pcm payload must hold whole 16-bit samples")
            return np.frombuffer(data, dtype="<i2").astype(np.int16)
        return g711.ulaw_decode(data) if self is AudioFormat.PCMU else g711.alaw_decode(data)

    def encode(self, pcm: np.ndarray) -> bytes:
        """int16 samples at :attr:`rate` → wire bytes."""
        if self is AudioFormat.PCM:
            return pcm.astype("<i2", copy=False).tobytes()
        return g711.ulaw_encode(pcm) if self is AudioFormat.PCMU else g711.alaw_encode(pcm)

    def to_pcm(self, data: bytes) -> Pcm:
        """Wire bytes → :class:`Pcm` (the inbound edge). Raises ValueError on a torn sample."""
        return Pcm(self.decode(data), self.rate)

    def from_pcm(self, audio: Pcm) -> bytes:
        """:class:`Pcm` → wire bytes (the outbound edge). Audio is rendered at :attr:`rate`; a
        chunk at another rate (a prepared reply adopted by a response that asked for another
        format) is resampled on its own rather than sent at the wrong speed."""
        samples = audio.samples if audio.rate == self.rate else resample_once(audio.samples, audio.rate, self.rate)
        return self.encode(samples)

    def duration_ms(self, nbytes: int) -> float:
        return 1000.0 * nbytes / (self.bytes_per_sample * self.rate)

    @property
    def beta_name(self) -> str:
        return {"audio/pcm": "pcm16", "audio/pcmu": "g711_ulaw", "audio/pcma": "g711_alaw"}[self.value]


_ALIASES = {
    "audio/pcm": AudioFormat.PCM,
    "pcm16": AudioFormat.PCM,
    "audio/pcmu": AudioFormat.PCMU,
    "g711_ulaw": AudioFormat.PCMU,
    "audio/pcma": AudioFormat.PCMA,
    "g711_alaw": AudioFormat.PCMA,
}


def parse_audio_format(value: object) -> AudioFormat:
    """Accepts a GA format object (``{"type": "audio/pcm", "rate": 24000}``) or a beta string."""
    rate = None
    if isinstance(value, dict):
        rate = value.get("rate")
        value = value.get("type")
    if not isinstance(value, str) or value not in _ALIASES:
        raise ValueError(f"unsupported audio format {value!r}; use audio/pcm, audio/pcmu or audio/pcma")
    fmt = _ALIASES[value]
    if rate is not None and rate != fmt.rate:
        raise ValueError(f"{fmt.value} is only supported at {fmt.rate} Hz, not {rate}")
    return fmt
