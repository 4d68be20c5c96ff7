"""Token sampling for the thinker and the talker, in the reference ``generate``'s order."""

from __future__ import annotations

from typing import Any

from .device_copy import to_device
from .streams import same_device


class TokenSampler:
    """Repetition penalty → suppressed tokens → temperature → top-k → top-p, then argmax or a draw:
    the order ``GenerationMixin._get_logits_processor`` applies them in."""

    def __init__(
        self,
        do_sample: bool = False,
        temperature: float = 1.0,
        top_k: int | None = None,
        top_p: float | None = None,
        repetition_penalty: float | None = None,
        suppress: list[int] | None = None,
        generator: Any = None,
    ) -> None:
        import torch
        from transformers import (
            LogitsProcessorList,
            RepetitionPenaltyLogitsProcessor,
            TemperatureLogitsWarper,
            TopKLogitsWarper,
            TopPLogitsWarper,
        )

        self.do_sample = bool(do_sample)
        self.generator = generator
        self._suppress = torch.tensor(sorted(set(suppress or [])), dtype=torch.long)
        procs = []
        if repetition_penalty is not None and repetition_penalty != 1.0:
            procs.append(RepetitionPenaltyLogitsProcessor(penalty=float(repetition_penalty)))
        self._pre = LogitsProcessorList(procs)
        warpers = []
        if self.do_sample:
            if temperature is not None and temperature != 1.0:
                warpers.append(TemperatureLogitsWarper(float(temperature)))
            if top_k is not None and top_k != 0:
                warpers.append(TopKLogitsWarper(top_k=int(top_k)))
            if top_p is not None and top_p < 1.0:
                warpers.append(TopPLogitsWarper(top_p=float(top_p)))
        self._warp = LogitsProcessorList(warpers)

    def __call__(self, logits, history=None) -> int:
        """``logits``: (1, V) float; ``history``: (1, H) long ids the penalty looks at."""
        import torch

        # host inputs reach the device through pinned memory, and the suppressed ids are cut to
        # the vocabulary on the host: each pageable copy or device-side mask would wait for the
        # stream's queue, which other sessions' threads share; the pick's read is the one wait
        scores = logits.float()
        if history is not None:
            history = to_device(history, scores.device)
        if len(self._pre) and history is not None and history.numel():
            scores = self._pre(history, scores)
        idx = self._suppress[self._suppress < scores.shape[-1]]
        if idx.numel():
            scores = scores.index_fill(-1, to_device(idx, scores.device), -float("inf"))
        if not self.do_sample:
            return int(torch.argmax(scores, dim=-1)[0])
        scores = self._warp(history, scores)
        probs = torch.softmax(scores, dim=-1)
        gen = self.generator
        if gen is not None and not same_device(gen.device, probs.device):
            gen = None
        return int(torch.multinomial(probs, 1, generator=gen)[0, 0])


def sample_top_k_top_p(logits, uniform, temperature: float, top_k: int, top_p: float):
    """One draw from ``softmax(logits / temperature)`` cut to the top-k, then to the top-p mass;
    ``uniform`` (k values in (0, 1)) drives an exponential race. No host sync: graph-safe."""
    import torch

    values, index = torch.topk(logits / temperature, top_k)  # sorted, largest first
    probs = torch.softmax(values, dim=-1)
    before = torch.cumsum(probs, dim=-1) - probs
    probs = probs * (before < top_p)  # the smallest prefix whose mass reaches top_p
    race = probs / -torch.log(uniform.clamp_min(1e-20))
    return index.gather(-1, torch.argmax(race, dim=-1, keepdim=True))
