"""The batched steps of each omni stage, and the slots a session holds in them.

* thinker: one reply token per row → next-token logits and the talker's vector for that token;
* talker: a whole codec frame per row (codebook 0 sampled in the step, Qwen3's residual codebooks,
  the next talker step), see :mod:`.talker_frames`.

Each step is the same sub-module calls as the per-session path (``language_model``,
``talker.model``, ``code_predictor.model``), run over ``bucket`` rows with the stage's
:class:`~.slots.RowsCache` and an explicit mask, so batched and single-session runs give the same
tokens (the tests compare them).
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from ..loader import LoadedOmni
from ..streams import PinnedRows
from ..talker_qwen3 import Qwen3Stream
from ..talker_qwen25 import Qwen25Stream
from ..talker_reads import TalkerReads
from ..talker_stream import CodeSampling, TalkerSettings
from ..thinker import ThinkerSettings, thinker_sampling
from .batcher import RowInput, StepBatcher
from .prefill import PrefillBatcher, talker_body, talker_rows, thinker_body, thinker_merge, thinker_rows
from .prefill_graphs import PrefillGraphs
from .rows import DrawBlocks, Rows, SessionRows
from .slots import SlotPool, SlotsFull
from .talker_frames import FusedTalker, pick_codes

log = logging.getLogger(__name__)


#: tokens one batched prefill may hold (the largest prefill graph: rows x tokens within it)
PREFILL_TOKENS = 8192


def _talker_input_dim(loaded: LoadedOmni) -> int:
    """Width of the talker's prompt rows: Qwen2.5's are thinker vectors, projected in the forward."""
    if loaded.arch == "qwen2_5_omni":
        return int(loaded.talker.thinker_to_talker_proj.in_features)
    return int(loaded.talker.model.config.hidden_size)


def _positions(pos: Any) -> Any:
    """``(bucket, 3)`` per-row rotary positions → the models' ``(3, bucket, 1)``."""
    return pos.t().unsqueeze(-1)


class ThinkerTokens:
    """The thinker's per-slot token state, so a step picks its row's next token on the device.

    A step forwards either the token its session gives or, chained, the token the slot's previous
    step picked (``last``); it then picks the next token with the model's sampling rule
    (repetition penalty over ``seen``: the session's whole context and reply so far, as the
    per-session sampler's history). A session can thus queue steps ahead of reading their tokens.
    Each slot also has its own suppressed ids (``suppress``): the tool-call tags outside a call,
    and, while a function call is written, every token its grammar does not allow next.
    """

    def __init__(self, loaded: LoadedOmni, pool: SlotPool, rule: CodeSampling) -> None:
        import torch

        self.loaded = loaded
        self.pool = pool
        self.rule = rule
        vocab = int(loaded.thinker.lm_head.weight.shape[0])
        device = loaded.device
        self.k = int(rule.top_k or vocab) if rule.do_sample else 1
        #: the thinker batcher's (see ``StepBatcher.state_lock``)
        self.lock = threading.Lock()
        self.last = torch.zeros((pool.slots,), dtype=torch.long, device=device)
        self.seen = torch.zeros((pool.slots, vocab), dtype=torch.bool, device=device)
        self.suppress = torch.zeros((pool.slots, vocab), dtype=torch.bool, device=device)
        #: per slot, the host rows a reply's start (:meth:`load`) and a call's grammar
        #: (:meth:`restrict`) stage their masks in
        self._seen_rows = PinnedRows(pool.slots, vocab, device)
        self._suppress_rows = PinnedRows(pool.slots, vocab, device)

    def load(self, slot: int, history: list[int], banned: list[int] | tuple[int, ...] = ()) -> None:
        """At the start of a reply: the ids the repetition penalty covers (the context so far),
        and the ids the reply may not pick. Queued behind the thinker's steps without waiting
        for them (:func:`~..streams.queued_on`): the lock held here also holds the stage's loop."""
        from ..streams import queued_on

        self._seen_rows.stage(slot, set(history))  # (outside the lock: the rows are the slot's)
        self._suppress_rows.stage(slot, banned)
        with self.lock, queued_on(self.loaded.stream("thinker")):
            self._seen_rows.copy_to(self.seen[slot], slot)
            self._suppress_rows.copy_to(self.suppress[slot], slot)

    def restrict(self, slot: int, allowed: Any) -> None:
        """The slot's next picks may take only the ids ``allowed`` marks (a (vocab,) bool numpy
        array, padded with False to the head's size); before the step that picks them is queued.

        Staged in the slot's pinned row and queued behind the thinker's steps without waiting
        for them, as :meth:`load` does."""
        import numpy as np

        from ..streams import queued_on

        self._suppress_rows.stage_mask(slot, np.logical_not(np.asarray(allowed, dtype=bool)))
        with self.lock, queued_on(self.loaded.stream("thinker")):
            self._suppress_rows.copy_to(self.suppress[slot], slot)

    def draws(self, generator: Any) -> DrawBlocks:
        """A session's draws for its steps (zeros as host values when the rule is greedy)."""
        return DrawBlocks(self.k, self.rule.do_sample, self.loaded.device, generator)

    def row_inputs(self) -> list[RowInput]:
        # token id, rotary position (3), chain (1: forward the slot's last picked token), draws
        return [RowInput((1,), "long"), RowInput((3,), "long"), RowInput((1,), "bool"), RowInput((self.k,), "float32")]

    #: the step's outputs read on the host: the picked token ids
    HOST_OUTPUTS = (0,)

    def make(self, bucket: int, columns: int, write_pos: Any, inputs: tuple[Any, ...]):
        import torch

        loaded = self.loaded
        lm = loaded.thinker.model.language_model
        head = loaded.thinker.lm_head
        qwen25 = loaded.arch == "qwen2_5_omni"
        ids, pos, chain, noise = inputs
        cache = self.pool.rows(bucket, write_pos, columns)
        rows = torch.arange(bucket, device=loaded.device)
        last_s, seen_s, suppress_s = self.last[:bucket], self.seen[:bucket], self.suppress[:bucket]

        def step():
            active = write_pos < self.pool.length  # rows without work this step keep their state
            token = torch.where(chain[:, 0], last_s, ids[:, 0])
            seen_s[rows, token] = seen_s[rows, token] | active  # the sampler's history includes it
            embeds = lm.embed_tokens(token[:, None])  # (bucket, 1, H)
            out = lm(inputs_embeds=embeds, position_ids=_positions(pos), attention_mask=cache.mask(),
                     use_cache=True, return_dict=True, **{loaded.cache_kwarg: cache})
            last = out.last_hidden_state[:, -1, :]
            picked = pick_codes(head(last).float(), seen_s, suppress_s, noise, self.rule)
            last_s.copy_(torch.where(active, picked, last_s))
            # what the talker needs of a reply token: ``TalkerReads.vectors`` for a text token
            # (Qwen2.5); Qwen3's talker needs only the token's id (its batched step embeds and
            # projects the ids itself, see ``talker_frames.TextParts``; the context embeds its
            # reply tokens when a talker prompt reads them, ``ThinkerContext.source_rows``)
            if qwen25:
                return picked, last + embeds[:, 0, :]
            return (picked,)

        return step


class OmniBatching:
    """Slot pools and step batchers of one loaded model, shared by all its sessions.

    ``slots`` bounds the live sessions: a session beyond it is refused (:class:`SlotsFull`), it
    never slows the others down.
    """

    def __init__(self, loaded: LoadedOmni, *, slots: int, thinker_tokens: int, talker_tokens: int,
                 graphs: bool, talker_settings: TalkerSettings, thinker_settings: ThinkerSettings,
                 gather_s: float = 0.002, prefill_gather_s: float = 0.005, lookahead: int = 12,
                 pipelined: bool = True, prefill_burst_s: float = 0.0) -> None:
        self.loaded = loaded
        self.slots = int(slots)
        device, dtype = loaded.device, loaded.dtype
        graphs = bool(graphs)
        text_cfg = loaded.config.thinker_config.text_config
        self.thinker_pool = SlotPool(text_cfg, slots, thinker_tokens, device, dtype, "thinker")
        self.talker_pool = SlotPool(loaded.talker.model.config, slots, talker_tokens, device, dtype, "talker")
        common = dict(capacity=self.slots, device=device, graphs=graphs, gather_s=gather_s)
        self.lookahead = max(1, int(lookahead))
        self.thinker_tokens = ThinkerTokens(loaded, self.thinker_pool, thinker_sampling(loaded, thinker_settings))
        self.thinker = StepBatcher(
            "thinker", self.thinker_tokens.make, self.thinker_tokens.row_inputs(),
            scratch=self.thinker_pool.length, stream=loaded.stream("thinker"),
            graph_streams=loaded.graph_streams("thinker"), state_lock=self.thinker_tokens.lock,
            column_buckets=self.thinker_pool.column_buckets(), host_outputs=ThinkerTokens.HOST_OUTPUTS, **common)
        reads = TalkerReads.of(loaded)
        thinker_graphs = PrefillGraphs(
            loaded, self.thinker_pool, thinker_body(loaded, self.thinker_pool, reads), name="thinker prefill",
            dim=int(text_cfg.hidden_size), enabled=graphs, max_rows=self.slots, max_tokens=PREFILL_TOKENS,
            capture_streams=loaded.graph_streams("thinker prefill"))
        self.prefill = PrefillBatcher(loaded, self.thinker_pool, thinker_rows(loaded, reads, thinker_graphs),
                                      stage="thinker", merge=thinker_merge, gather_s=prefill_gather_s,
                                      token_budget=PREFILL_TOKENS, graphs=thinker_graphs, burst_s=prefill_burst_s)
        talker_graphs = PrefillGraphs(
            loaded, self.talker_pool, talker_body(loaded, self.talker_pool), name="talker prefill",
            dim=_talker_input_dim(loaded), enabled=graphs, max_rows=self.slots, max_tokens=PREFILL_TOKENS,
            capture_streams=loaded.graph_streams("talker prefill"))
        self.talker_prefill = PrefillBatcher(loaded, self.talker_pool, talker_rows(loaded, talker_graphs),
                                             stage="talker", gather_s=prefill_gather_s, token_budget=PREFILL_TOKENS,
                                             graphs=talker_graphs, burst_s=prefill_burst_s)
        # the sessions of one thinker prefill batch reach the talker's prefill together
        self.prefill.on_finished = self.talker_prefill.expect
        kind = Qwen25Stream if loaded.arch == "qwen2_5_omni" else Qwen3Stream
        self.talker_frames = FusedTalker(loaded, self.talker_pool, kind.code_sampling(loaded, talker_settings),
                                         graphs=graphs, gather_s=gather_s)
        self.talker = self.talker_frames.batcher
        # and each stage's first decode steps after a prefill batch go together
        self.prefill.stepper, self.talker_prefill.stepper = self.thinker, self.talker
        for batcher in self.batchers:
            batcher.pipelined = bool(pipelined)
        log.info("omni batching: %s", self.describe())

    def describe(self) -> str:
        """What the start-up log says: slots, and the KV memory each session holds."""
        per = self.thinker_pool.bytes_per_slot + self.talker_pool.bytes_per_slot
        return (f"{self.slots} session slots (REALTIME_OMNI_OMNI_MAX_SESSIONS); KV cache per session "
                f"{per / 2**20:.1f} MiB (thinker {self.thinker_pool.length} tokens, talker "
                f"{self.talker_pool.length} tokens), {self.slots * per / 2**30:.2f} GiB in all")

    @property
    def batchers(self) -> list[StepBatcher]:
        return [self.thinker, self.talker]

    def open(self) -> SessionRows:
        thinker_slot = self.thinker_pool.allocate()
        try:
            talker_slot = self.talker_pool.allocate()
        except SlotsFull:
            self.thinker_pool.release(thinker_slot)
            raise
        return SessionRows(
            thinker=Rows(self.thinker, self.thinker_pool, thinker_slot, self.prefill, state=self.thinker_tokens,
                         lookahead=self.lookahead, then=talker_slot),
            talker=Rows(self.talker, self.talker_pool, talker_slot, self.talker_prefill, state=self.talker_frames,
                        lookahead=self.lookahead),
        )

    def release(self, rows: SessionRows) -> None:
        self.thinker_pool.release(rows.thinker.slot)
        self.talker_pool.release(rows.talker.slot)

    def warm(self) -> None:
        for batcher in self.batchers:
            batcher.warm()
        for prefill in (self.prefill, self.talker_prefill):
            if prefill.graphs is not None:
                prefill.graphs.warm()

    def stats(self) -> dict[str, Any]:
        return {
            "slots": self.slots, "in_use": self.thinker_pool.in_use,
            "kv_bytes_per_session": self.thinker_pool.bytes_per_slot + self.talker_pool.bytes_per_slot,
            **{b.name: b.stats() for b in self.batchers}, "thinker prefill": self.prefill.stats(),
            "talker prefill": self.talker_prefill.stats(),
        }

    def close(self) -> None:
        self.prefill.close()
        self.talker_prefill.close()
        for batcher in self.batchers:
            batcher.close()
