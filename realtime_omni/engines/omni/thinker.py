"""Streaming thinker with a KV cache kept per session (resumable segments).

The session keeps one :class:`ThinkerContext`: the thinker's static KV cache (:class:`~.graphs.StaticDecoder`) plus, for every token
in it, the token id, its rotary position and the vector the talker needs for that token. Each
conversation message in the cache is a record with a fingerprint; a new request re-uses the
longest matching prefix of records, crops the cache where the conversation diverges and prefills
only what is new (normally: the closing ``<|im_end|>\\n`` of the last reply, the new user turn and
the ``<|im_start|>assistant\\n`` header). A barge-in (:meth:`StreamingThinker.confirm`) crops the
cache back to the last token the listener heard.

The model is called through its sub-modules with explicit 3-D rotary positions (no module state
such as ``rope_deltas`` is touched), so one loaded model serves many sessions from many threads.

What the talker needs per token (``ThinkerOutput.hidden``):

* Qwen2.5-Omni: ``last_hidden + token_embedding`` (multimodal positions: ``last_hidden`` only),
  exactly what ``Qwen2_5OmniForConditionalGeneration.generate`` feeds its talker;
* Qwen3-Omni: the token embedding for text tokens and the layer-``accept_hidden_layer`` hidden state
  for audio/image tokens (``Qwen3OmniMoeForConditionalGeneration._get_talker_user_parts``); reply
  tokens need only their id (the talker embeds them).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..base import ThinkerOutput, ThinkRequest, TurnMessage
from .context import (
    ReplyState,
    ThinkerContext,
    TokenHidden,
    TokenRows,
    talker_prompt,
)
from .detokenize import TextDeltas
from .streams import settled_copies
from .loader import LoadedOmni
from .prompt import PromptRenderer, norm_text
from .sampling import TokenSampler
from .talker_reads import TalkerReads
from .talker_stream import CodeSampling
from .thinker_calls import ThinkerCalls, ban_ids
from .thinker_prefill import ThinkerPrefill
from .thinker_steps import ThinkerSteps
from .tool_calls import call_mode, tools_block

if TYPE_CHECKING:
    from .batching.batcher import Lookahead
    from .batching.rows import Rows

log = logging.getLogger(__name__)

QWEN25_SYSTEM_PROMPT = (
    "You are Qwen, a virtual human developed by the Qwen Team, Alibaba Group, capable of perceiving "
    "auditory and visual inputs, as well as generating text and speech."
)


# ---------------------------------------------------------------------------------------------
# the thinker


@dataclass
class ThinkerSettings:
    max_new_tokens: int = 1024
    system_prompt: str | None = None
    do_sample: bool | None = None
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    repetition_penalty: float | None = None
    #: benchmarks only: never stop on EOS (generate exactly max tokens)
    ignore_eos: bool = False
    #: prompt + reply budget; older messages are dropped (and re-prefilled) past it
    max_context_tokens: int | None = None
    #: size of the session's static KV cache (tokens); also caps the context
    cache_tokens: int = 8192
    #: replay the decode step as a CUDA graph (CUDA only)
    cuda_graphs: bool = True


def thinker_sampling(loaded: LoadedOmni, settings: ThinkerSettings) -> CodeSampling:
    """How reply tokens are picked: the settings, else the checkpoint's generation config."""
    gc = getattr(loaded.thinker, "generation_config", None)

    def pick(value, name, default):
        if value is not None:
            return value
        got = getattr(gc, name, None) if gc is not None else None
        return default if got is None else got

    return CodeSampling(
        do_sample=bool(pick(settings.do_sample, "do_sample", False)),
        temperature=float(pick(settings.temperature, "temperature", 1.0)),
        top_k=pick(settings.top_k, "top_k", None),
        top_p=pick(settings.top_p, "top_p", None),
        repetition_penalty=pick(settings.repetition_penalty, "repetition_penalty", None),
        suppress=(), eos=frozenset(),
    )


@dataclass(frozen=True)
class ReplyStart:
    """Where a reply's time went from its prefill's return to its first token (seconds): the
    talker prompt's snapshot, the first token's pick, and the batched state's load (0 alone).
    Read by the capacity benchmark, where sessions started together queue for one another."""

    prompt_s: float
    pick_s: float
    load_s: float


class StreamingThinker(ThinkerPrefill, ThinkerCalls, ThinkerSteps):
    """Per-session thinker: ``run(request)`` streams :class:`ThinkerOutput` per token."""

    def __init__(self, loaded: LoadedOmni, settings: ThinkerSettings, generator: Any = None,
                 rows: Rows | None = None, token_rows: TokenRows | None = None) -> None:
        self.loaded = loaded
        self.settings = settings
        #: the model's batched thinker and this session's slot in it; None: steps run alone
        self.rows = rows
        #: where each reply token's device rows for the session's talker go (see :class:`TokenRows`)
        self.token_rows = token_rows if token_rows is not None else TokenRows()
        self.ctx = ThinkerContext()
        self.renderer = PromptRenderer(loaded)
        self.generator = generator
        self.lock = threading.RLock()
        self.turn = 0
        self.closed = False
        #: the turn of the reply being generated, if any (a prefill ahead of a turn skips then)
        self._running_turn: int | None = None
        #: tokens evaluated by the last prefill (not reused from the cache)
        self.last_prefill_tokens = 0
        self.last_prompt_tokens = 0
        self.last_start: ReplyStart | None = None
        tcfg = loaded.config.thinker_config
        self._talker_reads = TalkerReads.of(loaded)
        text_cfg = tcfg.get_text_config() if hasattr(tcfg, "get_text_config") else tcfg.text_config
        self._text_cfg = text_cfg
        self._cache_len = max(64, int(settings.cache_tokens))
        self._max_positions = min(int(getattr(text_cfg, "max_position_embeddings", 32768)), self._cache_len)
        self._sampler = self._make_sampler()
        #: batched: the reply's steps queued ahead in the model's thinker (see ``_next_batched``)
        self._ahead: Lookahead | None = None
        self._draws: Any = None  # batched: the sampler's draws for those steps (``rows.DrawBlocks``)

    # -- public ------------------------------------------------------------------------------

    def run(self, request: ThinkRequest) -> Iterator[ThinkerOutput]:
        import torch

        with self.lock:
            if self.closed:
                return
            self.turn += 1
            turn = self.turn
            self._running_turn = turn
        try:
            with torch.inference_mode(), self._streaming():
                yield from self._run(request, turn)
        finally:
            with self.lock:
                if self._running_turn == turn:  # else a newer reply runs (and owns the mark)
                    self._running_turn = None

    def _streaming(self):
        """Counted among the sessions the batched thinker waits for while this reply runs."""
        import contextlib

        return self.rows.batcher.activity.streaming() if self.rows is not None else contextlib.nullcontext()

    def confirm(self, spoken_text: str) -> int:
        """Cut the last reply back to what was heard; returns the new cache length."""
        with self.lock:
            self.turn += 1  # an in-flight run() stops at its next step
            reply = self.ctx.reply
            if reply is None or self.closed:
                return len(self.ctx)
            spoken = spoken_text or ""
            common = 0
            limit = min(len(reply.text), len(spoken))
            while common < limit and reply.text[common] == spoken[common]:
                common += 1
            keep = 0
            for end in reply.ends:
                if end <= common:
                    keep += 1
                else:
                    break
            keep = min(keep, len(reply.ids))
            # drop trailing tokens whose text never showed (the first bytes of a character)
            while keep and reply.ends[keep - 1] == (reply.ends[keep - 2] if keep > 1 else 0):
                keep -= 1
            position = reply.content_start + min(keep, reply.forwarded)
            self.ctx.crop(position)
            reply.ids = reply.ids[:keep]
            reply.ends = reply.ends[:keep]
            reply.text = reply.text[: reply.ends[-1]] if keep else ""
            reply.forwarded = min(reply.forwarded, keep)
            record = reply.record
            record.settle(("assistant", norm_text(spoken)))
            record.end = position
            record.closed = False
            if not self.ctx.messages or self.ctx.messages[-1] is not record:
                self.ctx.messages = [m for m in self.ctx.messages if m.start < record.start] + [record]
            return len(self.ctx)

    def crop(self, position: int) -> int:
        """Cut the cache back to ``position`` tokens (inside the last reply, like confirm())."""
        with self.lock:
            self.turn += 1
            reply = self.ctx.reply
            self.ctx.crop(position)
            if reply is not None and position >= reply.record.start:
                keep = max(0, position - reply.content_start)
                reply.ids = reply.ids[:keep]
                reply.ends = reply.ends[:keep]
                reply.text = reply.text[: reply.ends[-1]] if keep else ""
                reply.forwarded = min(reply.forwarded, keep)
                reply.record.settle(("assistant", norm_text(reply.text)))
                reply.record.closed = False
            return len(self.ctx)

    @property
    def running(self) -> bool:
        return self._running_turn is not None

    @property
    def cache_length(self) -> int:
        decoder = self.ctx.decoder
        return decoder.length if decoder is not None else 0

    def prepare(self) -> None:
        """Allocate the KV cache and capture the decode step now (at session open) rather than
        on the first reply: one throw-away token is run and cut off again."""
        import torch

        with self.lock, torch.inference_mode():
            if self.closed or self.ctx.ids:
                return
            if self.rows is not None:
                # batched: the step was captured at load; the slot's cache views are built now,
                # not in the first turn's preparation, where turns starting together queue for
                # the interpreter (with 48 layers on the CPU: 1.4 ms of a turn's 1.9, see
                # benchmarks/omni_turn_preparation.py)
                self._decoder()
                return
            first = torch.tensor([[self.loaded.tokens.im_start]], dtype=torch.long)
            self._decoder().capture_now(lambda: self._forward(first, torch.zeros((3, 1), dtype=torch.long), {}))

    def close(self) -> None:
        with self.lock:
            self.closed = True
            self.turn += 1
            self._drain_ahead()
            self.ctx.free()

    # -- internals ---------------------------------------------------------------------------

    def _make_sampler(self) -> TokenSampler:
        return thinker_sampling(self.loaded, self.settings).sampler(self.generator)

    def _target(self, request: ThinkRequest) -> list[TurnMessage]:
        system = request.instructions or ""
        if self.settings.system_prompt is not None:
            base = self.settings.system_prompt
        elif self.loaded.arch == "qwen2_5_omni":
            base = QWEN25_SYSTEM_PROMPT
        else:
            base = ""
        if base and system and norm_text(system) != norm_text(base):
            system = base + "\n\n" + system
        elif base:
            system = base
        if self.loaded.tools is not None and request.tools:
            # declared under every tool_choice (``none`` only keeps the call tags out of the reply):
            # a session switching its choice keeps its context
            system = (system + "\n\n" if system else "") + tools_block(request.tools)
        target: list[TurnMessage] = []
        if system:
            target.append(TurnMessage(role="system", text=system))
        target.extend(request.messages)
        return target

    def _alive(self, turn: int, request: ThinkRequest) -> bool:
        return not self.closed and self.turn == turn and not request.cancelled.is_set()

    def _run(self, request: ThinkRequest, turn: int) -> Iterator[ThinkerOutput]:
        import torch

        loaded = self.loaded
        tok = loaded.tokens
        with self.lock:
            if not self._alive(turn, request):
                return
            self.preparing_since = time.perf_counter()  # (under the lock: a prefill ahead sets it too)
            self._drain_ahead()  # an earlier reply's generator left unclosed: nothing of it may run now
            prefilled, prompt, reply, logits = self._prefill(request, turn)
            back = time.perf_counter()
            self.last_prefill_tokens = prefilled
            self.last_prompt_tokens = prompt
            snapshot = talker_prompt(self.ctx, self.loaded, turn)
            prompted = time.perf_counter()
            mode = call_mode(request, loaded.tools)
            banned = self._banned(request)
            token = self._first_token(logits, mode, request)
            picked = time.perf_counter()
        log.info("omni thinker turn %d: prefilled %d of %d prompt tokens", turn, prefilled, prompt)

        def out(text: str, hidden: TokenHidden) -> ThinkerOutput:
            return ThinkerOutput(text=text, hidden=hidden, prefilled_tokens=prefilled, prompt_tokens=prompt)

        max_new = request.max_output_tokens or self.settings.max_new_tokens
        max_new = max(1, min(int(max_new), self._max_positions - prompt - 1))
        eos = set() if self.settings.ignore_eos else set(tok.eos)
        qwen25 = loaded.arch == "qwen2_5_omni"
        all_ids = torch.tensor([self.ctx.ids], dtype=torch.long)
        first = True

        def attach_prompt(hidden: TokenHidden) -> TokenHidden:
            nonlocal first
            if first:
                self.token_rows.put_prompt(turn, snapshot)  # not on the output: see TokenRows
                hidden.opens = True
                first = False
            return hidden

        batched = self.rows is not None
        rows_stream = loaded.stream("token rows")  # where the talker's rows are copied (see settled_copies)
        if batched:  # later tokens are picked on the device, with the context as the penalty's history
            self.rows.state.load(self.rows.slot, self.ctx.ids, banned)
        self.last_start = ReplyStart(prompted - back, picked - prompted, time.perf_counter() - picked)
        try:
            if mode != "none" and token == loaded.tools.open:  # the reply is a function call
                yield from self._call(request, turn, reply, {"prefilled_tokens": prefilled, "prompt_tokens": prompt},
                                      max_new)
                return
            while True:
                if not self._alive(turn, request):
                    return
                if token in eos:
                    yield out("", attach_prompt(TokenHidden(turn, len(reply.ids), token, end=True, eos=True)))
                    return
                last = len(reply.ids) + 1 >= max_new
                if not qwen25 or last:
                    # Qwen3's talker needs only the token id: hand it over before the forward pass.
                    # The last token of a reply cut by max tokens is never forwarded (as in the
                    # reference generate); it enters the cache with the next turn's prefill.
                    with self.lock:
                        delta = self._append_text(reply, token)
                    yield out(delta, attach_prompt(TokenHidden(turn, len(reply.ids) - 1, token)))
                    if last:
                        if self._alive(turn, request):
                            yield out("", attach_prompt(TokenHidden(turn, -1, -1, end=True)))
                        return
                    if not self._alive(turn, request):
                        return
                with self.lock:
                    if not self._alive(turn, request):
                        return
                    if batched:
                        picked, vec = self._next_batched(token, forwards=max_new - 1 - reply.forwarded)
                    else:
                        logits, vec = self._step(token)
                    reply.forwarded += 1
                    reply.record.end = len(self.ctx)
                    if qwen25:
                        delta = self._append_text(reply, token)
                if qwen25:
                    if vec is not None and request.want_audio:
                        self.token_rows.put(turn, len(reply.ids) - 1,
                                            settled_copies(rows_stream, (vec,))[0] if batched else vec)
                    yield out(delta, attach_prompt(TokenHidden(turn, len(reply.ids) - 1, token)))
                if batched:
                    token = picked
                else:
                    all_ids = torch.cat([all_ids, torch.tensor([[token]])], dim=1)
                    token = self._sampler(ban_ids(logits, banned), all_ids)
        finally:
            with self.lock:
                self._drain_ahead()

    def _append_text(self, reply: ReplyState, token: int) -> str:
        reply.ids.append(token)
        if reply.deltas is None:
            reply.deltas = TextDeltas(self.loaded.tokenizer)
        delta = reply.deltas.delta(reply.ids)  # ("" while a character's bytes are incomplete)
        reply.text += delta
        reply.ends.append(len(reply.text))
        return delta
