"""A session of a :class:`~.model.RayModel`: its calls go to the one worker actor that holds its
engine state (sticky), and move to another live worker only when that one died (the context is
then rebuilt from the conversation at the next think)."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
from collections.abc import Iterator
from typing import Any, Protocol

from ..base import (
    ModelInfo,
    VADStream,
)
from ..worker import protocol as p
from ..worker.remote import RemoteSession, RemoteVADStream

log = logging.getLogger(__name__)


@dataclasses.dataclass(eq=False)
class Worker:
    """One model-worker actor as the gateway sees it."""

    worker_id: str
    node_id: str
    handle: Any
    resources: dict[str, float]
    pid: int = 0
    info: ModelInfo | None = None
    traits: p.Traits | None = None
    #: sessions open on the worker, as it last reported (all gateways), and when
    reported_live: int = 0
    reported_at: float = 0.0
    #: keys of the sessions this gateway placed here and has not closed
    placed: set[str] = dataclasses.field(default_factory=set)
    dead: bool = False

    @property
    def live(self) -> int:
        return max(self.reported_live, len(self.placed))

    def free(self) -> float:
        limit = self.info.max_sessions if self.info is not None else None
        return float("inf") if limit is None else limit - self.live


class SessionOwner(Protocol):
    """What a session uses of its :class:`~.model.RayModel` (which imports this module)."""

    name: str
    strip_unheard_audio: bool
    replacements: int
    _vad: Any

    @property
    def info(self) -> ModelInfo: ...

    @property
    def traits(self) -> p.Traits: ...

    def _call(self, session: RaySession, method: str, args: tuple[Any, ...], *, move: bool = True,
              timeout: float | None = None) -> Any: ...

    def _stream(self, session: RaySession, method: str, args: tuple[Any, ...],
                cancelled: threading.Event) -> Iterator[Any]: ...

    def _place(self, key: str, exclude: Worker | None = None, avoid: frozenset[str] = frozenset()) -> Worker: ...

    def _release(self, worker: Worker, key: str) -> None: ...


class RaySession(RemoteSession):
    """A session whose engine state lives in one worker actor under ``key`` (sticky)."""

    def __init__(self, owner: SessionOwner, key: str, worker: Worker) -> None:
        super().__init__(key, owner.traits, owner.strip_unheard_audio and not owner.info.hears_audio)
        self._owner = owner
        self.worker = worker
        #: a worker has served a call of this session (before that, a full worker may refuse it)
        self.admitted = False
        #: workers that refused it as full
        self.refused_by: set[str] = set()

    def worker_for_call(self) -> Worker:
        """This session's worker; if it died, the live worker with the most free capacity, where
        the session's context is rebuilt from the conversation at its next think (re-prefill)."""
        self._check()
        old = self.worker
        if not old.dead:
            return old
        owner = self._owner
        new = owner._place(self.key, exclude=old)
        owner._release(old, self.key)
        self.worker = new
        owner.replacements += 1
        log.warning("model %s: session %s moved from dead worker %s to %s; its context is rebuilt there "
                    "from the conversation (re-prefill)", owner.name, self.key[:8], old.worker_id, new.worker_id)
        return new

    def _call(self, method: str, args: tuple[Any, ...]) -> Any:
        return self._owner._call(self, method, args)

    def _call_now(self, method: str, args: tuple[Any, ...]) -> Any:
        return self._owner._call(self, method, args, move=False, timeout=2.0)

    def _stream(self, method: str, args: tuple[Any, ...], cancelled: threading.Event) -> Iterator[Any]:
        return self._owner._stream(self, method, args, cancelled)

    def _context_lost(self) -> bool:
        return self.worker.dead

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        worker = self.worker
        self._owner._release(worker, self.key)
        if not worker.dead:
            with contextlib.suppress(Exception):
                worker.handle.close.remote(self.key)  # fire and forget: never wait on close


class RayVADSession(RaySession):
    """For engines with a VAD (the session manager decides from ``type(session).new_vad``)."""

    def new_vad(self) -> VADStream:
        self._check()
        local = self._owner._vad
        if local is not None:
            return local.stream()  # the gateway's own VAD, beside the audio: no actor call per frame
        # the worker's VAD: one actor call per chunk of input the session core hands over (slow
        # past a few dozen sessions; prefer a gateway VAD)
        return RemoteVADStream(self, next(self._vad_keys), self._traits.vad_frame_samples)
