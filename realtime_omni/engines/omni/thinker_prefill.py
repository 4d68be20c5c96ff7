"""The thinker's prefill: what a new turn adds to the session's cached context.

A request is matched message by message against the records of what the cache holds; the cache
is cropped where they diverge, and only the new tokens (the close of the last reply, the new
messages, the assistant header) are rendered and run. A context past its budget drops its oldest
messages and is prefilled again. With batching, the forward runs in the model's batched prefill
beside the other sessions' prefills; the results are the same.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from ..base import ThinkRequest
from .context import MessageRecord, MultimodalItem, ReplyState, TalkerPrompt, talker_prompt
from .streams import on_stream
from .prompt import Rendered, fingerprint

log = logging.getLogger(__name__)


class ThinkerPrefill:
    """Mixed into :class:`~.thinker.StreamingThinker` (its state: ``ctx``, ``renderer``,
    ``settings``, ``rows``, ``loaded`` and the forward / append steps)."""

    #: when this session began its latest prefill (the turn, or a prefill ahead): the batched
    #: prefill counts the time until it was queued as its preparation
    preparing_since: float | None = None

    def prefill_ahead(self, request: ThinkRequest) -> tuple[int, TalkerPrompt | None]:
        """Evaluate the conversation of ``request`` now, before a reply is asked for (the user's
        turn as it is committed, or at the pause that may end it). A reply asked for later with
        the same messages then finds them in the cache and evaluates only its header; one asked
        for with other messages crops what differs, as for any turn. Skipped (0) while a reply
        runs or when the context is over its budget (the reply trims it). Returns the tokens
        evaluated and, when there were any, what the talker's prompt holds of this context (so
        the talker can run it ahead too)."""
        import torch

        with self.lock, torch.inference_mode():
            if self.closed or self.running:
                return 0, None
            self.preparing_since = time.perf_counter()
            ids, rendered, close_len, budget = self._new_tokens(self._target(request))
            if not rendered or len(self.ctx) + len(ids) > budget:
                return 0, None
            prefilled = self._prefill_ids(self.turn, ids, rendered, len(ids), close_len, reply=False)[0]
            prompt = talker_prompt(self.ctx, self.loaded, self.turn, reply=False)
        log.info("omni thinker: %d tokens of the conversation prefilled ahead of the reply", prefilled)
        return prefilled, prompt

    def _new_tokens(self, target: list) -> tuple[list[int], list, int, int]:
        """Crop the cache where ``target`` diverges from it; the tokens that close the last reply
        and render the new messages (without a header), their renders, the closing's length and
        the context budget."""
        ctx = self.ctx
        prints = [fingerprint(m) for m in target]
        keep = 0
        while (keep < len(ctx.messages) and keep < len(prints)
               and ctx.messages[keep].current() == prints[keep]):
            keep += 1
        if keep < len(ctx.messages):
            ctx.crop(ctx.messages[keep].start)
            ctx.messages = ctx.messages[:keep]
        ids: list[int] = []
        rendered: list[tuple[int, Rendered, tuple]] = []
        if ctx.messages and not ctx.messages[-1].closed:
            reply = ctx.reply
            if reply is not None and reply.record is ctx.messages[-1]:
                ids += reply.ids[reply.forwarded :]  # emitted but never forwarded (max tokens)
            ids += self.renderer.closing()  # close the last reply: "<|im_end|>\n"
        close_len = len(ids)
        for msg, fp in zip(target[keep:], prints[keep:], strict=True):
            r = self.renderer.render(msg)
            rendered.append((len(ids), r, fp))
            ids += r.ids
        budget = self.settings.max_context_tokens or (self._max_positions - self.settings.max_new_tokens)
        return ids, rendered, close_len, budget

    def _prefill(self, request: ThinkRequest, turn: int):
        ctx = self.ctx
        target = self._target(request)
        ids, rendered, close_len, budget = self._new_tokens(target)
        gen_offset = len(ids)
        ids += self.renderer.header("assistant")
        if len(ctx) + len(ids) > budget and len(target) > 1:
            # too long: drop the oldest non-system messages and re-prefill what is left
            return self._prefill_trimmed(request, turn, target, [fingerprint(m) for m in target], budget)
        return self._prefill_ids(turn, ids, rendered, gen_offset, close_len, talks=request.want_audio)

    def _prefill_trimmed(self, request, turn, target, prints, budget):
        ctx = self.ctx
        ctx.crop(0)
        ctx.messages = []
        head = 1 if target and target[0].role == "system" else 0
        renders = [self.renderer.render(m) for m in target]
        total = sum(len(r.ids) for r in renders) + len(self.renderer.header("assistant"))
        drop = head
        while total > budget and drop < len(target) - 1:
            total -= len(renders[drop].ids)
            drop += 1
        chosen = list(range(head)) + list(range(drop, len(target)))
        ids: list[int] = []
        rendered = []
        for i in chosen:
            rendered.append((len(ids), renders[i], prints[i]))
            ids += renders[i].ids
        gen_offset = len(ids)
        ids += self.renderer.header("assistant")
        log.info("omni thinker: context over %d tokens, dropped %d old messages", budget, drop - head)
        return self._prefill_ids(turn, ids, rendered, gen_offset, talks=request.want_audio)

    def _prefill_ids(self, turn: int, ids: list[int], rendered, gen_offset: int, close_len: int = 0,
                     reply: bool = True, talks: bool = False):
        """Run ``ids`` into the cache and record their messages; with ``reply``, the last tokens
        are the header of a reply that starts now (its record and state are set up); ``talks``:
        the reply is spoken (the batched talker prefill expects this session next)."""
        import torch

        ctx = self.ctx
        loaded = self.loaded
        base = len(ctx)
        clips, lengths, pixels, grids, items, records = [], [], [], [], [], []
        for offset, r, fp in rendered:
            records.append(MessageRecord(fp, base + offset, base + offset + len(r.ids)))
            clips += r.audio_clips
            lengths += r.audio_lengths
            pixels += r.pixel_values
            grids += r.image_grids
            items += [(base + offset + o, kind, value) for o, kind, value in r.items]
        state = None
        if reply:
            record = MessageRecord(("assistant", ""), base + gen_offset, base + len(ids), closed=False)
            records.append(record)
            state = ReplyState(turn=turn, record=record, content_start=base + len(ids))
            record.live = state

        mm_kwargs: dict[str, Any] = {}
        device = loaded.device
        if clips:  # features and encoding in the forward, without reading the device back
            mm_kwargs["audio_clips"] = clips
        grid_t = None
        if pixels:
            vis_dtype = next(loaded.thinker.model.visual.parameters()).dtype
            mm_kwargs["pixel_values"] = torch.cat(pixels, dim=0).to(device=device, dtype=vis_dtype)
            grid_t = torch.tensor(grids, dtype=torch.long)
            mm_kwargs["image_grid_thw"] = grid_t.to(device)

        if base + len(ids) >= self._max_positions:
            raise ValueError(f"the conversation needs {base + len(ids)} context tokens; this session holds "
                             f"{self._max_positions - 1}")
        input_ids = torch.tensor([ids], dtype=torch.long)
        positions = self._positions(input_ids, grid_t, lengths) + ctx.next_pos  # (3, n)
        try:
            if self.rows is not None and self.rows.prefill is not None:
                # with the prefills of the other sessions starting now, in one forward pass
                decoder = self._decoder()
                logits, src = self.rows.prefill.prefill(input_ids[0], positions, mm_kwargs, self.rows.slot,
                                                        decoder.write_position(), self.preparing_since,
                                                        then=self.rows.then if reply and talks else None)
                decoder.advance(len(ids))
            else:
                with on_stream(loaded.stream("thinker")):
                    logits, src = self._forward(input_ids, positions, mm_kwargs)
        except BaseException:
            # the KV cache may hold part of this forward in some layers: start over next turn
            ctx.free()
            raise
        if ctx.messages and not ctx.messages[-1].closed:
            ctx.messages[-1].closed = True
            ctx.messages[-1].end = base + close_len
        ctx.messages += records
        if state is not None:
            ctx.reply = state
        for pos, kind, value in items:
            ctx.items.append(MultimodalItem(pos, kind, value))
        self._append(ids, positions, src)
        return len(ids), len(ctx), state, logits

    def _positions(self, input_ids, image_grid_thw, audio_lengths):
        import torch

        n = input_ids.shape[1]
        if image_grid_thw is None:
            # text and audio-only prompts: consecutive positions (what get_rope_index returns)
            return torch.arange(n, dtype=torch.long).view(1, n).expand(3, n).clone()
        thinker = self.loaded.thinker
        seqlens = torch.tensor(audio_lengths, dtype=torch.long) if audio_lengths else None
        pos, _ = thinker.get_rope_index(
            input_ids, image_grid_thw, None, torch.ones_like(input_ids), False, seqlens, None
        )
        return pos[:, 0, :].round().long()
