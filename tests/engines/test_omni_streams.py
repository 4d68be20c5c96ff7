"""Writes to a stage's state queued on its stream (``queued_on``) and the pinned host rows they copy."""

from __future__ import annotations

import threading

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from realtime_omni.engines.omni.streams import PinnedRows, on_stream, queued_on  # noqa: E402


def test_a_staged_row_marks_the_ids_in_range_and_nothing_left_from_before() -> None:
    rows = PinnedRows(3, 6, torch.device("cpu"))
    rows.stage(1, {0, 3, 5, 6, -1, 99})
    assert rows.rows[1].tolist() == [True, False, False, True, False, True]
    rows.stage(1, [2])
    assert rows.rows[1].tolist() == [False, False, True, False, False, False]
    rows.stage(0, ())
    assert not rows.rows[0].any() and not rows.rows[2].any()
    rows.stage_mask(2, np.array([False, True, True, False, False, True]))
    assert rows.rows[2].tolist() == [False, True, True, False, False, True]
    assert rows.rows[1].tolist() == [False, False, True, False, False, False]


def test_off_cuda_queued_writes_run_as_is() -> None:
    state = torch.zeros(3, 5, dtype=torch.bool)
    rows = PinnedRows(3, 5, torch.device("cpu"))
    rows.stage(1, [2, 4])
    with queued_on(None):
        rows.copy_to(state[1], 1)
    assert state.tolist()[1] == [False, False, True, False, True]
    assert not state[0].any() and not state[2].any()


def _busy(stream) -> None:
    """Keep ``stream`` busy for a while (well over the host's time to queue a few copies)."""
    with torch.cuda.stream(stream):
        torch.cuda._sleep(2_000_000_000)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_writes_queued_on_a_busy_stream_return_at_once_and_land_before_its_next_step() -> None:
    stage = torch.cuda.Stream()
    seen = torch.zeros((4, 1000), dtype=torch.bool, device="cuda")
    logits = torch.zeros((4, 16), device="cuda")
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):  # a device input made on another stream, as a prefill's output
        fresh = torch.arange(16, dtype=torch.float32, device="cuda") + 1
    torch.cuda.synchronize()
    lock = threading.Lock()
    rows = PinnedRows(4, 1000, seen.device)
    assert rows.rows.is_pinned()
    rows.stage(2, [7, 999, 1000])
    _busy(stage)
    with lock, queued_on(stage, fresh):
        rows.copy_to(seen[2], 2)
        logits[2].copy_(fresh)
    assert not stage.query(), "queued_on waited for the stage's stream"
    del fresh  # its memory stays the stage's until the copy has run (record_stream)
    with torch.cuda.stream(stage):  # the stage's next step reads the state
        read = (seen.sum(1), logits.sum(1))
    stage.synchronize()
    assert read[0].tolist() == [0, 0, 2, 0]
    assert read[1].tolist() == [0.0, 0.0, float(sum(range(1, 17))), 0.0]
    rows.stage(2, [1])  # restaged once the last copy ran: the state already read keeps its value
    assert rows.rows[2].nonzero().flatten().tolist() == [1]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_stream_by_contrast_waits_for_the_stream_it_ran_on() -> None:
    stage = torch.cuda.Stream()
    _busy(stage)
    with on_stream(stage):
        pass
    assert stage.query()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_stage_loop_launches_its_step_while_the_stream_is_still_busy() -> None:
    """The step's inputs reach the device without waiting for the stream: its launch returns
    long before the work queued ahead of it ends, and the step still reads its own inputs."""
    from realtime_omni.engines.omni.batching.batcher import RowInput, StepBatcher

    def make(bucket, columns, write_pos, inputs):
        (x,) = inputs
        return lambda: (x + write_pos[:, None].to(x.dtype),)

    stage = torch.cuda.Stream()
    batcher = StepBatcher("toy", make, [RowInput((2,), "float32")], capacity=4, device="cuda", scratch=99,
                          graphs=False, gather_s=0.0, stream=stage)
    try:
        batcher.result(batcher.submit(([1.0, 2.0],), 0, write_pos=0))  # the bucket, built
        _busy(stage)
        req = batcher.submit(([3.0, 4.0],), 2, write_pos=5)
        (out,) = batcher.result(req)
        started, launched = batcher.launches[-1]
        assert launched - started < 0.3, "the launch waited for the stream"
        assert out.tolist() == [8.0, 9.0]
    finally:
        batcher.close()
