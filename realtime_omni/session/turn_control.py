"""Turns of a :class:`~.core.RealtimeSession`: speech detection results, idle timeouts, commits
of the input buffer, transcription results and the speculative reply prepared while the user
speaks. A mixin of the session (its state lives there); split out of ``core.py`` by topic."""

from __future__ import annotations

import numpy as np

from ..engines.base import ThinkRequest, TurnMessage
from ..protocol.errors import ErrorCode, ProtocolError
from ..protocol.server_events import server_event
from . import actions as act
from .conversation import Item, new_id
from .input_buffer import MODEL_RATE
from .responses import Response
from .turn_detection import (
    SilenceStarted,
    SpeechResumed,
    SpeechStarted,
    SpeechStopped,
    TurnCheck,
)


class TurnControl:
    """Mixed into :class:`~.core.RealtimeSession` (``self`` is the session)."""

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
                if td.create_response and self.config.responds and self.response is None:
                    # the audio the turn will hold if this pause ends it
                    audio = self.input.peek(self._speech_start_ms, decision.audio_end_ms + 200)
                    if self.speculative:
                        self._drop_speculation()
                        self._spec_id += 1
                        self._spec_active = True
                        self._actions.append(act.Speculate(self._spec_id, audio))
                    else:
                        self._prefill_ahead(self._user_audio_message(audio))
            elif isinstance(decision, SpeechResumed):
                self._drop_speculation()
            elif isinstance(decision, TurnCheck) and self._speech_item_id is not None:
                # semantic_vad: the end-of-turn model hears the turn so far, the pause included
                audio = self.input.peek(self._speech_start_ms, decision.audio_end_ms + 200)
                self._actions.append(act.CheckTurnEnd(decision, audio))
            elif isinstance(decision, SpeechStopped) and self._speech_item_id is not None:
                self._end_turn(decision)
        if self.response is None and self._speech_item_id is None:
            self._check_idle(start_ms + len(probabilities) * self.detector.frame_ms)

    def _end_turn(self, decision: SpeechStopped) -> None:
        """The user's turn is over: commit it, then answer (or let a prepared reply go)."""
        td = self.config.turn_detection
        assert td is not None and self._speech_item_id is not None
        item_id, self._speech_item_id = self._speech_item_id, None
        self._emit(server_event("input_audio_buffer.speech_stopped", audio_end_ms=decision.audio_end_ms, item_id=item_id))
        audio = self.input.take(self._speech_start_ms, decision.audio_end_ms + 200)
        spec = self._spec_id if self._spec_active else None
        self._spec_active = False  # from here the driver adopts the prepared reply or drops it
        if not self._commit(item_id, audio, spec):
            if spec is not None:
                self._actions.append(act.DropSpeculation(spec))
        elif td.create_response and self.config.responds and self.response is None:
            self._create_response({}, spec)
        elif spec is not None:
            self._actions.append(act.DropSpeculation(spec))

    def on_turn_end_verdict(self, check: TurnCheck, complete: bool, probability: float) -> None:
        """Driver callback: the end-of-turn model's answer for a :class:`~.actions.CheckTurnEnd`.

        Finished: the turn ends now, at the pause the model heard, unless the user has spoken
        again since. Unfinished: the silence window (long, by eagerness) decides as usual."""
        if self.detector is None or self.closed or self._speech_item_id is None or not complete:
            return
        stopped = self.detector.end_now(check)
        if stopped is not None:
            self._end_turn(stopped)

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
        if td.create_response and self.config.responds:
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
        return self._next_request(TurnMessage(role="user", text=transcript))

    def _next_request(self, pending: TurnMessage | None) -> ThinkRequest:
        """The request a response with the session's settings would make now, with the
        conversation plus ``pending`` (a user turn not committed yet)."""
        request = self._think_request(None, self.config.max_output_tokens, self.config.wants_audio,
                                      self.config.tools, self.config.tool_choice)
        request.messages = self.conversation.to_messages() + ([pending] if pending is not None else [])
        return request

    def _prefill_ahead(self, pending: TurnMessage | None = None) -> None:
        """Let the model evaluate the conversation (plus the ``pending`` user turn) before the
        reply is asked for. Only where the reply will read the same messages: audio turns whose
        text stays empty (no transcription configured), no response running."""
        if not self.prefills_ahead or self.config.transcription is not None or self.response is not None:
            return
        self._actions.append(act.Prefill(self._next_request(pending)))

    def _user_audio_message(self, audio: np.ndarray) -> TurnMessage:
        """A committed audio turn as the thinker will read it (see :meth:`_commit`)."""
        images = [self._latest_image] if self._latest_image is not None else []
        return TurnMessage(role="user", text="", audio=audio, images=images)

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
                    if transcript:
                        # the engines transcribe a committed turn in one pass: one delta, the whole text
                        self._emit(server_event("conversation.item.input_audio_transcription.delta", item_id=item_id,
                                                content_index=0, delta=transcript))
                    self._emit(
                        server_event("conversation.item.input_audio_transcription.completed", item_id=item_id,
                                     content_index=0, transcript=transcript or "",
                                     usage={"type": "duration", "seconds": round(seconds, 3)})
                    )
            self._emit(server_event("conversation.item.done", item=item.to_dict()))
        self._maybe_start_pipeline()
