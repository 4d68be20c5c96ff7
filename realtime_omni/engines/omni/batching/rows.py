"""What a session holds of each batched stage (its rows), apart from the stages themselves, so the
per-session thinker and talker can name it without importing :mod:`.stages`, which imports them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .batcher import StepBatcher
from .prefill import PrefillBatcher
from .slots import SlotPool


@dataclass(frozen=True)
class Rows:
    """What one stage gives a session: its batcher, and its pool and slot."""

    batcher: StepBatcher
    pool: SlotPool | None = None
    slot: int | None = None
    prefill: PrefillBatcher | None = None
    #: the stage's per-slot state (the thinker's tokens, the fused talker's frame state)
    state: Any = None
    #: steps a session keeps queued ahead on this stage (see ``batcher.Lookahead``)
    lookahead: int = 1
    #: the session's slot on the stage after this one (the thinker's rows: its talker slot, whose
    #: prefill follows a spoken reply's thinker prefill)
    then: int | None = None


@dataclass(frozen=True)
class SessionRows:
    thinker: Rows
    talker: Rows


class DrawBlocks:
    """A session's uniform draws for one stage's batched steps (the sampler's noise), drawn
    ``rows`` steps at a time with the session's generator: on a GPU one kernel launch per block
    from the session's thread instead of one per token or frame. Step ``i`` of a block takes its
    row ``i``. A greedy stage draws nothing: every step gets the same host zeros, which the loop
    turns into one tensor for all rows."""

    def __init__(self, width: int, sample: bool, device: Any, generator: Any, rows: int = 16) -> None:
        self.width, self.sample, self.device, self.generator = int(width), bool(sample), device, generator
        self.rows = max(1, int(rows))
        self._zeros = [0.0] * self.width
        self._block: Any = None
        self._next = 0

    def next(self) -> Any:
        if not self.sample:
            return self._zeros
        if self._block is None or self._next >= self.rows:
            import torch

            self._block = torch.rand((self.rows, self.width), dtype=torch.float32, device=self.device,
                                     generator=self.generator)
            self._next = 0
        row = self._block[self._next]
        self._next += 1
        return row
