"""Video back to the caller: a face whose mouth follows the voice the caller hears.

When the caller's offer asks to receive video, the call answers with this track. Each frame draws
the mouth open in proportion to the loudness of the audio frame that the outgoing audio track sent
last (:attr:`~.tracks.OutgoingAudioTrack.level`), so the picture is in step with what is heard:
it closes in silence, at once on a barge-in (the audio queue is dropped), and stays closed after
the reply. Frames are raw RGB; aiortc encodes them with the codec the caller negotiated (VP8 or
H.264) and paces them by their timestamps. An engine that renders its own frames can hand them in
through :meth:`AvatarTrack.show` instead.
"""

from __future__ import annotations

import asyncio
import fractions
import time
from collections.abc import Callable

import numpy as np
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack
from av import VideoFrame

VIDEO_CLOCK = 90_000  # RTP clock rate of video


def _disc(height: int, width: int, cy: float, cx: float, ry: float, rx: float) -> np.ndarray:
    y, x = np.ogrid[:height, :width]
    return ((y - cy) / ry) ** 2 + ((x - cx) / rx) ** 2 <= 1.0


class AvatarTrack(MediaStreamTrack):
    kind = "video"

    def __init__(self, level: Callable[[], float], width: int = 320, height: int = 240, fps: float = 15.0) -> None:
        super().__init__()
        self._level = level
        self.width, self.height, self.fps = width - width % 2, height - height % 2, fps  # even: yuv420p
        self._start: float | None = None
        self._index = 0
        self._open = 0.0  # smoothed mouth opening, 0..1
        self._frame_from_engine: np.ndarray | None = None
        self.frames_sent = 0
        h, w = self.height, self.width
        face = np.empty((h, w, 3), np.uint8)
        face[:] = (28, 32, 48)  # background
        head = _disc(h, w, h * 0.5, w * 0.5, h * 0.42, w * 0.28)
        face[head] = (240, 200, 160)
        for side in (-1, 1):  # eyes
            face[_disc(h, w, h * 0.4, w * 0.5 + side * w * 0.1, h * 0.045, w * 0.03)] = (30, 30, 40)
        self._face = face
        self._mouth_box = (int(h * 0.62), int(h * 0.82), int(w * 0.38), int(w * 0.62))
        top, bottom, left, right = self._mouth_box
        self._mouth_y, self._mouth_x = np.ogrid[top:bottom, left:right]

    @property
    def mouth_box(self) -> tuple[int, int, int, int]:
        """(top, bottom, left, right) of the region the mouth is drawn in (tests measure it)."""
        return self._mouth_box

    def show(self, rgb: np.ndarray | None) -> None:
        """A frame rendered by the engine (``height × width × 3`` uint8) replaces the face until
        ``None`` is shown."""
        if rgb is not None and rgb.shape != (self.height, self.width, 3):
            raise ValueError(f"frames must be {self.height}x{self.width} RGB, got {rgb.shape}")
        self._frame_from_engine = rgb

    def _draw(self) -> np.ndarray:
        if self._frame_from_engine is not None:
            return self._frame_from_engine
        target = min(1.0, max(0.0, self._level()))
        # open fast, close a little slower: speech looks like speech, not like a flicker
        self._open += (target - self._open) * (0.8 if target > self._open else 0.5)
        frame = self._face.copy()
        top, bottom, left, right = self._mouth_box
        cy, cx = (top + bottom) / 2, (left + right) / 2
        ry = max(1.5, (bottom - top) / 2 * (0.12 + 0.88 * self._open))
        rx = (right - left) / 2
        inside = ((self._mouth_y - cy) / ry) ** 2 + ((self._mouth_x - cx) / rx) ** 2 <= 1.0
        frame[top:bottom, left:right][inside] = (90, 20, 30)
        return frame

    async def recv(self) -> VideoFrame:
        if self.readyState != "live":
            raise MediaStreamError
        if self._start is None:
            self._start = time.monotonic()
        due = self._start + self._index / self.fps
        delay = due - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        elif delay < -1.0:  # fell behind (a stalled sender): skip ahead, timestamps stay monotonic
            self._start = time.monotonic() - self._index / self.fps
        frame = VideoFrame.from_ndarray(self._draw(), format="rgb24")
        frame.pts = int(self._index * VIDEO_CLOCK / self.fps)
        frame.time_base = fractions.Fraction(1, VIDEO_CLOCK)
        self._index += 1
        self.frames_sent += 1
        return frame
