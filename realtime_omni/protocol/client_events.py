"""Client events: JSON text → a validated ``openai.types.realtime`` model.

Validation uses the official SDK's typed models, so anything the SDK can send is accepted and
anything it could not is rejected with a precise ``param``. Beta-era shapes (``modalities``,
``input_audio_format``, ``turn_detection`` at the session top level, assistant ``text`` parts)
are rewritten to GA shapes first, so beta clients keep working.
"""

from __future__ import annotations

import json
from typing import Any

import pydantic
from openai.types.realtime import RealtimeClientEvent

from . import errors
from .errors import ProtocolError

MAX_EVENT_BYTES = 15 * 1024 * 1024

_ADAPTER: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(RealtimeClientEvent)
KNOWN_TYPES = frozenset(
    {
        "session.update",
        "input_audio_buffer.append",
        "input_audio_buffer.commit",
        "input_audio_buffer.clear",
        "conversation.item.create",
        "conversation.item.retrieve",
        "conversation.item.truncate",
        "conversation.item.delete",
        "response.create",
        "response.cancel",
        "output_audio_buffer.clear",
    }
)
_BETA_FORMATS = {"pcm16": "audio/pcm", "g711_ulaw": "audio/pcmu", "g711_alaw": "audio/pcma"}


def _beta_format(value: Any) -> Any:
    if isinstance(value, str) and value in _BETA_FORMATS:
        fmt: dict[str, Any] = {"type": _BETA_FORMATS[value]}
        if value == "pcm16":
            fmt["rate"] = 24000
        return fmt
    return value


def normalize_session(session: dict[str, Any]) -> dict[str, Any]:
    """Rewrite a beta session object into the GA shape (GA objects pass through unchanged)."""
    s = dict(session)
    s.setdefault("type", "realtime")
    if "modalities" in s and "output_modalities" not in s:
        mods = [m for m in s.pop("modalities") or [] if m in ("text", "audio")]
        # beta ["text", "audio"] meant "audio with transcript", which GA spells ["audio"]
        s["output_modalities"] = ["audio"] if "audio" in mods else ["text"]
    if "max_response_output_tokens" in s and "max_output_tokens" not in s:
        s["max_output_tokens"] = s.pop("max_response_output_tokens")
    audio = dict(s.get("audio") or {})
    audio_in = dict(audio.get("input") or {})
    audio_out = dict(audio.get("output") or {})
    moved = False
    for beta_key, target, ga_key, convert in (
        ("input_audio_format", audio_in, "format", _beta_format),
        ("turn_detection", audio_in, "turn_detection", lambda v: v),
        ("input_audio_transcription", audio_in, "transcription", lambda v: v),
        ("input_audio_noise_reduction", audio_in, "noise_reduction", lambda v: v),
        ("output_audio_format", audio_out, "format", _beta_format),
        ("voice", audio_out, "voice", lambda v: v),
    ):
        if beta_key in s:
            target[ga_key] = convert(s.pop(beta_key))
            moved = True
    if moved:
        if audio_in:
            audio["input"] = audio_in
        if audio_out:
            audio["output"] = audio_out
        s["audio"] = audio
    return s


def _normalize_item(item: Any) -> Any:
    if not isinstance(item, dict):
        return item
    item = dict(item)
    item.setdefault("type", "message")
    if item.get("role") == "assistant" and isinstance(item.get("content"), list):
        parts = []
        for part in item["content"]:
            if isinstance(part, dict) and part.get("type") in ("text", "audio"):
                part = {**part, "type": "output_" + part["type"]}
            parts.append(part)
        item["content"] = parts
    return item


def _normalize(data: dict[str, Any]) -> dict[str, Any]:
    kind = data.get("type")
    if kind == "session.update" and isinstance(data.get("session"), dict):
        data = {**data, "session": normalize_session(data["session"])}
    elif kind == "conversation.item.create":
        data = {**data, "item": _normalize_item(data.get("item"))}
    elif kind == "response.create" and isinstance(data.get("response"), dict):
        response = dict(data["response"])
        if "modalities" in response and "output_modalities" not in response:
            mods = response.pop("modalities") or []
            response["output_modalities"] = ["audio"] if "audio" in mods else ["text"]
        if "max_response_output_tokens" in response:
            response["max_output_tokens"] = response.pop("max_response_output_tokens")
        data = {**data, "response": response}
    return data


def _param_of(error: dict[str, Any]) -> str:
    # The union discriminator adds the type name as the first location element; drop it.
    loc = [str(p) for p in error.get("loc", ())]
    if loc and "." in loc[0]:
        loc = loc[1:]
    return ".".join(loc)


def parse_client_event(raw: str | bytes, max_bytes: int = MAX_EVENT_BYTES) -> Any:
    """Parse and validate one client event. Raises :class:`ProtocolError` with a code."""
    if len(raw) > max_bytes:
        raise ProtocolError(
            errors.EVENT_TOO_LARGE, f"event of {len(raw)} bytes exceeds the {max_bytes}-byte limit"
        )
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ProtocolError(errors.INVALID_JSON, f"event is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ProtocolError(errors.INVALID_JSON, "event must be a JSON object")
    event_id = data.get("event_id") if isinstance(data.get("event_id"), str) else None
    kind = data.get("type")
    if not isinstance(kind, str):
        raise ProtocolError(errors.INVALID_EVENT, "event has no string 'type'", param="type", event_id=event_id)
    if kind not in KNOWN_TYPES:
        raise ProtocolError(
            errors.UNKNOWN_EVENT, f"unknown event type {kind!r}", param="type", event_id=event_id
        )
    try:
        return _ADAPTER.validate_python(_normalize(data))
    except pydantic.ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        param = _param_of(first)
        raise ProtocolError(
            errors.INVALID_EVENT,
            f"invalid {kind}: {param or 'event'}: {first.get('msg')}",
            param=param or None,
            event_id=event_id,
        ) from None
