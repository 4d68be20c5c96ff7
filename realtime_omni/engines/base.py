"""The contract between the session/pipeline layers and a model backend.

A :class:`VoiceModel` is loaded once per server and shared by every session. Each session opens
its own :class:`ModelSession`, which owns per-stream state (VAD recurrent state, the thinker's
KV cache) and is closed when the session ends. Every method that runs a model is synchronous and
is called from a worker thread by the pipeline, never from the event loop.
"""

from __future__ import annotations

import abc
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from ..audio import Pcm

Capability = Literal["audio_in", "text_in", "image_in", "audio_out", "text_out", "transcription", "vad", "echo", "tools"]


class ModelAtCapacity(RuntimeError):
    """``open_session`` refused: the model serves as many sessions as it can keep in real time."""


@dataclass(frozen=True)
class ModelInfo:
    """What ``GET /v1/models`` lists and ``session.created`` reports as capabilities."""

    id: str
    owned_by: str = "realtime-omni"
    capabilities: frozenset[str] = frozenset()
    #: the talker's native output rate; the pipeline resamples to the wire rate at the edge.
    output_rate: int = 24_000
    #: True when the thinker consumes the user's audio itself (omni); False when it needs text
    #: (cascade), in which case every audio turn is transcribed before the response starts.
    hears_audio: bool = False
    #: sessions the model serves at once (None: no limit of its own); one more is refused with
    #: :class:`ModelAtCapacity` rather than slowing the others below real time
    max_sessions: int | None = None
    #: True when the model answers while it listens: input audio goes to
    #: :meth:`ModelSession.listen` as it arrives and what comes back is played at once, as one
    #: open response. Such a model takes its own turns: no turn detection, no response pipeline.
    duplex: bool = False


@dataclass(frozen=True)
class ToolSpec:
    """A function the thinker may call: its name, what it does, and a JSON schema of its arguments."""

    name: str
    description: str
    parameters: dict[str, Any]


@dataclass(frozen=True)
class ToolCall:
    """A function call in the conversation: ``arguments`` is the JSON text the model produced."""

    name: str
    arguments: str
    call_id: str = ""


@dataclass(frozen=True)
class ToolCallDelta:
    """A piece of a function call streaming out of the thinker.

    The first piece of a call names the function; later pieces carry more of the arguments'
    JSON text; the last one has ``done`` set and the whole argument text in ``arguments``.
    """

    name: str
    delta: str = ""
    done: bool = False
    arguments: str = ""


#: ``auto``: the model chooses; ``none``: never call; ``required``: call one of the tools
ToolChoiceMode = Literal["auto", "none", "required"]


@dataclass
class TurnMessage:
    """One conversation message as a thinker sees it.

    ``role == "tool"`` is a function's output (``text``) for the call named ``tool_name``; an
    assistant message with ``call`` set is a function call the model made (or a client replayed).
    """

    role: Literal["system", "user", "assistant", "tool"]
    text: str = ""
    #: user audio at 16 kHz int16 (omni thinkers consume it; cascades use the transcript)
    audio: np.ndarray | None = None
    #: images (RGB uint8 HxWx3) attached to the turn
    images: list[np.ndarray] = field(default_factory=list)
    call: ToolCall | None = None
    tool_name: str | None = None


@dataclass
class ThinkRequest:
    """Everything one response needs: the full conversation as the listener knows it."""

    instructions: str
    messages: list[TurnMessage]
    max_output_tokens: int | None
    voice: str
    want_audio: bool
    #: set by the pipeline when the response is cancelled; engines poll it between tokens.
    cancelled: threading.Event = field(default_factory=threading.Event)
    #: functions the model may call (only sent to models with the ``tools`` capability)
    tools: list[ToolSpec] = field(default_factory=list)
    tool_choice: ToolChoiceMode = "auto"
    #: with ``tool_choice == "required"``: the one function that must be called, if named
    tool_name: str | None = None
    #: whether one reply may call several functions (engines that make one call per reply ignore it)
    parallel_tool_calls: bool = True
    #: speaking rate (``audio.output.speed``, 0.25-1.5); talkers that cannot change it ignore it
    speed: float = 1.0


@dataclass
class ThinkerOutput:
    """A piece of the thinker's stream: text plus, for omni models, opaque hidden states."""

    text: str
    hidden: object | None = None
    #: number of prompt tokens actually evaluated for this response (not reused from cache)
    prefilled_tokens: int | None = None
    prompt_tokens: int | None = None
    #: a piece of a function call instead of reply text (never spoken)
    call: ToolCallDelta | None = None


@dataclass
class TalkerOutput:
    """The talker's output for a span of the reply.

    Cascade talkers (Piper) produce the waveform directly in ``audio`` (int16 mono at
    ``ModelInfo.output_rate``); omni talkers produce codec ``codes`` that :meth:`ModelSession.decode`
    turns into audio in the codec stage.
    """

    audio: np.ndarray | None = None
    codes: object | None = None
    #: the reply text this output speaks (for transcript deltas and playback truth)
    text: str = ""
    #: last output of the reply (lets the codec flush its left context)
    final: bool = False


class VADStream(abc.ABC):
    """Speech probability per fixed frame of 16 kHz audio, with recurrent state per stream."""

    frame_samples: int = 512  # 32 ms at 16 kHz

    @abc.abstractmethod
    def probabilities(self, pcm16k: np.ndarray) -> list[float]:
        """Consume whole frames of int16 audio (len is a multiple of ``frame_samples``)."""

    @abc.abstractmethod
    def reset(self) -> None: ...


class ModelSession(abc.ABC):
    """Per-session model state. All methods run in worker threads."""

    #: the talker takes every thinker output as soon as it exists (omni talkers consume one
    #: token per codec frame): :meth:`talk_boundary` cuts after all that is pending, decided
    #: where the pipeline runs, without asking a worker that holds the session
    talks_every_output: bool = False
    #: :meth:`listen` is cheap enough to run on the event loop (a copy, no inference): the session
    #: calls it there instead of handing every 20 ms of audio to a worker thread and back
    listens_inline: bool = False
    #: the talker takes a reply in one :meth:`talk_live` call, fed with :meth:`talk_more` as the
    #: thinker's outputs come (instead of a :meth:`talk` call per output)
    talks_live: bool = False

    def new_vad(self) -> VADStream | None:
        """A VAD stream for server-side turn detection, or None when the model has none."""
        return None

    def transcribe(self, pcm16k: np.ndarray) -> str:
        """Transcript of one committed user turn (16 kHz int16)."""
        raise NotImplementedError

    @abc.abstractmethod
    def think(self, request: ThinkRequest) -> Iterator[ThinkerOutput]:
        """Stream the reply. Context kept from earlier turns may be reused (resumable segment)."""

    def prefill(self, request: ThinkRequest) -> int:
        """The conversation so far, before a reply is asked for (a committed user turn, or the
        turn as it stands at a pause that may end it). Engines that keep a context may evaluate
        it now, so that a reply asked for with the same messages starts from it; returns the
        tokens evaluated (0: nothing done, the default)."""
        return 0

    def talk_boundary(self, pending: list[ThinkerOutput], final: bool) -> int:
        """How many of the ``pending`` thinker outputs form the next talker segment now.

        The default cuts after the first clause (so the first audio leaves early) and then
        after each sentence; with :attr:`talks_every_output`, after everything pending.
        """
        if self.talks_every_output:
            return len(pending)
        text = ""
        for index, out in enumerate(pending):
            text += out.text
            stripped = text.rstrip()
            if stripped and stripped[-1] in ".!?;:" and len(stripped) >= 2:
                return index + 1
            if stripped and stripped[-1] == "," and len(stripped.split()) >= 4:
                return index + 1
        return len(pending) if final else 0

    @abc.abstractmethod
    def talk(
        self, segment: list[ThinkerOutput], voice: str, cancelled: threading.Event, final: bool, speed: float = 1.0
    ) -> Iterator[TalkerOutput]:
        """Turn one segment of thinker output into audio (or codes), first chunk early, at
        ``speed`` times the voice's own rate where the talker can change it."""

    def talk_more(self, segment: list[ThinkerOutput], voice: str, final: bool, first: bool = False) -> None:
        """With :attr:`talks_live`: hand the running reply's talker more thinker outputs
        (``first``: the first of a new reply; ``final``: the reply's text has ended)."""
        raise NotImplementedError

    def talk_live(self, cancelled: threading.Event) -> Iterator[TalkerOutput]:
        """With :attr:`talks_live`: the reply's talker outputs, from what :meth:`talk_more`
        hands it, until the reply's last chunk."""
        raise NotImplementedError

    def decode(self, out: TalkerOutput) -> np.ndarray:
        """Codec stage: a talker output → int16 audio at ``ModelInfo.output_rate``."""
        if out.audio is None:
            raise NotImplementedError("this engine's talker emits codes but has no codec")
        return out.audio

    def listen(self, audio: Pcm) -> Pcm | None:
        """Duplex models (``ModelInfo.duplex``): input audio as it arrives, at the rate its
        transport has it; returns audio to play now (at any rate: the session resamples), or None."""
        raise NotImplementedError("this model does not listen while it speaks")

    def confirm(self, spoken_text: str) -> None:
        """After an interruption: only ``spoken_text`` of the last reply was heard.

        Engines with a kept context cut it back so unheard tokens never reach the next turn.
        """

    def close(self) -> None:
        """Free per-session state (KV cache, recurrent state)."""


class VoiceModel(abc.ABC):
    """A loaded backend shared by all sessions."""

    info: ModelInfo

    @abc.abstractmethod
    def load(self, progress: Callable[[str], None] = lambda _msg: None) -> None:
        """Load weights (blocking; called once, off the event loop)."""

    @abc.abstractmethod
    def open_session(self) -> ModelSession: ...

    def stats(self) -> dict[str, dict[str, float]]:
        """Engine counters for ``/metrics``: ``{"slots": {...}, "<stage>": {"steps", "rows",
        "busy_s"}}``; empty for engines without shared stages. Called off the event loop."""
        return {}

    def close(self) -> None:
        """Release weights."""
