"""Chunked code → waveform decoding (24 kHz) with left context, hold-back and cross-fade.

Every decode renders a window ``codes[c0:e]`` where ``c0`` reaches ``left_context_frames`` before
the first sample still to emit, and keeps only the samples that are new. The sample ↔ code mapping
is exact for both codecs (sample ``t`` of a window starting at code ``c0`` is global sample
``c0 * samples_per_code + t``), so seams line up to the sample.

Qwen3-Omni ``code2wav`` is causal (causal convolutions, sliding-window causal attention), except
that each transposed-convolution stage needs one frame of look-ahead: rendering ``n`` codes yields
``n * 1920 - lost`` samples (``lost`` = 555 for the released config). The stream therefore emits
``[g(prev), g(e))`` with ``g(x) = x * 1920 - lost``, and the next window re-renders the held-back
``lost`` samples with their right context — unlike ``Qwen3OmniMoeCode2Wav.chunked_decode``, which
drops ``lost`` samples at every chunk seam. With a left context at least the receptive field
(convolutions: a few frames; attention: ``sliding_window`` × layers) the stream equals the one-shot
decode to float precision; the released config's 72-frame window × 8 layers is wider than the
default 25-frame context the reference uses, so there the match is approximate at the seams.

Qwen2.5-Omni token2wav (DiT flow matching + BigVGAN) is not causal: the DiT attends within
24-mel-frame blocks (12 codes) plus one block back (layers 0, 20) and one ahead (layer 10), and the
ODE solver iterates it 36 times; BigVGAN's convolutions look about a dozen mel frames both ways.
The stream keeps windows block-aligned, draws the ODE's initial noise per absolute mel frame (a
fixed, seeded noise field, so every window sees the same noise the one-shot decode sees), holds
back ``lookahead_frames`` codes at the end of each window (re-rendered with right context next
time) and cross-fades the held-back region from the old render to the new one over
``crossfade_ms``. The residual difference from one-shot decoding comes from the DiT's look-ahead
block and the ODE's growing receptive field at window edges.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from .codec_mixing import MixedWindows
from .device_copy import to_device
from .graphs import is_probing
from .shape_graphs import ShapeGraphs
from .streams import on_stream
from .loader import LoadedOmni, samples_per_code
from .waveform import code2wav, dit_sample, encode_speaker, set_dit_dtype, vocode

log = logging.getLogger(__name__)

OUTPUT_RATE = 24_000
_NOISE_BLOCK = 256  # mel frames per independently seeded noise block (Qwen2.5)


@dataclass
class CodecSettings:
    left_context_frames: int = 24
    #: codes held back at the end of every non-final window (re-rendered with right context)
    lookahead_frames: int = 0
    crossfade_ms: float = 10.0
    seed: int = 0
    # Qwen2.5 token2wav ODE settings (the reference defaults)
    dit_steps: int = 10
    guidance_scale: float = 0.5
    sway_coefficient: float = -1.0
    #: the DiT transformer's precision (its inputs and output stay float32: see waveform.set_dit_dtype)
    dit_dtype: str = "float32"
    #: replay each window shape as a CUDA graph (CUDA only)
    cuda_graphs: bool = True
    #: a window's graph comes in pieces (a DiT evaluation, a vocoder stage: ``piece_boundary``),
    #: at most this many queued on the device at once (0: a pass queued whole, as one graph)
    queued_pieces: int = 4
    #: every window shape's graph in one memory pool (see shape_graphs.ShapeGraphs)
    shared_pool: bool = True


class OmniCodec:
    """Shared (per model) decoder; per-reply state lives in :class:`~.codec_stream.CodecStream`."""

    def __init__(self, loaded: LoadedOmni, settings: CodecSettings, batch_windows: bool = False,
                 batch_rows: int = 64) -> None:
        self.loaded = loaded
        self.settings = settings
        self.arch = loaded.arch
        self.samples_per_code = samples_per_code(loaded)
        self._speaker_cache: dict[tuple, Any] = {}
        #: whether windows rendered while the model warms up get group buckets (see _window)
        self._group_shapes = True
        #: captured window lengths a reply's last window may be stretched to (see last_start)
        self.last_window_lengths: list[int] = []
        self.windows = ShapeGraphs(device=loaded.device, enabled=settings.cuda_graphs,
                                   name=f"{loaded.arch} codec window", limit=192, **loaded.graph_streams("codec"),
                                   pieces=settings.queued_pieces > 0, queued=settings.queued_pieces,
                                   shared_pool=settings.shared_pool)
        #: windows of all sessions decoded together (``batching``), or each on its own
        self.batcher: Any = None
        if batch_windows:
            from .batching.codec_windows import CodecBatcher

            mixed = self.arch == "qwen2_5_omni"  # (Qwen3's windows decode by shape)
            self.batcher = CodecBatcher(self.windows, loaded.stream("codec"), max_rows=batch_rows,
                                        **({"gather_s": 0.006, "burst_s": 0.03} if mixed else {}))
            if mixed:
                self.batcher.mixer = MixedWindows(self, self.batcher.buckets)
        if self.arch == "qwen2_5_omni":
            dit = loaded.config.token2wav_config.dit_config
            self.repeats = int(dit.repeats)
            self.block = max(1, int(dit.block_size) // self.repeats)
            self.lost = 0
            self.mel_dim = int(dit.mel_dim)
            set_dit_dtype(loaded.model.token2wav.code2wav_dit_model, settings.dit_dtype)
            self.max_code = int(dit.num_embeds)
            device = next(loaded.model.token2wav.parameters()).device
            #: a window's graph key is this and its length in codes
            self.key_prefix: tuple = ("token2wav", settings.guidance_scale >= 1e-5, str(device))
        else:
            c2w = loaded.config.code2wav_config
            rates = list(c2w.upsample_rates)
            # each decoder transposed conv (kernel 2r, stride r) trims r samples at its output rate
            self.lost = sum(r * math.prod(rates[i + 1 :]) for i, r in enumerate(rates))
            self.block = 1
            self.max_code = int(c2w.codebook_size) - 1
            self.key_prefix = ("code2wav",)
            self.groups = int(c2w.num_quantizers)

    # rendering ---------------------------------------------------------------------------------

    def rendered_length(self, n_codes: int) -> int:
        return max(0, n_codes * self.samples_per_code - self.lost) if n_codes else 0

    def render(self, codes, start: int = 0, speaker: str | None = None, seed: int | None = None,
               noise=None, steady: bool = False, deadline: float = math.inf, owner: int | None = None) -> np.ndarray:
        """Waveform (float32, 24 kHz) of ``codes`` rendered as one window whose first code has
        index ``start`` in the reply (Qwen2.5 uses it to pick the noise of those mel frames;
        ``noise`` overrides that noise, shape (mel frames, mel bins)).

        ``steady``: a window shape that recurs (a reply's running windows), worth a CUDA graph;
        graphs are captured only while the model loads, and a reply's last window reaches back
        to one of their lengths (:meth:`last_start`). ``deadline``: when
        its listener needs this window's audio (``time.monotonic``; the batched codec decodes the
        windows needed soonest first). ``owner``: the talker slot of the reply whose first window
        this is (the batched codec waits for the first windows of replies that started with it)."""
        return self.begin(codes, start, speaker, seed, noise, steady, deadline, owner).wait()

    def begin(self, codes, start: int = 0, speaker: str | None = None, seed: int | None = None,
              noise=None, steady: bool = False, deadline: float = math.inf,
              owner: int | None = None, reply: Any = None) -> PendingWindow:
        """:meth:`render` in two halves: the window goes to the batched codec now, and
        :meth:`PendingWindow.wait` returns its waveform. A stream sends its next window while
        the one before is still decoding, so the codec's next pass finds it queued instead of
        waiting for every session's thread to come round (``reply``: what names the stream, so
        that a pass takes one window of it). Without the batched codec the window is rendered by
        whoever waits for it."""
        import torch

        if self.batcher is None or is_probing():  # (while warming up: captured one by one)
            return PendingWindow(lambda: self._render(codes, start, speaker, seed, noise, steady, deadline, owner))
        with torch.inference_mode():
            key, fn, inputs = self._inputs(codes, start, speaker, seed, noise)
        request = self.batcher.send(key, fn, inputs, steady, deadline, owner, reply)
        return PendingWindow(batcher=self.batcher, request=request)

    def _render(self, codes, start: int, speaker: str | None, seed: int | None, noise, steady: bool,
                deadline: float, owner: int | None) -> np.ndarray:
        import torch

        with torch.inference_mode():
            return _waveform(self._window(*self._inputs(codes, start, speaker, seed, noise), steady, deadline, owner))

    def _inputs(self, codes, start: int, speaker: str | None, seed: int | None,
                noise) -> tuple[tuple, Callable[..., Any], tuple]:
        """A window of ``codes`` starting at code ``start``: its graph key, function and inputs."""
        if self.arch == "qwen2_5_omni":
            return self._q25_inputs(codes, start, speaker, seed, noise)
        return self._q3_call(self._q3_codes(codes))

    def decode_full(self, codes, speaker: str | None = None, seed: int | None = None) -> np.ndarray:
        """One-shot decode of a whole reply (the reference the chunked stream is compared with)."""
        return self.render(codes, 0, speaker, seed)

    def _q3_codes(self, codes):
        """Qwen3's codes (n, G) or (n,) as the window's input (1, G, n) on the device."""
        import torch

        codes = torch.as_tensor(codes, dtype=torch.long)
        if codes.ndim == 1:
            codes = codes[:, None]
        return to_device(codes.clamp(0, self.max_code).t()[None].contiguous(), self.loaded.device)

    def _q3_call(self, codes) -> tuple[tuple, Callable[..., Any], tuple]:
        """A window of ``codes`` (B, G, n): its graph key, its function and its inputs."""
        c2w = self.loaded.model.code2wav
        return (*self.key_prefix, codes.shape[-1]), lambda c: code2wav(c2w, c), (codes,)

    def running_window(self, sizes: list[int], chunk: int) -> int:
        """Codes in the longest window a reply renders once its chunks are steady (its left
        context full): after chunks of ``sizes`` frames, then of ``chunk``, over as many
        chunks as a block of codes (where a chunk is no whole number of blocks, the windows
        cycle through a few lengths); the arithmetic of :meth:`~.codec_stream.CodecStream._emit`."""
        n = emitted = 0
        hold = max(0, self.settings.lookahead_frames)
        running: list[int] = []
        for size in [*sizes, *[chunk] * 4096]:
            n += size
            target = self.rendered_length(max(0, n - hold))
            if target <= emitted:
                continue
            first = max(0, emitted // self.samples_per_code - max(0, self.settings.left_context_frames))
            first = (first // self.block) * self.block
            emitted = target
            if first > 0:  # the window's start has moved: its left context is full
                running.append(n - first)
                if len(running) > self.block:
                    break
        return max(running, default=n)

    def steady_window(self, rows: int, n: int) -> tuple[tuple, Callable[..., Any], tuple]:
        """``rows`` windows of ``n`` random codes (a reply's running window: its chunk with its
        context): the key, function and inputs the codec decodes (timed at load, see
        ``batching.capacity``)."""
        import torch

        device = self.loaded.device
        with torch.inference_mode():
            if self.arch != "qwen2_5_omni":
                return self._q3_call(torch.randint(0, self.max_code + 1, (rows, self.groups, n), device=device))
            codes = torch.randint(0, self.max_code + 1, (1, n), device=device)
            key, fn, inputs = self._q25_call(codes, self.noise(0, n * self.repeats, 0), None)
            return key, fn, tuple(t.expand(rows, *t.shape[1:]).contiguous() for t in inputs)

    def _window(self, key, fn, inputs: tuple, steady: bool, deadline: float = math.inf, owner: int | None = None):
        if self.batcher is not None:
            if not is_probing():
                return self.batcher.run(key, fn, inputs, steady, deadline, owner)
            if self._group_shapes:
                self.batcher.remember(key, fn, inputs)  # its group graphs are captured at load
        with on_stream(self.loaded.stream("codec")):
            return self.windows.run(key, fn, inputs, capture=steady)

    # a reply's last window -----------------------------------------------------------------------

    def captured_lengths(self) -> list[int]:
        """Window lengths (codes) that replay a captured graph when rendered alone."""
        prefix = self.key_prefix
        return sorted(key[-1] for key in self.windows.captured_keys()
                      if isinstance(key, tuple) and key[:-1] == prefix and isinstance(key[-1], int))

    def capture_last_windows(self, longest: int) -> list[int]:
        """At load (inside :func:`~.graphs.probing`): capture single windows of the lengths a
        reply's last window can take with :meth:`last_start`, up to ``longest`` codes: one per
        block phase (its start must stay block-aligned), without group buckets. Returns the
        lengths captured here."""
        if not self.windows.enabled:
            return []
        have = set(self.captured_lengths())
        wanted = [n for n in range(max(1, longest - self.block + 1), longest + 1) if n not in have]
        shape = (lambda n: (n,)) if self.arch == "qwen2_5_omni" else (lambda n: (n, self.groups))
        import torch

        self._group_shapes = False
        try:
            for n in wanted:
                codes = torch.randint(0, self.max_code, shape(n))
                for _ in range(2):  # a shape is captured on its second use
                    self.render(codes, 0, None, steady=True)
        finally:
            self._group_shapes = True
        self.last_window_lengths = self.captured_lengths()
        return wanted

    def last_start(self, n: int, start: int) -> int:
        """Where a reply's last window (ending at code ``n``) starts: ``start`` reaches back the
        left context; this reaches further back where that makes the window a captured length
        (its start block-aligned), so that it replays a graph instead of running eagerly (an
        eager window costs 4-5 times as much device time). More left context only brings the
        window closer to a one-shot decode of the reply."""
        for length in self.last_window_lengths:
            first = n - length
            if 0 <= first <= start and first % self.block == 0:
                return first
        return start

    def close(self) -> None:
        if self.batcher is not None:
            self.batcher.close()

    def noise(self, first: int, last: int, seed: int):
        """The fixed ODE start noise of mel frames [first, last) (same for every window)."""
        import torch

        parts = []
        b0, b1 = first // _NOISE_BLOCK, (max(first, last - 1)) // _NOISE_BLOCK
        for b in range(b0, b1 + 1):
            gen = torch.Generator().manual_seed((int(seed) * 1_000_003 + b) % (2**63 - 1))
            parts.append(torch.randn((_NOISE_BLOCK, self.mel_dim), generator=gen))
        field = torch.cat(parts, dim=0)
        off = first - b0 * _NOISE_BLOCK
        return field[off : off + (last - first)]

    def _q25_inputs(self, codes, start: int, speaker: str | None, seed: int | None, noise=None):
        """A Qwen2.5 window of ``codes`` starting at code ``start``: key, function and inputs."""
        import torch

        seed = self.settings.seed if seed is None else seed
        t2w = self.loaded.model.token2wav
        device = next(t2w.parameters()).device
        codes = torch.as_tensor(codes, dtype=torch.long).reshape(1, -1)
        bad = (codes < 0) | (codes > self.max_code)
        if bad.any():
            log.debug("omni codec: %d out-of-range codes replaced by 0", int(bad.sum()))
            codes = codes.masked_fill(bad, 0)
        codes = to_device(codes, device)
        frames = codes.shape[1] * self.repeats
        if noise is None:
            noise = self.noise(start * self.repeats, start * self.repeats + frames, seed)
        return self._q25_call(codes, noise, speaker)

    def _q25_call(self, codes, noise, speaker: str | None) -> tuple[tuple, Callable[..., Any], tuple]:
        """A window of ``codes`` (1, n) on the device: its graph key, its function and its inputs."""
        device = next(self.loaded.model.token2wav.parameters()).device
        cfg = self.settings.guidance_scale >= 1e-5
        cond, enc = self._speaker_inputs(speaker, cfg, device)

        def window(codes, noise, cond, enc):
            return self.q25_vocode(self.q25_dit(codes, noise, cond, enc))

        noise = to_device(noise, device).float()[None]
        # the speaker is an input like the codes: one graph per window shape serves every speaker,
        # and windows of different speakers decode in one batch
        return (*self.key_prefix, codes.shape[1]), window, (codes, noise, cond, enc)

    def q25_dit(self, codes, noise, cond, enc, lengths=None):
        """The mel frames (windows, mel, frames) of Qwen2.5 windows (inputs as :meth:`_q25_call`
        makes them, a row per window; ``lengths``: see :func:`~.waveform.dit_sample`)."""
        s = self.settings
        return dit_sample(self.loaded.model.token2wav.code2wav_dit_model, cond, None, codes, noise,
                          num_steps=s.dit_steps, guidance_scale=s.guidance_scale,
                          sway_coefficient=s.sway_coefficient, speaker_encoding=enc, lengths=lengths)

    def q25_vocode(self, mel):
        """The waveforms (windows, samples) of Qwen2.5 mel frames."""
        return vocode(self.loaded.model.token2wav.code2wav_bigvgan_model, mel)

    def _speaker_inputs(self, speaker: str | None, cfg: bool, device) -> tuple[Any, Any]:
        """A Qwen2.5 speaker as window inputs with a batch axis of 1: its x-vector (1, D) and the
        DiT's encoding of its reference mel (1, branches, D'), computed once per speaker."""
        name = speaker if speaker in self.loaded.speakers else self.loaded.default_speaker
        key = (name, cfg, str(device))
        found = self._speaker_cache.get(key)
        if found is None:
            spk = self.loaded.speakers[name]
            cond = spk["cond"].to(device).float().reshape(1, -1)
            enc = encode_speaker(self.loaded.model.token2wav.code2wav_dit_model,
                                 spk["ref_mel"].to(device).float(), cfg)
            found = self._speaker_cache[key] = (cond, enc[None])
        return found


def _waveform(out) -> np.ndarray:
    return out.detach().reshape(-1).float().cpu().numpy()


class PendingWindow:
    """A window on its way through the codec (:meth:`OmniCodec.begin`): a request queued at the
    batched codec, or a render left to whoever waits."""

    def __init__(self, render: Callable[[], np.ndarray] | None = None, *, batcher: Any = None,
                 request: Any = None) -> None:
        self._render = render
        self._batcher = batcher
        self._request = request

    def wait(self) -> np.ndarray:
        if self._request is not None:
            return _waveform(self._batcher.receive(self._request))
        if self._render is None:  # cancelled: nobody hears it
            return np.zeros(0, np.float32)
        return self._render()

    def cancel(self) -> None:
        """Nobody will read it: a window still queued is dropped (one decoding finishes)."""
        if self._request is not None:
            self._batcher.drop(self._request)
        self._render = None
