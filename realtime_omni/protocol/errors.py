"""Errors that become ``error`` events; the session always goes on after one."""

from __future__ import annotations

from typing import Any


class ProtocolError(Exception):
    """A client mistake, reported to that client as an ``error`` event with a code."""

    def __init__(
        self,
        code: str,
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


# Codes used across the server (one place, so clients and tests agree on spelling).
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
#: the session's conversation (items, instructions) would pass its byte budget
SESSION_MEMORY_EXCEEDED = "session_memory_exceeded"
SERVER_ERROR = "server_error"
