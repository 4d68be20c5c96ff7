"""Streaming talker: codec codes from the thinker's stream, starting on the first thinker token.

Both architectures consume exactly one reply token per codec frame, so the reference
``generate`` can be reproduced step by step as the thinker's tokens arrive:

Qwen2.5-Omni (``Qwen2_5OmniForConditionalGeneration.generate``)
    prefill  = [thinker context: last_hidden + embedding (0 at audio/image tokens)]
               + [embed(speaker BOS)] + [vec(g0)], with codec ``pad`` / ``bos`` embeddings added to
               the last two positions; rotary positions are the thinker's, then max+1, max+2.
    step s   = embed(code[s-1]) + R(s), R(s) = vec(g_s) while reply tokens last, then the
               ``tts_text_end`` embedding once, then ``tts_text_pad`` forever; stop on codec
               ``pad`` / ``end``; ``codec bos`` suppressed; repetition penalty over
               [mask × prompt, pad, bos, codes...].
Qwen3-Omni (``Qwen3OmniMoeForConditionalGeneration.generate`` + ``talker.prepare_inputs_for_generation``)
    prefill  = user-turn tokens of the whole context (text: text_projection(embedding); audio/image:
               hidden_projection(layer-``accept_hidden_layer`` hidden)) + the 9-position assistant part
               (header, 4 × tts_pad, tts_bos, first token; codec nothink/think_bos/think_eos/speaker/
               pad/bos).
    frame k  = codebook 0 sampled from the talker, codebooks 1..G-1 from the code predictor
               (prefill [talker hidden, embed(c0)], then one step per codebook).
    step k   = sum of the frame's codebook embeddings + T(k), T = text_projection(embedding) of
               g1.., the EOS token, then ``tts_eos``, then ``tts_pad`` forever; stop on codec EOS.

Step s needs reply token s (or the end of the reply), so the talker runs as far as the thinker's
stream allows on each ``talk()`` call and resumes on the next. With greedy decoding the thinker
tokens and talker codes are identical to the one-shot ``generate`` (tests check both models,
audio input included). Where this differs from the reference:

* sampling draws come from a per-session generator, so sampled runs differ draw by draw (same
  distributions, same top-k / top-p / temperature / repetition penalty / suppressed ids);
* Qwen2.5: ids token2wav cannot embed (``>= num_embeds + 1``, EOS excepted) are suppressed; a
  trained talker does not sample them, and the reference would crash on them;
* Qwen3: with audio *and* images in the context, rope positions of the talker prompt come from the
  thinker's ``get_rope_index`` (the talker's own copy reads a missing ``audio_config`` and the
  reference raises);
* later turns: the talker prompt is built from the cached context (thinker states computed turn by
  turn, the previous replies as generated token ids), not from a fresh prefill of the whole
  conversation re-tokenized — equal up to floating-point accumulation order.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from ..base import TalkerOutput, ThinkerOutput
from .code_predictor import CodeFrames
from .context import TalkerPrompt, TokenHidden
from .graphs import StaticDecoder, on_stream
from .loader import LoadedOmni, samples_per_code
from .sampling import TokenSampler

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


#: the reference generate()'s talker sampling defaults
_DEFAULTS = {
    "qwen2_5_omni": dict(temperature=0.9, top_k=40, top_p=0.8, repetition_penalty=1.05),
    "qwen3_omni_moe": dict(temperature=0.9, top_k=50, top_p=1.0, repetition_penalty=1.05),
}


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


class OmniTalker:
    """Per-session talker; keeps the running reply's talker state between ``talk()`` calls."""

    def __init__(self, loaded: LoadedOmni, settings: TalkerSettings, generator: Any = None) -> None:
        self.loaded = loaded
        self.settings = settings
        self.generator = generator
        self.stream: _Stream | None = None
        self.lock = threading.Lock()
        self.kind = _Qwen25Stream if loaded.arch == "qwen2_5_omni" else _Qwen3Stream
        # per session, reused by every reply: the static KV cache with its captured step, and
        # (Qwen3) the code predictor's captured frame
        self.decoder: StaticDecoder | None = None
        self.frames: CodeFrames | None = None
        # one reply at a time on the shared caches: a superseded reply's thread may still be
        # finishing a step when the next reply prefills
        self.step_lock = threading.Lock()

    def parts(self) -> tuple[StaticDecoder, CodeFrames | None]:
        if self.decoder is None:
            self.decoder = self.kind.new_decoder(self.loaded, self.settings)
        if self.frames is None and self.loaded.arch != "qwen2_5_omni":
            self.frames = CodeFrames(self.loaded, do_sample=self.settings.do_sample,
                                     cuda_graphs=self.settings.cuda_graphs, generator=self.generator)
        return self.decoder, self.frames

    def prepare(self) -> None:
        """Allocate the caches and capture the steps now (at session open), not on the first reply."""
        import torch

        with self.lock, torch.inference_mode():
            decoder, frames = self.parts()
            graph = decoder.graph
            if graph is not None and graph.enabled and not graph.captured:
                self.kind.dummy_prefill(self.loaded, decoder)
                graph.capture()
                decoder.crop(0)
            if frames is not None and frames.graph.enabled and not frames.graph.captured:
                frames.graph.capture()

    def talk(
        self, segment: list[ThinkerOutput], voice: str, cancelled: threading.Event, final: bool
    ) -> Iterator[TalkerOutput]:
        import torch

        with self.lock:
            for out in segment:
                hidden = out.hidden
                if not isinstance(hidden, TokenHidden):
                    continue
                stream = self.stream
                if stream is None or hidden.turn > stream.turn:
                    speaker = self.loaded.speaker_for(voice)
                    decoder, frames = self.parts()
                    if stream is not None:
                        stream.close()  # superseded: it takes no further step on the shared caches
                    stream = self.stream = self.kind(self.loaded, self.settings, self.generator,
                                                     hidden.turn, hidden.prompt, speaker, decoder, frames)
                    stream.step_lock = self.step_lock
                elif hidden.turn < stream.turn:
                    continue  # a stale reply
                stream.add(out)
            stream = self.stream
        if stream is None:
            if final:
                yield TalkerOutput(text="".join(o.text for o in segment), final=True)
            return
        with torch.inference_mode():
            yield from stream.run(cancelled, final)

    def stop(self) -> None:
        """End the running reply (barge-in); the caches and graphs stay for the next one."""
        with self.lock:
            if self.stream is not None:
                self.stream.close()
            self.stream = None

    def close(self) -> None:
        self.stop()
        with self.lock, self.step_lock:  # not under a step still finishing in the talker thread
            if self.decoder is not None:
                self.decoder.release()
            self.decoder = None
            if self.frames is not None:
                self.frames.graph.release()
            self.frames = None


class _Superseded(Exception):
    """A closed reply tried to step on the session's shared caches."""


class _Stream:
    """One reply's talker state (shared logic: chunking, text pacing, stop/resume)."""

    frame_samples: int = 480

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
        self.frame_limit = settings.max_new_tokens
        self.prefilled = False
        self.done = prompt is None  # no prompt (first output lost) → nothing to say
        self.ended = False  # the thinker's reply is complete
        self.final_sent = False
        self.logits = None  # pending logits of the last forward
        self.frames: list[Any] = []  # frames waiting to be emitted
        self.emitted = 0  # frames emitted so far
        self.steps = 0
        self.text_in = ""
        self.text_out = 0
        self.frame_sec = samples_per_code(loaded) / 24_000.0
        defaults = dict(_DEFAULTS[loaded.arch])
        for key in ("temperature", "top_k", "top_p", "repetition_penalty"):
            value = getattr(settings, key)
            if value is not None:
                defaults[key] = value
        self.sample_kw = defaults
        self.generator = generator

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
        except _Superseded:
            return

    def _run(self, cancelled: threading.Event, final: bool) -> Iterator[TalkerOutput]:
        if final:
            self.ended = True
        while not self.done:
            if cancelled.is_set():
                return
            if self.logits is None:
                if not self.prefilled:
                    if not self._can_prefill():
                        if self.ended:
                            self.done = True  # nothing to speak
                        break
                    self._prefill()
                    self.prefilled = True
                    continue
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
        start = self.emitted
        self.emitted += len(take)
        if take:
            codes = torch.stack([t if t.ndim else t.view(()) for t in take]).to("cpu")
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

    def _prefill_with(self, inputs, positions) -> Any:
        """Prefill the (reused) static cache from position 0; returns the step's outputs."""
        decoder = self.decoder
        n = inputs.shape[1]
        if n + 2 > decoder.max_len:
            raise ValueError(f"talker prompt of {n} tokens exceeds its cache of {decoder.max_len}")
        self.frame_limit = max(1, min(self.settings.max_new_tokens, decoder.max_len - n - 1))
        with self._own_caches(), on_stream(self.loaded.stream("talker")):
            decoder.crop(0)
            return self.forward(self.loaded, decoder, inputs, positions)

    def _step_with(self, fill: Callable[..., None]) -> Any:
        """Run the captured step after ``fill(*static inputs)`` wrote this step's inputs."""
        with self._own_caches(), on_stream(self.loaded.stream("talker")):
            fill(*self.decoder.inputs)
            out = self.decoder.graph()
            return tuple(o.clone() for o in out) if isinstance(out, tuple) else out.clone()

    @contextlib.contextmanager
    def _own_caches(self) -> Iterator[None]:
        """Hold the session's caches for one step; a closed (superseded) reply takes none."""
        with self.step_lock:
            if self.done:
                raise _Superseded
            yield

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

    # architecture hooks -------------------------------------------------------------------------

    def _can_prefill(self) -> bool: ...

    def _prefill(self) -> None: ...

    def _input_ready(self) -> bool: ...

    def _forward_next(self) -> None: ...

    def _take_frame(self) -> bool:
        """Sample the pending frame; append it to ``frames``; True on the codec EOS."""
        ...

    @staticmethod
    def forward(loaded: LoadedOmni, decoder: StaticDecoder, inputs, positions) -> Any: ...

    @classmethod
    def new_decoder(cls, loaded: LoadedOmni, settings: TalkerSettings) -> StaticDecoder: ...

    @classmethod
    def dummy_prefill(cls, loaded: LoadedOmni, decoder: StaticDecoder) -> None:
        """One throw-away token through the cache (before capturing the step at session open)."""
        import torch

        inputs = decoder.inputs
        width = inputs[1].shape[-1] if cls is _Qwen25Stream else inputs[0].shape[-1]
        dtype = inputs[1].dtype if cls is _Qwen25Stream else inputs[0].dtype
        decoder.crop(0)
        cls.forward(loaded, decoder, torch.zeros((1, 1, width), dtype=dtype, device=loaded.device),
                    torch.zeros((3, 1), dtype=torch.long))


class _Qwen25Stream(_Stream):
    def __init__(self, *args) -> None:
        super().__init__(*args)
        import torch

        loaded = self.loaded
        talker = loaded.talker
        cfg = loaded.config.talker_config
        self.vecs: list[Any] = []
        self.frame_samples = samples_per_code(loaded)
        eos = [int(cfg.tts_codec_pad_token_id), int(cfg.tts_codec_end_token_id)]
        self.eos = set() if self.settings.ignore_eos else set(eos)
        suppress = [int(cfg.tts_codec_start_token_id)] + (eos if self.settings.ignore_eos else [])
        # ids token2wav cannot embed (>= num_embeds + 1: mask/bos/...), EOS excepted; a trained
        # talker never samples them, a random one does
        t2w = getattr(loaded.config, "token2wav_config", None)
        if t2w is not None:
            first_bad = int(t2w.dit_config.num_embeds) + 1
            suppress += [i for i in range(first_bad, int(cfg.vocab_size)) if i not in self.eos]
        self.sampler = TokenSampler(do_sample=self.settings.do_sample, suppress=suppress,
                                    generator=self.generator, **self.sample_kw)
        embed_tokens = loaded.thinker.get_input_embeddings()
        ids = torch.tensor([int(cfg.tts_text_end_token_id), int(cfg.tts_text_pad_token_id)], device=self.device)
        with torch.inference_mode():
            eos_pad = embed_tokens(ids)
        self.text_eos, self.text_pad = eos_pad[0], eos_pad[1]
        self.codec_embed = talker.model.embed_tokens
        self.history = None
        self.pos = 0
        self.last_code = None

    def _add_token(self, hidden: TokenHidden) -> None:
        if hidden.vec is not None and not hidden.eos:
            self.vecs.append(hidden.vec)

    def _can_prefill(self) -> bool:
        return self.prompt is not None and len(self.vecs) >= 1

    def _prefill(self) -> None:
        import torch

        loaded, prompt, cfg = self.loaded, self.prompt, self.loaded.config.talker_config
        spk = loaded.speakers[self.speaker]
        embed_tokens = loaded.thinker.get_input_embeddings()
        bos_embed = embed_tokens(torch.tensor([spk["bos_token"]], device=self.device))
        inputs = torch.cat([prompt.src, bos_embed.to(prompt.src.dtype), self.vecs[0][None]], dim=0)[None].clone()
        codec = self.codec_embed(torch.tensor([int(cfg.tts_codec_pad_token_id),
                                               int(cfg.tts_codec_start_token_id)], device=self.device))
        inputs[:, -2, :] += codec[0]
        inputs[:, -1, :] += codec[1]
        p = prompt.next_pos
        extra = torch.tensor([[p, p, p], [p + 1, p + 1, p + 1]], dtype=torch.long, device=prompt.positions.device)
        positions = torch.cat([prompt.positions, extra], dim=0).t()  # (3, n)
        self.pos = p + 2
        n_prompt = prompt.src.shape[0]
        self.history = torch.tensor(
            [[int(cfg.tts_codec_mask_token_id)] * n_prompt
             + [int(cfg.tts_codec_pad_token_id), int(cfg.tts_codec_start_token_id)]], dtype=torch.long)
        self.logits = self._prefill_with(inputs, positions)

    @staticmethod
    def forward(loaded: LoadedOmni, decoder: StaticDecoder, inputs, positions):
        talker = loaded.talker
        x = talker.thinker_to_talker_proj(inputs.to(talker.thinker_to_talker_proj.weight.dtype))
        out = talker.model(inputs_embeds=x, position_ids=positions.to(loaded.device).view(3, 1, -1),
                           use_cache=True, return_dict=True, **{loaded.cache_kwarg: decoder.cache})
        return talker.codec_head(out.last_hidden_state[:, -1, :]).float()

    @classmethod
    def new_decoder(cls, loaded: LoadedOmni, settings: TalkerSettings) -> StaticDecoder:
        import torch

        talker = loaded.talker
        device = loaded.device
        decoder = StaticDecoder(talker.model.config, settings.cache_tokens, device, graphs=settings.cuda_graphs,
                                name=f"{loaded.arch} talker step", capture_stream=loaded.stream("talker capture"))
        embed = talker.model.embed_tokens
        width = int(loaded.thinker.get_input_embeddings().weight.shape[1])
        code = torch.zeros((1,), dtype=torch.long, device=device)
        part = torch.zeros((width,), dtype=embed.weight.dtype, device=device)
        positions = torch.zeros((3, 1), dtype=torch.long, device=device)
        decoder.inputs = (code, part, positions)
        decoder.bind(lambda: cls.forward(loaded, decoder, (embed(code) + part)[None], positions))
        return decoder

    def _reply_part(self, s: int):
        if s < len(self.vecs):
            return self.vecs[s]
        if not self.ended:
            return None
        return self.text_eos if s == len(self.vecs) else self.text_pad

    def _input_ready(self) -> bool:
        return self._reply_part(self.steps) is not None

    def _forward_next(self) -> None:
        part = self._reply_part(self.steps)
        pos = self.pos
        self.pos += 1

        def fill(code, static_part, positions) -> None:
            code.fill_(self.last_code)
            static_part.copy_(part)
            positions.fill_(pos)

        self.logits = self._step_with(fill)

    def _take_frame(self) -> bool:
        import torch

        code = self.sampler(self.logits, self.history)
        if code in self.eos:
            return True
        self.history = torch.cat([self.history, torch.tensor([[code]])], dim=1)
        self.last_code = code
        self.frames.append(torch.tensor(code, dtype=torch.long))
        return False


class _Qwen3Stream(_Stream):
    def __init__(self, *args) -> None:
        super().__init__(*args)
        import torch

        loaded = self.loaded
        cfg = loaded.config
        tcfg = cfg.talker_config
        talker = loaded.talker
        self.groups = int(tcfg.num_code_groups)
        vocab = int(tcfg.text_config.vocab_size)
        self.codec_eos = int(tcfg.codec_eos_token_id)
        suppress = [i for i in range(max(0, vocab - 1024), vocab) if i != self.codec_eos]
        if self.settings.ignore_eos:
            suppress.append(self.codec_eos)
        self.sampler = TokenSampler(do_sample=self.settings.do_sample, suppress=suppress,
                                    generator=self.generator, **self.sample_kw)
        self.embed_tokens = loaded.thinker.get_input_embeddings()
        special = torch.tensor([int(cfg.tts_bos_token_id), int(cfg.tts_eos_token_id), int(cfg.tts_pad_token_id)],
                               device=self.device)
        self.proj_dtype = talker.text_projection.linear_fc1.weight.dtype
        with torch.inference_mode():
            proj = talker.text_projection(self.embed_tokens(special).to(self.proj_dtype))
        self.tts_bos, self.tts_eos, self.tts_pad = proj[0], proj[1], proj[2]
        self.assistant: list[Any] = []  # raw thinker embeddings: header rows + reply tokens
        if self.prompt is not None:
            self.assistant = list(self.prompt.header_src)
        self.codes_hist: list[int] = []
        self.frame_embed = None
        self.hidden = None
        self.pos = 0

    def _groups(self) -> int:
        return self.groups

    def _max_frames(self) -> int:
        # the reference completes a frame's residual codebooks in the *next* step, so a run that
        # hits max_new_tokens drops its last frame
        return max(1, self.settings.max_new_tokens - 1)

    def add(self, out: ThinkerOutput) -> None:
        if out.hidden.prompt is not None and self.prompt is None and not self.prefilled:
            self.assistant = list(out.hidden.prompt.header_src)
        super().add(out)

    def _add_token(self, hidden: TokenHidden) -> None:
        import torch

        if hidden.token_id is None or hidden.token_id < 0:
            return
        with torch.inference_mode():
            emb = self.embed_tokens(torch.tensor([hidden.token_id], device=self.device))[0]
        self.assistant.append(emb)

    def _can_prefill(self) -> bool:
        return self.prompt is not None and len(self.assistant) >= 4

    def _prefill(self) -> None:
        import torch

        loaded, prompt = self.loaded, self.prompt
        cfg, tcfg = loaded.config, loaded.config.talker_config
        talker = loaded.talker
        dtype = talker.codec_head.weight.dtype
        parts = []
        if prompt.user_src is not None and prompt.user_src.shape[0]:
            user = torch.empty((prompt.user_src.shape[0], tcfg.text_config.hidden_size), device=self.device,
                               dtype=dtype)
            mm = prompt.user_mm.to(self.device)
            src = prompt.user_src.to(self.proj_dtype)
            if mm.any():
                user[mm] = talker.hidden_projection(src[mm]).to(dtype)
            if (~mm).any():
                user[~mm] = talker.text_projection(src[~mm]).to(dtype)
            parts.append(user)
        head = talker.text_projection(torch.stack(self.assistant[:4]).to(self.proj_dtype)).to(dtype)
        text_part = torch.cat([head[:3], self.tts_pad.expand(4, -1).to(dtype), self.tts_bos[None].to(dtype),
                               head[3:4]], dim=0)
        speaker_id = int(loaded.speakers.get(self.speaker, next(iter(loaded.speakers.values()))))
        specials = torch.tensor([int(tcfg.codec_nothink_id), int(tcfg.codec_think_bos_id),
                                 int(tcfg.codec_think_eos_id), speaker_id, int(tcfg.codec_pad_id),
                                 int(tcfg.codec_bos_id)], device=self.device)
        codec_part = torch.cat([torch.zeros((3, text_part.shape[1]), device=self.device, dtype=dtype),
                                talker.model.codec_embedding(specials).to(dtype)], dim=0)
        parts.append(text_part + codec_part)
        inputs = torch.cat(parts, dim=0)[None]
        n = inputs.shape[1]
        positions = torch.arange(n, dtype=torch.long).view(1, n).expand(3, n)
        images = [it for it in prompt.user_items if it.kind == "image"]
        if images:
            ids = list(prompt.user_ids) + [int(cfg.tts_pad_token_id)] * text_part.shape[0]
            ids_t = torch.tensor([ids], dtype=torch.long)
            audios = [it.value for it in prompt.user_items if it.kind == "audio"]
            grid = torch.tensor([it.value for it in images], dtype=torch.long)
            # the thinker's get_rope_index: the talker's own copy reads ``audio_config`` from the
            # talker config, which has none (the reference generate fails on audio + image input)
            pos, _ = loaded.thinker.get_rope_index(ids_t, grid, None, torch.ones_like(ids_t), False,
                                                   torch.tensor(audios, dtype=torch.long) if audios else None,
                                                   None)
            positions = pos[:, 0, :].round().long()
        self.pos = int(positions.max()) + 1
        self.hidden, self.logits = self._prefill_with(inputs, positions)

    @staticmethod
    def forward(loaded: LoadedOmni, decoder: StaticDecoder, inputs, positions):
        talker = loaded.talker
        out = talker.model(inputs_embeds=inputs, position_ids=positions.to(loaded.device).reshape(3, 1, -1),
                           use_cache=True, return_dict=True, **{loaded.cache_kwarg: decoder.cache})
        hidden = out.last_hidden_state[:, -1:, :]
        return hidden, talker.codec_head(hidden[:, -1, :]).float()

    @classmethod
    def new_decoder(cls, loaded: LoadedOmni, settings: TalkerSettings) -> StaticDecoder:
        import torch

        talker = loaded.talker
        device = loaded.device
        decoder = StaticDecoder(talker.model.config, settings.cache_tokens, device, graphs=settings.cuda_graphs,
                                name=f"{loaded.arch} talker step", capture_stream=loaded.stream("talker capture"))
        width = int(loaded.config.talker_config.text_config.hidden_size)
        inputs = torch.zeros((1, 1, width), dtype=talker.codec_head.weight.dtype, device=device)
        positions = torch.zeros((3, 1), dtype=torch.long, device=device)
        decoder.inputs = (inputs, positions)
        decoder.bind(lambda: cls.forward(loaded, decoder, inputs, positions))
        return decoder

    def _trailing(self, k: int):
        index = 4 + k
        if index < len(self.assistant):
            return self.loaded.talker.text_projection(self.assistant[index][None].to(self.proj_dtype))[0]
        if not self.ended:
            return None
        return self.tts_eos if index == len(self.assistant) else self.tts_pad

    def _input_ready(self) -> bool:
        return self._trailing(self.steps - 1) is not None

    def _forward_next(self) -> None:
        part = self._trailing(self.steps - 1)
        pos = self.pos
        self.pos += 1

        def fill(inputs, positions) -> None:
            inputs.copy_((self.frame_embed + part.to(self.frame_embed.dtype))[None, None, :])
            positions.fill_(pos)

        self.hidden, self.logits = self._step_with(fill)

    def _take_frame(self) -> bool:
        import torch

        history = torch.tensor([self.codes_hist], dtype=torch.long) if self.codes_hist else None
        c0 = self.sampler(self.logits, history)
        if c0 == self.codec_eos and not self.settings.ignore_eos:
            return True
        self.codes_hist.append(c0)
        with self._own_caches():
            codes, self.frame_embed = self.code_frames(self.hidden, c0)
        self.frames.append(torch.tensor([c0, *codes], dtype=torch.long))
        return False
