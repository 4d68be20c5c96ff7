"""A reply prepared during the pause before the end-of-turn decision.

When the user pauses, the runner transcribes what was said and runs the whole pipeline at once,
holding every output back. If the pause becomes the end of the turn and the response asks for
exactly what was prepared, the held outputs are released under the real response's id and
epoch and the rest streams live: first audio leaves as soon as the turn is confirmed. If the
user speaks on, or anything differs, it is dropped and nothing of it reaches the client.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..engines.base import ThinkRequest
from ..pipeline import ResponsePipeline, Sink
from . import actions as act

if TYPE_CHECKING:
    from .runner import SessionRunner

log = logging.getLogger(__name__)


def same_request(a: ThinkRequest, b: ThinkRequest) -> bool:
    """Whether a prepared request answers the real one (same context, same asks)."""
    return (
        a.instructions == b.instructions
        and a.want_audio == b.want_audio
        and a.voice == b.voice
        and a.max_output_tokens == b.max_output_tokens
        and (a.tools, a.tool_choice, a.tool_name) == (b.tools, b.tool_choice, b.tool_name)
        and [(m.role, m.text.strip(), m.call) for m in a.messages] == [(m.role, m.text.strip(), m.call) for m in b.messages]
    )


@dataclass
class Speculation:
    spec_id: int
    transcript: asyncio.Future[str | None]
    request: ThinkRequest | None = None
    task: asyncio.Task[None] | None = None
    #: outputs held back until adoption: ("text", t) / ("audio", wire, t) / ("usage", i, o, c) / ("call", piece)
    held: list[tuple[Any, ...]] = field(default_factory=list)
    #: (status, error, reason) once the prepared pipeline finished before adoption
    finished: tuple[str, str | None, str | None] | None = None
    response_id: str | None = None
    epoch: int | None = None

    @property
    def adopted(self) -> bool:
        return self.response_id is not None

    def cancel(self) -> None:
        if self.request is not None:
            self.request.cancelled.set()
        if self.task is not None:
            self.task.cancel()
        if not self.transcript.done():
            self.transcript.cancel()


class SpeculativeTurns:
    """The runner's side of speculation (mixed into :class:`~.runner.SessionRunner`)."""

    _spec: Speculation | None
    speculations_adopted: int

    def _drop_speculation(self: SessionRunner) -> None:
        spec, self._spec = self._spec, None
        if spec is not None and not spec.adopted:
            spec.cancel()

    async def _speculate(self: SessionRunner, spec: Speculation, pcm16k: Any) -> None:
        """Transcribe and run the whole pipeline now, holding every output until adoption."""
        assert self.model is not None
        loop = asyncio.get_running_loop()
        try:
            text = await loop.run_in_executor(self.executor, self.model.transcribe, pcm16k)
        except Exception as exc:  # noqa: BLE001 - the real turn transcribes again
            spec.transcript.set_exception(exc)
            return
        request = spec.request
        assert request is not None
        request.messages[-1].text = text
        spec.transcript.set_result(text)

        def current() -> bool:
            return not request.cancelled.is_set() and (not spec.adopted or self.core.epoch == spec.epoch)

        async def emit(*item: Any) -> None:
            if spec.adopted:
                await self.mailbox.put((item[0], spec.response_id, spec.epoch, *item[1:]))
            else:
                spec.held.append(item)

        sink = Sink(
            text=lambda t: emit("text", t), audio=lambda w, t: emit("audio", w, t), usage=lambda i, o, c: emit("usage", i, o, c),
            call=lambda piece: emit("call", piece),
        )
        pipeline = ResponsePipeline(self.model, self.core.model, self.executor, self.pipeline_settings, current,
                                    self.observer)
        try:
            status, reason = await pipeline.run(0, request, self.core.config.output_format, sink)
            result: tuple[str, str | None, str | None] = (status, None, reason)
        except asyncio.CancelledError:
            request.cancelled.set()
            raise
        except Exception as exc:  # noqa: BLE001 - fails the response if adopted, else nothing
            log.exception("prepared reply failed")
            result = ("failed", f"{type(exc).__name__}: {exc}", None)
        if spec.adopted:
            await self.mailbox.put(("end", spec.response_id, spec.epoch, *result))
        else:
            spec.finished = result

    async def _reuse_transcript(self: SessionRunner, item_id: str, spec: Speculation) -> None:
        text, error = None, None
        try:
            text = await asyncio.wait_for(asyncio.shield(spec.transcript), self.pipeline_settings.step_timeout_s)
        except asyncio.CancelledError:
            if not spec.transcript.cancelled():
                raise
            error = "transcription was cancelled"
        except Exception as exc:  # noqa: BLE001
            error = str(exc) or type(exc).__name__
        await self.mailbox.put(("transcript", item_id, text, error))

    def _adopt(self: SessionRunner, spec: Speculation, action: act.StartResponse) -> None:
        """Release the held outputs under the real response (on the session task, in order)."""
        core = self.core
        spec.response_id, spec.epoch = action.response_id, action.epoch
        for item in spec.held:
            kind, args = item[0], item[1:]
            if kind == "text":
                core.on_response_text(action.response_id, action.epoch, *args)
            elif kind == "audio":
                core.on_response_audio(action.response_id, action.epoch, *args)
            elif kind == "call":
                core.on_response_call(action.response_id, action.epoch, *args)
            else:
                core.on_response_usage(action.response_id, action.epoch, *args)
        spec.held.clear()
        if spec.finished is not None:
            core.on_response_end(action.response_id, action.epoch, *spec.finished)
        # the response's own cancel path now reaches the prepared pipeline
        assert spec.request is not None  # adoption requires a matching prepared request
        action.request.cancelled = spec.request.cancelled
        self._response_task = spec.task
        self._spec = None
        self.speculations_adopted += 1

