"""A session of a :class:`~.model.RayModel`: its calls go to the one worker actor that holds its
engine state (sticky), and move to another live worker only when that one died (the context is
then rebuilt from the conversation at the next think)."""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import logging
import threading
from collections.abc import Iterator
from typing import Any, Protocol

import numpy as np

from ...audio import Pcm
from ..base import (
    ModelInfo,
    ModelSession,
    TalkerOutput,
    ThinkerOutput,
    ThinkRequest,
    VADStream,
)
from ..worker import protocol as p
from ..worker.protocol import WorkerCrashed, WorkerError

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

    def _place(self, key: str, exclude: Worker | None = None) -> Worker: ...

    def _release(self, worker: Worker, key: str) -> None: ...


class RaySession(ModelSession):
    """A session whose engine state lives in one worker actor under ``key`` (sticky)."""

    def __init__(self, owner: SessionOwner, key: str, worker: Worker) -> None:
        self._owner = owner
        self.key = key
        self.worker = worker
        self.closed = False
        self._traits = owner.traits
        self._vad_keys = itertools.count(1)

    def _check(self) -> None:
        if self.closed:
            raise RuntimeError("model session is closed")

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

    def transcribe(self, pcm16k: np.ndarray) -> str:
        return self._owner._call(self, "transcribe", (pcm16k,))

    def listen(self, audio: Pcm) -> Pcm | None:
        # a duplex model hears each input chunk where it lives: one actor call per chunk
        return self._owner._call(self, "listen", (audio,))

    def think(self, request: ThinkRequest) -> Iterator[ThinkerOutput]:
        self._check()
        wire = p.wire_request(request, self._owner.strip_unheard_audio and not self._owner.info.hears_audio)
        return self._owner._stream(self, "think", (wire,), request.cancelled)

    def talk_boundary(self, pending: list[ThinkerOutput], final: bool) -> int:
        if not self._traits.custom_talk_boundary:
            return super().talk_boundary(pending, final)
        self._check()
        # on the event loop: never wait for a move; a dead worker fails the response at once
        return self._owner._call(self, "talk_boundary", (pending, final), move=False, timeout=2.0)

    def talk(
        self, segment: list[ThinkerOutput], voice: str, cancelled: threading.Event, final: bool, speed: float = 1.0
    ) -> Iterator[TalkerOutput]:
        self._check()
        return self._owner._stream(self, "talk", (segment, voice, final, speed), cancelled)

    def decode(self, out: TalkerOutput) -> np.ndarray:
        if not self._traits.custom_decode:
            return super().decode(out)
        return self._owner._call(self, "decode", (out,))

    def confirm(self, spoken_text: str) -> None:
        self._check()
        if self.worker.dead:
            return  # the context to cut back died with the worker
        with contextlib.suppress(WorkerError):
            self._owner._call(self, "confirm", (spoken_text,), move=False, timeout=5.0)

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
            return local.stream()
        return RayVADStream(self, next(self._vad_keys), self._traits.vad_frame_samples)


class RayVADStream(VADStream):
    """The worker's VAD, for engines with no ``gateway_vad``: one actor call per chunk of input
    the session core hands over (slow past a few dozen sessions; prefer a gateway VAD)."""

    def __init__(self, session: RaySession, key: int, frame_samples: int) -> None:
        self._session = session
        self.key = key
        self.frame_samples = frame_samples
        self._reset = False

    def probabilities(self, pcm16k: np.ndarray) -> list[float]:
        if len(pcm16k) % self.frame_samples:
            raise ValueError(f"VAD input must be whole frames of {self.frame_samples} samples, got {len(pcm16k)}")
        reset, self._reset = self._reset, False
        args = (self.key, pcm16k, reset)
        try:
            return self._session._owner._call(self._session, "vad", args)
        except WorkerCrashed:
            return self._session._owner._call(self._session, "vad", args)  # fresh state on the next worker

    def reset(self) -> None:
        self._reset = True
