"""Client events: JSON text → a validated ``openai.types.realtime`` model.

Validation uses the official SDK's typed models, so anything the SDK can send is accepted and
anything it could not is rejected with a precise ``param``. Beta-era shapes (``modalities``,
``input_audio_format``, ``turn_detection`` at the session top level, assistant ``text`` parts)
are rewritten to GA shapes first, so beta clients keep working.
"""

from __future__ import annotations

import typing
from typing import Any

import pydantic
from openai.types.realtime import RealtimeClientEvent

from . import strict_json
from .errors import ErrorCode, ProtocolError

MAX_EVENT_BYTES = 15 * 1024 * 1024

# One adapter per event type: the SDK's union carries its discriminator as SDK metadata that
# pydantic does not read, so dispatching by "type" ourselves gives precise error locations.
_ADAPTERS: dict[str, pydantic.TypeAdapter[Any]] = {
    typing.get_args(model.model_fields["type"].annotation)[0]: pydantic.TypeAdapter(model)
    for model in typing.get_args(typing.get_args(RealtimeClientEvent)[0])
}
KNOWN_TYPES = frozenset(_ADAPTERS)
#: client events of the published protocols (beta included) this server does not take, and why
UNSUPPORTED_TYPES: dict[str, str] = {}
#: beta event names the GA protocol folds into another event (with the session type it implies)
BETA_ALIASES = {"transcription_session.update": ("session.update", "transcription")}
_BETA_FORMATS = {"pcm16": "audio/pcm", "g711_ulaw": "audio/pcmu", "g711_alaw": "audio/pcma"}


def _beta_format(value: Any) -> Any:
    if isinstance(value, str) and value in _BETA_FORMATS:
        fmt: dict[str, Any] = {"type": _BETA_FORMATS[value]}
        if value == "pcm16":
            fmt["rate"] = 24000
        return fmt
    return value


def _as_dict(value: Any) -> dict[str, Any]:
    return dict(value) if isinstance(value, dict) else {}


def _output_modalities(value: Any, param: str) -> list[str]:
    """Beta ``modalities`` as GA ``output_modalities``: beta ["text", "audio"] meant "audio with
    transcript", which GA spells ["audio"]."""
    if value is None:
        value = []
    if not isinstance(value, list) or not all(isinstance(m, str) for m in value):
        raise ProtocolError(ErrorCode.INVALID_VALUE, f"{param} must be a list of strings", param=param)
    return ["audio"] if "audio" in value else ["text"]


def normalize_session(session: dict[str, Any]) -> dict[str, Any]:
    """Rewrite a beta session object into the GA shape (GA objects pass through unchanged)."""
    s = dict(session)
    s.setdefault("type", "realtime")
    if "modalities" in s and "output_modalities" not in s:
        s["output_modalities"] = _output_modalities(s.pop("modalities"), "session.modalities")
    if "max_response_output_tokens" in s and "max_output_tokens" not in s:
        s["max_output_tokens"] = s.pop("max_response_output_tokens")
    audio = _as_dict(s.get("audio"))
    audio_in = _as_dict(audio.get("input"))
    audio_out = _as_dict(audio.get("output"))
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
    if moved and (s.get("audio") is None or isinstance(s.get("audio"), dict)):
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


def _check_formats(session: dict[str, Any], event_id: str | None) -> None:
    """Name an unsupported audio format plainly instead of as a schema mismatch."""
    from ..audio import parse_audio_format

    audio = session.get("audio")
    for direction in ("input", "output"):
        block = audio.get(direction) if isinstance(audio, dict) else None
        fmt = block.get("format") if isinstance(block, dict) else None
        if fmt is None:
            continue
        try:
            parse_audio_format(fmt)
        except ValueError as exc:
            raise ProtocolError(
                ErrorCode.UNSUPPORTED_AUDIO_FORMAT, str(exc), param=f"session.audio.{direction}.format", event_id=event_id
            ) from None


#: numeric fields the published API bounds (its SDK types do not): (event type, path) → (low, high)
_RANGES: dict[tuple[str, tuple[str, ...]], tuple[float, float]] = {
    ("session.update", ("session", "max_output_tokens")): (1, 4096),
    ("session.update", ("session", "audio", "output", "speed")): (0.25, 1.5),
    ("response.create", ("response", "max_output_tokens")): (1, 4096),
    ("conversation.item.truncate", ("audio_end_ms",)): (0, 24 * 3600 * 1000),
    ("conversation.item.truncate", ("content_index",)): (0, 1024),
}


def _check_ranges(data: dict[str, Any], event_id: str | None) -> None:
    """Out-of-range numbers get ``invalid_value`` naming the field (``"inf"`` stays allowed)."""
    kind = data.get("type")
    for (event, path), (low, high) in _RANGES.items():
        if event != kind:
            continue
        value: Any = data
        for key in path:
            value = value.get(key) if isinstance(value, dict) else None
        if isinstance(value, bool) or not isinstance(value, int | float):
            continue  # absent, "inf", or a type error the schema names
        if not low <= value <= high:
            raise ProtocolError(ErrorCode.INVALID_VALUE, f"{'.'.join(path)} must be between {low} and {high}, got {value}",
                                param=".".join(path), event_id=event_id)


def _normalize(data: dict[str, Any]) -> dict[str, Any]:
    kind = data.get("type")
    if kind == "session.update" and isinstance(data.get("session"), dict):
        data = {**data, "session": normalize_session(data["session"])}
        _check_formats(data["session"], data.get("event_id") if isinstance(data.get("event_id"), str) else None)
    elif kind == "conversation.item.create":
        data = {**data, "item": _normalize_item(data.get("item"))}
    elif kind == "response.create" and isinstance(data.get("response"), dict):
        response = dict(data["response"])
        if "modalities" in response and "output_modalities" not in response:
            response["output_modalities"] = _output_modalities(response.pop("modalities"), "response.modalities")
        if "max_response_output_tokens" in response:
            response["max_output_tokens"] = response.pop("max_response_output_tokens")
        data = {**data, "response": response}
    return data


def _take_item_references(data: dict[str, Any], event_id: str | None) -> list[tuple[int, str]]:
    """Pull ``{"type": "item_reference", "id": ...}`` entries out of ``response.input`` (the SDK's
    item union has no such member) and return them as (position, item id)."""
    response = data.get("response")
    items = response.get("input") if isinstance(response, dict) else None
    if not isinstance(items, list):
        return []
    refs: list[tuple[int, str]] = []
    kept = []
    for index, item in enumerate(items):
        if isinstance(item, dict) and item.get("type") == "item_reference":
            if not isinstance(item.get("id"), str) or set(item) - {"type", "id"}:
                raise ProtocolError(ErrorCode.INVALID_EVENT, "an item_reference has exactly a string 'id'",
                                    param=f"response.input.{index}", event_id=event_id)
            refs.append((index, item["id"]))
        else:
            kept.append(item)
    if refs:
        response["input"] = kept
    return refs


#: the SDK model each conversation item shape validates against (named in pydantic's error paths)
_ITEM_MODELS = {
    ("function_call", None): "RealtimeConversationItemFunctionCall",
    ("function_call_output", None): "RealtimeConversationItemFunctionCallOutput",
    ("message", "system"): "RealtimeConversationItemSystemMessage",
    ("message", "user"): "RealtimeConversationItemUserMessage",
    ("message", "assistant"): "RealtimeConversationItemAssistantMessage",
}


def _is_member(part: Any) -> bool:
    """A union member's class name in an error path (fields are lower case)."""
    return isinstance(part, str) and (part[:1].isupper() or "[" in part)


def _matches_own_shape(error: dict[str, Any], data: Any) -> bool:
    """Whether an error of a union comes from the member the value's own type/role selects."""
    node = data
    for part in error.get("loc", ()):
        if _is_member(part):
            if not isinstance(node, dict) or not isinstance(node.get("type"), str):
                return True
            role = node.get("role") if node.get("type") == "message" and isinstance(node.get("role"), str) else None
            own = _ITEM_MODELS.get((node["type"], role))
            return own is None or part == own
        try:
            node = node[part]
        except (KeyError, IndexError, TypeError):
            return False
        if not isinstance(node, dict | list):
            return False
    return True


def _best_error(errors_: list[dict[str, Any]], data: dict[str, Any]) -> dict[str, Any]:
    """Of a union's errors, the one about the member the client meant (its ``type``/``role``)."""
    return next((e for e in errors_ if _matches_own_shape(e, data)), errors_[0])


def _param_of(error: dict[str, Any]) -> str:
    return ".".join(str(p) for p in error.get("loc", ()) if not _is_member(p))


def parse_client_event(raw: str | bytes, max_bytes: int = MAX_EVENT_BYTES) -> Any:
    """Parse and validate one client event. Raises :class:`ProtocolError` with a code."""
    if len(raw) > max_bytes:
        raise ProtocolError(
            ErrorCode.EVENT_TOO_LARGE, f"event of {len(raw)} bytes exceeds the {max_bytes}-byte limit"
        )
    try:
        data = strict_json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ProtocolError(ErrorCode.INVALID_JSON, f"event is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ProtocolError(ErrorCode.INVALID_JSON, "event must be a JSON object")
    event_id = data.get("event_id") if isinstance(data.get("event_id"), str) else None
    kind = data.get("type")
    if not isinstance(kind, str):
        raise ProtocolError(ErrorCode.INVALID_EVENT, "event has no string 'type'", param="type", event_id=event_id)
    if kind in BETA_ALIASES and isinstance(data.get("session"), dict):
        kind, session_type = BETA_ALIASES[kind]
        data = {**data, "type": kind, "session": {**data["session"], "type": session_type}}
    if kind in UNSUPPORTED_TYPES:
        raise ProtocolError(ErrorCode.UNSUPPORTED, UNSUPPORTED_TYPES[kind], param="type", event_id=event_id)
    if kind not in KNOWN_TYPES:
        raise ProtocolError(
            ErrorCode.UNKNOWN_EVENT, f"unknown event type {kind!r}", param="type", event_id=event_id
        )
    data = _normalize(data)
    _check_ranges(data, event_id)
    refs = _take_item_references(data, event_id) if kind == "response.create" else []
    try:
        event = _ADAPTERS[kind].validate_python(data)
        if refs:
            # an extra field of the SDK model: response.input without them, and where they stood
            event.response.item_references = refs
        return event
    except pydantic.ValidationError as exc:
        first = _best_error(exc.errors(include_url=False), data)
        param = _param_of(first)
        raise ProtocolError(
            ErrorCode.INVALID_EVENT,
            f"invalid {kind}: {param or 'event'}: {first.get('msg')}",
            param=param or None,
            event_id=event_id,
        ) from None
