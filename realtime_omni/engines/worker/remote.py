"""What a session whose engine state lives elsewhere does the same way wherever that is: in a
supervised worker process (:class:`~.proxy.IsolatedSession`) or in a Ray actor
(:class:`~..placement.session.RaySession`).

Every engine call becomes a call or a stream to the place that holds the session's state; pure
text logic (the default talk boundary, decoding plain audio) stays here, with no round trip.
Subclasses say how to reach that place (:meth:`RemoteSession._call`, ``_call_now``, ``_stream``)
and how to close.
"""

from __future__ import annotations

import abc
import contextlib
import itertools
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np

from ...audio import Pcm
from ..base import ModelSession, TalkerOutput, ThinkerOutput, ThinkRequest, VADStream
from . import protocol as p
from .protocol import WorkerCrashed, WorkerError


class RemoteSession(ModelSession):
    def __init__(self, key: Any, traits: p.Traits, strip_unheard_audio: bool) -> None:
        self.key = key
        self.closed = False
        self._traits = traits
        self.talks_every_output = traits.talks_every_output  # the base talk boundary reads it here
        self.talks_live = traits.talks_live
        #: drop the audio of turns a model that does not hear audio never reads (less to send)
        self._strip_unheard_audio = strip_unheard_audio
        self._vad_keys = itertools.count(1)

    # -- how to reach the session's state (subclasses) ------------------------------------------
    @abc.abstractmethod
    def _call(self, method: str, args: tuple[Any, ...]) -> Any:
        """One call; waits for a restarting or replaced worker like any model step."""

    @abc.abstractmethod
    def _call_now(self, method: str, args: tuple[Any, ...]) -> Any:
        """One call that must not wait for a worker to come back (on the event loop, or about
        state that a new worker would not hold anyway); raises :class:`WorkerError` instead."""

    @abc.abstractmethod
    def _stream(self, method: str, args: tuple[Any, ...], cancelled: threading.Event) -> Iterator[Any]:
        """A generator running where the state is, with cancellation."""

    def _context_lost(self) -> bool:
        """Whether the state a ``confirm`` would cut back is known to be gone already."""
        return False

    # -- the engine calls -------------------------------------------------------------------------
    def _check(self) -> None:
        if self.closed:
            raise RuntimeError("model session is closed")

    def transcribe(self, pcm16k: np.ndarray) -> str:
        self._check()
        return self._call("transcribe", (pcm16k,))

    def listen(self, audio: Pcm) -> Pcm | None:
        self._check()
        return self._call("listen", (audio,))

    def think(self, request: ThinkRequest) -> Iterator[ThinkerOutput]:
        self._check()
        return self._stream("think", (p.wire_request(request, self._strip_unheard_audio),), request.cancelled)

    def prefill(self, request: ThinkRequest) -> int:
        self._check()
        return self._call("prefill", (p.wire_request(request, self._strip_unheard_audio),))

    def talk_boundary(self, pending: list[ThinkerOutput], final: bool) -> int:
        if not self._traits.custom_talk_boundary:
            return super().talk_boundary(pending, final)  # pure text logic: no round trip
        self._check()
        # called on the event loop: never wait for a worker coming back (whose thinker state for
        # this response died anyway); a WorkerError fails the response at once
        return self._call_now("talk_boundary", (pending, final))

    def talk(
        self, segment: list[ThinkerOutput], voice: str, cancelled: threading.Event, final: bool, speed: float = 1.0
    ) -> Iterator[TalkerOutput]:
        self._check()
        return self._stream("talk", (segment, voice, final, speed), cancelled)

    def talk_more(self, segment: list[ThinkerOutput], voice: str, final: bool, first: bool = False) -> None:
        self._check()
        self._call("talk_more", (segment, voice, final, first))

    def talk_live(self, cancelled: threading.Event) -> Iterator[TalkerOutput]:
        self._check()
        return self._stream("talk_live", (), cancelled)

    def decode(self, out: TalkerOutput) -> np.ndarray:
        if not self._traits.custom_decode:
            return super().decode(out)
        self._check()
        return self._call("decode", (out,))

    def confirm(self, spoken_text: str) -> None:
        self._check()
        if self._context_lost():
            return  # the context to cut back died with its worker
        # only the worker that generated the reply holds a context to cut back: if it is down
        # (or dies now), there is nothing left to confirm and nothing to wait for
        with contextlib.suppress(WorkerError):
            self._call_now("confirm", (spoken_text,))


class RemoteVADStream(VADStream):
    """A VAD stream whose state lives with the session's; ``reset`` rides on the next call."""

    def __init__(self, session: RemoteSession, key: int, frame_samples: int) -> None:
        self._session = session
        self.key = key
        self.frame_samples = frame_samples
        self._reset = False

    def probabilities(self, pcm16k: np.ndarray) -> list[float]:
        session = self._session
        session._check()
        if len(pcm16k) % self.frame_samples:
            raise ValueError(f"VAD input must be whole frames of {self.frame_samples} samples, got {len(pcm16k)}")
        reset, self._reset = self._reset, False
        args = (self.key, pcm16k, reset)
        try:
            return session._call("vad", args)
        except WorkerCrashed:
            # the stream's state died with the worker; a VAD error would end the whole session
            # (the runner does not catch it), so run the frames again on the worker that took
            # over (waiting for it like any call), where the stream starts fresh
            return session._call("vad", args)

    def reset(self) -> None:
        self._reset = True
