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
from typing import Any, Literal

import numpy as np

from ..audio import AudioFormat, Pcm, StreamResampler
from ..audio.denoise import InputDenoiser
from ..engines.base import ModelInfo, ThinkRequest
from ..mcp.servers import url_allowed
from ..protocol.errors import ErrorCode, ProtocolError
from ..protocol.server_events import server_event
from . import actions as act
from .config import SEMANTIC_CHECK_MS, SEMANTIC_MAX_WAIT_MS, SessionConfig, tools_of
from .conversation import Conversation, Item, item_from_client, new_id
from .idle import IdleTimer
from .input_buffer import MODEL_RATE, InputAudioBuffer
from .mcp_control import McpControl
from .playback import PlaybackLedger
from .response_control import ResponseControl
from .responses import Response
from .turn_control import TurnControl
from .turn_detection import (
    TurnDetector,
)

log = logging.getLogger(__name__)

MIN_COMMIT_MS = 100
#: the VAD reads 512-sample frames (32 ms at 16 kHz); a detection job holds at most 1.024 s of them
VAD_FRAME = 512
VAD_SLICE = 32 * VAD_FRAME


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


class RealtimeSession(TurnControl, ResponseControl, McpControl):
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
        end_of_turn: bool = False,
        mcp_urls: tuple[str, ...] = (),
        mcp_timeout_s: float = 15.0,
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
        #: evaluate a user's audio turn ahead of the reply, at the pause that may end it and when
        #: it is committed by hand (omni models: they hear the audio itself and keep a context)
        self.prefills_ahead = model.hears_audio
        self._spec_id = 0
        self._spec_active = False
        self.has_vad = has_vad and not model.duplex  # a duplex model takes its own turns
        #: semantic_vad can ask an end-of-turn model (else it is a silence window)
        self.end_of_turn = end_of_turn
        self.config = SessionConfig(model=model.id, mcp_urls=tuple(mcp_urls))
        self._init_mcp(mcp_timeout_s)
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
        self._prefill_ahead()  # a model's own system prompt, before anything is asked

    def _prompt_settings(self) -> tuple:
        """The settings a reply's prompt opens with (instructions and the functions declared)."""
        return self.config.instructions, tuple(self.config.tools)

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
        self.config = SessionConfig.model_validate(snapshot["config"]).model_copy(
            update={"mcp_urls": self.config.mcp_urls})
        if not self.has_vad:
            self.config.turn_detection = None
        self._reset_detector()
        for data in snapshot["items"]:
            status = data.get("status") if data.get("status") != "in_progress" else "incomplete"
            self.conversation.add(Item(id=data["id"], role=data.get("role"), type=data.get("type", "message"),
                                       status=status, content=data.get("content") or [],
                                       call_id=data.get("call_id", ""), name=data.get("name", ""),
                                       arguments=data.get("arguments", ""), output=data.get("output") or "",
                                       server_label=data.get("server_label", ""), error=data.get("error"),
                                       tools=data.get("tools") or [],
                                       approval_request_id=data.get("approval_request_id") or "",
                                       approve=bool(data.get("approve")), reason=data.get("reason")))
        self.audio_started = any(i.role == "assistant" for i in self.conversation)
        # servers the operator no longer allows leave; listed tools are not stored: ask again
        self.config.mcp = [s for s in self.config.mcp if url_allowed(s.url, self.config.mcp_urls)]
        for server in self.config.mcp:
            self._list_mcp(server)

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
        if update.get("type") not in (None, self.config.type):
            self._check_type_change(update["type"])
        if update.get("model") is not None and not self.accepts_model(update["model"]):
            raise ProtocolError(ErrorCode.INVALID_VALUE, f"the model cannot change within a session (served: "
                                f"{self.model.id!r})", param="session.model")
        instructions = update.get("instructions")
        if instructions is not None and len(instructions) > len(self.config.instructions):
            self.conversation.check_room(len(instructions) - len(self.config.instructions),
                                         len(self.config.instructions), param="session.instructions")
        config = self.config.model_copy(deep=True)
        config.apply(update, audio_started=self.audio_started)
        if (config.tools or config.mcp) and not self.calls_tools:
            raise ProtocolError(ErrorCode.UNSUPPORTED, f"model {self.model.id!r} does not call functions",
                                param="session.tools")
        if config.turn_detection is not None and not self.has_vad:
            raise ProtocolError(
                ErrorCode.UNSUPPORTED,
                f"model {self.model.id!r} has no voice activity detector; set turn_detection to null",
                param="session.audio.input.turn_detection",
            )
        old_vad, old_servers, old_prompt = self.config.turn_detection, self.config.mcp, self._prompt_settings()
        self.config = config
        if old_vad != config.turn_detection:
            self._reset_detector()
        self._emit(server_event("session.updated", session=self.session_dict()))
        self._mcp_servers_changed(old_servers)  # the update is acknowledged, then the listing starts
        if self._prompt_settings() != old_prompt:
            # what every reply's prompt starts with changed: the model may evaluate it now, so
            # that the first reply after it evaluates only the user's turn
            self._prefill_ahead()

    def _check_type_change(self, kind: str) -> None:
        if kind == "transcription" and "transcription" not in self.model.capabilities:
            raise ProtocolError(ErrorCode.UNSUPPORTED, f"model {self.model.id!r} does not transcribe",
                                param="session.type")
        if self.response is not None:
            raise ProtocolError(ErrorCode.ACTIVE_RESPONSE, f"the session type cannot change while response "
                                f"{self.response.id} is in progress", param="session.type")

    def start_as(self, kind: Literal["realtime", "transcription"]) -> None:
        """Open as a transcription session (``?intent=transcription``), before :meth:`start`."""
        if kind != self.config.type:
            self._check_type_change(kind)
            self.config.become(kind)

    def _reset_detector(self) -> None:
        td = self.config.turn_detection
        if td is None or not self.has_vad:
            self.detector = None
        elif td.type == "semantic_vad" and self.end_of_turn:
            self.detector = TurnDetector(td.threshold, SEMANTIC_MAX_WAIT_MS[td.eagerness or "auto"],
                                         check_after_ms=SEMANTIC_CHECK_MS)
        else:
            self.detector = TurnDetector(td.threshold, td.silence_duration_ms)
        if self.detector is None and self._speech_item_id is not None:
            self._speech_item_id = None

    def _on_input_audio_buffer_append(self, event: Any) -> None:
        # the JSON channel's edge: base64 and the session's input format end here
        try:
            wire = binascii.a2b_base64(event.audio, strict_mode=True)  # (b64decode: a regex pass first)
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
            whole = len(self._vad_pending) // VAD_FRAME * VAD_FRAME
            # in slices: every session's VAD shares a two-thread pool, and one client appending
            # minutes of audio at once must not hold a thread for seconds while others wait
            for lo in range(0, whole, VAD_SLICE):
                hi = min(lo + VAD_SLICE, whole)
                start_ms = 1000.0 * (self._vad_position + lo) / MODEL_RATE
                self._actions.append(act.DetectSpeech(self._vad_pending[lo:hi], start_ms))
            self._vad_position += whole
            self._vad_pending = self._vad_pending[whole:]

    def _on_input_audio_buffer_commit(self, event: Any) -> None:
        tail = self.input.end_streams()  # the whole of what was appended, the resamplers' delay included
        if self.detector is not None and len(tail):  # the VAD's clock keeps step with the buffer's
            self._vad_pending = np.concatenate([self._vad_pending, tail])
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
        if self._commit(item_id, self.input.take()):
            self._prefill_ahead()  # the client asks for the reply itself, usually a moment later

    def _on_input_audio_buffer_clear(self, event: Any) -> None:
        self.input.clear(streams=True)
        self._speech_item_id = None
        self._drop_speculation()
        if self.detector is not None:
            self.detector.reset()
        self._emit(server_event("input_audio_buffer.cleared"))

    def _on_conversation_item_create(self, event: Any) -> None:
        data = event.item.model_dump(exclude_none=True)
        item = item_from_client(data, accepts_images=self.sees, accepts_tools=self.calls_tools)
        if item.type == "mcp_approval_response":
            self._check_approval(item)
        if item.type == "function_call_output" and self.conversation.find_call(item.call_id) is None:
            raise ProtocolError(ErrorCode.ITEM_NOT_FOUND, f"no function_call item has call_id {item.call_id[:100]!r}",
                                param="item.call_id")
        for index, part in enumerate(item.content):
            if part.get("type") == "input_audio" and part.get("audio"):
                param = f"item.content.{index}.audio"
                try:
                    wire = binascii.a2b_base64(part.pop("audio"), strict_mode=True)
                except (binascii.Error, ValueError):
                    raise ProtocolError(ErrorCode.INVALID_BASE64, "audio is not valid base64", param=param) from None
                try:
                    pcm = StreamResampler(self.config.input_format.rate, MODEL_RATE).process(
                        self.config.input_format.decode(wire), last=True
                    )
                except ValueError as exc:  # e.g. an odd byte count of 16-bit PCM
                    raise ProtocolError(ErrorCode.INVALID_AUDIO, str(exc), param=param) from None
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

    def _on_response_create(self, event: Any) -> None:
        if not self.config.responds:
            raise ProtocolError(ErrorCode.UNSUPPORTED, "a transcription session does not create responses; "
                                "session.update with type 'realtime' first", param="type")
        if self.response is not None:
            raise ProtocolError(
                ErrorCode.ACTIVE_RESPONSE,
                f"conversation already has an active response in progress: {self.response.id}",
            )
        params = event.response.model_dump(exclude_unset=True) if event.response else {}
        _check_metadata(params.get("metadata"))
        voice = ((params.get("audio") or {}).get("output") or {}).get("voice")
        if voice is not None:
            self.config.voice_for(voice, self.audio_started, "response.audio.output.voice")
        if params.get("prompt"):
            raise ProtocolError(ErrorCode.UNSUPPORTED, "stored prompts are not supported by this server; send the text "
                                "as instructions", param="response.prompt")
        for index, item_id in params.get("item_references", ()):
            self.conversation.get(item_id, param=f"response.input.{index}.id")  # refused now, not mid-response
        tools, _, choice = tools_of(params, self.config.tools, self.config.mcp, self.config.tool_choice, "response",
                                    self.config.mcp_urls)
        self._with_mcp(tools, choice)  # an MCP choice whose tool is not listed: refused now
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
