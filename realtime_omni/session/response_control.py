"""Responses of a :class:`~.core.RealtimeSession`: creating them (the think request, the
messages), starting the pipeline, cancelling, and the engine's results streamed back (text,
audio, tool-call pieces, usage, the end), plus the audio a duplex model answers while it
listens. A mixin of the session (its state lives there); split out of ``core.py`` by topic."""

from __future__ import annotations

from typing import Any

from ..audio import Pcm, StreamResampler
from ..engines.base import ThinkRequest, ToolCallDelta, ToolSpec, TurnMessage
from ..protocol.errors import ErrorCode, ProtocolError
from ..protocol.server_events import server_event
from . import actions as act
from .config import parse_format, voice_name
from .conversation import Item, item_from_client, new_id
from .input_buffer import MODEL_RATE
from .responses import Response
from .tools import ToolChoice


class ResponseControl:
    """Mixed into :class:`~.core.RealtimeSession` (``self`` is the session)."""

    # ---------------------------------------------------------------- responses
    def _create_response(self, params: dict[str, Any], spec_id: int | None = None,
                         tools: list[ToolSpec] | None = None, choice: ToolChoice | None = None,
                         continued: int = 0) -> None:
        cfg = self.config
        tools = cfg.tools if tools is None else tools
        choice = choice or cfg.tool_choice
        given = (tools, choice)
        try:
            tools, choice, routes = self._with_mcp(tools, choice)
        except ProtocolError as exc:  # a response of turn detection: the choice's tool went away
            self.error(exc)
            tools, choice, routes = self._with_mcp(tools, ToolChoice("auto"))
        modalities = params.get("output_modalities") or cfg.output_modalities
        modalities = ["audio"] if "audio" in modalities else ["text"]
        output_format = cfg.output_format
        audio = (params.get("audio") or {}).get("output") or {}
        voice = cfg.voice if audio.get("voice") is None else voice_name(audio["voice"])
        if audio.get("format"):
            output_format = parse_format(audio["format"], "response.audio.output.format")
        in_conversation = params.get("conversation") not in ("none",)
        self.epoch += 1
        item = Item(id=new_id("item"), role="assistant", status="in_progress")
        response = Response(
            id=new_id("resp"),
            epoch=self.epoch,
            item=item,
            modalities=modalities,
            output_format=output_format,
            voice=voice,
            max_output_tokens=params.get("max_output_tokens") or cfg.max_output_tokens,
            in_conversation=in_conversation,
            metadata=params.get("metadata"),
            attach=self._add_item if in_conversation else None,
            mcp_routes=routes,
            continuation=(params, *given, continued),
        )
        self.response = response
        self._idle.disarm()
        self._response_started_ms = 1000.0 * self._vad_position / MODEL_RATE
        self.ledger.begin(response.id, response)
        if "audio" in modalities:
            self.audio_started = True
            cfg.voice = voice  # the voice it speaks with is the session's from now on
        response.start_events(self._emit, defer_message=bool(tools) and choice.mode != "none")
        if self.rate_limits is not None:
            self._emit(server_event("rate_limits.updated", rate_limits=self.rate_limits()))
        self._pending_request = self._think_request(params.get("instructions"), response.max_output_tokens,
                                                    response.wants_audio, tools, choice, voice)
        if params.get("parallel_tool_calls") is not None:
            self._pending_request.parallel_tool_calls = bool(params["parallel_tool_calls"])
        self._pending_input = params.get("input")
        self._pending_refs = params.get("item_references", [])
        self._pending_spec = spec_id
        self._run_approved(response)
        self._maybe_start_pipeline()

    def _think_request(self, instructions: str | None, limit: int | str, want_audio: bool,
                       tools: list[ToolSpec], choice: ToolChoice, voice: str | None = None) -> ThinkRequest:
        return ThinkRequest(
            instructions=self.config.instructions if instructions is None else instructions,
            messages=[],  # filled when the pipeline starts, after pending transcripts arrive
            max_output_tokens=None if limit == "inf" else int(limit),
            voice=self.config.voice if voice is None else voice,
            want_audio=want_audio,
            speed=self.config.speed,
            tools=list(tools),
            tool_choice=choice.mode if tools else "none",  # a session may hold "required" before its tools
            tool_name=choice.name,
            parallel_tool_calls=self.config.parallel_tool_calls,
        )

    def _messages(self, params_input: list[dict[str, Any]] | None, refs: list[tuple[int, str]]) -> list[TurnMessage]:
        """The conversation, or the response's own ``input`` (new items and references to
        existing ones, in the order given)."""
        if params_input is None and not refs:
            return self.conversation.to_messages()
        given = iter(params_input or [])
        where = dict(refs)
        items: list[Item] = []
        for index in range(len(params_input or []) + len(refs)):
            if index in where:
                items.append(self.conversation.get(where[index], param=f"response.input.{index}.id"))
            else:
                items.append(item_from_client(next(given), self.sees, self.calls_tools, param=f"response.input.{index}"))
        return [m for item in items for m in self.conversation.messages_of(item)]

    def _maybe_start_pipeline(self) -> None:
        response = self.response
        # a duplex model's replies come from what it hears (on_model_audio), not from a pipeline
        if (response is None or response.pipeline_started or self._pending_transcripts or self.model.duplex
                or response.mcp_running):
            return
        response.pipeline_started = True
        request = self._pending_request
        assert request is not None
        try:
            request.messages = self._messages(self._pending_input, self._pending_refs)
        except ProtocolError as exc:  # an input item this model cannot take: fail this response only
            self.error(exc)
            response.finish(self._emit, "failed", error=exc.to_error())
            self.response = None
            return
        self._actions.append(act.StartResponse(response.id, response.epoch, request, response.output_format, self._pending_spec))

    def _cancel_active(self, reason: str, heard_ms: float | None = None) -> None:
        response = self.response
        assert response is not None
        self.epoch += 1  # fence: every chunk of the old epoch is now stale
        if self._pending_spec is not None and not response.pipeline_started:
            self._actions.append(act.DropSpeculation(self._pending_spec))
        self._pending_spec = None
        if heard_ms is None:
            heard_ms = self.ledger.sent_ms(response.id)
        heard = response.finish(self._emit, "cancelled", reason=reason, heard_ms=heard_ms)
        self.response = None
        self._actions.append(act.CancelResponse(response.id, response.epoch))
        if heard is not None:
            self._actions.append(act.ConfirmHeard(heard))

    def on_response_text(self, response_id: str, epoch: int, text: str) -> None:
        response = self._live(response_id, epoch)
        if response is not None:
            response.text_delta(self._emit, text)

    def on_response_audio(self, response_id: str, epoch: int, audio: Pcm, text: str = "") -> None:
        response = self._live(response_id, epoch)
        if response is not None and len(audio):
            response.audio_delta(self._emit, audio, text)

    def on_response_call(self, response_id: str, epoch: int, piece: ToolCallDelta) -> None:
        response = self._live(response_id, epoch)
        if response is not None:
            response.call_delta(self._emit, piece)
            self._dispatch_mcp(response)

    def on_response_usage(self, response_id: str, epoch: int, input_tokens: int, output_tokens: int, cached_tokens: int) -> None:
        response = self._live(response_id, epoch)
        if response is not None:
            response.input_tokens, response.output_tokens, response.cached_tokens = input_tokens, output_tokens, cached_tokens

    def on_response_end(self, response_id: str, epoch: int, status: str = "completed", error: str | None = None, reason: str | None = None) -> None:
        """Driver callback: the pipeline finished (or failed). Stale epochs are ignored."""
        response = self._live(response_id, epoch)
        if response is None:
            return
        if response.mcp_running:  # it ends once its MCP calls have returned
            response.deferred_end = (status, error, reason)
            return
        err = None
        if status == "failed":
            err = {"type": "server_error", "code": ErrorCode.SERVER_ERROR, "message": error or "the model failed"}
            self._emit(server_event("error", error={**err, "param": None, "event_id": None}))
        response.finish(self._emit, status, error=err, reason=reason)  # type: ignore[arg-type]
        self.response = None
        self._arm_idle(response)
        self._continue_after_mcp(response)

    def _live(self, response_id: str, epoch: int) -> Response | None:
        response = self.response
        if response is None or response.id != response_id or response.epoch != epoch or epoch != self.epoch:
            return None
        return response

    # ---------------------------------------------------------------- duplex models
    def on_model_audio(self, audio: Pcm) -> None:
        """Driver callback: what a duplex model said on hearing a :class:`~.actions.Listen`.
        It plays at once, as deltas of one open response."""
        if self.closed:
            return
        if self.response is None:
            self._create_response({"output_modalities": ["audio"]})
            self._duplex_resampler = None
        assert self.response is not None
        rate = self.response.output_format.rate
        resampler = self._duplex_resampler
        if resampler is None or resampler.in_rate != audio.rate:
            resampler = self._duplex_resampler = StreamResampler(audio.rate, rate)
        samples = resampler.process(audio.samples)
        if len(samples):  # a resampler's first call may hold everything back as filter delay
            self.response.audio_delta(self._emit, Pcm(samples, rate), "")

    # ---------------------------------------------------------------- what was heard
    def _on_conversation_item_truncate(self, event: Any) -> None:
        item = self.conversation.get(event.item_id)
        if item.role != "assistant" or event.content_index != 0 or not item.content or item.content[0].get("type") != "output_audio":
            raise ProtocolError(ErrorCode.INVALID_TRUNCATE, "only an assistant audio part can be truncated", param="content_index")
        if event.audio_end_ms < 0 or event.audio_end_ms > item.audio_ms + 1:
            raise ProtocolError(
                ErrorCode.INVALID_TRUNCATE,
                f"audio_end_ms {event.audio_end_ms} is beyond the item's {item.audio_ms:.0f} ms of audio",
                param="audio_end_ms",
            )
        if self.response is not None and self.response.item is item:
            self._cancel_active("client_cancelled", heard_ms=event.audio_end_ms)
        self._truncate(item, event.audio_end_ms)

    def _truncate(self, item: Item, audio_end_ms: int) -> None:
        heard = item.truncate_audio(audio_end_ms)
        self._actions.append(act.ConfirmHeard(heard))
        self._emit(server_event("conversation.item.truncated", item_id=item.id, content_index=0, audio_end_ms=audio_end_ms))

    def playback_cut(self, response_id: str) -> None:
        """A transport that plays audio on the server's side (WebRTC, telephony) dropped what it
        still held of ``response_id`` for the listener (a barge-in).

        The active response needs nothing here: the turn detector that heard the user cancels it,
        truncating to what was heard. A reply already complete but not all heard is truncated to
        what was heard, exactly as a client's ``conversation.item.truncate`` would."""
        if self.closed or (self.response is not None and self.response.id == response_id):
            return
        unheard = self.ledger.unheard_reply(response_id)
        if unheard is None:
            return
        response, heard_ms = unheard
        if self.conversation.holds(response.item):  # not deleted meanwhile
            self._truncate(response.item, int(heard_ms))

    def fenced(self, epoch: int | None) -> bool:
        """Whether audio tagged with ``epoch`` is stale (the session moved past it: a barge-in)."""
        return epoch is not None and epoch != self.epoch
