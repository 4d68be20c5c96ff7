"""Token sampling over one step's logits: repetition penalty, top-k, top-p, min-p, temperature.

The same chain, in the same order, as llama.cpp's default sampler, so replies keep the character
they had there; an optional mask (a grammar's allowed tokens) is applied first.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Sampling:
    temperature: float = 0.3
    top_p: float = 0.9
    top_k: int = 40
    min_p: float = 0.05
    repeat_penalty: float = 1.2
    #: how many of the latest tokens the repetition penalty looks at
    penalty_window: int = 64


def sample(logits: np.ndarray, recent: Sequence[int], settings: Sampling, rng: np.random.Generator,
           allowed: np.ndarray | None = None) -> int:
    scores = np.array(logits, dtype=np.float32).reshape(-1)
    if allowed is not None:
        scores[~allowed] = -np.inf
    if settings.repeat_penalty != 1.0 and recent:
        seen = np.unique(np.asarray(recent[-settings.penalty_window:], dtype=np.int64))
        picked = scores[seen]
        scores[seen] = np.where(picked > 0, picked / settings.repeat_penalty, picked * settings.repeat_penalty)
    k = min(settings.top_k if settings.top_k > 0 else scores.size, scores.size)
    candidates = np.argpartition(-scores, k - 1)[:k]
    candidates = candidates[np.argsort(-scores[candidates], kind="stable")]
    top = scores[candidates]
    finite = np.isfinite(top)
    if not finite.any():
        raise ValueError("no token is allowed at this step")
    candidates, top = candidates[finite], top[finite]
    if settings.temperature <= 0:
        return int(candidates[0])
    probs = np.exp(top - top[0])
    probs /= probs.sum()
    keep = int(np.searchsorted(np.cumsum(probs), settings.top_p) + 1) if settings.top_p < 1.0 else probs.size
    keep = max(1, min(keep, probs.size))
    keep = max(1, min(keep, int((probs[:keep] >= settings.min_p * probs[0]).sum())))
    tempered = np.exp((top[:keep] - top[0]) / settings.temperature)
    return int(candidates[rng.choice(keep, p=tempered / tempered.sum())])
