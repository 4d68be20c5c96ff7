"""SessionManager: the registry of live sessions, limits, resume, persistence and shutdown."""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import logging
from typing import Any, Literal

from ..audio.end_of_turn import EndOfTurnModel
from ..engines.base import ModelAtCapacity, ModelSession
from ..engines.registry import ModelRegistry
from ..observer import NullObserver, Observer
from ..pipeline import PipelineSettings
from ..protocol.errors import ProtocolError
from .core import Outgoing, RealtimeSession
from .journal import Journal
from .ownership import Ownership
from .persist import Persister, restoration
from .retention import keeps_row, purge_forever
from .runner import RunnerLimits, SessionRunner
from .store import SessionStore, token_hash

log = logging.getLogger(__name__)

#: how long a new session's client may wait for its first store write (a resume token that the
#: store has not got would not survive a crash of the process)
FIRST_WRITE_S = 2.0
#: sessions remembered as ended (see SessionManager._ended); a delete is written within seconds
ENDED_MEMORY = 4096
#: a resume waits at most this long for the store to find its session
STORE_LOAD_S = 10.0
#: a resume through this process waits for another's lease this much past the lease's length
#: (a holder that died: its lease lapses; one alive: it lets go at its next renewal)
TAKE_OVER_MARGIN_S = 1.0
#: how long a session that ended here keeps its lease waiting for its last write
SETTLE_S = 30.0


class SessionLimitError(Exception):
    """The server is at its session cap (HTTP 503 / WebSocket close 1013)."""


class UnknownModelError(Exception):
    """``?model=`` names no loaded model (HTTP 400)."""


class ResumeError(Exception):
    """The resume token is unknown or its grace period has passed."""


class _LiveHere(Exception):
    """A stored session another resume rebuilt here meanwhile: resume the live one."""


class SessionManager:
    def __init__(
        self,
        registry: ModelRegistry,
        *,
        max_sessions: int = 100,
        limits: RunnerLimits | None = None,
        pipeline: PipelineSettings | None = None,
        model_threads: int = 4,
        store: SessionStore | None = None,
        resume_grace_s: float = 30.0,
        persist_ttl_s: float = 3600.0,
        observer: Observer | None = None,
        store_transcripts: bool = True,
        end_of_turn: EndOfTurnModel | None = None,
        lease_s: float = 5.0,
    ) -> None:
        self.registry = registry
        #: semantic_vad's end-of-turn model, shared by every session (None: a silence window)
        self.end_of_turn = end_of_turn
        self.max_sessions = max_sessions
        self.limits = limits or RunnerLimits()
        self.pipeline = pipeline or PipelineSettings()
        self.store = store
        self.resume_grace_s = resume_grace_s
        self.persist_ttl_s = persist_ttl_s
        self.observer: Observer = observer or NullObserver()
        self._purger: asyncio.Task[None] | None = None
        # Models never run on the event loop: heavy steps (ASR/LLM/TTS) and the per-frame VAD get
        # separate pools so a long synthesis cannot delay barge-in detection.
        self.executor = concurrent.futures.ThreadPoolExecutor(model_threads, thread_name_prefix="model")
        self.vad_executor = concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix="vad")
        # One thread for store writes keeps the writes of a session in order.
        self.store_executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="store")
        #: incremental, debounced writes (store_transcripts False: items keep their shape, not their words)
        self.persister = Persister(store, self.store_executor, store_transcripts=store_transcripts) if store else None
        #: with a store shared by several processes: which of them runs each live session
        self.ownership = (Ownership(store, lease_s, lambda: list(self.sessions), self._let_go)
                          if store is not None and store.shared else None)
        if self.ownership is not None and self.persister is not None:
            self.persister.holder = self.ownership.holder  # writes fenced by the leases
        self.sessions: dict[str, SessionRunner] = {}
        self._by_token: dict[str, SessionRunner] = {}
        #: sessions that ended here for good, until their rows are surely gone from the store: a
        #: resume in the moment before the delete is written must not rebuild them from the row
        self._ended: collections.OrderedDict[str, None] = collections.OrderedDict()
        self.total_opened = 0
        self._releasing: set[asyncio.Task[None]] = set()
        #: replies prepared during the user's pause and released at the end-of-turn decision
        self.speculations_adopted = 0

    def start(self) -> None:
        """Begin the store's retention (on the event loop, once): expired rows are purged now,
        whatever ended their sessions, and periodically after."""
        if self.store is not None and self._purger is None:
            self._purger = asyncio.create_task(
                purge_forever(self.store, self.store_executor, self.persist_ttl_s, lambda: list(self.sessions)),
                name="session-store-purge")
        if self.persister is not None:
            self.persister.start()
        if self.ownership is not None:
            self.ownership.start()

    def open(self, model_name: str | None, *, snapshot: dict | None = None, token: str | None = None,
             last_seq: int = 0, owner: str | None = None, transport: str = "internal",
             session_type: Literal["realtime", "transcription"] = "realtime",
             model_session: ModelSession | None = None) -> SessionRunner:
        """Create and start a session (call on the event loop). ``owner``: digest of the API key
        it belongs to (None when keys are off); only that key may resume it. ``transport``: what
        carries it (websocket, webrtc, twilio), for metrics. ``model_session``: one reserved for
        it already (:meth:`_reserve`)."""
        model = self.registry.get(model_name) if model_session is not None else None
        if model is None:
            model, model_session = self._reserve(model_name)
        core = RealtimeSession(
            model.info, session_id=snapshot["id"] if snapshot else None,
            has_vad="vad" in model.info.capabilities, max_session_seconds=self.limits.max_session_s,
            requested_model=model_name,
            max_bytes=self.limits.max_session_bytes,
            end_of_turn=self.end_of_turn is not None,
            mcp_urls=self.limits.mcp_allowed_urls, mcp_timeout_s=self.limits.mcp_timeout_s,
        )
        core.accepts_model = lambda name, served=model.info.id: self.registry.resolve(name) == served
        if snapshot is not None:
            try:
                core.restore(snapshot)
            except Exception as exc:  # noqa: BLE001 - a row this server cannot read (older schema, damage)
                model_session.close()
                log.warning("session %s: stored row not restorable: %s", snapshot.get("id"), exc)
                raise ResumeError("unknown or expired resume token") from None
        else:
            try:
                core.start_as(session_type)
            except ProtocolError as exc:
                model_session.close()
                raise ValueError(exc.message) from None
        runner = SessionRunner(
            core, model_session, self.executor, self.vad_executor, self.limits, self.pipeline,
            on_close=self._forget, on_change=self.persister.changed if self.persister else None,
            observer=self.observer, transport=transport, end_of_turn=self.end_of_turn,
        )
        runner.owner = owner if snapshot is None else snapshot.get("owner")
        runner.from_store = snapshot is not None
        if token is not None:
            runner.resume_token = token
            runner.journal = Journal(self.limits.journal_events, last_seq, self.limits.journal_bytes)
        self.sessions[core.id] = runner
        self._by_token[runner.resume_token] = runner
        self.total_opened += 1
        self.observer.session_opened(transport)
        runner.start()
        if self.persister is not None and snapshot is None:
            self.persister.opened(runner)
        return runner

    async def stored(self, runner: SessionRunner) -> None:
        """Wait (within :data:`FIRST_WRITE_S`) until a new session's row is in the store, so
        that the resume token its client is about to get survives a crash of this process.
        Without a store, at once; a store too slow is logged, and the session goes on."""
        if self.persister is None:
            return
        if not await self.persister.written(runner.core.id, FIRST_WRITE_S):
            log.warning("session %s: not in the store after %.1f s; its client gets the token anyway",
                        runner.core.id, FIRST_WRITE_S)

    async def resume(self, token: str, last_seq: int, owner: str | None = None, transport: str = "internal"
                     ) -> tuple[SessionRunner, list[Outgoing], bool]:
        """Re-attach to a live (detached) session, or rebuild a stored one after a restart.

        Returns the runner, the events the client missed, and whether some were lost (gap).
        """
        runner = self._by_token.get(token)
        if runner is not None and not runner.closed.is_set():
            if runner.owner != owner:  # another key's session: as if the token did not exist
                raise ResumeError("unknown or expired resume token")
            # one attachment at a time: concurrent resumes take over one after the other
            async with runner.attach_lock:
                if runner.close_reason is not None:  # ending (its grace ran out meanwhile): not to be resumed
                    raise ResumeError("unknown or expired resume token")
                if runner.detached_since is None:
                    # The old connection may be half-dead (the server has not seen the drop
                    # yet): the token holder takes over and the old connection is let go.
                    if runner.kick is not None:
                        runner.kick()
                    try:
                        await asyncio.wait_for(runner.detached.wait(), 5.0)
                    except asyncio.TimeoutError:
                        raise ResumeError("this session is still connected elsewhere") from None
                missed, gap = await runner.attach(last_seq)
                if runner.close_reason is not None or runner.closed.is_set():
                    raise ResumeError("unknown or expired resume token")
            self.observer.session_resumed(runner.transport)
            return runner, missed, gap
        if self.store is not None:
            snapshot = await self._load(token)
            if snapshot is not None and snapshot.get("owner") != owner:
                raise ResumeError("unknown or expired resume token")
            if snapshot is not None and self._rebuildable(snapshot):
                if not isinstance(snapshot.get("model"), str):  # a row this server cannot read
                    raise ResumeError("unknown or expired resume token")
                if self.ownership is None:
                    return self._rebuild(snapshot, token, last_seq, transport)
                # room for it here first (its model session reserved): the process that holds it
                # lets it go only for a rebuild that can happen
                _model, reserved = self._reserve(snapshot["model"])
                try:
                    snapshot = await self._take_over(snapshot, token)
                except BaseException as exc:
                    with contextlib.suppress(Exception):  # (off the loop: a model's close may block)
                        await asyncio.shield(asyncio.to_thread(reserved.close))
                    if isinstance(exc, _LiveHere):  # another resume here rebuilt it meanwhile: take it over
                        return await self.resume(token, last_seq, owner, transport)
                    raise
                try:
                    return self._rebuild(snapshot, token, last_seq, transport, reserved)
                except BaseException:
                    await self._give_back(str(snapshot["id"]))
                    raise
        raise ResumeError("unknown or expired resume token")

    async def _load(self, token: str) -> dict[str, Any] | None:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(STORE_LOAD_S):
                return await loop.run_in_executor(self.store_executor, self.store.load,  # type: ignore[union-attr]
                                                  token_hash(token), self.persist_ttl_s)
        except Exception as exc:  # noqa: BLE001 - slow, or down: the client may try again
            log.warning("resume: the session store did not answer: %s", exc or type(exc).__name__)
            raise ResumeError("the session store did not answer in time; try again") from None

    def _reserve(self, model_name: str | None) -> tuple[Any, ModelSession]:
        """The model and a session of it, or what admission refuses (the server's limit, an
        unknown model, the model at its capacity)."""
        model = self._admissible(model_name)
        try:
            return model, model.open_session()
        except ModelAtCapacity as exc:  # admission control: refused, never slowed down
            raise SessionLimitError(f"model {model.info.id!r} is at its capacity: {exc}") from exc

    def _admissible(self, model_name: str | None) -> Any:
        """The model a new session would get, or what :meth:`open` refuses at once for it
        (the model itself may still be at its capacity)."""
        if len(self.sessions) >= self.max_sessions:
            raise SessionLimitError(f"server is at its limit of {self.max_sessions} concurrent sessions")
        model = self.registry.get(model_name)
        if model is None:
            known = ", ".join(m.id for m in self.registry.infos())
            raise UnknownModelError(f"unknown model {model_name!r}; available: {known}")
        return model

    def _rebuild(self, snapshot: dict[str, Any], token: str, last_seq: int, transport: str,
                 model_session: ModelSession | None = None) -> tuple[SessionRunner, list[Outgoing], bool]:
        stored_seq = int(snapshot.get("last_seq", 0))
        # Number on from whatever the client saw last, so no number is ever reused.
        runner = self.open(snapshot["model"], snapshot=snapshot, token=token, last_seq=max(stored_seq, last_seq),
                           transport=transport, model_session=model_session)
        self.observer.session_resumed(transport)
        # The journal died with the old process: say precisely what cannot be replayed
        # and what the store never got (see persist.restoration).
        runner.restored = restoration(stored_seq, last_seq, [item.id for item in runner.core.conversation])
        return runner, [], last_seq != stored_seq

    def _rebuildable(self, snapshot: dict[str, Any]) -> bool:
        """A stored session that is neither live here nor ended here for good."""
        return snapshot.get("id") not in self.sessions and snapshot.get("id") not in self._ended

    async def _take_over(self, snapshot: dict[str, Any], token: str) -> dict[str, Any]:
        """Take a stored session from the process that holds it (it writes its last changes and
        lets go) and read its row again; a holder that neither lets go nor lapses in time keeps it."""
        assert self.ownership is not None
        session_id = str(snapshot.get("id"))
        try:
            taken = await self.ownership.take(session_id, self.ownership.lease_s + TAKE_OVER_MARGIN_S)
        except Exception as exc:  # noqa: BLE001 - the store is down or slow
            log.warning("session %s: lease not taken: %s", session_id, exc)
            raise ResumeError("the session store did not answer in time; try again") from None
        if not taken:
            raise ResumeError("this session is still connected elsewhere")
        try:
            fresh = await self._load(token)
        except BaseException:  # (cancelled too: a lease without a session would be renewed for ever)
            await asyncio.shield(self._give_back(session_id))
            raise
        if fresh is None or fresh.get("id") != session_id or not self._rebuildable(fresh):
            await self._give_back(session_id)
            if session_id in self.sessions:  # another resume of it here was quicker
                raise _LiveHere(session_id)
            raise ResumeError("unknown or expired resume token")  # ended meanwhile
        return fresh

    async def _give_back(self, session_id: str) -> None:
        """A lease taken for a rebuild that did not happen (unless the session runs here now, or
        ended here and waits for its last write)."""
        if self.ownership is None or session_id in self.sessions or session_id in self.ownership.pending:
            return
        try:
            await self.ownership.release([session_id])
        except Exception as exc:  # noqa: BLE001 - it lapses on its own
            log.warning("session %s: lease not given back (it lapses): %s", session_id, exc)

    async def _let_go(self, session_id: str, write: bool) -> None:
        """Stop this process's copy of a session another process serves now (see :class:`Ownership`);
        its lease goes once its last changes are written (``_forget``), or at once if it ended."""
        runner = self.sessions.get(session_id)
        if runner is None:
            return  # ended meanwhile: _forget handles its lease
        if not write:  # another process holds it already: nothing more of this copy is written
            runner.superseded = True
            if self.persister is not None:
                self.persister.forget(session_id)
        if runner.kick is not None:  # its client (half-dead, or about to be) goes: the session moves
            runner.kick()
        await runner.close("session_moved")

    async def _release_after_write(self, session_id: str) -> None:
        """Drop the lease once the session's last changes (or its row's deletion) are written;
        one that does not get written in :data:`SETTLE_S` goes all the same (it lapses anyway
        when this process cannot reach the store)."""
        assert self.ownership is not None
        if self.persister is not None and not await self.persister.settled(session_id, SETTLE_S):
            log.warning("session %s: its last changes are not written after %.0f s; its lease goes anyway",
                        session_id, SETTLE_S)
        try:
            await self.ownership.release([session_id])
        except Exception as exc:  # noqa: BLE001 - it lapses on its own
            log.warning("session %s: lease not released (it lapses): %s", session_id, exc)

    def _forget(self, runner: SessionRunner) -> None:
        self.speculations_adopted += runner.speculations_adopted
        self.observer.session_closed(runner.transport, runner.close_reason or "ended")
        self.sessions.pop(runner.core.id, None)
        self._by_token.pop(runner.resume_token, None)
        if self.persister is not None and runner.superseded:
            self.persister.forget(runner.core.id)  # another process writes its row now
        elif self.persister is not None:
            keep = keeps_row(runner.close_reason)
            self.persister.ended(runner, keep=keep, hurry=runner.close_reason == "session_moved")
            if not keep:
                self._ended[runner.core.id] = None
                while len(self._ended) > ENDED_MEMORY:
                    self._ended.popitem(last=False)
        if self.ownership is not None and not runner.superseded:
            self.ownership.letting_go(runner.core.id)
            task = asyncio.get_running_loop().create_task(self._release_after_write(runner.core.id))
            self._releasing.add(task)
            task.add_done_callback(self._releasing.discard)

    async def shutdown(self, timeout: float = 10.0) -> None:
        """Close every session and the store within ``timeout`` seconds, whatever is stuck.

        Sessions end as ``server_shutdown`` (their snapshots stay: resumable after a restart).
        What the store has not written by the deadline is given up, and said so in the log.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        if self._purger is not None:
            self._purger.cancel()
        runners = list(self.sessions.values())
        if runners:
            closing = [asyncio.ensure_future(r.close("server_shutdown")) for r in runners]
            _, pending = await asyncio.wait(closing, timeout=timeout * 0.6)
            for task in pending:
                task.cancel()
            if pending:
                log.warning("shutdown: %d sessions did not close in time; cancelled", len(pending))
                await asyncio.wait(pending, timeout=max(deadline - loop.time(), 0.0) / 2)
        self.executor.shutdown(wait=False, cancel_futures=True)
        self.vad_executor.shutdown(wait=False, cancel_futures=True)
        # what is marked is written in one last batch; the deadline bounds how long that may take
        written = self.persister is None or await self.persister.close(max(deadline - loop.time(), 0.1))
        for task in list(self._releasing):
            task.cancel()
        if self.ownership is not None:
            # after the last writes another process may take the sessions over at once; without
            # them the leases lapse on their own
            await self.ownership.close(max(deadline - loop.time(), 0.1), release=written)
        if not written:
            log.warning("shutdown: the session store did not finish its writes in time; the rest is lost")
            self.store_executor.shutdown(wait=False, cancel_futures=True)
            return
        self.store_executor.shutdown(wait=False)
        if self.store is not None:
            self.store.close()

