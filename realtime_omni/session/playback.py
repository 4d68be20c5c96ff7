"""Playback truth: how much of each response's audio actually reached the listener.

The session core owns it; transports only report. The WebSocket writer reports what it sent,
the WebRTC track the frames that went out, telephony the carrier's marks (absolute positions).
The core reads it when a response is cut short, and when a transport that plays audio on the
server's side (WebRTC, telephony) drops what it still held at a barge-in: a reply that was fully
generated but only partly heard is then truncated to what was heard, as a client would do it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .responses import Response


@dataclass(slots=True)
class _Played:
    response: Response | None
    sent_ms: float = 0.0


class PlaybackLedger:
    def __init__(self, keep: int = 8) -> None:
        self._played: dict[str, _Played] = {}
        self._keep = keep
        self.current: str | None = None

    def begin(self, response_id: str, response: Response | None = None) -> None:
        self.current = response_id
        self._played[response_id] = _Played(response)
        while len(self._played) > self._keep:  # bounded: only recent responses matter
            del self._played[next(iter(self._played))]

    def mark_sent(self, response_id: str, ms: float) -> None:
        """More audio of the response left (a relative amount: WebSocket sends, WebRTC frames)."""
        played = self._played.get(response_id)
        if played is not None:
            played.sent_ms += ms

    def set_heard(self, response_id: str, ms: float) -> None:
        """The listener has heard up to ``ms`` (an absolute position: telephony marks)."""
        played = self._played.get(response_id)
        if played is not None:
            played.sent_ms = ms

    def sent_ms(self, response_id: str) -> float:
        played = self._played.get(response_id)
        return played.sent_ms if played is not None else 0.0

    def unheard_reply(self, response_id: str, margin_ms: float = 20.0) -> tuple[Response, float] | None:
        """A finished, completed reply in the conversation whose audio was not all heard (with
        what was heard), or None: the one case a cut at the listener must truncate."""
        played = self._played.get(response_id)
        response = played.response if played is not None else None
        if response is None or response.status != "completed" or not response.in_conversation:
            return None
        if not response.wants_audio or played.sent_ms + margin_ms >= response.item.audio_ms:
            return None
        return response, played.sent_ms
