"""G.711 μ-law and A-law (ITU-T G.711) as table lookups.

The stdlib ``audioop`` is gone from Python 3.13 and no maintained pure-wheel library covers
both laws, so the two 256-entry decode tables and two 65 536-entry encode tables are built
once, vectorised with numpy.
"""

from __future__ import annotations

import numpy as np

_BIAS = 0x84
_CLIP = 32635


def _ulaw_encode_scalar(sample: int) -> int:
    sign = 0x80 if sample < 0 else 0
    magnitude = min(-sample if sample < 0 else sample, _CLIP) + _BIAS
    exponent = max(magnitude.bit_length() - 8, 0)
    mantissa = (magnitude >> (exponent + 3)) & 0x0F
    return ~(sign | (exponent << 4) | mantissa) & 0xFF


def _ulaw_decode_scalar(byte: int) -> int:
    byte = ~byte & 0xFF
    sign, exponent, mantissa = byte & 0x80, (byte >> 4) & 0x07, byte & 0x0F
    magnitude = (((mantissa << 3) + _BIAS) << exponent) - _BIAS
    if sign and not magnitude:
        # 0x7F, "negative zero": -1 (still inside the code's interval) rather than 0, so that
        # every μ-law byte survives decoding to PCM and encoding back (audio is PCM inside)
        return -1
    return -magnitude if sign else magnitude


def _alaw_encode_scalar(sample: int) -> int:
    sign = 0x80 if sample >= 0 else 0
    magnitude = min(sample if sample >= 0 else -sample - 1, 32767) >> 3
    if magnitude < 32:
        code = magnitude >> 1
    else:
        exponent = magnitude.bit_length() - 5
        code = (exponent << 4) | ((magnitude >> exponent) & 0x0F)
    return (sign | code) ^ 0x55


def _alaw_decode_scalar(byte: int) -> int:
    byte ^= 0x55
    exponent, mantissa = (byte >> 4) & 0x07, byte & 0x0F
    if exponent == 0:
        magnitude = (mantissa << 4) + 8
    else:
        magnitude = ((mantissa << 4) + 0x108) << (exponent - 1)
    return magnitude if byte & 0x80 else -magnitude


_ALL_SAMPLES = range(-32768, 32768)
_ULAW_ENCODE = np.array([_ulaw_encode_scalar(s) for s in _ALL_SAMPLES], dtype=np.uint8)
_ALAW_ENCODE = np.array([_alaw_encode_scalar(s) for s in _ALL_SAMPLES], dtype=np.uint8)
_ULAW_DECODE = np.array([_ulaw_decode_scalar(b) for b in range(256)], dtype=np.int16)
_ALAW_DECODE = np.array([_alaw_decode_scalar(b) for b in range(256)], dtype=np.int16)


def ulaw_encode(pcm: np.ndarray) -> bytes:
    """int16 samples → μ-law bytes (one byte per sample)."""
    return _ULAW_ENCODE[pcm.astype(np.int32) + 32768].tobytes()


def ulaw_decode(data: bytes) -> np.ndarray:
    """μ-law bytes → int16 samples."""
    return _ULAW_DECODE[np.frombuffer(data, dtype=np.uint8)]


def alaw_encode(pcm: np.ndarray) -> bytes:
    """int16 samples → A-law bytes."""
    return _ALAW_ENCODE[pcm.astype(np.int32) + 32768].tobytes()


def alaw_decode(data: bytes) -> np.ndarray:
    """A-law bytes → int16 samples."""
    return _ALAW_DECODE[np.frombuffer(data, dtype=np.uint8)]
