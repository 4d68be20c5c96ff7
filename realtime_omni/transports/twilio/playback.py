"""What the carrier holds and what the caller heard, from our marks and their echoes (sans-I/O).

Every audio delta is cut into 20 ms frames and followed by a ``mark`` named ``<response_id>:<ms>``
(the response's audio position at the end of that delta). Twilio echoes a mark when the audio
before it has finished playing, so an echo is playback truth: the caller heard ``ms`` of that
response. Marks not yet echoed mean audio is still queued at the carrier. On ``clear`` Twilio
drops its queue and echoes the outstanding marks at once; those echoes do not mean "heard", so
they are remembered here and ignored.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from .messages import FRAME_BYTES, FRAME_MS, ULAW_SILENCE

MAX_CLEARED = 4096  # cleared mark names remembered until their echo (bounded)
#: marks awaiting their echo per response: past this a carrier that never echoes (a peer that
#: ignores marks) would grow them for the whole call; the oldest are forgotten (minutes of audio)
MAX_PENDING_MARKS = 4096
#: responses remembered even while the carrier still holds their audio (same reason)
MAX_TRACKS = 64


@dataclass
class _Track:
    """One response's outbound audio."""

    #: μ-law bytes of the delta tail that did not fill a whole frame yet
    remainder: bytes = b""
    #: ms of frames sent (padding included) and of real audio given to us
    framed_ms: float = 0.0
    audio_ms: float = 0.0
    #: last echoed position (ms heard), capped at ``audio_ms``
    heard_ms: float = 0.0
    pending: dict[str, None] = field(default_factory=dict)  # in the order sent


class CarrierPlayback:
    def __init__(self, keep: int = 8) -> None:
        self._tracks: OrderedDict[str, _Track] = OrderedDict()
        self._keep = keep
        self._cleared: OrderedDict[str, None] = OrderedDict()

    # -- outbound ---------------------------------------------------------------------
    def _track(self, response_id: str) -> _Track:
        track = self._tracks.get(response_id)
        if track is None:
            track = self._tracks[response_id] = _Track()
            while len(self._tracks) > self._keep:  # bounded: only recent responses matter
                old_id, old = next(iter(self._tracks.items()))
                if old.pending and len(self._tracks) <= MAX_TRACKS:
                    break  # never forget a response the carrier is still playing (within reason)
                del self._tracks[old_id]
        return track

    def frames(self, response_id: str, wire: bytes, *, final: bool = False) -> tuple[list[bytes], str | None]:
        """Cut a delta into whole 160-byte frames; returns them and the mark to send after them.

        The tail that does not fill a frame waits for the next delta; ``final`` pads it with
        silence (end of the reply). No frames → no mark.
        """
        track = self._track(response_id)
        track.audio_ms += len(wire) / 8.0
        data = track.remainder + wire
        whole = len(data) // FRAME_BYTES * FRAME_BYTES
        if final and whole < len(data):
            data += ULAW_SILENCE * (FRAME_BYTES - (len(data) - whole))
            whole = len(data)
        frames = [data[i : i + FRAME_BYTES] for i in range(0, whole, FRAME_BYTES)]
        track.remainder = data[whole:]
        if not frames:
            return [], None
        track.framed_ms += FRAME_MS * len(frames)
        name = f"{response_id}:{int(round(track.framed_ms))}"
        track.pending[name] = None
        while len(track.pending) > MAX_PENDING_MARKS:
            del track.pending[next(iter(track.pending))]
        return frames, name

    # -- inbound ----------------------------------------------------------------------
    def on_mark(self, name: str) -> tuple[str, float] | None:
        """An echoed mark → (response_id, ms heard), or None (unknown, or echoed by a clear)."""
        if name in self._cleared:
            del self._cleared[name]
            return None
        response_id, _, ms_text = name.rpartition(":")
        track = self._tracks.get(response_id)
        if track is None or name not in track.pending:
            return None
        del track.pending[name]
        try:
            ms = float(ms_text)
        except ValueError:
            return None
        track.heard_ms = max(track.heard_ms, min(ms, track.audio_ms))
        return response_id, track.heard_ms

    # -- barge-in ---------------------------------------------------------------------
    @property
    def busy(self) -> bool:
        """Audio is still queued at the carrier (marks sent and not echoed)."""
        return any(track.pending for track in self._tracks.values())

    def clear(self) -> dict[str, _Track]:
        """The carrier was told to drop its queue: returns the responses that had audio there."""
        cut: dict[str, _Track] = {}
        for response_id, track in self._tracks.items():
            track.remainder = b""
            if track.pending:
                cut[response_id] = track
                for name in track.pending:
                    self._cleared[name] = None
                track.pending = {}
        while len(self._cleared) > MAX_CLEARED:
            self._cleared.popitem(last=False)
        return cut

    def pending_of(self, response_id: str) -> bool:
        track = self._tracks.get(response_id)
        return bool(track and track.pending)

    def heard_ms(self, response_id: str) -> float:
        track = self._tracks.get(response_id)
        return track.heard_ms if track else 0.0
