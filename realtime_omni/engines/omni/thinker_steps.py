"""The thinker's forward steps: one generated token at a time, alone (a CUDA graph per session)
or in the model's batched thinker (a row in this session's slot, with steps queued ahead).
"""

from __future__ import annotations

from typing import Any

from .audio_tower import merge_audio
from .device_copy import to_device
from .graphs import StaticDecoder
from .streams import on_stream


class ThinkerSteps:
    """Mixed into :class:`~.thinker.StreamingThinker` (its state: ``ctx``, ``loaded``, ``rows``,
    ``settings``, ``generator``, ``_ahead``, ``_talker_reads``, the cache's shape)."""

    def _decoder(self) -> StaticDecoder:
        ctx = self.ctx
        if ctx.decoder is None:
            import torch

            device = self.loaded.device
            rows = self.rows
            decoder = StaticDecoder(self._text_cfg, self._cache_len, device,
                                    graphs=self.settings.cuda_graphs and rows is None,
                                    name=f"{self.loaded.arch} thinker step",
                                    pool=rows.pool if rows else None, slot=rows.slot if rows else None,
                                    **self.loaded.graph_streams("thinker"))
            ids = torch.zeros((1, 1), dtype=torch.long, device=device)
            positions = torch.zeros((3, 1), dtype=torch.long, device=device)
            decoder.bind(lambda: self._forward(ids, positions, {}, decoder))
            decoder.inputs = (ids, positions)
            ctx.decoder = decoder
        return ctx.decoder

    def _forward(self, input_ids, positions, mm_kwargs, decoder: StaticDecoder | None = None):
        """One thinker forward over new tokens; returns last-token logits and talker vectors."""
        loaded = self.loaded
        if decoder is None:
            decoder = self._decoder()
        device = loaded.device
        inputs = merge_audio(loaded, input_ids, mm_kwargs)
        ids = inputs["input_ids"]
        out = loaded.thinker.model(
            position_ids=to_device(positions, device).view(3, 1, -1),
            use_cache=True,
            output_hidden_states=self._talker_reads.select,
            return_dict=True,
            **{loaded.cache_kwarg: decoder.cache},
            **inputs,
        )
        last = out.last_hidden_state
        logits = loaded.thinker.lm_head(last[:, -1:, :])[:, -1, :].float()
        return logits, self._talker_reads.vectors(ids, out.hidden_states, last)[0]

    def _append(self, ids: list[int], positions, src) -> None:
        ctx = self.ctx
        mm_ids = {self.loaded.tokens.audio, self.loaded.tokens.image}
        ctx.ids += ids
        ctx.mm += [i in mm_ids for i in ids]
        ctx.positions.append(positions.t())
        ctx.src.append(src.detach())
        ctx.next_pos = int(positions.max()) + 1

    def _step(self, token: int):
        """Forward one generated token; returns (next logits, its talker vector or None)."""
        try:
            decoder = self._decoder()
            ids, pos = decoder.inputs
            with on_stream(self.loaded.stream("thinker")):
                ids.fill_(token)
                pos.fill_(self.ctx.next_pos)
                logits, src = decoder.graph()  # replayed: the graph's buffers, copied below
                logits, src = logits.clone(), src.clone()
        except BaseException:
            self.ctx.free()  # a half-updated KV cache: the next turn re-prefills from scratch
            raise
        self.ctx.append_token(token, self.ctx.next_pos, src[0], self.loaded.tokens)
        vec = src[0] if self.loaded.arch == "qwen2_5_omni" else None
        return logits, vec

    def _next_batched(self, token: int, forwards: int) -> tuple[int, Any]:
        """Forward ``token`` in the model's batched thinker, in this session's slot; returns the
        token the step picked next and the talker's vector (Qwen2.5) or None (Qwen3's talker
        needs only the token ids).

        Up to ``rows.lookahead`` steps stay queued: each later one forwards, on the device, the
        token the step before it picked (``ThinkerTokens``). What is queued but not read when
        the reply ends is withdrawn (:meth:`_drain_ahead`); a step that ran past the reply wrote
        beyond the cache's length, where no row attends and the next token overwrites it.
        ``forwards``: forward passes the reply may still make, this one included."""
        rows, decoder = self.rows, self._decoder()
        ahead = self._ahead
        if ahead is None:  # (imported here: the batching package imports this module)
            from .batching.batcher import Lookahead

            ahead = self._ahead = Lookahead(rows.batcher, rows.slot, rows.lookahead)
        if self._draws is None:
            self._draws = rows.state.draws(self.generator)
        draws = self._draws

        def push(chain: bool) -> None:
            offset = len(ahead)
            pos = self.ctx.next_pos + offset
            ahead.push((token, [pos] * 3, chain, draws.next()), decoder.write_position() + offset, pos)

        try:
            if not len(ahead):
                push(chain=False)
            while ahead.room > 0 and len(ahead) < forwards:
                push(chain=True)
            (picked, *vec), pos = ahead.pop()  # ``picked``: read back by the loop; Qwen2.5's vector
        except BaseException:
            self._drain_ahead()
            self.ctx.free()  # the step may or may not have written: re-prefill next turn
            raise
        decoder.advance()
        src = vec[0] if vec else None  # Qwen3: the token's embedding, made when the context is read
        self.ctx.append_token(token, pos, src, self.loaded.tokens)
        return picked, src

    def _drain_ahead(self) -> None:
        """Withdraw steps still queued for a reply that ended (under ``self.lock``), and the first
        step its stage may still expect of it."""
        if self._ahead is not None:
            self._ahead.drain()
        if self.rows is not None:
            self.rows.batcher.unexpect(self.rows.slot)
