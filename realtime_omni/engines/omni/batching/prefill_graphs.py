"""CUDA graphs of the batched prefills, one per (rows, tokens, columns) bucket.

An eager prefill is host-bound: each forward launches thousands of small kernels one by one
(48 thinker layers with their experts, 20 talker layers). Measured on the H200, 16 sessions
prefilling together took 608 ms of wall time for about 140 ms of kernels (13 400 launches;
``benchmarks/omni_prefill_profile.py``), and sessions starting together waited for each other's
launches. The decoder part of a prefill (the thinker's
language model over the turn's input embeddings, the talker's model over its prompt rows) is
therefore captured at load per bucket: a batch is padded to the smallest bucket that holds it
(rows, tokens per row, attended columns), its tensors are copied into that bucket's static
inputs and the graph replays. The audio tower still runs eagerly (clips of any length), and so
do prefills with images (Qwen3's deepstack features enter inside the decoder) and batches larger
than every bucket.

The same body runs eagerly on the CPU and in the graph, so the CPU tests check the padding and
the bucket's exactness against sessions run alone.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

from ..graphs import StepGraph, graphs_available
from .slots import SlotPool

log = logging.getLogger(__name__)

#: rows per bucket (capped by the slot count, which is always a bucket)
ROW_BUCKETS = (1, 2, 4, 8, 16, 32)
#: tokens per row: a first turn with a short system prompt, a later spoken turn
TOKEN_BUCKETS = (32, 64, 128, 256)
#: the column buckets of the slot pool that get graphs (longer contexts stay eager)
MAX_COLUMNS = 1024


@dataclass
class PrefillInputs:
    """One batch of prefill rows, padded to ``(rows, tokens)`` (the tensors a graph reads)."""

    x: Any  # (B, T, D) input embeddings
    ids: Any  # (B, T) token ids: which rows are audio or image placeholders (thinker)
    positions: Any  # (3, B, T) rotary positions
    mask: Any  # (B, 1, T, columns) bool: the columns each query may see
    slots: Any  # (B,) each row's slot
    write: Any  # (B, T) the column each token's K/V goes to (padding: the scratch column)
    ends: Any  # (B,) each row's last real token


#: ``body(inputs, columns)`` → the stage's outputs for every row (padded rows included)
Body = Callable[[PrefillInputs, int], tuple[Any, ...]]


@dataclass(frozen=True)
class BucketKey:
    rows: int
    tokens: int
    columns: int


class PrefillGraphs:
    """The captured prefill buckets of one stage (``enabled`` only on CUDA with graphs on).

    :meth:`bucket` picks the bucket a batch is padded to (``None``: run it at its own size,
    eagerly); :meth:`run` replays the bucket's graph on the inputs, or runs ``body`` eagerly.
    ``pad`` pads batches to the buckets even where no graph is captured (the CPU tests check the
    padded batches against sessions run alone).
    """

    pad = False

    def __init__(self, loaded: Any, pool: SlotPool, body: Body, *, name: str, dim: int, enabled: bool,
                 max_rows: int, max_tokens: int, capture_streams: dict[str, Any] | None = None) -> None:
        self.loaded = loaded
        self.pool = pool
        self.body = body
        self.name = name
        self.dim = int(dim)
        self.enabled = bool(enabled) and graphs_available(loaded.device)
        self.rows = sorted({b for b in ROW_BUCKETS if b < max_rows} | {int(max_rows)})
        self.tokens = [t for t in TOKEN_BUCKETS if t <= pool.length]
        self.columns = [c for c in pool.column_buckets() if c <= min(MAX_COLUMNS, pool.length)]
        self.max_tokens = int(max_tokens)
        self.streams = capture_streams or {}
        #: every bucket, ordered by rows, then tokens, then columns (the first that fits is the smallest)
        self._keys = [BucketKey(r, t, c) for r in self.rows for t in self.tokens for c in self.columns
                      if r * t <= self.max_tokens and t <= c]
        self._graphs: dict[BucketKey, tuple[PrefillInputs, StepGraph]] = {}
        self._memory: Any = None  # one memory pool for the stage's prefill graphs (they run one at a time)

    def keys(self) -> list[BucketKey]:
        return list(self._keys)

    def bucket(self, rows: int, tokens: int, reach: int) -> BucketKey | None:
        """The smallest captured bucket for ``rows`` rows of up to ``tokens`` tokens reaching
        ``reach`` columns, or ``None``."""
        if not (self.enabled or self.pad):
            return None
        for key in self._keys:
            if key.rows >= rows and key.tokens >= tokens and key.columns >= reach:
                return key if key in self._graphs or self.pad else None
        return None

    def warm(self) -> int:
        """Capture every bucket now (the model is loading, nothing else runs); how many took."""
        if not self.enabled:
            return 0
        import torch

        from ..streams import on_stream

        if self._memory is None:
            self._memory = torch.cuda.graph_pool_handle()
        taken = 0
        for key in self.keys():
            static = self._static(key)
            graph = StepGraph(lambda s=static, c=key.columns: self.body(s, c), device=self.loaded.device,
                              name=f"{self.name} {key.rows}x{key.tokens}x{key.columns}", kind=self.name,
                              warmup=1, pool=self._memory, **self.streams)
            with torch.inference_mode(), on_stream(self.streams.get("run_stream")):
                graph.ensure_captured()
            if not graph.captured:
                break  # the same body fails the same way at every size
            self._graphs[key] = (static, graph)
            taken += 1
        log.info("omni: %s: %d graphs captured (rows %s, tokens %s, columns %s)", self.name, taken,
                 self.rows, self.tokens, self.columns)
        return taken

    def run(self, key: BucketKey | None, inputs: PrefillInputs) -> tuple[Any, ...]:
        if key not in self._graphs:
            return self.body(inputs, int(inputs.mask.shape[-1]))
        static, graph = self._graphs[key]
        for f in fields(PrefillInputs):
            getattr(static, f.name).copy_(getattr(inputs, f.name))
        return graph()

    def _static(self, key: BucketKey) -> PrefillInputs:
        """A bucket's inputs, valid as they are (every row writes to scratch, sees column 0)."""
        import torch

        device, b, t = self.loaded.device, key.rows, key.tokens
        mask = torch.zeros((b, 1, t, key.columns), dtype=torch.bool, device=device)
        mask[..., 0] = True
        return PrefillInputs(
            x=torch.zeros((b, t, self.dim), dtype=self.loaded.dtype, device=device),
            ids=torch.zeros((b, t), dtype=torch.long, device=device),
            positions=torch.arange(t, device=device).expand(3, b, t).contiguous(),
            mask=mask,
            slots=torch.zeros((b,), dtype=torch.long, device=device),
            write=torch.full((b, t), self.pool.length, dtype=torch.long, device=device),
            ends=torch.full((b,), t - 1, dtype=torch.long, device=device),
        )

    def has(self, key: BucketKey) -> bool:
        return key in self._graphs

    @property
    def captured(self) -> int:
        return len(self._graphs)
