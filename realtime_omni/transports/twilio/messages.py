"""Twilio Media Streams wire format, sans-I/O: JSON text frames in, typed messages out.

Inbound (Twilio → us): ``connected``, ``start``, ``media``, ``dtmf``, ``mark``, ``stop``.
Outbound (us → Twilio, bidirectional ``<Connect><Stream>`` only): ``media``, ``mark``, ``clear``.
Audio is base64 μ-law (``audio/x-mulaw``) at 8 kHz mono; Twilio itself sends 20 ms (160-byte)
frames and we send the same size back.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
from dataclasses import dataclass, field
from typing import Any
from xml.sax.saxutils import quoteattr

from ...protocol import strict_json

#: one 20 ms frame of 8 kHz μ-law
FRAME_BYTES = 160
FRAME_MS = 20
#: μ-law code for (positive) zero; pads the last partial frame of a reply
ULAW_SILENCE = b"\xff"
#: a text frame longer than this is dropped unread (Twilio's own frames are ~250 characters)
MAX_MESSAGE_CHARS = 256 * 1024
#: decoded media payloads above this (2 s of audio) are dropped: no carrier sends that much at once
MAX_MEDIA_BYTES = 16_000
DTMF_DIGITS = frozenset("0123456789*#ABCDabcd")
INBOUND_EVENTS = frozenset({"connected", "start", "media", "dtmf", "mark", "stop"})


class TwilioMessageError(ValueError):
    """A frame that is not a valid Media Streams message (logged and ignored, never fatal)."""


@dataclass
class StartInfo:
    stream_sid: str
    call_sid: str | None = None
    account_sid: str | None = None
    tracks: list[str] = field(default_factory=list)
    custom_parameters: dict[str, str] = field(default_factory=dict)
    media_format: dict[str, Any] = field(default_factory=dict)


def parse(raw: str | bytes) -> dict[str, Any]:
    """One text frame → its JSON object, with a string ``event``. Raises :class:`TwilioMessageError`."""
    if isinstance(raw, bytes):
        raise TwilioMessageError("binary frame (Media Streams frames are JSON text)")
    if len(raw) > MAX_MESSAGE_CHARS:
        raise TwilioMessageError(f"frame of {len(raw)} characters is over the {MAX_MESSAGE_CHARS} limit")
    try:
        message = strict_json.loads(raw)
    except ValueError:
        raise TwilioMessageError("frame is not JSON") from None
    if not isinstance(message, dict) or not isinstance(message.get("event"), str):
        raise TwilioMessageError("frame is not a JSON object with a string 'event'")
    return message


def _object(message: dict[str, Any], key: str) -> dict[str, Any]:
    value = message.get(key)
    if not isinstance(value, dict):
        raise TwilioMessageError(f"'{message['event']}' message without a '{key}' object")
    return value


def parse_start(message: dict[str, Any]) -> StartInfo:
    start = _object(message, "start")
    stream_sid = start.get("streamSid") or message.get("streamSid")
    if not isinstance(stream_sid, str) or not stream_sid:
        raise TwilioMessageError("'start' message without a streamSid")
    params = start.get("customParameters") or {}
    if not isinstance(params, dict):
        raise TwilioMessageError("'start.customParameters' is not an object")
    return StartInfo(
        stream_sid=stream_sid,
        call_sid=_str_or_none(start.get("callSid")),
        account_sid=_str_or_none(start.get("accountSid")),
        tracks=[t for t in start.get("tracks") or [] if isinstance(t, str)],
        custom_parameters={str(k): str(v) for k, v in params.items() if v is not None},
        media_format=start.get("mediaFormat") if isinstance(start.get("mediaFormat"), dict) else {},
    )


def media_format_problem(fmt: dict[str, Any]) -> str | None:
    """Why a ``start.mediaFormat`` is not 8 kHz mono μ-law (None when it is, or is absent)."""
    if not fmt:
        return None
    encoding = str(fmt.get("encoding", "audio/x-mulaw")).lower()
    if encoding not in ("audio/x-mulaw", "audio/mulaw", "audio/pcmu"):
        return f"encoding {encoding!r}"
    if _number(fmt.get("sampleRate", 8000)) != 8000:
        return f"sample rate {fmt.get('sampleRate')!r}"
    if _number(fmt.get("channels", 1)) != 1:
        return f"channels {fmt.get('channels')!r}"
    return None


def _number(value: Any) -> float | None:
    """A JSON number (or numeric string) as a float; None for anything else (never raises)."""
    if isinstance(value, bool):
        return None
    try:
        return float(value)
    except (TypeError, ValueError, OverflowError):
        return None


def parse_media(message: dict[str, Any]) -> tuple[str, bytes]:
    """(track, μ-law bytes) of a ``media`` message. Raises on bad base64 / empty / huge payloads."""
    media = _object(message, "media")
    payload = media.get("payload")
    if not isinstance(payload, str):
        raise TwilioMessageError("'media' message without a string payload")
    if len(payload) > 4 * (MAX_MEDIA_BYTES // 3 + 1):
        raise TwilioMessageError(f"media payload of {len(payload)} base64 characters is over the limit")
    try:
        audio = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise TwilioMessageError("media payload is not valid base64") from None
    if not audio:
        raise TwilioMessageError("empty media payload")
    track = media.get("track")
    return (track if isinstance(track, str) else "inbound"), audio


def parse_dtmf(message: dict[str, Any]) -> str:
    digit = _object(message, "dtmf").get("digit")
    if not isinstance(digit, str) or len(digit) != 1 or digit not in DTMF_DIGITS:
        raise TwilioMessageError(f"invalid DTMF digit {digit!r}")
    return digit.upper()


def parse_mark(message: dict[str, Any]) -> str:
    name = _object(message, "mark").get("name")
    if not isinstance(name, str) or not name:
        raise TwilioMessageError("'mark' message without a name")
    return name


def _str_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


# ------------------------------------------------------------------------------ outbound
def media(stream_sid: str, frame: bytes) -> str:
    payload = base64.b64encode(frame).decode("ascii")
    return json.dumps({"event": "media", "streamSid": stream_sid, "media": {"payload": payload}})


def mark(stream_sid: str, name: str) -> str:
    return json.dumps({"event": "mark", "streamSid": stream_sid, "mark": {"name": name}})


def clear(stream_sid: str) -> str:
    return json.dumps({"event": "clear", "streamSid": stream_sid})


# ------------------------------------------------------------------------------ TwiML and signatures
def connect_stream_twiml(stream_url: str, parameters: dict[str, str] | None = None) -> str:
    """``<Response><Connect><Stream url=...>`` (a bidirectional stream), custom parameters inside."""
    lines = ['<?xml version="1.0" encoding="UTF-8"?>', "<Response>", "  <Connect>", f"    <Stream url={quoteattr(stream_url)}>"]
    for name, value in (parameters or {}).items():
        lines.append(f"      <Parameter name={quoteattr(name)} value={quoteattr(value)} />")
    lines += ["    </Stream>", "  </Connect>", "</Response>", ""]
    return "\n".join(lines)


def request_signature(auth_token: str, url: str, params: dict[str, str] | None = None) -> str:
    """Twilio's ``X-Twilio-Signature``: base64 HMAC-SHA1 of the URL followed by the sorted POST
    parameters' names and values, keyed with the account's auth token."""
    data = url + "".join(f"{k}{v}" for k, v in sorted((params or {}).items()))
    digest = hmac.new(auth_token.encode(), data.encode(), hashlib.sha1).digest()
    return base64.b64encode(digest).decode("ascii")


def valid_signature(auth_token: str, signature: str, url: str, params: dict[str, str] | None = None) -> bool:
    return hmac.compare_digest(request_signature(auth_token, url, params), signature or "")
