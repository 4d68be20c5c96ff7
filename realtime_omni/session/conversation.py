"""Conversation items: ordered, addressable, truncatable to what the listener heard."""

from __future__ import annotations

import itertools
import uuid
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from ..engines.base import ToolCall, TurnMessage
from ..protocol.errors import ErrorCode, ProtocolError
from .memory import approx_bytes
from .tools import check_tool_text

MAX_ITEMS = 2000

ItemType = Literal["message", "function_call", "function_call_output", "mcp_list_tools", "mcp_call",
                   "mcp_approval_request", "mcp_approval_response"]


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
    #: None for function_call / function_call_output and MCP items, which have no role
    role: Literal["user", "assistant", "system"] | None
    type: ItemType = "message"
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
    #: function_call: the call's id, the function's name and its JSON arguments;
    #: function_call_output: the call it answers and what the function returned
    call_id: str = ""
    name: str = ""
    arguments: str = ""
    output: str = ""
    #: MCP items: the server's label; mcp_call: its error (None: none); mcp_list_tools: the tools
    server_label: str = ""
    error: dict[str, Any] | None = None
    tools: list[dict[str, Any]] = field(default_factory=list)
    #: mcp_call / mcp_approval_response: the approval request answered; approve and why
    approval_request_id: str = ""
    approve: bool = False
    reason: str | None = None

    def nbytes(self) -> int:
        """What this item holds in memory, roughly: its content, samples and pixels."""
        size = approx_bytes(self.content) + sum(int(image.nbytes) for image in self.images)
        size += len(self.arguments) + len(self.output) + (approx_bytes(self.tools) if self.tools else 0)
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
        head = {"id": self.id, "object": "realtime.item", "type": self.type, "status": self.status}
        match self.type:
            case "function_call":
                return head | {"call_id": self.call_id, "name": self.name, "arguments": self.arguments}
            case "function_call_output":
                return head | {"call_id": self.call_id, "output": self.output}
            case "mcp_list_tools":
                return head | {"server_label": self.server_label, "tools": list(self.tools)}
            case "mcp_call":
                return head | {"server_label": self.server_label, "name": self.name, "arguments": self.arguments,
                               "approval_request_id": self.approval_request_id or None,
                               "output": self.output if self.error is None and self.status == "completed" else None,
                               "error": self.error}
            case "mcp_approval_request":
                return head | {"server_label": self.server_label, "name": self.name, "arguments": self.arguments}
            case "mcp_approval_response":
                return head | {"approval_request_id": self.approval_request_id, "approve": self.approve,
                               "reason": self.reason}
            case _:
                return head | {"role": self.role, "content": [dict(part) for part in self.content]}

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
                ErrorCode.SESSION_MEMORY_EXCEEDED,
                f"this session holds {used} bytes of conversation and instructions; {extra} more would pass its "
                f"limit of {self.max_bytes} bytes. Delete items (conversation.item.delete) to make room.",
                param=param, type="invalid_request_error",
            )

    def __len__(self) -> int:
        return len(self._order)

    def __iter__(self):  # type: ignore[no-untyped-def]
        return (self._items[i] for i in self._order)

    def holds(self, item: Item) -> bool:
        """Whether this very item is in the conversation (not deleted, not replaced)."""
        return self._items.get(item.id) is item

    def last_id(self) -> str | None:
        return self._order[-1] if self._order else None

    def find(self, item_id: str) -> Item | None:
        """The item, or None when it is not (or no longer) in the conversation."""
        return self._items.get(item_id)

    def get(self, item_id: str, param: str = "item_id", event_id: str | None = None) -> Item:
        item = self._items.get(item_id)
        if item is None:
            raise ProtocolError(
                ErrorCode.ITEM_NOT_FOUND, f"item {item_id!r} does not exist", param=param, event_id=event_id
            )
        return item

    def add(self, item: Item, previous_item_id: str | None = None) -> str | None:
        """Insert ``item`` after ``previous_item_id`` (end when None); returns its predecessor."""
        if item.id in self._items:
            raise ProtocolError(ErrorCode.INVALID_VALUE, f"item id {item.id!r} already exists", param="item.id")
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

    def find_call(self, call_id: str) -> Item | None:
        """The function_call item with this ``call_id`` (the newest, should a client reuse one)."""
        for item_id in reversed(self._order):
            item = self._items[item_id]
            if item.type == "function_call" and item.call_id == call_id:
                return item
        return None

    def to_messages(self) -> list[TurnMessage]:
        return [m for item in self for m in self.messages_of(item)]

    def messages_of(self, item: Item) -> list[TurnMessage]:
        """An item as the thinker reads it: an MCP call reads as a call and its result, a
        declined approval request as a call and the refusal."""
        if item.type == "mcp_approval_request":
            answer = next((i for i in self if i.type == "mcp_approval_response" and i.approval_request_id == item.id), None)
            if answer is None or answer.approve:
                return []  # not answered yet, or approved: the mcp_call that ran it reads instead
            refusal = "the user declined this call" + (f": {answer.reason}" if answer.reason else "")
            return [TurnMessage(role="assistant", call=ToolCall(item.name, item.arguments, item.id)),
                    TurnMessage(role="tool", text=refusal, tool_name=item.name)]
        if item.type == "mcp_call":
            if item.status != "completed" and item.error is None:
                return []  # still running, or cut off before it ran
            result = item.output if item.error is None else f"error: {item.error.get('message', 'the call failed')}"
            return [TurnMessage(role="assistant", call=ToolCall(item.name, item.arguments, item.id)),
                    TurnMessage(role="tool", text=result, tool_name=item.name)]
        message = self.message_of(item)
        return [message] if message is not None else []

    def message_of(self, item: Item) -> TurnMessage | None:
        """An item as the thinker reads it (None: nothing to read)."""
        if item.type != "message":
            return self.tool_message(item)
        text = item.text()
        if not text and item.audio16k is None and not item.images:
            return None
        return TurnMessage(role=item.role, text=text, audio=item.audio16k, images=list(item.images))  # type: ignore[arg-type]


    def tool_message(self, item: Item) -> TurnMessage | None:
        """How a function call or its output reads to the thinker (None: an unfinished call)."""
        match item.type:
            case "function_call" if item.status == "completed":
                return TurnMessage(role="assistant", call=ToolCall(item.name, item.arguments, item.call_id))
            case "function_call_output":
                call = self.find_call(item.call_id)
                return TurnMessage(role="tool", text=item.output, tool_name=call.name if call else None)
        return None


_counter = itertools.count()


#: the largest image a client may send, in pixels: 4096 x 4096 (48 MiB as RGB). A small PNG
#: can declare a huge canvas; it is refused from its header, before anything is decoded.
MAX_IMAGE_PIXELS = 4096 * 4096


def decode_image(url: str, param: str) -> np.ndarray:
    """A ``data:image/...;base64,`` URL → RGB uint8 array (no remote fetches)."""
    import base64
    import io

    from PIL import Image, UnidentifiedImageError

    if not url.startswith("data:image/") or ";base64," not in url:
        raise ProtocolError(ErrorCode.INVALID_VALUE, "image_url must be a data:image/...;base64 URL", param=param)
    try:
        raw = base64.b64decode(url.split(";base64,", 1)[1], validate=True)
        with Image.open(io.BytesIO(raw)) as image:  # reads the header only
            width, height = image.size
            if width * height > MAX_IMAGE_PIXELS:
                raise ProtocolError(ErrorCode.INVALID_VALUE, f"the image is {width}x{height} pixels; at most "
                                    f"{MAX_IMAGE_PIXELS} pixels are accepted", param=param)
            return np.asarray(image.convert("RGB"))
    except (ValueError, UnidentifiedImageError, OSError, Image.DecompressionBombError):
        raise ProtocolError(ErrorCode.INVALID_VALUE, "image_url does not hold a readable image", param=param) from None


def item_from_client(data: dict[str, Any], accepts_images: bool = False, accepts_tools: bool = False,
                     param: str = "item") -> Item:
    """A validated ``conversation.item.create`` item → :class:`Item` (audio parts decoded later)."""
    kind = data.get("type", "message")
    if kind == "mcp_approval_response":
        request = data.get("approval_request_id")
        if not isinstance(request, str) or not request:
            raise ProtocolError(ErrorCode.INVALID_VALUE, "an mcp_approval_response needs an approval_request_id",
                                param=f"{param}.approval_request_id")
        reason = data.get("reason")
        if reason is not None:
            check_tool_text(reason, f"{param}.reason")
        return Item(id=data.get("id") or new_id("item"), role=None, type=kind, approval_request_id=request,
                    approve=bool(data.get("approve")), reason=reason)
    if kind in ("function_call", "function_call_output"):
        if not accepts_tools:
            raise ProtocolError(ErrorCode.UNSUPPORTED, f"this model does not call functions: {kind} items are not "
                                "accepted", param=f"{param}.type")
        return _function_item(data, kind, param)
    if kind != "message":
        raise ProtocolError(ErrorCode.UNSUPPORTED, f"item type {kind!r} cannot be created by a client (the server "
                            "makes MCP lists, calls and approval requests)", param=f"{param}.type")
    role = data.get("role")
    content, images = [], []
    for index, part in enumerate(data.get("content") or []):
        part = {k: v for k, v in part.items() if v is not None}
        if part.get("type") == "input_image":
            if not accepts_images:
                raise ProtocolError(
                    ErrorCode.UNSUPPORTED, "this model does not accept images", param=f"item.content.{index}.type"
                )
            images.append(decode_image(part.get("image_url", ""), f"item.content.{index}.image_url"))
            part = {"type": "input_image", "detail": part.get("detail", "auto")}  # pixels are kept as an array
        content.append(part)
    return Item(id=data.get("id") or new_id("item"), role=role, content=content, status="completed", images=images)


def _function_item(data: dict[str, Any], kind: str, param: str) -> Item:
    item = Item(id=data.get("id") or new_id("item"), role=None, type=kind, status="completed")
    item.call_id = data.get("call_id") or ""
    if kind == "function_call":
        item.name, item.arguments = data.get("name") or "", data.get("arguments") or ""
        item.call_id = item.call_id or new_id("call")
        if not item.name:
            raise ProtocolError(ErrorCode.INVALID_VALUE, "a function_call item needs a name", param=f"{param}.name")
        check_tool_text(item.arguments, f"{param}.arguments")
    else:
        item.output = data.get("output") or ""
        if not item.call_id:
            raise ProtocolError(ErrorCode.INVALID_VALUE, "a function_call_output item needs a call_id", param=f"{param}.call_id")
        check_tool_text(item.output, f"{param}.output")
    return item
