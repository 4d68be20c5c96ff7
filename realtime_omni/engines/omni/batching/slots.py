"""The KV cache of one stage, shared by all sessions: one slot (batch row) per session.

Each decoder layer gets one key and one value tensor of shape ``[slots, kv_heads, length + 1,
head_dim]``. A session's own transformers ``StaticCache`` is made of views into its slot row, so
its prefill, crop and length bookkeeping work as before, while the batched decode step
(:class:`RowsCache`) writes one token per row at each row's own position and attends over the
rows in place, without copying a session's cache anywhere.

The extra last column is scratch: a batch row without work in a step writes there, and no
session's context ever reaches it.

A step attends over the first ``columns`` of the rows only (:meth:`SlotPool.column_buckets`):
the longest context among the step's rows decides how many, rounded up to a bucket, so a batch
of short conversations does not read an 8192-token slot to the end at every token.
"""

from __future__ import annotations

import threading
from typing import Any

from ...base import ModelAtCapacity


#: the shortest attended span of a batched step, and the factor between one span and the next
FIRST_COLUMNS = 256
COLUMNS_FACTOR = 4


class SlotsFull(ModelAtCapacity):
    """Every slot of a stage is taken: the engine is at its real-time capacity."""


def _kv_shape(config: Any) -> tuple[int, int, int]:
    layers = int(config.num_hidden_layers)
    heads = int(config.num_attention_heads)
    kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // heads)
    return layers, kv_heads, head_dim


class SlotPool:
    """Preallocated K/V of one stage for ``slots`` sessions of up to ``length`` tokens each."""

    def __init__(self, config: Any, slots: int, length: int, device: Any, dtype: Any, name: str) -> None:
        import torch

        if slots < 1 or length < 2:
            raise ValueError("a slot pool needs at least one slot of two tokens")
        self.name = name
        self.slots = int(slots)
        self.length = int(length)  # usable tokens per slot; column ``length`` is scratch
        self.device = torch.device(device)
        self.dtype = dtype
        layers, kv_heads, head_dim = _kv_shape(config)
        shape = (self.slots, kv_heads, self.length + 1, head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=self.device) for _ in range(layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=self.device) for _ in range(layers)]
        self._free = list(range(self.slots))
        self._lock = threading.Lock()

    # -- accounting ------------------------------------------------------------------------

    def column_buckets(self) -> list[int]:
        """How many leading columns a batched step may attend over: 256, 1024, 4096, … below the
        slot's length, then every column (the context and the scratch column)."""
        buckets, span = [], FIRST_COLUMNS
        while span < self.length + 1:
            buckets.append(span)
            span *= COLUMNS_FACTOR
        return [*buckets, self.length + 1]

    def columns_for(self, last_write: int) -> int:
        """The smallest column bucket that holds a step whose rows write at most at ``last_write``."""
        need = int(last_write) + 1
        return next((c for c in self.column_buckets() if c >= need), self.length + 1)

    @property
    def bytes_per_slot(self) -> int:
        per_layer = self.keys[0][0].numel() * self.keys[0].element_size()
        return 2 * per_layer * len(self.keys)

    @property
    def in_use(self) -> int:
        with self._lock:
            return self.slots - len(self._free)

    def allocate(self) -> int:
        """The lowest free slot (so batches stay short); :class:`SlotsFull` when none is left."""
        with self._lock:
            if not self._free:
                raise SlotsFull(f"all {self.slots} {self.name} slots are in use")
            self._free.sort()
            return self._free.pop(0)

    def release(self, slot: int) -> None:
        with self._lock:
            if 0 <= slot < self.slots and slot not in self._free:
                self._free.append(slot)

    # -- views -----------------------------------------------------------------------------

    def attach(self, cache: Any, slot: int) -> None:
        """Point every layer of a batch-1 ``StaticCache`` at this pool's row ``slot``."""
        import torch

        # every layer's length is its own element of one tensor: one allocation, not one a layer
        lengths = torch.zeros(len(cache.layers), dtype=torch.long, device=self.device)
        for i, layer in enumerate(cache.layers):
            keys = self.keys[i][slot : slot + 1, :, : self.length]
            values = self.values[i][slot : slot + 1, :, : self.length]
            layer.max_cache_len = self.length
            layer.device = self.device
            layer.batch_size, layer.num_heads = 1, keys.shape[1]
            layer.k_head_dim = layer.v_head_dim = keys.shape[-1]
            layer.keys, layer.values = keys, values
            layer.cumulative_length = lengths[i]
            layer.is_initialized = True

    def rows(self, bucket: int, write_pos: Any, columns: int | None = None) -> RowsCache:
        return RowsCache(self, bucket, write_pos, self.length + 1 if columns is None else columns)


class RowsCache:
    """Duck-typed transformers cache for one batched decode step over slots ``0..bucket-1``.

    ``write_pos`` (``bucket`` longs, on the device) is where each row's new token goes; the
    attention mask lets a row see its columns ``0..write_pos``. Both are static tensors, so the
    step can be captured once per bucket and replayed for any mix of sessions and lengths.
    Attention reads the first ``columns`` columns of each row: every working row writes below
    that; a row without work writes to the scratch column, outside it, and its output is unused.
    """

    is_compileable = True

    def __init__(self, pool: SlotPool, bucket: int, write_pos: Any, columns: int) -> None:
        import torch

        if not 1 <= columns <= pool.length + 1:
            raise ValueError(f"a step attends over 1..{pool.length + 1} columns, not {columns}")
        self.pool = pool
        self.bucket = bucket
        self.write_pos = write_pos
        self.rows = torch.arange(bucket, device=pool.device)
        self.columns = torch.arange(columns, device=pool.device)

    def mask(self) -> Any:
        """``(bucket, 1, 1, columns)`` boolean: True where a row may attend."""
        return (self.columns[None, :] <= self.write_pos[:, None])[:, None, None, :]

    def update(self, key_states: Any, value_states: Any, layer_idx: int, *args: Any, **kwargs: Any):
        keys = self.pool.keys[layer_idx][: self.bucket]
        values = self.pool.values[layer_idx][: self.bucket]
        # (bucket, kv_heads, 1, dim) -> each row's own column; index_put_ stays on the device
        keys[self.rows, :, self.write_pos] = key_states[:, :, 0, :]
        values[self.rows, :, self.write_pos] = value_states[:, :, 0, :]
        span = len(self.columns)
        return keys[:, :, :span], values[:, :, :span]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return 0  # positions are always given explicitly

    def __len__(self) -> int:
        return len(self.pool.keys)
