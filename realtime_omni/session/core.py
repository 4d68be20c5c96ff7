"""The sans-I/O Realtime session: client events in, server events and actions out.

Nothing here touches a socket, a thread or a model. A driver (:mod:`realtime_omni.session.runner`)
feeds it client events and engine results in order, sends :meth:`RealtimeSession.drain_events`
and performs :meth:`RealtimeSession.drain_actions`. Tests drive it directly.
"""

from __future__ import annotations

import base64
import binascii
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..audio import AudioFormat, Pcm, StreamResampler
from ..audio.denoise import InputDenoiser
from ..engines.base import ModelInfo, ThinkRequest, ToolCallDelta, ToolSpec, TurnMessage
from ..protocol.errors import ErrorCode, ProtocolError
from ..protocol.server_events import server_event
from . import actions as act
from .config import SessionConfig, parse_format, tools_of
from .conversation import Conversation, Item, item_from_client, new_id
from .idle import IdleTimer
from .input_buffer import MODEL_RATE, InputAudioBuffer
from .playback import PlaybackLedger
from .responses import Response
from .tools import ToolChoice
from .turn_detection import (
    SilenceStarted,
    SpeechResumed,
    SpeechStarted,
    SpeechStopped,
    TurnDetector,
)

log = logging.getLogger(__name__)

MIN_COMMIT_MS = 100


@dataclass
class Outgoing:
    """A server event ready to send; ``epoch`` marks audio that a later cancel makes stale."""

    event: dict[str, Any]
    epoch: int | None = None
    audio_ms: float = 0.0
    response_id: str | None = None
    #: an audio delta's PCM: media transports take it as it is (and encode it themselves)
    audio: Pcm | None = None
    #: the output format the JSON channel encodes ``audio`` in (:meth:`json_event`)
    audio_format: AudioFormat | None = None
    #: what it holds, roughly (set by the driver when queued; 0: not measured yet)
    nbytes: int = 0

    def json_event(self) -> dict[str, Any]:
        """The event as the JSON channel sends it. An audio delta's ``delta`` (empty until here)
        is encoded now, at the edge: transports that never send it never pay for it."""
        if self.audio is None or self.audio_format is None:
            return self.event
        return {**self.event, "delta": base64.b64encode(self.audio_format.from_pcm(self.audio)).decode()}


class RealtimeSession:
    def __init__(
        self,
        model: ModelInfo,
        *,
        session_id: str | None = None,
        has_vad: bool = True,
        max_session_seconds: float = 3600.0,
        max_bytes: int | None = None,
        clock=time.time,  # type: ignore[no-untyped-def]
        requested_model: str | None = None,
    ) -> None:
        self.id = session_id or new_id("sess")
        self.model = model
        #: the id the client asked for when it is an alias of the served one (``gpt-realtime``)
        self.requested_model = requested_model if requested_model not in (None, model.id) else None
        #: whether a model id in session.update names this session's model (the manager knows aliases)
        self.accepts_model: Callable[[str], bool] = lambda name: name in (model.id, self.requested_model)
        #: whether the model takes images; frames for a model that cannot see are dropped at once
        self.sees = "image_in" in model.capabilities
        #: whether the model can call functions (session.tools, function_call items)
        self.calls_tools = "tools" in model.capabilities
        self._latest_image: np.ndarray | None = None
        #: prepare replies during the pause before the end-of-turn decision (cascade models)
        self.speculative = not model.hears_audio
        self._spec_id = 0
        self._spec_active = False
        self.has_vad = has_vad and not model.duplex  # a duplex model takes its own turns
        self.config = SessionConfig(model=model.id)
        if not self.has_vad:
            self.config.turn_detection = None
        self.created_at = clock()
        self.expires_at = int(self.created_at + max_session_seconds)
        #: ``max_bytes`` bounds the conversation and the instructions together
        self.conversation = Conversation(max_bytes)
        self.input = InputAudioBuffer()
        #: audio.input.noise_reduction, applied before everything that hears the input
        self.denoiser = InputDenoiser(lambda: self.config.noise_reduction)
        self.detector: TurnDetector | None = None
        self.ledger = PlaybackLedger()
        #: the epoch fence: audio tagged with an older epoch is dropped everywhere
        self.epoch = 0
        self.response: Response | None = None
        self.audio_started = False
        self._speech_item_id: str | None = None
        self._speech_start_ms = 0
        self._vad_pending = np.zeros(0, dtype=np.int16)
        self._vad_position = 0  # stream samples already given to the VAD
        self._idle = IdleTimer()
        self._response_started_ms = 0.0  # input position when the current response began
        self._pending_transcripts: set[str] = set()
        # the next response's request, held until every pending transcript has arrived
        self._pending_request: ThinkRequest | None = None
        self._pending_input: list[dict[str, Any]] | None = None
        self._pending_refs: list[tuple[int, str]] = []
        self._pending_spec: int | None = None
        #: a duplex model's output rate → the output format's, for the open response
        self._duplex_resampler: StreamResampler | None = None
        self._events: list[Outgoing] = []
        # event ids: a per-session random prefix and a counter (uuid4 per event costs ~8x more)
        self._id_prefix = uuid.uuid4().hex[:12]
        self._event_counter = 0
        self._actions: list[act.Action] = []
        self.closed = False
        #: extension: the secret a client presents to resume this session after a disconnect
        self.resume_token: str | None = None
        #: the driver's view of this session's limits, reported as rate_limits.updated
        self.rate_limits: Callable[[], list[dict[str, Any]]] | None = None
        self._reset_detector()

    # ---------------------------------------------------------------- outputs
    def drain_events(self) -> list[Outgoing]:
        out, self._events = self._events, []
        return out

    def drain_actions(self) -> list[act.Action]:
        out, self._actions = self._actions, []
        return out

    def _emit(
        self, event: dict[str, Any], epoch: int | None = None, audio_ms: float = 0.0,
        response_id: str | None = None, audio: Pcm | None = None, audio_format: AudioFormat | None = None,
    ) -> None:
        self._event_counter += 1
        event = {"event_id": f"event_{self._id_prefix}{self._event_counter:x}", **event}
        self._events.append(Outgoing(event, epoch, audio_ms, response_id, audio, audio_format))

    def error(self, exc: ProtocolError) -> None:
        # what a client was told is on the server's record too (message cut: clients choose it)
        log.info("session %s: error %s (param %s): %.200s", self.id, exc.code, exc.param, exc.message)
        self._emit(server_event("error", error=exc.to_error()))

    # ---------------------------------------------------------------- lifecycle
    def start(self) -> None:
        """Greet the client: ``session.created`` (+ extension capabilities)."""
        session = self.session_dict()
        if self.resume_token is not None:
            session["resume_token"] = self.resume_token
        self._emit(server_event("session.created", session=session))

    def session_dict(self) -> dict[str, Any]:
        session = self.config.to_dict(self.id, self.expires_at)
        # Extension (not in OpenAI's schema): what this model can take and give.
        session["capabilities"] = sorted(self.model.capabilities)
        if self.requested_model is not None:
            # Extension: ``model`` is the model that serves; this is the alias the client asked for
            session["requested_model"] = self.requested_model
        return session

    @property
    def input_received_ms(self) -> float:
        """Milliseconds of input audio received so far, on the clock of the VAD events."""
        return 1000.0 * (self._vad_position + len(self._vad_pending)) / MODEL_RATE

    def warn_expiring(self, seconds_left: int) -> None:
        """Extension event: the session will be closed at its lifetime limit."""
        self._emit(server_event("session.expiring", seconds_left=seconds_left, expires_at=self.expires_at))

    def close(self, reason: str = "client_closed") -> None:
        """End the session: any active response ends (cancelled) exactly once."""
        if self.closed:
            return
        if self.response is not None:
            self._cancel_active("client_cancelled")
        self.closed = True
        self._actions.append(act.CloseSession(reason))

    # ---------------------------------------------------------------- persistence
    def snapshot(self) -> dict[str, Any]:
        """What a store keeps: settings and items (text/transcripts), not audio or model state."""
        return {
            "id": self.id,
            "model": self.model.id,
            "created_at": self.created_at,
            "config": self.config.model_dump(mode="json"),
            "items": [item.to_dict() for item in self.conversation],
        }

    def restore(self, snapshot: dict[str, Any]) -> None:
        """Rebuild settings and conversation from a snapshot (the model context follows on the
        next turn, since every response sends the whole conversation to the thinker)."""
        self.config = SessionConfig.model_validate(snapshot["config"])
        if not self.has_vad:
            self.config.turn_detection = None
        self._reset_detector()
        for data in snapshot["items"]:
            status = data.get("status") if data.get("status") != "in_progress" else "incomplete"
            self.conversation.add(Item(id=data["id"], role=data.get("role"), type=data.get("type", "message"),
                                       status=status, content=data.get("content") or [],
                                       call_id=data.get("call_id", ""), name=data.get("name", ""),
                                       arguments=data.get("arguments", ""), output=data.get("output", "")))
        self.audio_started = any(i.role == "assistant" for i in self.conversation)

    # ---------------------------------------------------------------- client events
    def receive(self, event: Any) -> None:
        """Handle one validated client event (an ``openai.types.realtime`` model)."""
        handler = getattr(self, "_on_" + event.type.replace(".", "_"))
        try:
            handler(event)
        except ProtocolError as exc:
            if exc.event_id is None:
                exc.event_id = event.event_id
            self.error(exc)

    def _on_session_update(self, event: Any) -> None:
        update = event.session.model_dump(exclude_unset=True)
        if update.get("prompt"):
            raise ProtocolError(ErrorCode.UNSUPPORTED, "stored prompts (session.prompt) are not supported by this server; "
                                "send the text as instructions", param="session.prompt")
        if update.get("type") == "transcription":
            raise ProtocolError(ErrorCode.UNSUPPORTED, "transcription sessions are not supported", param="session.type")
        if update.get("model") is not None and not self.accepts_model(update["model"]):
            raise ProtocolError(ErrorCode.INVALID_VALUE, f"the model cannot change within a session (served: "
                                f"{self.model.id!r})", param="session.model")
        instructions = update.get("instructions")
        if instructions is not None and len(instructions) > len(self.config.instructions):
            self.conversation.check_room(len(instructions) - len(self.config.instructions),
                                         len(self.config.instructions), param="session.instructions")
        config = self.config.model_copy(deep=True)
        config.apply(update, audio_started=self.audio_started)
        if config.tools and not self.calls_tools:
            raise ProtocolError(ErrorCode.UNSUPPORTED, f"model {self.model.id!r} does not call functions",
                                param="session.tools")
        if config.turn_detection is not None and not self.has_vad:
            raise ProtocolError(
                ErrorCode.UNSUPPORTED,
                f"model {self.model.id!r} has no voice activity detector; set turn_detection to null",
                param="session.audio.input.turn_detection",
            )
        old_vad = self.config.turn_detection
        self.config = config
        if old_vad != config.turn_detection:
            self._reset_detector()
        self._emit(server_event("session.updated", session=self.session_dict()))

    def _reset_detector(self) -> None:
        td = self.config.turn_detection
        self.detector = TurnDetector(td.threshold, td.silence_duration_ms) if td and self.has_vad else None
        if self.detector is None and self._speech_item_id is not None:
            self._speech_item_id = None

    def _on_input_audio_buffer_append(self, event: Any) -> None:
        # the JSON channel's edge: base64 and the session's input format end here
        try:
            wire = base64.b64decode(event.audio, validate=True)
        except (binascii.Error, ValueError):
            raise ProtocolError(ErrorCode.INVALID_BASE64, "audio is not valid base64", param="audio") from None
        try:
            audio = self.config.input_format.to_pcm(wire)
        except ValueError as exc:
            raise ProtocolError(ErrorCode.INVALID_AUDIO, str(exc), param="audio") from None
        self.append_audio(audio)

    def append_audio(self, audio: Pcm) -> None:
        """Input audio, decoded at its edge (a JSON append or a media track), at any rate."""
        audio = self.denoiser.process(audio)
        if self.model.duplex:
            self._actions.append(act.Listen(audio))
            return
        pcm = self.input.append(audio)
        if self.detector is not None and len(pcm):
            self._vad_pending = np.concatenate([self._vad_pending, pcm])
            frame = 512
            whole = len(self._vad_pending) // frame * frame
            if whole:
                start_ms = 1000.0 * self._vad_position / MODEL_RATE
                self._actions.append(act.DetectSpeech(self._vad_pending[:whole], start_ms))
                self._vad_position += whole
                self._vad_pending = self._vad_pending[whole:]

    def _on_input_audio_buffer_commit(self, event: Any) -> None:
        if self.input.duration_ms < MIN_COMMIT_MS:
            raise ProtocolError(
                ErrorCode.BUFFER_TOO_SMALL,
                f"buffer too small: {self.input.duration_ms:.0f} ms of audio, at least {MIN_COMMIT_MS} ms needed",
            )
        item_id = self._speech_item_id or new_id("item")
        self._speech_item_id = None
        self._drop_speculation()
        if self.detector is not None:
            self.detector.reset()
        self._commit(item_id, self.input.take())

    def _on_input_audio_buffer_clear(self, event: Any) -> None:
        self.input.clear()
        self._speech_item_id = None
        self._drop_speculation()
        if self.detector is not None:
            self.detector.reset()
        self._emit(server_event("input_audio_buffer.cleared"))

    def _on_conversation_item_create(self, event: Any) -> None:
        data = event.item.model_dump(exclude_none=True)
        item = item_from_client(data, accepts_images=self.sees, accepts_tools=self.calls_tools)
        if item.type == "function_call_output" and self.conversation.find_call(item.call_id) is None:
            raise ProtocolError(ErrorCode.ITEM_NOT_FOUND, f"no function_call item has call_id {item.call_id[:100]!r}",
                                param="item.call_id")
        for index, part in enumerate(item.content):
            if part.get("type") == "input_audio" and part.get("audio"):
                try:
                    wire = base64.b64decode(part.pop("audio"), validate=True)
                    pcm = StreamResampler(self.config.input_format.rate, MODEL_RATE).process(
                        self.config.input_format.decode(wire), last=True
                    )
                except (binascii.Error, ValueError):
                    raise ProtocolError(
                        ErrorCode.INVALID_BASE64, "audio is not valid base64 audio", param=f"item.content.{index}.audio"
                    ) from None
                item.audio16k = pcm if item.audio16k is None else np.concatenate([item.audio16k, pcm])
                if not part.get("transcript") and not self.model.hears_audio:
                    self._pending_transcripts.add(item.id)
                    self._actions.append(act.Transcribe(item.id, pcm))
        try:
            self.conversation.check_room(item.nbytes(), len(self.config.instructions), param="item")
        except ProtocolError:
            self._pending_transcripts.discard(item.id)
            self._actions = [a for a in self._actions if not (isinstance(a, act.Transcribe) and a.item_id == item.id)]
            raise
        previous = self._add_item(item, event.previous_item_id)
        self._emit(server_event("conversation.item.added", previous_item_id=previous, item=item.to_dict()))
        if item.id not in self._pending_transcripts:
            self._emit(server_event("conversation.item.done", item=item.to_dict()))

    def _add_item(self, item: Item, previous_item_id: str | None = None) -> str | None:
        """Add to the conversation; items it had to let go (MAX_ITEMS) are announced as deleted,
        so clients, the resume journal and the store all forget them."""
        previous = self.conversation.add(item, previous_item_id)
        evicted, self.conversation.evicted = self.conversation.evicted, []
        for item_id in evicted:
            self._emit(server_event("conversation.item.deleted", item_id=item_id))
        return previous

    def _on_conversation_item_retrieve(self, event: Any) -> None:
        item = self.conversation.get(event.item_id)
        self._emit(server_event("conversation.item.retrieved", item=item.to_dict()))

    def _on_conversation_item_delete(self, event: Any) -> None:
        self.conversation.delete(event.item_id)
        self._emit(server_event("conversation.item.deleted", item_id=event.item_id))

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
        heard = item.truncate_audio(event.audio_end_ms)
        self._actions.append(act.ConfirmHeard(heard))
        self._emit(
            server_event("conversation.item.truncated", item_id=item.id, content_index=0, audio_end_ms=event.audio_end_ms)
        )

    def _on_response_create(self, event: Any) -> None:
        if self.response is not None:
            raise ProtocolError(
                ErrorCode.ACTIVE_RESPONSE,
                f"conversation already has an active response in progress: {self.response.id}",
            )
        params = event.response.model_dump(exclude_unset=True) if event.response else {}
        _check_metadata(params.get("metadata"))
        if params.get("prompt"):
            raise ProtocolError(ErrorCode.UNSUPPORTED, "stored prompts are not supported by this server; send the text "
                                "as instructions", param="response.prompt")
        for index, item_id in params.get("item_references", ()):
            self.conversation.get(item_id, param=f"response.input.{index}.id")  # refused now, not mid-response
        tools, choice = tools_of(params, self.config.tools, self.config.tool_choice, "response")
        if tools and not self.calls_tools:
            raise ProtocolError(ErrorCode.UNSUPPORTED, f"model {self.model.id!r} does not call functions",
                                param="response.tools")
        self._create_response(params, tools=tools, choice=choice)

    def _on_response_cancel(self, event: Any) -> None:
        if self.response is None or (event.response_id and event.response_id != self.response.id):
            raise ProtocolError(ErrorCode.NO_ACTIVE_RESPONSE, "there is no active response to cancel", param="response_id")
        self._cancel_active("client_cancelled")

    def _on_output_audio_buffer_clear(self, event: Any) -> None:
        if self.ledger.current is None:
            raise ProtocolError(ErrorCode.INVALID_VALUE, "there is no output audio to clear yet")
        if self.response is not None:
            self._cancel_active("client_cancelled")
        self._emit(server_event("output_audio_buffer.cleared", response_id=self.ledger.current))

    # ---------------------------------------------------------------- turns
    def on_speech_probabilities(self, probabilities: list[float], start_ms: float) -> None:
        """Driver callback: VAD results for a :class:`~.actions.DetectSpeech` action."""
        if self.detector is None or self.closed:
            return
        td = self.config.turn_detection
        assert td is not None
        for decision in self.detector.feed(probabilities, start_ms):
            if isinstance(decision, SpeechStarted):
                self._idle.disarm()
                self._speech_item_id = new_id("item")
                self._speech_start_ms = max(decision.audio_start_ms - td.prefix_padding_ms, 0)
                self._emit(
                    server_event("input_audio_buffer.speech_started", audio_start_ms=decision.audio_start_ms,
                                 item_id=self._speech_item_id)
                )
                if td.interrupt_response and self.response is not None:
                    self._cancel_active("turn_detected")
            elif isinstance(decision, SilenceStarted) and self._speech_item_id is not None:
                if self.speculative and td.create_response and self.response is None:
                    self._drop_speculation()
                    self._spec_id += 1
                    self._spec_active = True
                    audio = self.input.peek(self._speech_start_ms, decision.audio_end_ms + 200)
                    self._actions.append(act.Speculate(self._spec_id, audio))
            elif isinstance(decision, SpeechResumed):
                self._drop_speculation()
            elif isinstance(decision, SpeechStopped) and self._speech_item_id is not None:
                item_id, self._speech_item_id = self._speech_item_id, None
                self._emit(server_event("input_audio_buffer.speech_stopped", audio_end_ms=decision.audio_end_ms, item_id=item_id))
                audio = self.input.take(self._speech_start_ms, decision.audio_end_ms + 200)
                spec = self._spec_id if self._spec_active else None
                self._spec_active = False  # from here the driver adopts the prepared reply or drops it
                if not self._commit(item_id, audio, spec):
                    if spec is not None:
                        self._actions.append(act.DropSpeculation(spec))
                elif td.create_response and self.response is None:
                    self._create_response({}, spec)
                elif spec is not None:
                    self._actions.append(act.DropSpeculation(spec))
        if self.response is None and self._speech_item_id is None:
            self._check_idle(start_ms + len(probabilities) * self.detector.frame_ms)

    def _check_idle(self, now_ms: float) -> None:
        td = self.config.turn_detection
        stretch = self._idle.due(now_ms, td.idle_timeout_ms if td is not None else None)
        if stretch is None or td is None:
            return
        item_id = new_id("item")
        self._emit(server_event("input_audio_buffer.timeout_triggered", audio_start_ms=stretch[0],
                                audio_end_ms=stretch[1], item_id=item_id))
        self._drop_speculation()
        self._commit(item_id, self.input.take(stretch[0], stretch[1]))
        if td.create_response:
            self._create_response({})

    def _arm_idle(self, response: Response) -> None:
        self._idle.arm(self._response_started_ms, response.item.audio_ms, 1000.0 * self._vad_position / MODEL_RATE)

    def append_image(self, rgb: np.ndarray) -> None:
        """A camera frame (newest wins); it joins the next committed user turn."""
        if self.sees:
            self._latest_image = rgb

    def _drop_speculation(self) -> None:
        if self._spec_active:
            self._spec_active = False
            self._actions.append(act.DropSpeculation(self._spec_id))

    def preview_request(self, transcript: str) -> ThinkRequest:
        """The request the next response would make if the pending user turn says ``transcript``
        (for speculation; the driver compares it with the real one before adopting)."""
        request = self._think_request(None, self.config.max_output_tokens, self.config.wants_audio,
                                      self.config.tools, self.config.tool_choice)
        request.messages = self.conversation.to_messages() + [TurnMessage(role="user", text=transcript)]
        return request

    def _commit(self, item_id: str, audio: np.ndarray, spec_id: int | None = None) -> bool:
        """Add a user audio turn; False (and an error event) when the session has no room for it."""
        item = Item(id=item_id, role="user", content=[{"type": "input_audio", "transcript": None}], audio16k=audio)
        if self._latest_image is not None:
            item.images, self._latest_image = [self._latest_image], None
        try:  # also reached from the VAD's decision, outside receive(): report, never raise
            self.conversation.check_room(item.nbytes(), len(self.config.instructions))
        except ProtocolError as exc:
            self.error(exc)
            self._emit(server_event("input_audio_buffer.cleared"))
            return False
        previous = self._add_item(item)
        self._emit(server_event("input_audio_buffer.committed", previous_item_id=previous, item_id=item_id))
        self._emit(server_event("conversation.item.added", previous_item_id=previous, item=item.to_dict()))
        if self.model.hears_audio and self.config.transcription is None:
            self._emit(server_event("conversation.item.done", item=item.to_dict()))
            return True
        self._pending_transcripts.add(item_id)
        self._actions.append(act.Transcribe(item_id, audio, spec_id))
        return True

    def on_transcription(self, item_id: str, transcript: str | None, error: str | None = None) -> None:
        """Driver callback: the transcript of a committed item (or why there is none)."""
        self._pending_transcripts.discard(item_id)
        try:
            item = self.conversation.get(item_id)
        except ProtocolError:
            item = None  # deleted meanwhile
        if item is not None:
            if error is not None:
                self._emit(
                    server_event("conversation.item.input_audio_transcription.failed", item_id=item_id, content_index=0,
                                 error={"type": "transcription_error", "code": ErrorCode.SERVER_ERROR, "message": error})
                )
            else:
                for part in item.content:
                    if part.get("type") == "input_audio":
                        part["transcript"] = transcript
                if self.config.transcription is not None:
                    seconds = 0.0 if item.audio16k is None else len(item.audio16k) / MODEL_RATE
                    self._emit(
                        server_event("conversation.item.input_audio_transcription.completed", item_id=item_id,
                                     content_index=0, transcript=transcript or "",
                                     usage={"type": "duration", "seconds": round(seconds, 3)})
                    )
            self._emit(server_event("conversation.item.done", item=item.to_dict()))
        self._maybe_start_pipeline()

    # ---------------------------------------------------------------- responses
    def _create_response(self, params: dict[str, Any], spec_id: int | None = None,
                         tools: list[ToolSpec] | None = None, choice: ToolChoice | None = None) -> None:
        cfg = self.config
        tools = cfg.tools if tools is None else tools
        choice = choice or cfg.tool_choice
        modalities = params.get("output_modalities") or cfg.output_modalities
        modalities = ["audio"] if "audio" in modalities else ["text"]
        output_format = cfg.output_format
        audio = (params.get("audio") or {}).get("output") or {}
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
            voice=cfg.voice,
            max_output_tokens=params.get("max_output_tokens") or cfg.max_output_tokens,
            in_conversation=in_conversation,
            metadata=params.get("metadata"),
            attach=self._add_item if in_conversation else None,
        )
        self.response = response
        self._idle.disarm()
        self._response_started_ms = 1000.0 * self._vad_position / MODEL_RATE
        self.ledger.begin(response.id)
        if "audio" in modalities:
            self.audio_started = True
        response.start_events(self._emit, defer_message=bool(tools) and choice.mode != "none")
        if self.rate_limits is not None:
            self._emit(server_event("rate_limits.updated", rate_limits=self.rate_limits()))
        self._pending_request = self._think_request(params.get("instructions"), response.max_output_tokens,
                                                    response.wants_audio, tools, choice)
        self._pending_input = params.get("input")
        self._pending_refs = params.get("item_references", [])
        self._pending_spec = spec_id
        self._maybe_start_pipeline()

    def _think_request(self, instructions: str | None, limit: int | str, want_audio: bool,
                       tools: list[ToolSpec], choice: ToolChoice) -> ThinkRequest:
        return ThinkRequest(
            instructions=self.config.instructions if instructions is None else instructions,
            messages=[],  # filled when the pipeline starts, after pending transcripts arrive
            max_output_tokens=None if limit == "inf" else int(limit),
            voice=self.config.voice,
            want_audio=want_audio,
            tools=list(tools),
            tool_choice=choice.mode if tools else "none",  # a session may hold "required" before its tools
            tool_name=choice.name,
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
        return [m for m in map(self.conversation.message_of, items) if m is not None]

    def _maybe_start_pipeline(self) -> None:
        response = self.response
        # a duplex model's replies come from what it hears (on_model_audio), not from a pipeline
        if response is None or response.pipeline_started or self._pending_transcripts or self.model.duplex:
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

    def on_response_usage(self, response_id: str, epoch: int, input_tokens: int, output_tokens: int, cached_tokens: int) -> None:
        response = self._live(response_id, epoch)
        if response is not None:
            response.input_tokens, response.output_tokens, response.cached_tokens = input_tokens, output_tokens, cached_tokens

    def on_response_end(self, response_id: str, epoch: int, status: str = "completed", error: str | None = None, reason: str | None = None) -> None:
        """Driver callback: the pipeline finished (or failed). Stale epochs are ignored."""
        response = self._live(response_id, epoch)
        if response is None:
            return
        err = None
        if status == "failed":
            err = {"type": "server_error", "code": ErrorCode.SERVER_ERROR, "message": error or "the model failed"}
            self._emit(server_event("error", error={**err, "param": None, "event_id": None}))
        response.finish(self._emit, status, error=err, reason=reason)  # type: ignore[arg-type]
        self.response = None
        self._arm_idle(response)

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


#: the published limits of response.metadata
MAX_METADATA_PAIRS, MAX_METADATA_KEY, MAX_METADATA_VALUE = 16, 64, 512


def _check_metadata(metadata: dict[str, str] | None) -> None:
    if not metadata:
        return
    if len(metadata) > MAX_METADATA_PAIRS:
        raise ProtocolError(ErrorCode.INVALID_VALUE, f"metadata holds at most {MAX_METADATA_PAIRS} pairs, got {len(metadata)}",
                            param="response.metadata")
    for key, value in metadata.items():
        if len(key) > MAX_METADATA_KEY or len(value) > MAX_METADATA_VALUE:
            raise ProtocolError(ErrorCode.INVALID_VALUE, f"metadata keys are at most {MAX_METADATA_KEY} characters and "
                                f"values at most {MAX_METADATA_VALUE}", param=f"response.metadata.{key[:64]}")
