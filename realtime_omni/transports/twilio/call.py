"""One phone call: a Twilio Media Stream on one side, a realtime session on the other.

The reader (:meth:`TwilioCall.run`) turns Twilio frames into session input; one writer task
(:meth:`TwilioCall._write`) owns every send to Twilio: reply audio as 20 ms ``media`` frames, a
``mark`` after each delta, and ``clear`` on barge-in. Twilio never sees Realtime JSON events, so
the application gets them (and telephony extension events such as ``telephony.dtmf``) through
listeners on the call; see :func:`realtime_omni.transports.twilio.set_call_hook`.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from starlette.websockets import WebSocket, WebSocketDisconnect, WebSocketState

from ...audio import AudioFormat
from ...protocol.server_events import server_event
from ...session.core import Outgoing
from ...session.manager import SessionLimitError, SessionManager, UnknownModelError
from ...session.runner import SessionRunner
from . import messages as tw
from .playback import CarrierPlayback

log = logging.getLogger(__name__)

SEND_TIMEOUT_S = 10.0
Listener = Callable[[dict[str, Any]], Any]
#: customParameters of ``<Stream>`` that configure the session (others reach the app's hook only)
SESSION_PARAMETERS = ("instructions", "voice", "model")


#: the customParameter that carries the voice webhook's single-use stream token
STREAM_TOKEN_PARAMETER = "stream_token"
#: a stream must say ``start`` this soon after connecting
START_TIMEOUT_S = 15.0


class TwilioCall:
    def __init__(self, websocket: WebSocket, manager: SessionManager, hook: Callable[["TwilioCall"], Any] | None = None,
                 redeem: Callable[[str], bool] | None = None) -> None:
        self.websocket = websocket
        self.manager = manager
        self._hook = hook
        #: when telephony is authenticated: checks (and uses up) the stream token the voice
        #: webhook put in the TwiML; no session opens without it
        self._redeem = redeem
        self.info: tw.StartInfo | None = None
        self.runner: SessionRunner | None = None
        self.playback = CarrierPlayback()
        self.stats: Counter[str] = Counter()
        self.started_at = time.monotonic()
        #: set once the call is over (stop, disconnect, send failure): nothing more goes to Twilio
        self.stopped = False
        self._listeners: list[Listener] = []
        self._writer: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._active: str | None = None  # the response in progress, as the writer saw it
        self._close_code = 1000

    # ------------------------------------------------------------------ application API
    @property
    def stream_sid(self) -> str | None:
        return self.info.stream_sid if self.info else None

    @property
    def call_sid(self) -> str | None:
        return self.info.call_sid if self.info else None

    def add_listener(self, listener: Listener) -> None:
        """``listener(event)`` gets every server event of the session and the ``telephony.*``
        extension events. Call it from the hook; it runs on the event loop, so keep it short
        (a coroutine it returns is run as a task)."""
        self._listeners.append(listener)

    async def send_event(self, event: dict[str, Any]) -> None:
        """Inject a Realtime client event (e.g. ``response.create`` after a DTMF digit)."""
        if self.runner is not None:
            await self.runner.submit(json.dumps(event))

    # ------------------------------------------------------------------ reader
    async def run(self) -> None:
        await self.websocket.accept()
        reason = "client_disconnected"
        try:
            while True:
                if self.info is None:  # a socket that never says who it is does not linger
                    message = await asyncio.wait_for(self.websocket.receive(), START_TIMEOUT_S)
                else:
                    message = await self.websocket.receive()
                if message["type"] == "websocket.disconnect":
                    break
                raw = message.get("text")
                if raw is None:
                    raw = message.get("bytes") or b""
                if not await self._handle(raw):
                    reason = "twilio_stop"
                    break
        except WebSocketDisconnect:
            pass
        except asyncio.TimeoutError:
            log.info("twilio stream: no 'start' within %.0f s; closing", START_TIMEOUT_S)
            self._close_code = 1008
        except Exception:  # noqa: BLE001 - one bad call must not take the server down
            log.exception("twilio call %s failed", self.call_sid)
            self._close_code = 1011
        finally:
            await self._close(reason)

    async def _handle(self, raw: str | bytes) -> bool:
        """One frame from Twilio; False ends the call."""
        self.stats["frames_in"] += 1
        try:
            message = tw.parse(raw)
            event = message["event"]
            if event == "media":
                await self._on_media(message)
            elif event == "mark":
                self._on_mark(message)
            elif event == "start":
                return await self._on_start(message)
            elif event == "dtmf":
                await self._on_dtmf(message)
            elif event == "stop":
                log.info("twilio call %s: stop after %.1f s", self.call_sid, time.monotonic() - self.started_at)
                return False
            elif event == "connected":
                log.debug("twilio stream connected (protocol %s %s)", message.get("protocol"), message.get("version"))
            else:
                self._reject("unknown_event", f"unknown event {event[:40]!r}")
        except tw.TwilioMessageError as exc:
            self._reject("bad_frame", str(exc))
        return True

    def _reject(self, kind: str, why: str) -> None:
        """Log and ignore bad input; logging thins out after the first few of a kind."""
        self.stats[kind] += 1
        count = self.stats[kind]
        if count <= 3 or count in (10, 100, 1000) or count % 10_000 == 0:
            log.warning("twilio call %s: ignored %s (%s; %d so far)", self.call_sid or "-", kind, why, count)

    async def _on_start(self, message: dict[str, Any]) -> bool:
        if self.info is not None:
            self._reject("second_start", "the stream already started")
            return True
        info = tw.parse_start(message)
        problem = tw.media_format_problem(info.media_format)
        if problem:
            log.error("twilio call %s: unsupported media format (%s); hanging up", info.call_sid, problem)
            self._close_code = 1003
            return False
        params = info.custom_parameters
        token = params.pop(STREAM_TOKEN_PARAMETER, None)  # never passed on to listeners
        if self._redeem is not None and not (token and self._redeem(token)):
            log.warning("twilio call %s: stream without a valid token; hanging up", info.call_sid)
            self._close_code = 1008
            return False
        try:
            runner = self.manager.open(params.get("model") or None, transport="twilio")
        except (SessionLimitError, UnknownModelError) as exc:
            log.error("twilio call %s: no session (%s); hanging up", info.call_sid, exc)
            self._close_code = 1013 if isinstance(exc, SessionLimitError) else 1008
            return False
        self.info, self.runner = info, runner
        runner.journal.keep_audio = False  # the carrier plays it; nothing replays it
        log.info("twilio call %s: stream %s → session %s (model %s)",
                 info.call_sid, info.stream_sid, runner.core.id, runner.core.model.id)
        await runner.submit(json.dumps({"type": "session.update", "session": self._session_config(params)}))
        if self._hook is not None:
            try:
                result = self._hook(self)
                if inspect.isawaitable(result):
                    await result
            except Exception:  # noqa: BLE001
                log.exception("twilio call hook failed")
        self._notify(self._extension("telephony.call.started", custom_parameters=params, session_id=runner.core.id))
        self._writer = asyncio.create_task(self._write(runner), name=f"twilio-writer-{info.stream_sid}")
        return True

    def _session_config(self, params: dict[str, str]) -> dict[str, Any]:
        assert self.runner is not None
        core = self.runner.core
        audio_in: dict[str, Any] = {"format": {"type": "audio/pcmu"}}
        # Server VAD decides turns; speech over a reply interrupts it (and we clear the carrier).
        audio_in["turn_detection"] = (
            {"type": "server_vad", "interrupt_response": True, "create_response": True} if core.has_vad else None
        )
        if "transcription" in core.model.capabilities:
            audio_in["transcription"] = {"model": "whisper-1"}
        audio_out: dict[str, Any] = {"format": {"type": "audio/pcmu"}}
        if params.get("voice"):
            audio_out["voice"] = params["voice"]
        session: dict[str, Any] = {"type": "realtime", "output_modalities": ["audio"],
                                   "audio": {"input": audio_in, "output": audio_out}}
        if params.get("instructions"):
            session["instructions"] = params["instructions"]
        return session

    async def _on_media(self, message: dict[str, Any]) -> None:
        if self.runner is None:
            self._reject("media_before_start", "media before start")
            return
        track, audio = tw.parse_media(message)
        if track not in ("inbound", "inbound_track"):
            return  # a both_tracks stream also carries our own audio back: not the caller
        self.stats["media_in"] += 1
        # the telephony edge: what carriers send is μ-law, whatever the session's format
        await self.runner.submit_audio(AudioFormat.PCMU.to_pcm(audio))

    def _on_mark(self, message: dict[str, Any]) -> None:
        heard = self.playback.on_mark(tw.parse_mark(message))
        if heard is not None and self.runner is not None:
            self.stats["marks_heard"] += 1
            self.runner.heard(*heard)  # playback truth for the next barge-in

    async def _on_dtmf(self, message: dict[str, Any]) -> None:
        digit = tw.parse_dtmf(message)
        if self.runner is None:
            self._reject("dtmf_before_start", "dtmf before start")
            return
        self.stats["dtmf"] += 1
        log.info("twilio call %s: DTMF %s", self.call_sid, digit)
        # The model's context sees the key press as a user turn...
        item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": f"[DTMF {digit}]"}]}
        await self.runner.submit(json.dumps({"type": "conversation.item.create", "item": item}))
        # ...and the application gets the GA event (OpenAI sends it on SIP calls) and the extension
        # event, which also names the call.
        received = time.time()
        self._notify({"event_id": f"event_dtmf_{int(received * 1000)}",
                      **server_event("input_audio_buffer.dtmf_event_received", event=digit, received_at=int(received))})
        self._notify(self._extension("telephony.dtmf", digit=digit))

    # ------------------------------------------------------------------ writer
    async def _write(self, runner: SessionRunner) -> None:
        """The only task that sends to Twilio."""
        while True:
            out = await runner.next_outgoing()
            if out is None:
                break
            event = out.event
            kind = event.get("type")
            self._notify(event)  # first: the application sees the session's decision as it is made
            try:
                if kind == "response.output_audio.delta" and out.audio is not None:
                    await self._send_audio(runner, out)
                elif kind == "input_audio_buffer.speech_started":
                    await self._barge_in(runner)
                elif kind == "response.created":
                    self._active = event["response"]["id"]
                elif kind == "response.done":
                    await self._response_done(event["response"])
                elif kind == "error":
                    log.warning("twilio call %s: session error %s", self.call_sid, event.get("error"))
            except Exception:  # noqa: BLE001 - a writer bug must not leave the session without a reader
                log.exception("twilio writer failed on %s", kind)
        if not self.stopped:  # the session ended on its own (idle, max duration): hang up
            self.stopped = True
            await self._hang_up(1000)

    async def _send(self, text: str) -> None:
        if self.stopped:
            return
        try:
            await asyncio.wait_for(self.websocket.send_text(text), SEND_TIMEOUT_S)
        except (WebSocketDisconnect, RuntimeError, ConnectionError, asyncio.TimeoutError, OSError):
            # Gone, or not reading for SEND_TIMEOUT_S: hang up, so the reader wakes and frees the session.
            self.stopped = True
            self._spawn(self._hang_up(1011))

    async def _hang_up(self, code: int) -> None:
        try:
            await self.websocket.close(code=code)
        except (RuntimeError, WebSocketDisconnect, OSError):
            pass

    async def _send_audio(self, runner: SessionRunner, out: Outgoing) -> None:
        assert self.info is not None and out.response_id is not None and out.audio is not None
        if runner.is_stale(out.epoch):
            return  # fenced off by a barge-in after it was queued
        # the telephony edge: the carrier takes μ-law, whatever the session's output format
        frames, name = self.playback.frames(out.response_id, AudioFormat.PCMU.from_pcm(out.audio))
        await self._send_frames(frames, name)

    async def _send_frames(self, frames: list[bytes], name: str | None) -> None:
        assert self.info is not None
        for frame in frames:
            await self._send(tw.media(self.info.stream_sid, frame))
        if name is not None:
            await self._send(tw.mark(self.info.stream_sid, name))
        self.stats["frames_out"] += len(frames)

    async def _barge_in(self, runner: SessionRunner) -> None:
        """The caller started speaking: drop whatever the carrier still holds, at once."""
        assert self.info is not None
        active = self._active
        if not (self.playback.busy or active):
            return
        await self._send(tw.clear(self.info.stream_sid))
        self.stats["clears"] += 1
        for response_id in self.playback.clear():
            # the session truncates a complete but partly heard reply to the heard marks (a
            # task: the writer never waits on the session's mailbox while the session waits on us)
            self._spawn(runner.playback_cut(response_id))
        self._notify(self._extension("telephony.clear", response_id=active))

    async def _response_done(self, response: dict[str, Any]) -> None:
        assert self.info is not None
        response_id, status = response["id"], response.get("status", "")
        if status == "completed":
            frames, name = self.playback.frames(response_id, b"", final=True)  # pad and send the tail
            await self._send_frames(frames, name)
        elif self.playback.pending_of(response_id):
            await self._send(tw.clear(self.info.stream_sid))  # cancelled: its queued audio is stale
            self.playback.clear()
            self.stats["clears"] += 1
        if self._active == response_id:
            self._active = None

    # ------------------------------------------------------------------ events and cleanup
    def _extension(self, kind: str, **fields: Any) -> dict[str, Any]:
        return {"type": kind, "call_sid": self.call_sid, "stream_sid": self.stream_sid, **fields}

    def _notify(self, event: dict[str, Any]) -> None:
        for listener in self._listeners:
            try:
                result = listener(event)
                if inspect.isawaitable(result):
                    self._spawn(result)
            except Exception:  # noqa: BLE001 - an application bug must not break the call
                log.exception("twilio call listener failed on %s", event.get("type"))

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _close(self, reason: str) -> None:
        """Free everything on every exit path: session, writer, listener tasks, the socket."""
        self.stopped = True
        if self.runner is not None:
            await self.runner.close(reason)
        if self._writer is not None:
            try:
                await asyncio.wait_for(self._writer, SEND_TIMEOUT_S)
            except (asyncio.TimeoutError, Exception):  # noqa: BLE001
                self._writer.cancel()
        if self.info is not None:
            self._notify(self._extension("telephony.call.ended", reason=reason, stats=dict(self.stats)))
            log.info("twilio call %s ended (%s): %s", self.call_sid, reason, dict(self.stats))
        if self._tasks:  # listener coroutines get a moment to finish, then are cancelled
            _, late = await asyncio.wait(set(self._tasks), timeout=2.0)
            for task in late:
                task.cancel()
            await asyncio.gather(*late, return_exceptions=True)
        self._listeners.clear()
        if self.websocket.client_state is WebSocketState.CONNECTED:
            await self._hang_up(self._close_code)
