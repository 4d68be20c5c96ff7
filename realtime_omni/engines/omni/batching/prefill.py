"""Thinker prefills of several sessions in one forward pass.

When many replies start together, prefilling one session after another makes the last one wait
for all the others (the prompt's audio tower and every thinker layer, eagerly, per session). The
:class:`PrefillBatcher` takes the prefills pending at that moment (up to a token budget), pads
them to one length, merges their audio / image inputs, and runs them as one batch: each row writes
its tokens into its own slot at its own offset, and attends to its own slot only.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from ..graphs import on_stream
from .batcher import Mailbox
from .slots import SlotPool

log = logging.getLogger(__name__)

#: multimodal inputs whose rows can be merged across sessions (by concatenation on dim 0)
MERGEABLE = {"input_features", "feature_attention_mask", "pixel_values", "image_grid_thw"}


@dataclass(eq=False)
class PrefillRequest:
    ids: Any  # (n,) long, cpu
    positions: Any  # (3, n) long rotary positions
    mm: dict[str, Any]
    slot: int
    start: int  # the slot's current length: where the first token goes
    done: threading.Event = field(default_factory=threading.Event)
    result: tuple[Any, Any] | None = None  # (last-token logits (1, V), talker vectors (n, H))
    error: BaseException | None = None


class SlotRowsCache:
    """Duck-typed cache for a batch of multi-token rows, each in its own slot: writes go to
    ``(slot_b, position_bt)``; attention reads each row's slot (a gathered copy)."""

    is_compileable = False

    def __init__(self, pool: SlotPool, slots: Any, write_pos: Any) -> None:
        self.pool = pool
        self.slots = slots  # (B,)
        self.write_pos = write_pos  # (B, T)

    def update(self, key_states: Any, value_states: Any, layer_idx: int, *args: Any, **kwargs: Any):
        keys, values = self.pool.keys[layer_idx], self.pool.values[layer_idx]
        rows = self.slots[:, None]
        keys[rows, :, self.write_pos] = key_states.transpose(1, 2)  # (B, T, kv_heads, dim)
        values[rows, :, self.write_pos] = value_states.transpose(1, 2)
        return keys.index_select(0, self.slots), values.index_select(0, self.slots)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return 0

    def __len__(self) -> int:
        return len(self.pool.keys)


class PrefillBatcher(Mailbox):
    name = "thinker prefill"

    def __init__(self, loaded: Any, pool: SlotPool, *, hidden_select: Any, accept_layer: int,
                 gather_s: float = 0.01, token_budget: int = 8192, step_timeout_s: float = 120.0) -> None:
        self.loaded = loaded
        self.pool = pool
        self.hidden_select = hidden_select
        self.accept_layer = accept_layer
        self.gather_s = gather_s
        self.token_budget = token_budget
        self.step_timeout_s = step_timeout_s
        super().__init__()
        self.batches = 0
        self.rows = 0
        self.busy_s = 0.0
        self._thread = threading.Thread(target=self._loop, name="batch-prefill", daemon=True)
        self._thread.start()

    def prefill(self, ids: Any, positions: Any, mm: dict[str, Any], slot: int, start: int) -> tuple[Any, Any]:
        if set(mm) - MERGEABLE:
            raise ValueError(f"cannot batch prefill inputs {sorted(set(mm) - MERGEABLE)}")
        n = int(ids.numel())
        if start + n > self.pool.length:
            raise ValueError(f"the prefill needs {start + n} tokens of a {self.pool.length}-token slot")
        return self._submit(PrefillRequest(ids.reshape(-1), positions, mm, slot, start))

    def close(self) -> None:
        self._close_mailbox()
        self._thread.join(timeout=5)

    def stats(self) -> dict[str, Any]:
        return {"batches": self.batches, "rows": self.rows, "busy_s": self.busy_s,
                "mean_rows": self.rows / self.batches if self.batches else 0.0}

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closed:
                    self._cond.wait(0.5)
                if self._closed:
                    return
                deadline = time.monotonic() + self.gather_s  # let prefills that start together meet
                while not self._closed:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    self._cond.wait(left)
                take, tokens = [], 0
                seen: set[int] = set()
                for req in self._queue:
                    n = int(req.ids.numel())
                    if take and (tokens + n > self.token_budget or req.slot in seen):
                        continue
                    take.append(req)
                    seen.add(req.slot)
                    tokens += n
                chosen = {id(r) for r in take}
                self._queue = [r for r in self._queue if id(r) not in chosen]
            self._run(take)

    def _run(self, take: list[PrefillRequest]) -> None:
        import torch

        started = time.perf_counter()
        try:
            with torch.inference_mode(), on_stream(self.loaded.stream("thinker")):
                results = self._forward(take)
            for req, res in zip(take, results, strict=True):
                req.result = res
        except BaseException as exc:  # noqa: BLE001 - every waiting session gets the error
            log.exception("omni: batched prefill failed")
            for req in take:
                req.error = exc
        finally:
            self.batches += 1
            self.rows += len(take)
            self.busy_s += time.perf_counter() - started
            for req in take:
                req.done.set()

    def _forward(self, take: list[PrefillRequest]) -> list[tuple[Any, Any]]:
        import torch

        loaded, pool = self.loaded, self.pool
        device = loaded.device
        lengths = [int(r.ids.numel()) for r in take]
        batch, width = len(take), max(lengths)
        ids = torch.full((batch, width), int(loaded.tokens.im_end), dtype=torch.long)
        positions = torch.zeros((3, batch, width), dtype=torch.long)
        write = torch.full((batch, width), pool.length, dtype=torch.long)  # padding → scratch
        visible = torch.zeros((batch, width), dtype=torch.long)  # last column each query may see
        for b, (req, n) in enumerate(zip(take, lengths, strict=True)):
            ids[b, :n] = req.ids
            positions[:, b, :n] = req.positions
            positions[:, b, n:] = req.positions[:, -1:] + 1
            write[b, :n] = torch.arange(req.start, req.start + n)
            visible[b] = torch.arange(req.start, req.start + width)
        columns = torch.arange(pool.length + 1)
        mask = (columns[None, None, :] <= visible[:, :, None]) & (columns[None, None, :] < pool.length)
        mm = _merge([r.mm for r in take])
        cache = SlotRowsCache(pool, torch.tensor([r.slot for r in take], device=device), write.to(device))
        ids_d = ids.to(device)
        out = loaded.thinker.model(
            input_ids=ids_d, position_ids=positions.to(device), attention_mask=mask[:, None].to(device),
            use_cache=True, output_hidden_states=self.hidden_select, return_dict=True,
            **{loaded.cache_kwarg: cache}, **mm)
        hidden, last = out.hidden_states, out.last_hidden_state
        multimodal = ids_d == loaded.tokens.audio
        if loaded.tokens.image is not None:
            multimodal |= ids_d == loaded.tokens.image
        embed = hidden[0]
        if loaded.arch == "qwen2_5_omni":
            src = last + torch.where(multimodal[..., None], torch.zeros_like(embed), embed)
        else:
            src = torch.where(multimodal[..., None], hidden[self.accept_layer], embed)
        ends = torch.tensor([n - 1 for n in lengths], device=device)
        logits = loaded.thinker.lm_head(last[torch.arange(batch, device=device), ends]).float()
        return [(logits[b : b + 1].clone(), src[b, :n].clone()) for b, n in enumerate(lengths)]


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
    for key in ("pixel_values", "image_grid_thw"):
        values = [p[key] for p in parts if key in p]
        if values:
            merged[key] = torch.cat(values, dim=0)
    return merged
