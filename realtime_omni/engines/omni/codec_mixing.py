"""Qwen2.5 codec windows of different lengths decoded in one pass.

The batched codec (:mod:`.batching.codec_windows`) decodes the windows pending at one moment
together, one group per window shape. Replies at different points have windows of several
lengths pending at once: a new reply's short first windows beside the steady ones of replies
already speaking, or two cohorts of a burst of replies one ramp window apart. A pass per length
costs nearly as much as one pass for all of them, because at a few rows the DiT's 36 evaluations
are bound by their kernel launches (Qwen2.5 on the H100: one window 91 ms, 16 windows 304 ms).

Here the DiT runs once for every pending window, each padded at its end to the longest
(:class:`~.dit_blocks.DiTWindow` keeps each window's frames from attending to its padding: the
DiT mixes frames only in attention), and the vocoder, whose convolutions do look past a window's
end, runs once per length, on the mel frames that are the window's own. Each window's audio is
what it is alone, up to rounding.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Hashable, Sequence
from typing import Any

from .device_copy import to_device
from .streams import on_stream

#: rows of the vocoder's passes (one length of a mixed pass each; a single row included)
VOCODER_BUCKETS = (1, 2, 4, 8, 16, 32)


class MixedWindows:
    """Decodes a group of Qwen2.5 windows of any lengths (``codec``: the :class:`~.codec.OmniCodec`).

    On CUDA the passes replay graphs captured at load (:meth:`capture`): the DiT for each window
    length a reply renders and each group bucket (a pass is padded to the next captured length
    and bucket), the vocoder for each length and bucket. Windows longer than every captured length
    (a reply's last window) are not mixed: they take the batched codec's own path."""

    def __init__(self, codec: Any, buckets: Sequence[int]) -> None:
        self.codec = codec
        self.windows = codec.windows
        self.buckets = tuple(sorted(buckets))
        #: the DiT's buckets: a mixed pass has two windows at least, and pads two to four (one
        #: graph fewer per length to capture at load, where each costs seconds)
        self.dit_buckets = tuple(b for b in self.buckets if b >= 4) or self.buckets
        #: DiT window lengths (codes) with captured graphs, ascending (any length without graphs)
        self.lengths: list[int] = []
        self.passes = 0  # mixed passes run
        self.padded_codes = 0  # codes of padding the DiT ran in them
        #: a pass's cost model, ms = fixed + per_code * codes (rows times the padded length),
        #: from the codec's groups timed at load (:meth:`learn`); until then every length mixes
        self.fixed_ms = math.inf
        self.per_code_ms = 0.0

    def _length(self, key: Hashable) -> int | None:
        """The length in codes of a Qwen2.5 window of graph key ``key`` (None: no such window)."""
        if isinstance(key, tuple) and key[:-1] == self.codec.key_prefix and isinstance(key[-1], int):
            return key[-1]
        return None

    def family(self, key: Hashable) -> Hashable | None:
        """The group a window of graph key ``key`` decodes in (None: only with its own shape)."""
        n = self._length(key)
        if n is None or (self.windows.enabled and not (self.lengths and n <= self.lengths[-1])):
            return None
        return ("mixed", *self.codec.key_prefix)

    def learn(self, group_ms: dict[int, float], codes: int) -> None:
        """Fit the cost model to the times of groups of ``codes``-code windows by group size (the
        real-time capacity's measurement at load): the time of one window is mostly launches,
        what more windows add is mostly arithmetic (H100, Qwen2.5: 91 ms alone, 569 for 32)."""
        sizes = sorted(group_ms)
        if codes <= 0 or len(sizes) < 2 or sizes[0] != 1:
            return
        top = sizes[-1]
        self.per_code_ms = max(0.0, (group_ms[top] - group_ms[1]) / ((top - 1) * codes))
        self.fixed_ms = max(0.0, group_ms[1] - self.per_code_ms * codes)

    def choose(self, group: Sequence[Any], length=lambda req: req.key[-1]) -> list[Any]:
        """The windows of ``group`` (ordered by urgency) worth one pass: those of the first one's
        length, then each other length (in order of urgency) where padding it into the pass costs
        no more than a pass of its own (the rest get a pass of their own later)."""
        by_length: dict[int, list[Any]] = {}
        for req in group:
            by_length.setdefault(length(req), []).append(req)
        lengths = iter(by_length)
        first = next(lengths)
        longest, rows, taken = first, len(by_length[first]), [first]
        for n in lengths:
            more = len(by_length[n])
            apart = self._cost(rows, longest) + self._cost(more, n)
            if self._cost(rows + more, max(longest, n)) <= apart:  # (inf: not measured, all mix)
                longest, rows = max(longest, n), rows + more
                taken.append(n)
        return [req for n in taken for req in by_length[n]]

    def _cost(self, rows: int, codes: int) -> float:
        return self.fixed_ms + self.per_code_ms * rows * codes

    def run(self, inputs: Sequence[tuple[Any, ...]], lengths: Sequence[int]) -> tuple[list[Any], bool]:
        """The waveform (1, samples) of each window, and whether the DiT's pass replayed a graph:
        ``inputs`` as the codec builds them (codes (1, n), noise (1, n * repeats, mel), speaker
        (1, D), encoding (1, branches, D')) with ``lengths`` n."""
        import torch
        import torch.nn.functional as F

        codec = self.codec
        rows, longest = len(inputs), max(lengths)
        n = next((m for m in self.lengths if m >= longest), longest) if self.windows.enabled else longest
        size = self._bucket(self.dit_buckets, rows, lambda b: ("dit", *codec.key_prefix, n, b))
        dit_key = ("dit", *codec.key_prefix, n, size)
        order = [*range(rows), *[0] * (size - rows)]  # then copies of the first window, discarded
        pad = [n - m for m in lengths]
        self.passes += 1
        self.padded_codes += sum(pad)
        codes = torch.cat([F.pad(inputs[i][0], (0, pad[i])) for i in order])
        noise = torch.cat([F.pad(inputs[i][1], (0, 0, 0, pad[i] * codec.repeats)) for i in order])
        speaker = torch.cat([inputs[i][2] for i in order])
        encoding = torch.cat([inputs[i][3] for i in order])
        own = to_device(torch.tensor([lengths[i] for i in order], dtype=torch.long), codes.device)
        replayed = self.windows.has(dit_key)
        mel = self.windows.run(dit_key, codec.q25_dit, (codes, noise, speaker, encoding, own), capture=False)
        out: list[Any] = [None] * rows
        by_length: dict[int, list[int]] = collections.defaultdict(list)
        for i, m in enumerate(lengths):
            by_length[m].append(i)
        for m, picked in by_length.items():
            vsize = self._bucket(VOCODER_BUCKETS, len(picked), lambda b, m=m: ("vocoder", *codec.key_prefix, m, b))
            index = to_device(torch.tensor(picked + [picked[0]] * (vsize - len(picked))), mel.device)
            wav = self.windows.run(("vocoder", *codec.key_prefix, m, vsize), codec.q25_vocode,
                                   (mel[index, :, : m * codec.repeats].contiguous(),), capture=False)
            for j, i in enumerate(picked):
                out[i] = wav[j : j + 1].clone()
        return out, replayed

    def _bucket(self, buckets: Sequence[int], rows: int, key) -> int:
        """The smallest bucket holding ``rows`` whose graph was captured (``rows`` itself where
        none was: an eager pass, as on the CPU)."""
        return next((b for b in buckets if b >= rows and self.windows.has(key(b))), rows)

    def capture(self, keys: Sequence[Hashable], longest: int = 0) -> list[int]:
        """At load (inside :func:`~.graphs.probing`): for the window shapes a reply renders (their
        graph keys), capture the DiT of each length for every group bucket and the vocoder for
        every vocoder bucket, with random windows; for ``longest`` (a reply's longest last
        window) the DiT only: the last windows of replies that end together decode in one pass,
        padded to it, instead of eagerly. Their vocoder runs eagerly: as fast as replayed for 32
        windows, 2-5 times slower for 8 or one (H100: 58.7 against 32.0 ms, 40.9 against 7.9),
        where an eager DiT costs hundreds of ms. Returns the lengths (codes) now mixed."""
        if not self.windows.enabled:
            return []
        import torch

        codec = self.codec
        lengths = [n for n in map(self._length, keys) if n is not None]
        vocoded = set(lengths)
        lengths += [longest] if longest > max(lengths, default=0) else []
        with torch.inference_mode(), on_stream(codec.loaded.stream("codec")):
            for n in sorted(set(lengths)):
                key, _fn, (codes, noise, speaker, encoding) = codec.steady_window(1, n)
                for size in self.dit_buckets:
                    rows = tuple(t.expand(size, *t.shape[1:]).contiguous() for t in (codes, noise, speaker, encoding))
                    own = torch.full((size,), n, dtype=torch.long, device=codes.device)
                    for _ in range(2):  # a shape is captured on its second use
                        mel = self.windows.run(("dit", *key[:-1], n, size), codec.q25_dit, (*rows, own), capture=True)
                for size in VOCODER_BUCKETS if n in vocoded else ():
                    part = mel[:1].expand(size, *mel.shape[1:]).contiguous()
                    for _ in range(2):
                        self.windows.run(("vocoder", *key[:-1], n, size), codec.q25_vocode, (part,), capture=True)
        self.lengths = sorted(n for n in set(lengths) if all(
            self.windows.has(("dit", *codec.key_prefix, n, b)) for b in self.dit_buckets))
        return self.lengths

    def stats(self) -> dict[str, int]:
        return {"mixed_passes": self.passes, "mixed_padded_codes": self.padded_codes}
