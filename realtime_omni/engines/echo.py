"""The echo engine: loads nothing; what it hears goes straight back out.

A duplex model (``ModelInfo.duplex``): each piece of input audio comes back from
:meth:`EchoSession.listen` unchanged, and the session plays it as one long response. Sessions
open it cheaply (smoke tests, transport latency runs).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

from ..audio import Pcm
from .base import (
    ModelInfo,
    ModelSession,
    TalkerOutput,
    ThinkerOutput,
    ThinkRequest,
    VoiceModel,
)


class EchoSession(ModelSession):
    listens_inline = True

    def listen(self, audio: Pcm) -> Pcm:
        return audio  # the same samples: the session resamples only if its output rate differs

    def think(self, request: ThinkRequest) -> Iterator[ThinkerOutput]:
        return iter(())

    def talk(
        self, segment: list[ThinkerOutput], voice: str, cancelled: threading.Event, final: bool, speed: float = 1.0
    ) -> Iterator[TalkerOutput]:
        return iter(())


class EchoModel(VoiceModel):
    info = ModelInfo(
        id="echo",
        capabilities=frozenset({"audio_in", "audio_out", "echo"}),
        output_rate=24_000,
        hears_audio=False,
        duplex=True,
    )

    def load(self, progress: Callable[[str], None] = lambda _msg: None) -> None:
        progress("echo: nothing to load")

    def open_session(self) -> ModelSession:
        return EchoSession()
