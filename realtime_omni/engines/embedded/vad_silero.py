"""Silero VAD (v5/v6 onnx) run with onnxruntime: one shared session, recurrent state per stream.

The model file is the one faster-whisper ships (``faster_whisper/assets/silero_vad_v6.onnx``,
already installed for the recognizer): the ``silero-vad`` package would carry the same network but
declares a dependency on torch, which nothing else in the embedded default needs.
"""

from __future__ import annotations

import importlib.resources
from pathlib import Path

import numpy as np
import onnxruntime as ort

from ..base import VADStream

SAMPLE_RATE = 16_000
FRAME = 512  # samples per model call at 16 kHz (32 ms)
CONTEXT = 64  # v5+ models see the last 64 samples of the previous frame in front of each frame


def default_model_path() -> Path:
    return Path(str(importlib.resources.files("faster_whisper") / "assets" / "silero_vad_v6.onnx"))


class SileroVAD:
    """Holds the onnx session; ``InferenceSession.run`` is thread-safe, so streams share it."""

    def __init__(self, path: str | Path | None = None) -> None:
        opts = ort.SessionOptions()
        # one frame is ~1 ms of work: threads only add wake-up latency and contend with the LLM
        opts.intra_op_num_threads = 1
        opts.inter_op_num_threads = 1
        self.session = ort.InferenceSession(
            str(path or default_model_path()), sess_options=opts, providers=["CPUExecutionProvider"]
        )
        self._sr = np.array(SAMPLE_RATE, dtype=np.int64)
        # faster-whisper's export takes the LSTM's h and c apart and no sample rate (16 kHz only);
        # silero's own takes one stacked ``state`` and ``sr``
        self._split_state = {"h", "c"} <= {i.name for i in self.session.get_inputs()}

    def initial_state(self) -> np.ndarray:
        return np.zeros((2, 1, 1, 128) if self._split_state else (2, 1, 128), dtype=np.float32)

    def run(self, window: np.ndarray, state: np.ndarray) -> tuple[float, np.ndarray]:
        """One model call: ``window`` is float32 [1, CONTEXT + FRAME]; returns (prob, new state)."""
        if self._split_state:
            prob, h, c = self.session.run(None, {"input": window, "h": state[0], "c": state[1]})
            return float(np.asarray(prob).reshape(-1)[0]), np.stack([h, c])
        prob, new_state = self.session.run(None, {"input": window, "state": state, "sr": self._sr})
        return float(prob[0, 0]), new_state

    def stream(self) -> SileroVADStream:
        return SileroVADStream(self)


class SileroVADStream(VADStream):
    """Per-stream LSTM state and sample context (what silero's own ``OnnxWrapper`` keeps)."""

    frame_samples = FRAME

    def __init__(self, model: SileroVAD) -> None:
        self._model = model
        self.reset()

    def reset(self) -> None:
        self._state = self._model.initial_state()
        self._context = np.zeros(CONTEXT, dtype=np.float32)

    def probabilities(self, pcm16k: np.ndarray) -> list[float]:
        if len(pcm16k) % FRAME:
            raise ValueError(f"VAD input must be whole {FRAME}-sample frames, got {len(pcm16k)}")
        audio = pcm16k.astype(np.float32) / 32768.0
        probs: list[float] = []
        window = np.empty((1, CONTEXT + FRAME), dtype=np.float32)
        for start in range(0, len(audio), FRAME):
            window[0, :CONTEXT] = self._context
            window[0, CONTEXT:] = audio[start : start + FRAME]
            prob, self._state = self._model.run(window, self._state)
            self._context = window[0, -CONTEXT:].copy()
            probs.append(prob)
        return probs
