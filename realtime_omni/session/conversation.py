"""Conversation items: ordered, addressable, truncatable to what the listener heard."""

from __future__ import annotations

import itertools
import uuid
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from ..engines.base import TurnMessage
from ..protocol import errors
from ..protocol.errors import ProtocolError
from .memory import approx_bytes

MAX_ITEMS = 2000


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:20]}"


@dataclass
class SpokenSpan:
    """A span of reply text and the audio milliseconds that speak it (playback truth)."""

    text: str
    start_ms: float
    end_ms: float


@dataclass
class Item:
    id: str
    role: Literal["user", "assistant", "system"]
    type: str = "message"
    status: Literal["completed", "incomplete", "in_progress"] = "completed"
    #: content parts in GA shape (without inline audio; audio is held as samples below)
    content: list[dict[str, Any]] = field(default_factory=list)
    #: user speech at 16 kHz (input_audio parts); kept for omni thinkers and transcription
    audio16k: np.ndarray | None = None
    #: images seen with this turn (RGB uint8 HxWx3): camera frames or input_image parts
    images: list[np.ndarray] = field(default_factory=list)
    #: assistant audio milliseconds produced, and the text spans they speak
    audio_ms: float = 0.0
    spans: list[SpokenSpan] = field(default_factory=list)

    def nbytes(self) -> int:
        """What this item holds in memory, roughly: its content, samples and pixels."""
        size = approx_bytes(self.content) + sum(int(image.nbytes) for image in self.images)
        if self.audio16k is not None:
            size += int(self.audio16k.nbytes)
        return size + sum(len(span.text) for span in self.spans)

    def text(self) -> str:
        """The item's text as a thinker should see it (transcripts for audio parts)."""
        pieces = []
        for part in self.content:
            value = part.get("text") if part.get("text") is not None else part.get("transcript")
            if value:
                pieces.append(value)
        return " ".join(pieces).strip()

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "realtime.item",
            "type": self.type,
            "status": self.status,
            "role": self.role,
            "content": [dict(part) for part in self.content],
        }

    def truncate_audio(self, audio_end_ms: float) -> str:
        """Keep only the first ``audio_end_ms`` of this assistant item; returns the heard text."""
        heard: list[str] = []
        for span in self.spans:
            if span.end_ms <= audio_end_ms:
                heard.append(span.text)
            elif span.start_ms < audio_end_ms:
                # A clause cut mid-way: keep the words spoken so far, proportionally.
                words = span.text.split()
                fraction = (audio_end_ms - span.start_ms) / max(span.end_ms - span.start_ms, 1e-6)
                heard.append(" ".join(words[: int(len(words) * fraction)]))
        text = " ".join(p.strip() for p in heard if p.strip())
        self.audio_ms = min(self.audio_ms, audio_end_ms)
        for part in self.content:
            if part.get("type") == "output_audio":
                part["transcript"] = text
        self.spans = [s for s in self.spans if s.start_ms < audio_end_ms]
        return text


class Conversation:
    """The default conversation of a session."""

    def __init__(self, max_bytes: int | None = None) -> None:
        self._items: dict[str, Item] = {}
        self._order: list[str] = []
        #: the budget of what a client adds (items, plus the instructions it sets); None: none
        self.max_bytes = max_bytes
        #: ids of items that left because the conversation was full, not yet announced
        self.evicted: list[str] = []

    def nbytes(self) -> int:
        return sum(item.nbytes() for item in self._items.values())

    def check_room(self, extra: int, held_elsewhere: int, param: str | None = None) -> None:
        """Refuse (``session_memory_exceeded``) what would take the session past its budget."""
        if self.max_bytes is None:
            return
        used = self.nbytes() + held_elsewhere
        if used + extra > self.max_bytes:
            raise ProtocolError(
                errors.SESSION_MEMORY_EXCEEDED,
                f"this session holds {used} bytes of conversation and instructions; {extra} more would pass its "
                f"limit of {self.max_bytes} bytes. Delete items (conversation.item.delete) to make room.",
                param=param, type="invalid_request_error",
            )

    def __len__(self) -> int:
        return len(self._order)

    def __iter__(self):  # type: ignore[no-untyped-def]
        return (self._items[i] for i in self._order)

    def last_id(self) -> str | None:
        return self._order[-1] if self._order else None

    def get(self, item_id: str, param: str = "item_id", event_id: str | None = None) -> Item:
        item = self._items.get(item_id)
        if item is None:
            raise ProtocolError(
                errors.ITEM_NOT_FOUND, f"item {item_id!r} does not exist", param=param, event_id=event_id
            )
        return item

    def add(self, item: Item, previous_item_id: str | None = None) -> str | None:
        """Insert ``item`` after ``previous_item_id`` (end when None); returns its predecessor."""
        if item.id in self._items:
            raise ProtocolError(errors.INVALID_VALUE, f"item id {item.id!r} already exists", param="item.id")
        if len(self._order) >= MAX_ITEMS:
            # bounded: the oldest item leaves the context first (the session announces it)
            self.evicted.append(self._order[0])
            self.delete(self._order[0])
        if previous_item_id is None or previous_item_id == self.last_id():
            self._order.append(item.id)
        elif previous_item_id == "root":
            self._order.insert(0, item.id)
        else:
            self.get(previous_item_id, param="previous_item_id")
            self._order.insert(self._order.index(previous_item_id) + 1, item.id)
        self._items[item.id] = item
        index = self._order.index(item.id)
        return self._order[index - 1] if index > 0 else None

    def delete(self, item_id: str) -> None:
        self.get(item_id)
        del self._items[item_id]
        self._order.remove(item_id)

    def to_messages(self) -> list[TurnMessage]:
        messages = []
        for item in self:
            if item.type != "message":
                continue
            text = item.text()
            if not text and item.audio16k is None and not item.images:
                continue
            messages.append(TurnMessage(role=item.role, text=text, audio=item.audio16k, images=list(item.images)))
        return messages


_counter = itertools.count()


def decode_image(url: str, param: str) -> np.ndarray:
    """A ``data:image/...;base64,`` URL → RGB uint8 array (no remote fetches)."""
    import base64
    import io

    from PIL import Image, UnidentifiedImageError

    if not url.startswith("data:image/") or ";base64," not in url:
        raise ProtocolError(errors.INVALID_VALUE, "image_url must be a data:image/...;base64 URL", param=param)
    try:
        raw = base64.b64decode(url.split(";base64,", 1)[1], validate=True)
        with Image.open(io.BytesIO(raw)) as image:
            return np.asarray(image.convert("RGB"))
    except (ValueError, UnidentifiedImageError, OSError):
        raise ProtocolError(errors.INVALID_VALUE, "image_url does not hold a readable image", param=param) from None


def item_from_client(data: dict[str, Any], accepts_images: bool = False) -> Item:
    """A validated ``conversation.item.create`` item → :class:`Item` (audio parts decoded later)."""
    kind = data.get("type", "message")
    if kind != "message":
        raise ProtocolError(
            errors.UNSUPPORTED, f"item type {kind!r} is not supported (no tools on this server)", param="item.type"
        )
    role = data.get("role")
    content, images = [], []
    for index, part in enumerate(data.get("content") or []):
        part = {k: v for k, v in part.items() if v is not None}
        if part.get("type") == "input_image":
            if not accepts_images:
                raise ProtocolError(
                    errors.UNSUPPORTED, "this model does not accept images", param=f"item.content.{index}.type"
                )
            images.append(decode_image(part.get("image_url", ""), f"item.content.{index}.image_url"))
            part = {"type": "input_image", "detail": part.get("detail", "auto")}  # pixels are kept as an array
        content.append(part)
    return Item(id=data.get("id") or new_id("item"), role=role, content=content, status="completed", images=images)
