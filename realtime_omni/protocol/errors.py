"""Errors that become ``error`` events; the session always goes on after one."""

from __future__ import annotations

from enum import StrEnum
from typing import Any


class ProtocolError(Exception):
    """A client mistake, reported to that client as an ``error`` event with an :class:`ErrorCode`."""

    def __init__(
        self,
        code: ErrorCode,
        message: str,
        *,
        param: str | None = None,
        event_id: str | None = None,
        type: str = "invalid_request_error",
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.param = param
        self.event_id = event_id
        self.type = type

    def to_error(self) -> dict[str, Any]:
        return {
            "type": self.type,
            "code": self.code,
            "message": self.message,
            "param": self.param,
            "event_id": self.event_id,
        }


class ErrorCode(StrEnum):
    """Every error code the server sends: in ``error`` events and in HTTP error bodies.

    Members are strings (``ErrorCode.INVALID_JSON == "invalid_json"``), so they go into JSON
    and compare with the codes clients see unchanged. A test checks that each code written as a
    literal anywhere in the package is listed here.
    """

    # client events (error events on the session)
    INVALID_JSON = "invalid_json"
    UNKNOWN_EVENT = "unknown_event_type"
    INVALID_EVENT = "invalid_event"
    EVENT_TOO_LARGE = "event_too_large"
    INVALID_BASE64 = "invalid_base64"
    INVALID_AUDIO = "invalid_audio"
    UNSUPPORTED_AUDIO_FORMAT = "unsupported_audio_format"
    ACTIVE_RESPONSE = "conversation_already_has_active_response"
    NO_ACTIVE_RESPONSE = "response_cancel_not_active"
    ITEM_NOT_FOUND = "item_not_found"
    INVALID_TRUNCATE = "invalid_truncate"
    BUFFER_TOO_SMALL = "input_audio_buffer_commit_empty"
    UNSUPPORTED = "unsupported_feature"
    INVALID_VALUE = "invalid_value"
    SERVER_ERROR = "server_error"
    #: the session's conversation (items, instructions) would pass its byte budget
    SESSION_MEMORY_EXCEEDED = "session_memory_exceeded"
    RATE_LIMIT_EXCEEDED = "rate_limit_exceeded"
    # MCP tools: a server_url outside the operator's list; a server whose tools could not be listed
    MCP_SERVER_NOT_ALLOWED = "mcp_server_not_allowed"
    MCP_LIST_TOOLS_FAILED = "mcp_list_tools_failed"
    # the session's own limits
    SESSION_IDLE_TIMEOUT = "session_idle_timeout"
    SESSION_EXPIRED = "session_expired"
    # opening a session (WebSocket and WebRTC)
    SESSION_LIMIT_REACHED = "session_limit_reached"
    MODEL_NOT_FOUND = "model_not_found"
    RESUME_TOKEN_INVALID = "resume_token_invalid"
    # authentication
    INVALID_API_KEY = "invalid_api_key"
    INVALID_CLIENT_SECRET = "invalid_client_secret"
    ORIGIN_NOT_ALLOWED = "origin_not_allowed"
    # HTTP bodies (client secrets, WebRTC calls)
    REQUEST_TOO_LARGE = "request_too_large"
    OFFER_TOO_LARGE = "offer_too_large"
    INVALID_MULTIPART = "invalid_multipart"
    UNSUPPORTED_MEDIA_TYPE = "unsupported_media_type"
    MISSING_SDP = "missing_sdp"
    INVALID_SESSION = "invalid_session"
    INVALID_SDP = "invalid_sdp"
    MISSING_AUDIO = "missing_audio"
    MISSING_DATA_CHANNEL = "missing_data_channel"
    UNSUPPORTED_DATA_CHANNEL = "unsupported_data_channel"
    INVALID_OFFER = "invalid_offer"
    ANSWER_TIMEOUT = "answer_timeout"
    CALL_NOT_FOUND = "call_not_found"
    # HTTP requests the framework refuses before an endpoint runs
    INVALID_REQUEST = "invalid_request"
    NOT_FOUND = "not_found"
    METHOD_NOT_ALLOWED = "method_not_allowed"
    # telephony webhooks (authenticated by the carrier's signature, not an API key)
    INVALID_SIGNATURE = "invalid_signature"
    TELEPHONY_NOT_CONFIGURED = "telephony_not_configured"


# The names modules used before the enum (``errors.INVALID_JSON``): the same members.
INVALID_JSON = ErrorCode.INVALID_JSON
UNKNOWN_EVENT = ErrorCode.UNKNOWN_EVENT
INVALID_EVENT = ErrorCode.INVALID_EVENT
EVENT_TOO_LARGE = ErrorCode.EVENT_TOO_LARGE
INVALID_BASE64 = ErrorCode.INVALID_BASE64
INVALID_AUDIO = ErrorCode.INVALID_AUDIO
UNSUPPORTED_AUDIO_FORMAT = ErrorCode.UNSUPPORTED_AUDIO_FORMAT
ACTIVE_RESPONSE = ErrorCode.ACTIVE_RESPONSE
NO_ACTIVE_RESPONSE = ErrorCode.NO_ACTIVE_RESPONSE
ITEM_NOT_FOUND = ErrorCode.ITEM_NOT_FOUND
INVALID_TRUNCATE = ErrorCode.INVALID_TRUNCATE
BUFFER_TOO_SMALL = ErrorCode.BUFFER_TOO_SMALL
UNSUPPORTED = ErrorCode.UNSUPPORTED
INVALID_VALUE = ErrorCode.INVALID_VALUE
SERVER_ERROR = ErrorCode.SERVER_ERROR
SESSION_MEMORY_EXCEEDED = ErrorCode.SESSION_MEMORY_EXCEEDED
