"""Fewer kernels per step on CUDA: transformers' RMSNorm through torch's fused ``rms_norm``.

A batched decode step replays a CUDA graph, yet it still runs every kernel of the step one after
another, and at decode sizes each kernel is tiny: the step costs about the number of its kernels.
transformers' RMSNorm is eight of them (cast up, square, mean, add, rsqrt, multiply, cast down,
scale); a Qwen3-Omni thinker layer has four norms, the talker and each of a frame's fifteen
code-predictor steps as many per layer. ``torch.nn.functional.rms_norm`` computes the same thing
(in float32 inside) in one kernel on CUDA.
"""

from __future__ import annotations

import functools
import inspect
import types
from typing import Any


def fuse_rms_norms(model: Any) -> int:
    """Route every transformers RMSNorm in ``model`` through ``F.rms_norm``; returns how many."""
    count = 0
    for module in model.modules():
        if _is_plain_rms_norm(type(module)) and not hasattr(module, "_unfused_forward"):
            module._unfused_forward = module.forward
            module.forward = types.MethodType(_fused_forward, module)
            count += 1
    return count


@functools.cache
def _is_plain_rms_norm(cls: type) -> bool:
    """The usual RMSNorm of transformers (``weight * normed.to(input_dtype)``, no ``1 + weight``
    or other variant): only what reads exactly like it is replaced."""
    if "RMSNorm" not in cls.__name__:
        return False
    try:
        source = inspect.getsource(cls.forward)
    except (OSError, TypeError):
        return False
    return "variance_epsilon" in source and "self.weight * hidden_states.to(input_dtype)" in source


def _fused_forward(self: Any, hidden_states: Any) -> Any:
    import torch.nn.functional as F

    if hidden_states.dtype != self.weight.dtype:  # mixed precision: keep the original's promotion
        return self._unfused_forward(hidden_states)
    return F.rms_norm(hidden_states, (hidden_states.shape[-1],), self.weight, self.variance_epsilon)
