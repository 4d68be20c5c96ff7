"""Timing of a call's outgoing media: the RTP clock and the rates around it, the one 20 ms
:class:`FrameClock` per event loop that paces every outgoing track, and :class:`PacketLength`,
how much audio each outgoing Opus packet holds."""

from __future__ import annotations

import asyncio
import fractions
import time
import weakref
from collections.abc import Callable

RATE = 48_000  # Opus's RTP clock (and the rate its decoders give)
FRAME_MS = 20
CLOCK_FRAME = RATE * FRAME_MS // 1000  # 960: one frame's step of the RTP clock
TIME_BASE = fractions.Fraction(1, RATE)
WIRE_RATE = 24_000  # the session's audio/pcm rate
#: the outgoing track's PCM: the session's rate, handed to the Opus encoder as it is (at 48 kHz it
#: took a resampler per call and 30 % more encoder time for the same 12 kHz of audio band)
TRACK_RATE = WIRE_RATE
FRAME_SAMPLES = TRACK_RATE * FRAME_MS // 1000  # 480


class FrameClock:
    """One 20 ms tick for every outgoing track of an event loop: a single timer per tick wakes
    all the tracks waiting on it (a per-track ``asyncio.sleep`` costs a timer, a future and a
    heap operation per call per frame). Ticks are counted from the first use; a loop stall of
    more than 100 ms re-anchors the grid instead of bursting."""

    def __init__(self, period_s: float = FRAME_MS / 1000.0) -> None:
        self.period = period_s
        self.tick = 0  # ticks fired so far
        self._start: float | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._handle: asyncio.TimerHandle | None = None
        self.stalls = 0

    def current(self) -> int:
        """The tick in progress now (starting the clock if it was not)."""
        if self._start is None:
            self._start = time.monotonic()
        return self.tick

    def next_tick(self) -> asyncio.Future[None]:
        """A future done at the next tick (shared by every waiter of that tick)."""
        loop = asyncio.get_running_loop()
        if self._start is None:
            self._start = time.monotonic()
        if self._waiter is None or self._waiter.done():
            self._waiter = loop.create_future()
        if self._handle is None:
            # loop.time() is time.monotonic() on the default and uvloop loops
            due = self._start + (self.tick + 1) * self.period
            self._handle = loop.call_at(loop.time() + (due - time.monotonic()), self._fire)
        return self._waiter

    def _fire(self) -> None:
        self._handle = None
        self.tick += 1
        assert self._start is not None
        behind = time.monotonic() - (self._start + self.tick * self.period)
        if behind > 0.1:  # the loop stalled: re-anchor rather than fire a burst of ticks
            self.stalls += 1
            self._start = time.monotonic() - self.tick * self.period
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


_clocks: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, FrameClock] = weakref.WeakKeyDictionary()


def frame_clock() -> FrameClock:
    """The running loop's shared :class:`FrameClock`."""
    loop = asyncio.get_running_loop()
    clock = _clocks.get(loop)
    if clock is None:
        clock = _clocks[loop] = FrameClock()
    return clock


class PacketLength:
    """How much audio each outgoing Opus packet holds, for every call of a server: 20 ms while it
    holds fewer than ``busy_calls`` calls, 40 ms from there on (and 20 again below three quarters
    of it). Few calls get the least delay; many, half the packets and their per-packet CPU (the
    media of every call shares one event loop, so one core). ``fixed``: that length always."""

    def __init__(self, live_calls: Callable[[], int], busy_calls: int = 32, fixed: int | None = None) -> None:
        self._live_calls = live_calls
        self.busy_calls = busy_calls
        self.fixed = fixed
        self._busy = False

    @classmethod
    def from_setting(cls, packet_ms: int | str, busy_calls: int, live_calls: Callable[[], int]) -> "PacketLength":
        """From ``transports.webrtc.audio_packet_ms`` (20, 40, 60 or "auto")."""
        return cls(live_calls, busy_calls, None if packet_ms == "auto" else int(packet_ms))

    def __call__(self) -> int:
        if self.fixed is not None:
            return self.fixed
        calls = self._live_calls()
        if self._busy and calls < self.busy_calls * 3 // 4:
            self._busy = False
        elif not self._busy and calls >= self.busy_calls:
            self._busy = True
        return 40 if self._busy else 20
