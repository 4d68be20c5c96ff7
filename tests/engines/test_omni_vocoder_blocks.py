"""The vocoder's anti-aliased activations in each form against transformers' grouped modules."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from realtime_omni.engines.omni.vocoder_blocks import FORMS, amp_block, anti_aliased  # noqa: E402
from realtime_omni.engines.omni.waveform import vocode  # noqa: E402


def tiny_vocoder():
    from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import Qwen2_5OmniToken2WavBigVGANModel

    config = transformers.Qwen2_5OmniBigVGANConfig(
        mel_dim=16, upsample_initial_channel=32, upsample_rates=[5, 3, 2], upsample_kernel_sizes=[11, 7, 4],
        resblock_kernel_sizes=[3, 7], resblock_dilation_sizes=[[1, 3, 5], [1, 3, 5]])
    torch.manual_seed(0)
    vocoder = Qwen2_5OmniToken2WavBigVGANModel._from_config(config).eval()
    with torch.no_grad():
        for p in vocoder.parameters():  # SnakeBeta's alpha and beta start at zero: make them count
            p.normal_(0.0, 0.3)
    return vocoder


@pytest.mark.parametrize("form", [f for f in FORMS if f != "grouped"])
@pytest.mark.parametrize("length", [1, 7, 40])
def test_each_form_of_the_activation_computes_what_the_grouped_one_does(form, length):
    vocoder = tiny_vocoder()
    activation = vocoder.resblocks[0].activations[0]
    x = torch.randn((3, 16, length), generator=torch.Generator().manual_seed(length))
    with torch.inference_mode():
        want = activation(x)
        got = anti_aliased(activation, x, form)
        block_want = vocoder.resblocks[1](x)
        block_got = amp_block(vocoder.resblocks[1], x, form)
    assert got.shape == want.shape == (3, 16, length)
    assert float((got - want).abs().max()) <= 1e-5 * float(want.abs().max())
    assert float((block_got - block_want).abs().max()) <= 1e-5 * float(block_want.abs().max())


@pytest.mark.parametrize("form", FORMS)
def test_the_whole_vocoder_gives_the_same_waveform_in_every_form(form):
    vocoder = tiny_vocoder()
    mel = torch.randn((2, 16, 12), generator=torch.Generator().manual_seed(3)) - 4
    with torch.inference_mode():
        want = vocoder(mel).reshape(2, -1)  # transformers' forward (on the CPU already)
        got = vocode(vocoder, mel, form)
    assert got.shape == want.shape and float(want.abs().max()) > 0
    assert float((got - want).abs().max()) <= 1e-5 * float(want.abs().max())


def test_an_unknown_form_is_refused():
    vocoder = tiny_vocoder()
    with pytest.raises(ValueError, match="unknown activation form"):
        anti_aliased(vocoder.activation_post, torch.zeros((1, 8, 4)), "fft")
