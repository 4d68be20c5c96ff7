"""One response's state and the server events that describe its life.

Every ``response.created`` is followed by exactly one ``response.done``: :meth:`Response.finish`
refuses to run twice, whichever path (completion, cancel, failure, disconnect) gets there first.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from ..audio import AudioFormat, Pcm
from ..engines.base import ToolCallDelta
from ..protocol.beta import CONVERSATION_ID
from ..protocol.server_events import server_event
from .conversation import Item, SpokenSpan, new_id

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
    #: the client's response.metadata, echoed on response.created and response.done
    metadata: dict[str, str] | None = None
    #: puts an output item into the conversation and returns its predecessor's id (None when the
    #: response is out of band)
    attach: Callable[[Item], str | None] | None = None
    #: output items in order: the message (``item``) and function calls, as they begin
    outputs: list[Item] = field(default_factory=list)
    #: the function call whose arguments are streaming now
    _call: Item | None = field(default=None, repr=False)
    #: the MCP tools the model was offered: function name → (server label, tool name, asks first)
    mcp_routes: dict[str, tuple[str, str, bool]] = field(default_factory=dict)
    #: mcp_call items whose arguments are complete, not yet handed to the driver; those running
    mcp_ready: list[Item] = field(default_factory=list)
    mcp_running: dict[str, Item] = field(default_factory=dict)
    #: the model's end, held while MCP calls run: (status, error, reason)
    deferred_end: tuple[str, str | None, str | None] | None = None
    #: how a reply that used MCP results goes on: (params, tools, choice, replies so far)
    continuation: tuple[dict[str, Any], list[Any], Any, int] | None = None

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
            "output": [item.to_dict() for item in self.outputs],
            "conversation_id": CONVERSATION_ID if self.in_conversation else None,
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
            "metadata": self.metadata,
        }

    def _index(self, item: Item) -> int:
        """The output index of ``item`` (by identity), or -1 while it is not an output."""
        for index, output in enumerate(self.outputs):  # (a loop: this runs twice per audio delta)
            if output is item:
                return index
        return -1

    def _ids(self) -> dict[str, Any]:
        return {"response_id": self.id, "item_id": self.item.id, "output_index": self._index(self.item),
                "content_index": 0}

    def start_events(self, emit: EventSink, defer_message: bool = False) -> None:
        """``response.created``, then the message item at once, or (``defer_message``, when the
        model may call a function instead of speaking) when its first text or audio comes."""
        emit(server_event("response.created", response=self.to_dict()))
        if not defer_message:
            self._open_message(emit)

    def add_output(self, emit: EventSink, item: Item) -> None:
        """A new output item (the message, a call): ``response.output_item.added`` and, in the
        conversation, ``conversation.item.added``."""
        self.outputs.append(item)
        emit(server_event("response.output_item.added", response_id=self.id, output_index=len(self.outputs) - 1,
                          item=item.to_dict()))
        if self.attach is not None:
            emit(server_event("conversation.item.added", previous_item_id=self.attach(item), item=item.to_dict()))

    def _open_message(self, emit: EventSink) -> None:
        if self._index(self.item) >= 0:
            return
        self.add_output(emit, self.item)
        # Items use the output_* part types; the content_part events use plain audio/text (GA SDK).
        self.item.content = [{"type": "output_audio", "transcript": ""} if self.wants_audio else {"type": "output_text", "text": ""}]
        part = {"type": "audio", "transcript": ""} if self.wants_audio else {"type": "text", "text": ""}
        emit(server_event("response.content_part.added", **self._ids(), part=part))

    def call_delta(self, emit: EventSink, piece: ToolCallDelta) -> None:
        """A piece of a function call: the first opens a ``function_call`` item, the last closes it."""
        call = self._call
        if call is None:
            route = self.mcp_routes.get(piece.name)
            if route is not None:
                label, tool, asks = route
                kind = "mcp_approval_request" if asks else "mcp_call"
                call = Item(id=new_id("mcpr" if asks else "mcp"), role=None, type=kind, status="in_progress",
                            name=tool, server_label=label)
            else:
                call = Item(id=new_id("item"), role=None, type="function_call", status="in_progress",
                            call_id=new_id("call"), name=piece.name)
            self._call = call
            if call.type != "mcp_approval_request":  # a request is announced whole, once its arguments are
                self.add_output(emit, call)
        if call.type != "function_call":
            self._mcp_delta(emit, call, piece)
            return
        ids = {"response_id": self.id, "item_id": call.id, "output_index": self._index(call), "call_id": call.call_id}
        if piece.delta:
            call.arguments += piece.delta
            emit(server_event("response.function_call_arguments.delta", **ids, delta=piece.delta), epoch=self.epoch)
        if piece.done:
            call.arguments = piece.arguments or call.arguments
            call.status = "completed"
            self._call = None
            emit(server_event("response.function_call_arguments.done", **ids, name=call.name, arguments=call.arguments))
            self._close_output(emit, call)

    def _mcp_delta(self, emit: EventSink, call: Item, piece: ToolCallDelta) -> None:
        """Arguments of an MCP call (streamed) or of an approval request (announced when done)."""
        if piece.delta:
            call.arguments += piece.delta
            if call.type == "mcp_call":
                emit(server_event("response.mcp_call_arguments.delta", response_id=self.id, item_id=call.id,
                                  output_index=self._index(call), delta=piece.delta), epoch=self.epoch)
        if not piece.done:
            return
        call.arguments = piece.arguments or call.arguments
        self._call = None
        if call.type == "mcp_approval_request":
            call.status = "completed"
            self.add_output(emit, call)
            self._close_output(emit, call)
            return
        emit(server_event("response.mcp_call_arguments.done", response_id=self.id, item_id=call.id,
                          output_index=self._index(call), arguments=call.arguments))
        self.start_mcp_call(emit, call)

    def start_mcp_call(self, emit: EventSink, call: Item) -> None:
        """``response.mcp_call.in_progress``; the driver is asked to run it (``mcp_ready``)."""
        emit(server_event("response.mcp_call.in_progress", item_id=call.id, output_index=self._index(call)))
        self.mcp_ready.append(call)
        self.mcp_running[call.id] = call

    def end_mcp_call(self, emit: EventSink, item_id: str, output: str, error: dict[str, Any] | None) -> bool:
        """A call's result: the item is closed (``completed`` / ``failed``). False: not running."""
        call = self.mcp_running.pop(item_id, None)
        if call is None:
            return False
        call.output, call.error = output, error
        call.status = "completed" if error is None else "incomplete"
        kind = "response.mcp_call.completed" if error is None else "response.mcp_call.failed"
        emit(server_event(kind, item_id=call.id, output_index=self._index(call)))
        self._close_output(emit, call)
        return True

    def _close_output(self, emit: EventSink, item: Item) -> None:
        emit(server_event("response.output_item.done", response_id=self.id, output_index=self._index(item),
                          item=item.to_dict()))
        if self.attach is not None:
            emit(server_event("conversation.item.done", item=item.to_dict()))

    def text_delta(self, emit: EventSink, text: str) -> None:
        """Reply text: a transcript delta in audio mode, a text delta in text mode."""
        if not text:
            return
        self._open_message(emit)
        self.text += text
        kind = "response.output_audio_transcript.delta" if self.wants_audio else "response.output_text.delta"
        emit(server_event(kind, **self._ids(), delta=text), epoch=self.epoch)

    def audio_delta(self, emit: EventSink, audio: Pcm, text: str) -> None:
        """A chunk of audio at the output format's rate (and the reply text it begins to speak)."""
        self._open_message(emit)
        duration = audio.duration_ms
        start = self.item.audio_ms
        self.item.audio_ms += duration
        if text:
            self.text_delta(emit, text)
            self.item.spans.append(SpokenSpan(text=text, start_ms=start, end_ms=self.item.audio_ms))
        elif self.item.spans:
            self.item.spans[-1].end_ms = self.item.audio_ms
        emit(
            # ``delta`` stays empty: the WebSocket writer encodes the PCM (Outgoing.json_event)
            server_event("response.output_audio.delta", **self._ids(), delta=""),
            epoch=self.epoch,
            audio_ms=duration,
            response_id=self.id,
            audio=audio,
            audio_format=self.output_format,
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
        if status == "completed" and self._call is not None:
            # the model stopped inside a call's arguments: only the token limit does that
            status, reason = "incomplete", "max_output_tokens"
        self.status = status
        if not self.outputs:
            self._open_message(emit)  # a reply with nothing in it is still a (empty) message
        heard: str | None = None
        if status == "cancelled" and self.wants_audio and heard_ms is not None and heard_ms < self.item.audio_ms:
            heard = self.item.truncate_audio(heard_ms)
        elif self._index(self.item) < 0:
            pass
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
        if self._index(self.item) >= 0:
            self._close_message(emit, status)
        if self._call is not None:  # cut off while its arguments streamed: never called
            call, self._call = self._call, None
            call.status = "incomplete"
            if self._index(call) >= 0:  # (an approval request is not announced until complete)
                self._close_output(emit, call)
        for call in list(self.mcp_running.values()):  # cut off while the server ran it
            self.end_mcp_call(emit, call.id, "", {"type": "tool_execution_error",
                                                  "message": "the response ended before the call returned"})
        self.mcp_ready.clear()
        emit(server_event("response.done", response=self.to_dict()))
        return heard

    def _close_message(self, emit: EventSink, status: Status) -> None:
        self.item.status = "completed" if status == "completed" else "incomplete"
        part = dict(self.item.content[0])
        part["type"] = "audio" if self.wants_audio else "text"
        if self.wants_audio:
            emit(server_event("response.output_audio.done", **self._ids()))
            emit(server_event("response.output_audio_transcript.done", **self._ids(), transcript=part["transcript"]))
        else:
            emit(server_event("response.output_text.done", **self._ids(), text=part["text"]))
        emit(server_event("response.content_part.done", **self._ids(), part=part))
        self._close_output(emit, self.item)
