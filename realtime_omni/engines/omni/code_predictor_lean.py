"""Qwen3-Omni's code predictor frame with fewer kernels: the same weights and arithmetic as
transformers' modules, laid out for a replayed graph.

A frame runs the code predictor 15 times (one step per residual codebook) through its 5 layers:
75 layer steps, each dozens of small kernels through transformers' modules (separate q, k and v
projections, each norm, the rotary embedding rebuilt every forward, the cache's index writes,
separate gate and up projections, the residual adds). At decode sizes a kernel's cost is mostly
its launch and latency, not its work, so a frame costs about its kernel count: about 3 500 of
the roughly 5 000 kernels of a batched talker step were here (docs/benchmarks/omni-capacity.md).

Here a layer step is about 24 operations instead of 45 (a frame of 32 rows: 1835 instead of
3473, counted by ``benchmarks/omni_code_predictor_ops.py``):

- one projection for q, k and v (their weights concatenated once), one for gate and up;
- q and k normalised together (one ``rms_norm``) and rotated with tables built once for the
  frame's 17 fixed positions, their norms' weights and q's attention scaling folded in;
- the cache written at its step's fixed columns (each step of the unrolled frame knows them),
  and attention read over exactly the columns written so far, so a one-token step needs no mask;
- the output and down projections add their residual in the same kernel (``addmm``).

The result equals the modules' up to rounding; the tests compare them on the tiny checkpoint.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from .sampling import sample_top_k_top_p

#: one rearrangement per code predictor (kept on the module itself, so it goes with the model),
#: shared by every bucket's step and every session
_building = threading.Lock()


@dataclass
class _Layer:
    input_norm: Any  # (H,)
    qkv: Any  # (H, (Hq + 2 Hkv) D): for x @ w (a transposed view)
    cos: Any  # (P, Hq + Hkv, D): the rotation's tables for q's and k's heads, their norm
    sin: Any  # weights (and q's the attention's scaling) folded in
    o: Any  # (Hq D, H): a transposed view of the module's weight, as are gate_up and down
    post_norm: Any  # (H,)
    gate_up: Any  # (H, 2 I)
    down: Any  # (I, H)


def supports(cp: Any) -> bool:
    """Whether ``cp`` (the code predictor) reads exactly like the layout above: otherwise its
    frame runs through the modules."""
    config = cp.model.config
    rope = getattr(config, "rope_parameters", None) or {}
    layer = cp.model.layers[0]
    return (not getattr(config, "attention_bias", False) and getattr(config, "hidden_act", "") == "silu"
            and rope.get("rope_type", "default") == "default" and getattr(config, "sliding_window", None) is None
            and hasattr(layer.self_attn, "q_norm") and hasattr(layer.mlp, "gate_proj"))


class LeanFrames:
    """The code predictor's weights rearranged once per model (:meth:`of`); :meth:`step` builds
    a frame's step for a bucket of rows (the interface of :func:`~.code_predictor.frame_step`)."""

    @classmethod
    def of(cls, loaded: Any) -> LeanFrames:
        """The model's one instance (its fused q/k/v and gate/up weights exist once)."""
        cp = loaded.talker.code_predictor
        with _building:
            frames = getattr(cp, "_lean_frames", None)
            if frames is None:
                frames = cls(loaded)
                object.__setattr__(cp, "_lean_frames", frames)  # (not a submodule: no state_dict entry)
            return frames

    def __init__(self, loaded: Any) -> None:
        import torch

        cp = loaded.talker.code_predictor
        config = cp.model.config
        # (its parts, not the module: the module holds this instance)
        self.lm_heads, self.codebooks = cp.lm_head, cp.model.codec_embedding
        self.codec_embedding = loaded.talker.model.codec_embedding
        self.heads = int(config.num_attention_heads)
        self.kv_heads = int(config.num_key_value_heads)
        self.dim = int(getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads)
        self.eps = float(config.rms_norm_eps)
        self.groups = int(loaded.config.talker_config.num_code_groups)
        self.intermediate = int(config.intermediate_size)
        with torch.no_grad():
            self.final_norm = cp.model.norm.weight.detach()
            cos, sin = self._rotary(cp.model.rotary_emb, self.final_norm)
            self.layers = [self._layer(layer, cos, sin) for layer in cp.model.layers[: config.num_hidden_layers]]

    def _layer(self, layer: Any, cos: Any, sin: Any) -> _Layer:
        """One layer's weights rearranged. ``x * cos + roll(x, D/2) * sin`` rotates ``x`` as
        transformers' ``rotate_half`` does (``sin`` signed); with ``x = n * w`` (``n``
        normalised, ``w`` the norm's weight) that is ``n * (w cos) + roll(n) * (roll(w) sin)``,
        so the weights go into the tables, and q's tables take the attention's scaling too."""
        import torch

        attn, mlp = layer.self_attn, layer.mlp
        dtype = self.final_norm.dtype
        qkv = torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight], dim=0)
        weights = torch.cat([attn.q_norm.weight[None].expand(self.heads, -1) * self.dim ** -0.5,
                             attn.k_norm.weight[None].expand(self.kv_heads, -1)], dim=0).float()  # (qk, D)
        rolled = weights.roll(self.dim // 2, dims=-1)
        gate_up = torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight], dim=0)
        # (transposed views: the matmuls read them as they are, as nn.Linear does)
        return _Layer(input_norm=layer.input_layernorm.weight.detach(), qkv=qkv.t(),
                      cos=(cos[:, None, :] * weights).to(dtype).contiguous(),
                      sin=(sin[:, None, :] * rolled).to(dtype).contiguous(),
                      o=attn.o_proj.weight.detach().t(), post_norm=layer.post_attention_layernorm.weight.detach(),
                      gate_up=gate_up.t(), down=mlp.down_proj.weight.detach().t())

    def _rotary(self, rotary: Any, like: Any) -> tuple[Any, Any]:
        """Per position 0..groups, ``cos`` and the signed ``sin`` ``(P, D)`` in float32, from the
        module's own frequencies (``rotary``: its rotary embedding), rounded to the model's dtype
        as transformers rounds them."""
        import torch

        inv_freq = rotary.inv_freq.to(device=like.device, dtype=torch.float32)
        positions = torch.arange(self.groups + 1, dtype=torch.float32, device=like.device)
        emb = torch.cat([positions[:, None] * inv_freq[None, :]] * 2, dim=-1)
        scaling = float(getattr(rotary, "attention_scaling", 1.0))
        cos = (emb.cos() * scaling).to(like.dtype).float()
        sin = (emb.sin() * scaling).to(like.dtype).float()
        half = self.dim // 2
        return cos, torch.cat([-sin[:, :half], sin[:, half:]], dim=-1)

    def step(self, bucket: int, do_sample: bool, spec: Any, inputs: tuple[Any, ...]):
        """A frame's step for ``bucket`` rows: ``inputs`` = (hidden (B, H), c0 (B, 1), noise
        (B, G-1, k)); returns the residual codes (B, G-1) and the frame's summed codebook
        embeddings (B, H)."""
        import torch
        import torch.nn.functional as F

        hidden, c0, noise = inputs
        like = self.final_norm
        heads, kv_heads, dim, groups = self.heads, self.kv_heads, self.dim, self.groups
        qk = heads + kv_heads
        cache = torch.zeros((len(self.layers), 2, bucket, kv_heads, groups + 1, dim), dtype=like.dtype,
                            device=like.device)
        causal = torch.ones((2, 2), dtype=torch.bool, device=like.device).tril()  # step 1's two tokens
        width = int(like.shape[0])

        def attend(x: Any, layer_index: int, layer: _Layer, start: int) -> Any:
            """One layer over ``x`` (B, T, H) at positions ``start`` .. ``start + T - 1``."""
            t = x.shape[1]
            normed = F.rms_norm(x, (width,), layer.input_norm, self.eps)
            proj = (normed.reshape(-1, width) @ layer.qkv).view(bucket, t, qk + kv_heads, dim)
            rot = F.rms_norm(proj[:, :, :qk], (dim,), None, self.eps)  # q and k normalised, then
            cos, sin = layer.cos[start : start + t], layer.sin[start : start + t]  # weighted and rotated
            rot = torch.addcmul(rot * cos, rot.roll(dim // 2, dims=-1), sin)
            keys, values = cache[layer_index, 0], cache[layer_index, 1]  # (B, KV, S, D)
            keys[:, :, start : start + t].copy_(rot[:, :, heads:].transpose(1, 2))
            values[:, :, start : start + t].copy_(proj[:, :, qk:].transpose(1, 2))
            seen = start + t
            # the query heads sharing a key head folded into the query axis: (B, KV, G*T, D)
            q = rot[:, :, :heads].transpose(1, 2).reshape(bucket, kv_heads, (heads // kv_heads) * t, dim)
            scores = q @ keys[:, :, :seen].transpose(-1, -2)  # (q's tables hold the scaling)
            if t > 1:
                grouped = scores.view(bucket, kv_heads, heads // kv_heads, t, seen)
                scores = grouped.masked_fill(~causal[:t, :seen], float("-inf")).view_as(scores)
            probs = torch.softmax(scores, dim=-1)  # (in float32 inside, as the modules' softmax)
            out = (probs @ values[:, :, :seen]).view(bucket, heads, t, dim).transpose(1, 2).reshape(-1, heads * dim)
            residual = x.reshape(-1, width)
            # the residual added by the projection's own kernel: in place past the first layer
            # (the first one's input is a codebook embedding the frame still sums)
            x = torch.addmm(residual, out, layer.o) if layer_index == 0 else residual.addmm_(out, layer.o)
            normed = F.rms_norm(x, (width,), layer.post_norm, self.eps)
            gate, up = (normed @ layer.gate_up).split(self.intermediate, dim=-1)
            return x.addmm_(F.silu(gate) * up, layer.down).view(bucket, t, width)

        def step():
            first = self.codec_embedding(c0)  # (B, 1, H)
            embeds = [first]
            x = torch.cat([hidden[:, None, :].to(first.dtype), first], dim=1)
            start, codes = 0, []
            for j in range(1, groups):
                for index, layer in enumerate(self.layers):
                    x = attend(x, index, layer, start)
                last = F.rms_norm(x[:, -1, :], (width,), self.final_norm, self.eps)
                logits = self.lm_heads[j - 1](last).float()
                if do_sample:
                    code = sample_top_k_top_p(logits, noise[:, j - 1], spec.temperature, spec.top_k, 0.8)
                else:
                    code = torch.argmax(logits, dim=-1, keepdim=True)
                codes.append(code)
                start += x.shape[1]
                x = self.codebooks[j - 1](code)
                embeds.append(x)
            return torch.cat(codes, dim=1), torch.cat(embeds, dim=1).sum(dim=1)

        return step
