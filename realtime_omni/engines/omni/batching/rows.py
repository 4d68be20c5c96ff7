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


@dataclass(frozen=True)
class SessionRows:
    thinker: Rows
    talker: Rows
