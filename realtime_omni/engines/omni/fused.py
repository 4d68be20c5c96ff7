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


# -- attention over a short cache ------------------------------------------------------------------

#: the name the code predictor's attention is registered under with transformers
SHORT_ATTENTION = "omni_short"


def short_attention(module: Any, query: Any, key: Any, value: Any, attention_mask: Any,
                    scaling: float | None = None, dropout: float = 0.0, **_kwargs: Any) -> tuple[Any, None]:
    """Attention as three plain kernels (two batched matmuls and a softmax), for caches of a few
    tokens.

    Qwen3-Omni's code predictor attends over at most 17 tokens, 75 times per frame; SDPA's fused
    kernels carry a fixed cost (about 55 µs each on the H200) far above that work. The query
    heads that share a key/value head are folded into the query axis, so each K/V head is read
    once (no ``repeat_kv`` copy). ``attention_mask``: None, boolean (True attends) or additive,
    broadcastable to ``(batch, 1, q_len, kv_len)``; the result is ``(batch, q_len, heads, dim)``.
    """
    import torch

    batch, heads, q_len, dim = query.shape
    kv_heads, kv_len = key.shape[1], key.shape[2]
    group = heads // kv_heads
    scale = scaling if scaling is not None else dim ** -0.5
    q = query.reshape(batch, kv_heads, group * q_len, dim)
    scores = torch.matmul(q, key.transpose(-1, -2)).float() * scale  # (B, KV, G*T, S)
    if attention_mask is None and q_len > 1:  # SDPA's ``is_causal`` (aligned top-left, as torch does)
        causal = torch.ones((q_len, kv_len), dtype=torch.bool, device=query.device).tril()
        attention_mask = causal[None, None]
    if attention_mask is not None:
        mask = attention_mask[..., :kv_len].reshape(attention_mask.shape[0], 1, 1, -1, kv_len)
        scores = scores.view(batch, kv_heads, group, q_len, kv_len)
        if mask.dtype == torch.bool:
            scores = scores.masked_fill(~mask, float("-inf"))
        else:
            scores = scores + mask.float()
        scores = scores.view(batch, kv_heads, group * q_len, kv_len)
    probs = torch.softmax(scores, dim=-1).to(value.dtype)
    out = torch.matmul(probs, value).view(batch, heads, q_len, dim)
    return out.transpose(1, 2).contiguous(), None


def use_short_attention(config: Any) -> None:
    """Run the attention of the modules built from ``config`` through :func:`short_attention`
    (read at each forward, so it applies to a loaded model before its graphs are captured)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    AttentionInterface.register(SHORT_ATTENTION, short_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(SHORT_ATTENTION, sdpa_mask)
    config._attn_implementation = SHORT_ATTENTION
