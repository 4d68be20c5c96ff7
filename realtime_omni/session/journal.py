"""Sequence numbers and the bounded journal that lets a reconnecting client catch up.

Every server event gets ``sequence_number`` (an extension field) when it leaves the session's
outbox, and is kept in a ring buffer. A client that resumes with the last number it received
gets exactly the events after it: none lost, none twice.
"""

from __future__ import annotations

from collections import deque

from .core import Outgoing


class Journal:
    def __init__(self, capacity: int = 8192, last_seq: int = 0) -> None:
        self._events: deque[Outgoing] = deque(maxlen=capacity)
        self.last_seq = last_seq

    def record(self, out: Outgoing) -> None:
        self.last_seq += 1
        out.event["sequence_number"] = self.last_seq
        self._events.append(out)

    def since(self, last_seq: int) -> tuple[list[Outgoing], bool]:
        """Events after ``last_seq``, and whether some of them already left the ring (a gap)."""
        missed = [out for out in self._events if out.event["sequence_number"] > last_seq]
        expected = self.last_seq - last_seq
        return missed, len(missed) < expected
