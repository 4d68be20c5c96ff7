"""Qwen2.5-Omni's BigVGAN residual blocks with their anti-aliased activations in other forms.

Each of the vocoder's 109 anti-aliased activations upsamples its input by 2 (a transposed
convolution with one fixed 12-tap filter), applies SnakeBeta and downsamples by 2 (a 12-tap
convolution). transformers runs both filters as grouped convolutions, one group per channel; on
the GPU, cuDNN runs the grouped transposed one with a slow direct kernel. The filters are the same
for every channel, so the channels can be folded into the batch (``flat``: one channel, no
groups), and the upsampling can be split into its even and odd outputs, two 6-tap filters of an
ordinary convolution, interleaved (``polyphase``). All forms compute the same waveform up to
rounding (tests/engines/test_omni_vocoder_blocks.py); ``grouped`` is transformers' modules.
"""

from __future__ import annotations

FORMS = ("grouped", "flat", "polyphase")


def amp_block(block, hidden, form: str):
    """``Qwen2_5OmniAMPBlock.forward`` with its activations in ``form``."""
    activations = block.activations
    for conv1, conv2, act1, act2 in zip(block.convs1, block.convs2, activations[::2], activations[1::2]):
        hidden = hidden + conv2(anti_aliased(act2, conv1(anti_aliased(act1, hidden, form)), form))
    return hidden


def anti_aliased(activation, hidden, form: str):
    """``Qwen2_5OmniAntiAliasedActivation1d.forward`` in ``form``."""
    import torch.nn.functional as F

    if form == "grouped":
        return activation(hidden)
    up, down = activation.upsample, activation.downsample
    rows, channels, n = hidden.shape
    flat = F.pad(hidden.reshape(rows * channels, 1, n), (up.pad, up.pad), mode="replicate")
    if form == "flat":
        wide = F.conv_transpose1d(flat, up.filter.reshape(1, 1, -1), stride=up.stride)
        wide = wide[..., up.pad_left : -up.pad_right]
    elif form == "polyphase":
        wide = _polyphase_upsample(flat, up)
    else:
        raise ValueError(f"unknown activation form {form!r} (one of {', '.join(FORMS)})")
    wide = activation.act((up.ratio * wide).reshape(rows, channels, -1))
    flat = F.pad(wide.reshape(rows * channels, 1, -1), (down.pad_left, down.pad_right), mode="replicate")
    return F.conv1d(flat, down.filter.reshape(1, 1, -1), stride=down.stride).reshape(rows, channels, -1)


def _polyphase_upsample(padded, up):
    """The transposed convolution of ``padded`` (rows, 1, L) with ``up.filter`` at stride 2,
    cropped as ``Qwen2_5OmniUpSample1d`` crops it, without the ratio's gain.

    Output sample 2m + p of the transposed convolution is the sum over q of input m - q times
    filter tap 2q + p: for each phase p an ordinary convolution with the phase's taps reversed."""
    import torch
    import torch.nn.functional as F

    taps = up.filter.reshape(-1)
    if up.stride != 2 or taps.numel() % 2:
        raise ValueError("the polyphase form needs an even filter at stride 2")
    half = taps.numel() // 2
    phases = torch.stack([taps[0::2].flip(0), taps[1::2].flip(0)])[:, None]  # (2, 1, half)
    length = padded.shape[-1]
    out = F.conv1d(padded, phases)  # (rows, 2, length - half + 1): sample 2(m + half - 1) + p
    interleaved = out.transpose(1, 2).reshape(padded.shape[0], 1, -1)
    # the transposed convolution's sample i is interleaved sample i - 2 (half - 1)
    shift = 2 * (half - 1)
    full = 2 * (length - 1) + taps.numel()
    return interleaved[..., up.pad_left - shift : full - up.pad_right - shift]
