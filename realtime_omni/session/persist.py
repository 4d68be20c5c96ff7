"""Incremental, debounced persistence of live sessions.

Sessions mark what changed (the meta, an item, an item gone); one flusher task gathers the marks
of every session after ``debounce_s``, turns them into :class:`StoreChange` s on the event loop
(the state as it is *then*: ten edits of an item make one write) and hands one batch at a time
to the store thread. While a batch is written new marks only coalesce, so the backlog is bounded
by construction: at most one pending write per item and per session, never a queue of copies.

Each written meta carries ``last_seq``: every event numbered up to it has its effect in the
stored state. After a crash a resume compares it with what the client saw (see
:func:`restoration`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .retention import without_transcripts
from .store import SessionStore, StoreChange, token_hash

if TYPE_CHECKING:
    from .runner import SessionRunner

log = logging.getLogger(__name__)

#: events that change an item's stored record (keyed by ``item_id`` or ``item.id``)
_ITEM_EVENTS = frozenset({
    "conversation.item.added", "conversation.item.done", "conversation.item.truncated",
    "conversation.item.input_audio_transcription.completed", "response.output_item.done",
})


@dataclass
class _Dirty:
    runner: "SessionRunner"
    items: set[str] = field(default_factory=set)
    removed: set[str] = field(default_factory=set)
    since: float = field(default_factory=time.monotonic)


class Persister:
    def __init__(self, store: SessionStore, executor: concurrent.futures.Executor, *,
                 debounce_s: float = 0.2, store_transcripts: bool = True) -> None:
        self.store = store
        #: this process's lease holder id (a store shared by several processes, see ownership.py):
        #: writes touch only the sessions it holds (or nobody does)
        self.holder: str | None = None
        self.executor = executor
        self.debounce_s = debounce_s
        self.store_transcripts = store_transcripts
        self._dirty: dict[str, _Dirty] = {}
        self._deleted: set[str] = set()
        self._wake = asyncio.Event()
        #: new sessions whose row is not in the store yet: set once a batch has written it
        self._unwritten: dict[str, asyncio.Event] = {}
        self._task: asyncio.Task[None] | None = None
        self._writing: asyncio.Future[None] | None = None
        #: the sessions of the batch being written
        self._in_flight: set[str] = set()
        #: sessions whose last write someone waits for (a handover): written without the debounce
        self._awaited: set[str] = set()
        #: batches written, and items written, since start (for /metrics and the benchmarks)
        self.batches = 0
        self.items_written = 0

    # ------------------------------------------------------------ marks (on the event loop)
    def opened(self, runner: "SessionRunner") -> None:
        """A new session: its meta is written with the next batch, without the debounce (its
        client waits for it, see :meth:`written`)."""
        self._unwritten[runner.core.id] = asyncio.Event()
        self._mark(runner)

    async def written(self, session_id: str, timeout: float) -> bool:
        """Wait until a new session's row is in the store (at most ``timeout`` s): its resume
        token then survives a crash of this process. False: not written in time."""
        event = self._unwritten.get(session_id)
        if event is None:
            return True
        try:
            async with asyncio.timeout(timeout):
                await event.wait()
        except TimeoutError:
            return False
        return True

    def changed(self, runner: "SessionRunner", events: list[dict[str, Any]]) -> None:
        """Mark what these (state-changing) events touched."""
        dirty = self._mark(runner)
        for event in events:
            kind = event.get("type")
            if kind == "conversation.item.deleted":
                item_id = str(event.get("item_id"))
                dirty.items.discard(item_id)
                dirty.removed.add(item_id)
            elif kind in _ITEM_EVENTS:
                item = event.get("item")
                item_id = item.get("id") if isinstance(item, dict) else event.get("item_id")
                if item_id:
                    dirty.items.add(str(item_id))
                    dirty.removed.discard(str(item_id))
            elif kind == "response.done":
                for output in event.get("response", {}).get("output") or []:
                    if isinstance(output, dict) and output.get("id"):
                        dirty.items.add(str(output["id"]))

    def ended(self, runner: "SessionRunner", keep: bool, hurry: bool = False) -> None:
        """The session is over: its row goes (``keep`` False) or gets a last write (``hurry``:
        without the debounce, another process waits for it)."""
        sid = runner.core.id
        if keep:
            if hurry:
                self._awaited.add(sid)  # (until settled() has seen it written)
            self._mark(runner)
            return
        self._dirty.pop(sid, None)
        self._deleted.add(sid)
        self._release(sid)  # nothing to wait for: the row goes
        self._wake.set()

    def forget(self, sid: str) -> None:
        """Write nothing more of this session (another process serves it now)."""
        self._dirty.pop(sid, None)
        self._release(sid)

    async def settled(self, sid: str, timeout: float) -> bool:
        """Wait until what was marked of a session is written (at most ``timeout`` s)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        self._awaited.add(sid)  # written without the debounce: someone waits for it
        try:
            while sid in self._dirty or sid in self._deleted or sid in self._in_flight:
                if loop.time() >= deadline:
                    return False
                self._wake.set()
                await asyncio.sleep(min(self.debounce_s / 4, 0.05))
            return True
        finally:
            self._awaited.discard(sid)

    def _release(self, sid: str) -> None:
        event = self._unwritten.pop(sid, None)
        if event is not None:
            event.set()

    def _mark(self, runner: "SessionRunner") -> _Dirty:
        dirty = self._dirty.get(runner.core.id)
        if dirty is None:
            dirty = self._dirty[runner.core.id] = _Dirty(runner)
        self._wake.set()
        return dirty

    @property
    def backlog(self) -> int:
        """Sessions with changes not yet handed to the store (plus the batch being written)."""
        return len(self._dirty) + len(self._deleted)

    def oldest_change_age(self) -> float:
        return max((time.monotonic() - d.since for d in self._dirty.values()), default=0.0)

    # ------------------------------------------------------------ the flusher
    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="session-store-flusher")

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            if not any(sid in self._dirty for sid in (*self._unwritten, *self._awaited)):
                await asyncio.sleep(self.debounce_s)  # let a burst of changes coalesce
            self._wake.clear()
            await self.flush()

    async def flush(self) -> bool:
        """Write everything marked so far (one batch, in the store thread); False when the write
        failed (what it held is marked again, for the next batch)."""
        taken = self._dirty
        changes, deleted = self._take()
        if not changes and not deleted:
            return True
        loop = asyncio.get_running_loop()
        writing = loop.run_in_executor(self.executor, self.store.apply, changes, deleted, self.holder)
        self._writing, self._in_flight = writing, {c.session_id for c in changes} | set(deleted)

        def finished(done: asyncio.Future[list[str]]) -> None:
            # when the write ends (not when a waiter is cancelled), in one step: a failed batch is
            # marked again before its sessions leave the batch in flight (see ``settled``)
            error = done.exception() if not done.cancelled() else asyncio.CancelledError()
            if error is None:
                self._written(changes, done.result())
            else:
                log.error("session store write failed (%d sessions): %s", len(changes) + len(deleted), error)
                self._mark_again(taken, deleted)
            if self._writing is writing:
                self._writing, self._in_flight = None, set()

        writing.add_done_callback(finished)
        try:
            await asyncio.shield(writing)
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 - logged and marked again by ``finished``
            return False
        return True

    def _written(self, changes: list[StoreChange], theirs: list[str]) -> None:
        self.batches += 1
        self.items_written += sum(len(c.items) for c in changes if c.session_id not in theirs)
        for sid in theirs:
            log.warning("session %s: another process holds it now; its changes here were not written", sid)
        for change in changes:
            self._release(change.session_id)

    def _mark_again(self, taken: dict[str, _Dirty], deleted: list[str]) -> None:
        self._deleted.update(deleted)
        for sid, old in taken.items():
            if sid in self._deleted or old.runner.superseded:
                continue
            new = self._dirty.setdefault(sid, _Dirty(old.runner, since=old.since))
            new.items |= old.items - new.removed
            new.removed |= old.removed - new.items
        self._wake.set()

    def _take(self) -> tuple[list[StoreChange], list[str]]:
        dirty, self._dirty = self._dirty, {}
        deleted, self._deleted = sorted(self._deleted), set()
        # a superseded session's copy writes nothing (another process serves it)
        return [self._change(d) for d in dirty.values()
                if d.runner.core.id not in deleted and not d.runner.superseded], deleted

    def _change(self, dirty: _Dirty) -> StoreChange:
        runner = dirty.runner
        core = runner.core
        order = [item.id for item in core.conversation]
        present = set(order)
        digest = token_hash(runner.resume_token)
        meta = {"id": core.id, "model": core.model.id, "created_at": core.created_at,
                "config": core.config.model_dump(mode="json"), "owner": runner.owner,
                "token_digest": digest, "last_seq": runner.journal.last_seq, "order": order}
        items = {}
        for item in core.conversation:
            if item.id in dirty.items:
                items[item.id] = item.to_dict()
        if not self.store_transcripts:
            items = {i: without_transcripts({"items": [d]})["items"][0] for i, d in items.items()}
        removed = sorted(i for i in dirty.removed if i not in present)
        return StoreChange(core.id, digest, meta, items, removed)

    async def close(self, timeout: float) -> bool:
        """Stop the flusher and write what is left within ``timeout``; False if it did not fit
        or did not get written."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        try:
            async with asyncio.timeout(timeout):
                if self._writing is not None:  # the batch the flusher was waiting for goes on
                    with contextlib.suppress(Exception):  # (failed: marked again, retried just below)
                        await asyncio.shield(self._writing)
                return await self.flush()
        except TimeoutError:
            return False


def restoration(stored_seq: int, client_seq: int, item_ids: list[str]) -> dict[str, Any]:
    """What a resume from the store tells the client (extension ``session.resumed.restored``).

    The stored state covers every event up to ``stored_seq``; the journal did not survive.
    - ``client_seq > stored_seq``: the client saw events the store never got; their effects
      (items added, deleted, changed) may be missing: ``lost`` names that range.
    - ``client_seq < stored_seq``: events the client never got cannot be replayed; their effects
      are in the restored state: ``not_replayed`` names that range.
    ``item_ids`` is the restored conversation, in order: the client compares it with its own.
    """
    lost = [stored_seq + 1, client_seq] if client_seq > stored_seq else None
    missed = [client_seq + 1, stored_seq] if client_seq < stored_seq else None
    return {"stored_sequence_number": stored_seq, "lost": lost, "not_replayed": missed, "item_ids": item_ids}
