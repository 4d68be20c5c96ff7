"""Session-wide fixtures: the real embedded models, loaded once, and real servers on loopback."""

from __future__ import annotations

import numpy as np
import pytest

from realtime_omni.audio.resample import resample_once
from realtime_omni.engines.registry import ModelRegistry

from .server import ServerThread


@pytest.fixture(scope="session")
def registry() -> ModelRegistry:
    """embedded (default) + echo, loaded once for the whole run."""
    pytest.importorskip("realtime_omni.engines.embedded", reason="needs the 'embedded' extra")
    reg = ModelRegistry()
    reg.load(["embedded", "echo"])
    yield reg
    reg.close()


@pytest.fixture(scope="session")
def embedded(registry):
    return registry.get("embedded")


@pytest.fixture(scope="session")
def server(registry):
    with ServerThread(registry) as srv:
        yield srv


@pytest.fixture(scope="session")
def say(embedded):
    """Text → speech (int16) at the requested rate, synthesized by the embedded Piper voice."""

    def _say(text: str, rate: int = 24_000) -> np.ndarray:
        chunks = list(embedded.tts.synthesize(text))
        pcm = np.concatenate(chunks) if chunks else np.zeros(0, np.int16)
        return resample_once(pcm, embedded.tts.sample_rate, rate)

    return _say


@pytest.fixture(scope="session")
def transcribe(embedded):
    """int16 audio at ``rate`` → text, by the embedded Whisper."""

    def _transcribe(pcm: np.ndarray, rate: int) -> str:
        return embedded.asr.transcribe(resample_once(pcm, rate, 16_000))

    return _transcribe
