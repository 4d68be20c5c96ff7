"""Session settings: the GA session object, validated and applied field by field."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError

from ..audio import AudioFormat, denoise, parse_audio_format
from ..engines.base import ToolSpec
from ..protocol.errors import ErrorCode, ProtocolError
from ..mcp.servers import McpServer
from .tools import ToolChoice, parse_tool_choice, parse_tools

# semantic_vad without an end-of-turn model: its eagerness maps onto a silence window.
_EAGERNESS_SILENCE_MS = {"low": 900, "medium": 500, "auto": 500, "high": 250}
#: semantic_vad with the model: the model is asked after this much silence...
SEMANTIC_CHECK_MS = 200
#: ...and a turn it judged unfinished ends anyway after this much (by eagerness)
SEMANTIC_MAX_WAIT_MS = {"low": 4000, "medium": 2000, "auto": 2000, "high": 1000}


class TurnDetection(BaseModel):
    type: Literal["server_vad", "semantic_vad"] = "server_vad"
    threshold: float = Field(0.5, ge=0.0, le=1.0)
    prefix_padding_ms: int = Field(300, ge=0, le=5000)
    silence_duration_ms: int = Field(500, ge=0, le=10000)
    create_response: bool = True
    interrupt_response: bool = True
    idle_timeout_ms: int | None = Field(None, ge=5000, le=30000)
    eagerness: Literal["low", "medium", "high", "auto"] | None = None

    def to_dict(self) -> dict[str, Any]:
        out = self.model_dump(exclude_none=True)
        if self.type == "semantic_vad":
            out = {k: out[k] for k in ("type", "eagerness", "create_response", "interrupt_response") if k in out}
        else:
            out.pop("eagerness", None)
            out.setdefault("idle_timeout_ms", None)
        return out


#: what a client may list in ``include``: none of it is available from the served models
_INCLUDABLE = {"item.input_audio_transcription.logprobs": "log probabilities of transcripts"}


class SessionConfig(BaseModel):
    """The effective configuration of one session (what ``session.updated`` reports)."""

    model: str
    #: "transcription": the input is detected, committed and transcribed; no responses
    type: Literal["realtime", "transcription"] = "realtime"
    instructions: str = ""
    voice: str = "alloy"
    output_modalities: list[Literal["text", "audio"]] = ["audio"]
    input_format: AudioFormat = AudioFormat.PCM
    output_format: AudioFormat = AudioFormat.PCM
    turn_detection: TurnDetection | None = TurnDetection()
    transcription: dict[str, Any] | None = None
    noise_reduction: denoise.NoiseReduction | None = None
    max_output_tokens: int | Literal["inf"] = "inf"
    speed: float = 1.0
    tools: list[ToolSpec] = []
    #: MCP servers among the tools (their listed tools join ``tools`` for the model)
    mcp: list[McpServer] = []
    tool_choice: ToolChoice = ToolChoice()
    parallel_tool_calls: bool = True
    #: the MCP server URLs the operator allows (``tools.mcp_allowed_urls``); not a client setting
    mcp_urls: tuple[str, ...] = Field(default=(), exclude=True)

    def voice_for(self, value: str | dict[str, Any], audio_started: bool, param: str) -> str:
        """The voice a session or response update names (a name, or ``{"id": ...}``); it may
        differ from the session's only until the session has produced audio (as in the reference)."""
        voice = voice_name(value)
        if not voice or len(voice) > MAX_VOICE_CHARS:
            raise ProtocolError(ErrorCode.INVALID_VALUE, f"a voice is a name of 1 to {MAX_VOICE_CHARS} characters",
                                param=param)
        if voice != self.voice and audio_started:
            raise ProtocolError(ErrorCode.INVALID_VALUE, "voice cannot change once the session has produced audio",
                                param=param)
        return voice

    @property
    def wants_audio(self) -> bool:
        return "audio" in self.output_modalities

    @property
    def responds(self) -> bool:
        """Whether turns get answers (a transcription session only transcribes them)."""
        return self.type == "realtime"

    def become(self, kind: Literal["realtime", "transcription"]) -> None:
        self.type = kind
        if kind == "transcription" and self.transcription is None:
            # transcripts are what this session is for; the served model makes them
            self.transcription = {"model": self.model}

    def apply(self, update: dict[str, Any], *, audio_started: bool) -> None:
        """Apply a (validated, GA-shaped) ``session.update`` payload; only present keys change."""
        for wanted in update.get("include") or ():
            raise ProtocolError(ErrorCode.UNSUPPORTED, f"{_INCLUDABLE.get(wanted, wanted)} are not available from this "
                                "server's models", param="session.include")
        if update.get("type") in ("realtime", "transcription"):
            self.become(update["type"])
        if "instructions" in update and update["instructions"] is not None:
            self.instructions = update["instructions"]
        if update.get("output_modalities") is not None:
            # GA allows one of the two; ["text", "audio"] (beta) means audio with its transcript
            self.output_modalities = ["audio"] if "audio" in update["output_modalities"] else ["text"]
        if "max_output_tokens" in update and update["max_output_tokens"] is not None:
            self.max_output_tokens = update["max_output_tokens"]
        if update.get("tools") is not None or update.get("tool_choice") is not None:
            self.tools, self.mcp, self.tool_choice = tools_of(update, self.tools, self.mcp, self.tool_choice, "session",
                                                              self.mcp_urls)
        if update.get("parallel_tool_calls") is not None:
            self.parallel_tool_calls = bool(update["parallel_tool_calls"])
        audio = update.get("audio") or {}
        audio_in = audio.get("input") or {}
        audio_out = audio.get("output") or {}
        if audio_in.get("format") is not None:
            self.input_format = parse_format(audio_in["format"], "session.audio.input.format")
        if audio_out.get("format") is not None:
            self.output_format = parse_format(audio_out["format"], "session.audio.output.format")
        if "turn_detection" in audio_in:
            self.turn_detection = _turn_detection(audio_in["turn_detection"])
        if "transcription" in audio_in:
            self.transcription = audio_in["transcription"]
        if "noise_reduction" in audio_in:
            self.noise_reduction = _noise_reduction(audio_in["noise_reduction"])
        if audio_out.get("voice") is not None:
            self.voice = self.voice_for(audio_out["voice"], audio_started, "session.audio.output.voice")
        if audio_out.get("speed") is not None:
            self.speed = float(audio_out["speed"])

    def to_dict(self, session_id: str, expires_at: int) -> dict[str, Any]:
        """The GA ``session`` object (a transcription session's when that is the type)."""
        audio_in = {
            "format": _format_dict(self.input_format),
            "transcription": self.transcription,
            "noise_reduction": {"type": self.noise_reduction} if self.noise_reduction else None,
            "turn_detection": self.turn_detection.to_dict() if self.turn_detection else None,
        }
        if self.type == "transcription":
            return {"type": "transcription", "object": "realtime.transcription_session", "id": session_id,
                    "expires_at": expires_at, "include": None, "audio": {"input": audio_in}}
        return {
            "type": "realtime",
            "object": "realtime.session",
            "id": session_id,
            "model": self.model,
            "output_modalities": list(self.output_modalities),
            "instructions": self.instructions,
            "tools": [tool_dict(tool) for tool in self.tools] + [server.to_dict() for server in self.mcp],
            "tool_choice": self.tool_choice.to_dict(),
            "parallel_tool_calls": self.parallel_tool_calls,
            "max_output_tokens": self.max_output_tokens,
            "tracing": None,
            "prompt": None,
            "expires_at": expires_at,
            "audio": {
                "input": audio_in,
                "output": {"format": _format_dict(self.output_format), "voice": self.voice, "speed": self.speed},
            },
        }


#: the longest voice name (or custom voice id) a session or response may give
MAX_VOICE_CHARS = 64


def voice_name(value: str | dict[str, Any]) -> str:
    """A voice as the protocol names it: a name, or a custom voice's ``{"id": ...}``."""
    return value.get("id", "") if isinstance(value, dict) else str(value)


def tools_of(params: dict[str, Any], tools: list[ToolSpec], servers: list[McpServer], choice: ToolChoice,
             where: Literal["session", "response"], mcp_urls: tuple[str, ...] = ()
             ) -> tuple[list[ToolSpec], list[McpServer], ToolChoice]:
    """The tools, MCP servers and tool choice after ``params`` (a session update or a response's
    own), given the ones in force; a named choice must stay among the tools.

    A session may hold ``required`` while it has no tools: pipecat sends its configured choice as
    soon as it connects and its tools only once its conversation starts. A response.create held
    to ``required`` without a tool is refused; a turn detection response then has nothing to call
    and answers in words. MCP servers are declared on the session (their tools are listed once,
    when declared): a response's own ``tools`` may not add one."""
    if params.get("tools") is not None:
        tools, new_servers = parse_tools(params["tools"], f"{where}.tools", mcp_urls)
        if where == "response" and new_servers:
            raise ProtocolError(ErrorCode.UNSUPPORTED, "MCP servers are declared in session.update (their tools are "
                                "listed once there), not per response", param="response.tools")
        servers = new_servers if where == "session" else servers
    if params.get("tool_choice") is not None:
        choice = parse_tool_choice(params["tool_choice"], tools, f"{where}.tool_choice", servers)
    elif choice.server_label is not None and choice.server_label not in {s.label for s in servers}:
        raise ProtocolError(ErrorCode.INVALID_VALUE, f"tool_choice names MCP server {choice.server_label!r}, which the "
                            "new tools lack", param=f"{where}.tool_choice")
    elif choice.server_label is None and choice.name is not None and choice.name not in {tool.name for tool in tools}:
        raise ProtocolError(ErrorCode.INVALID_VALUE, f"tool_choice names {choice.name!r}, which the new tools lack",
                            param=f"{where}.tool_choice")
    if where == "response" and choice.mode == "required" and not tools and not servers:
        raise ProtocolError(ErrorCode.INVALID_VALUE, "tool_choice 'required' needs at least one tool",
                            param=f"{where}.tool_choice")
    return tools, servers, choice


def tool_dict(tool: ToolSpec) -> dict[str, Any]:
    return {"type": "function", "name": tool.name, "description": tool.description, "parameters": tool.parameters}


def parse_format(value: Any, param: str) -> AudioFormat:
    try:
        return parse_audio_format(value)
    except ValueError as exc:
        raise ProtocolError(ErrorCode.UNSUPPORTED_AUDIO_FORMAT, str(exc), param=param) from None


def _format_dict(fmt: AudioFormat) -> dict[str, Any]:
    return {"type": fmt.value, "rate": fmt.rate} if fmt is AudioFormat.PCM else {"type": fmt.value}


def _noise_reduction(value: dict[str, Any] | None) -> denoise.NoiseReduction | None:
    """The denoiser type asked for; refused up front when this server cannot run it, so the
    client hears why instead of getting noisy audio under a setting that claims otherwise."""
    if value is None:
        return None
    param = "session.audio.input.noise_reduction.type"
    kind = value.get("type")
    if kind not in denoise.KINDS:
        raise ProtocolError(ErrorCode.INVALID_VALUE, f"noise_reduction.type must be one of {list(denoise.KINDS)}, "
                            f"got {kind!r}", param=param)
    if not denoise.available():
        raise ProtocolError(ErrorCode.UNSUPPORTED, f"noise reduction needs the {denoise.PACKAGE!r} package, which "
                            "this server lacks (pip install 'realtime-omni[denoise]')", param=param)
    return kind


def _turn_detection(value: dict[str, Any] | None) -> TurnDetection | None:
    if value is None:
        return None
    fields = {k: v for k, v in value.items() if v is not None}
    if fields.get("type") == "semantic_vad":
        fields["silence_duration_ms"] = _EAGERNESS_SILENCE_MS[fields.get("eagerness") or "auto"]
    try:
        return TurnDetection(**fields)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        field = ".".join(str(p) for p in first["loc"])
        raise ProtocolError(ErrorCode.INVALID_VALUE, f"turn_detection.{field}: {first['msg']}",
                            param=f"session.audio.input.turn_detection.{field}") from None
