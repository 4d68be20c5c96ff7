"""The DiT block's layer norms with their modulation as one Triton kernel on the GPU.

Each of Qwen2.5's DiT blocks normalises its activations twice, and each time scales and shifts
them by the time step's modulation (``norm * (1 + scale) + shift``); before the second, it adds the
attention's output through a gate. In PyTorch that is a layer norm and a multiply-add per norm
plus the gated residual: five passes over the activations, the multiply-adds on a slow broadcast
path (about 150 of the 500 ms a batch of 32 windows spends in the DiT on an H100,
docs/benchmarks/omni-qwen25-codec-kernels.md). Here each norm, with its gated residual where
there is one, is one pass: a program per frame row reads it once and writes the results once.

Without CUDA or Triton, or for other shapes, the PyTorch operations run.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

log = logging.getLogger(__name__)

#: set once the kernel failed in this process
_disabled: list[bool] = []


@functools.cache
def _kernels() -> Any:
    """Triton and the kernel, compiled on first use (None where Triton is missing)."""
    try:
        import triton
        import triton.language as tl
    except ImportError:
        return None

    @triton.jit(do_not_specialize=["frames", "mod_stride"])
    def norm_modulate(h_ptr, x_ptr, gate_ptr, shift_ptr, scale_ptr, h_out_ptr, out_ptr, frames, mod_stride, eps,
                      WIDTH: tl.constexpr, BLOCK: tl.constexpr, GATED: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)  # one frame of one batch row
        batch = row // frames
        cols = tl.arange(0, BLOCK)
        inside = cols < WIDTH
        h = tl.load(h_ptr + row * WIDTH + cols, mask=inside, other=0.0).to(tl.float32)
        if GATED:  # the residual through its gate, rounded as it is stored
            x = tl.load(x_ptr + row * WIDTH + cols, mask=inside, other=0.0).to(tl.float32)
            gate = tl.load(gate_ptr + batch * mod_stride + cols, mask=inside, other=0.0).to(tl.float32)
            stored = (h + gate * x).to(h_out_ptr.dtype.element_ty)
            tl.store(h_out_ptr + row * WIDTH + cols, stored, mask=inside)
            h = stored.to(tl.float32)
        mean = tl.sum(h, axis=0) / WIDTH
        centred = tl.where(inside, h - mean, 0.0)
        variance = tl.sum(centred * centred, axis=0) / WIDTH
        normed = centred * (1.0 / tl.sqrt(variance + eps))
        scale = tl.load(scale_ptr + batch * mod_stride + cols, mask=inside, other=0.0).to(tl.float32)
        shift = tl.load(shift_ptr + batch * mod_stride + cols, mask=inside, other=0.0).to(tl.float32)
        tl.store(out_ptr + row * WIDTH + cols, normed * (1.0 + scale) + shift, mask=inside)

    return triton, norm_modulate


def _on_device(hidden) -> bool:
    return bool(hidden.is_cuda) and not _disabled


def fits(hidden, *modulation) -> bool:
    """Whether the kernel computes this norm: contiguous (rows, frames, width) activations on
    the GPU and (rows, 1, width) modulations with unit stride along the width."""
    return (_on_device(hidden) and hidden.ndim == 3 and hidden.is_contiguous()
            and all(m.shape == (hidden.shape[0], 1, hidden.shape[2]) and m.stride(2) == 1
                    and m.stride(0) == modulation[0].stride(0) for m in modulation)
            and _kernels() is not None)


def norm_modulate(norm, hidden, shift, scale, fused: bool = True):
    """``norm(hidden) * (1 + scale) + shift`` (``norm``: a LayerNorm without affine weights);
    ``fused``: by the kernel where it :func:`fits`."""
    import torch

    if fused and fits(hidden, shift, scale):
        try:
            out = torch.empty_like(hidden)
            _launch(hidden, hidden, shift, shift, scale, hidden, out, norm.eps, gated=False)
            return out
        except Exception:  # noqa: BLE001 - a compiler or driver error: PyTorch still works
            _give_up()
    return torch.addcmul(shift, norm(hidden), 1 + scale)


def gate_norm_modulate(norm, hidden, x, gate, shift, scale, fused: bool = True):
    """``hidden + gate * x`` and ``norm`` of it modulated by ``shift`` and ``scale``."""
    import torch

    if fused and fits(hidden, gate, shift, scale) and x.shape == hidden.shape and x.is_contiguous():
        try:
            summed, out = torch.empty_like(hidden), torch.empty_like(hidden)
            _launch(hidden, x, gate, shift, scale, summed, out, norm.eps, gated=True)
            return summed, out
        except Exception:  # noqa: BLE001 - a compiler or driver error: PyTorch still works
            _give_up()
    summed = torch.addcmul(hidden, gate, x)
    return summed, torch.addcmul(shift, norm(summed), 1 + scale)


def _launch(hidden, x, gate, shift, scale, h_out, out, eps: float, gated: bool) -> None:
    _, kernel = _kernels()
    rows, frames, width = hidden.shape
    block = 1 << (width - 1).bit_length()
    kernel[(rows * frames,)](hidden, x, gate, shift, scale, h_out, out, frames, shift.stride(0), float(eps),
                             WIDTH=width, BLOCK=block, GATED=gated, num_warps=4 if block <= 1024 else 8)


def _give_up() -> None:
    log.exception("omni DiT: the fused norm kernel failed; PyTorch's operations run instead")
    _kernels.cache_clear()
    _disabled.append(True)
