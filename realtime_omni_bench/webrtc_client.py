"""A small aiortc client of ``/v1/realtime/calls``: for tests, benchmarks and examples.

It does what a browser does: an audio track (fed from numpy, paced in real time), the
``oai-events`` data channel, an SDP offer POSTed to the server, the answer applied. Received audio
is kept with its arrival times; server events are kept in order.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import httpx
import numpy as np
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from aiortc.jitterbuffer import JitterBuffer
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack
from av import Packet

from realtime_omni.transports.webrtc.ice import gather_on, rtc_ice_servers
from realtime_omni.transports.webrtc.incoming import (
    ImmediateAudioJitterBuffer,
    InlineAudioDecoder,
    frame_to_mono,
)
from realtime_omni.transports.webrtc.opus import OpusPacketEncoder

RATE = 48_000
FRAME = 960


class PcmSource(MediaStreamTrack):
    """A microphone made of numpy: queued int16 48 kHz audio, silence when there is none."""

    kind = "audio"

    def __init__(self, on_frame: Callable[[int, float, np.ndarray], None] | None = None) -> None:
        super().__init__()
        self._pending: deque[np.ndarray] = deque()
        self._buffer = np.zeros(0, dtype=np.int16)
        self._start: float | None = None
        self._index = 0
        self._on_frame = on_frame
        self._encoder: OpusPacketEncoder | None = None
        self.skipped_frames = 0  # frames this client was too late to send (see catch_up)

    def play(self, pcm48k: np.ndarray) -> float:
        """Queue audio; returns its duration in seconds."""
        self._pending.append(np.asarray(pcm48k, dtype=np.int16))
        return len(pcm48k) / RATE

    def catch_up(self, max_late_s: float = 0.06) -> int:
        """Skip the frames whose time passed more than ``max_late_s`` ago, as a microphone does
        when its reader stalls (a browser's audio thread never sends a catch-up burst; a loaded
        benchmark process would, and the server's live playout would drop the backlog). Returns
        how many were skipped; their queued audio is dropped with them."""
        if self._start is None:
            return 0
        late = time.monotonic() - (self._start + self._index * FRAME / RATE)
        if late <= max_late_s:
            return 0
        skip = int(late * RATE / FRAME)
        self._index += skip
        self.skipped_frames += skip
        drop = skip * FRAME
        while drop > 0 and (len(self._buffer) or self._pending):
            if not len(self._buffer):
                self._buffer = self._pending.popleft()
            n = min(drop, len(self._buffer))
            self._buffer, drop = self._buffer[n:], drop - n
        return skip

    @property
    def queued_s(self) -> float:
        return (len(self._buffer) + sum(len(p) for p in self._pending)) / RATE

    def clear(self) -> None:
        self._pending.clear()
        self._buffer = np.zeros(0, dtype=np.int16)

    async def recv(self) -> Packet:
        if self.readyState != "live":
            raise MediaStreamError
        if self._start is None:
            self._start = time.monotonic()
        due = self._start + self._index * FRAME / RATE
        now = time.monotonic()
        if due > now:
            await asyncio.sleep(due - now)
        while len(self._buffer) < FRAME and self._pending:
            self._buffer = np.concatenate([self._buffer, self._pending.popleft()])
        if len(self._buffer) >= FRAME:
            samples, self._buffer = self._buffer[:FRAME], self._buffer[FRAME:]
        else:
            samples = np.zeros(FRAME, dtype=np.int16)
            samples[: len(self._buffer)] = self._buffer
            self._buffer = np.zeros(0, dtype=np.int16)
        if self._on_frame is not None:
            self._on_frame(self._index, time.monotonic(), samples)
        # Encoded here, as the server's track does: aiortc only packs the packet (no thread hop,
        # no pure-Python audio level), so the clients cost less than the server they measure.
        if self._encoder is None:
            self._encoder = OpusPacketEncoder(rate=RATE)  # a browser microphone: 48 kHz
        packet = self._encoder.encode(samples, self._index * FRAME)
        self._index += 1
        assert packet is not None  # libopus returns one packet per 20 ms frame
        return packet


class WebRTCClient:
    def __init__(
        self,
        base_url: str,
        *,
        model: str | None = None,
        session: dict[str, Any] | None = None,
        addresses: list[str] | None = ("127.0.0.1",),  # type: ignore[assignment]
        jitter_prefetch: int | None = 1,
        keep_audio_s: float = 120.0,
        on_frame_sent: Callable[[int, float, np.ndarray], None] | None = None,
        on_frame_received: Callable[[float, np.ndarray], None] | None = None,
        data_channel: bool = True,
        audio: bool = True,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.session = session
        self.addresses = list(addresses) if addresses else None
        self.jitter_prefetch = jitter_prefetch
        self.pc = RTCPeerConnection(RTCConfiguration(iceServers=rtc_ice_servers([])))
        self.source = PcmSource(on_frame_sent)
        self.events: list[dict[str, Any]] = []
        self._event_added = asyncio.Event()
        self.channel: Any = None
        self._want_channel = data_channel
        self._want_audio = audio
        self.call_id: str | None = None
        self.location: str | None = None
        self.received: deque[tuple[float, np.ndarray]] = deque(maxlen=int(keep_audio_s * 50))
        self._on_frame_received = on_frame_received
        self._tasks: list[asyncio.Task[Any]] = []
        self._opened = asyncio.Event()
        self.frames_received = 0

    # ------------------------------------------------------------------ connect
    async def connect(self, timeout: float = 15.0) -> None:
        pc = self.pc
        if self._want_audio:
            transceiver = pc.addTransceiver(self.source, direction="sendrecv")
            if self.jitter_prefetch is not None:  # 0: decode each packet on arrival
                buffer = (ImmediateAudioJitterBuffer() if self.jitter_prefetch <= 0
                          else JitterBuffer(capacity=16, prefetch=self.jitter_prefetch))
                setattr(transceiver.receiver, "_RTCRtpReceiver__jitter_buffer", buffer)
        if self._want_channel:
            self.channel = pc.createDataChannel("oai-events")
            self.channel.on("open", self._opened.set)
            self.channel.on("message", self._on_message)
        pc.on("track", self._on_track)
        offer = await pc.createOffer()
        await gather_on(pc, self.addresses)
        await pc.setLocalDescription(offer)
        status, body, headers = await self.post_offer(pc.localDescription.sdp)
        if status != 201:
            raise ConnectionError(f"POST /v1/realtime/calls: {status} {body}")
        self.location = headers.get("location")
        self.call_id = (self.location or "").rsplit("/", 1)[-1] or None
        await pc.setRemoteDescription(RTCSessionDescription(sdp=body, type="answer"))
        if self._want_channel:
            await asyncio.wait_for(self._opened.wait(), timeout)

    async def post_offer(self, sdp: str) -> tuple[int, str, httpx.Headers]:
        params = {"model": self.model} if self.model else None
        async with httpx.AsyncClient(timeout=30.0) as http:
            if self.session is None:
                r = await http.post(f"{self.base_url}/v1/realtime/calls", params=params, content=sdp,
                                    headers={"Content-Type": "application/sdp"})
            else:
                files = {"sdp": (None, sdp, "application/sdp"), "session": (None, json.dumps(self.session), "application/json")}
                r = await http.post(f"{self.base_url}/v1/realtime/calls", params=params, files=files)
        return r.status_code, r.text, r.headers

    def _on_track(self, track: Any) -> None:
        if track.kind == "audio":
            for transceiver in self.pc.getTransceivers():
                if transceiver.receiver.track is track:  # before aiortc starts its decoder thread
                    InlineAudioDecoder.install(transceiver.receiver)
            self._tasks.append(asyncio.ensure_future(self._read_audio(track)))

    async def _read_audio(self, track: Any) -> None:
        while True:
            try:
                frame = await track.recv()
            except MediaStreamError:
                return
            now = time.monotonic()
            pcm = frame_to_mono(frame)
            self.frames_received += 1
            self.received.append((now, pcm))
            if self._on_frame_received is not None:
                self._on_frame_received(now, pcm)

    def _on_message(self, message: str | bytes) -> None:
        self.events.append(json.loads(message))
        self._event_added.set()

    # ------------------------------------------------------------------ use
    def send(self, event: dict[str, Any]) -> None:
        self.channel.send(json.dumps(event))

    async def wait_for(
        self, kind: str, timeout: float = 10.0, start: int = 0, where: Callable[[dict[str, Any]], bool] | None = None
    ) -> dict[str, Any]:
        """The first event of type ``kind`` at index ≥ ``start`` (waiting for it if needed)."""
        deadline = time.monotonic() + timeout
        index = start
        while True:
            while index < len(self.events):
                event = self.events[index]
                index += 1
                if event.get("type") == kind and (where is None or where(event)):
                    return event
            left = deadline - time.monotonic()
            if left <= 0:
                seen = [e.get("type") for e in self.events[start:]]
                raise TimeoutError(f"no {kind} within {timeout} s; saw {seen[-30:]}")
            self._event_added.clear()
            try:
                await asyncio.wait_for(self._event_added.wait(), left)
            except asyncio.TimeoutError:
                pass

    def audio_since(self, t0: float) -> np.ndarray:
        parts = [pcm for at, pcm in self.received if at >= t0]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int16)

    async def hangup(self) -> int:
        if self.call_id is None:
            return 0
        async with httpx.AsyncClient(timeout=10.0) as http:
            r = await http.delete(f"{self.base_url}/v1/realtime/calls/{self.call_id}")
        return r.status_code

    async def close(self, hangup: bool = True) -> None:
        if hangup:
            try:
                await self.hangup()
            except httpx.HTTPError:
                pass
        self.source.stop()
        await self.pc.close()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
