"""Which server process holds a live session, when several share one store (Redis).

Each process holds a lease on each of its live sessions (attached or waiting for a resume) and
renews them all every ``lease_s / 5``. A client that resumes through another process makes that
process *ask* for the session: the holder's next renewal sees the request and lets its copy go
(closed as ``session_moved``, its last changes written, its row kept), then drops the lease; the
asker takes it and rebuilds the session from the stored row. A process that died leaves its
leases to lapse after ``lease_s``. A process that stalled past its lease and finds the session
held by another stops its copy without writing it. So one process at a time runs a session
and writes its row, and none deletes a row another process is serving.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import uuid
from collections.abc import Awaitable, Callable, Collection

from .store import Renewal, SessionStore

log = logging.getLogger(__name__)

#: how often a taker asks the store whether the lease has come free
POLL_S = 0.1


class Ownership:
    """``let_go(session_id, write)`` stops this process's copy of a session: with ``write``, its
    last changes are written first (it was asked for); without, nothing more is written (another
    process holds it already)."""

    def __init__(self, store: SessionStore, lease_s: float, live: Callable[[], Collection[str]],
                 let_go: Callable[[str, bool], Awaitable[None]]) -> None:
        self.store = store
        self.lease_s = float(lease_s)
        self.holder = uuid.uuid4().hex
        self._live = live
        self._let_go = let_go
        # its own thread: a renewal must not queue behind a large batch of writes
        self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="store-lease")
        self._task: asyncio.Task[None] | None = None
        self._letting_go: set[str] = set()
        #: the leases this process believes it has (what it drops at shutdown)
        self.held: set[str] = set()
        #: sessions handed to another process, and lost to one (for metrics and tests)
        self.moved_out = 0
        self.lost = 0

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._renew_forever(), name="session-leases")

    async def _call(self, fn: Callable[..., object], *args: object) -> object:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, fn, *args)

    async def _renew_forever(self) -> None:
        while True:
            try:
                await self.renew()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - a store that is down: try again next round
                log.warning("session leases not renewed: %s", exc)
            await asyncio.sleep(self.lease_s / 5)

    async def renew(self) -> None:
        """One round: hold every live session, and let go of those asked for or lost."""
        ids = [sid for sid in self._live() if sid not in self._letting_go]
        if not ids:
            return
        renewal = await asyncio.wait_for(self._call(self.store.hold, self.holder, ids, self.lease_s), self.lease_s)
        assert isinstance(renewal, Renewal)
        self.held.update(ids)
        self.held.difference_update(renewal.lost)
        for sid, write in [(sid, False) for sid in renewal.lost] + [(sid, True) for sid in renewal.wanted]:
            self._letting_go.add(sid)
            asyncio.create_task(self._hand_over(sid, write), name=f"hand-over-{sid}")

    async def _hand_over(self, session_id: str, write: bool) -> None:
        try:
            if write:
                log.info("session %s: asked for by another process; handing it over", session_id)
                self.moved_out += 1
            else:
                log.warning("session %s: held by another process now; this copy stops unwritten", session_id)
                self.lost += 1
            await self._let_go(session_id, write)
        finally:
            self._letting_go.discard(session_id)

    async def take(self, session_id: str, timeout: float) -> bool:
        """Take the lease of a session to rebuild here, asking its holder to let it go and
        waiting up to ``timeout`` for that (or for a dead holder's lease to lapse)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        asked = False
        while True:
            if await self._call(self.store.claim, session_id, self.holder, self.lease_s):
                self.held.add(session_id)
                return True
            if not asked:
                await self._call(self.store.ask, session_id, self.holder, timeout + self.lease_s)
                asked = True
            if loop.time() + POLL_S > deadline:
                return False
            await asyncio.sleep(POLL_S)

    async def release(self, session_ids: Collection[str]) -> None:
        ids = [sid for sid in session_ids if sid in self.held]
        if ids:
            self.held.difference_update(ids)
            await self._call(self.store.release, self.holder, ids)

    async def close(self, timeout: float) -> None:
        """Stop renewing and drop this process's leases (another process may take them at once)."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        try:
            async with asyncio.timeout(timeout):
                await self.release(list(self.held))
        except Exception as exc:  # noqa: BLE001 - they lapse on their own
            log.warning("session leases not released at shutdown (they lapse in %.0f s): %s", self.lease_s, exc)
        self._executor.shutdown(wait=False)
