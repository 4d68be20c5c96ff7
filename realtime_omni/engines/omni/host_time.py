"""The interpreter time the sessions' own threads take, per stage, and the frames they make.

The batched stages' loops run the forward passes; each session's threads still walk its reply
token by token and frame by frame (text, its talker's parts, its codec stream). With dozens of
sessions that work, under one interpreter lock, is what binds before the GPU does (Qwen3 on the
H200: about 1.2 ms per session and frame, so 64 sessions need nearly all of one interpreter).
This counts it, in CPU seconds of the threads that run each stage's calls, so an operator sees
it coming: ``realtime_omni_engine_session_cpu_seconds`` over ``realtime_omni_engine_frames``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

T = TypeVar("T")

STAGES = ("thinker", "talker", "codec")


class HostTime:
    """CPU seconds of the sessions' threads by stage, and the code frames made (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.seconds = dict.fromkeys(STAGES, 0.0)
        self.frames = 0

    def add(self, stage: str, seconds: float, frames: int = 0) -> None:
        with self._lock:
            self.seconds[stage] += seconds
            self.frames += frames

    def generator(self, stage: str, items: Iterator[T], frames: Callable[[T], int] = lambda _item: 0) -> Iterator[T]:
        """``items`` with the CPU time of each step of it (between two yields, in the thread that
        asked for the item) counted to ``stage``. Closing it closes ``items`` (their cleanup runs)."""
        try:
            while True:
                began = time.thread_time()
                try:
                    item = next(items)
                except StopIteration:
                    self.add(stage, time.thread_time() - began)
                    return
                self.add(stage, time.thread_time() - began, frames(item))
                yield item
        finally:
            close = getattr(items, "close", None)
            if close is not None:
                close()

    def stats(self) -> dict[str, float]:
        with self._lock:
            return {**{f"{stage}_cpu_s": s for stage, s in self.seconds.items()}, "frames": float(self.frames)}
