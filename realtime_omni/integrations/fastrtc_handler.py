"""A FastRTC stream handler that talks to a realtime_omni server over ``/v1/realtime``.

Use it as the handler of a FastRTC ``Stream`` (``pip install 'realtime-omni[fastrtc]'``)::

    from fastrtc import Stream
    from realtime_omni.integrations.fastrtc_handler import RealtimeOmniHandler

    Stream(handler=RealtimeOmniHandler(url="http://127.0.0.1:8000"), modality="audio",
           mode="send-receive").ui.launch()

The browser's microphone reaches :meth:`receive` as ``(sample_rate, int16 array)``; it is resampled
(soxr, stateful) to the server's 24 kHz pcm16 and appended with the ``openai`` SDK. The server's
VAD decides turns. Reply audio is resampled to ``output_sample_rate`` and handed to FastRTC by
:meth:`emit`; when the caller starts speaking (``input_audio_buffer.speech_started``) the queued
reply audio is dropped at once (barge-in). Transcripts come out as ``AdditionalOutputs``
(``{"role": "user"|"assistant", "content": text}``).

fastrtc (and gradio) are optional: this module imports without them, and
:class:`RealtimeOmniHandler` is built on first use.
"""

from __future__ import annotations

import asyncio
import base64
import logging
from collections import Counter
from typing import Any

import numpy as np

from ..audio.resample import StreamResampler

log = logging.getLogger(__name__)

SERVER_RATE = 24_000  # audio/pcm on the Realtime API
AUDIO_DELTAS = ("response.output_audio.delta", "response.audio.delta")
ASSISTANT_TRANSCRIPTS = ("response.output_audio_transcript.done", "response.audio_transcript.done")
#: bound of the reply-audio queue (frames of ~100 ms); the oldest is dropped past it
MAX_QUEUED_FRAMES = 600

_CLASS: type | None = None


def _fastrtc() -> Any:
    try:
        import fastrtc
    except ImportError as exc:
        raise ImportError(
            "the FastRTC handler needs fastrtc and gradio: pip install 'realtime-omni[fastrtc]'"
        ) from exc
    return fastrtc


def _to_int16(array: np.ndarray) -> np.ndarray:
    array = np.asarray(array)
    if array.ndim > 1:  # FastRTC gives (channels, samples): (1, n) for mono
        if min(array.shape) == 1:
            array = array.reshape(-1)
        else:
            array = array.mean(axis=0 if array.shape[0] < array.shape[-1] else -1).astype(array.dtype)
    if np.issubdtype(array.dtype, np.floating):
        return (np.clip(array, -1.0, 1.0) * 32767).astype(np.int16)
    return array.astype(np.int16, copy=False)


def _build() -> type:
    fastrtc = _fastrtc()

    class RealtimeOmniHandler(fastrtc.AsyncStreamHandler):  # type: ignore[misc, name-defined]
        """FastRTC ``AsyncStreamHandler`` bridging to a realtime_omni server (see the module doc)."""

        def __init__(
            self,
            url: str = "http://127.0.0.1:8000",
            *,
            model: str = "embedded",
            instructions: str | None = None,
            voice: str | None = None,
            api_key: str = "realtime-omni",
            transcription: bool = True,
            silence_duration_ms: int | None = None,
            input_sample_rate: int = 48_000,
            output_sample_rate: int = SERVER_RATE,
        ) -> None:
            super().__init__(expected_layout="mono", output_sample_rate=output_sample_rate,
                             input_sample_rate=input_sample_rate)
            self.url = url.rstrip("/")
            self.model = model
            self.instructions = instructions
            self.voice = voice
            self.api_key = api_key
            self.transcription = transcription
            self.silence_duration_ms = silence_duration_ms
            self.output_queue: asyncio.Queue[Any] = asyncio.Queue()
            self.connected = asyncio.Event()
            self.stats: Counter[str] = Counter()
            self._connection: Any = None
            self._in: StreamResampler | None = None
            self._out = StreamResampler(SERVER_RATE, output_sample_rate)
            self._closing = False

        def copy(self) -> "RealtimeOmniHandler":
            return RealtimeOmniHandler(
                self.url, model=self.model, instructions=self.instructions, voice=self.voice, api_key=self.api_key,
                transcription=self.transcription, silence_duration_ms=self.silence_duration_ms,
                input_sample_rate=self.input_sample_rate, output_sample_rate=self.output_sample_rate,
            )

        # -- the connection: one task reads server events for the whole stream --------
        def _session(self) -> dict[str, Any]:
            vad: dict[str, Any] = {"type": "server_vad", "interrupt_response": True, "create_response": True}
            if self.silence_duration_ms is not None:
                vad["silence_duration_ms"] = self.silence_duration_ms
            audio_in: dict[str, Any] = {"format": {"type": "audio/pcm", "rate": SERVER_RATE}, "turn_detection": vad}
            if self.transcription:
                audio_in["transcription"] = {"model": "whisper-1"}
            audio_out: dict[str, Any] = {"format": {"type": "audio/pcm", "rate": SERVER_RATE}}
            if self.voice:
                audio_out["voice"] = self.voice
            session: dict[str, Any] = {"type": "realtime", "output_modalities": ["audio"],
                                       "audio": {"input": audio_in, "output": audio_out}}
            if self.instructions:
                session["instructions"] = self.instructions
            return session

        async def start_up(self) -> None:
            from openai import AsyncOpenAI

            ws = "ws" + self.url[len("http"):] if self.url.startswith("http") else self.url
            client = AsyncOpenAI(api_key=self.api_key, base_url=f"{self.url}/v1", websocket_base_url=f"{ws}/v1")
            try:
                async with client.realtime.connect(model=self.model) as connection:
                    await connection.session.update(session=self._session())  # type: ignore[arg-type]
                    self._connection = connection  # audio may flow now: it queues behind the update
                    async for event in connection:
                        if event.type == "session.updated":
                            self.connected.set()  # the session exists and is configured
                        await self._on_event(event)
            except Exception as exc:  # noqa: BLE001 - the stream ends; FastRTC keeps serving others
                if not self._closing:
                    log.warning("realtime_omni connection ended: %s", exc)
            finally:
                self._connection = None
                self.connected.clear()

        async def _on_event(self, event: Any) -> None:
            kind = event.type
            if kind in AUDIO_DELTAS:
                pcm = np.frombuffer(base64.b64decode(event.delta), dtype="<i2")
                pcm = self._out.process(pcm)
                if len(pcm):
                    self._put((self.output_sample_rate, pcm.reshape(1, -1)))
                    self.stats["audio_frames"] += 1
            elif kind == "input_audio_buffer.speech_started":
                self._barge_in()
            elif kind == "conversation.item.input_audio_transcription.completed":
                self._put(fastrtc.AdditionalOutputs({"role": "user", "content": event.transcript}))
            elif kind in ASSISTANT_TRANSCRIPTS:
                self._put(fastrtc.AdditionalOutputs({"role": "assistant", "content": event.transcript}))
            elif kind == "error":
                self.stats["errors"] += 1
                log.warning("realtime_omni error: %s", getattr(event, "error", event))

        def _put(self, item: Any) -> None:
            if self.output_queue.qsize() >= MAX_QUEUED_FRAMES:
                self.output_queue.get_nowait()  # bounded: the oldest frame gives way
                self.stats["dropped_frames"] += 1
            self.output_queue.put_nowait(item)

        def _barge_in(self) -> None:
            """The user speaks: what is queued of the reply must not play any more."""
            self.stats["speech_started"] += 1
            kept = []
            while not self.output_queue.empty():
                item = self.output_queue.get_nowait()
                if isinstance(item, tuple):
                    self.stats["cleared_frames"] += 1
                else:
                    kept.append(item)  # transcripts still go out
            for item in kept:
                self.output_queue.put_nowait(item)
            self._out.reset()
            clear = getattr(self, "_clear_queue", None)  # FastRTC's own playout queue
            if callable(clear):
                clear()

        # -- FastRTC interface -------------------------------------------------------------
        async def receive(self, frame: tuple[int, np.ndarray]) -> None:
            connection = self._connection
            if connection is None:
                return
            rate, array = frame
            if self._in is None or self._in.in_rate != rate:
                self._in = StreamResampler(rate, SERVER_RATE)
            pcm = self._in.process(_to_int16(array))
            if len(pcm):
                await connection.input_audio_buffer.append(audio=base64.b64encode(pcm.astype("<i2").tobytes()).decode())

        async def emit(self) -> Any:
            return await fastrtc.wait_for_item(self.output_queue)

        async def shutdown(self) -> None:  # type: ignore[override]
            self._closing = True
            connection, self._connection = self._connection, None
            if connection is not None:
                await connection.close()

    return RealtimeOmniHandler


def __getattr__(name: str) -> Any:
    global _CLASS
    if name == "RealtimeOmniHandler":
        if _CLASS is None:
            _CLASS = _build()
        return _CLASS
    raise AttributeError(name)
