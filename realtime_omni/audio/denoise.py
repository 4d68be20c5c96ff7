"""Input noise reduction (``audio.input.noise_reduction``) with RNNoise, streamed per session.

RNNoise (xiph, BSD-3-Clause) comes from the optional ``pyrnnoise`` wheel (Apache-2.0), which
bundles ``librnnoise`` built for x86_64/arm64. It works on 10 ms frames of 48 kHz audio: input
is resampled up with soxr, cut into frames (a remainder waits for the next chunk), denoised, and
resampled back, so the output lags the input by up to one frame plus the two resamplers' delay
(about 20-30 ms at 24 kHz in) and a chunk's output may be shorter or longer than its input.

RNNoise has one model and no tuning knob, so ``near_field`` and ``far_field`` run the same
processing; the type is kept only to report it back in ``session.updated``.
"""

from __future__ import annotations

import ctypes
import importlib.util
import logging
import sys
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Literal

import numpy as np

from .pcm import Pcm
from .resample import StreamResampler

log = logging.getLogger(__name__)
NoiseReduction = Literal["near_field", "far_field"]
KINDS: tuple[NoiseReduction, ...] = ("near_field", "far_field")
RNNOISE_RATE = 48_000
PACKAGE = "pyrnnoise"
_LIBRARY_NAMES = {"linux": "librnnoise.so", "darwin": "librnnoise.dylib", "win32": "rnnoise.dll"}


def available() -> bool:
    """Whether the denoiser can run here (the package is installed and its library loads)."""
    if importlib.util.find_spec(PACKAGE) is None:  # looked up each time: installs can change
        return False
    try:
        _library()
    except OSError:
        return False
    return True


@cache
def _library() -> ctypes.CDLL:
    # The library is loaded directly: importing the package also imports its file I/O helpers
    # (audiolab, PyAV graphs), about 0.3 s that a session should not wait for.
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise OSError(f"{PACKAGE} is not installed")
    path = Path(next(iter(spec.submodule_search_locations))) / _LIBRARY_NAMES.get(sys.platform, "librnnoise.so")
    lib = ctypes.CDLL(str(path))
    lib.rnnoise_create.argtypes = [ctypes.c_void_p]
    lib.rnnoise_create.restype = ctypes.c_void_p
    lib.rnnoise_destroy.argtypes = [ctypes.c_void_p]
    lib.rnnoise_destroy.restype = None
    lib.rnnoise_get_frame_size.restype = ctypes.c_int
    lib.rnnoise_process_frame.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_float),
                                          ctypes.POINTER(ctypes.c_float)]
    lib.rnnoise_process_frame.restype = ctypes.c_float
    return lib


class StreamDenoiser:
    """Denoises consecutive int16 chunks of one stream at ``rate``; state carries across chunks.

    Frames are cut from the 48 kHz stream, not per chunk, so chunking does not move them; the
    output still differs slightly with chunking because soxr's streaming rounds per chunk.
    """

    def __init__(self, rate: int, quality: str = "LQ") -> None:
        self.rate = rate
        self._lib = _library()
        self._frame = int(self._lib.rnnoise_get_frame_size())  # 480: 10 ms at 48 kHz
        self._state: int | None = self._lib.rnnoise_create(None)
        if not self._state:
            raise MemoryError("rnnoise_create failed")
        # soxr's LQ filter: about 20 ms there and back at 24 kHz, where HQ holds back 65 ms;
        # RNNoise's coarse bands do not need HQ's steeper anti-imaging filter
        self._up = StreamResampler(rate, RNNOISE_RATE, quality)
        self._down = StreamResampler(RNNOISE_RATE, rate, quality)
        self._pending = np.zeros(0, dtype=np.float32)

    def process(self, pcm: np.ndarray) -> np.ndarray:
        """Feed int16 samples at ``rate``; returns the denoised samples ready so far."""
        up = self._up.process(pcm).astype(np.float32)
        if len(self._pending):
            up = np.concatenate([self._pending, up])
        whole = len(up) // self._frame * self._frame
        frames, self._pending = np.ascontiguousarray(up[:whole]), up[whole:]
        pointer = ctypes.POINTER(ctypes.c_float)
        for start in range(0, whole, self._frame):
            # in place: RNNoise allows the same buffer for input and output
            view = frames[start:start + self._frame].ctypes.data_as(pointer)
            self._lib.rnnoise_process_frame(self._state, view, view)  # returns a voice probability, unused
        cleaned = np.clip(np.rint(frames), -32768, 32767).astype(np.int16)
        return self._down.process(cleaned)

    def close(self) -> None:
        if self._state:
            self._lib.rnnoise_destroy(self._state)
            self._state = None

    def __del__(self) -> None:
        self.close()


class InputDenoiser:
    """A session's input noise reduction, following the session's setting as it changes.

    ``setting`` returns the current ``noise_reduction`` type (``None``: off). The stream state
    is kept while it stays on at the same rate (both types run the same processing).
    """

    def __init__(self, setting: Callable[[], NoiseReduction | None]) -> None:
        self._setting = setting
        self._stream: StreamDenoiser | None = None
        self._unloadable = False

    def process(self, audio: Pcm) -> Pcm:
        """The input chunk as the session should hear it (unchanged when noise reduction is off)."""
        if self._setting() is None or self._unloadable:
            if self._stream is not None:
                self._stream.close()
                self._stream = None
            return audio
        if self._stream is None or self._stream.rate != audio.rate:
            if self._stream is not None:
                self._stream.close()
            try:
                self._stream = StreamDenoiser(audio.rate)
            except OSError:  # a session restored on a server without the package: hear it raw
                self._unloadable = True
                log.warning("noise_reduction is set but %s cannot be loaded; input is not denoised", PACKAGE)
                return audio
        return Pcm(self._stream.process(audio.samples), audio.rate)
