"""``OmniSession``: one conversation on an ``OmniModel`` (``model.py``): its thinker with the
context it keeps across turns, its running talker, its codec streams (see ``model.py`` for the
stage wiring the pipeline sees)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any, Protocol

import numpy as np

from ..base import ModelSession, TalkerOutput, ThinkerOutput, ThinkRequest, VADStream
from .batching.mailbox import StepWithdrawn
from .batching.stages import OmniBatching, SessionRows
from .codec import OmniCodec
from .codec_stream import CodecStream, to_int16
from .context import TokenRows
from .host_time import HostTime
from .loader import LoadedOmni
from .talker import CodeChunk, OmniTalker, TalkerSettings
from .thinker import ReplyStart, StreamingThinker, ThinkerSettings


class SessionHost(Protocol):
    """What a session reads of its model (an :class:`~.model.OmniModel`)."""

    loaded: LoadedOmni | None
    batching: OmniBatching | None
    codec: OmniCodec | None
    seed: int | None
    cuda_graphs: bool
    talks_live: bool
    thinker_settings: ThinkerSettings
    talker_settings: TalkerSettings
    host_time: HostTime
    vad: Any

    def session_closed(self, session: OmniSession) -> None: ...


def _generator(device, seed: int):
    import torch

    try:
        return torch.Generator(device=device).manual_seed(seed)
    except RuntimeError:
        return torch.Generator().manual_seed(seed)



def _frames(out: TalkerOutput) -> int:
    return len(out.codes) if isinstance(out.codes, CodeChunk) else 0


class OmniSession(ModelSession):
    """Per-session state: the thinker's KV cache, the running talker, the codec streams."""

    talks_every_output = True  # the talker consumes one token per codec frame

    @property
    def talks_live(self) -> bool:  # type: ignore[override]
        """...in one call per reply, fed token by token (``live_talker``)."""
        return self.model.talks_live

    def new_vad(self) -> VADStream | None:
        vad = self.model.vad
        return vad.stream() if vad is not None else None

    def __init__(self, model: SessionHost) -> None:
        import torch

        self.model = model
        loaded = model.loaded
        self.loaded = loaded
        seed = model.seed if model.seed is not None else int(torch.seed() % (2**31))
        self.seed = seed
        # a slot in each batched stage (SlotsFull when the model is at capacity)
        self.rows: SessionRows | None = model.batching.open() if model.batching is not None else None
        # what the thinker hands its talker on the device, kept here, never on the outputs
        token_rows = TokenRows()
        # one generator per stage: think() and talk() run in different threads
        self.thinker = StreamingThinker(loaded, model.thinker_settings, _generator(loaded.device, seed),
                                        rows=self.rows.thinker if self.rows else None, token_rows=token_rows)
        self.talker = OmniTalker(loaded, model.talker_settings, _generator(loaded.device, seed + 1), rows=self.rows,
                                 token_rows=token_rows)
        self._codec_stream: CodecStream | None = None
        self._ended_stream: CodecStream | None = None  # the reply before, its last chunk sent
        self._codec_lock = threading.Lock()
        self.closed = False
        if model.cuda_graphs and loaded.device_type == "cuda":
            # allocate the static caches and capture the per-token steps before the first turn
            self.thinker.prepare()
            self.talker.prepare()

    # ModelSession -------------------------------------------------------------------------------

    def think(self, request: ThinkRequest) -> Iterator[ThinkerOutput]:
        if self.closed:
            return iter(())
        return self.model.host_time.generator("thinker", self.thinker.run(request))

    def prefill(self, request: ThinkRequest) -> int:
        if self.closed:
            return 0
        evaluated, prompt = self.thinker.prefill_ahead(request)
        if prompt is not None and request.want_audio:
            self.talker.prefill_ahead(prompt)
        return evaluated

    def talk(
        self, segment: list[ThinkerOutput], voice: str, cancelled: threading.Event, final: bool, speed: float = 1.0
    ) -> Iterator[TalkerOutput]:
        if self.closed:
            return iter(())
        # (the codec has one rate: speed is not applied)
        talking = self._sending(self.talker.talk(segment, voice, cancelled, final))
        return self.model.host_time.generator("talker", talking, _frames)

    def talk_more(self, segment: list[ThinkerOutput], voice: str, final: bool, first: bool = False) -> None:
        if not self.closed:
            self.talker.feed(segment, voice, final, first)

    def talk_live(self, cancelled: threading.Event) -> Iterator[TalkerOutput]:
        if self.closed:
            return iter(())
        return self.model.host_time.generator("talker", self._sending(self.talker.talk_live(cancelled)), _frames)

    def decode(self, out: TalkerOutput) -> np.ndarray:
        began = time.thread_time()
        try:
            return self._decode(out)
        finally:
            self.model.host_time.add("codec", time.thread_time() - began)

    def _sending(self, outputs: Iterator[TalkerOutput]) -> Iterator[TalkerOutput]:
        """The talker's outputs, each chunk's codec window sent as the chunk is made: the codec
        decodes it while the one before plays out (:meth:`CodecStream.send`), and :meth:`decode`
        only collects it."""
        for out in outputs:
            chunk = out.codes
            if isinstance(chunk, CodeChunk) and not self.closed and self.model.codec is not None:
                with self._codec_lock:
                    stream = self._stream_for(chunk)
                    if stream is not None:
                        stream.send(chunk.codes, start=chunk.start, final=chunk.final or out.final, ref=chunk)
            yield out

    def _decode(self, out: TalkerOutput) -> np.ndarray:
        chunk = out.codes
        if not isinstance(chunk, CodeChunk) or self.closed or self.model.codec is None:
            return np.zeros(0, np.int16) if out.audio is None else out.audio
        final = chunk.final or out.final
        with self._codec_lock:
            stream = next((s for s in (self._codec_stream, self._ended_stream)
                           if s is not None and s.turn == chunk.turn and s.sent(chunk)), None)
            if stream is None:  # not sent as it was made (a talker that bypassed _sending)
                stream = self._stream_for(chunk)
                if stream is None:
                    return np.zeros(0, np.int16)  # a chunk of an older reply
                stream.send(chunk.codes, start=chunk.start, final=final, ref=chunk)
        try:
            wav = stream.receive(chunk)
        except StepWithdrawn:  # the reply was cut meanwhile (a newer one began, or the session closed)
            return np.zeros(0, np.int16)
        if final:
            with self._codec_lock:
                if self._codec_stream is stream:
                    self._codec_stream = None
                if self._ended_stream is stream:
                    self._ended_stream = None
        return to_int16(wav)

    def _stream_for(self, chunk: CodeChunk) -> CodecStream | None:
        """Under ``_codec_lock``: the codec stream of ``chunk``'s reply, begun at its first chunk
        (None: a chunk of an older reply). A reply whose last chunk was sent stays readable
        until a later one replaces it; one cut before its end drops its queued windows."""
        stream = self._codec_stream
        if stream is not None and stream.turn == chunk.turn:
            return stream
        if stream is not None and chunk.turn < stream.turn:
            return None
        if stream is not None:
            if stream.complete:
                self._ended_stream = stream
            else:
                stream.cancel()
        slot = self.rows.talker.slot if self.rows is not None else None
        stream = self._codec_stream = CodecStream.of(self.model.codec, chunk.turn, chunk.speaker,
                                                     seed=self.seed + chunk.turn, slot=slot)
        return stream

    def confirm(self, spoken_text: str) -> None:
        self.thinker.confirm(spoken_text)
        self.talker.stop()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            try:
                self.thinker.close()
            finally:
                self.talker.close()
        finally:  # a stage that could not finish a step in time must not cost the model a slot
            with self._codec_lock:
                for stream in (self._codec_stream, self._ended_stream):
                    if stream is not None:
                        stream.cancel()
                self._codec_stream = self._ended_stream = None
            if self.rows is not None and self.model.batching is not None:
                self.model.batching.release(self.rows)  # after the stages let go of their slots
            self.model.session_closed(self)

    # extras -------------------------------------------------------------------------------------

    @property
    def last_prefill_tokens(self) -> int:
        return self.thinker.last_prefill_tokens

    @property
    def last_reply_start(self) -> ReplyStart | None:
        """Where the last reply's time went from its prefill to its first token."""
        return self.thinker.last_start

    @property
    def cache_length(self) -> int:
        """Tokens in the thinker's KV cache."""
        return self.thinker.cache_length

    def crop(self, position: int) -> int:
        """Cut the thinker's context back to ``position`` tokens (barge-in by token count)."""
        self.talker.stop()
        return self.thinker.crop(position)
