"""Session-wide fixtures: the real embedded models, loaded once, and real servers on loopback."""

from __future__ import annotations

import gc
import shutil
import socket
import subprocess
import time

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
    # as the server does at start-up (app.py): the models' objects leave the collector's full
    # passes, which otherwise pause every thread of this process (servers and clients alike)
    # for a third of a second
    gc.collect()
    gc.freeze()
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
    """Text → speech (int16) at the requested rate, synthesized by the embedded Piper voice
    without its sampling noise: the same words on every run, so what the ASR hears is too."""

    def _say(text: str, rate: int = 24_000) -> np.ndarray:
        chunks = list(embedded.tts.synthesize(text, steady=True))
        pcm = np.concatenate(chunks) if chunks else np.zeros(0, np.int16)
        return resample_once(pcm, embedded.tts.sample_rate, rate)

    return _say


@pytest.fixture(scope="session")
def transcribe(embedded):
    """int16 audio at ``rate`` → text, by the embedded Whisper."""

    def _transcribe(pcm: np.ndarray, rate: int) -> str:
        return embedded.asr.transcribe(resample_once(pcm, rate, 16_000))

    return _transcribe


@pytest.fixture
def redis_url(tmp_path):
    """A real redis-server on a free loopback port, for this test only."""
    server = shutil.which("redis-server")
    if server is None:
        pytest.skip("redis-server is not installed (scripts/test.sh installs it)")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([server, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--dir", str(tmp_path)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            break
        except OSError:
            time.sleep(0.05)
    yield f"redis://127.0.0.1:{port}/0"
    proc.terminate()
    proc.wait(10)


