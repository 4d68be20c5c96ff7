"""One reply's codec stream: code chunks in, the new samples out (see :mod:`.codec` for how
windows reach back for left context, hold back their last codes and cross-fade the seams)."""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np

from .codec import OUTPUT_RATE, OmniCodec

log = logging.getLogger(__name__)


class CodecStream:
    """Incremental decoder for one reply: push code chunks in order, get the new samples."""

    @classmethod
    def of(cls, codec: OmniCodec, turn: int, speaker: str | None, seed: int | None = None,
           slot: int | None = None) -> CodecStream:
        """A stream of ``codec`` for one reply (``seed``: the codec's own by default; ``slot``: the
        session's talker slot, which names the reply's first window to the batched codec)."""
        return cls(codec, turn, speaker, codec.settings.seed if seed is None else seed, slot)

    def __init__(self, codec: OmniCodec, turn: int, speaker: str | None, seed: int, slot: int | None = None) -> None:
        self.codec = codec
        self.slot = slot
        self.turn = turn
        self.speaker = speaker
        self.seed = seed
        self.codes: list[Any] = []  # per-chunk tensors
        self.n = 0  # codes received
        self.emitted = 0  # samples emitted (global index of the next sample)
        self.tail: np.ndarray | None = None  # previous render of the held-back samples
        self.finished = False
        self.started: float | None = None  # when the first audio came out (the listener starts)

    def push(self, codes, start: int | None = None, final: bool = False) -> np.ndarray:
        import torch

        codes = torch.as_tensor(codes, dtype=torch.long).cpu()
        if start is not None and start != self.n:
            if start < self.n:  # a replay: forget what follows
                self._truncate(start)
            else:  # frames were lost upstream: continue without them (no left context there)
                log.debug("omni codec: gap of %d frames", start - self.n)
                self.codes.append(torch.zeros((start - self.n, *codes.shape[1:]), dtype=torch.long))
                self.n = start
                self.emitted = max(self.emitted, self.codec.rendered_length(start))
                self.tail = None
        if codes.shape[0]:
            self.codes.append(codes)
            self.n += int(codes.shape[0])
        return self._emit(final)

    def _truncate(self, n: int) -> None:
        import torch

        allc = torch.cat(self.codes, dim=0) if self.codes else None
        self.codes = [allc[:n]] if allc is not None else []
        self.n = n

    def _emit(self, final: bool) -> np.ndarray:
        import torch

        codec = self.codec
        U = codec.samples_per_code
        hold = 0 if final else max(0, codec.settings.lookahead_frames)
        target = codec.rendered_length(max(0, self.n - hold)) if self.n - hold > 0 else 0
        if final:
            target = codec.rendered_length(self.n)
            self.finished = True
        if target <= self.emitted or self.n == 0:
            return np.zeros(0, np.float32)
        first_code = self.emitted // U
        c0 = max(0, first_code - max(0, codec.settings.left_context_frames))
        c0 = (c0 // codec.block) * codec.block
        if final:
            c0 = codec.last_start(self.n, c0)
        allc = torch.cat(self.codes, dim=0)
        if len(self.codes) > 1:
            self.codes = [allc]
        wav = codec.render(allc[c0 : self.n], c0, self.speaker, self.seed, steady=not final, deadline=self._deadline(),
                           owner=self.slot if self.started is None else None)
        base = c0 * U
        new = wav[self.emitted - base : target - base].copy()
        if self.tail is not None and len(self.tail) and len(new):
            xf = min(len(self.tail), len(new), int(codec.settings.crossfade_ms * OUTPUT_RATE / 1000))
            if xf > 0:
                w = (np.arange(1, xf + 1, dtype=np.float32) / (xf + 1))
                new[:xf] = self.tail[:xf] * (1.0 - w) + new[:xf] * w
        self.tail = wav[target - base :].copy() if not final else None
        self.emitted = target
        if self.started is None and len(new):
            self.started = time.monotonic()
        return new

    def _deadline(self) -> float:
        """When a listener who plays from the first audio reaches the next sample (the first
        window: now)."""
        if self.started is None:
            return time.monotonic()
        return self.started + self.emitted / OUTPUT_RATE


def to_int16(wav: np.ndarray) -> np.ndarray:
    return (np.clip(wav, -1.0, 1.0) * 32767.0).round().astype(np.int16)
