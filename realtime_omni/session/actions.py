"""What the sans-I/O session core asks its driver to do (the core never runs a model itself)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..audio import AudioFormat, Pcm
from ..engines.base import ThinkRequest
from ..mcp.servers import McpServer
from .turn_detection import TurnCheck


@dataclass
class DetectSpeech:
    """Run the VAD over these 16 kHz samples (whole frames) and report probabilities."""

    pcm16k: np.ndarray
    start_ms: float


@dataclass
class Transcribe:
    item_id: str
    pcm16k: np.ndarray
    #: the speculation that already heard this audio, if any (its transcript is reused)
    spec_id: int | None = None


@dataclass
class StartResponse:
    response_id: str
    epoch: int
    request: ThinkRequest
    output_format: AudioFormat
    #: the speculation prepared for this turn, if any (adopted when its request matches)
    spec_id: int | None = None


@dataclass
class Speculate:
    """A pause in the user's speech: prepare the reply now (ASR, thinker, talker) so it can leave
    the moment the turn is confirmed. Nothing of it reaches the client unless it is adopted."""

    spec_id: int
    pcm16k: np.ndarray


@dataclass
class Prefill:
    """A model that hears audio and keeps its context (omni): the conversation as the next
    reply would read it, to evaluate now (``ModelSession.prefill``), before the reply is asked
    for. Only a matter of speed: a reply asked for with other messages evaluates them itself."""

    request: ThinkRequest


@dataclass
class CheckTurnEnd:
    """``semantic_vad``: ask the end-of-turn model whether the user's pause ends their turn."""

    check: TurnCheck
    pcm16k: np.ndarray


@dataclass
class DropSpeculation:
    spec_id: int


@dataclass
class CancelResponse:
    response_id: str
    epoch: int


@dataclass
class ConfirmHeard:
    """Only ``text`` of the last reply reached the listener; cut the model context to it."""

    text: str


@dataclass
class Listen:
    """A duplex model hears this input now (``ModelSession.listen``); what it says back goes to
    :meth:`~.core.RealtimeSession.on_model_audio` before the next input."""

    audio: Pcm


@dataclass
class ListMcpTools:
    """List an MCP server's tools for the ``mcp_list_tools`` item ``item_id``."""

    item_id: str
    server: McpServer
    timeout_s: float


@dataclass
class CallMcpTool:
    """Run one ``mcp_call`` item of a response on its MCP server."""

    response_id: str
    epoch: int
    item_id: str
    server: McpServer
    tool: str
    arguments: str
    timeout_s: float


@dataclass
class CloseSession:
    reason: str


Action = (DetectSpeech | Transcribe | Speculate | Prefill | CheckTurnEnd | DropSpeculation | StartResponse | CancelResponse | ConfirmHeard
          | Listen | ListMcpTools | CallMcpTool | CloseSession)
