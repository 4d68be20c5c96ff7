"""Server events in the beta dialect, for clients that connect with ``OpenAI-Beta: realtime=v1``.

The session core speaks GA only; a transport that sees a beta client passes each outgoing event
through :func:`to_beta` just before sending.
"""

from __future__ import annotations

from typing import Any

_RENAMES = {
    "response.output_audio.delta": "response.audio.delta",
    "response.output_audio.done": "response.audio.done",
    "response.output_audio_transcript.delta": "response.audio_transcript.delta",
    "response.output_audio_transcript.done": "response.audio_transcript.done",
    "response.output_text.delta": "response.text.delta",
    "response.output_text.done": "response.text.done",
    "conversation.item.added": "conversation.item.created",
}
_PART_TYPES = {"output_audio": "audio", "output_text": "text"}
_FORMATS = {"audio/pcm": "pcm16", "audio/pcmu": "g711_ulaw", "audio/pcma": "g711_alaw"}


def _part(part: Any) -> Any:
    if isinstance(part, dict) and part.get("type") in _PART_TYPES:
        return {**part, "type": _PART_TYPES[part["type"]]}
    return part


def _item(item: Any) -> Any:
    if isinstance(item, dict) and isinstance(item.get("content"), list):
        return {**item, "content": [_part(p) for p in item["content"]]}
    return item


def _session(session: dict[str, Any]) -> dict[str, Any]:
    audio = session.get("audio") or {}
    audio_in, audio_out = audio.get("input") or {}, audio.get("output") or {}
    out = {k: v for k, v in session.items() if k not in ("audio", "output_modalities", "max_output_tokens")}
    out["object"] = "realtime.session"
    out["modalities"] = ["text", "audio"] if "audio" in session.get("output_modalities", []) else ["text"]
    out["max_response_output_tokens"] = session.get("max_output_tokens", "inf")
    out["input_audio_format"] = _FORMATS.get((audio_in.get("format") or {}).get("type", ""), "pcm16")
    out["output_audio_format"] = _FORMATS.get((audio_out.get("format") or {}).get("type", ""), "pcm16")
    out["turn_detection"] = audio_in.get("turn_detection")
    out["input_audio_transcription"] = audio_in.get("transcription")
    out["voice"] = audio_out.get("voice")
    return out


def _transcription_session(session: dict[str, Any]) -> dict[str, Any]:
    audio_in = (session.get("audio") or {}).get("input") or {}
    return {
        "id": session.get("id"), "object": "realtime.transcription_session", "expires_at": session.get("expires_at"),
        "input_audio_format": _FORMATS.get((audio_in.get("format") or {}).get("type", ""), "pcm16"),
        "input_audio_transcription": audio_in.get("transcription"), "turn_detection": audio_in.get("turn_detection"),
        "input_audio_noise_reduction": audio_in.get("noise_reduction"), "include": session.get("include"),
    }


#: the one conversation of a session (responses name it as their ``conversation_id``)
CONVERSATION_ID = "conv_default"


def beta_followers(event: dict[str, Any]) -> list[dict[str, Any]]:
    """Events the beta dialect sends right after this one and GA does not: the beta server
    announces the session's conversation after ``session.created``."""
    if event["type"] == "session.created":
        return [{"type": "conversation.created", "event_id": f"{event['event_id']}_conversation",
                 "conversation": {"id": CONVERSATION_ID, "object": "realtime.conversation"}}]
    return []


def to_beta(event: dict[str, Any]) -> dict[str, Any] | None:
    """The beta form of a GA server event, or None when beta has no such event."""
    kind = event["type"]
    if kind == "conversation.item.done":
        return None
    out = dict(event)
    out["type"] = _RENAMES.get(kind, kind)
    if "item" in out:
        out["item"] = _item(out["item"])
    if kind in ("session.created", "session.updated") and out["session"].get("type") == "transcription":
        out["type"] = "transcription_" + kind
        out["session"] = _transcription_session(out["session"])
    elif kind in ("session.created", "session.updated"):
        out["session"] = _session(out["session"])
    if kind.startswith("response.") and isinstance(out.get("response"), dict):
        response = dict(out["response"])
        response["output"] = [_item(i) for i in response.get("output") or []]
        if "output_modalities" in response:
            response["modalities"] = response.pop("output_modalities")
        out["response"] = response
    return out
