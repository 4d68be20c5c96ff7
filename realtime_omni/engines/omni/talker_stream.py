"""One reply's talker state, shared by both architectures: chunking, text pacing, stop/resume."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from ..base import TalkerOutput, ThinkerOutput
from .code_predictor import CodeFrames
from .context import TalkerPrompt, TokenHidden, TokenRows
from .graphs import StaticDecoder
from .streams import on_stream
from .loader import LoadedOmni, samples_per_code
from .talker_prefix import TalkerPrefix, prefill_rows

log = logging.getLogger(__name__)


@dataclass
class TalkerSettings:
    do_sample: bool = True
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    repetition_penalty: float | None = None
    max_new_tokens: int = 4096
    first_chunk_frames: int = 12
    chunk_frames: int = 24
    #: sizes of the chunks between the first and the steady ones: the second chunk must be ready
    #: before the first has played, so it cannot be a full steady chunk
    ramp_frames: tuple[int, ...] = ()
    #: transcript pacing: text is attributed to audio at most this fast (characters per second)
    chars_per_second: float = 15.0
    #: benchmarks only: never stop on the codec EOS (run to max_new_tokens)
    ignore_eos: bool = False
    #: size of the session's static talker KV cache: the thinker's context + one reply's frames
    cache_tokens: int = 8192 + 4096 + 16
    #: replay the talker step (and Qwen3's code-predictor frame) as CUDA graphs (CUDA only)
    cuda_graphs: bool = True
    #: once a reply's audio has started, its frames are made at most this many seconds ahead of
    #: a listener who plays it in real time from its first chunk (0: as fast as the GPU goes)
    pace_lead_s: float = 0.0


#: the reference generate()'s talker sampling defaults
_DEFAULTS = {
    "qwen2_5_omni": dict(temperature=0.9, top_k=40, top_p=0.8, repetition_penalty=1.05),
    "qwen3_omni_moe": dict(temperature=0.9, top_k=50, top_p=1.0, repetition_penalty=1.05),
}


@dataclass(frozen=True)
class CodeSampling:
    """How an architecture's talker picks codebook-0 codes: the per-session :class:`TokenSampler`
    and the batched talker's in-graph sampling are both built from this."""

    do_sample: bool
    temperature: float
    top_k: int | None
    top_p: float | None
    repetition_penalty: float | None
    suppress: tuple[int, ...]
    eos: frozenset[int]  # codes that end the reply (empty when EOS is ignored)

    @classmethod
    def make(cls, loaded: LoadedOmni, settings: TalkerSettings, suppress: list[int], eos: set[int]) -> CodeSampling:
        kw = dict(_DEFAULTS[loaded.arch])
        for key in ("temperature", "top_k", "top_p", "repetition_penalty"):
            value = getattr(settings, key)
            if value is not None:
                kw[key] = value
        return cls(do_sample=bool(settings.do_sample), suppress=tuple(sorted(set(suppress))), eos=frozenset(eos), **kw)

    def sampler(self, generator: Any) -> Any:
        from .sampling import TokenSampler

        return TokenSampler(do_sample=self.do_sample, temperature=self.temperature, top_k=self.top_k,
                            top_p=self.top_p, repetition_penalty=self.repetition_penalty,
                            suppress=list(self.suppress), generator=generator)


@dataclass
class CodeChunk:
    """``TalkerOutput.codes`` of the omni engine: a run of codec frames of one reply."""

    turn: int
    start: int  # index of the first frame within the reply
    codes: Any  # long tensor on CPU: (n,) for Qwen2.5, (n, G) for Qwen3
    speaker: str
    final: bool = False

    def __len__(self) -> int:
        return int(self.codes.shape[0])


class Superseded(Exception):
    """A closed reply tried to step on the session's shared caches."""


class _OwnCaches:
    """``TalkerStream._own_caches``: a plain class, not a generator-based context manager (it is
    entered once per frame of every session, in their threads)."""

    __slots__ = ("stream",)

    def __init__(self, stream: TalkerStream) -> None:
        self.stream = stream

    def __enter__(self) -> None:
        self.stream.step_lock.acquire()
        if self.stream.done:
            self.stream.step_lock.release()
            raise Superseded

    def __exit__(self, *exc: object) -> None:
        self.stream.step_lock.release()


class TalkerStream:
    """One reply's talker state (shared logic: chunking, text pacing, stop/resume)."""

    frame_samples: int = 480

    #: when this reply's talker began to build its prompt (set before the prefill)
    preparing_since: float | None = None

    def __init__(self, loaded: LoadedOmni, settings: TalkerSettings, generator, turn: int,
                 prompt: TalkerPrompt | None, speaker: str, decoder: StaticDecoder,
                 frames: CodeFrames | None = None) -> None:
        self.loaded = loaded
        self.settings = settings
        self.turn = turn
        self.prompt = prompt
        self.speaker = speaker
        self.device = loaded.device
        self.decoder = decoder
        self.code_frames = frames
        self.step_lock = threading.Lock()  # the session's, set by OmniTalker
        self.prefix = TalkerPrefix()  # the session's, set by OmniTalker
        self.rows: Any = None  # the session's slot in the model's batched talker, set by OmniTalker
        self.token_rows = TokenRows()  # the session's (what its thinker hands over), set by OmniTalker
        self.ahead: Any = None  # batched: frames queued ahead (``batcher.Lookahead``)
        self.draws: Any = None  # batched: the sampler's draws for those frames (``rows.DrawBlocks``)
        self.frame_limit = settings.max_new_tokens
        self.prefilled = False
        self.rows_run = 0  # prompt rows the prefill ran (the rest were in the cache already)
        self.done = prompt is None  # no prompt (first output lost) → nothing to say
        self.ended = False  # the thinker's reply is complete
        self.final_sent = False
        self.logits = None  # pending logits of the last forward
        #: frames waiting to be emitted: codebook-0 codes (Qwen2.5) or each frame's codes (Qwen3)
        self.frames: list[Any] = []
        self.emitted = 0  # frames emitted so far
        self.first_out: float | None = None  # when the first audio chunk left (monotonic)
        self.steps = 0
        self.text_in = ""
        self.text_out = 0
        self.frame_sec = samples_per_code(loaded) / 24_000.0
        self.generator = generator
        self.sampling = self.code_sampling(loaded, settings)
        self.sampler = self.sampling.sampler(generator)

    # feeding ----------------------------------------------------------------------------------

    def add(self, out: ThinkerOutput) -> None:
        hidden: TokenHidden = out.hidden
        self.text_in += out.text or ""
        if hidden.prompt is not None and self.prompt is None and not self.prefilled:
            self.prompt = hidden.prompt
            self.done = False
        self._add_token(hidden)
        if hidden.end:
            self.ended = True

    def _add_token(self, hidden: TokenHidden) -> None:
        raise NotImplementedError

    # running ----------------------------------------------------------------------------------

    def run(self, cancelled: threading.Event, final: bool) -> Iterator[TalkerOutput]:
        try:
            yield from self._run(cancelled, final)
        except Superseded:
            return
        finally:
            if self.ahead is not None and (self.done or cancelled.is_set()):
                with self.step_lock:
                    self.ahead.drain()

    def _run(self, cancelled: threading.Event, final: bool) -> Iterator[TalkerOutput]:
        if final:
            self.ended = True
        fused = self.rows is not None
        while not self.done:
            if cancelled.is_set():
                return
            if not self.prefilled:
                if not self._can_prefill():
                    if self.ended:
                        self.done = True  # nothing to speak
                    break
                self.preparing_since = time.perf_counter()  # (the batched prefill times the preparation)
                self._prefill()
                self.prefilled = True
                if fused:  # the batched talker takes the frames from here, from the slot's state
                    self.rows.state.load(self.rows.slot, self.logits, self._frame_hidden(), self._seen_codes())
                continue
            queued = len(self.ahead) if self.ahead is not None else 0
            wait = self._pace_wait() if not queued else 0.0
            if wait > 0:
                self._pause(wait, cancelled)
                continue
            if fused:
                # one batched step takes this frame and runs the talker on the next step's input
                stop = self._fused_frame(self._paced_frames())
                if stop is None:
                    break  # the next step's input is not known yet
            else:
                if self.logits is None:
                    if not self._input_ready():
                        break
                    self._forward_next()
                    continue
                stop = self._take_frame()
                self.logits = None
            if stop:
                self.done = True
                break
            self.steps += 1
            if self.steps >= self._max_frames():
                self.done = True
                break
            if len(self.frames) >= max(1, self._threshold()):
                yield self._chunk(final=False)
        if cancelled.is_set():
            return
        if self.done and self.ended and not self.final_sent:
            while len(self.frames) > max(1, self.settings.chunk_frames):
                yield self._chunk(final=False, count=self.settings.chunk_frames)
            self.final_sent = True
            yield self._chunk(final=True)

    def _chunk(self, final: bool, count: int | None = None) -> TalkerOutput:
        import torch

        take = self.frames if count is None else self.frames[:count]
        self.frames = [] if count is None else self.frames[count:]
        if take and self.first_out is None:
            self.first_out = time.monotonic()  # the listener starts playing about now
        start = self.emitted
        self.emitted += len(take)
        if take:
            codes = torch.tensor(take, dtype=torch.long)
        else:
            codes = torch.zeros((0,) if self.loaded.arch == "qwen2_5_omni" else (0, self._groups()),
                                dtype=torch.long)
        chunk = CodeChunk(turn=self.turn, start=start, codes=codes, speaker=self.speaker, final=final)
        return TalkerOutput(codes=chunk, text=self._paced_text(final), final=final)

    def _groups(self) -> int:
        return 1

    def _threshold(self) -> int:
        """Frames in the next chunk: the first chunk, the ramp, then steady chunks."""
        s = self.settings
        if self.emitted == 0:
            return s.first_chunk_frames
        done = self.emitted - s.first_chunk_frames
        for size in s.ramp_frames:
            if done < size:
                return size
            done -= size
        return s.chunk_frames

    def _max_frames(self) -> int:
        return self.frame_limit

    def _paced_frames(self) -> int | None:
        """How many frames the reply may have made by now (None: no limit): a listener who
        started at the first chunk and plays in real time has heard ``t`` seconds; frames up to
        ``t + pace_lead_s`` may exist, plus the chunk being built (its frames reach the listener
        only together). A session far ahead of its listener leaves the batched steps to those
        about to run dry and to replies that are starting."""
        lead = self.settings.pace_lead_s
        if lead <= 0 or self.first_out is None:
            return None
        heard = time.monotonic() - self.first_out
        return int((heard + lead) / self.frame_sec) + self._threshold()

    def _pace_wait(self) -> float:
        """Seconds until the next frame may be made (0: now): when :meth:`_paced_frames` first
        exceeds the frames made so far."""
        lead = self.settings.pace_lead_s
        if lead <= 0 or self.first_out is None:
            return 0.0
        due = self.first_out + (self.steps + 1 - self._threshold()) * self.frame_sec - lead
        return max(due - time.monotonic(), 0.0)

    def _pause(self, seconds: float, cancelled: threading.Event) -> None:
        """Hold the next frame back (a barge-in or a close still ends the wait at once, or
        within 50 ms); meanwhile the batched talker does not wait for this session."""
        rows = self.rows
        pausing = rows.batcher.activity.paused() if rows is not None else contextlib.nullcontext()
        with pausing:
            cancelled.wait(min(seconds, 0.05))

    def _prefill_with(self, inputs, positions, context_rows: int = 0) -> Any:
        """Prefill the session's talker cache with ``inputs`` (1, n, D) at ``positions`` (3, n);
        the first ``context_rows`` are the conversation part (:class:`TalkerPrefix`): those the
        cache holds already are not run again. Returns the last row's outputs."""
        decoder = self.decoder
        n = inputs.shape[1]
        if n + 2 > decoder.max_len:
            raise ValueError(f"talker prompt of {n} tokens exceeds its cache of {decoder.max_len}")
        self.frame_limit = max(1, min(self.settings.max_new_tokens, decoder.max_len - n - 1))
        with self._own_caches():
            out, self.rows_run = prefill_rows(self.loaded, self.forward, decoder, self.rows, inputs[0], positions,
                                              context_rows, self.prefix, self.preparing_since, speaks=True)
        return out

    def _step_with(self, fill: Callable[..., None]) -> Any:
        """Run the captured step after ``fill(*static inputs)`` wrote this step's inputs."""
        with self._own_caches(), on_stream(self.loaded.stream("talker")):
            fill(*self.decoder.inputs)
            out = self.decoder.graph()
            return tuple(o.clone() for o in out) if isinstance(out, tuple) else out.clone()

    def _fused_frame(self, limit: int | None = None) -> bool | None:
        """The next frame through the batched talker (see ``batching.talker_frames``): True on
        EOS, None when the step after it cannot be queued yet (its reply part is unknown).
        ``limit``: frames the reply may have made by now (pacing; None: no limit).

        Frames whose next reply part is known are queued ahead (``rows.lookahead``), so the
        talker's loop finds this session's next frame waiting while this thread hands the last
        chunk on; what is still queued when the reply ends is withdrawn."""
        rows = self.rows
        with self._own_caches():
            if self.ahead is None:  # (imported here: the batching package imports this module)
                from .batching.batcher import Lookahead

                self.ahead = Lookahead(rows.batcher, rows.slot, rows.lookahead)
            ahead, decoder = self.ahead, self.decoder
            most = self._max_frames() if limit is None else min(limit, self._max_frames())
            while ahead.room > 0 and self.steps + len(ahead) < most:
                part = self._part_after_frame(len(ahead))
                if part is None:
                    break
                if self.draws is None:
                    self.draws = rows.state.draws(self.generator)
                row = (part, [self.pos] * 3, self.draws.next())
                ahead.push(row, decoder.write_position() + len(ahead))
                self.pos += 1
            if not len(ahead):
                return None
            (c0, codes), _ = ahead.pop()  # read back by the talker's loop, for every row at once
            decoder.advance()
        return self._append_frame([c0, *codes])

    def _own_caches(self) -> _OwnCaches:
        """Hold the session's caches for one step; a closed (superseded) reply takes none."""
        return _OwnCaches(self)

    def _paced_text(self, final: bool) -> str:
        if final:
            cut = len(self.text_in)
        else:
            allowed = int(self.emitted * self.frame_sec * self.settings.chars_per_second)
            cut = min(allowed, len(self.text_in))
            if cut < len(self.text_in):
                space = self.text_in.rfind(" ", self.text_out, cut + 1)
                cut = space if space > self.text_out else self.text_out
        text = self.text_in[self.text_out : cut]
        self.text_out = max(self.text_out, cut)
        return text

    def close(self) -> None:
        self.logits = None
        self.done = True
        # under the lock even when nothing is queued yet: a first frame may be creating its
        # lookahead right now; once this holds the lock that frame has queued what it queues
        # (drained here) and any later one sees ``done`` and queues nothing
        with self.step_lock:
            if self.ahead is not None:
                self.ahead.drain()
            if self.rows is not None:  # a first frame its stage may still expect
                self.rows.batcher.unexpect(self.rows.slot)

    # architecture hooks -------------------------------------------------------------------------

    @classmethod
    def code_sampling(cls, loaded: LoadedOmni, settings: TalkerSettings) -> CodeSampling: ...

    @classmethod
    def context_part(cls, loaded: LoadedOmni, prompt: TalkerPrompt) -> tuple[Any, Any] | None:
        """The conversation part of the talker's prompt: rows (n, D) and positions (3, n), the
        same for every reply that follows this context (see :class:`TalkerPrefix`)."""
        ...

    def _can_prefill(self) -> bool: ...

    def _prefill(self) -> None: ...

    def _input_ready(self) -> bool: ...

    def _forward_next(self) -> None: ...

    def _take_frame(self) -> bool:
        """Sample the pending frame; append it to ``frames``; True on the codec EOS."""
        ...

    def _frame_hidden(self) -> Any:
        """The hidden state the next frame starts from (Qwen3's code predictor), or None."""
        return None

    def _seen_codes(self) -> list[int]:
        """Codes the repetition penalty covers when the first frame is taken."""
        ...

    def _part_after_frame(self, ahead: int = 0) -> Any:
        """The reply part of the talker step that follows the next frame (``ahead`` frames
        later), or None (not yet known)."""
        ...

    def _append_frame(self, values: list[int]) -> bool:
        """Append a frame the batched talker took (codebook 0 first); True on the codec EOS."""
        ...

    @staticmethod
    def forward(loaded: LoadedOmni, decoder: StaticDecoder, inputs, positions) -> Any: ...

    @classmethod
    def new_decoder(cls, loaded: LoadedOmni, settings: TalkerSettings, rows: Any = None) -> StaticDecoder:
        """The session's talker cache with this architecture's step bound to it."""
        ...

    @staticmethod
    def empty_decoder(loaded: LoadedOmni, settings: TalkerSettings, rows: Any = None) -> StaticDecoder:
        """The session's talker cache: its own, or its slot of the model's batched talker."""
        return StaticDecoder(loaded.talker.model.config, settings.cache_tokens, loaded.device,
                             graphs=settings.cuda_graphs and rows is None, name=f"{loaded.arch} talker step",
                             pool=rows.pool if rows else None, slot=rows.slot if rows else None,
                             **loaded.graph_streams("talker"))

    @classmethod
    def dummy_prefill(cls, loaded: LoadedOmni, decoder: StaticDecoder) -> None:
        """One throw-away token through the empty cache (before capturing the step at session open)."""
        import torch

        like = cls.step_input(decoder)  # one input row of this architecture's step
        cls.forward(loaded, decoder, torch.zeros((1, 1, like.shape[-1]), dtype=like.dtype, device=loaded.device),
                    torch.zeros((3, 1), dtype=torch.long))

    @staticmethod
    def step_input(decoder: StaticDecoder) -> Any:
        """The static tensor that carries the step's input embedding."""
        ...
