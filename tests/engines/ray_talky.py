"""A tiny engine for the Ray placement tests: streams words slowly and speaks a tone per segment.

It lives in an importable module (not a test file) because worker actors in other processes
import its builder by reference.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator

import numpy as np

from realtime_omni.engines.base import (
    ModelInfo,
    ModelSession,
    TalkerOutput,
    ThinkerOutput,
    ThinkRequest,
    VoiceModel,
)

#: sessions one talky worker serves at once
MAX_SESSIONS = 2
WORD_S = 0.03


class TalkySession(ModelSession):
    def __init__(self, word_s: float = WORD_S, chunk_ms: int = 100, chunks: int = 1) -> None:
        self.turns = 0
        self.word_s = word_s
        self.chunk_ms = chunk_ms
        self.chunks = chunks

    def think(self, request: ThinkRequest) -> Iterator[ThinkerOutput]:
        self.turns += 1
        heard = sum(1 for m in request.messages if m.role in ("user", "assistant"))
        yield ThinkerOutput(text=f"pid{os.getpid()} ", prompt_tokens=heard, prefilled_tokens=heard)
        for index in range(request.max_output_tokens or 16):
            if request.cancelled.is_set():
                return
            time.sleep(self.word_s)
            yield ThinkerOutput(text=f"w{index} ")

    def talk(self, segment: list[ThinkerOutput], voice: str, cancelled: threading.Event,
             final: bool, speed: float = 1.0) -> Iterator[TalkerOutput]:
        """``chunks`` pieces of ``chunk_ms`` of tone, paced in real time after the first."""
        text = "".join(o.text for o in segment)
        n = 24 * self.chunk_ms
        tone = (3000 * np.sin(np.arange(n) * 2 * np.pi * 440 / 24_000)).astype(np.int16)
        started = time.monotonic()
        for index in range(self.chunks):
            if cancelled.is_set():
                return
            delay = started + index * self.chunk_ms / 1000 - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            last = index == self.chunks - 1
            yield TalkerOutput(audio=tone, text=text if index == 0 else "", final=final and last)


class TalkyModel(VoiceModel):
    def __init__(self, max_sessions: int | None = MAX_SESSIONS, word_s: float = WORD_S, chunk_ms: int = 100,
                 chunks: int = 1) -> None:
        self.info = ModelInfo(id="talky", capabilities=frozenset({"text_in", "text_out", "audio_out"}),
                              max_sessions=max_sessions)
        self.session_args = (word_s, chunk_ms, chunks)

    def load(self, progress: Callable[[str], None] = lambda _msg: None) -> None:
        progress("talky: nothing to load")

    def open_session(self) -> TalkySession:
        return TalkySession(*self.session_args)


def build() -> VoiceModel:
    return TalkyModel()
