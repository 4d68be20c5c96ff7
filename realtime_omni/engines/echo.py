"""The echo engine: loads nothing and generates nothing.

The session core special-cases it (input audio goes straight back out), so it only has to exist
for ``GET /v1/models`` and for sessions to open it cheaply (smoke tests, transport latency runs).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

from .base import ModelInfo, ModelSession, TalkerOutput, ThinkerOutput, ThinkRequest, VoiceModel


class EchoSession(ModelSession):
    def think(self, request: ThinkRequest) -> Iterator[ThinkerOutput]:
        return iter(())

    def talk(
        self, segment: list[ThinkerOutput], voice: str, cancelled: threading.Event, final: bool
    ) -> Iterator[TalkerOutput]:
        return iter(())


class EchoModel(VoiceModel):
    info = ModelInfo(
        id="echo",
        capabilities=frozenset({"audio_in", "audio_out", "echo"}),
        output_rate=24_000,
        hears_audio=False,
    )

    def load(self, progress: Callable[[str], None] = lambda _msg: None) -> None:
        progress("echo: nothing to load")

    def open_session(self) -> ModelSession:
        return EchoSession()
