"""How a session's runner performs what its core asks (:mod:`.actions`): the VAD and a duplex
model inline, in audio order; transcription and responses as tasks that report back through the
mailbox (:mod:`.inputs`). Composed into :class:`~.runner.SessionRunner`, which it reads through
:class:`PerformerHost`; it owns the tasks it starts.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
from typing import Any, Protocol

from ..audio.end_of_turn import COMPLETE, EndOfTurnModel
from ..engines.base import ModelSession, ThinkRequest, VADStream
from ..observer import Observer
from ..pipeline import PipelineSettings, ResponsePipeline, Sink
from . import actions as act
from . import inputs as inp
from .core import RealtimeSession
from .speculation import SpeculativeTurns

log = logging.getLogger(__name__)


class PerformerHost(Protocol):
    """What the performer reads of the runner that owns it, read at each use."""

    @property
    def core(self) -> RealtimeSession: ...

    @property
    def model(self) -> ModelSession | None: ...

    @property
    def vad(self) -> VADStream | None: ...

    @property
    def executor(self) -> concurrent.futures.Executor: ...

    @property
    def vad_executor(self) -> concurrent.futures.Executor: ...

    @property
    def end_of_turn(self) -> EndOfTurnModel | None: ...

    @property
    def pipeline_settings(self) -> PipelineSettings: ...

    @property
    def observer(self) -> Observer: ...

    @property
    def mailbox(self) -> asyncio.Queue[inp.SessionInput]: ...

    @property
    def speculation(self) -> SpeculativeTurns: ...


class ActionPerformer:
    def __init__(self, host: PerformerHost) -> None:
        self._host = host
        #: the live response's pipeline (or the adopted prepared reply's)
        self.response_task: asyncio.Task[None] | None = None
        #: transcriptions in flight
        self.side_tasks: set[asyncio.Task[None]] = set()
        #: MCP calls in flight, by response (a cancelled response stops its calls)
        self._mcp_calls: dict[str, set[asyncio.Task[None]]] = {}

    def running(self) -> list[asyncio.Task[None]]:
        """The tasks still running (the runner cancels them when the session ends)."""
        return [t for t in [self.response_task, *self.side_tasks] if t is not None and not t.done()]

    async def perform(self, action: act.Action) -> None:
        match action:
            case act.DetectSpeech():
                # Inline (not a side task): turn decisions must follow the audio order.
                await self._detect_speech(action)
            case act.Listen():
                # Inline, like the VAD: what the model says back must follow the audio order.
                await self._listen(action)
            case act.Speculate():
                self._host.speculation.start(action)
            case act.Prefill(request):
                self._spawn(self._prefill(request))
            case act.CheckTurnEnd():
                self._spawn(self._check_turn_end(action))
            case act.DropSpeculation(spec_id):
                self._host.speculation.discard(spec_id)
            case act.Transcribe():
                reuse = self._host.speculation.reuse_transcript(action, self._transcribe)
                self._spawn(reuse if reuse is not None else self._transcribe(action))
            case act.StartResponse():
                adopted = self._host.speculation.adopt(action)
                if adopted is not None:
                    self.response_task = adopted.task
                else:
                    self.response_task = asyncio.create_task(self._respond(action))
            case act.CancelResponse(response_id):
                task = self.response_task
                if task is not None and not task.done():
                    task.cancel()
                for call in self._mcp_calls.pop(response_id, set()):
                    call.cancel()  # the server is told, and its answer is not waited for
            case act.ConfirmHeard(text):
                await self._confirm(text)
            case act.ListMcpTools():
                self._spawn(self._list_mcp_tools(action))
            case act.CallMcpTool():
                task = self._spawn(self._call_mcp_tool(action))
                self._mcp_calls.setdefault(action.response_id, set()).add(task)
                task.add_done_callback(lambda done, rid=action.response_id: self._mcp_call_ended(rid, done))
            case act.CloseSession():
                pass  # the loop in SessionRunner._run sees core.closed

    async def _detect_speech(self, action: act.DetectSpeech) -> None:
        host = self._host
        if host.vad is None:
            return
        try:
            probs = await asyncio.wait_for(
                asyncio.get_running_loop().run_in_executor(host.vad_executor, host.vad.probabilities, action.pcm16k),
                host.pipeline_settings.step_timeout_s)
        except Exception:  # noqa: BLE001 - a VAD failure (or hang) costs these frames, not the session
            log.exception("VAD failed in session %s", host.core.id)
            return
        host.core.on_speech_probabilities(probs, action.start_ms)

    async def _listen(self, action: act.Listen) -> None:
        host = self._host
        if host.model is None:
            return
        if host.model.listens_inline:
            said = host.model.listen(action.audio)
            if said is not None:
                host.core.on_model_audio(said)
            return
        try:
            said = await asyncio.wait_for(
                asyncio.get_running_loop().run_in_executor(host.vad_executor, host.model.listen, action.audio),
                host.pipeline_settings.step_timeout_s)
        except Exception:  # noqa: BLE001 - a failed step costs this piece of audio, not the session
            log.exception("duplex model failed in session %s", host.core.id)
            return
        if said is not None:
            host.core.on_model_audio(said)

    async def _confirm(self, text: str) -> None:
        model = self._host.model
        if model is None:
            return
        # Bookkeeping, not inference: off the model pool so a busy pool cannot stall it.
        try:
            await asyncio.wait_for(asyncio.to_thread(model.confirm, text), self._host.pipeline_settings.step_timeout_s)
        except Exception:  # noqa: BLE001 - the next turn re-sends the whole conversation
            log.exception("confirm failed in session %s", self._host.core.id)

    def _mcp_call_ended(self, response_id: str, task: asyncio.Task[None]) -> None:
        calls = self._mcp_calls.get(response_id)
        if calls is not None:
            calls.discard(task)
            if not calls:
                del self._mcp_calls[response_id]

    def _spawn(self, coro: Any) -> asyncio.Task[None]:
        task = asyncio.create_task(coro)
        self.side_tasks.add(task)
        task.add_done_callback(self.side_tasks.discard)
        return task

    async def _check_turn_end(self, action: act.CheckTurnEnd) -> None:
        """Ask the end-of-turn model about the user's pause; without an answer (no model, a
        failure, a timeout) the silence window ends the turn as server_vad would."""
        model = self._host.end_of_turn
        if model is None:
            return
        try:
            probability = await asyncio.wait_for(
                asyncio.get_running_loop().run_in_executor(self._host.vad_executor, model.probability, action.pcm16k),
                self._host.pipeline_settings.step_timeout_s)
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 - the silence window still ends the turn
            log.exception("end-of-turn model failed in session %s", self._host.core.id)
            return
        await self._host.mailbox.put(inp.TurnEndVerdict(action.check, probability >= COMPLETE, probability))

    async def _prefill(self, request: ThinkRequest) -> None:
        """Evaluate the conversation ahead of the reply; a failure or a timeout only costs the
        reply that time (it evaluates whatever it does not find)."""
        model = self._host.model
        if model is None:
            return
        try:
            await asyncio.wait_for(asyncio.get_running_loop().run_in_executor(self._host.executor, model.prefill, request),
                                   self._host.pipeline_settings.step_timeout_s)
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 - only speed is lost
            log.exception("prefill ahead of the reply failed in session %s", self._host.core.id)

    async def _transcribe(self, action: act.Transcribe) -> None:
        loop = asyncio.get_running_loop()
        text, error = None, None
        try:
            if self._host.model is None:
                raise RuntimeError("this model cannot transcribe")
            text = await asyncio.wait_for(
                loop.run_in_executor(self._host.executor, self._host.model.transcribe, action.pcm16k),
                self._host.pipeline_settings.step_timeout_s,
            )
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - reported to the client as transcription.failed
            log.exception("transcription failed")
            error = str(exc) or type(exc).__name__
        await self._host.mailbox.put(inp.Transcript(action.item_id, text, error))

    async def _list_mcp_tools(self, action: act.ListMcpTools) -> None:
        from ..mcp.client import McpFailure, list_tools

        try:
            tools = await list_tools(action.server, action.timeout_s)
        except McpFailure as exc:
            await self._host.mailbox.put(inp.McpToolsListed(action.item_id, (), exc.error))
            return
        except Exception as exc:  # noqa: BLE001 - the listing must end either way
            log.exception("MCP listing failed in session %s", self._host.core.id)
            error = {"type": "http_error", "code": 500, "message": f"listing failed ({type(exc).__name__})"}
            await self._host.mailbox.put(inp.McpToolsListed(action.item_id, (), error))
            return
        await self._host.mailbox.put(inp.McpToolsListed(action.item_id, tuple(tools)))

    async def _call_mcp_tool(self, action: act.CallMcpTool) -> None:
        """Run the call; a response cancelled meanwhile drops the result (its epoch is stale)."""
        from ..mcp.client import McpFailure, call_tool

        output, error = "", None
        try:
            arguments = json.loads(action.arguments or "{}")
            if not isinstance(arguments, dict):
                raise ValueError("the arguments are not a JSON object")
            output = await call_tool(action.server, action.tool, arguments, action.timeout_s)
        except McpFailure as exc:
            error = exc.error
        except ValueError as exc:
            error = {"type": "tool_execution_error", "message": f"invalid arguments: {exc}"[:500]}
        except Exception as exc:  # noqa: BLE001 - the response must hear back whatever happened
            log.exception("MCP call failed in session %s", self._host.core.id)
            error = {"type": "tool_execution_error", "message": f"the call failed ({type(exc).__name__})"}
        await self._host.mailbox.put(inp.McpCallDone(action.response_id, action.epoch, action.item_id, output, error))

    async def _respond(self, action: act.StartResponse) -> None:
        rid, epoch = action.response_id, action.epoch
        host = self._host
        assert host.model is not None
        pipeline = ResponsePipeline(host.model, host.core.model, host.executor, host.pipeline_settings,
                                    lambda: host.core.epoch == epoch, host.observer)
        sink = Sink(
            text=lambda text: self._host.mailbox.put(inp.ResponseText(rid, epoch, text)),
            audio=lambda pcm, text: self._host.mailbox.put(inp.ResponseAudio(rid, epoch, pcm, text)),
            usage=lambda i, o, c: self._host.mailbox.put(inp.ResponseUsage(rid, epoch, i, o, c)),
            call=lambda piece: self._host.mailbox.put(inp.ResponseCall(rid, epoch, piece)),
        )
        try:
            status, reason = await pipeline.run(epoch, action.request, action.output_format.rate, sink)
            await self._host.mailbox.put(inp.ResponseEnd(rid, epoch, status, None, reason))
        except asyncio.CancelledError:
            action.request.cancelled.set()
            raise
        except Exception as exc:  # noqa: BLE001 - fails this response, never the server
            log.exception("response %s failed", rid)
            await self._host.mailbox.put(inp.ResponseEnd(rid, epoch, "failed", f"{type(exc).__name__}: {exc}", None))
