"""What a connection does with its session besides sending and receiving: detach and resume
(the journal keeps what would have been sent), and report playback (what went out, what was
heard, what a server-side player dropped). A mixin of :class:`~.runner.SessionRunner`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any

from ..protocol.server_events import server_event
from . import inputs as inp

if TYPE_CHECKING:
    from ..observer import Observer
    from .core import Outgoing, RealtimeSession
    from .journal import Journal

log = logging.getLogger(__name__)

#: how long a resume waits for the session to process what the client sent before the drop
SYNC_TIMEOUT_S = 10.0


class ConnectionLink:
    # provided by SessionRunner
    core: RealtimeSession
    journal: Journal
    observer: Observer
    transport: str
    closed: asyncio.Event
    detached: asyncio.Event
    detached_since: float | None
    kick: Any
    restored: Any
    last_client_event_id: str | None
    _drain: asyncio.Task[None] | None

    async def _offer(self, message: inp.SessionInput) -> bool: ...
    async def next_outgoing(self) -> Outgoing | None: ...
    async def close(self, reason: str = "client_closed") -> None: ...

    # -- detach and resume ----------------------------------------------------------------
    def detach(self, grace_s: float) -> None:
        """The connection dropped: keep running, journal what would have been sent, and close
        the session if nobody resumes it within ``grace_s``."""
        if self.closed.is_set() or self._drain is not None:
            return
        self.detached_since = time.monotonic()
        self.observer.session_detached(self.transport)
        self.kick = None
        self.detached.set()
        self._drain = asyncio.create_task(self._journal_while_detached(grace_s))

    async def _journal_while_detached(self, grace_s: float) -> None:
        async def drain() -> None:
            while await self.next_outgoing() is not None:
                pass

        try:
            await asyncio.wait_for(drain(), grace_s)
        except asyncio.TimeoutError:
            log.info("session %s expired after %.0f s detached", self.core.id, grace_s)
            self._drain = None
            await self.close("resume_grace_expired")

    def resumed_event(self, replayed: int, gap: bool) -> dict[str, Any]:
        """Extension event opening a resumed connection (not numbered: it belongs to the link)."""
        event = server_event("session.resumed", event_id="event_resumed", session=self.core.session_dict(),
                             replayed=replayed, gap=gap, last_sequence_number=self.journal.last_seq,
                             last_client_event_id=self.last_client_event_id)
        if self.restored is not None:
            event["restored"], self.restored = self.restored, None
        return event

    async def attach(self, last_seq: int) -> tuple[list[Outgoing], bool]:
        """A client resumed: stop journaling on its behalf; returns (missed events, gap)."""
        if self._drain is not None:
            drain, self._drain = self._drain, None
            drain.cancel()
            await asyncio.gather(drain, return_exceptions=True)
        self.detached_since = None
        self.detached.clear()
        # Let every client event accepted before the drop be processed, so the client learns
        # exactly which of its events to send again (those after last_client_event_id).
        # Bounded both ways: a session that cannot take the marker (full mailbox, full outbox and
        # no writer yet) or never reaches it must not hold the resuming client for ever.
        synced: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        offered = asyncio.ensure_future(self._offer(inp.Sync(synced)))
        await asyncio.wait({offered}, timeout=SYNC_TIMEOUT_S)
        if offered.done() and offered.result():
            await asyncio.wait({synced}, timeout=SYNC_TIMEOUT_S)
        else:
            offered.cancel()
        missed, gap = self.journal.since(last_seq)
        for out in missed:
            self.mark_sent(out)
        return missed, gap

    # -- what transports report about playback (the core keeps the record) -------------------
    def mark_sent(self, out: Outgoing) -> None:
        """Writers call this after each send (playback truth for WebSocket clients)."""
        if out.response_id is not None:
            self.core.ledger.mark_sent(out.response_id, out.audio_ms)

    def played(self, response_id: str, ms: float) -> None:
        """A server-side player sent ``ms`` more of the response's audio to the listener."""
        self.core.ledger.mark_sent(response_id, ms)

    def heard(self, response_id: str, ms: float) -> None:
        """The listener has heard the response up to ``ms`` (telephony marks)."""
        self.core.ledger.set_heard(response_id, ms)

    def is_stale(self, epoch: int | None) -> bool:
        """Whether audio of ``epoch`` was fenced off by a barge-in after it was queued."""
        return self.core.fenced(epoch)

    async def playback_cut(self, response_id: str) -> None:
        """A server-side player dropped what it held of the response at a barge-in: the core
        truncates a complete but partly heard reply to what was heard."""
        await self._offer(inp.PlaybackCut(response_id))

