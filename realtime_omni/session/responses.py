"""One response's state and the server events that describe its life.

Every ``response.created`` is followed by exactly one ``response.done``: :meth:`Response.finish`
refuses to run twice, whichever path (completion, cancel, failure, disconnect) gets there first.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any, Literal

from ..audio import AudioFormat
from .conversation import Item, SpokenSpan

Status = Literal["completed", "cancelled", "failed", "incomplete"]
EventSink = Any  # callable(event: dict, epoch: int | None = None, audio_ms: float = 0.0, response_id: str | None = None)


@dataclass
class Response:
    id: str
    epoch: int
    item: Item
    modalities: list[str]
    output_format: AudioFormat
    voice: str
    max_output_tokens: int | Literal["inf"]
    #: whether the output item belongs to the default conversation (False for conversation="none")
    in_conversation: bool = True
    status: Literal["in_progress", "completed", "cancelled", "failed", "incomplete"] = "in_progress"
    text: str = ""
    pipeline_started: bool = False
    input_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    status_details: dict[str, Any] | None = None
    _parts_open: bool = field(default=True, repr=False)

    @property
    def wants_audio(self) -> bool:
        return "audio" in self.modalities

    def to_dict(self) -> dict[str, Any]:
        total = self.input_tokens + self.output_tokens
        return {
            "object": "realtime.response",
            "id": self.id,
            "status": self.status,
            "status_details": self.status_details,
            "output": [self.item.to_dict()],
            "conversation_id": "conv_default" if self.in_conversation else None,
            "output_modalities": list(self.modalities),
            "max_output_tokens": self.max_output_tokens,
            "audio": {"output": {"format": {"type": self.output_format.value}, "voice": self.voice}},
            "usage": {
                "total_tokens": total,
                "input_tokens": self.input_tokens,
                "output_tokens": self.output_tokens,
                "input_token_details": {"cached_tokens": self.cached_tokens, "text_tokens": self.input_tokens},
                "output_token_details": {"text_tokens": self.output_tokens},
            },
            "metadata": None,
        }

    def _ids(self) -> dict[str, Any]:
        return {"response_id": self.id, "item_id": self.item.id, "output_index": 0, "content_index": 0}

    def start_events(self, emit: EventSink, previous_item_id: str | None) -> None:
        emit({"type": "response.created", "response": self.to_dict() | {"output": []}})
        emit({"type": "response.output_item.added", "response_id": self.id, "output_index": 0, "item": self.item.to_dict()})
        if self.in_conversation:
            emit({"type": "conversation.item.added", "previous_item_id": previous_item_id, "item": self.item.to_dict()})
        # Items use the output_* part types; the content_part events use plain audio/text (GA SDK).
        self.item.content = [{"type": "output_audio", "transcript": ""} if self.wants_audio else {"type": "output_text", "text": ""}]
        part = {"type": "audio", "transcript": ""} if self.wants_audio else {"type": "text", "text": ""}
        emit({"type": "response.content_part.added", **self._ids(), "part": part})

    def text_delta(self, emit: EventSink, text: str) -> None:
        """Reply text: a transcript delta in audio mode, a text delta in text mode."""
        if not text:
            return
        self.text += text
        kind = "response.output_audio_transcript.delta" if self.wants_audio else "response.output_text.delta"
        emit({"type": kind, **self._ids(), "delta": text}, epoch=self.epoch)

    def audio_delta(self, emit: EventSink, wire: bytes, text: str) -> None:
        """A chunk of encoded audio (and the reply text it begins to speak, if any)."""
        duration = self.output_format.duration_ms(len(wire))
        start = self.item.audio_ms
        self.item.audio_ms += duration
        if text:
            self.text_delta(emit, text)
            self.item.spans.append(SpokenSpan(text=text, start_ms=start, end_ms=self.item.audio_ms))
        elif self.item.spans:
            self.item.spans[-1].end_ms = self.item.audio_ms
        emit(
            {"type": "response.output_audio.delta", **self._ids(), "delta": base64.b64encode(wire).decode()},
            epoch=self.epoch,
            audio_ms=duration,
            response_id=self.id,
            audio=wire,
        )

    def finish(
        self,
        emit: EventSink,
        status: Status,
        *,
        reason: str | None = None,
        error: dict[str, Any] | None = None,
        heard_ms: float | None = None,
    ) -> str | None:
        """Close the response once; returns the heard text when it was cut short, else None."""
        if self.status != "in_progress":
            return None
        self.status = status
        heard: str | None = None
        if status == "cancelled" and self.wants_audio and heard_ms is not None and heard_ms < self.item.audio_ms:
            heard = self.item.truncate_audio(heard_ms)
        elif self.wants_audio:
            self.item.content[0]["transcript"] = self.text
        else:
            self.item.content[0]["text"] = self.text
        if status == "cancelled":
            self.status_details = {"type": "cancelled", "reason": reason or "client_cancelled"}
        elif status == "incomplete":
            self.status_details = {"type": "incomplete", "reason": reason or "max_output_tokens"}
        elif status == "failed":
            self.status_details = {"type": "failed", "error": error}
        self.item.status = "completed" if status == "completed" else "incomplete"
        part = dict(self.item.content[0])
        part["type"] = "audio" if self.wants_audio else "text"
        if self.wants_audio:
            emit({"type": "response.output_audio.done", **self._ids()})
            emit({"type": "response.output_audio_transcript.done", **self._ids(), "transcript": part["transcript"]})
        else:
            emit({"type": "response.output_text.done", **self._ids(), "text": part["text"]})
        emit({"type": "response.content_part.done", **self._ids(), "part": part})
        emit({"type": "response.output_item.done", "response_id": self.id, "output_index": 0, "item": self.item.to_dict()})
        if self.in_conversation:
            emit({"type": "conversation.item.done", "item": self.item.to_dict()})
        emit({"type": "response.done", "response": self.to_dict()})
        return heard
