"""The vocoder's fused activation kernels (Triton) against transformers' modules.

On a GPU the kernels run compiled. Elsewhere Triton's interpreter runs the same kernels on the
CPU, where Triton is installed (it comes with torch's CUDA wheels, not with the CPU ones).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from realtime_omni.engines.omni import vocoder_kernels  # noqa: E402
from realtime_omni.engines.omni.waveform import vocode  # noqa: E402

from .triton_kernels import DEVICE, failing_kernels, kernels_of  # noqa: E402


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
    return vocoder.to(DEVICE)


@pytest.fixture
def kernels(monkeypatch):
    yield from kernels_of(vocoder_kernels, monkeypatch)


@pytest.mark.parametrize("length", [1, 2, 7, 40, 300])
def test_the_kernels_compute_the_anti_aliased_activation(kernels, length):
    activation = tiny_vocoder().resblocks[1].activations[3]
    x = torch.randn((2, 16, length), generator=torch.Generator().manual_seed(length)).to(DEVICE)
    with torch.inference_mode():
        want = activation(x)
        got = kernels.run(activation, x, block=64)
    assert got.shape == want.shape == (2, 16, length)
    assert float((got - want).abs().max()) <= 1e-5 * float(want.abs().max())


def test_the_vocoder_with_fused_activations_gives_the_modules_waveform(kernels):
    vocoder = tiny_vocoder()
    mel = (torch.randn((2, 16, 12), generator=torch.Generator().manual_seed(3)) - 4).to(DEVICE)
    with torch.inference_mode():
        want = vocoder(mel).reshape(2, -1).to(DEVICE)  # transformers' forward
        got = vocode(vocoder, mel)
        post = vocoder.activation_post
        kernels_used = vocoder_kernels.fits(post, torch.zeros((1, post.act.in_features, 4), device=DEVICE))
    assert kernels_used
    assert got.shape == want.shape and float(want.abs().max()) > 0
    assert float((got - want).abs().max()) <= 1e-5 * float(want.abs().max())


def test_other_filters_or_precisions_are_not_for_the_kernels(kernels):
    from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import (
        Qwen2_5OmniAntiAliasedActivation1d, Qwen2_5OmniSnakeBeta)

    release = tiny_vocoder().activation_post
    channels = release.act.in_features
    x = torch.zeros((1, channels, 4), device=DEVICE)
    other = Qwen2_5OmniAntiAliasedActivation1d(Qwen2_5OmniSnakeBeta(channels), up_kernel_size=6).to(DEVICE)
    assert kernels.fits(release, x)
    assert not kernels.fits(other, x)
    assert not kernels.fits(release, x.double())


def test_on_the_cpu_the_modules_run():
    release = tiny_vocoder().activation_post.cpu()
    x = torch.randn((1, release.act.in_features, 5))
    assert not vocoder_kernels.fits(release, x)
    assert torch.equal(vocoder_kernels.activation(release, x), release(x))


def test_a_kernel_that_fails_leaves_the_modules_running(monkeypatch, caplog):
    """A compiler or driver error on the first window is logged; that window and every later one
    run through the modules, and the reply goes on."""
    release = tiny_vocoder().activation_post.cpu()
    x = torch.randn((1, release.act.in_features, 5))
    launches = failing_kernels(vocoder_kernels, "run", monkeypatch)
    assert torch.equal(vocoder_kernels.activation(release, x), release(x))
    assert torch.equal(vocoder_kernels.activation(release, x), release(x))
    assert len(launches) == 1 and vocoder_kernels._disabled
    assert "fused activation kernels failed" in caplog.text
