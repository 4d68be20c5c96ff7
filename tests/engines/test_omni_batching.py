"""Cross-session batching of the omni engine, on the tiny random checkpoints (CPU).

A batch of sessions must give each session exactly what it would get alone: the same thinker
tokens, talker codes and audio (greedy), across turns, after a barge-in cut, and while other
sessions join and leave mid-stream.
"""

from __future__ import annotations

import collections
import dataclasses
import math

import threading
import time

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from realtime_omni.engines.base import TalkerOutput, TurnMessage  # noqa: E402
from realtime_omni.engines.omni import OmniModel  # noqa: E402
from realtime_omni.engines.omni.codec_stream import CodecStream  # noqa: E402
from realtime_omni.engines.omni.loader import samples_per_code  # noqa: E402
from realtime_omni.engines.omni.talker import CodeChunk  # noqa: E402
from realtime_omni.engines.settings import EngineSettings, OmniSettings  # noqa: E402
from realtime_omni.engines.omni.batching import (  # noqa: E402
    BatcherClosed,
    Lookahead,
    RowInput,
    SlotsFull,
    StepBatcher,
)

from .test_omni import (  # noqa: E402, F401 - _one_thread: the module's autouse fixture
    ARCHS,
    CHUNKS,
    _one_thread,
    live_turn,
    qwen3_config,
    request,
    run_turn,
    save_checkpoint,
    user_audio,
)


@pytest.fixture(scope="module", params=ARCHS)
def pair(request, tmp_path_factory):
    """The same checkpoint twice: batched stages (4 slots) and every session on its own."""
    arch = request.param
    root = tmp_path_factory.mktemp(arch)
    save_checkpoint(arch, root)
    models = {}
    for name, slots in (("batched", 4), ("alone", 0)):
        model = OmniModel(root, OmniSettings(talker_do_sample=False, seed=0, talker_max_frames=40,
                                             max_sessions=slots, **CHUNKS[arch]))
        model.load()
        models[name] = model
    yield models
    for model in models.values():
        model.close()


def _turns(i: int) -> list[list[TurnMessage]]:
    first = TurnMessage(role="user", text=f"hello number {i}", audio=user_audio(0.4, seed=i))
    second = TurnMessage(role="user", text=f"and then {i}?")
    return [[first], [first, second]]


def _conversation(session, i: int, cut: bool, started: threading.Event | None = None) -> dict:
    """Two turns; with ``cut`` the first reply is cut back (barge-in) to half its tokens."""
    record: dict = {"tokens": [], "codes": [], "audio": []}
    spoken = ""
    for t, messages in enumerate(_turns(i)):
        if t == 1:
            messages = [messages[0], TurnMessage(role="assistant", text=spoken), messages[1]]
        outputs, chunks, audio, _ = run_turn(session, request(messages, max_tokens=8))
        if started is not None:
            started.set()
        texts = [o.text for o in outputs]
        spoken = "".join(texts[: max(1, len(texts) // 2)]) if cut else "".join(texts)
        if cut and t == 0:
            session.confirm(spoken)
        record["tokens"].append([o.hidden.token_id for o in outputs])
        record["codes"].append([c.codes.codes.tolist() for c in chunks if c.codes is not None])
        record["audio"].append(np.concatenate(audio) if audio else np.zeros(0, np.int16))
    return record


def _alone(model: OmniModel, i: int, cut: bool) -> dict:
    session = model.open_session()
    try:
        return _conversation(session, i, cut)
    finally:
        session.close()


def _same(a: dict, b: dict) -> None:
    assert a["tokens"] == b["tokens"]
    assert a["codes"] == b["codes"]
    for x, y in zip(a["audio"], b["audio"], strict=True):
        assert x.shape == y.shape
        assert np.array_equal(x, y)


def _together(batched: OmniModel) -> dict[int, dict]:
    """Conversations 0-2 at once, 3 joining once the others stream; each leaves when done."""
    results: dict[int, dict] = {}
    errors: list[BaseException] = []
    first_done = threading.Event()

    def converse(i: int, started: threading.Event | None = None) -> None:
        try:
            session = batched.open_session()
            try:
                results[i] = _conversation(session, i, cut=(i == 1), started=started)
            finally:
                session.close()  # leaves while the others may still be mid-stream
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=converse, args=(i, first_done if i == 0 else None)) for i in range(3)]
    for th in threads:
        th.start()
    assert first_done.wait(120)
    late = threading.Thread(target=converse, args=(3,))
    late.start()
    for th in [*threads, late]:
        th.join(300)
    assert not errors, errors
    return results


def test_a_batch_of_sessions_gives_each_what_it_gets_alone(pair):
    batched, alone = pair["batched"], pair["alone"]
    expected = {i: _alone(alone, i, cut=(i == 1)) for i in range(4)}
    results = _together(batched)
    for i in range(4):
        _same(results[i], expected[i])
    stats = batched.batching.stats()
    assert stats["in_use"] == 0  # every slot came back
    assert stats["thinker"]["steps"] > 0 and stats["talker"]["steps"] > 0


def test_a_reply_records_where_its_time_went_from_its_prefill_to_its_first_token(pair):
    for name, model in pair.items():
        session = model.open_session()
        try:
            assert session.last_reply_start is None
            run_turn(session, request(_turns(0)[0], max_tokens=2))
            start = session.last_reply_start
        finally:
            session.close()
        assert start is not None and min(start.prompt_s, start.pick_s, start.load_s) >= 0.0
        assert start.prompt_s + start.pick_s + start.load_s < 30.0
        if name == "alone":  # no batched state to load
            assert start.load_s < 0.05


def test_prefills_padded_to_their_graph_buckets_give_the_same_replies(pair):
    """On the GPU a batched prefill is padded to a captured (rows, tokens, columns) bucket: extra
    rows that write only to the scratch column, extra tokens per row, more attended columns. Here
    the same padding runs eagerly and every session must still get what it gets alone."""
    batched, alone = pair["batched"], pair["alone"]
    prefills = [batched.batching.prefill, batched.batching.talker_prefill]
    before = [p.stats()["bucketed"] for p in prefills]
    for p in prefills:
        p.graphs.pad = True
    try:
        results = _together(batched)
    finally:
        for p in prefills:
            p.graphs.pad = False
    for i in range(4):
        _same(results[i], _alone(alone, i, cut=(i == 1)))
    for p, was in zip(prefills, before, strict=True):
        assert p.stats()["bucketed"] > was, p.name  # the padding did run


def test_loops_handing_each_step_over_at_once_give_each_session_what_it_gets_alone(pair):
    """By default (``pipelined``) a loop hands a step's results over only after launching the next
    step (or at once when there is none); turned off, it hands them over as soon as the step is
    done: every session still gets exactly its tokens, codes and audio, sessions joining and
    leaving included, and every slot comes back."""
    batched, alone = pair["batched"], pair["alone"]
    loops = batched.batching.batchers
    assert all(loop.pipelined for loop in loops)  # the default the other tests run
    for loop in loops:
        loop.pipelined = False
    try:
        results = _together(batched)
    finally:
        for loop in loops:
            loop.pipelined = True
    for i in range(4):
        _same(results[i], _alone(alone, i, cut=(i == 1)))
    assert batched.batching.stats()["in_use"] == 0


def test_steps_of_several_sessions_share_one_forward(pair):
    """Sessions mid-reply are gathered into the same step (mean rows per step above one); each
    new turn's prefill is counted with how long it waited for its batch and for its result."""
    batched = pair["batched"]
    before = batched.batching.thinker.stats()
    prefill_before = batched.batching.prefill.stats()
    talker_before = batched.batching.talker_prefill.stats()["requests"]
    sessions = [batched.open_session() for _ in range(3)]
    barrier = threading.Barrier(3)

    def go(i: int) -> None:
        barrier.wait()
        run_turn(sessions[i], request([TurnMessage(role="user", text=f"hi {i}")], max_tokens=8))

    threads = [threading.Thread(target=go, args=(i,)) for i in range(3)]
    began = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join(120)
    for s in sessions:
        s.close()
    after = batched.batching.thinker.stats()
    rows = after["rows"] - before["rows"]
    steps = after["steps"] - before["steps"]
    assert steps > 0 and rows / steps > 1.2
    # the loop's timeline holds each of those steps: when it ran, for how long, with how many rows
    timeline = batched.batching.thinker.steps_since(began)
    assert len(timeline) == steps and sum(n for _, _, n in timeline) == rows
    assert all(began <= start <= end for start, end, _ in timeline)
    assert all(a[1] <= b[0] for a, b in zip(timeline, timeline[1:]))  # one step after another
    prefill = batched.batching.prefill.stats()
    assert prefill["requests"] - prefill_before["requests"] == 3
    waited = prefill["wait_s"] - prefill_before["wait_s"]
    took = prefill["latency_s"] - prefill_before["latency_s"]
    assert 0.0 <= waited < took
    assert all(0.0 <= wait < total for _, wait, total in prefill["recent"][-3:])
    # each turn's preparation (its prompt rendered) is timed, and precedes the queuing
    assert all(prepared is not None and 0.0 < prepared < 10.0 for prepared, _, _ in prefill["recent"][-3:])
    talker = batched.batching.talker_prefill.stats()  # the talker's prompt, built from the first token
    new = talker["requests"] - talker_before
    assert new >= 3 and all(p is not None and 0.0 < p < 10.0 for p, _, _ in talker["recent"][-new:])
    # the model's stats (what /metrics exports) carry the same counters
    assert batched.stats()["thinker prefill"]["requests"] == prefill["requests"]


def test_the_talker_prefill_expects_the_sessions_of_each_thinker_prefill_batch(pair):
    """A thinker prefill batch tells the talker's prefill which sessions (their talker slots) will
    come next: those of spoken replies; it waits for them (up to its burst: tests/engines/test_omni_mailbox.py) until they come or the
    expectation lapses. Without a burst it expects nothing."""
    batched = pair["batched"]
    batching = batched.batching
    talker = batching.talker_prefill
    assert batching.prefill.on_finished == talker.expect
    assert talker.burst_s > 0
    # a spoken reply's thinker prefill names its session; a text reply's does not
    told: list[list[int]] = []
    batching.prefill.on_finished = lambda slots: (told.append(list(slots)), talker.expect(slots))
    session = batched.open_session()
    try:
        for want_audio in (True, False):
            req = request([TurnMessage(role="user", text=f"hi {want_audio}")], max_tokens=3)
            req = dataclasses.replace(req, want_audio=want_audio)
            list(session.think(req)) if not want_audio else run_turn(session, req)
    finally:
        session.close()
        batching.prefill.on_finished = talker.expect
    assert told == [[session.rows.talker.slot]]
    with talker._cond:
        assert not talker._expecting()
    talker.expect([2, 3], within_s=0.2)
    with talker._cond:
        assert talker._expecting()
    time.sleep(0.3)
    with talker._cond:
        assert not talker._expecting() and not talker._expected
    burst, talker.burst_s = talker.burst_s, 0.0
    try:
        talker.expect([2, 3], within_s=5.0)
        with talker._cond:
            assert not talker._expecting()
    finally:
        talker.burst_s = burst


def test_a_spoken_replys_talker_prefill_announces_its_first_codec_window(pair):
    """The talker's prefill of a reply names the session (its talker slot) to the codec, whose
    first window of that reply carries the same slot, and only that window (the codec waits for
    the first windows announced together: tests/engines/test_omni_mailbox.py). Qwen3's codec
    has no burst to wait in: it keeps no announcement."""
    batched = pair["batched"]
    codec, talker_prefill = batched.codec.batcher, batched.batching.talker_prefill
    assert talker_prefill.on_finished == codec.expect_first
    told: list[list[int]] = []
    owners: list[int | None] = []
    talker_prefill.on_finished = lambda slots: (told.append(list(slots)), codec.expect_first(slots))
    send = codec.send
    codec.send = lambda *args: (owners.append(args[5]), send(*args))[1]
    session = batched.open_session()
    try:
        run_turn(session, request([TurnMessage(role="user", text="say something")], max_tokens=16))
    finally:
        session.close()
        talker_prefill.on_finished = codec.expect_first
        del codec.send
    slot = session.rows.talker.slot
    assert told == [[slot]]
    assert owners[0] == slot and all(owner is None for owner in owners[1:])
    assert len(owners) > 1 or batched.arch != "qwen2_5_omni"  # (Qwen3's tiny talker ends at once)
    assert not codec._announced


def test_a_session_beyond_the_slots_is_refused_and_a_freed_slot_is_reused(pair):
    batched = pair["batched"]
    sessions = [batched.open_session() for _ in range(4)]
    with pytest.raises(SlotsFull, match="slots are in use"):
        batched.open_session()
    sessions.pop(2).close()
    again = batched.open_session()
    assert again.rows.thinker.slot == 2  # the lowest free slot: batches stay short
    for s in [*sessions, again]:
        s.close()
    assert batched.batching.stats()["in_use"] == 0


def test_settings_reach_the_batching(tmp_path):
    """The section's batching fields reach the model; out-of-range values are refused by name."""
    from pydantic import ValidationError

    save_checkpoint("qwen3_omni_moe", tmp_path)
    model = OmniModel(tmp_path, OmniSettings(max_sessions=3, lookahead_steps=5, talker_max_frames=300,
                                             batch_gather_ms=4.0, pipelined_steps=False, pace_lead_ms=800,
                                             prefill_burst_ms=25))
    assert model.max_sessions == 3 and model.lookahead_steps == 5 and model.batch_gather_s == 0.004
    model.load()
    try:  # both prefills gather a burst for as long as the section says
        assert model.batching.prefill.burst_s == model.batching.talker_prefill.burst_s == 0.025
    finally:
        model.close()
    assert OmniSettings().prefill_burst_ms == 60.0
    assert model.pipelined_steps is False and model.talker_settings.pace_lead_s == 0.8
    assert OmniSettings().pace_lead_ms == 1500.0  # the transport's own lead
    assert model.talker_settings.max_new_tokens == 300 and model.info.max_sessions == 3
    for name, bad in (("max_sessions", -1), ("lookahead_steps", 0), ("lookahead_steps", 10000),
                      ("talker_max_frames", 0), ("random_weights", "perhaps"), ("pace_lead_ms", -1),
                      ("pace_lead_ms", float("nan")), ("prefill_burst_ms", -1), ("prefill_burst_ms", 10_000)):
        with pytest.raises(ValidationError, match=name):
            OmniSettings(**{name: bad})


# ---------------------------------------------------------------------------------------------
# the batcher on its own: rows, errors, closing


def _adder(capacity: int, fail_on: int | None = None) -> StepBatcher:
    """A toy stage: each row's output is its input plus its write position."""

    def make(bucket, columns, write_pos, inputs):
        (x,) = inputs

        def step():
            if fail_on is not None and bool((x == fail_on).any()):
                raise RuntimeError("the forward failed")
            return (x + write_pos[:, None].to(x.dtype),)

        return step

    return StepBatcher("toy", make, [RowInput((2,), "float32")], capacity=capacity, device="cpu",
                       scratch=99, graphs=False, gather_s=0.0)


def test_batcher_rows_get_their_own_outputs():
    batcher = _adder(8)
    try:
        out = {}

        def go(slot: int) -> None:
            (y,) = batcher.step((torch.tensor([slot, -slot], dtype=torch.float32),), slot=slot, write_pos=10 * slot)
            out[slot] = y.tolist()

        threads = [threading.Thread(target=go, args=(s,)) for s in (0, 3, 5)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(10)
        assert out == {s: [s + 10 * s, -s + 10 * s] for s in (0, 3, 5)}
    finally:
        batcher.close()


def test_batcher_refuses_bad_slots_and_survives_a_failed_step():
    batcher = _adder(4, fail_on=7)
    try:
        for bad in (None, -1, 4, 10_000):
            with pytest.raises(ValueError, match="slot"):
                batcher.step((torch.zeros(2),), slot=bad)
        with pytest.raises(ValueError, match="takes 1 inputs"):  # a row is checked in the session's thread
            batcher.step((torch.zeros(2), torch.zeros(2)), slot=0)
        with pytest.raises(RuntimeError):  # a row of the wrong shape never reaches the loop
            batcher.step((torch.zeros(3),), slot=0)
        for values in ([1.0, 2.0, 3.0], 5.0, [[1.0, 2.0]], "ab", [1.0, None], [1.0, "2"], [object(), 1]):  # checked
            with pytest.raises(ValueError):
                batcher.step((values,), slot=0)
        with pytest.raises(RuntimeError, match="forward failed"):
            batcher.step((torch.full((2,), 7.0),), slot=1)
        (y,) = batcher.step((torch.ones(2),), slot=1, write_pos=2)  # the loop goes on
        assert y.tolist() == [3.0, 3.0]
        (y,) = batcher.step(([1.0, -1.0],), slot=2, write_pos=1)  # host values, as sessions send them
        assert y.tolist() == [2.0, 0.0]
    finally:
        batcher.close()
    with pytest.raises(BatcherClosed):
        batcher.step((torch.zeros(2),), slot=0)


@pytest.mark.parametrize("expected", [True, False], ids=["expected", "unexpected"])
def test_a_step_waits_for_the_first_steps_of_the_sessions_a_prefill_batch_just_ended(expected):
    """After a prefill batch the stage expects those sessions' first steps (``expect``, called
    by the prefill's ``stepper`` hook): the first step waits for them, up to ``expect_s``, and
    all go in one batch. Unexpected, each goes as it comes."""
    batcher = _adder(8)
    batcher.expect_s = 2.0
    try:
        if expected:
            batcher.expect([0, 1, 2])
        threads = []
        for slot in (0, 1, 2):
            threads.append(threading.Thread(target=batcher.step, args=((torch.zeros(2),), slot)))
            threads[-1].start()
            time.sleep(0.1)  # the sessions' threads come round one after another
        for th in threads:
            th.join(10)
    finally:
        batcher.close()
    assert [rows for _, _, rows in batcher.timeline] == ([3] if expected else [1, 1, 1])


def test_an_expected_step_that_never_comes_holds_a_batch_no_longer_than_expect_s():
    batcher = _adder(8)
    batcher.expect_s = 0.3
    try:
        batcher.expect([5], within_s=0.6)
        began = time.monotonic()
        batcher.step((torch.zeros(2),), slot=0)
        assert 0.25 < time.monotonic() - began < 0.6
        time.sleep(0.4)  # slot 5's expectation lapses
        batcher.expect([6], within_s=0.01)  # lapsed before the next step: not waited for
        time.sleep(0.05)
        began = time.monotonic()
        batcher.step((torch.zeros(2),), slot=0)
        assert time.monotonic() - began < 0.2
        batcher.expect_s = 2.0
        batcher.expect([8], within_s=10.0)  # a reply cut before its first step: no longer waited for
        threading.Timer(0.1, batcher.unexpect, args=(8,)).start()
        began = time.monotonic()
        batcher.step((torch.zeros(2),), slot=0)
        assert time.monotonic() - began < 1.0 and not batcher._expected
        batcher.expect_s = 0.0  # a stage that expects nothing
        batcher.expect([7], within_s=10.0)
        assert not batcher._expected
    finally:
        batcher.close()


def test_spoken_replies_prefilled_together_tell_each_stage_whose_first_steps_follow(pair):
    """The thinker's and the talker's prefills name the slots of the spoken replies of one batch
    to their stage's decode steps (``stepper``); a lone reply (no peers to keep pace with) and a
    prefill run ahead of its turn name none."""
    batched = pair["batched"]
    batching = batched.batching
    assert batching.prefill.stepper is batching.thinker and batching.talker_prefill.stepper is batching.talker
    told: dict[str, list[list[int]]] = {"thinker": [], "talker": []}
    expects = {name: getattr(batching, name).expect for name in told}
    for name in told:
        getattr(batching, name).expect = lambda slots, _name=name, **kw: (told[_name].append(sorted(slots)),
                                                                           expects[_name](slots, **kw))
    prefills = (batching.prefill, batching.talker_prefill)
    bursts = [prefill.burst_s for prefill in prefills]
    sessions = [batched.open_session() for _ in range(2)]
    first = TurnMessage(role="user", text="tell me")
    spoken = dataclasses.replace(request([first], max_tokens=4), want_audio=True)
    try:
        run_turn(sessions[0], spoken)  # alone
        assert told == {"thinker": [], "talker": []}
        # two turns that end together: their prefills meet (each batch waits for the other)
        for prefill in prefills:
            prefill.burst_s = 5.0
        batching.prefill.expect([s.rows.thinker.slot for s in sessions], within_s=5.0)
        threads = [threading.Thread(target=run_turn, args=(s, spoken)) for s in sessions]
        for th in threads:
            th.start()
        for th in threads:
            th.join(60)
        assert told == {"thinker": [sorted(s.rows.thinker.slot for s in sessions)],
                        "talker": [sorted(s.rows.talker.slot for s in sessions)]}
        told["thinker"].clear(), told["talker"].clear()
        # the next turns prefilled ahead of their replies: nothing follows at once
        ahead = request([first, TurnMessage(role="user", text="and more")], max_tokens=4)
        batching.prefill.expect([s.rows.thinker.slot for s in sessions], within_s=5.0)
        threads = [threading.Thread(target=s.prefill, args=(dataclasses.replace(ahead, want_audio=True),))
                   for s in sessions]
        for th in threads:
            th.start()
        for th in threads:
            th.join(60)
        assert told == {"thinker": [], "talker": []}
    finally:
        for prefill, burst in zip(prefills, bursts, strict=True):
            prefill.burst_s = burst
        for session in sessions:
            session.close()
        for name in told:
            del getattr(batching, name).expect


def test_a_failing_hint_to_the_next_stage_does_not_stop_the_prefills(pair):
    batching = pair["batched"].batching
    hook = batching.prefill.on_finished

    def broken(slots):
        raise RuntimeError("the next stage is gone")

    batching.prefill.on_finished = broken
    session = pair["batched"].open_session()
    try:
        for text in ("first", "second"):  # the second prefill still runs
            req = dataclasses.replace(request([TurnMessage(role="user", text=text)], max_tokens=3), want_audio=True)
            outputs, _, audio, _ = run_turn(session, req)
            assert outputs and sum(len(a) for a in audio) > 0
    finally:
        session.close()
        batching.prefill.on_finished = hook


def test_steps_queued_ahead_run_in_order_one_per_batch_and_withdrawn_ones_never_run():
    ran: list[list[float]] = []

    def make(bucket, columns, write_pos, inputs):
        (x,) = inputs

        def step():
            ran.append([float(v) for v, p in zip(x[:, 0], write_pos) if int(p) != 99])
            if -1.0 in ran[-1]:
                started.set()
                gate.wait(5)
            return (x + write_pos[:, None].to(x.dtype),)

        return step

    gate, started = threading.Event(), threading.Event()
    batcher = StepBatcher("toy", make, [RowInput((1,), "float32")], capacity=4, device="cpu", scratch=99,
                          graphs=False, gather_s=0.0)
    try:
        ahead = Lookahead(batcher, slot=1, depth=3)
        other = Lookahead(batcher, slot=2, depth=3)
        for k in range(3):
            ahead.push((torch.tensor([float(k)]),), write_pos=10 + k, note=k)
            other.push((torch.tensor([100.0 + k]),), write_pos=20 + k)
        assert ahead.room == 0
        outs = [ahead.pop() for _ in range(3)]
        # each slot's steps in the order queued, one per batch, both slots in the same batches
        assert [(float(y[0]), note) for (y,), note in outs] == [(10.0, 0), (12.0, 1), (14.0, 2)]
        assert all(len(rows) <= 2 for rows in ran)
        # withdrawn while the loop is busy: they never run, and the loop goes on for the others
        blocker = threading.Thread(target=batcher.step, args=((torch.tensor([-1.0]),),), kwargs={"slot": 3})
        blocker.start()
        assert started.wait(5)
        for k in range(3):
            ahead.push((torch.tensor([50.0 + k]),), write_pos=30 + k)
        ahead.drain()
        gate.set()
        blocker.join(5)
        (y,), _ = other.pop()
        assert float(y[0]) == 100.0 + 20
        assert not [v for rows in ran for v in rows if 50 <= v < 60]
        assert len(ahead) == 0
    finally:
        batcher.close()


def _stuck_on_minus_one() -> tuple[StepBatcher, threading.Event, threading.Event, list[float]]:
    """A toy stage whose loop stops inside the step that carries -1 until ``gate`` is set
    (``started`` says it got there); ``ran``: every real row's value, in the order run."""
    gate, started = threading.Event(), threading.Event()
    ran: list[float] = []

    def make(bucket, columns, write_pos, inputs):
        (x,) = inputs

        def step():
            ran.extend(float(v) for v, p in zip(x[:, 0], write_pos) if int(p) != 99)
            if -1.0 in ran:
                started.set()
                gate.wait(5)
            return (x,)

        return step

    batcher = StepBatcher("toy", make, [RowInput((1,), "float32")], capacity=4, device="cpu", scratch=99,
                          graphs=False, gather_s=0.0)
    return batcher, gate, started, ran


def test_a_step_that_timed_out_leaves_the_queue_and_a_withdraw_keeps_one_deadline():
    """A session that gave up on a step (its deadline passed while the loop was stuck) takes it
    out of the queue, so it never runs later; withdrawing several running steps waits once for
    the step deadline, not once per step."""
    batcher, gate, started, ran = _stuck_on_minus_one()
    batcher.step_timeout_s = 1.0
    blocker = threading.Thread(target=lambda: pytest.raises(TimeoutError, batcher.step, (torch.tensor([-1.0]),), 3))
    try:
        blocker.start()
        assert started.wait(5)
        late = batcher.submit((torch.tensor([7.0]),), slot=1)
        with pytest.raises(TimeoutError):
            batcher.result(late)
        assert late not in batcher._queue
        # two requests that will not finish in time (the loop is stuck): one deadline for both
        stuck = [batcher.submit((torch.tensor([8.0 + k]),), slot=2) for k in range(2)]
        with batcher._cond:
            batcher._queue = [r for r in batcher._queue if r not in stuck]  # as if running
        begun = time.monotonic()
        with pytest.raises(TimeoutError):
            batcher.withdraw(stuck)
        assert time.monotonic() - begun < 1.7  # not 2 x 1.0 s
    finally:
        gate.set()
        blocker.join(5)
        batcher.close()
    assert 7.0 not in ran


def test_a_closed_session_gives_its_slots_back_even_when_a_stage_cannot_stop(pair):
    """A stage whose close fails (a step that did not finish in time) still lets the session's
    slots go: the model does not lose capacity for good."""
    batched = pair["batched"]
    session = batched.open_session()

    def stuck() -> None:
        raise TimeoutError("thinker: a running step did not finish within 60 s")

    session.thinker.close = stuck
    with pytest.raises(TimeoutError):
        session.close()
    assert batched.batching.stats()["in_use"] == 0
    assert session not in batched._sessions


def test_a_live_talker_waiting_for_its_next_token_is_neither_streaming_nor_paced(pair):
    """Between two tokens a live talker is outside the talker's count (the batched talker does
    not wait for it) and not among the replies held back for pacing (a gauge operators read)."""
    batched = pair["batched"]
    session = batched.open_session()
    activity = batched.batching.talker.activity
    cancelled = threading.Event()
    waiting = threading.Thread(target=lambda: list(session.talker.talk_live(cancelled)))
    try:
        waiting.start()
        time.sleep(0.2)  # inside talk_live, no token fed yet
        assert waiting.is_alive()
        assert (activity.count, activity.paused_count) == (0, 0)
    finally:
        cancelled.set()
        waiting.join(5)
        session.close()


def test_closing_a_reply_while_its_first_frame_queues_steps_withdraws_them():
    """A barge-in that closes a reply's talker stream while its first frame is still queueing
    steps ahead (holding the session's step lock, its lookahead just made) waits for that frame
    and withdraws what it queued: nothing of the closed reply runs after the close, and the stage
    no longer expects a first step of it."""
    from types import SimpleNamespace

    from realtime_omni.engines.omni.talker_stream import TalkerStream

    batcher, gate, started, ran = _stuck_on_minus_one()
    stream = TalkerStream.__new__(TalkerStream)  # only what close() touches
    stream.step_lock, stream.ahead, stream.done, stream.logits = threading.Lock(), None, False, None
    stream.rows = SimpleNamespace(batcher=batcher, slot=1)
    batcher.expect_s = 0.5
    batcher.expect([1, 2], within_s=30.0)  # its reply was prefilled with another's
    first_frame_queued = threading.Event()

    def first_frame() -> None:  # what _fused_frame does under the lock, for a reply's first frame
        with stream.step_lock:
            first_frame_queued.set()
            time.sleep(0.2)  # the close arrives meanwhile
            stream.ahead = Lookahead(batcher, slot=1, depth=3)
            for k in range(3):
                stream.ahead.push((torch.tensor([50.0 + k]),), write_pos=10 + k)

    blocker = threading.Thread(target=batcher.step, args=((torch.tensor([-1.0]),),), kwargs={"slot": 3})
    frame = threading.Thread(target=first_frame)
    try:
        blocker.start()
        assert started.wait(5)  # the loop is busy: the frame's steps stay queued
        frame.start()
        assert first_frame_queued.wait(5)
        stream.close()
        assert stream.ahead is not None and len(stream.ahead) == 0
        assert set(batcher._expected) == {2}
    finally:
        gate.set()
        frame.join(5)
        blocker.join(5)
        batcher.close()
    assert not [v for v in ran if 50 <= v < 60]


def test_in_graph_code_picking_matches_the_sampler():
    """Greedy: the batched pick equals TokenSampler (penalty over seen codes, suppressed ids);
    sampled: every draw stays inside the top-k of the penalized scores."""
    from realtime_omni.engines.omni.batching.talker_frames import pick_codes
    from realtime_omni.engines.omni.talker_stream import CodeSampling

    gen = torch.Generator().manual_seed(0)
    vocab, rows = 64, 16
    logits = torch.randn((rows, vocab), generator=gen) * 3
    histories = [torch.randint(0, vocab, (1, 5), generator=gen) for _ in range(rows)]
    seen = torch.zeros((rows, vocab), dtype=torch.bool)
    for r, h in enumerate(histories):
        seen[r, h[0]] = True
    suppress_ids = [3, 7, 60]
    suppress = torch.zeros(vocab, dtype=torch.bool)
    suppress[suppress_ids] = True
    greedy = CodeSampling(do_sample=False, temperature=0.9, top_k=8, top_p=0.8, repetition_penalty=1.3,
                          suppress=tuple(suppress_ids), eos=frozenset())
    picked = pick_codes(logits, seen, suppress, torch.zeros((rows, 8)), greedy)
    sampler = greedy.sampler(None)
    assert picked.tolist() == [sampler(logits[r : r + 1], histories[r]) for r in range(rows)]
    sampled = CodeSampling(**{**greedy.__dict__, "do_sample": True})
    penalized = torch.where(seen, torch.where(logits < 0, logits * 1.3, logits / 1.3), logits).masked_fill(suppress, -1e9)
    top = penalized.topk(8, dim=-1).indices
    for _ in range(20):
        draw = pick_codes(logits, seen, suppress, torch.rand((rows, 8), generator=gen), sampled)
        assert all(int(draw[r]) in top[r].tolist() for r in range(rows))
        assert not suppress[draw].any()


def test_greedy_rows_hand_their_draws_as_host_values_and_the_loop_stacks_them_once(pair):
    """A greedy stage's draws are zeros: as host values every row's become one tensor in the
    loop (on a GPU, one copy to the device per step instead of one per row)."""
    batching = pair["batched"].batching
    for state, batcher in ((batching.thinker_tokens, batching.thinker), (batching.talker_frames, batching.talker)):
        if state.rule.do_sample:
            continue
        draws = state.draws(None).next()
        assert isinstance(draws, list) and set(draws) == {0.0}
        reqs = [type("R", (), {"inputs": batcher._row(row)})() for row in
                [tuple(spec_value(spec, draws) for spec in batcher.row_inputs) for _ in range(3)]]
        stacked = batcher._stacked(len(batcher.row_inputs) - 1, reqs, torch.float32)
        assert stacked.shape == (3, len(draws)) and stacked.dtype == torch.float32 and not stacked.any()


def test_a_sessions_draws_come_a_block_of_steps_at_a_time_from_its_generator():
    """Sampled: step i of each block is row i of one draw of (rows, width) from the session's
    generator (so a seed gives the same draws, a GPU launches once per block); greedy: zeros."""
    from realtime_omni.engines.omni.batching.rows import DrawBlocks

    draws = DrawBlocks(5, True, "cpu", torch.Generator().manual_seed(7), rows=4)
    got = torch.stack([draws.next() for _ in range(6)])
    reference = torch.Generator().manual_seed(7)
    expected = torch.cat([torch.rand((4, 5), generator=reference), torch.rand((4, 5), generator=reference)])[:6]
    assert torch.equal(got, expected)
    assert len({tuple(row.tolist()) for row in got}) == 6
    greedy = DrawBlocks(3, False, "cpu", None)
    assert greedy.next() == [0.0, 0.0, 0.0] and greedy.next() is greedy.next()


def spec_value(spec, draws):
    """A row's host value for an input of ``spec`` (the draws for the last one)."""
    return draws if spec.dtype == "float32" and spec.shape == (len(draws),) else [0] * spec.shape[0]


def test_sampled_batched_replies_are_reproducible_per_seed(tmp_path):
    """Sampling in the batch draws from each session's own generator: same seed, same reply
    (whatever else the batch holds; whether another seed changes the codes depends on how peaked
    the tiny model's distributions are, so that is checked on the picking function above)."""
    save_checkpoint("qwen3_omni_moe", tmp_path)
    model = OmniModel(tmp_path, OmniSettings(thinker_do_sample=True, talker_do_sample=True, seed=0,
                                             talker_max_frames=24, max_sessions=2, **CHUNKS["qwen3_omni_moe"]))
    model.load()
    try:
        runs = []
        for seed in (0, 0):
            model.seed = seed
            session = model.open_session()
            try:
                outputs, chunks, _, _ = run_turn(session, request([TurnMessage(role="user", text="hi")], max_tokens=6))
            finally:
                session.close()
            # the thinker's tokens after the first are drawn on the device, in the batched step
            tokens = [o.hidden.token_id for o in outputs if o.hidden.token_id is not None and o.hidden.token_id >= 0]
            assert len(tokens) >= 2 and all(0 <= t < model.loaded.thinker.lm_head.weight.shape[0] for t in tokens)
            runs.append((tokens, [c.codes.codes.tolist() for c in chunks if c.codes is not None]))
        assert runs[0][1] and runs[0] == runs[1]
    finally:
        model.close()


def _meet_in_the_codec(codec, render: list) -> dict:
    """``render`` (callables) from threads that queue while the codec's loop is busy with a
    blocker; returns the batcher's stats before and after and each call's result."""
    busy, release = threading.Event(), threading.Event()

    def hold(x):
        busy.set()
        release.wait(30)
        return x

    out: dict[int, np.ndarray] = {}
    blocker = threading.Thread(target=codec.batcher.run, args=("blocker", hold, (torch.zeros(1, 1),), False))
    threads = [threading.Thread(target=lambda i=i: out.__setitem__(i, render[i]())) for i in range(len(render))]
    try:
        blocker.start()
        assert busy.wait(30)
        before = codec.batcher.stats()
        for th in threads:
            th.start()
        deadline = time.monotonic() + 30
        while len(codec.batcher._queue) < len(render) and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        release.set()
        for th in [blocker, *threads]:
            th.join(60)
    return {"before": before, "after": codec.batcher.stats(), "out": out}


@pytest.mark.parametrize("padded", [False, True], ids=["exact", "padded-to-bucket"])
def test_codec_windows_of_several_sessions_decode_together(pair, padded):
    """Same-shape windows from several sessions go through the codec in one pass and each gets
    what it would get alone (Qwen2.5: DiT + BigVGAN with each window's own speaker, two speakers
    in one batch; Qwen3: code2wav). Padded: the group of three runs as a bucket of four (as it
    replays a captured graph on CUDA)."""
    codec = pair["batched"].codec
    assert codec.batcher is not None
    codec.batcher.pad_groups = padded
    padded_before = codec.batcher.padded_rows
    high = codec.max_code + 1
    shape = (24,) if codec.arch == "qwen2_5_omni" else (6, codec.groups)
    gen = torch.Generator().manual_seed(3)
    windows = [torch.randint(0, high, shape, generator=gen) for _ in range(3)]
    names = sorted(codec.loaded.speakers) if codec.arch == "qwen2_5_omni" else [None]
    speakers = [names[i % len(names)] for i in range(3)]
    assert codec.arch != "qwen2_5_omni" or len(set(speakers)) == 2
    alone = [codec.render(w, 0, speakers[i], 5 + i) for i, w in enumerate(windows)]
    if codec.arch == "qwen2_5_omni":  # the speaker is heard: the same window in the other voice differs
        other = codec.render(windows[1], 0, speakers[0], 6)
        assert np.abs(other - alone[1]).max() > 1e-3 * np.abs(alone[1]).max()
    # the three meet for sure: they queue while the loop is busy with a window of another shape
    try:
        met = _meet_in_the_codec(codec, [lambda i=i: codec.render(windows[i], 0, speakers[i], 5 + i) for i in range(3)])
    finally:
        codec.batcher.pad_groups = False
    before, out = met["before"], met["out"]
    after = met["after"]
    # the blocker (one window) and the three (one pass)
    assert after["rows"] - before["rows"] == 4 and after["steps"] - before["steps"] == 2
    assert codec.batcher.padded_rows - padded_before == (1 if padded else 0)
    # no CUDA graph off the GPU: every window is counted as decoded eagerly
    # (the blocker was tallied as it started, before ``before``)
    assert after["eager_rows"] - before["eager_rows"] == 3 and after["graph_rows"] == before["graph_rows"]
    for i in range(3):
        assert out[i].shape == alone[i].shape
        # relative to the window's level (the tiny Qwen2.5 vocoder's output is about 1e-9)
        np.testing.assert_allclose(out[i], alone[i], rtol=0, atol=1e-6 * np.abs(alone[i]).max())


@pytest.mark.parametrize("mix", [True, False], ids=["one-pass", "a-pass-per-length"])
def test_qwen25_windows_of_different_lengths_decode_in_one_pass(pair, mix):
    """Qwen2.5 windows of three lengths (a reply's first window beside others further on) and two
    speakers: one DiT pass for all of them (each padded to the longest), and each window's audio
    is what it is alone. With mixing off, a pass per length (the same audio)."""
    codec = pair["batched"].codec
    if codec.arch != "qwen2_5_omni":
        pytest.skip("Qwen3's code2wav windows decode by shape")
    gen = torch.Generator().manual_seed(8)
    windows = [torch.randint(0, codec.max_code + 1, (n,), generator=gen) for n in (12, 30, 18)]
    names = sorted(codec.loaded.speakers)
    speakers = [names[i % len(names)] for i in range(3)]
    alone = [codec.render(w, 4 * i, speakers[i], 5) for i, w in enumerate(windows)]
    mixer = codec.batcher.mixer
    learnt = mixer.fixed_ms, mixer.per_code_ms
    codec.batcher.mix = mix
    mixer.fixed_ms = math.inf  # every length worth mixing (the cost model is tested below)
    try:
        met = _meet_in_the_codec(codec, [lambda i=i: codec.render(windows[i], 4 * i, speakers[i], 5) for i in range(3)])
    finally:
        codec.batcher.mix = True
        mixer.fixed_ms, mixer.per_code_ms = learnt
    before, after = met["before"], met["after"]
    assert after["rows"] - before["rows"] == 4  # the blocker and the three
    assert after["steps"] - before["steps"] == (2 if mix else 4)
    assert after["mixed_passes"] - before["mixed_passes"] == (1 if mix else 0)
    assert after["mixed_padded_codes"] - before["mixed_padded_codes"] == (18 + 12 if mix else 0)
    for i in range(3):
        got = met["out"][i]
        assert got.shape == alone[i].shape
        np.testing.assert_allclose(got, alone[i], rtol=0, atol=1e-6 * np.abs(alone[i]).max())


def test_a_codec_pass_mixes_only_the_lengths_whose_padding_costs_less_than_a_pass_of_their_own():
    """The cost model from the load's group times (H100, Qwen2.5: a 78-code window 91 ms alone,
    569 ms for 32): three urgent first windows (12 codes) beside 13 steady ones go in one pass;
    13 urgent first windows beside 3 steady ones do not (the steady ones wait for the next
    pass). Before any measurement every length mixes; a measurement without a lone window
    teaches nothing."""
    from types import SimpleNamespace

    from realtime_omni.engines.omni.codec_mixing import MixedWindows
    from realtime_omni.engines.omni.shape_graphs import ShapeGraphs

    mixer = MixedWindows(SimpleNamespace(windows=ShapeGraphs(device=torch.device("cpu")), key_prefix=("t2w",)),
                         (2, 4, 8, 16, 32))

    def windows(*counts: tuple[int, int]) -> list[tuple]:
        return [("t2w", n) for n, rows in counts for _ in range(rows)]

    def lengths(chosen: list[tuple]) -> dict[int, int]:
        return dict(collections.Counter(key[-1] for key in chosen))

    length = lambda key: key[-1]  # noqa: E731
    assert lengths(mixer.choose(windows((12, 13), (78, 3)), length)) == {12: 13, 78: 3}  # not measured yet
    mixer.learn({2: 101.0, 32: 569.4}, 78)  # no lone window: nothing learnt
    assert math.isinf(mixer.fixed_ms)
    mixer.learn({1: 90.6, 2: 101.0, 4: 133.5, 8: 186.8, 16: 303.8, 32: 569.4}, 78)
    assert 70 < mixer.fixed_ms < 80 and 0.18 < mixer.per_code_ms < 0.22
    assert lengths(mixer.choose(windows((12, 3), (78, 13)), length)) == {12: 3, 78: 13}
    assert lengths(mixer.choose(windows((12, 13), (78, 3)), length)) == {12: 13}
    # the order is kept: the most urgent length first, then the others by urgency
    assert [k[-1] for k in mixer.choose(windows((54, 2), (42, 2), (12, 1)), length)] == [54, 54, 42, 42, 12]


@pytest.mark.parametrize("mix", [True, False], ids=["gathers-the-next-windows", "one-length-at-once"])
def test_after_a_pass_the_codec_waits_for_the_windows_its_sessions_send_next(mix):
    """Mixing lengths: a window left queued by a pass waits for the windows that arrive right
    after it (sessions whose last window just came back send their next), and all go in one
    pass. Without mixing, the window left queued goes at once, alone."""
    from realtime_omni.engines.omni.batching.codec_windows import CodecBatcher
    from realtime_omni.engines.omni.shape_graphs import ShapeGraphs

    passes: list[list[int]] = []

    class Mixer:
        lengths: list[int] = []

        def family(self, key):
            return "all"

        def choose(self, group):
            return list(group)

        def run(self, inputs, lengths):
            passes.append(sorted(lengths))
            return [x + 1 for x, in inputs], False

        def stats(self):
            return {}

    batcher = CodecBatcher(ShapeGraphs(device=torch.device("cpu")), None, gather_s=0.3, burst_s=1.0)
    batcher.mixer, batcher.mix = Mixer(), mix
    busy, release, alone_started = threading.Event(), threading.Event(), threading.Event()

    def window(n: int):
        def fn(x):
            if n == 0:
                busy.set()
                release.wait(10)
            if n == 1:
                alone_started.set()
            passes.append([n])
            return x + 1
        return fn

    def send(n: int) -> threading.Thread:
        th = threading.Thread(target=batcher.run, args=(("w", n), window(n), (torch.zeros(1, 2),), False, time.monotonic()))
        th.start()
        return th

    threads = [send(0)]
    try:
        assert busy.wait(10)
        threads.append(send(1))  # left queued by the blocker's pass
        deadline = time.monotonic() + 10
        while len(batcher._queue) < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        release.set()
        threads[0].join(10)  # the blocker's pass is over: its session sends its next window
        if not mix:
            assert alone_started.wait(10)
        threads.append(send(2))
    finally:
        release.set()
        for th in threads:
            th.join(10)
        batcher.close()
    assert passes == ([[0], [1, 2]] if mix else [[0], [1], [2]])


def test_an_isolated_omni_worker_refuses_a_session_beyond_its_slots(tmp_path, monkeypatch):
    """The server's default: the model in a worker process, built with the settings it was handed
    (not its environment). Its slot count travels with the model's info, so the server refuses
    the extra session at once, before any call."""
    from realtime_omni.engines.base import ModelAtCapacity
    from realtime_omni.engines.worker import IsolatedModel

    save_checkpoint("qwen2_5_omni", tmp_path)
    # the spawned worker inherits this environment: its settings must not come from there
    monkeypatch.setenv("REALTIME_OMNI_OMNI_MAX_SESSIONS", "5")
    monkeypatch.setenv("REALTIME_OMNI_ENGINES__OMNI__MAX_SESSIONS", "5")
    model = IsolatedModel(f"omni:{tmp_path}", engines=EngineSettings(omni=OmniSettings(
        max_sessions=1, talker_do_sample=False, seed=0, talker_max_frames=40, **CHUNKS["qwen2_5_omni"])))
    model.load()
    try:
        assert model.info.max_sessions == 1
        assert model.stats()["slots"] == {"total": 1, "in_use": 0, "speaking": 0, "paced": 0}  # from the worker
        first = model.open_session()
        with pytest.raises(ModelAtCapacity, match="1 session slots"):
            model.open_session()
        first.close()
        session = model.open_session()  # the slot came back
        # a turn evaluated ahead of its reply, across the process boundary
        messages = [TurnMessage(role="user", audio=user_audio(0.3, seed=2))]
        assert session.prefill(request(messages, max_tokens=2)) > 10
        outputs = list(session.think(request(messages, max_tokens=2)))
        assert outputs[0].prefilled_tokens == 3  # only <|im_start|>assistant\n was left
        # the talker takes every output: decided here, without a round trip to the worker
        with monkeypatch.context() as patch:
            patch.setattr(session, "_call_now", lambda *a: pytest.fail("talk_boundary asked the worker"))
            assert session.talk_boundary(outputs, final=False) == len(outputs)
        # the outputs came through the pipe without tensors; the worker's talker still speaks them
        spoken = list(session.talk(outputs, "alloy", threading.Event(), True))
        assert spoken[-1].final and any(out.codes is not None and len(out.codes) for out in spoken)
        # the same reply again, fed live: one talk_live stream, the outputs handed over by calls
        assert session.talks_live  # the worker's traits carry the model's setting
        outputs = list(session.think(request(messages, max_tokens=2)))
        session.talk_more(outputs[:1], "alloy", final=False, first=True)
        live = session.talk_live(threading.Event())
        session.talk_more(outputs[1:], "alloy", final=True)
        again = list(live)
        assert again[-1].final and any(out.codes is not None and len(out.codes) for out in again)
        session.close()
    finally:
        model.close()


def test_long_prefills_run_in_chunks_and_give_the_same_reply(pair):
    """A text prefill longer than the chunk size runs in several batches (the other sessions'
    steps can run between them) and the reply is exactly the one of a session alone."""
    batched, alone = pair["batched"], pair["alone"]
    expected = _alone(alone, 2, cut=False)
    prefills = (batched.batching.prefill, batched.batching.talker_prefill)
    before = [p.stats()["steps"] for p in prefills]
    for p in prefills:
        p.chunk_tokens = 5
    try:
        session = batched.open_session()
        try:
            got = _conversation(session, 2, cut=False)
        finally:
            session.close()
    finally:
        for p in prefills:
            p.chunk_tokens = 512
    _same(got, expected)
    # two turns, each prefill in several chunks (the first thinker prefill carries audio: whole)
    assert prefills[0].stats()["steps"] - before[0] >= 3
    assert prefills[1].stats()["steps"] - before[1] >= 4


@pytest.mark.parametrize("arch", ARCHS)
def test_steps_attend_over_as_many_columns_as_their_longest_row_needs(arch, tmp_path):
    """A step reads the first 256 columns of its rows while every context fits there, more once
    one row's context passes them (a long conversation batched with a short one), and each
    session still gets exactly what it gets alone."""
    save_checkpoint(arch, tmp_path)
    common = dict(talker_do_sample=False, seed=0, talker_max_frames=40, cache_tokens=700, **CHUNKS[arch])
    batched = OmniModel(tmp_path, OmniSettings(max_sessions=2, **common))
    alone = OmniModel(tmp_path, OmniSettings(max_sessions=0, **common))
    batched.load()
    alone.load()
    try:
        assert batched.batching.thinker_pool.column_buckets() == [256, 701]
        long_text = " ".join(f"item {k} of the list is number {k * 7}" for k in range(10))
        turns = {0: [TurnMessage(role="user", text=long_text)], 1: [TurnMessage(role="user", text="hi there")]}

        def reply(model: OmniModel, i: int) -> dict:
            session = model.open_session()
            try:
                outputs, chunks, audio, _ = run_turn(session, request(turns[i], max_tokens=8))
            finally:
                session.close()
            return {"tokens": [o.hidden.token_id for o in outputs], "prefilled": outputs[0].prefilled_tokens,
                    "codes": [c.codes.codes.tolist() for c in chunks if c.codes is not None],
                    "audio": np.concatenate(audio) if audio else np.zeros(0, np.int16)}

        expected = {i: reply(alone, i) for i in turns}
        assert 256 < expected[0]["prefilled"] < 600 and expected[1]["prefilled"] < 200
        got: dict[int, dict] = {}
        short_only = reply(batched, 1)  # alone on the batched stages: every step within 256 columns
        assert set(batched.batching.thinker.stats()["columns_steps"]) == {256}
        threads = [threading.Thread(target=lambda i=i: got.__setitem__(i, reply(batched, i))) for i in turns]
        for th in threads:
            th.start()
        for th in threads:
            th.join(300)
        for i in turns:
            assert got[i]["tokens"] == expected[i]["tokens"] and got[i]["codes"] == expected[i]["codes"]
            assert np.array_equal(got[i]["audio"], expected[i]["audio"])
        assert short_only["tokens"] == expected[1]["tokens"]
        for stage, pool in ((batched.batching.thinker, batched.batching.thinker_pool),
                            (batched.batching.talker, batched.batching.talker_pool)):
            assert set(stage.stats()["columns_steps"]) == {256, pool.length + 1}, stage.name
    finally:
        batched.close()
        alone.close()


def test_column_buckets_of_a_slot_pool():
    from realtime_omni.engines.omni.batching.slots import RowsCache, SlotPool

    config = type("Cfg", (), {"num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1,
                              "head_dim": 4, "hidden_size": 8})()
    assert SlotPool(config, 2, 8192, "cpu", torch.float32, "t").column_buckets() == [256, 1024, 4096, 8193]
    pool = SlotPool(config, 2, 100, "cpu", torch.float32, "t")
    assert pool.column_buckets() == [101]  # shorter than the first bucket: the whole slot
    assert pool.columns_for(3) == 101
    for bad in (0, 102):
        with pytest.raises(ValueError, match="columns"):
            RowsCache(pool, 2, torch.zeros(2, dtype=torch.long), bad)


def test_prefill_buckets_are_the_smallest_that_hold_a_batch_within_the_token_budget():
    from types import SimpleNamespace

    from realtime_omni.engines.omni.batching.prefill_graphs import BucketKey, PrefillGraphs
    from realtime_omni.engines.omni.batching.slots import SlotPool

    config = SimpleNamespace(num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, hidden_size=8)
    pool = SlotPool(config, slots=40, length=8192, device="cpu", dtype=torch.float32, name="thinker")
    loaded = SimpleNamespace(device=torch.device("cpu"), dtype=torch.float32)
    graphs = PrefillGraphs(loaded, pool, lambda x, columns: (), name="thinker prefill", dim=8, enabled=True,
                           max_rows=40, max_tokens=8192)
    assert graphs.rows == [1, 2, 4, 8, 16, 32, 40]  # the slot count is always a bucket
    assert graphs.columns == [256, 1024]
    keys = graphs.keys()
    assert all(k.rows * k.tokens <= 8192 and k.tokens <= k.columns for k in keys)
    assert BucketKey(40, 256, 256) not in keys  # over the token budget
    assert graphs.bucket(3, 100, 120) is None  # off the GPU nothing is captured
    graphs.pad = True
    assert graphs.bucket(3, 100, 120) == BucketKey(4, 128, 256)
    assert graphs.bucket(17, 30, 700) == BucketKey(32, 32, 1024)  # a later turn: more context columns
    assert graphs.bucket(1, 257, 300) is None  # longer rows, contexts beyond 1024 and more rows stay eager
    assert graphs.bucket(1, 10, 1025) is None
    assert graphs.bucket(41, 10, 20) is None


def test_a_pipelined_loop_hands_a_lone_step_over_at_once():
    """Nothing queued behind a step: its results are handed over without waiting for another."""
    import time

    batcher = _adder(4)
    batcher.pipelined = True
    batcher.idle_wait_s = 3.0  # (a step handed over only at the loop's next look would take that long)
    try:
        for _ in range(3):
            started = time.monotonic()
            (y,) = batcher.step((torch.ones(2),), slot=1, write_pos=2)
            assert y.tolist() == [3.0, 3.0]
            assert time.monotonic() - started < 1.5
    finally:
        batcher.close()


def test_reply_tokens_carry_no_tensors_to_the_talker_and_it_uses_the_thinkers_rows(pair, tmp_path):
    """A session's think and talk may run in different processes (the worker's pipe pickles each
    output): an output holds token ids and no tensor. The talker takes the reply's prompt and
    (Qwen2.5) each token's vector through the session, in the model's process; Qwen3's batched
    talker takes each reply token as its id, which its step embeds and projects itself."""
    import pickle

    batched = pair["batched"]
    other = batched.open_session()  # holds slot 0: the session's steps run in a bucket of 2 rows
    session = batched.open_session()
    try:
        outputs, chunks, _audio, _ = run_turn(session, request([TurnMessage(role="user", text="hi there")],
                                                               max_tokens=8))
        assert chunks and len(outputs) > 2
        assert outputs[0].hidden.opens and outputs[0].hidden.prompt is None
        for out in outputs:
            assert len(pickle.dumps(out)) < 1024, out
        stream = session.talker.stream
        if batched.loaded.arch != "qwen2_5_omni":
            tokens = [out.hidden.token_id for out in outputs if out.hidden.index >= 0]
            assert stream.assistant[len(stream.prompt.header_src):] == tokens
            assert session.thinker.token_rows._rows == {}  # no device rows were handed over
            return
        assert stream.vecs  # the rows were used
        for row in stream.vecs:  # own copies, not views that keep the whole batch's outputs alive
            assert row.untyped_storage().nbytes() == row.numel() * row.element_size()
    finally:
        session.close()
        other.close()


def _timed_reply(session, lead_s: float, cancel_after_s: float | None = None) -> tuple[list, list[float], float]:
    """The first turn's reply, thought first, then spoken in one ``talk()``: each chunk's codes
    and the time it came out; with ``cancel_after_s``, the reply is cancelled that long after its
    first chunk. Returns (codes per chunk, times, seconds the talk took after the cancel)."""
    settings = session.talker.settings  # the model's: restored below
    before = settings.pace_lead_s, settings.ignore_eos
    settings.pace_lead_s, settings.ignore_eos = lead_s, True  # every reply runs to the frame limit
    try:
        outputs = list(session.think(request(_turns(0)[0], max_tokens=8)))
        cancelled = threading.Event()
        codes, times, stopped = [], [], 0.0
        for chunk in session.talk(outputs, "alloy", cancelled, final=True):
            times.append(time.monotonic())
            codes.append(chunk.codes.codes.tolist())
            if cancel_after_s is not None and len(times) == 1:
                threading.Timer(cancel_after_s, cancelled.set).start()
        if cancelled.is_set():
            stopped = time.monotonic() - times[0] - cancel_after_s
        return codes, times, stopped
    finally:
        settings.pace_lead_s, settings.ignore_eos = before


def test_a_reply_paced_to_its_listener_stays_within_its_lead_and_says_the_same(pair):
    """With ``pace_lead_ms`` a reply's frames are made at most that far ahead of a listener who
    plays from its first chunk (frames queued ahead before that chunk may be more): the frames
    out by each chunk fit the clock, the codes are those of the reply made as fast as possible,
    and a barge-in still ends a paced reply at once."""
    batched = pair["batched"]
    queued = batched.batching.lookahead
    batched.batching.lookahead = 2  # sessions opened from here queue two frames ahead
    try:
        _paced_replies(batched)
    finally:
        batched.batching.lookahead = queued


def _paced_replies(batched: OmniModel) -> None:
    session = batched.open_session()
    try:
        fast, _, _ = _timed_reply(session, 0.0)
        session.confirm("")
    finally:
        session.close()
    frame_s = samples_per_code(batched.loaded) / 24_000
    total = sum(len(c) for c in fast)
    lead = 4 * frame_s
    assert total * frame_s > lead + 4 * frame_s, "the reply must be longer than the lead to be paced"
    seen: list[dict] = []  # the model's reply counts while the paced reply runs (what /metrics shows)
    done = threading.Event()

    def watch() -> None:
        while not done.wait(0.01):
            seen.append(dict(batched.stats()["slots"]))

    watcher = threading.Thread(target=watch)
    watcher.start()
    session = batched.open_session()
    try:
        paced, times, _ = _timed_reply(session, lead)
    finally:
        session.close()
        done.set()
        watcher.join(10)
    assert paced == fast
    assert max(c["paced"] for c in seen) == 1 and max(c["speaking"] for c in seen) == 1
    assert batched.stats()["slots"]["speaking"] == 0 and batched.stats()["slots"]["paced"] == 0
    made = np.cumsum([len(c) for c in paced])
    chunk = batched.talker_settings.chunk_frames  # the tests' chunking has no ramp
    for when, frames in zip(times[1:], made[1:], strict=True):
        heard = when - times[0]
        # frames out by now: what the listener has heard plus the lead, plus a chunk being built
        # and the two frames queued before the first chunk
        assert frames * frame_s <= heard + lead + (chunk + 3) * frame_s
    assert times[-1] - times[0] >= total * frame_s - lead - (chunk + 3) * frame_s - 0.05  # it did wait
    session = batched.open_session()
    try:
        _, _, stopped = _timed_reply(session, lead, cancel_after_s=0.05)
    finally:
        session.close()
    assert stopped < 0.5
    assert batched.batching.stats()["in_use"] == 0


def test_codec_windows_needed_soonest_are_decoded_first():
    """Windows pending together go earliest deadline first: a reply's first window (due now),
    then a reply about to run dry, then one seconds ahead of its listener, whatever order they
    came in; a window without a listener goes last."""
    from realtime_omni.engines.omni.batching.codec_windows import CodecBatcher
    from realtime_omni.engines.omni.shape_graphs import ShapeGraphs

    batcher = CodecBatcher(ShapeGraphs(device=torch.device("cpu")), None, gather_s=0.0)
    order: list[str] = []
    busy, release = threading.Event(), threading.Event()

    def window(name: str):
        def fn(x):
            if name == "blocker":
                busy.set()
                release.wait(10)
            order.append(name)
            return x + 1
        return fn

    now = time.monotonic()
    windows = [("no listener", None), ("ahead", now + 3.0), ("first", now), ("running low", now + 0.16)]
    threads = [threading.Thread(target=batcher.run, args=("blocker", window("blocker"), (torch.zeros(1, 2),), False))]
    threads[0].start()
    try:
        assert busy.wait(10)  # the loop is inside the blocker: the others queue up meanwhile
        for name, deadline in windows:
            args = (name, window(name), (torch.zeros(1, 2),), False) + (() if deadline is None else (deadline,))
            threads.append(threading.Thread(target=batcher.run, args=args))
            threads[-1].start()
        deadline_s = time.monotonic() + 10
        while len(batcher._queue) < len(windows) and time.monotonic() < deadline_s:
            time.sleep(0.01)
    finally:
        release.set()
        for th in threads:
            th.join(10)
        batcher.close()
    assert order == ["blocker", "first", "running low", "ahead", "no listener"]


def test_a_first_window_that_arrives_while_a_group_runs_goes_before_the_groups_left_waiting():
    """The codec runs one group of same-shape windows per pass: a new reply's first window that
    arrives while a group runs is decoded next, before the other groups queued with that one;
    windows of a waiting group's shape that arrive meanwhile join its batch."""
    from realtime_omni.engines.omni.batching.codec_windows import CodecBatcher
    from realtime_omni.engines.omni.shape_graphs import ShapeGraphs

    batcher = CodecBatcher(ShapeGraphs(device=torch.device("cpu")), None, gather_s=0.0)
    order: list[tuple[str, int]] = []
    busy, release = threading.Event(), threading.Event()
    started_a = threading.Event()

    def window(key: str, block: threading.Event | None = None, started: threading.Event | None = None):
        def fn(x):
            if started is not None:
                started.set()
            if block is not None:
                block.wait(10)
            order.append((key, int(x.shape[0])))
            return x + 1
        return fn

    now = time.monotonic()
    hold_a = threading.Event()

    def run(key, fn, deadline):
        threads.append(threading.Thread(target=batcher.run, args=(key, fn, (torch.zeros(1, 2),), False, deadline)))
        threads[-1].start()

    threads: list[threading.Thread] = []
    try:
        run("blocker", window("blocker", release, busy), now - 1)
        assert busy.wait(10)
        run("a", window("a", hold_a, started_a), now + 0.1)  # due soonest: runs next, and holds
        run("b", window("b"), now + 2.0)  # queued with "a", due later
        deadline_s = time.monotonic() + 10
        while len(batcher._queue) < 2 and time.monotonic() < deadline_s:
            time.sleep(0.01)
        release.set()
        assert started_a.wait(10)  # "a" runs; "b" waits in the queue
        run("first", window("first"), time.monotonic())  # a new reply's first window
        run("b", window("b"), now + 2.5)  # another window of b's shape
        while len(batcher._queue) < 3 and time.monotonic() < deadline_s:
            time.sleep(0.01)
        hold_a.set()
    finally:
        release.set()
        hold_a.set()
        for th in threads:
            th.join(10)
        batcher.close()
    assert order == [("blocker", 1), ("a", 1), ("first", 1), ("b", 2)]


def test_a_codec_stream_asks_for_its_first_window_now_and_later_ones_by_playback(pair):
    """The deadline a reply's codec stream gives each window: its first now, each later one when
    a listener playing from the first audio reaches the window's first new sample."""
    from realtime_omni.engines.omni.codec import OUTPUT_RATE

    codec = pair["batched"].codec
    asked: list[float] = []
    begin = codec.begin

    def recording(*args, **kwargs):
        asked.append(kwargs["deadline"])
        return begin(*args, **kwargs)

    codec.begin = recording  # the real window, its deadline noted
    try:
        stream = CodecStream.of(codec, turn=0, speaker=None, seed=0)
        groups = () if codec.arch == "qwen2_5_omni" else (codec.groups,)
        before = time.monotonic()
        later = []  # (deadline asked, when playback from the first audio reaches the window)
        for n, final in ((12, False), (12, False), (24, False), (0, True)):
            due = None if stream.started is None else stream.started + stream.emitted / OUTPUT_RATE
            count = len(asked)
            stream.push(torch.zeros((n, *groups), dtype=torch.long), final=final)
            if len(asked) > count and due is not None:
                later.append((asked[-1], due))
    finally:
        del codec.begin
    assert stream.started is not None and before <= asked[0] <= stream.started
    assert len(later) >= 2 and all(a == pytest.approx(d) for a, d in later)


def test_live_talkers_of_several_sessions_give_each_what_it_gets_alone(pair):
    """Three replies at once, each one talk_live call fed token by token (the server's path
    since the talker stopped being called once per token): the batched talker gives each the
    codes and audio it gets alone."""
    batched, alone = pair["batched"], pair["alone"]

    def codes(chunks):
        return [c.codes.codes.tolist() for c in chunks if isinstance(c.codes, CodeChunk) and len(c.codes)]

    expected = {}
    for i in range(3):
        session = alone.open_session()
        try:
            expected[i] = codes(run_turn(session, request(_turns(i)[0], max_tokens=8))[1])
        finally:
            session.close()
    results: dict[int, list] = {}
    errors: list[BaseException] = []

    def converse(i: int) -> None:
        session = batched.open_session()
        try:
            results[i] = codes(live_turn(session, request(_turns(i)[0], max_tokens=8))[1])
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)
        finally:
            session.close()

    threads = [threading.Thread(target=converse, args=(i,)) for i in range(3)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(120)
    assert not errors, errors
    assert results == expected and all(expected.values())
    assert batched.batching.stats()["in_use"] == 0


def test_a_pooled_cache_knows_its_length_on_the_host_without_reading_the_device():
    """A session's first prefill asks where its cache ends (write_position) and a new turn may
    crop it: in a slot pool both come from the host's count, so neither waits for the device's
    queue (the other sessions' prefills and steps)."""
    from realtime_omni.engines.omni.batching.slots import SlotPool
    from realtime_omni.engines.omni.graphs import StaticDecoder

    text = qwen3_config().thinker_config.text_config
    pool = SlotPool(text, slots=2, length=64, device="cpu", dtype=torch.float32, name="thinker")
    decoder = StaticDecoder(text, 64, "cpu", graphs=False, pool=pool, slot=pool.allocate())
    cache = decoder._cache
    reads = []
    device_length = cache.get_seq_length
    cache.get_seq_length = lambda *a: reads.append(1) or device_length(*a)
    assert decoder.write_position() == 0
    decoder.advance(12)  # a batched prefill wrote 12 tokens
    decoder.advance()  # and a batched step one more
    decoder.crop(20)  # longer than the cache: nothing to cut
    assert decoder.write_position() == 13
    decoder.crop(9)  # a barge-in cut
    assert decoder.write_position() == 9 and reads == []
    assert decoder.length == 9  # the device agrees (read once, here)
    decoder.advance(3)
    decoder.crop(0)
    assert decoder.write_position() == 0 and decoder.length == 0


def test_the_warm_up_prefills_a_spoken_turn_alone_and_several_at_once_and_frees_their_slots(tmp_path):
    """The first prefills of a process pay one-time costs (seconds on the H200): on CUDA the model
    pays them while it loads (``warm_prefills``), with throw-away sessions prefilling one, two,
    then four at once through the batched prefills, and gives every slot back."""
    from realtime_omni.engines.omni.warmup import SIZES, warm_prefills

    save_checkpoint("qwen3_omni_moe", tmp_path)
    messages: list[str] = []
    model = OmniModel(tmp_path, OmniSettings(talker_do_sample=False, seed=0, max_sessions=4,
                                             **CHUNKS["qwen3_omni_moe"]))
    real, lock, flying, most = model.open_session, threading.Lock(), [0], [0]

    def counted():  # how many of the warm-up's prefills run at the same time
        session = real()
        prefill = session.prefill

        def run(req):
            with lock:
                flying[0] += 1
                most[0] = max(most[0], flying[0])
            try:
                return prefill(req)
            finally:
                with lock:
                    flying[0] -= 1

        session.prefill = run
        return session

    model.load()
    try:
        assert model.batching.prefill.stats()["requests"] == 0  # on the CPU, not at load
        model.open_session = counted
        assert warm_prefills(model, progress=messages.append) == list(SIZES)
        model.open_session = real
        thinker = model.batching.prefill.stats()
        assert thinker["requests"] == thinker["rows"] == sum(SIZES) == 7
        assert most[0] == 4  # (each prefill waits for the batch's gathering: they overlap)
        assert model.batching.talker_prefill.stats()["requests"] == 7
        assert model.batching.thinker_pool.in_use == 0 and model.open_sessions == 0
        assert any(m.startswith("prefills warmed up: 1 in") for m in messages), messages
    finally:
        model.close()


def test_a_model_with_random_weights_warms_up_as_a_loaded_one(tmp_path, monkeypatch):
    """The GPU benchmarks build their models with random weights (``OmniModel.random``) and must
    meet what a server's first users meet: that path runs the load's warm-up too (it did not, and
    a capacity run's first level of 8 paid a 2.9 s first prefill that the server pays at load)."""
    warmed: list[tuple[str, OmniModel]] = []

    def warm_up(self, progress=lambda _msg: None):
        warmed.append(("random" if self.path is None else "load", self))

    monkeypatch.setattr(OmniModel, "warm_up", warm_up)
    model = OmniModel.random(qwen3_config(), OmniSettings(device="cpu", dtype="float32", seed=0, max_sessions=2))
    try:
        assert warmed == [("random", model)]
    finally:
        model.close()
    save_checkpoint("qwen3_omni_moe", tmp_path)
    loaded = OmniModel(tmp_path, OmniSettings(seed=0, max_sessions=2))
    loaded.load()
    try:
        assert warmed[1:] == [("load", loaded)]
    finally:
        loaded.close()


def test_the_heap_of_a_load_is_frozen_out_of_the_collectors_full_passes():
    """On CUDA the warm-up ends with ``freeze_heap``: what the load left alive is no longer scanned
    by a full collection, which holds the interpreter lock and so stops every loop at once."""
    import gc

    from realtime_omni.engines.omni.warmup import freeze_heap

    messages: list[str] = []
    kept = [object() for _ in range(1000)]  # (tracked containers: lists)
    kept = [[x] for x in kept]
    try:
        took = freeze_heap(messages.append)
        assert took > 0.0 and gc.get_freeze_count() >= len(kept)
        (message,) = messages
        frozen = int(message.split()[2])  # (objects freed since leave the frozen set: it only shrinks)
        assert frozen >= gc.get_freeze_count() and message == (
            f"heap frozen: {frozen} objects out of the collector's sight "
            f"(a full collection over them took {1000 * took:.0f} ms)")
        began = time.perf_counter()
        gc.collect()
        assert time.perf_counter() - began < 0.5 * took  # (the frozen heap is not scanned again)
    finally:
        gc.unfreeze()  # the other tests' models are collected as before
    assert gc.get_freeze_count() == 0


def test_a_warm_up_that_fails_is_reported_and_leaves_the_model_usable(tmp_path):
    """A warm-up round that raises stops the warm-up with a message; the sessions it opened are
    closed and the model serves turns as before."""
    from realtime_omni.engines.omni import warmup

    save_checkpoint("qwen3_omni_moe", tmp_path)
    model = OmniModel(tmp_path, OmniSettings(talker_do_sample=False, seed=0, max_sessions=4,
                                             **CHUNKS["qwen3_omni_moe"]))
    model.load()
    try:
        real = model.open_session

        def no_room(_request):
            raise RuntimeError("no room")

        def failing_second_round():
            session = real()
            if model.open_sessions > 1:  # the round of two
                session.prefill = no_room
            return session

        model.open_session = failing_second_round
        messages: list[str] = []
        ran = warmup.warm_prefills(model, progress=messages.append)
        model.open_session = real
        assert ran == [1] and messages == ["prefill warm-up stopped at 2 sessions (RuntimeError: no room)"]
        assert model.open_sessions == 0 and model.batching.thinker_pool.in_use == 0
        session = model.open_session()
        try:
            outputs, _chunks, _audio, _ = run_turn(session, request([TurnMessage(role="user", text="hi")], max_tokens=4))
            assert outputs
        finally:
            session.close()
    finally:
        model.close()


def test_a_batched_session_builds_its_cache_views_when_it_opens_not_in_its_first_turn(pair):
    """``prepare`` (run at session open on CUDA) builds the thinker's cache views on the
    session's slot, so a first turn's preparation does not; each layer's length is its own
    element of one tensor."""
    session = pair["batched"].open_session()
    try:
        thinker = session.thinker
        assert thinker.ctx.decoder is None
        thinker.prepare()
        decoder = thinker.ctx.decoder
        assert decoder is not None and decoder.slot == session.rows.thinker.slot
        layers = decoder._cache.layers
        assert len(layers) > 1 and [int(layer.cumulative_length) for layer in layers] == [0] * len(layers)
        with torch.inference_mode():
            layers[0].cumulative_length.add_(5)  # (what a layer's own update does)
            assert [int(layer.cumulative_length) for layer in layers] == [5] + [0] * (len(layers) - 1)
            layers[0].cumulative_length.zero_()
        outputs, _chunks, _audio, _ = run_turn(session, request([TurnMessage(role="user", text="hi")], max_tokens=4))
        assert outputs and thinker.ctx.decoder is decoder
    finally:
        session.close()


class _Store:
    """A codec window store that says which shapes it holds a CUDA graph for and runs the window's
    function (as a replay computes what the function does; CUDA graphs do not run on the CPU)."""

    def __init__(self, held, enabled: bool = False):
        self.held, self.replays, self.enabled = set(held), [], enabled

    def has(self, key):
        return key in self.held

    def run(self, key, fn, inputs, capture=True):
        if key in self.held:
            self.replays.append((key, int(inputs[0].shape[0])))
        return fn(*inputs)


def test_a_small_group_of_windows_captured_only_alone_replays_them_one_by_one():
    """Windows of a shape with a graph for one window but none for groups (a reply's last window)
    replay that graph window by window when up to ``ALONE_REPLAYS`` of them come together; a
    larger group, or a shape with no graph at all, runs eagerly in one pass. Each window's result
    is its own either way. (CUDA graphs do not run on the CPU: the store here says which shapes
    it holds and runs the window's function, as a replay computes what the function does.)"""
    from realtime_omni.engines.omni.batching.codec_windows import ALONE_REPLAYS, CodecBatcher, WindowRequest

    calls: list[int] = []

    def fn(x):
        calls.append(int(x.shape[0]))
        return x * 2

    def group(n, key="last 85"):
        return [WindowRequest(key, fn, (torch.full((1, 3), float(i)),), False) for i in range(n)]

    store = _Store({"last 85"})
    batcher = CodecBatcher(store, None, gather_s=0.0)
    try:
        small = group(ALONE_REPLAYS)
        batcher._run_group(small)
        assert store.replays == [("last 85", 1)] * ALONE_REPLAYS and calls == [1] * ALONE_REPLAYS
        assert [float(r.result[0, 0]) for r in small] == [2.0 * i for i in range(ALONE_REPLAYS)]
        assert batcher.graph_rows == ALONE_REPLAYS and batcher.eager_rows == 0
        store.replays.clear(), calls.clear()
        large = group(ALONE_REPLAYS + 1)
        batcher._run_group(large)
        assert store.replays == [] and calls == [ALONE_REPLAYS + 1]
        assert [float(r.result[0, 0]) for r in large] == [2.0 * i for i in range(ALONE_REPLAYS + 1)]
        calls.clear()
        batcher._run_group(group(2, key="never captured"))
        assert store.replays == [] and calls == [2] and batcher.eager_rows == ALONE_REPLAYS + 3
    finally:
        batcher.close()


@pytest.mark.parametrize("mix", [True, False], ids=["mixer-graphs", "eager"])
def test_last_windows_of_replies_that_end_together_replay_the_mixers_graphs(mix):
    """A group of windows too large to replay one by one, of a shape with no group graph (the
    last windows of replies that end together), or a window of a length no graph holds: with
    lengths mixing on the GPU it goes through the mixer in one pass (padded to a captured length)
    instead of running eagerly."""
    from realtime_omni.engines.omni.batching.codec_windows import ALONE_REPLAYS, CodecBatcher, WindowRequest

    mixed: list[list[int]] = []

    class Mixer:
        def family(self, key):
            return "all" if key[0] == "t2w" else None

        def run(self, inputs, lengths):
            mixed.append(list(lengths))
            return [x * 2 for x, in inputs], True

        def stats(self):
            return {}

    calls: list[int] = []

    def fn(x):
        calls.append(int(x.shape[0]))
        return x * 2

    store = _Store({("t2w", 85)}, enabled=True)
    batcher = CodecBatcher(store, None, gather_s=0.0)
    batcher.mixer, batcher.mix = Mixer(), mix
    try:
        group = [WindowRequest(("t2w", 85), fn, (torch.full((1, 3), float(i)),), False) for i in range(ALONE_REPLAYS + 2)]
        batcher._run_group(group)
        assert [float(r.result[0, 0]) for r in group] == [2.0 * i for i in range(ALONE_REPLAYS + 2)]
        assert mixed == ([[85] * (ALONE_REPLAYS + 2)] if mix else [])
        assert calls == ([] if mix else [ALONE_REPLAYS + 2])
        assert (batcher.graph_rows, batcher.eager_rows) == ((ALONE_REPLAYS + 2, 0) if mix else (0, ALONE_REPLAYS + 2))
        # a shape the mixer does not take (Qwen3's) runs eagerly either way
        batcher._run_group([WindowRequest(("c2w", 8), fn, (torch.zeros(1, 3),), False) for _ in range(6)])
        assert calls[-1] == 6
        # one window: its own graph where it has one, else the mixer's (an odd length, as after a
        # replay from a barge-in), else eagerly
        mixed.clear(), calls.clear(), store.replays.clear()
        own, odd = (WindowRequest(("t2w", n), fn, (torch.ones(1, 3),), False) for n in (85, 37))
        batcher._run_one(own)
        batcher._run_one(odd)
        assert store.replays == [(("t2w", 85), 1)]  # (the store's replay runs the function)
        assert (mixed, calls) == (([[37]], [1]) if mix else ([], [1, 1]))
        assert float(own.result[0, 0]) == float(odd.result[0, 0]) == 2.0
    finally:
        batcher.close()


def test_a_codec_stream_sent_ahead_reads_what_it_reads_chunk_by_chunk(pair):
    """A reply's chunks sent as the talker makes them, read later, give the samples of the same
    chunks pushed one at a time; no more than IN_FLIGHT windows are at the codec at once (the
    rest go as windows come back), and a cut reply's windows leave nothing behind."""
    from realtime_omni.engines.omni import codec_stream

    codec = pair["batched"].codec
    groups = () if codec.arch == "qwen2_5_omni" else (codec.groups,)
    gen = torch.Generator().manual_seed(5)
    sizes = [2, 3, 4, 5, 5, 5]
    chunks = [torch.randint(0, codec.max_code + 1, (n, *groups), generator=gen) for n in sizes]
    starts = np.cumsum([0, *sizes[:-1]]).tolist()

    one_by_one = CodecStream.of(codec, turn=0, speaker=None, seed=4)
    expected = [one_by_one.push(c, start=s, final=i == len(chunks) - 1)
                for i, (c, s) in enumerate(zip(chunks, starts, strict=True))]

    ahead = CodecStream.of(codec, turn=0, speaker=None, seed=4)
    refs = [object() for _ in chunks]
    for i, (c, s, ref) in enumerate(zip(chunks, starts, refs, strict=True)):
        ahead.send(c, start=s, final=i == len(chunks) - 1, ref=ref)
        assert len(ahead._sent) <= codec_stream.IN_FLIGHT
    assert len(ahead._later) == len(chunks) - codec_stream.IN_FLIGHT
    got = [ahead.receive(ref) for ref in refs]
    assert sum(len(g) for g in got) > 0
    for g, e in zip(got, expected, strict=True):
        np.testing.assert_allclose(g, e, atol=1e-5)

    cut = CodecStream.of(codec, turn=1, speaker=None, seed=4)
    for c, s in zip(chunks[:4], starts[:4], strict=True):
        cut.send(c, start=s)
    cut.cancel()
    assert not cut._sent and not cut._later and cut.receive().size == 0
    with codec.batcher._cond:
        assert not codec.batcher._queue


def test_a_reply_sent_to_its_end_is_read_after_the_next_begins_and_a_cut_one_is_dropped(pair):
    """The talker's chunks go to the codec as they are made (``OmniSession._sending``), so a
    session may send the next reply's first chunk before its codec stage has read the last
    one's: the reply whose last chunk was sent is still read whole. A reply cut before its last
    chunk is dropped when the next one begins: its windows leave the codec's queue and its
    chunks read as silence."""
    batched = pair["batched"]
    codec = batched.codec
    groups = () if codec.arch == "qwen2_5_omni" else (codec.groups,)
    gen = torch.Generator().manual_seed(9)

    def out(turn: int, start: int, n: int, final: bool) -> TalkerOutput:
        codes = torch.randint(0, codec.max_code + 1, (n, *groups), generator=gen)
        return TalkerOutput(codes=CodeChunk(turn=turn, start=start, codes=codes, speaker=None, final=final),
                            final=final)

    session = batched.open_session()
    try:
        ended = [out(1, 0, 4, False), out(1, 4, 6, True)]
        cut = [out(2, 0, 4, False), out(2, 4, 6, False)]
        for _ in session._sending(iter(ended + cut)):
            pass
        assert all(session.decode(o).size > 0 for o in ended)
        cut_stream = session._codec_stream
        assert cut_stream is not None and cut_stream.turn == 2
        for _ in session._sending(iter([out(3, 0, 4, False)])):
            pass
        assert not cut_stream._sent and not cut_stream._later
        assert all(session.decode(o).size == 0 for o in cut)
    finally:
        session.close()
    with codec.batcher._cond:
        assert not codec.batcher._queue


def test_a_cut_reply_read_after_its_cancel_gives_silence_batched_or_not(pair):
    """A stream cancelled while its reader is about to read (the session began a newer reply, or
    closed): the batched codec's window reads as withdrawn, a window left to its reader as silence;
    neither raises anything else."""
    from realtime_omni.engines.omni.batching.mailbox import StepWithdrawn

    for name in ("batched", "alone"):
        codec = pair[name].codec
        groups = () if codec.arch == "qwen2_5_omni" else (codec.groups,)
        stream = CodecStream.of(codec, turn=0, speaker=None, seed=1)
        refs = [object(), object()]
        for i, ref in enumerate(refs):
            stream.send(torch.zeros((6, *groups), dtype=torch.long), start=6 * i, ref=ref)
        windows = [s.window for s in stream._sent]
        stream.cancel()
        for window in windows:
            try:
                wav = window.wait()
            except StepWithdrawn:
                assert name == "batched"
            else:  # a batched window a pass had already taken: its audio; a lazy one: silence
                assert name == "batched" or wav.size == 0
