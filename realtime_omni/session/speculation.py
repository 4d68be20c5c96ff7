"""A reply prepared during the pause before the end-of-turn decision.

When the user pauses, the runner transcribes what was said and runs the whole pipeline at once,
holding every output back. If the pause becomes the end of the turn and the response asks for
exactly what was prepared, the held outputs are released under the real response's id and
epoch and the rest streams live: first audio leaves as soon as the turn is confirmed. If the
user speaks on, or anything differs, it is dropped and nothing of it reaches the client.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..engines.base import ModelSession, ThinkRequest
from ..observer import Observer
from ..pipeline import PipelineSettings, ResponsePipeline, Sink
from . import actions as act
from . import inputs as inp
from .core import RealtimeSession

log = logging.getLogger(__name__)


def same_request(a: ThinkRequest, b: ThinkRequest) -> bool:
    """Whether a prepared request answers the real one (same context, same asks)."""
    return (
        a.instructions == b.instructions
        and a.want_audio == b.want_audio
        and a.voice == b.voice
        and a.speed == b.speed
        and a.max_output_tokens == b.max_output_tokens
        and (a.tools, a.tool_choice, a.tool_name, a.parallel_tool_calls) == (b.tools, b.tool_choice, b.tool_name,
                                                                          b.parallel_tool_calls)
        and [(m.role, m.text.strip(), m.call) for m in a.messages] == [(m.role, m.text.strip(), m.call) for m in b.messages]
    )


@dataclass
class Speculation:
    spec_id: int
    transcript: asyncio.Future[str | None]
    request: ThinkRequest | None = None
    task: asyncio.Task[None] | None = None
    #: outputs held back until adoption (no response id yet: stamped on at adoption)
    held: list[inp.EngineOutput] = field(default_factory=list)
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


class SpeculationHost(Protocol):
    """What speculation reads of the session that owns it (the runner), read at each use."""

    @property
    def core(self) -> RealtimeSession: ...

    @property
    def model(self) -> ModelSession | None: ...

    @property
    def executor(self) -> concurrent.futures.Executor: ...

    @property
    def pipeline_settings(self) -> PipelineSettings: ...

    @property
    def observer(self) -> Observer: ...

    @property
    def mailbox(self) -> asyncio.Queue[inp.SessionInput]: ...


class SpeculativeTurns:
    """The runner's prepared replies: at most one at a time (composed into
    :class:`~.runner.SessionRunner`, which performs the core's speculation actions through it)."""

    def __init__(self, host: SpeculationHost) -> None:
        self._host = host
        self.current: Speculation | None = None
        #: prepared replies that became the real response
        self.adopted = 0

    def start(self, action: act.Speculate) -> None:
        """Drop any prepared reply and prepare one for the audio heard so far."""
        self.drop()
        host = self._host
        if host.model is not None:
            spec = Speculation(action.spec_id, asyncio.get_running_loop().create_future())
            # the context as it is now, before the turn is committed; the transcript fills in later
            spec.request = host.core.preview_request("")
            spec.task = asyncio.create_task(self._speculate(spec, action.pcm16k))
            self.current = spec

    def drop(self) -> None:
        spec, self.current = self.current, None
        if spec is not None and not spec.adopted:
            spec.cancel()

    def discard(self, spec_id: int) -> None:
        """The user spoke on: drop that prepared reply unless it was adopted already."""
        spec = self.current
        if spec is not None and spec.spec_id == spec_id and not spec.adopted:
            self.drop()

    def reuse_transcript(self, action: act.Transcribe,
                         afresh: Callable[[act.Transcribe], Coroutine[Any, Any, None]]) -> Coroutine[Any, Any, None] | None:
        """The prepared transcript's delivery for this turn; None when none was prepared for it.
        ``afresh`` transcribes the turn itself if the prepared transcript is dropped meanwhile."""
        spec = self.current
        if spec is not None and action.spec_id == spec.spec_id:
            return self._reuse_transcript(action, spec, afresh)
        return None

    def adopt(self, action: act.StartResponse) -> Speculation | None:
        """The prepared reply released as this response if it asks for the same; else None (and
        whatever was prepared is dropped): the caller then runs the response afresh."""
        spec = self.current
        session_id = self._host.core.id
        if spec is not None and action.spec_id == spec.spec_id and spec.request is not None \
                and spec.transcript.done() and same_request(spec.request, action.request):
            log.debug("session %s: adopting prepared reply (%d outputs held)", session_id, len(spec.held))
            self._adopt(spec, action)
            return spec
        if spec is not None:
            log.debug("session %s: prepared reply does not match; starting afresh", session_id)
        self.drop()
        return None

    async def _speculate(self, spec: Speculation, pcm16k: Any) -> None:
        """Transcribe and run the whole pipeline now, holding every output until adoption."""
        host = self._host
        model = host.model
        assert model is not None
        loop = asyncio.get_running_loop()
        try:
            text = await loop.run_in_executor(host.executor, model.transcribe, pcm16k)
        except Exception as exc:  # noqa: BLE001 - the real turn transcribes again
            spec.transcript.set_exception(exc)
            return
        request = spec.request
        assert request is not None
        request.messages[-1].text = text
        spec.transcript.set_result(text)

        def current() -> bool:
            return not request.cancelled.is_set() and (not spec.adopted or host.core.epoch == spec.epoch)

        async def emit(output: inp.EngineOutput) -> None:
            if spec.adopted:
                assert spec.response_id is not None and spec.epoch is not None
                await host.mailbox.put(inp.for_response(output, spec.response_id, spec.epoch))
            else:
                spec.held.append(output)

        sink = Sink(  # the response is not known yet: an empty id and epoch 0 until adoption
            text=lambda t: emit(inp.ResponseText("", 0, t)), audio=lambda w, t: emit(inp.ResponseAudio("", 0, w, t)),
            usage=lambda i, o, c: emit(inp.ResponseUsage("", 0, i, o, c)), call=lambda piece: emit(inp.ResponseCall("", 0, piece)),
        )
        pipeline = ResponsePipeline(model, host.core.model, host.executor, host.pipeline_settings, current,
                                    host.observer)
        try:
            status, reason = await pipeline.run(0, request, host.core.config.output_format.rate, sink)
            result: tuple[str, str | None, str | None] = (status, None, reason)
        except asyncio.CancelledError:
            request.cancelled.set()
            raise
        except Exception as exc:  # noqa: BLE001 - fails the response if adopted, else nothing
            log.exception("prepared reply failed")
            result = ("failed", f"{type(exc).__name__}: {exc}", None)
        if spec.adopted:
            assert spec.response_id is not None and spec.epoch is not None
            await host.mailbox.put(inp.ResponseEnd(spec.response_id, spec.epoch, *result))
        else:
            spec.finished = result

    async def _reuse_transcript(self, action: act.Transcribe, spec: Speculation,
                                afresh: Callable[[act.Transcribe], Coroutine[Any, Any, None]]) -> None:
        text, error = None, None
        try:
            text = await asyncio.wait_for(asyncio.shield(spec.transcript), self._host.pipeline_settings.step_timeout_s)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if not spec.transcript.cancelled() or (task is not None and task.cancelling()):
                raise  # this delivery itself was cancelled (the session is closing)
            # the prepared reply was dropped before its transcript came (the user spoke again, or
            # paused again): the committed turn keeps its words, transcribed afresh
            await afresh(action)
            return
        except Exception as exc:  # noqa: BLE001
            error = str(exc) or type(exc).__name__
        await self._host.mailbox.put(inp.Transcript(action.item_id, text, error))

    def _adopt(self, spec: Speculation, action: act.StartResponse) -> None:
        """Release the held outputs under the real response (on the session task, in order)."""
        core = self._host.core
        spec.response_id, spec.epoch = action.response_id, action.epoch
        for output in spec.held:
            inp.deliver(core, inp.for_response(output, action.response_id, action.epoch))
        spec.held.clear()
        if spec.finished is not None:
            core.on_response_end(action.response_id, action.epoch, *spec.finished)
        # the response's own cancel path now reaches the prepared pipeline
        assert spec.request is not None  # adoption requires a matching prepared request
        action.request.cancelled = spec.request.cancelled
        self.current = None
        self.adopted += 1
