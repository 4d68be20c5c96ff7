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


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("arch", ["qwen2_5_omni", "qwen3_omni_moe"])
def test_codec_windows_in_pieces_render_what_eager_does(arch: str, tmp_path) -> None:
    """Each architecture's codec window (Qwen2.5: DiT evaluations, then the vocoder's stages;
    Qwen3: code2wav's upsampling and decoder blocks) captured in pieces, two queued at a time,
    renders the window its eager run does."""
    import numpy as np

    from realtime_omni.engines.omni import OmniModel
    from realtime_omni.engines.omni.codec import CodecSettings, OmniCodec
    from realtime_omni.engines.omni.graphs import probing
    from realtime_omni.engines.settings import OmniSettings
    from tests.engines.test_omni import CHUNKS, save_checkpoint

    save_checkpoint(arch, tmp_path)
    model = OmniModel(tmp_path, OmniSettings(device="cuda", dtype="float32", seed=0, **CHUNKS[arch]))
    model.load()
    try:
        loaded = model.loaded
        gen = torch.Generator().manual_seed(5)
        codes = (torch.randint(0, 60, (24,), generator=gen) if arch == "qwen2_5_omni"
                 else torch.randint(0, 32, (12, 4), generator=gen))
        speaker = loaded.default_speaker
        want = OmniCodec(loaded, CodecSettings(cuda_graphs=False)).render(codes, 0, speaker, seed=3)
        codec = OmniCodec(loaded, CodecSettings(queued_pieces=2))
        with probing():  # windows are captured only while a model loads: the second sight captures
            for _ in range(2):
                codec.render(codes, 0, speaker, seed=3, steady=True)
        (_, graph), = codec.windows._graphs.values()
        assert graph.captured and len(graph.graphs) > 2
        for _ in range(2):  # replayed, pieces queued two at a time
            got = codec.render(codes, 0, speaker, seed=3, steady=True)
            assert np.abs(want).max() > 0
            np.testing.assert_allclose(got, want, rtol=0, atol=1e-4 * float(np.abs(want).max()))
    finally:
        model.close()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("pieces", [False, True])
def test_shapes_in_one_pool_replay_what_each_computes(pieces: bool) -> None:
    """Window shapes captured into one memory pool (``shared_pool``), replayed in turn from two
    streams that do not wait for each other, each return what their eager run returns: the
    pool's fence keeps one replay off the memory another is still using."""
    from realtime_omni.engines.omni.graphs import probing
    from realtime_omni.engines.omni.shape_graphs import ShapeGraphs

    gen = torch.Generator().manual_seed(7)
    w = (torch.randn(256, 256, generator=gen) / 16).cuda()
    windows = ShapeGraphs(device="cuda", pieces=pieces, queued=2, shared_pool=True)
    rows = [8, 32, 64]
    with probing():
        for n in rows:
            for _ in range(2):  # captured on the second sight
                windows.run(n, lambda x: chain(x, w), (torch.randn(n, 256, generator=gen).cuda(),))
    assert windows.captured == len(rows)
    side = torch.cuda.Stream()
    xs, got, want = [], [], []  # (inputs kept alive: the side stream may still read them)
    for i, n in enumerate(rows * 3):
        xs.append(torch.randn(n, 256, generator=gen).cuda())
        want.append(chain(xs[-1], w))
        stream = side if i % 2 else torch.cuda.current_stream()
        stream.wait_stream(torch.cuda.current_stream())  # (its input), not the side's last replay
        with torch.cuda.stream(stream):
            got.append(windows.run(n, lambda x: chain(x, w), (xs[-1],)))
    torch.cuda.synchronize()
    for a, b in zip(got, want, strict=True):
        assert all(torch.allclose(p, q, atol=1e-5) for p, q in zip(a, b, strict=True))
    # the load's report finds the pool in the allocator's segments
    from realtime_omni.engines.omni.graphs import memory_line, pool_bytes

    assert pool_bytes(torch.cuda.memory_snapshot()) > 0
    assert "GiB of it in CUDA graph pools" in memory_line("cuda")


def test_graph_pools_are_the_segments_of_private_pools() -> None:
    """What the load reports as graph pools: the allocator's segments of a private pool (a pool
    id other than (0, 0)), not those of the general cache; off CUDA the load reports nothing."""
    from realtime_omni.engines.omni.graphs import memory_line, pool_bytes

    segments = [{"total_size": 2 << 20, "segment_pool_id": (0, 0)},
                {"total_size": 20 << 20, "segment_pool_id": (0, 3)},
                {"total_size": 6 << 20, "segment_pool_id": [1, 0]},
                {"total_size": 4 << 20}]
    assert pool_bytes(segments) == 26 << 20
    assert pool_bytes([]) == 0
    assert memory_line("cpu") is None
