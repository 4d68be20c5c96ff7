"""The embedded CPU cascade: Silero VAD → Whisper tiny.en → SmolLM2-135M → Piper, in-process."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import numpy as np

from ..base import (
    ModelInfo,
    ModelSession,
    TalkerOutput,
    ThinkerOutput,
    ThinkRequest,
    VADStream,
    VoiceModel,
)
from ..settings import EmbeddedSettings
from .asr_whisper import WhisperASR
from .llm import LlamaThinker, LlamaThinkerModel
from .tts_piper import SAMPLE_RATE, PiperTTS
from .vad_silero import SileroVAD


class EmbeddedSession(ModelSession):
    """Per-session state: VAD streams and the thinker's own context cache; the rest is shared."""

    def __init__(self, model: EmbeddedModel, thinker: LlamaThinker) -> None:
        self._model = model
        self._thinker = thinker

    def new_vad(self) -> VADStream:
        return self._model.vad.stream()

    def transcribe(self, pcm16k: np.ndarray) -> str:
        return self._model.asr.transcribe(pcm16k)

    def think(self, request: ThinkRequest) -> Iterator[ThinkerOutput]:
        return self._thinker.think(request)

    def talk(
        self, segment: list[ThinkerOutput], voice: str, cancelled: threading.Event, final: bool, speed: float = 1.0
    ) -> Iterator[TalkerOutput]:
        # only one voice is installed: every requested name ("alloy", "verse", ...) gets joe
        return self._model.tts.talk("".join(out.text for out in segment), cancelled, final, speed)

    def confirm(self, spoken_text: str) -> None:
        self._thinker.confirm(spoken_text)

    def close(self) -> None:
        self._thinker.close()


class EmbeddedModel(VoiceModel):
    info = ModelInfo(
        id="embedded",
        capabilities=frozenset({"audio_in", "text_in", "audio_out", "text_out", "transcription", "vad", "tools"}),
        output_rate=SAMPLE_RATE,
        hears_audio=False,
    )

    def __init__(self, settings: EmbeddedSettings | None = None) -> None:
        self.settings = settings if settings is not None else EmbeddedSettings()
        self._threads = self.settings.threads
        self.vad: SileroVAD
        self.asr: WhisperASR
        self.llm: LlamaThinkerModel
        self.tts: PiperTTS
        #: seconds each component took to load (and warm up), for logs and benchmarks
        self.load_times: dict[str, float] = {}

    def load(self, progress: Callable[[str], None] = lambda _msg: None) -> None:
        def step(name: str, build: Callable[[], None]) -> None:
            progress(f"loading {name}…")
            start = time.perf_counter()
            build()
            self.load_times[name] = time.perf_counter() - start
            progress(f"{name} ready in {self.load_times[name]:.2f}s")

        def vad() -> None:
            self.vad = SileroVAD()

        def asr() -> None:
            self.asr = WhisperASR(cpu_threads=self._threads)
            # the first CTranslate2 call pays one-off allocation costs: pay them now
            self.asr.transcribe(np.zeros(16_000, dtype=np.int16))

        def llm() -> None:
            self.llm = LlamaThinkerModel(self.settings.llm_path, n_ctx=self.settings.context_tokens,
                                         n_threads=self._threads, cache_dir=self.settings.cache_dir)
            self.llm.load(progress)

        def tts() -> None:
            self.tts = PiperTTS(threads=self._threads)
            for _ in self.tts.synthesize("Ready."):  # warm the onnx session and espeak
                pass

        step("VAD", vad)
        step("ASR", asr)
        step("LLM", llm)
        step("TTS", tts)

    def open_session(self) -> EmbeddedSession:
        # cheap: the session's cache is warmed on the shared loader thread in the background
        return EmbeddedSession(self, self.llm.open())

    def close(self) -> None:
        if hasattr(self, "llm"):
            self.llm.close()
