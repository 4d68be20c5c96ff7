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
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..audio_tower import merge_audio
from ..device_copy import to_device
from ..graphs import graphs_available
from ..streams import DeviceSpans, on_stream
from .mailbox import Done, Mailbox
from .prefill_graphs import Body, BucketKey, PrefillGraphs, PrefillInputs
from .slots import SlotPool

log = logging.getLogger(__name__)

#: multimodal inputs whose rows can be merged across sessions (by concatenation on dim 0)
MERGEABLE = {"pixel_values", "image_grid_thw", "audio_clips"}


@dataclass(eq=False)
class PrefillRequest:
    inputs: Any  # thinker: (n,) token ids; talker: (n, H) input embeddings
    positions: Any  # (3, n) long rotary positions
    mm: dict[str, Any]
    slot: int
    start: int  # the slot's current length: where the first token goes
    done: Done = field(default_factory=Done)
    result: tuple[Any, ...] | None = None  # what the stage's row forward returns for this row
    error: BaseException | None = None
    offset: int = 0  # tokens prefilled so far (a long text prefill runs in chunks)
    parts: list[tuple[Any, ...]] = field(default_factory=list)
    queued_at: float = field(default_factory=time.perf_counter)
    started_at: float | None = None  # when its first batch began
    #: seconds the session spent on it before queuing it (its prompt and inputs), when it says
    prepared_s: float | None = None
    #: the slot whose prefill on the next stage follows this one (a spoken reply's thinker
    #: prefill: its session's talker slot), or None
    then: int | None = None

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
    """The rows of one batched prefill, padded to the longest (``lengths`` are the real ones) or
    to a captured bucket (``key``; its extra rows write to the scratch column only)."""

    lengths: list[int]
    positions: Any  # (3, B, T) on the device
    mask: Any  # (B, 1, T, columns) bool on the device: the columns the furthest row reaches
    slots: Any  # (B,) on the device
    write: Any  # (B, T) on the device
    ends: Any  # (B,) on the device: each row's last real token
    key: BucketKey | None = None

    @property
    def shape(self) -> tuple[int, int]:
        return int(self.write.shape[0]), int(self.write.shape[1])

    def inputs(self, x: Any, ids: Any = None) -> PrefillInputs:
        import torch

        if ids is None:  # (the talker's rows: no token ids)
            ids = torch.zeros(self.shape, dtype=torch.long, device=self.write.device)
        return PrefillInputs(x, ids, self.positions, self.mask, self.slots, self.write, self.ends)


#: ``forward(pieces, padded)`` → one result tuple per piece
RowsForward = Callable[[list[_Piece], Padded], list[tuple[Any, ...]]]
#: the results of a request's chunks → its result
Merge = Callable[[list[tuple[Any, ...]]], tuple[Any, ...]]


class PrefillBatcher(Mailbox):
    """``token_budget`` bounds one batch (so the other sessions' decode steps, queued behind it on
    the stage's stream, wait at most one batch; 8192 measured better than 4096 on the H200 when 64
    replies start together: first audio p95 3.7 s instead of 5.2 s); a text prefill longer than ``chunk_tokens`` runs in
    chunks, one per batch. Prefills with audio or images run whole (their clips must meet their
    placeholders in one forward). ``burst_s``: how long a burst of prefills that keep arriving
    may gather into one batch (:meth:`~.mailbox.Mailbox._gathered`; 0: ``gather_s`` only)."""

    def __init__(self, loaded: Any, pool: SlotPool, forward: RowsForward, *, stage: str,
                 merge: Merge = lambda parts: parts[-1], gather_s: float = 0.01, token_budget: int = 8192,
                 chunk_tokens: int = 512, step_timeout_s: float = 120.0,
                 graphs: PrefillGraphs | None = None, burst_s: float = 0.0) -> None:
        self.loaded = loaded
        self.graphs = graphs
        self.pool = pool
        self.forward = forward
        self.merge = merge
        self.chunk_tokens = chunk_tokens
        self.stage = stage
        self.name = f"{stage} prefill"
        self.gather_s = gather_s
        self.burst_s = burst_s
        self.token_budget = token_budget
        self.step_timeout_s = step_timeout_s
        super().__init__()
        self.spans = DeviceSpans(graphs_available(loaded.device))
        self.bucketed = 0  # batches padded to a graph bucket
        self.replayed = 0  # of those, batches that replayed the bucket's graph
        # per finished request: seconds spent preparing it (when the session says), queued before
        # its first batch began, and until its last batch ended (a burst of new turns shows
        # here, before any first token)
        self.requests = 0
        self.wait_s = 0.0
        self.latency_s = 0.0
        self.recent: deque[tuple[float | None, float, float]] = deque(maxlen=1024)
        #: called with the ``then`` slots of each batch's finished requests (the thinker's prefill
        #: tells the talker's which sessions will want theirs next)
        self.on_finished: Callable[[list[int]], None] | None = None
        #: the stage's decode steps, told which slots' first steps follow a batch of several
        #: replies (requests with a ``then``: a reply's own prefill, not one run ahead of its turn)
        self.stepper: Mailbox | None = None
        self._start()

    @property
    def expect_s(self) -> float:  # (the burst is how long an expected prefill is waited for)
        return self.burst_s

    def prefill(self, inputs: Any, positions: Any, mm: dict[str, Any], slot: int, start: int,
                prepared_since: float | None = None, then: int | None = None) -> tuple[Any, ...]:
        """Prefill ``inputs`` (token ids, or embeddings ``(n, H)``) into ``slot`` from ``start``;
        ``prepared_since``: when the session began to prepare it (``time.perf_counter``);
        ``then``: the slot whose prefill on the next stage comes next (see :attr:`on_finished`)."""
        if set(mm) - MERGEABLE:
            raise ValueError(f"cannot batch prefill inputs {sorted(set(mm) - MERGEABLE)}")
        n = int(positions.shape[-1])
        if start + n > self.pool.length:
            raise ValueError(f"the prefill needs {start + n} tokens of a {self.pool.length}-token slot")
        request = PrefillRequest(inputs, positions, mm, slot, start, then=then)
        if prepared_since is not None:
            request.prepared_s = max(request.queued_at - prepared_since, 0.0)
        return self._submit(request)

    def _loop(self) -> None:
        while True:
            with self._cond:
                # prefills starting together meet
                if not self._gathered(self.gather_s, burst_s=self.burst_s, expecting=self._expecting):
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
        for piece in take:
            if piece.request.started_at is None:
                piece.request.started_at = started
        try:
            # a stream of its own, of lower priority than the stage's decode steps: a prefill of
            # hundreds of milliseconds would otherwise hold every live session's next step
            stream = self.loaded.stream(self.name)
            with torch.inference_mode(), on_stream(stream):
                span = self.spans.begin(stream)
                padded = self._pad(take)
                if padded.key is not None:
                    self.bucketed += 1
                    self.replayed += int(self.graphs is not None and self.graphs.has(padded.key))
                results = self.forward(take, padded)
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
            ended = time.perf_counter()
            with self._cond:  # the others' next chunks stay queued
                gone = {id(r) for r in finished}
                self._queue = [r for r in self._queue if id(r) not in gone]
                for req in finished:
                    if req.error is None:
                        self._timed(req, ended)
            # what follows is announced before the sessions wake: a first step taken before its
            # expectation was set would leave the expectation holding the others' steps
            done = [req for req in finished if req.error is None and req.then is not None]
            try:
                if len(done) > 1 and self.stepper is not None:
                    # replies that start together (a lone one has no peers to keep pace with, and
                    # the others' steps would wait for it); briefly: a reply cut right after its
                    # prefill must not hold the others' steps
                    self.stepper.expect([req.slot for req in done], within_s=0.1)
                if done and self.on_finished is not None:
                    self.on_finished([req.then for req in done])
            except Exception:  # noqa: BLE001 - a hint for the next stage must not stop this loop
                log.exception("omni: %s could not tell the next stage what follows", self.name)
            finally:
                for req in finished:
                    req.done.set()

    def _timed(self, req: PrefillRequest, ended: float) -> None:
        wait = (req.started_at if req.started_at is not None else ended) - req.queued_at
        self.requests += 1
        self.wait_s += wait
        self.latency_s += ended - req.queued_at
        self.recent.append((req.prepared_s, wait, ended - req.queued_at))

    def stats(self) -> dict[str, Any]:
        with self._cond:
            recent = list(self.recent)
            timing = {"requests": self.requests, "wait_s": self.wait_s, "latency_s": self.latency_s}
        return {**super().stats(), **timing, "recent": recent, "bucketed": self.bucketed,
                "graph_batches": self.replayed, "graphs": self.graphs.captured if self.graphs is not None else 0}

    def _pad(self, take: list[_Piece]) -> Padded:
        import torch

        pool, device = self.pool, self.loaded.device
        lengths = [int(r.positions.shape[-1]) for r in take]  # (pieces)
        width = max(lengths)
        reach = min(pool.length, max(r.start for r in take) + width)  # padding may not see scratch
        images = any("pixel_values" in r.mm for r in take)  # Qwen3's deepstack: the whole thinker, eagerly
        key = None if self.graphs is None or images else self.graphs.bucket(len(take), width, reach)
        batch, width, columns = (key.rows, key.tokens, key.columns) if key is not None else (len(take), width, reach)
        positions = torch.zeros((3, batch, width), dtype=torch.long)
        write = torch.full((batch, width), pool.length, dtype=torch.long)  # padding → scratch
        visible = torch.zeros((batch, width), dtype=torch.long)  # last column each query may see
        slots = torch.full((batch,), take[0].slot, dtype=torch.long)  # extra rows: scratch writes only
        ends = torch.zeros((batch,), dtype=torch.long)
        for b, (req, n) in enumerate(zip(take, lengths, strict=True)):
            rope = req.positions.to("cpu")  # (the talker's come from the device)
            positions[:, b, :n] = rope
            positions[:, b, n:] = rope[:, -1:] + 1
            write[b, :n] = torch.arange(req.start, req.start + n)
            visible[b] = torch.arange(req.start, req.start + width).clamp(max=pool.length - 1)
            slots[b], ends[b] = req.slot, n - 1
        mask = torch.arange(columns)[None, None, :] <= visible[:, :, None]
        return Padded(lengths, to_device(positions, device), to_device(mask[:, None], device),
                      to_device(slots, device), to_device(write, device), to_device(ends, device), key)


def thinker_body(loaded: Any, pool: SlotPool, reads: Any) -> Body:
    """The thinker's language model over padded input embeddings → (last-token logits (B, V),
    talker vectors (B, T, H)): what a prefill graph captures (``reads``: the model's
    :class:`~..talker_reads.TalkerReads`)."""
    lm, head = loaded.thinker.model.language_model, loaded.thinker.lm_head

    def body(x: PrefillInputs, columns: int) -> tuple[Any, ...]:
        cache = SlotRowsCache(pool, x.slots, x.write, columns)
        out = lm(inputs_embeds=x.x, position_ids=x.positions, attention_mask=x.mask, use_cache=True,
                 output_hidden_states=reads.select, return_dict=True, **{loaded.cache_kwarg: cache})
        return _thinker_outputs(out, head, reads, x.ids, x.ends)

    return body


def thinker_rows(loaded: Any, reads: Any, graphs: PrefillGraphs) -> RowsForward:
    """Thinker prefill rows → (last-token logits (1, V), talker vectors (n, H)) per row: the
    audio tower eagerly, then ``graphs`` (the :func:`thinker_body`, captured per bucket)."""

    def forward(take: list[_Piece], padded: Padded) -> list[tuple[Any, ...]]:
        import torch

        lengths = padded.lengths
        ids = torch.full(padded.shape, int(loaded.tokens.im_end), dtype=torch.long)
        for b, (req, n) in enumerate(zip(take, lengths, strict=True)):
            ids[b, :n] = req.inputs.reshape(-1)
        inputs = merge_audio(loaded, ids, _merge([r.mm for r in take]))
        if "pixel_values" in inputs:  # images: the thinker's own forward (deepstack features)
            logits, src = _with_images(loaded, graphs.pool, reads, padded, inputs)
        else:
            logits, src = graphs.run(padded.key, padded.inputs(_embeddings(loaded, inputs), inputs["input_ids"]))
        return [(logits[b : b + 1].clone(), src[b, :n].clone()) for b, n in enumerate(lengths)]

    return forward


def _embeddings(loaded: Any, inputs: dict[str, Any]) -> Any:
    """The language model's input embeddings, audio merged: Qwen3's clips are encoded already
    (:func:`merge_audio`); Qwen2.5's features go through its own audio tower here, as its
    thinker's forward would run them."""
    model, ids = loaded.thinker.model, inputs["input_ids"]
    embeds = inputs.get("inputs_embeds")
    if embeds is None:
        embeds = model.get_input_embeddings()(ids)
    if "input_features" in inputs:
        audio = model.get_audio_features(inputs["input_features"], inputs.get("feature_attention_mask"),
                                         return_dict=True).last_hidden_state
        where = (ids == int(loaded.tokens.audio))[..., None].expand_as(embeds)
        embeds = embeds.masked_scatter(where, audio.to(embeds.dtype))
    return embeds


def _with_images(loaded: Any, pool: SlotPool, reads: Any, padded: Padded, inputs: dict[str, Any]) -> tuple[Any, Any]:
    cache = SlotRowsCache(pool, padded.slots, padded.write, int(padded.mask.shape[-1]))
    out = loaded.thinker.model(
        position_ids=padded.positions, attention_mask=padded.mask, use_cache=True,
        output_hidden_states=reads.select, return_dict=True, **{loaded.cache_kwarg: cache}, **inputs)
    return _thinker_outputs(out, loaded.thinker.lm_head, reads, inputs["input_ids"], padded.ends)


def _thinker_outputs(out: Any, head: Any, reads: Any, ids: Any, ends: Any) -> tuple[Any, Any]:
    """A thinker forward's (last-token logits (B, V), talker vectors (B, T, H))."""
    import torch

    last = out.last_hidden_state
    rows = torch.arange(last.shape[0], device=last.device)
    return head(last[rows, ends]).float(), reads.vectors(ids, out.hidden_states, last)


def thinker_merge(parts: list[tuple[Any, ...]]) -> tuple[Any, ...]:
    """A chunked thinker prefill: the last chunk's logits, every chunk's talker vectors."""
    import torch

    return parts[-1][0], torch.cat([p[1] for p in parts], dim=0)


def talker_body(loaded: Any, pool: SlotPool) -> Body:
    """The talker's model over padded prompt rows → (last hidden states (B, H), logits (B, V))."""
    talker = loaded.talker

    def body(x: PrefillInputs, columns: int) -> tuple[Any, ...]:
        import torch

        rows_in = x.x
        if loaded.arch == "qwen2_5_omni":
            rows_in = talker.thinker_to_talker_proj(rows_in.to(talker.thinker_to_talker_proj.weight.dtype))
        cache = SlotRowsCache(pool, x.slots, x.write, columns)
        out = talker.model(inputs_embeds=rows_in, position_ids=x.positions, attention_mask=x.mask,
                           use_cache=True, return_dict=True, **{loaded.cache_kwarg: cache})
        hidden = out.last_hidden_state[torch.arange(rows_in.shape[0], device=rows_in.device), x.ends]
        return hidden, talker.codec_head(hidden).float()

    return body


def talker_rows(loaded: Any, graphs: PrefillGraphs) -> RowsForward:
    """Talker prefill rows (input embeddings) → (last hidden state (1, 1, H), logits (1, V))."""

    def forward(take: list[_Piece], padded: Padded) -> list[tuple[Any, ...]]:
        import torch

        first = take[0].inputs
        x = torch.zeros((*padded.shape, first.shape[-1]), dtype=first.dtype, device=loaded.device)
        for b, (req, n) in enumerate(zip(take, padded.lengths, strict=True)):
            x[b, :n] = req.inputs.reshape(n, -1)
        hidden, logits = graphs.run(padded.key, padded.inputs(x))
        return [(hidden[b].view(1, 1, -1).clone(), logits[b : b + 1].clone()) for b in range(len(take))]

    return forward


def _merge(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """Concatenate the sessions' audio clips and images in row order (the order their
    placeholders take in the flattened batch)."""
    import torch

    merged: dict[str, Any] = {}
    clips = [clip for p in parts for clip in p.get("audio_clips", ())]
    if clips:
        merged["audio_clips"] = clips
    for key in ("pixel_values", "image_grid_thw"):
        values = [p[key] for p in parts if key in p]
        if values:
            merged[key] = torch.cat(values, dim=0)
    return merged
