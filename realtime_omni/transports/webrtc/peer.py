"""One WebRTC call: an RTCPeerConnection around one session runner.

Inputs: the ``oai-events`` data channel (client JSON events, in order, into
:meth:`SessionRunner.submit`, on a task), the microphone (each packet decoded as it arrives and
handed to :class:`~.incoming.MicrophoneSink`) and, for models that see, the camera
(:func:`~.video.pump_video_in`, on a task). One writer task owns every send on
the data channel: the session's events (audio deltas go to the outgoing track instead, never on
the channel) and the track's ``output_audio_buffer.*`` notifications. Every exit path —
hang-up, data channel or connection closed, peer gone silent, session ended, server shutdown —
goes through :meth:`Peer.hangup`, which releases the session, the tasks and the connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from aiortc.jitterbuffer import JitterBuffer

from ...audio import StreamResampler
from ...protocol.errors import ErrorCode
from ...protocol.server_events import event_text
from ...session.runner import SessionRunner
from .ice import filter_offer_candidates, gather_on, loopback_only, rtc_ice_servers
from .incoming import (
    AudioInputStats,
    ImmediateAudioJitterBuffer,
    InlineAudioDecoder,
    MicrophoneSink,
    pump_audio_in,
)
from .pacing import PacketLength
from .tracks import OutgoingAudioTrack, at_track_rate, server_event
from .avatar import AvatarTrack
from .video import VideoSampler, pump_video_in

log = logging.getLogger(__name__)

EVENTS_LABEL = "oai-events"
_HIGH_WATER = 1 << 20  # bytes buffered on the data channel before the writer waits
_INBOX = 256


@dataclass
class WebRTCOptions:
    ice_servers: list[dict[str, Any]] = field(default_factory=list)
    #: addresses to gather host candidates on (None: every non-loopback interface, via aioice)
    local_addresses: list[str] | None = None
    #: aiortc's receive jitter buffer holds this many frames before decoding (aiortc: 4 = 80 ms);
    #: 0: each packet is decoded on arrival (:class:`~.incoming.ImmediateAudioJitterBuffer`)
    jitter_prefetch: int = 0
    video_fps: float = 1.0
    #: a caller that asks to receive video gets the avatar track (a face speaking the replies)
    avatar: bool = True
    avatar_size: tuple[int, int] = (320, 240)
    avatar_fps: float = 15.0
    #: the data channel must open within this long after the connection is up
    datachannel_timeout_s: float = 5.0
    #: ICE + DTLS must connect within this long after the answer
    connect_timeout_s: float = 15.0
    #: no media or event from the peer for this long: the peer is gone (0 disables)
    peer_timeout_s: float = 10.0
    #: outgoing audio queued on the track at most (the session paces ~1.5 s ahead)
    max_queue_ms: float = 5000.0
    #: live streams (echo) keep at most this much backlog on the track
    live_max_ms: float = 100.0
    #: audio per outgoing Opus packet (20, 40 or 60 ms, or "auto": see :class:`~.pacing.PacketLength`)
    audio_packet_ms: int | str = "auto"
    audio_busy_calls: int = 32
    #: chooses each call's packet length (the call registry sets it; None: 20 ms, or the fixed length)
    packet_length: Callable[[], int] | None = None


class Peer:
    def __init__(
        self, call_id: str, runner: SessionRunner, options: WebRTCOptions, on_closed: Callable[[Peer], None]
    ) -> None:
        self.id = call_id
        self.runner = runner
        self.options = options
        #: a lost peer leaves its session resumable this long (a new offer with the token)
        self.resume_grace_s = 0.0
        #: digest of the API key the call belongs to (None: keys are off)
        self.owner: str | None = None
        runner.kick = lambda: self.hangup("superseded")  # a resume elsewhere takes the session over
        runner.journal.keep_audio = False  # the track plays it: a resume never replays audio
        self._on_closed = on_closed
        self.pc = RTCPeerConnection(RTCConfiguration(iceServers=rtc_ice_servers(options.ice_servers)))
        live = options.live_max_ms if runner.core.model.duplex else None  # duplex (echo): a live stream, not paced ahead
        # without a call registry (which counts the server's calls): this call alone
        packets = options.packet_length or PacketLength.from_setting(
            options.audio_packet_ms, options.audio_busy_calls, lambda: 1)
        self.track = OutgoingAudioTrack(runner, self._note, options.max_queue_ms, live, packet_ms=packets(),
                                        packet_length=packets)
        self.video = VideoSampler(options.video_fps, enabled=self.sees)
        #: the video sent back, when the caller's offer asks to receive video (see answer)
        self.avatar: AvatarTrack | None = None
        self.audio_in = AudioInputStats()
        self.microphone = MicrophoneSink(runner, self.audio_in)
        #: decodes the microphone in the loop (None: aiortc's decoder thread does)
        self.decoder: InlineAudioDecoder | None = None
        self.channel: Any | None = None
        self.created_at = time.monotonic()
        self.connected_at: float | None = None
        self.hangup_reason: str | None = None
        self.closed = asyncio.Event()
        self._notes: deque[dict[str, Any]] = deque(maxlen=256)
        #: set when the writer has something to do: the session queued an event, the track noted
        #: one, the data channel opened (one wake-up per event, not a task and a wait set)
        self._wake = asyncio.Event()
        self._inbox: asyncio.Queue[str | bytes] = asyncio.Queue(_INBOX)
        self._channel_open = asyncio.Event()
        self._connected = asyncio.Event()
        self._early: deque[dict[str, Any]] = deque(maxlen=1024)  # events before the channel opened
        #: a resume's replay, sent first and whole: the session's journal already bounds it (a
        #: trimmed replay would lose session.resumed itself while telling the client gap=false)
        self._preface: list[dict[str, Any]] = []
        self._tasks: set[asyncio.Task[Any]] = set()
        self._closer: asyncio.Task[None] | None = None
        self._last_activity = time.monotonic()
        self._resamplers: dict[int, StreamResampler] = {}
        self.events_sent = 0
        self.events_received = 0
        self.audio_deltas = 0

    @property
    def sees(self) -> bool:
        return "image_in" in self.runner.core.model.capabilities

    # ------------------------------------------------------------------ setup
    async def answer(self, offer_sdp: str) -> str:
        """Apply the offer, attach the tracks, gather, and return the answer SDP."""
        pc = self.pc
        pc.on("datachannel", self._on_datachannel)
        pc.on("track", self._on_track)
        pc.on("connectionstatechange", self._on_connection_state)
        addresses = self.options.local_addresses
        offer = filter_offer_candidates(offer_sdp, loopback_only(addresses))
        await pc.setRemoteDescription(RTCSessionDescription(sdp=offer, type="offer"))
        audio_seen = video_seen = False
        for transceiver in pc.getTransceivers():
            if transceiver.kind == "audio" and not audio_seen:
                audio_seen = True
                transceiver.sender.replaceTrack(self.track)
                transceiver.direction = "sendrecv"
                self._tune_jitter_buffer(transceiver.receiver)
                self.decoder = InlineAudioDecoder.install(transceiver.receiver)
                if self.decoder is not None:
                    self.decoder.sink = self.microphone
            elif transceiver.kind == "video" and not video_seen:
                video_seen = True
                # the offer's direction, seen from here: "sendonly"/"sendrecv" mean the caller
                # receives; the camera comes in only for a model that can see
                send = self.options.avatar and transceiver._offerDirection in ("sendrecv", "sendonly")
                if send:
                    width, height = self.options.avatar_size
                    self.avatar = AvatarTrack(lambda: self.track.level, width, height, self.options.avatar_fps)
                    transceiver.sender.replaceTrack(self.avatar)
                transceiver.direction = {(True, True): "sendrecv", (True, False): "sendonly",
                                         (False, True): "recvonly", (False, False): "inactive"}[(send, self.sees)]
            else:  # extra m-lines: nothing flows
                transceiver.direction = "inactive"
        await gather_on(pc, addresses)
        answer = await pc.createAnswer()
        await pc.setLocalDescription(answer)
        self._spawn(self._writer(), "writer")
        self._spawn(self._reader(), "reader")
        self._spawn(self._watchdog(), "watchdog")
        return pc.localDescription.sdp

    def _tune_jitter_buffer(self, receiver: Any) -> None:
        # aiortc 1.16 hard-codes JitterBuffer(capacity=16, prefetch=4) for audio: 4 frames = 80 ms
        # before the first decode. A server feeding a VAD/ASR needs no playout smoothing: 0
        # releases each packet on arrival (ImmediateAudioJitterBuffer); 1-3 keep aiortc's buffer
        # with that prefetch (which holds each frame until the next packet arrives, +20 ms).
        name = "_RTCRtpReceiver__jitter_buffer"
        prefetch = self.options.jitter_prefetch
        if prefetch >= 4 or not hasattr(receiver, name):
            return
        buffer = ImmediateAudioJitterBuffer() if prefetch <= 0 else JitterBuffer(capacity=16, prefetch=prefetch)
        setattr(receiver, name, buffer)

    def _spawn(self, coro: Any, name: str) -> None:
        task = asyncio.create_task(coro, name=f"webrtc-{self.id}-{name}")
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("call %s: task %s failed", self.id, task.get_name(), exc_info=task.exception())
            self.hangup("server_error")

    # ------------------------------------------------------------------ aiortc callbacks
    def _on_datachannel(self, channel: Any) -> None:
        if self.channel is None and channel.label == EVENTS_LABEL:
            self.channel = channel
            channel.bufferedAmountLowThreshold = _HIGH_WATER // 4
            channel.on("message", self._on_message)
            channel.on("close", lambda: self.hangup("data_channel_closed"))
            self._channel_open.set()
            self._wake.set()
            return
        why = (
            f"only one {EVENTS_LABEL!r} data channel is supported"
            if channel.label == EVENTS_LABEL
            else f"unsupported data channel {channel.label!r}; events go on {EVENTS_LABEL!r}"
        )
        log.info("call %s: closing data channel %r: %s", self.id, channel.label, why)
        self._note(server_event("error", error={
            "type": "invalid_request_error", "code": ErrorCode.UNSUPPORTED_DATA_CHANNEL, "message": why,
            "param": None, "event_id": None}))
        channel.close()

    def _on_message(self, message: str | bytes) -> None:
        self._last_activity = time.monotonic()
        self.events_received += 1
        try:
            self._inbox.put_nowait(message)
        except asyncio.QueueFull:  # overflow policy: refuse the event, tell the client
            self._note(server_event("error", error={
                "type": "invalid_request_error", "code": ErrorCode.RATE_LIMIT_EXCEEDED,
                "message": "too many events in flight on the data channel; event dropped",
                "param": None, "event_id": None}))

    def _on_track(self, track: Any) -> None:
        if track.kind == "audio":
            if self.decoder is None:  # aiortc decodes in its thread: read the track
                self._spawn(pump_audio_in(track, self.microphone), "audio-in")
        elif track.kind == "video":
            self._spawn(pump_video_in(track, self.video, self.runner.submit_image), "video-in")

    def _on_connection_state(self) -> None:
        state = self.pc.connectionState
        if state == "connected":
            self.connected_at = self.connected_at or time.monotonic()
            self._connected.set()
        elif state in ("failed", "closed"):
            self.hangup(f"connection_{state}")

    def _note(self, event: dict[str, Any]) -> None:
        self._notes.append(event)
        self._wake.set()

    # ------------------------------------------------------------------ tasks
    async def _reader(self) -> None:
        """Data channel → session, in arrival order, with the runner's backpressure."""
        while True:
            message = await self._inbox.get()
            await self.runner.submit(message)
            if self.runner.closed.is_set():
                return

    async def _watchdog(self) -> None:
        opts = self.options
        try:
            await asyncio.wait_for(self._connected.wait(), opts.connect_timeout_s)
        except asyncio.TimeoutError:
            self.hangup("connect_timeout")
            return
        try:
            await asyncio.wait_for(self._channel_open.wait(), opts.datachannel_timeout_s)
        except asyncio.TimeoutError:
            log.warning("call %s: no %r data channel within %.1f s", self.id, EVENTS_LABEL, opts.datachannel_timeout_s)
            self.hangup("no_data_channel")
            return
        while opts.peer_timeout_s > 0:
            await asyncio.sleep(min(1.0, opts.peer_timeout_s / 4))
            last = max(self._last_activity, self.audio_in.last_at)
            if time.monotonic() - last > opts.peer_timeout_s:
                self.hangup("peer_timeout")
                return

    async def _writer(self) -> None:
        """The only task that sends on the data channel."""
        runner, wake = self.runner, self._wake
        runner.outbox.on_put = wake.set
        opened = False
        try:
            while True:
                wake.clear()  # every source is looked at after this: what comes later sets it again
                if not opened and self._channel_open.is_set():
                    opened = True
                    await self._send_early()
                if self._notes:
                    await self._send_notes()
                out = runner.next_outgoing_nowait()
                if out is None:
                    break
                if isinstance(out, str):  # "empty": nothing queued anywhere
                    await wake.wait()
                    continue
                await self._handle(out)
        finally:
            if runner.outbox.on_put == wake.set:  # (a resumed call's new writer may hold it now)
                runner.outbox.on_put = None
        # The session ended (idle timeout, expiry, close): say what is left, then hang up.
        await self._send_notes()
        self.hangup(self.hangup_reason or "session_closed")

    async def _send_early(self) -> None:
        preface, self._preface = self._preface, []
        for event in preface:
            await self._send(event)
        while self._early:
            await self._send(self._early.popleft())

    async def _send_notes(self) -> None:
        while self._notes:
            await self._send(self._notes.popleft())

    async def _handle(self, out: Any) -> None:
        event = out.event
        kind = event["type"]
        runner = self.runner
        if kind == "response.output_audio.delta":
            self.audio_deltas += 1
            if out.audio is not None:  # PCM from the session: no wire format on this path
                await self.track.push(at_track_rate(out.audio, self._resamplers), out.response_id, out.epoch)
            return  # the audio goes on the track, never on the data channel
        after: Callable[[], Any] | None = None
        if kind == "output_audio_buffer.cleared":
            # the core's answer to the client's output_audio_buffer.clear: cut the track now
            playing = self.track.playing
            self.track.clear(announce=False)
            if event.get("response_id") is None and playing is not None:
                event = {**event, "response_id": playing}
        elif kind == "input_audio_buffer.speech_started":
            td = runner.core.config.turn_detection
            if td is not None and td.interrupt_response:
                after = self._interrupted
        elif kind == "response.output_audio.done":
            self.track.finish(event["response_id"])
        elif kind == "response.done":
            response = event.get("response") or {}
            rid = response.get("id")
            if rid is not None:
                if response.get("status") == "cancelled":
                    self.track.clear(rid)
                self.track.finish(rid)
        await self._send(event)
        runner.mark_sent(out)
        if after is not None:
            await after()

    async def _interrupted(self) -> None:
        """Server VAD heard the user: stop the assistant's voice now, and tell the session what
        was dropped (it truncates a complete reply to what was heard; an active response it
        cancels itself)."""
        rid = self.track.playing
        if self.track.clear() and rid is not None:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.runner.playback_cut(rid), 1.0)

    def preface(self, events: list[dict[str, Any]]) -> None:
        """Events to send before anything else once the data channel opens (a resume's replay)."""
        self._preface.extend(events)

    async def _send(self, event: dict[str, Any]) -> None:
        channel = self.channel
        if channel is None:
            self._early.append(event)
            return
        if channel.readyState != "open":
            return
        channel.send(event_text(event))
        self.events_sent += 1
        if channel.bufferedAmount > _HIGH_WATER:
            drained = asyncio.Event()
            channel.once("bufferedamountlow", drained.set)
            try:
                await asyncio.wait_for(drained.wait(), 30.0)
            except asyncio.TimeoutError:
                self.hangup("data_channel_stalled")

    # ------------------------------------------------------------------ shutdown
    def hangup(self, reason: str = "hangup") -> asyncio.Task[None]:
        """Release the call (idempotent; callable from any task, including the call's own)."""
        if self._closer is None:
            self.hangup_reason = self.hangup_reason or reason
            self._closer = asyncio.get_running_loop().create_task(self._close(reason), name=f"webrtc-{self.id}-close")
        return self._closer

    async def _close(self, reason: str) -> None:
        log.info("call %s (session %s) ends: %s", self.id, self.runner.core.id, reason)
        # A lost peer (not a hang-up) leaves the session running and resumable for the grace period.
        resumable = reason in _LOSS_REASONS and self.resume_grace_s > 0 and not self.runner.closed.is_set()
        if not resumable:
            try:
                await self.runner.close(reason if reason != "hangup" else "client_closed")
            except Exception:  # noqa: BLE001 - keep releasing
                log.exception("call %s: closing the session failed", self.id)
        self.track.stop()
        if self.avatar is not None:
            self.avatar.stop()
        tasks = list(self._tasks)
        writer = [t for t in tasks if t.get_name().endswith("-writer")]
        if writer and not resumable:  # let it send the session's last events (the runner woke it with None)
            await asyncio.wait(writer, timeout=2.0)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=5.0)
        if resumable:
            self.runner.detach(self.resume_grace_s)  # after our writer stopped reading its outbox
        try:
            await asyncio.wait_for(self.pc.close(), 10.0)
        except Exception:  # noqa: BLE001
            log.exception("call %s: closing the peer connection failed", self.id)
        self.video.release()
        self.channel = None
        self.closed.set()
        self._on_closed(self)

    def info(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "realtime.call",
            "session_id": self.runner.core.id,
            "model": self.runner.core.model.id,
            "connection_state": self.pc.connectionState,
            "data_channel": self.channel is not None,
            "audio_in_frames": self.audio_in.frames,
            "audio_in_dropped": self.audio_in.dropped,
            "audio_out_frames": self.track.audio_frames_sent,
            "audio_packet_ms": self.track.packet_ms,
            "underruns": self.track.underruns,
            "skipped_ms": round(self.track.skipped_ms, 1),
            "video_frames": self.video.frames_seen,
            "avatar_frames": self.avatar.frames_sent if self.avatar is not None else 0,
            "inline_decoder": self.decoder is not None,
        }


# How a call can end without the client meaning to end the session.
_LOSS_REASONS = frozenset({"connection_failed", "connection_closed", "data_channel_closed", "peer_timeout",
                           "data_channel_stalled", "superseded", "resume_offer_failed"})


def new_call_id() -> str:
    return f"rtc_{uuid.uuid4().hex[:24]}"
