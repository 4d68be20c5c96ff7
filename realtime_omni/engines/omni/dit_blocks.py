"""Qwen2.5-Omni's DiT transformer blocks as a codec window evaluates them 36 times.

transformers' ``DiTDecoderLayer`` rebuilds, in every layer of every evaluation, a boolean
attention mask of shape (rows, heads, frames, frames) from the blocks' index differences (three
elementwise passes over it, and SDPA converts it to an additive mask again), and computes the
rotary embedding of every row in every evaluation. Both depend only on the window's length: here
they are made once per window (:class:`DiTWindow`), one additive mask per distinct look-back /
look-ahead pair, broadcast over rows and heads. The blocks' modulations, gates and residuals are
fused multiply-adds (one pass over the activations each instead of two), and on the GPU each
norm with its modulation (and the gated residual before it) is one kernel (:mod:`.dit_kernels`).

The weights are transformers' own modules, read here; the arithmetic is the same up to rounding
(a fused multiply-add rounds once where the layer rounds twice).
"""

from __future__ import annotations

from typing import Any

from .dit_kernels import gate_norm_modulate, norm_modulate


class DiTWindow:
    """What every evaluation of one window shares: the rotary cos/sin and each layer's mask.

    ``lengths`` (rows,): windows of different lengths in one batch, each padded at its end to
    ``frames`` (mel frames). A row's frames keep the positions and blocks they have alone (both
    count from the window's start), and its frames attend to none of its padding, so they come
    out as they do alone (attention is the DiT's only mixing along time). A padding frame still
    attends within its blocks (to itself at least: no row of its mask is all -inf, which would
    fill it with NaN, and NaN times a zero weight is NaN in every frame)."""

    def __init__(self, dit, frames: int, device, dtype, lengths=None) -> None:
        import torch

        positions = torch.arange(frames, device=device)[None]
        probe = torch.empty((1, frames, 1), device=device, dtype=dtype)
        cos, sin = dit.rotary_embed(probe, positions)  # (1, frames, head_dim)
        self.rope = (cos[:, None], sin[:, None])
        index = torch.arange(frames, device=device)
        block = index // dit.block_size
        diff = block[None, :] - block[:, None]  # key block - query block
        padding = None
        if lengths is not None:  # (rows, query, key): a real frame's query on a padding key
            lengths = lengths.to(device)[:, None]
            padding = ((index[None, :] >= lengths)[:, None, :] & (index[None, :] < lengths)[:, :, None])
        masks: dict[tuple[int, int], Any] = {}
        self.masks = []
        for layer in dit.transformer_blocks:
            reach = (int(layer.look_backward_block), int(layer.look_ahead_block))
            if reach not in masks:
                blocked = ~((diff >= -reach[0]) & (diff <= reach[1]))[None]  # (1 or rows, query, key)
                if padding is not None:
                    blocked = blocked | padding
                mask = torch.zeros(blocked.shape, device=device, dtype=dtype).masked_fill_(blocked, float("-inf"))
                masks[reach] = mask[:, None]
            self.masks.append(masks[reach])


def run_blocks(dit, hidden, time_embedding, window: DiTWindow, fused: bool = True):
    """Every transformer block of ``dit`` over ``hidden`` (rows, frames, hidden); ``fused``: the
    norms through :mod:`.dit_kernels` on the GPU (else PyTorch's operations)."""
    for layer, mask in zip(dit.transformer_blocks, window.masks):
        hidden = _block(layer, hidden, time_embedding, window.rope, mask, fused)
    return hidden


def _block(layer, hidden, time_embedding, rope, mask, fused: bool):
    import torch
    import torch.nn.functional as F

    modulation = layer.attn_norm
    emb = modulation.linear(F.silu(time_embedding))[:, None]
    shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = emb.chunk(6, dim=-1)
    normed = norm_modulate(modulation.norm, hidden, shift_msa, scale_msa, fused)
    attention = _attention(layer.attn, normed, rope, mask)
    hidden, normed = gate_norm_modulate(layer.ff_norm, hidden, attention, gate_msa, shift_mlp, scale_mlp, fused)
    ff = layer.ff.ff  # Linear, GELU, Dropout (off in eval), Linear
    return torch.addcmul(hidden, gate_mlp, ff[3](ff[1](ff[0](normed))))


def _attention(attn, x, rope, mask):
    import torch.nn.functional as F

    rows, frames, _ = x.shape
    heads = attn.heads
    head_dim = attn.inner_dim // heads

    def split(proj):
        return proj(x).view(rows, frames, heads, head_dim).transpose(1, 2)

    query, key, value = split(attn.to_q), split(attn.to_k), split(attn.to_v)
    # the checkpoint rotates only the first head, with its dimensions interleaved
    cos, sin = rope
    query[:, :1] = _rotate(query[:, :1], cos, sin)
    key[:, :1] = _rotate(key[:, :1], cos, sin)
    out = F.scaled_dot_product_attention(query, key, value, attn_mask=mask)
    return attn.to_out[0](out.transpose(1, 2).reshape(rows, frames, heads * head_dim))


def _rotate(x, cos, sin):
    import torch

    x = torch.cat((x[..., 0::2], x[..., 1::2]), dim=-1)
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin
