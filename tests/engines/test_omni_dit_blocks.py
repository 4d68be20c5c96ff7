"""The codec's own DiT block loop (``dit_blocks``) against transformers' ``DiTDecoderLayer``s.

A tiny random DiT with a look-back and a look-ahead layer (the real model has both) over windows
that end mid-block: the per-window masks and rotary tables must give what each layer computes
from its own block differences, in float32 and in bfloat16.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from realtime_omni.engines.omni.dit_blocks import DiTWindow, run_blocks  # noqa: E402


def tiny_dit(seed: int = 0):
    from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import Qwen2_5OmniToken2WavDiTModel

    config = transformers.Qwen2_5OmniDiTConfig(
        hidden_size=64, num_hidden_layers=4, num_attention_heads=4, head_dim=16, ff_mult=2, emb_dim=16,
        block_size=6, look_ahead_layers=[2], look_backward_layers=[0, 3], repeats=2, num_embeds=64,
        mel_dim=16, enc_emb_dim=16, enc_dim=16, enc_channels=[32, 32, 32, 32, 96],
        enc_attention_channels=16, enc_se_channels=16)
    torch.manual_seed(seed)
    dit = Qwen2_5OmniToken2WavDiTModel._from_config(config).eval()
    with torch.no_grad():
        for p in dit.parameters():  # away from the zero-initialised gates: every path counts
            p.normal_(0.0, 0.2)
    return dit


def reference_blocks(dit, hidden, time_embedding):
    positions = torch.arange(hidden.shape[1])[None].repeat(hidden.shape[0], 1)
    rope = dit.rotary_embed(hidden, positions)
    block_diff = dit._create_block_diff(hidden)
    for layer in dit.transformer_blocks:
        hidden = layer(hidden, time_embedding, position_embeddings=rope, block_diff=block_diff)
    return hidden


@pytest.mark.parametrize("frames", [6, 17, 30])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_block_loop_computes_what_transformers_layers_do(frames, dtype):
    dit = tiny_dit().to(getattr(torch, dtype))
    gen = torch.Generator().manual_seed(frames)
    hidden = torch.randn((3, frames, 64), generator=gen).to(dit.proj_out.weight.dtype)
    time_embedding = torch.randn((3, 64), generator=gen).to(hidden.dtype)
    with torch.inference_mode():
        want = reference_blocks(dit, hidden, time_embedding).float()
        got = run_blocks(dit, hidden, time_embedding, DiTWindow(dit, frames, "cpu", hidden.dtype)).float()
    scale = float(want.abs().max())
    tolerance = 1e-5 if dtype == "float32" else 3e-2
    assert scale > 0 and float((got - want).abs().max()) <= tolerance * scale


def test_each_layer_gets_the_mask_of_its_own_reach():
    dit = tiny_dit()
    window = DiTWindow(dit, 18, "cpu", torch.float32)  # three blocks of 6 frames
    allowed = [torch.isfinite(mask[0, 0]) for mask in window.masks]
    block = torch.arange(18) // 6
    same = block[:, None] == block[None, :]
    back = same | (block[None, :] == block[:, None] - 1)
    ahead = same | (block[None, :] == block[:, None] + 1)
    assert [a.tolist() for a in allowed] == [back.tolist(), same.tolist(), ahead.tolist(), back.tolist()]
    assert window.masks[0] is window.masks[3]  # one mask per distinct reach


def test_windows_of_different_lengths_padded_into_one_batch_come_out_as_alone():
    """Rows padded at their ends (to 30 frames) with their own lengths: each row's frames equal
    the row run alone at its length, and garbage in the padding (even huge values) changes
    nothing, nor turns a padding frame into NaN."""
    dit = tiny_dit()
    gen = torch.Generator().manual_seed(1)
    lengths = [30, 11, 17]
    rows = [torch.randn((1, n, 64), generator=gen) for n in lengths]
    time_embedding = torch.randn((3, 64), generator=gen)
    padded = torch.full((3, 30, 64), 1e4)
    for i, row in enumerate(rows):
        padded[i, : lengths[i]] = row[0]
    with torch.inference_mode():
        window = DiTWindow(dit, 30, "cpu", torch.float32, torch.tensor(lengths))
        got = run_blocks(dit, padded, time_embedding, window)
        assert torch.isfinite(got).all()
        for i, n in enumerate(lengths):
            alone = run_blocks(dit, rows[i], time_embedding[i : i + 1], DiTWindow(dit, n, "cpu", torch.float32))
            scale = float(alone.abs().max())
            assert float((got[i, :n] - alone[0]).abs().max()) <= 1e-5 * scale
    # without the lengths the padding is attended to: the rows differ (the test can fail)
    with torch.inference_mode():
        unmasked = run_blocks(dit, padded, time_embedding, DiTWindow(dit, 30, "cpu", torch.float32))
    assert float((unmasked[1, :11] - got[1, :11]).abs().max()) > 1e-3
