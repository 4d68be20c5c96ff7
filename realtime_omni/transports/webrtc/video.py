"""Incoming video: sample the camera at a low rate for models that can see.

aiortc decodes every received frame in its receiver thread; this module only decides which
decoded frames are kept. Sampling is newest-wins: at most one frame is held (no queue, so a slow
consumer never makes memory grow), replaced at most ``fps`` times a second, and converted to an
RGB array only when the session takes it. For a model without the ``image_in`` capability the
call answers the video m-line ``inactive`` (the browser sends nothing); a video track that
arrives anyway is drained without conversion.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

log = logging.getLogger(__name__)


class VideoSampler:
    def __init__(self, fps: float = 1.0, enabled: bool = True) -> None:
        self.interval = 1.0 / fps if fps > 0 else float("inf")
        self.enabled = enabled
        self._latest: Any | None = None  # av.VideoFrame, unconverted
        self._latest_at = 0.0
        self._sampled_at = 0.0
        self._taken_at = 0.0
        self.frames_seen = 0
        self.frames_sampled = 0

    def offer(self, frame: Any) -> None:
        """One decoded frame arrived (called for every frame: must stay O(1))."""
        self.frames_seen += 1
        if not self.enabled:
            return
        now = time.monotonic()
        if now - self._sampled_at >= self.interval:
            self._latest, self._latest_at, self._sampled_at = frame, now, now
            self.frames_sampled += 1

    def latest(self, *, only_new: bool = True) -> tuple[np.ndarray, float] | None:
        """The newest sampled frame as RGB uint8 HxWx3 and its arrival time (``time.monotonic``);
        None when there is none (or, with ``only_new``, none since the last call)."""
        frame, at = self._latest, self._latest_at
        if frame is None or (only_new and at <= self._taken_at):
            return None
        self._taken_at = at
        return frame.to_ndarray(format="rgb24"), at

    def release(self) -> None:
        self._latest = None


async def pump_video_in(
    track: MediaStreamTrack, sampler: VideoSampler, deliver: Callable[[np.ndarray], object] | None = None
) -> None:
    """Drain the remote video track (aiortc's frame queue is unbounded) into the sampler, and
    hand each newly sampled frame to ``deliver`` as RGB (one conversion per sample, 1 fps by
    default, so cheap enough for the loop)."""
    while True:
        try:
            frame = await track.recv()
        except MediaStreamError:
            return
        sampled = sampler.frames_sampled
        sampler.offer(frame)
        if deliver is not None and sampler.frames_sampled != sampled:
            latest = sampler.latest()
            if latest is not None:
                deliver(latest[0])
