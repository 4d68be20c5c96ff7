"""The omni engine's real-time capacity: measured at load from its batched steps, and admission by it.

The arithmetic is checked on step times given by hand; the measurement and the admission on the
tiny random checkpoints (CPU), in-process and through the worker process the server uses.
"""

from __future__ import annotations

import dataclasses

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from pydantic import ValidationError  # noqa: E402

from realtime_omni.engines.base import ModelAtCapacity, TurnMessage  # noqa: E402
from realtime_omni.engines.omni import OmniModel  # noqa: E402
from realtime_omni.engines.omni.codec_stream import CodecStream  # noqa: E402
from realtime_omni.engines.omni.batching import capacity  # noqa: E402
from realtime_omni.engines.omni.batching.capacity import (  # noqa: E402
    StepTimes,
    Workload,
    at,
    demand,
    host_demand,
    realtime_sessions,
)
from realtime_omni.engines.settings import EngineSettings, OmniSettings  # noqa: E402

from .test_omni import (  # noqa: E402, F401 - _one_thread: the module's autouse fixture
    ARCHS,
    CHUNKS,
    _one_thread,
    request,
    run_turn,
    save_checkpoint,
    user_audio,
)

TIMES = StepTimes(thinker={1: 10.0, 8: 12.0, 32: 20.0}, talker={1: 10.0, 8: 14.0, 32: 24.0})
QWEN3 = Workload(frame_s=0.08, tokens_per_frame=1.0, window_s=0.64, budget=0.6)


def test_a_step_costs_what_its_bucket_costs_and_more_rows_take_more_steps():
    assert at(TIMES.talker, 1) == 10.0 and at(TIMES.talker, 5) == 14.0 and at(TIMES.talker, 32) == 24.0
    assert at(TIMES.talker, 33) == 24.0 + 10.0  # a full step of 32 and one of 1
    assert at(TIMES.talker, 0) == 0.0 and at({}, 4) == 0.0


def test_the_capacity_is_the_most_sessions_whose_steps_fit_the_budget():
    # 8 sessions: (14 + 12) ms per 80 ms frame; 32: (24 + 20) ms, 55 %; 33: two steps each, 80 %
    assert demand(TIMES, QWEN3, 8) == pytest.approx(26 / 80)
    assert demand(TIMES, QWEN3, 32) == pytest.approx(0.55)
    assert realtime_sessions(TIMES, QWEN3, slots=64) == 32
    assert realtime_sessions(TIMES, QWEN3, slots=16) == 16  # the slots bound it first
    # the thinker's steps count as often as replies write tokens
    fewer = dataclasses.replace(QWEN3, tokens_per_frame=1 / 3)
    assert demand(TIMES, fewer, 32) == pytest.approx((24 + 20 / 3) / 80)
    # the codec's group of 32 windows every 640 ms: 192 ms of it takes 30 % more; 8 fit
    with_codec = dataclasses.replace(TIMES, codec={1: 40.0, 8: 60.0, 32: 192.0})
    assert demand(with_codec, QWEN3, 32) == pytest.approx(0.55 + 0.3)
    assert demand(with_codec, QWEN3, 8) == pytest.approx(26 / 80 + 60 / 640)
    assert realtime_sessions(with_codec, QWEN3, slots=64) == 8
    assert realtime_sessions(TIMES, dataclasses.replace(QWEN3, budget=0.1), slots=64) == 0


def test_the_sessions_own_threads_bound_the_capacity_when_the_interpreter_fills_first():
    # 1.2 ms of the interpreter per session and 80 ms frame: 40 sessions take 60 % of it
    host = dataclasses.replace(TIMES, host=1.2)
    assert host_demand(host, QWEN3, 40) == pytest.approx(0.6)
    assert realtime_sessions(host, QWEN3, slots=64) == 32  # the device binds first (above)
    cheap = dataclasses.replace(TIMES, talker={1: 1.0, 64: 2.0}, thinker={1: 1.0, 64: 2.0}, host=1.2)
    assert demand(cheap, QWEN3, 64) < 0.1 and realtime_sessions(cheap, QWEN3, slots=64) == 40
    assert realtime_sessions(dataclasses.replace(cheap, host=0.0), QWEN3, slots=64) == 64  # not measured


def _model(arch: str, root, **settings) -> OmniModel:
    save_checkpoint(arch, root)
    model = OmniModel(root, OmniSettings(talker_do_sample=False, seed=0, talker_max_frames=40, max_sessions=3,
                                         **CHUNKS[arch], **settings))
    model.load()
    return model


@pytest.mark.parametrize("arch", ARCHS)
def test_the_load_measures_the_capacity_and_admits_no_session_beyond_it(arch, tmp_path):
    model = _model(arch, tmp_path, realtime_admission="on", realtime_budget=1.0, ignore_eos=True)
    try:
        times = model.capacity_times
        # every bucket of both decode stages, and the codec's steady window alone and in groups
        assert sorted(times.thinker) == sorted(times.talker) == model.batching.thinker.sizes
        assert 1 in times.codec and all(ms > 0 for ms in [*times.thinker.values(), *times.codec.values()])
        # and a throw-away reply's own threads, per frame (the host's share)
        assert 0 < times.host < 100
        limit = model.realtime_capacity
        assert 0 <= limit <= 3 and model.info.max_sessions == limit
        assert model.stats()["slots"]["realtime_capacity"] == limit
        sessions = [model.open_session() for _ in range(limit)]
        with pytest.raises(ModelAtCapacity):
            model.open_session()
        for session in sessions:
            session.close()
        # a budget no step fits (a device busy with something else): one session still gets in,
        # the next is refused, saying why
        model.settings.realtime_budget = 1e-9
        assert model.measure_capacity() == 1 and model.info.max_sessions == 1
        only = model.open_session()
        with pytest.raises(ModelAtCapacity, match="real-time capacity"):
            model.open_session()
        only.close()
    finally:
        model.close()


def _slot_state(model: OmniModel, session) -> list:
    """The session's slots' cache columns (not the scratch column) and per-slot step state, copied."""
    b = model.batching
    thinker, talker = session.rows.thinker.slot, session.rows.talker.slot
    state = [t[slot, :, : pool.length].clone() for pool, slot in ((b.thinker_pool, thinker), (b.talker_pool, talker))
             for t in (*pool.keys, *pool.values)]
    tokens, frames = b.thinker_tokens, b.talker_frames
    state += [t[thinker].clone() for t in (tokens.last, tokens.seen, tokens.suppress)]
    state += [t[talker].clone() for t in (frames.logits, frames.seen)]
    return state + ([frames.hidden[talker].clone()] if frames.hidden is not None else [])


def test_timing_the_steps_leaves_every_slot_as_it_was(tmp_path):
    """The measurement replays each bucket with every row idle (writing to the scratch column
    only), and its throw-away reply (the host's share) runs in a slot of its own: a session
    holding its context across it finds its slots as it left them."""
    model = _model("qwen3_omni_moe", tmp_path, realtime_admission="off")
    try:
        assert model.realtime_capacity is None and model.info.max_sessions == 3  # off: the slots admit
        first = TurnMessage(role="user", text="hello there", audio=user_audio(0.3, seed=1))
        session = model.open_session()
        try:
            run_turn(session, request([first], max_tokens=6))
            before = _slot_state(model, session)
            sessions, line = model.estimate_capacity(budget=1.0)
            after = _slot_state(model, session)
            assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))
            assert line.startswith(f"real-time capacity {sessions} of 3 session slots")
        finally:
            session.close()
    finally:
        model.close()


def test_an_isolated_worker_admits_by_its_measured_capacity(tmp_path):
    """Through the worker process the server runs: the capacity travels with the model's info."""
    from realtime_omni.engines.worker import IsolatedModel

    save_checkpoint("qwen3_omni_moe", tmp_path)
    model = IsolatedModel(f"omni:{tmp_path}", engines=EngineSettings(omni=OmniSettings(
        max_sessions=2, talker_do_sample=False, seed=0, talker_max_frames=40, realtime_admission="on",
        realtime_budget=1e-9, **CHUNKS["qwen3_omni_moe"])))
    model.load()
    try:
        assert model.info.max_sessions == 1  # no step fits the budget: one session all the same
        assert model.stats()["slots"]["realtime_capacity"] == 1
        only = model.open_session()
        with pytest.raises(ModelAtCapacity):
            model.open_session()
        only.close()
    finally:
        model.close()


@pytest.mark.parametrize("bad", [{"realtime_admission": "sometimes"}, {"realtime_budget": 0}, {"realtime_budget": 1.5},
                                 {"realtime_budget": -1}, {"realtime_budget": "lots"}])
def test_admission_settings_out_of_range_are_refused_by_name(bad):
    with pytest.raises(ValidationError, match=next(iter(bad))):
        OmniSettings(**bad)


def test_the_capacity_line_says_what_it_rests_on():
    line = capacity.describe(TIMES, QWEN3, 32, 64)
    assert line.startswith("real-time capacity 32 of 64 session slots (steady demand within 60% of the device "
                           "and of the interpreter")
    assert line.endswith("host not measured (reply too short, or no free slot)")
    assert capacity.describe(dataclasses.replace(TIMES, host=1.234), QWEN3, 32, 64).endswith(
        "host 1.23 ms per session and frame")
    assert "thinker 1: 10.0, 8: 12.0, 32: 20.0" in line


@pytest.mark.parametrize("arch", ARCHS)
def test_the_timed_codec_window_is_the_one_a_running_reply_renders(arch, tmp_path, monkeypatch):
    """The capacity times the codec's running window (the captured graph a reply replays), found
    by arithmetic: it must be the length a reply's stream renders once its chunks are steady."""
    model = _model(arch, tmp_path, realtime_admission="off")
    try:
        codec = model.codec
        # enough steady chunks for the left context to fill (the test's chunks are short)
        assert not model.ramp_frames
        sizes = [model.first_chunk_frames] + [model.chunk_frames] * 16
        rendered: list[int] = []  # the windows' lengths once their start has moved (context full)
        begin = codec.begin

        def counted(codes, start=0, *args, **kwargs):
            if start > 0:
                rendered.append(len(codes))
            return begin(codes, start, *args, **kwargs)

        monkeypatch.setattr(codec, "begin", counted)
        stream = CodecStream.of(codec, turn=0, speaker=None, seed=0)
        groups = () if arch == "qwen2_5_omni" else (codec.groups,)
        start = 0
        for size in sizes:
            stream.push(torch.randint(0, codec.max_code + 1, (size, *groups)), start=start)
            start += size
        # (with the test's 8-code chunks and Qwen2.5's 12-code blocks the windows cycle: the longest)
        assert rendered and max(rendered) == codec.running_window(sizes[:1], model.chunk_frames)
    finally:
        model.close()


def test_host_time_counts_each_step_of_a_generator_and_closing_it_closes_the_generator():
    from realtime_omni.engines.omni.host_time import HostTime

    host = HostTime()
    closed = []

    def reply():
        try:
            for frames in (2, 3, 4):
                sum(range(20_000))  # some interpreter time per step
                yield frames
        finally:
            closed.append(True)

    steps = host.generator("talker", reply(), frames=lambda n: n)
    assert next(steps) == 2 and next(steps) == 3
    steps.close()  # the consumer stops early (a barge-in): the reply's cleanup runs
    assert closed == [True]
    stats = host.stats()
    assert stats["frames"] == 5 and stats["talker_cpu_s"] > 0 and stats["thinker_cpu_s"] == 0
    assert list(host.generator("thinker", iter(()))) == []


def test_a_failed_host_measurement_leaves_the_host_term_out_and_the_model_serving(tmp_path, monkeypatch, caplog):
    def broken(*_args, **_kwargs):
        raise RuntimeError("the throw-away reply failed")

    monkeypatch.setattr(capacity, "host_ms_per_frame", broken)  # (a fault injected into the load)
    model = _model("qwen3_omni_moe", tmp_path, realtime_admission="on", realtime_budget=1.0)
    try:
        assert model.capacity_times.host == 0.0 and model.realtime_capacity >= 1
        assert "could not be measured" in caplog.text
        session = model.open_session()
        run_turn(session, request([TurnMessage(role="user", text="hi", audio=user_audio(0.3, seed=2))], max_tokens=3))
        session.close()
    finally:
        model.close()
