"""``turn_detection.idle_timeout_ms``: nudge the model when the user stays silent.

The timer runs on input-audio time (the stream positions the VAD reports), not on a wall
clock, so the core stays sans-I/O and a client that stops sending audio stops the timer too.
It is armed when a response ends, from the moment the listener has heard all of it (the
response's audio played out in real time from its start), and disarmed by speech or by a new
response. When it fires the session sends ``input_audio_buffer.timeout_triggered``, commits the
silent stretch as a user turn and (with ``create_response``) asks the model to go on.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class IdleTimer:
    #: input position (ms) from which silence counts; None: not armed
    since_ms: float | None = None

    def arm(self, response_started_ms: float, response_audio_ms: float, now_ms: float) -> None:
        self.since_ms = max(now_ms, response_started_ms + response_audio_ms)

    def disarm(self) -> None:
        self.since_ms = None

    def due(self, now_ms: float, timeout_ms: int | None) -> tuple[int, int] | None:
        """(start, end) of the silent stretch once it has lasted ``timeout_ms``; fires once."""
        if timeout_ms is None or self.since_ms is None or now_ms - self.since_ms < timeout_ms:
            return None
        start, self.since_ms = self.since_ms, None
        return int(start), int(now_ms)
