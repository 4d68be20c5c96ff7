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
    def __init__(self) -> None:
        self.turns = 0

    def think(self, request: ThinkRequest) -> Iterator[ThinkerOutput]:
        self.turns += 1
        heard = sum(1 for m in request.messages if m.role in ("user", "assistant"))
        yield ThinkerOutput(text=f"pid{os.getpid()} ", prompt_tokens=heard, prefilled_tokens=heard)
        for index in range(request.max_output_tokens or 16):
            if request.cancelled.is_set():
                return
            time.sleep(WORD_S)
            yield ThinkerOutput(text=f"w{index} ")

    def talk(self, segment: list[ThinkerOutput], voice: str, cancelled: threading.Event,
             final: bool) -> Iterator[TalkerOutput]:
        text = "".join(o.text for o in segment)
        tone = (3000 * np.sin(np.arange(2400) * 2 * np.pi * 440 / 24_000)).astype(np.int16)
        yield TalkerOutput(audio=tone, text=text, final=final)


class TalkyModel(VoiceModel):
    info = ModelInfo(id="talky", capabilities=frozenset({"text_in", "text_out", "audio_out"}),
                     max_sessions=MAX_SESSIONS)

    def load(self, progress: Callable[[str], None] = lambda _msg: None) -> None:
        progress("talky: nothing to load")

    def open_session(self) -> TalkySession:
        return TalkySession()


def build() -> VoiceModel:
    return TalkyModel()
