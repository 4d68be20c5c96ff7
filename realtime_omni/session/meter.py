"""Turn latencies of one session, from the events it hands to its transport (sans-I/O).

The driver tells :class:`TurnMeter` when input audio arrived (:meth:`audio_arrived`) and which
event it handed to the writer at what time (:meth:`handed_over`); the meter reports latencies to
an :class:`~realtime_omni.observer.Observer`. Times are seconds of one monotonic clock; audio
positions are milliseconds of the session's input stream (the ``audio_start_ms`` /
``audio_end_ms`` of the VAD events).
"""

from __future__ import annotations

import bisect
from collections import deque
from typing import Any

from ..observer import Observer

#: arrivals remembered to place speech in time (a chunk per 20 ms: over a minute)
_ARRIVALS = 4096


class TurnMeter:
    def __init__(self, observer: Observer) -> None:
        self.observer = observer
        # (stream position at the end of an arrived chunk, when it arrived), positions rising
        self._ends: deque[float] = deque(maxlen=_ARRIVALS)
        self._times: deque[float] = deque(maxlen=_ARRIVALS)
        self._speech_end: float | None = None
        self._response: str | None = None
        self._created_at = 0.0
        self._ends_speech_at: float | None = None
        self._first_audio = False
        self._last_audio_at: float | None = None
        self._barge_from: float | None = None

    def audio_arrived(self, stream_ms: float, now: float) -> None:
        """Input audio up to ``stream_ms`` has arrived at ``now``."""
        if not self._ends or stream_ms > self._ends[-1]:
            self._ends.append(stream_ms)
            self._times.append(now)

    def arrival_of(self, stream_ms: float, now: float) -> float:
        """When the audio at ``stream_ms`` arrived (``now`` if not yet, or forgotten)."""
        ends = list(self._ends)
        index = bisect.bisect_left(ends, stream_ms)
        if index >= len(ends):
            return now
        return self._times[index]

    def handed_over(self, event: dict[str, Any], now: float) -> None:
        """``event`` was handed to the transport's writer at ``now``."""
        kind = event.get("type")
        if kind == "response.output_audio.delta":
            if event.get("response_id") == self._response:
                self._on_audio(now)
        elif kind == "response.created":
            self._response = event["response"]["id"]
            self._created_at = now
            self._ends_speech_at, self._speech_end = self._speech_end, None
            self._first_audio = False
            self._last_audio_at = None
            self._barge_from = None
        elif kind == "input_audio_buffer.speech_stopped":
            self._speech_end = self.arrival_of(float(event["audio_end_ms"]), now)
        elif kind == "input_audio_buffer.speech_started":
            if self._response is not None and self._last_audio_at is not None:
                self._barge_from = self.arrival_of(float(event["audio_start_ms"]), now)
        elif kind == "response.done":
            response = event["response"]
            self.observer.response_done(str(response.get("status")))
            if response.get("id") == self._response:
                if self._barge_from is not None and self._last_audio_at is not None:
                    self.observer.barge_in(max(self._last_audio_at - self._barge_from, 0.0), max(now - self._barge_from, 0.0))
                self._response = None
        elif kind == "error":
            self.observer.error_sent(str((event.get("error") or {}).get("code") or "unknown"))

    def _on_audio(self, now: float) -> None:
        self._last_audio_at = now
        if self._first_audio:
            return
        self._first_audio = True
        self.observer.time_to_first_audio(now - self._created_at)
        if self._ends_speech_at is not None:
            self.observer.speech_end_to_first_audio(max(now - self._ends_speech_at, 0.0))
