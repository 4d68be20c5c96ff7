"""What the server measures, as a small typed interface.

The session core, its driver, the pipeline and the transports report what happened here; they
never talk to a metrics library. :mod:`realtime_omni.metrics` implements it for Prometheus;
:class:`NullObserver` (the default) drops everything, so tests and embedders need nothing.
"""

from __future__ import annotations

from typing import Literal, Protocol

#: the stages whose model steps are timed: a thinker token, a talker chunk, a codec decode
Stage = Literal["thinker", "talker", "codec"]


class Observer(Protocol):
    def session_opened(self, transport: str) -> None:
        """A new session started on ``transport`` (websocket, webrtc, twilio, ...)."""

    def session_closed(self, transport: str, reason: str) -> None:
        """A session ended for good; ``reason`` is its close reason (client_closed, ...)."""

    def session_detached(self, transport: str) -> None:
        """The connection dropped and the session waits for a resume."""

    def session_resumed(self, transport: str) -> None:
        """A client re-attached to a session with its resume token."""

    def response_done(self, status: str) -> None:
        """A ``response.done`` left for the client (completed, cancelled, failed, incomplete)."""

    def error_sent(self, code: str) -> None:
        """An ``error`` event left for the client."""

    def time_to_first_audio(self, seconds: float) -> None:
        """``response.created`` → the response's first audio handed to the transport."""

    def speech_end_to_first_audio(self, seconds: float) -> None:
        """End of the user's speech (as it arrived) → the reply's first audio handed over."""

    def barge_in(self, stopped_s: float, cancelled_s: float) -> None:
        """The user spoke over a reply that had sent audio. From the start of the speech (when
        that audio arrived): ``stopped_s`` to the last audio of the reply handed over (0 when none
        followed), ``cancelled_s`` to its ``response.done`` (cancelled) handed over."""

    def stage_step(self, stage: Stage, seconds: float) -> None:
        """One model step of a pipeline stage (waits on other stages not included)."""

    def real_time_factor(self, ratio: float) -> None:
        """One reply: pipeline time (pacing sleeps excluded) per second of audio produced."""


class NullObserver:
    """Measures nothing."""

    def session_opened(self, transport: str) -> None:
        pass

    def session_closed(self, transport: str, reason: str) -> None:
        pass

    def session_detached(self, transport: str) -> None:
        pass

    def session_resumed(self, transport: str) -> None:
        pass

    def response_done(self, status: str) -> None:
        pass

    def error_sent(self, code: str) -> None:
        pass

    def time_to_first_audio(self, seconds: float) -> None:
        pass

    def speech_end_to_first_audio(self, seconds: float) -> None:
        pass

    def barge_in(self, stopped_s: float, cancelled_s: float) -> None:
        pass

    def stage_step(self, stage: Stage, seconds: float) -> None:
        pass

    def real_time_factor(self, ratio: float) -> None:
        pass
