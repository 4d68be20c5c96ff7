"""Typed bodies of the HTTP endpoints. The JSON shapes are the wire contract: the client-secret
and model-list ones follow OpenAI's, which the ``openai`` SDK parses."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ..protocol.errors import ErrorCode


class ErrorDetail(BaseModel):
    type: Literal["invalid_request_error", "server_error"]
    code: ErrorCode
    message: str
    param: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorDetail


class Health(BaseModel):
    status: Literal["ok"] = "ok"
    version: str


class Readiness(BaseModel):
    """Callers without a key (when keys are on) get ``status`` only."""

    status: Literal["ready", "degraded", "loading"]
    models: list[str] | None = None
    not_ready: list[str] | None = None
    worker_restarts: dict[str, int] | None = None
    sessions: int | None = None


class Model(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str
    capabilities: list[str]
    default: bool
    aliases: list[str]


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[Model]


class ExpiresAfter(BaseModel):
    anchor: Literal["created_at"] = "created_at"
    #: range-checked by the endpoint (10–7200), answered 400 ``invalid_value`` like OpenAI
    seconds: float | None = None


class ClientSecretRequest(BaseModel):
    #: session settings the secret is bound to; validated when a session applies them
    session: dict[str, Any] | None = None
    expires_after: ExpiresAfter | None = None


class ClientSecret(BaseModel):
    value: str = Field(description="ek_...: opens one session, once, before expires_at")
    expires_at: int
    session: dict[str, Any]


class CallInfo(BaseModel):
    id: str
    object: Literal["realtime.call"] = "realtime.call"
    session_id: str
    model: str
    connection_state: str
    data_channel: bool
    audio_in_frames: int
    #: microphone frames dropped because the session's mailbox was full
    audio_in_dropped: int = 0
    audio_out_frames: int
    #: audio in each Opus packet sent now (20 or 40 with "auto", by the server's call count)
    audio_packet_ms: int = 20
    underruns: int
    skipped_ms: float
    video_frames: int
    avatar_frames: int = 0
    inline_decoder: bool


class CallList(BaseModel):
    object: Literal["list"] = "list"
    data: list[CallInfo]
    total_opened: int


class CallEnded(BaseModel):
    id: str
    object: Literal["realtime.call"] = "realtime.call"
    status: Literal["ended"] = "ended"


class IceConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    object: Literal["realtime.ice_config"] = "realtime.ice_config"
    ice_servers: list[dict[str, Any]]


#: documented refusals, by status (every one is an :class:`ErrorResponse`)
def refusals(*statuses: int) -> dict[int | str, dict[str, Any]]:
    return {status: {"model": ErrorResponse} for status in statuses}
