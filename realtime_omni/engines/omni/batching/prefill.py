"""Prefills of several sessions in one forward pass (the thinker's and the talker's).

When many replies start together, prefilling one session after another makes the last one wait
for all the others (the prompt's audio tower and every layer, eagerly, per session). A
:class:`PrefillBatcher` takes the prefills pending at that moment (up to a token budget), pads
them to one length and runs them as one batch: each row writes its tokens into its own slot at
its own offset, and attends to its own slot only. :func:`thinker_rows` also merges the sessions'
audio clips and images; :func:`talker_rows` takes input embeddings.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..audio_tower import merge_audio, to_device
from ..graphs import DeviceSpans, graphs_available, on_stream
from .batcher import Mailbox
from .slots import SlotPool

log = logging.getLogger(__name__)

#: multimodal inputs whose rows can be merged across sessions (by concatenation on dim 0)
MERGEABLE = {"input_features", "feature_attention_mask", "pixel_values", "image_grid_thw", "audio_clips"}


@dataclass(eq=False)
class PrefillRequest:
    inputs: Any  # thinker: (n,) token ids; talker: (n, H) input embeddings
    positions: Any  # (3, n) long rotary positions
    mm: dict[str, Any]
    slot: int
    start: int  # the slot's current length: where the first token goes
    done: threading.Event = field(default_factory=threading.Event)
    result: tuple[Any, ...] | None = None  # what the stage's row forward returns for this row
    error: BaseException | None = None
    offset: int = 0  # tokens prefilled so far (a long text prefill runs in chunks)
    parts: list[tuple[Any, ...]] = field(default_factory=list)

    @property
    def length(self) -> int:
        return int(self.positions.shape[-1])


@dataclass
class _Piece:
    """The part of a request that one batch prefills (all of it, or its next chunk)."""

    request: PrefillRequest
    inputs: Any
    positions: Any
    mm: dict[str, Any]
    slot: int
    start: int


class SlotRowsCache:
    """Duck-typed cache for a batch of multi-token rows, each in its own slot: writes go to
    ``(slot_b, position_bt)``; attention reads the first ``columns`` columns of each row's slot
    (a gathered copy: as far as the furthest row reaches, not the whole slot)."""

    is_compileable = False

    def __init__(self, pool: SlotPool, slots: Any, write_pos: Any, columns: int) -> None:
        self.pool = pool
        self.slots = slots  # (B,)
        self.write_pos = write_pos  # (B, T)
        self.columns = int(columns)

    def update(self, key_states: Any, value_states: Any, layer_idx: int, *args: Any, **kwargs: Any):
        keys, values = self.pool.keys[layer_idx], self.pool.values[layer_idx]
        rows = self.slots[:, None]
        keys[rows, :, self.write_pos] = key_states.transpose(1, 2)  # (B, T, kv_heads, dim)
        values[rows, :, self.write_pos] = value_states.transpose(1, 2)
        span = self.columns
        return keys[:, :, :span].index_select(0, self.slots), values[:, :, :span].index_select(0, self.slots)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return 0

    def __len__(self) -> int:
        return len(self.pool.keys)


@dataclass
class Padded:
    """The rows of one batched prefill, padded to the longest (``lengths`` are the real ones)."""

    lengths: list[int]
    positions: Any  # (3, B, T) on the device
    mask: Any  # (B, 1, T, columns) bool on the device: the columns the furthest row reaches
    cache: SlotRowsCache


#: ``forward(pieces, padded)`` → one result tuple per piece
RowsForward = Callable[[list[_Piece], Padded], list[tuple[Any, ...]]]
#: the results of a request's chunks → its result
Merge = Callable[[list[tuple[Any, ...]]], tuple[Any, ...]]


class PrefillBatcher(Mailbox):
    """``token_budget`` bounds one batch (so the other sessions' decode steps, queued behind it on
    the stage's stream, wait at most one batch; 8192 measured better than 4096 on the H200 when 64
    replies start together: first audio p95 3.7 s instead of 5.2 s); a text prefill longer than ``chunk_tokens`` runs in
    chunks, one per batch. Prefills with audio or images run whole (their clips must meet their
    placeholders in one forward)."""

    def __init__(self, loaded: Any, pool: SlotPool, forward: RowsForward, *, stage: str,
                 merge: Merge = lambda parts: parts[-1], gather_s: float = 0.01, token_budget: int = 8192,
                 chunk_tokens: int = 512, step_timeout_s: float = 120.0) -> None:
        self.loaded = loaded
        self.pool = pool
        self.forward = forward
        self.merge = merge
        self.chunk_tokens = chunk_tokens
        self.stage = stage
        self.name = f"{stage} prefill"
        self.gather_s = gather_s
        self.token_budget = token_budget
        self.step_timeout_s = step_timeout_s
        super().__init__()
        self.spans = DeviceSpans(graphs_available(loaded.device))
        self._start()

    def prefill(self, inputs: Any, positions: Any, mm: dict[str, Any], slot: int, start: int) -> tuple[Any, ...]:
        """Prefill ``inputs`` (token ids, or embeddings ``(n, H)``) into ``slot`` from ``start``."""
        if set(mm) - MERGEABLE:
            raise ValueError(f"cannot batch prefill inputs {sorted(set(mm) - MERGEABLE)}")
        n = int(positions.shape[-1])
        if start + n > self.pool.length:
            raise ValueError(f"the prefill needs {start + n} tokens of a {self.pool.length}-token slot")
        return self._submit(PrefillRequest(inputs, positions, mm, slot, start))

    def _loop(self) -> None:
        while True:
            with self._cond:
                if not self._gathered(self.gather_s):  # let prefills that start together meet
                    return
                take, tokens = [], 0
                seen: set[int] = set()
                for req in self._queue:
                    piece = self._piece(req)
                    n = int(piece.positions.shape[-1])
                    if take and (tokens + n > self.token_budget or req.slot in seen):
                        continue
                    take.append(piece)
                    seen.add(req.slot)
                    tokens += n
            self._run(take)

    def _piece(self, req: PrefillRequest) -> _Piece:
        lo = req.offset
        hi = req.length if req.mm else min(req.length, lo + self.chunk_tokens)
        if lo == 0 and hi == req.length:
            return _Piece(req, req.inputs, req.positions, req.mm, req.slot, req.start)
        return _Piece(req, req.inputs[lo:hi], req.positions[:, lo:hi], req.mm, req.slot, req.start + lo)

    def _run(self, take: list[_Piece]) -> None:
        import torch

        started = time.perf_counter()
        finished: list[PrefillRequest] = []
        try:
            # a stream of its own, of lower priority than the stage's decode steps: a prefill of
            # hundreds of milliseconds would otherwise hold every live session's next step
            stream = self.loaded.stream(self.name)
            with torch.inference_mode(), on_stream(stream):
                span = self.spans.begin(stream)
                results = self.forward(take, self._pad(take))
                self.spans.end(span, stream)
            for piece, res in zip(take, results, strict=True):
                req = piece.request
                req.parts.append(res)
                req.offset += int(piece.positions.shape[-1])
                if req.offset >= req.length:
                    req.result = self.merge(req.parts)
                    finished.append(req)
        except BaseException as exc:  # noqa: BLE001 - every waiting session gets the error
            log.exception("omni: batched %s failed", self.name)
            for piece in take:
                piece.request.error = exc
                finished.append(piece.request)
        finally:
            self._count(len(take), started)
            with self._cond:  # the others' next chunks stay queued
                gone = {id(r) for r in finished}
                self._queue = [r for r in self._queue if id(r) not in gone]
            for req in finished:
                req.done.set()

    def _pad(self, take: list[_Piece]) -> Padded:
        import torch

        pool, device = self.pool, self.loaded.device
        lengths = [int(r.positions.shape[-1]) for r in take]  # (pieces)
        batch, width = len(take), max(lengths)
        positions = torch.zeros((3, batch, width), dtype=torch.long)
        write = torch.full((batch, width), pool.length, dtype=torch.long)  # padding → scratch
        visible = torch.zeros((batch, width), dtype=torch.long)  # last column each query may see
        for b, (req, n) in enumerate(zip(take, lengths, strict=True)):
            rope = req.positions.to("cpu")  # (the talker's come from the device)
            positions[:, b, :n] = rope
            positions[:, b, n:] = rope[:, -1:] + 1
            write[b, :n] = torch.arange(req.start, req.start + n)
            visible[b] = torch.arange(req.start, req.start + width)
        reach = min(pool.length, max(r.start for r in take) + width)  # padding may not see scratch
        columns = torch.arange(reach)
        mask = columns[None, None, :] <= visible[:, :, None]
        cache = SlotRowsCache(pool, to_device(torch.tensor([r.slot for r in take]), device), to_device(write, device),
                              reach)
        return Padded(lengths, to_device(positions, device), to_device(mask[:, None], device), cache)


def thinker_rows(loaded: Any, reads: Any) -> RowsForward:
    """Thinker prefill rows → (last-token logits (1, V), talker vectors (n, H)) per row;
    ``reads``: the :class:`~..talker_reads.TalkerReads` of the model."""

    def forward(take: list[_Piece], padded: Padded) -> list[tuple[Any, ...]]:
        import torch

        device, lengths = loaded.device, padded.lengths
        ids = torch.full((len(take), max(lengths)), int(loaded.tokens.im_end), dtype=torch.long)
        for b, (req, n) in enumerate(zip(take, lengths, strict=True)):
            ids[b, :n] = req.inputs.reshape(-1)
        inputs = merge_audio(loaded, ids, _merge([r.mm for r in take]))
        ids = inputs["input_ids"]
        out = loaded.thinker.model(
            position_ids=padded.positions, attention_mask=padded.mask, use_cache=True,
            output_hidden_states=reads.select, return_dict=True, **{loaded.cache_kwarg: padded.cache},
            **inputs)
        last = out.last_hidden_state
        src = reads.vectors(ids, out.hidden_states, last)
        ends = torch.tensor([n - 1 for n in lengths], device=device)
        logits = loaded.thinker.lm_head(last[torch.arange(len(take), device=device), ends]).float()
        return [(logits[b : b + 1].clone(), src[b, :n].clone()) for b, n in enumerate(lengths)]

    return forward


def thinker_merge(parts: list[tuple[Any, ...]]) -> tuple[Any, ...]:
    """A chunked thinker prefill: the last chunk's logits, every chunk's talker vectors."""
    import torch

    return parts[-1][0], torch.cat([p[1] for p in parts], dim=0)


def talker_rows(loaded: Any) -> RowsForward:
    """Talker prefill rows (input embeddings) → (last hidden state (1, 1, H), logits (1, V))."""

    def forward(take: list[_Piece], padded: Padded) -> list[tuple[Any, ...]]:
        import torch

        talker, device, lengths = loaded.talker, loaded.device, padded.lengths
        first = take[0].inputs
        x = torch.zeros((len(take), max(lengths), first.shape[-1]), dtype=first.dtype, device=device)
        for b, (req, n) in enumerate(zip(take, lengths, strict=True)):
            x[b, :n] = req.inputs.reshape(n, -1)
        if loaded.arch == "qwen2_5_omni":
            x = talker.thinker_to_talker_proj(x.to(talker.thinker_to_talker_proj.weight.dtype))
        out = talker.model(inputs_embeds=x, position_ids=padded.positions, attention_mask=padded.mask,
                           use_cache=True, return_dict=True, **{loaded.cache_kwarg: padded.cache})
        ends = torch.tensor([n - 1 for n in lengths], device=device)
        hidden = out.last_hidden_state[torch.arange(len(take), device=device), ends]  # (B, H)
        logits = talker.codec_head(hidden).float()
        return [(hidden[b].view(1, 1, -1).clone(), logits[b : b + 1].clone()) for b in range(len(take))]

    return forward


def _merge(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """Concatenate the sessions' audio clips and images in row order (the order their
    placeholders take in the flattened batch), padding audio frames to the longest clip."""
    import torch

    merged: dict[str, Any] = {}
    feats = [p["input_features"] for p in parts if "input_features" in p]
    if feats:
        frames = max(f.shape[-1] for f in feats)
        merged["input_features"] = torch.cat(
            [torch.nn.functional.pad(f, (0, frames - f.shape[-1])) for f in feats], dim=0)
        merged["feature_attention_mask"] = torch.cat(
            [torch.nn.functional.pad(p["feature_attention_mask"], (0, frames - p["feature_attention_mask"].shape[-1]))
             for p in parts if "input_features" in p], dim=0)
    clips = [clip for p in parts for clip in p.get("audio_clips", ())]
    if clips:
        merged["audio_clips"] = clips
    for key in ("pixel_values", "image_grid_thw"):
        values = [p[key] for p in parts if key in p]
        if values:
            merged[key] = torch.cat(values, dim=0)
    return merged
