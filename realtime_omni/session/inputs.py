"""What a session's mailbox carries: one small frozen class per kind of input.

Transports put client frames and audio in (:class:`ClientEvent`, :class:`AudioIn`, ...); the
session's own tasks put engine results in (:class:`Transcript` and the :data:`EngineOutput`
classes). :class:`~.runner.SessionRunner` takes them out one at a time, in order, and
dispatches on the class with ``match``.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ..audio import Pcm
from ..engines.base import ToolCallDelta
from ..mcp.client import ListedTool
from .core import RealtimeSession
from .turn_detection import TurnCheck

# eq=False: the fields hold arrays and futures; an input is a message, never compared.


@dataclass(frozen=True, slots=True, eq=False)
class ClientEvent:
    """One client frame, raw JSON, in wire order (parsed on the session's task)."""

    raw: str | bytes


@dataclass(frozen=True, slots=True, eq=False)
class RateLimited:
    """A client frame the token bucket refused: the client gets an error, the frame is dropped."""


@dataclass(frozen=True, slots=True, eq=False)
class AudioIn:
    """Input audio from a media track, decoded by its transport (Twilio's μ-law, WebRTC's Opus)."""

    audio: Pcm


@dataclass(frozen=True, slots=True, eq=False)
class Image:
    """A camera frame (RGB uint8, HxWx3); the newest joins the next user turn."""

    rgb: np.ndarray


@dataclass(frozen=True, slots=True, eq=False)
class Sync:
    """A marker: resolved once everything queued before it has been processed (resume)."""

    done: asyncio.Future[None]


@dataclass(frozen=True, slots=True, eq=False)
class Alarm:
    """The session's deadline timer rang: the runner looks at its limits again."""


@dataclass(frozen=True, slots=True, eq=False)
class Close:
    reason: str


@dataclass(frozen=True, slots=True, eq=False)
class PlaybackCut:
    """A server-side player (WebRTC track, telephony) dropped what it held of a response."""

    response_id: str


@dataclass(frozen=True, slots=True, eq=False)
class TurnEndVerdict:
    """The end-of-turn model's answer to a :class:`~.actions.CheckTurnEnd`."""

    check: TurnCheck
    complete: bool
    probability: float


@dataclass(frozen=True, slots=True, eq=False)
class Transcript:
    """The transcript of a committed item, or why there is none."""

    item_id: str
    text: str | None
    error: str | None = None


@dataclass(frozen=True, slots=True, eq=False)
class McpToolsListed:
    """What an MCP server listed for an ``mcp_list_tools`` item, or the error."""

    item_id: str
    tools: tuple[ListedTool, ...]
    error: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True, eq=False)
class McpCallDone:
    """An ``mcp_call`` item's result (its text, or the error)."""

    response_id: str
    epoch: int
    item_id: str
    output: str
    error: dict[str, Any] | None = None


# Engine outputs of one response. A prepared (speculative) reply holds them with an empty id and
# epoch 0 until it is adopted; :func:`for_response` then stamps the real response on them.


@dataclass(frozen=True, slots=True, eq=False)
class ResponseText:
    response_id: str
    epoch: int
    text: str


@dataclass(frozen=True, slots=True, eq=False)
class ResponseAudio:
    response_id: str
    epoch: int
    #: at the rate of the response's output format (encoded by the transport that sends it)
    audio: Pcm
    #: the reply text this audio begins to speak, if any
    text: str = ""


@dataclass(frozen=True, slots=True, eq=False)
class ResponseCall:
    response_id: str
    epoch: int
    piece: ToolCallDelta


@dataclass(frozen=True, slots=True, eq=False)
class ResponseUsage:
    response_id: str
    epoch: int
    input_tokens: int
    output_tokens: int
    cached_tokens: int


@dataclass(frozen=True, slots=True, eq=False)
class ResponseEnd:
    response_id: str
    epoch: int
    status: str
    error: str | None = None
    reason: str | None = None


EngineOutput = ResponseText | ResponseAudio | ResponseCall | ResponseUsage | ResponseEnd
SessionInput = (ClientEvent | RateLimited | AudioIn | Image | Sync | Alarm | Close | PlaybackCut | TurnEndVerdict | Transcript
                | McpToolsListed | McpCallDone | EngineOutput)


def for_response(output: EngineOutput, response_id: str, epoch: int) -> EngineOutput:
    """``output`` as an output of that response (a prepared reply's outputs at adoption)."""
    return replace(output, response_id=response_id, epoch=epoch)


def deliver(core: RealtimeSession, output: EngineOutput) -> None:
    """Hand one engine output to the session core (which drops it if its epoch is stale)."""
    match output:
        case ResponseText(rid, epoch, text):
            core.on_response_text(rid, epoch, text)
        case ResponseAudio(rid, epoch, audio, text):
            core.on_response_audio(rid, epoch, audio, text)
        case ResponseCall(rid, epoch, piece):
            core.on_response_call(rid, epoch, piece)
        case ResponseUsage(rid, epoch, input_tokens, output_tokens, cached_tokens):
            core.on_response_usage(rid, epoch, input_tokens, output_tokens, cached_tokens)
        case ResponseEnd(rid, epoch, status, error, reason):
            core.on_response_end(rid, epoch, status, error, reason)


def payload_bytes(message: SessionInput) -> int:
    """What an input from the client side holds (frames, audio, camera frames), counted against
    the runner's ``queue_bytes``; inputs from the session's own tasks count 0."""
    match message:
        case ClientEvent(raw):
            return len(raw)
        case AudioIn(audio):
            return audio.nbytes
        case Image(rgb):
            return int(getattr(rgb, "nbytes", 0))
    return 0
