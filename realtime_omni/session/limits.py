"""A session's limits: the settings (:class:`RunnerLimits`), the client event rate
(:class:`TokenBucket`), the timer that wakes a session at its deadlines
(:class:`DeadlineAlarm`) and what the client is told when a limit ends its session."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..protocol.errors import ErrorCode


@dataclass
class RunnerLimits:
    mailbox_size: int = 256
    outbox_size: int = 512
    idle_timeout_s: float = 600.0
    max_session_s: float = 3600.0
    #: a ``session.expiring`` warning goes out this long before the lifetime limit closes it
    expiry_warning_s: float = 60.0
    max_event_bytes: int = 15 * 1024 * 1024
    #: client events per second (token bucket; burst = 2 s worth); excess events get an error
    max_events_per_s: float = 500.0
    journal_events: int = 8192
    #: the resume journal's bound in bytes (the oldest events leave first: a resume reports the gap)
    journal_bytes: int = 16 * 1024 * 1024
    #: conversation items and instructions together; past it a client's additions are refused
    max_session_bytes: int = 64 * 1024 * 1024
    #: client frames waiting in the mailbox, and events waiting in the outbox, each at most this
    queue_bytes: int = 32 * 1024 * 1024
    #: MCP server URLs (prefixes) sessions may name; empty: MCP tools are refused
    mcp_allowed_urls: tuple[str, ...] = ()
    #: deadline of one MCP listing or call
    mcp_timeout_s: float = 15.0


class Wedged(Exception):
    """A limit passed while the session waited for room in its outbox."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


#: what the client is told when a limit ends its session (the code is also the close reason)
EXPIRY_MESSAGES = {
    ErrorCode.SESSION_IDLE_TIMEOUT: "session closed after being idle",
    ErrorCode.SESSION_EXPIRED: "session reached its maximum duration",
}


class TokenBucket:
    """Client events per second: refills at ``rate``, holds two seconds' worth (the burst)."""

    def __init__(self, rate: float) -> None:
        self.rate = rate
        self.capacity = 2 * rate
        self.tokens = self.capacity
        self.stamp = time.monotonic()

    def report(self) -> list[dict[str, Any]]:
        self.take(0)
        reset = (self.capacity - self.tokens) / self.rate if self.rate else 0.0
        return [{"name": "requests", "limit": int(self.capacity), "remaining": int(self.tokens), "reset_seconds": round(reset, 3)}]

    def take(self, cost: int = 1) -> bool:
        now = time.monotonic()
        self.tokens = min(self.capacity, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        if self.tokens < cost:
            return False
        self.tokens -= cost
        return True


class DeadlineAlarm:
    """One timer for a session's deadlines (idle, lifetime, expiry warning), re-armed only when
    one comes nearer. Most messages move the idle deadline later, which needs no new timer: an
    early ring finds nothing expired and arms the next. A timer per message (``asyncio.timeout``
    around each mailbox wait) cost every audio chunk a timer to create and cancel."""

    def __init__(self, ring: Callable[[], None]) -> None:
        self._ring = ring
        self._handle: asyncio.TimerHandle | None = None
        self._at = float("inf")

    def arm(self, when: float, now: float) -> None:
        """Ring at ``when`` (``time.monotonic`` clock) or before."""
        if self._handle is not None and self._at <= when:
            return
        self.cancel()
        self._at = when
        # call_later, not call_at: the loop's clock need not be time.monotonic (uvloop's is not)
        self._handle = asyncio.get_running_loop().call_later(max(when - now, 0.0), self._rang)

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        self._at = float("inf")

    def _rang(self) -> None:
        self._handle = None
        self._at = float("inf")
        self._ring()
