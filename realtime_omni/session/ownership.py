"""Which server process holds a live session, when several share one store (Redis).

Each process holds a lease on each of its live sessions (attached or waiting for a resume), and
on each it is still letting go of, and renews them all every ``lease_s / 5``. A client that
resumes through another process makes that process *ask* for the session: the holder's next
renewal sees the request and lets its copy go (closed as ``session_moved``), writes its last
changes, then drops the lease; the asker takes it and rebuilds the session from the stored row.
A process that died leaves its leases to lapse after ``lease_s``. The store's writes are fenced
by the lease: a process writes or deletes only the rows of sessions it holds (or nobody does),
so one that stalled past its lease, whose session another process serves now, changes nothing
there, and its copy stops at its next renewal.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import uuid
from collections.abc import Awaitable, Callable, Collection

from .store import Renewal, SessionStore

log = logging.getLogger(__name__)

#: how often a taker asks the store whether the lease has come free
POLL_S = 0.1


class Ownership:
    """``let_go(session_id, write)`` stops this process's copy of a session: with ``write``, its
    last changes are written before the lease goes (it was asked for); without, nothing more is
    written (another process holds it already). The manager calls :meth:`letting_go` for a
    session that ends here and :meth:`release` once its last write is in."""

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
        self._tasks: set[asyncio.Task[None]] = set()
        #: the leases this process believes it has (renewed until released)
        self.held: set[str] = set()
        #: sessions this process is letting go of: closing, or waiting for their last write
        self.pending: set[str] = set()
        #: sessions another process took while this one still ran them (stopped unwritten)
        self._lost: set[str] = set()
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
        """One round: hold every live session and every one being let go; let go of those
        asked for, and stop those another process took meanwhile."""
        live = set(self._live())
        self._lost &= live  # (gone here: forgotten)
        ids = sorted((live | self.held) - self._lost)
        if not ids:
            return
        had = set(self.held)  # a lease of these that lapsed is lost, not taken again
        renewal = await asyncio.wait_for(self._call(self.store.hold, self.holder, ids, self.lease_s, had),
                                         self.lease_s)
        assert isinstance(renewal, Renewal)
        # what ended and was released while the renewal ran must not come back: held again, it
        # would be renewed for ever (the store has it again now: released once more)
        live = set(self._live())
        stale = [sid for sid in ids if sid not in live and sid not in self.held and sid not in renewal.lost]
        self.held.update(sid for sid in ids if sid not in stale and sid not in renewal.lost)
        if stale:
            await self._call(self.store.release, self.holder, stale)
        for sid in renewal.lost:
            self.held.discard(sid)
            self.pending.discard(sid)
            if sid in live:
                self._lost.add(sid)
                self.lost += 1
                log.warning("session %s: held by another process now; this copy stops unwritten", sid)
                self._spawn(sid, write=False)
        for sid in renewal.wanted:
            if sid in live and sid not in self.pending:
                self.letting_go(sid)
                self.moved_out += 1
                log.info("session %s: asked for by another process; handing it over", sid)
                self._spawn(sid, write=True)

    def _spawn(self, session_id: str, write: bool) -> None:
        task = asyncio.get_running_loop().create_task(self._letting(session_id, write), name=f"let-go-{session_id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _letting(self, session_id: str, write: bool) -> None:
        try:
            await self._let_go(session_id, write)
        except Exception:  # noqa: BLE001 - the copy runs on: it may be asked for again
            log.exception("session %s: not let go", session_id)
            self.pending.discard(session_id)

    def letting_go(self, session_id: str) -> None:
        """A session of this process ends or moves: its lease is kept (renewed) until
        :meth:`release`, and a resume here waits for that."""
        if session_id in self.held:
            self.pending.add(session_id)

    async def take(self, session_id: str, timeout: float) -> bool:
        """Take the lease of a session to rebuild here, asking its holder to let it go and
        waiting up to ``timeout`` for that (or for a dead holder's lease to lapse). A session
        this process is still letting go of is waited for the same way."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        asker = f"{self.holder}:{uuid.uuid4().hex[:8]}"  # this resume's request (not another's here)
        asked = taken = False
        try:
            while True:
                if session_id not in self.pending and await self._call(
                        self.store.claim, session_id, self.holder, self.lease_s):
                    self.held.add(session_id)
                    taken = True
                    return True
                if not asked and session_id not in self.pending:
                    await self._call(self.store.ask, session_id, asker, timeout + self.lease_s)
                    asked = True
                if loop.time() + POLL_S > deadline:
                    return False
                await asyncio.sleep(POLL_S)
        finally:
            if asked and not taken:  # given up (or cancelled): its holder keeps it
                with contextlib.suppress(Exception):
                    await asyncio.shield(self._call(self.store.withdraw, session_id, asker))

    async def release(self, session_ids: Collection[str]) -> None:
        ids = [sid for sid in session_ids if sid in self.held]
        self.pending.difference_update(session_ids)
        if ids:
            self.held.difference_update(ids)
            await self._call(self.store.release, self.holder, ids)

    async def close(self, timeout: float, release: bool = True) -> None:
        """Stop renewing and drop this process's leases (another process may take them at once);
        ``release`` False: leave them to lapse (the last writes did not all land)."""
        tasks = [t for t in [self._task, *self._tasks] if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._task = None
        if not release:
            self._executor.shutdown(wait=False)
            return
        try:
            async with asyncio.timeout(timeout):
                await self.release(list(self.held))
        except Exception as exc:  # noqa: BLE001 - they lapse on their own
            log.warning("session leases not released at shutdown (they lapse in %.0f s): %s", self.lease_s, exc)
        self._executor.shutdown(wait=False)
