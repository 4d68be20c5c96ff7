"""A step captured as several CUDA graphs (``StepGraph(pieces=True)``), split where it calls
``piece_boundary``, replays what the step computes eagerly, however many pieces are queued."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from realtime_omni.engines.omni.graphs import StepGraph, piece_boundary  # noqa: E402


def chain(x, w):
    """Three stretches of work, each reading the last one's output."""
    y = torch.tanh(x @ w)
    piece_boundary()
    y = y * 2 + x
    piece_boundary()
    return (y @ w.t()).softmax(-1), y.sum(-1)


def test_off_a_capture_a_boundary_changes_nothing() -> None:
    x, w = torch.randn(4, 8), torch.randn(8, 8)
    graph = StepGraph(lambda: chain(x, w), device="cpu", pieces=True)
    got = graph()
    want = chain(x, w)
    assert not graph.captured and graph.graphs == []
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("queued", [0, 1, 2])
def test_pieces_replay_the_eager_step(queued: int) -> None:
    gen = torch.Generator().manual_seed(queued)
    x = torch.randn(64, 256, generator=gen).cuda()
    w = torch.randn(256, 256, generator=gen).cuda() / 16
    graph = StepGraph(lambda: chain(x, w), device="cuda", pieces=True, queued=lambda: queued)
    graph()  # captured here
    assert len(graph.graphs) == 3
    for seed in range(3):  # fresh inputs, as a codec window copies in before each replay
        x.copy_(torch.randn(64, 256, generator=torch.Generator().manual_seed(100 + seed)).cuda())
        got = [t.clone() for t in graph()]
        want = chain(x, w)
        torch.cuda.synchronize()
        assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(got, want, strict=True))
