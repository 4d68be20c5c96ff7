"""The DiT's fused norm kernel (Triton) against PyTorch's layer norm, modulation and gate."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from realtime_omni.engines.omni import dit_kernels  # noqa: E402
from realtime_omni.engines.omni.dit_blocks import DiTWindow, run_blocks  # noqa: E402

from .test_omni_dit_blocks import tiny_dit  # noqa: E402
from .triton_kernels import DEVICE, failing_kernels, kernels_of  # noqa: E402


@pytest.fixture
def kernels(monkeypatch):
    yield from kernels_of(dit_kernels, monkeypatch)


def inputs(rows: int, frames: int, width: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn((rows, frames, width), generator=gen) * 3 + 1
    x = torch.randn((rows, frames, width), generator=gen)
    # the modulations are views into one (rows, 1, 6 width) tensor, as the block makes them
    emb = torch.randn((rows, 1, 6 * width), generator=gen)
    return [t.to(DEVICE) for t in (hidden, x)], [m.to(DEVICE) for m in emb.chunk(6, dim=-1)]


@pytest.mark.parametrize("width", [64, 48])
def test_the_kernel_norms_and_modulates_as_pytorch_does(kernels, width):
    (hidden, x), (shift, scale, gate, *_rest) = inputs(3, 5, width, width)
    norm = torch.nn.LayerNorm(width, elementwise_affine=False, eps=1e-6)
    assert kernels.fits(hidden, shift, scale)
    want = torch.addcmul(shift, norm(hidden), 1 + scale)
    got = kernels.norm_modulate(norm, hidden, shift, scale)
    assert float((got - want).abs().max()) <= 1e-5 * float(want.abs().max())
    want_sum = torch.addcmul(hidden, gate, x)
    want_out = torch.addcmul(shift, norm(want_sum), 1 + scale)
    got_sum, got_out = kernels.gate_norm_modulate(norm, hidden, x, gate, shift, scale)
    assert float((got_sum - want_sum).abs().max()) <= 1e-5 * float(want_sum.abs().max())
    assert float((got_out - want_out).abs().max()) <= 1e-5 * float(want_out.abs().max())


def test_the_blocks_with_the_kernel_compute_what_they_do_without(kernels):
    dit = tiny_dit().to(DEVICE)
    gen = torch.Generator().manual_seed(1)
    hidden = torch.randn((2, 17, 64), generator=gen).to(DEVICE)
    time_embedding = torch.randn((2, 64), generator=gen).to(DEVICE)
    window = DiTWindow(dit, 17, DEVICE, torch.float32)
    with torch.inference_mode():
        want = run_blocks(dit, hidden, time_embedding, window, fused=False)
        got = run_blocks(dit, hidden, time_embedding, window, fused=True)
    assert float((got - want).abs().max()) <= 1e-5 * float(want.abs().max())


def test_strided_inputs_or_shared_modulations_are_not_for_the_kernel(kernels):
    (hidden, _x), (shift, scale, *_rest) = inputs(2, 3, 16, 0)
    assert kernels.fits(hidden, shift, scale)
    assert not kernels.fits(hidden.transpose(0, 1), shift, scale)  # not (rows, frames, width) contiguous
    assert not kernels.fits(hidden, shift[:1], scale[:1])  # one modulation for two rows


def test_on_the_cpu_pytorchs_operations_run():
    (hidden, _x), (shift, scale, *_rest) = inputs(2, 3, 16, 0)
    cpu = [t.cpu() for t in (hidden, shift, scale)]
    norm = torch.nn.LayerNorm(16, elementwise_affine=False, eps=1e-6)
    assert not dit_kernels.fits(*cpu)
    assert torch.equal(dit_kernels.norm_modulate(norm, *cpu), torch.addcmul(cpu[1], norm(cpu[0]), 1 + cpu[2]))


def test_a_kernel_that_fails_leaves_pytorchs_operations_running(monkeypatch, caplog):
    (hidden, x), (shift, scale, gate, *_rest) = inputs(2, 3, 16, 0)
    hidden, x, shift, scale, gate = (t.cpu() for t in (hidden, x, shift, scale, gate))
    norm = torch.nn.LayerNorm(16, elementwise_affine=False, eps=1e-6)
    launches = failing_kernels(dit_kernels, "_launch", monkeypatch)
    want = torch.addcmul(shift, norm(hidden), 1 + scale)
    assert torch.equal(dit_kernels.norm_modulate(norm, hidden, shift, scale), want)
    summed, out = dit_kernels.gate_norm_modulate(norm, hidden, x, gate, shift, scale)
    assert torch.equal(summed, torch.addcmul(hidden, gate, x))
    assert len(launches) == 1 and dit_kernels._disabled
    assert "fused norm kernel failed" in caplog.text
