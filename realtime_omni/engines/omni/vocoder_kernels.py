"""Qwen2.5-Omni's BigVGAN activations as two Triton kernels on the GPU.

Each of the vocoder's 109 anti-aliased activations upsamples its input by 2 (a 12-tap transposed
convolution, the same filter for every channel), applies SnakeBeta and downsamples by 2 (a 12-tap
convolution), each end padded by repeating its edge sample. transformers runs it as six passes
over the activations, and cuDNN runs the depthwise transposed convolution with a slow direct
kernel: about 230 of the 381 ms a batch of 32 windows spends in the vocoder on an H100
(docs/benchmarks/omni-qwen25-codec-kernels.md). Here the upsampling and SnakeBeta are one kernel
and the downsampling another; the residual blocks around them stay transformers' modules.

Without CUDA or Triton, or for filters of another shape, :func:`activation` runs the module.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

log = logging.getLogger(__name__)


@functools.cache
def _kernels() -> Any:
    """The two kernels, compiled on first use (None where Triton is missing)."""
    try:
        import triton
        import triton.language as tl
    except ImportError:
        return None

    # T and C vary with the window and stage: not specialised, so that a new window length
    # never compiles (a CUDA graph cannot hold a compilation)
    @triton.jit(do_not_specialize=["channels", "length"])
    def up_snake(x_ptr, out_ptr, taps_ptr, alpha_ptr, beta_ptr, eps, channels, length, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        t = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)  # upsampled positions, [0, 2 length)
        inside = t < 2 * length
        # transposed convolution at stride 2, cropped as transformers crops it: output t sums
        # six inputs from (t + 5) // 2 - 5 on, with taps 11, 9, ... (t even) or 10, 8, ... (t odd)
        first = (t + 5) // 2 - 5
        top = 11 - (t & 1)
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        base = x_ptr + row.to(tl.int64) * length
        for q in tl.static_range(6):
            src = tl.minimum(tl.maximum(first + q, 0), length - 1)  # the edge repeated
            acc += tl.load(taps_ptr + top - 2 * q) * tl.load(base + src, mask=inside, other=0.0)
        y = 2.0 * acc  # the upsampling ratio's gain
        # SnakeBeta with its log-scale parameters, one channel per program
        channel = row % channels
        alpha = tl.exp(tl.load(alpha_ptr + channel).to(tl.float32))
        inv_beta = 1.0 / (tl.exp(tl.load(beta_ptr + channel).to(tl.float32)) + eps)
        s = tl.sin(y * alpha)
        out = y + inv_beta * (s * s)
        tl.store(out_ptr + row.to(tl.int64) * 2 * length + t, out, mask=inside)

    @triton.jit(do_not_specialize=["length"])
    def down(x_ptr, out_ptr, taps_ptr, length, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        n = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        inside = n < length
        base = x_ptr + row.to(tl.int64) * 2 * length
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        for k in tl.static_range(12):
            src = tl.minimum(tl.maximum(2 * n + k - 5, 0), 2 * length - 1)  # padded 5 left, 6 right
            acc += tl.load(taps_ptr + k) * tl.load(base + src, mask=inside, other=0.0)
        tl.store(out_ptr + row.to(tl.int64) * length + n, acc, mask=inside)

    return triton, up_snake, down


#: set once the kernels failed in this process
_disabled: list[bool] = []


def _on_device(hidden) -> bool:
    return bool(hidden.is_cuda) and not _disabled


def fits(activation, hidden) -> bool:
    """Whether the kernels compute this activation: CUDA float32, the filters of the release."""
    import torch

    up, down = activation.upsample, activation.downsample
    return (_on_device(hidden) and hidden.dtype == torch.float32 and hidden.ndim == 3
            and all(t.dtype == torch.float32 and t.is_contiguous()
                    for t in (up.filter, down.filter, activation.act.alpha, activation.act.beta))
            and up.ratio == 2 and up.stride == 2 and up.filter.numel() == 12 and up.pad == 5
            and up.pad_left == 15 and down.stride == 2 and down.filter.numel() == 12
            and down.pad_left == 5 and down.pad_right == 6 and _kernels() is not None)


def activation(act, hidden):
    """``Qwen2_5OmniAntiAliasedActivation1d.forward(hidden)``, fused where :func:`fits`. A kernel
    that fails (first met while the model warms up, before any graph is captured) is logged and
    the modules run from then on."""
    if not fits(act, hidden):
        return act(hidden)
    try:
        return run(act, hidden)
    except Exception:  # noqa: BLE001 - a compiler or driver error: the modules still work
        _give_up()
        return act(hidden)


def run(act, hidden, block: int = 1024):
    """The two kernels over ``hidden`` (rows, channels, length); no check that they fit."""
    import torch

    triton, up_snake, down = _kernels()
    hidden = hidden.contiguous()
    rows, channels, length = hidden.shape
    snake = act.act
    wide = torch.empty((rows, channels, 2 * length), device=hidden.device, dtype=torch.float32)
    # the filters and SnakeBeta's parameters as the module holds them (contiguous float32)
    up_snake[(rows * channels, triton.cdiv(2 * length, block))](
        hidden, wide, act.upsample.filter, snake.alpha, snake.beta, float(snake.no_div_by_zero), channels, length,
        BLOCK=block)
    out = torch.empty_like(hidden)
    down[(rows * channels, triton.cdiv(length, block))](wide, out, act.downsample.filter, length, BLOCK=block)
    return out


def _give_up() -> None:
    log.exception("omni vocoder: the fused activation kernels failed; transformers' modules run instead")
    _kernels.cache_clear()
    _disabled.append(True)


def amp_block(block, hidden, fused: bool = True):
    """``Qwen2_5OmniAMPBlock.forward`` with its activations through :func:`activation`."""
    acts = block.activations
    run_act = activation if fused else (lambda act, x: act(x))
    for conv1, conv2, act1, act2 in zip(block.convs1, block.convs2, acts[::2], acts[1::2]):
        hidden = hidden + conv2(run_act(act2, conv1(run_act(act1, hidden))))
    return hidden
