"""The talker's whole frame, for every session at once, inside one batched step.

A frame used to be three hand-offs per session: sample codebook 0 in the session's thread
(penalty, suppressed ids, warpers, a host sync), run the code predictor (Qwen3), then step the
talker. With dozens of sessions their threads took turns on the GIL and reached the batch at
different times, so batches stayed small. Here the step does it all on the device:

    c0     = sample(the slot's pending logits; repetition penalty over the codes it has seen)
    codes  = code predictor frame (hidden, c0)                      (Qwen3; Qwen2.5 has one codebook)
    x      = embed(frame) + the reply part of the next step
             (Qwen3: made here from the reply token's id, see :class:`TextParts`)
    logits = talker(x)  → kept in the slot for the next frame

and the loop reads ``c0`` (and the residual codes) back for every row at once. The slot's state
(pending logits, hidden state, seen codes) lives in per-slot device buffers; a session loads it
after its own prefill (:meth:`FusedTalker.load`).
"""

from __future__ import annotations

from typing import Any

from ..code_predictor import CodePredictorSpec, frame_step
from ..sampling import sample_top_k_top_p
from ..loader import LoadedOmni
from ..streams import PinnedRows
from ..talker_stream import CodeSampling
from .batcher import RowInput, StepBatcher
from .rows import DrawBlocks
from .slots import SlotPool


def pick_codes(logits, seen, suppress, noise, rule: CodeSampling):
    """Codebook-0 codes of ``B`` rows, in the reference order: repetition penalty over the seen
    codes → suppressed ids → (sampling) temperature, top-k, top-p and a draw driven by ``noise``;
    greedy: argmax. Graph-safe (no host sync)."""
    import torch

    scores = logits
    if rule.repetition_penalty is not None and rule.repetition_penalty != 1.0:
        p = float(rule.repetition_penalty)
        scores = torch.where(seen, torch.where(scores < 0, scores * p, scores / p), scores)
    scores = scores.masked_fill(suppress, -float("inf"))
    if not rule.do_sample:
        return torch.argmax(scores, dim=-1)
    top_k = int(rule.top_k or scores.shape[-1])
    top_p = float(rule.top_p if rule.top_p is not None else 1.0)
    return sample_top_k_top_p(scores, noise, float(rule.temperature or 1.0), top_k, top_p)[:, 0]


class TextParts:
    """Qwen3's reply part of a talker step, for every row at once, from the reply token's id:
    the talker's ``text_projection`` of the thinker's embedding of that token, or of ``tts_eos`` /
    ``tts_pad`` after the text (``talker_qwen3.TEXT_EOS``, ``TEXT_PAD``). A session thus hands the
    batched talker an integer per frame instead of a device vector that its thinker had to copy
    out of each step's batch (a copy and a wait per token in that session's thread)."""

    def __init__(self, loaded: LoadedOmni) -> None:
        import torch

        cfg, talker = loaded.config, loaded.talker
        self.embed_tokens = loaded.thinker.get_input_embeddings()
        self.projection = talker.text_projection
        self.proj_dtype = talker.text_projection.linear_fc1.weight.dtype
        with torch.inference_mode():
            special = torch.tensor([int(cfg.tts_eos_token_id), int(cfg.tts_pad_token_id)], device=loaded.device)
            self.special = self.project(special)  # (2, W): TEXT_EOS's row, then TEXT_PAD's

    def project(self, ids: Any) -> Any:
        return self.projection(self.embed_tokens(ids).to(self.proj_dtype))

    def __call__(self, ids: Any) -> Any:
        """``ids`` (B,) long → parts (B, W)."""
        import torch

        tokens = self.project(ids.clamp(min=0))
        special = self.special[(-1 - ids).clamp(0, 1)]
        return torch.where((ids >= 0)[:, None], tokens, special)


class FusedTalker:
    """Per-slot frame state of the talker and its batched frame step (see the module doc)."""

    #: the step's outputs read on the host: codebook 0 and the residual codes of each frame
    HOST_OUTPUTS = (0, 1)

    def __init__(self, loaded: LoadedOmni, pool: SlotPool, rule: CodeSampling, *, graphs: bool,
                 gather_s: float, activity: Any = None) -> None:
        import torch

        self.loaded = loaded
        self.pool = pool
        self.rule = rule
        talker = loaded.talker
        self.qwen3 = loaded.arch != "qwen2_5_omni"
        device, slots = loaded.device, pool.slots
        vocab = int(talker.codec_head.weight.shape[0])
        width = int(talker.codec_head.weight.shape[1])
        dtype = talker.codec_head.weight.dtype
        self.k = int(rule.top_k or vocab) if rule.do_sample else 1
        self.logits = torch.zeros((slots, vocab), dtype=torch.float32, device=device)
        self.hidden = torch.zeros((slots, width), dtype=dtype, device=device)
        self.seen = torch.zeros((slots, vocab), dtype=torch.bool, device=device)
        self._seen_rows = PinnedRows(slots, vocab, device)  # where a reply's start stages its row
        self.suppress = torch.zeros((vocab,), dtype=torch.bool, device=device)
        ids = [i for i in rule.suppress if i < vocab]
        if ids:
            self.suppress[torch.tensor(ids, device=device)] = True
        inputs: list[RowInput]
        if self.qwen3:
            self.spec = CodePredictorSpec.of(loaded)
            self.cp_k = self.spec.top_k
            residual = max(1, self.spec.groups - 1) * self.cp_k
            self.text_parts = TextParts(loaded)
            # the reply token's id (or TEXT_EOS / TEXT_PAD), rotary position, and one row of
            # draws: codebook 0's, then the residual codebooks'
            inputs = [RowInput((1,), "long"), RowInput((3,), "long"), RowInput((self.k + residual,), "float32")]
        else:
            part_width = int(loaded.thinker.get_input_embeddings().weight.shape[1])
            part_dtype = str(talker.model.embed_tokens.weight.dtype).removeprefix("torch.")
            inputs = [RowInput((part_width,), part_dtype), RowInput((3,), "long"), RowInput((self.k,), "float32")]
        self.batcher = StepBatcher(
            "talker", self._make, inputs, capacity=slots, device=device, scratch=pool.length,
            stream=loaded.stream("talker"), graph_streams=loaded.graph_streams("talker"), graphs=graphs,
            gather_s=gather_s, activity=activity, column_buckets=pool.column_buckets(),
            host_outputs=self.HOST_OUTPUTS)

    # -- what a session calls ----------------------------------------------------------------------

    def load(self, slot: int, logits: Any, hidden: Any, seen: list[int]) -> None:
        """After the session's own prefill: its pending logits (and hidden state), and the codes
        the repetition penalty starts from. Queued behind the talker's steps without waiting for
        them (:func:`~..streams.queued_on`): the lock held here also holds the stage's loop."""
        from ..streams import queued_on

        self._seen_rows.stage(slot, seen)  # (outside the lock: the row is the slot's)
        with self.batcher.state_lock, queued_on(self.loaded.stream("talker"), logits, hidden):
            self.logits[slot].copy_(logits.reshape(-1))
            if hidden is not None:
                self.hidden[slot].copy_(hidden.reshape(-1))
            self._seen_rows.copy_to(self.seen[slot], slot)

    def draws(self, generator: Any) -> DrawBlocks:
        """A session's draws for its frames, each frame's in one row (c0's, then Qwen3's residual
        codebooks'; the step splits them)."""
        return DrawBlocks(self.batcher.row_inputs[-1].shape[0], self.rule.do_sample, self.loaded.device, generator)

    def close(self) -> None:
        self.batcher.close()

    # -- the step -----------------------------------------------------------------------------------

    def _make(self, bucket: int, columns: int, write_pos: Any, inputs: tuple[Any, ...]):
        import torch

        loaded, talker = self.loaded, self.loaded.talker
        cache = self.pool.rows(bucket, write_pos, columns)
        rows = torch.arange(bucket, device=loaded.device)
        logits_s, hidden_s, seen_s = self.logits[:bucket], self.hidden[:bucket], self.seen[:bucket]
        part, pos, draws = inputs
        noise = draws[:, : self.k]
        frame = None
        if self.qwen3:
            hid = torch.zeros_like(hidden_s)
            c0_in = torch.zeros((bucket, 1), dtype=torch.long, device=loaded.device)
            residual = draws[:, self.k :].view(bucket, -1, self.cp_k)
            frame = frame_step(loaded, self.rule.do_sample)(bucket, None, (hid, c0_in, residual))

        def step():
            active = write_pos < self.pool.length  # rows without work this step keep their state
            c0 = pick_codes(logits_s, seen_s, self.suppress, noise, self.rule)
            seen_s[rows, c0] = seen_s[rows, c0] | active
            if frame is not None:
                hid.copy_(hidden_s)
                c0_in.copy_(c0[:, None])
                codes, embed = frame()
                x = (embed + self.text_parts(part[:, 0]).to(embed.dtype))[:, None, :]
            else:
                codes = c0[:, None]
                x = talker.model.embed_tokens(c0[:, None]) + part[:, None, :]
                x = talker.thinker_to_talker_proj(x.to(talker.thinker_to_talker_proj.weight.dtype))
            out = talker.model(inputs_embeds=x, position_ids=pos.t().unsqueeze(-1), attention_mask=cache.mask(),
                               use_cache=True, return_dict=True, **{loaded.cache_kwarg: cache})
            hidden = out.last_hidden_state[:, -1, :]
            logits = talker.codec_head(hidden).float()
            logits_s.copy_(torch.where(active[:, None], logits, logits_s))
            if frame is not None:  # only Qwen3's code predictor starts from the hidden state
                hidden_s.copy_(torch.where(active[:, None], hidden.to(hidden_s.dtype), hidden_s))
            return c0, codes

        return step
