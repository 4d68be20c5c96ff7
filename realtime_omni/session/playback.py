"""Playback truth: how much of each response's audio actually left for the listener.

The transport that delivers audio reports it here (the WebSocket writer on send, the WebRTC
track as frames go out, telephony on carrier marks); the core reads it when a response is cut
short, so the conversation keeps only what was heard.
"""

from __future__ import annotations


class PlaybackLedger:
    def __init__(self, keep: int = 8) -> None:
        self._sent: dict[str, float] = {}
        self._keep = keep
        self.current: str | None = None

    def begin(self, response_id: str) -> None:
        self.current = response_id
        self._sent[response_id] = 0.0
        while len(self._sent) > self._keep:  # bounded: only recent responses matter
            del self._sent[next(iter(self._sent))]

    def mark_sent(self, response_id: str, ms: float) -> None:
        if response_id in self._sent:
            self._sent[response_id] += ms

    def set_heard(self, response_id: str, ms: float) -> None:
        """Absolute position (telephony marks, WebRTC played frames)."""
        if response_id in self._sent:
            self._sent[response_id] = ms

    def sent_ms(self, response_id: str) -> float:
        return self._sent.get(response_id, 0.0)
