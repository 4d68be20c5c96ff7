"""Sequence numbers and the bounded journal that lets a reconnecting client catch up.

Every server event gets ``sequence_number`` (an extension field) when it leaves the session's
outbox, and is kept in a ring buffer bounded in events and in bytes. A client that resumes with
the last number it received gets exactly the events after it: none lost, none twice — or, when
the oldest of them already left the ring, ``gap: true``.

The journal does not keep what the conversation no longer holds: when an item is deleted, the
events about it keep their place and numbers (replay stays in order) but lose their payload
(texts, transcripts, audio, content parts). Nor, with ``keep_audio`` off, the audio deltas that a
server-side player (a WebRTC call's track, a phone line) sends instead of the client: a resume
never replays them (that audio is stale once the call is gone), and a live call would otherwise
hold thousands of them (up to ``capacity``: 50 a second from an echo, each an event, its samples
and their holders) for the cycle collector to walk over and over. Only their numbers are kept,
so a resume still knows it lost nothing else.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from .core import Outgoing
from .memory import approx_bytes

#: payload fields of events about an item, emptied when that item is deleted
_PAYLOAD = ("delta", "text", "transcript", "audio", "arguments")


class Journal:
    def __init__(self, capacity: int = 8192, last_seq: int = 0, max_bytes: int | None = None) -> None:
        self._events: deque[Outgoing] = deque()
        self.capacity = capacity
        self.max_bytes = max_bytes
        self.nbytes = 0
        self.last_seq = last_seq
        #: False while a server-side player sends the audio (see the module's docstring)
        self.keep_audio = True
        self._omitted: deque[int] = deque(maxlen=capacity)  # numbers of the audio deltas not kept

    def __len__(self) -> int:
        return len(self._events)

    def record(self, out: Outgoing) -> None:
        self.last_seq += 1
        out.event["sequence_number"] = self.last_seq
        if out.audio is not None and not self.keep_audio:
            self._omitted.append(self.last_seq)
            return
        if not out.nbytes:
            out.nbytes = approx_bytes(out.event) + (out.audio.nbytes if out.audio is not None else 0)
        self._events.append(out)
        self.nbytes += out.nbytes
        while self._events and (len(self._events) > self.capacity
                                or (self.max_bytes is not None and self.nbytes > self.max_bytes)):
            self.nbytes -= self._events.popleft().nbytes
        if out.event.get("type") == "conversation.item.deleted":
            self.forget_item(str(out.event.get("item_id")))

    def forget_item(self, item_id: str) -> int:
        """Empty the payload of every journaled event about ``item_id``; returns how many."""
        touched = 0
        for out in self._events:
            if _scrub(out.event, item_id):
                out.audio = None
                size = approx_bytes(out.event)
                self.nbytes += size - out.nbytes
                out.nbytes = size
                touched += 1
        return touched

    def since(self, last_seq: int) -> tuple[list[Outgoing], bool]:
        """Events after ``last_seq``, and whether some of them already left the ring (a gap)."""
        missed = [out for out in self._events if out.event["sequence_number"] > last_seq]
        omitted = sum(1 for seq in self._omitted if seq > last_seq)  # played already, never replayed
        expected = self.last_seq - last_seq
        return missed, len(missed) + omitted < expected


def _scrub(event: dict[str, Any], item_id: str) -> bool:
    touched = False
    if event.get("item_id") == item_id and event.get("type") != "conversation.item.deleted":
        for key in _PAYLOAD:
            if isinstance(event.get(key), str) and event[key]:
                event[key] = ""
                touched = True
        if isinstance(event.get("part"), dict):
            touched = _empty_part(event["part"]) or touched
    item = event.get("item")
    if isinstance(item, dict) and item.get("id") == item_id and item.get("content"):
        item["content"] = []
        touched = True
    response = event.get("response")
    if isinstance(response, dict):
        for output in response.get("output") or []:
            if isinstance(output, dict) and output.get("id") == item_id and output.get("content"):
                output["content"] = []
                touched = True
    return touched


def _empty_part(part: dict[str, Any]) -> bool:
    touched = False
    for key in _PAYLOAD:
        if isinstance(part.get(key), str) and part[key]:
            part[key] = ""
            touched = True
    return touched
