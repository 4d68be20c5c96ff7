"""Video back to the caller: a face whose mouth follows the voice the caller hears.

When the caller's offer asks to receive video, the call answers with this track. Each frame draws
the mouth open in proportion to the loudness of the audio frame that the outgoing audio track sent
last (:attr:`~.tracks.OutgoingAudioTrack.level`), so the picture is in step with what is heard:
it closes in silence, at once on a barge-in (the audio queue is dropped), and stays closed after
the reply. Frames are raw RGB; aiortc encodes them with the codec the caller negotiated (VP8 or
H.264) and paces them by their timestamps. An engine that renders its own frames can hand them in
through :meth:`AvatarTrack.show` instead.

A picture that has not changed is not sent again at the frame rate: the track looks at the voice
every frame period, but sends a frame only when the mouth (or the engine's frame) changed, or
after ``still_interval_s`` so the caller's decoder keeps a recent frame. A call is silent most of
the time (the caller is speaking, or thinking), and each frame costs a draw and an encode.
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

    def __init__(self, level: Callable[[], float], width: int = 320, height: int = 240, fps: float = 15.0,
                 still_interval_s: float = 1.0) -> None:
        super().__init__()
        self._level = level
        self.width, self.height, self.fps = width - width % 2, height - height % 2, fps  # even: yuv420p
        self.still_interval_s = still_interval_s
        self._start: float | None = None
        self._index = 0
        self._open = 0.0  # smoothed mouth opening, 0..1
        self._frame_from_engine: np.ndarray | None = None
        self._sent: tuple[object, ...] | None = None  # what the last frame sent showed
        self._sent_at = 0.0
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

    def _step(self) -> tuple[object, ...]:
        """Follow the voice one frame period on; what the picture would show now."""
        if self._frame_from_engine is not None:
            return ("engine", id(self._frame_from_engine))
        target = min(1.0, max(0.0, self._level()))
        # open fast, close a little slower: speech looks like speech, not like a flicker
        self._open += (target - self._open) * (0.8 if target > self._open else 0.5)
        top, bottom = self._mouth_box[:2]
        ry = max(1.5, (bottom - top) / 2 * (0.12 + 0.88 * self._open))
        return ("mouth", round(ry * 4) / 4)  # a quarter pixel: the drawing cannot show less

    def _draw(self, shown: tuple[object, ...]) -> np.ndarray:
        kind, value = shown
        if kind == "engine":  # (the frame _step just saw)
            return self._frame_from_engine  # type: ignore[return-value]
        frame = self._face.copy()
        top, bottom, left, right = self._mouth_box
        cy, cx = (top + bottom) / 2, (left + right) / 2
        ry, rx = float(value), (right - left) / 2  # type: ignore[arg-type]
        inside = ((self._mouth_y - cy) / ry) ** 2 + ((self._mouth_x - cx) / rx) ** 2 <= 1.0
        frame[top:bottom, left:right][inside] = (90, 20, 30)
        return frame

    async def recv(self) -> VideoFrame:
        while True:
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
            index = self._index
            self._index += 1
            shown = self._step()
            now = time.monotonic()
            if shown == self._sent and now - self._sent_at < self.still_interval_s:
                continue  # the same picture: the caller already has it
            self._sent, self._sent_at = shown, now
            frame = VideoFrame.from_ndarray(self._draw(shown), format="rgb24")
            frame.pts = int(index * VIDEO_CLOCK / self.fps)
            frame.time_base = fractions.Fraction(1, VIDEO_CLOCK)
            self.frames_sent += 1
            return frame
