"""The session runner's edges: a transport waiting to deliver input (the mailbox full) may be
cancelled (its connection dropped, a send timed out) without its bytes staying counted; a model
session slow to close does not leave the session half released."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time

import numpy as np

from realtime_omni.audio import Pcm
from realtime_omni.engines.echo import EchoModel
from realtime_omni.protocol.errors import ErrorCode
from realtime_omni.session.core import RealtimeSession
from realtime_omni.session.limits import RunnerLimits
from realtime_omni.session.runner import SessionRunner


async def test_a_cancelled_delivery_leaves_no_bytes_counted_and_the_next_one_gets_in():
    model = EchoModel()
    pool = concurrent.futures.ThreadPoolExecutor(1)
    # not started: nothing takes from the mailbox, which holds one message and 16 kB
    runner = SessionRunner(RealtimeSession(model.info, has_vad=False), None, pool, pool,
                           limits=RunnerLimits(mailbox_size=1, queue_bytes=16_000))
    try:
        frame = np.zeros(4_000, np.int16)  # 8 kB
        await runner.submit_audio(frame)  # fills the mailbox (one message)
        assert runner.inbox_bytes == 8_000
        waiting = asyncio.ensure_future(runner.submit_audio(frame))  # waits for room
        await asyncio.sleep(0.05)
        assert not waiting.done() and runner.inbox_bytes == 16_000
        waiting.cancel()
        await asyncio.gather(waiting, return_exceptions=True)
        assert runner.inbox_bytes == 8_000  # the undelivered frame's bytes left the count
        runner.mailbox.get_nowait()  # the session takes the first frame
        runner.inbox_bytes -= 8_000
        await asyncio.wait_for(runner.submit_audio(frame), 2)  # room again: delivered
        assert runner.mailbox.qsize() == 1 and runner.inbox_bytes == 8_000
    finally:
        runner.closed.set()
        pool.shutdown(wait=False)


async def test_a_model_slow_to_close_still_lets_the_session_end_and_is_closed_all_the_same():
    """``close`` stops waiting after 2 s; a model session whose close takes longer (a GPU step
    still finishing) must not leave the session half released: the manager hears of the close,
    the writer wakes, and the model's close completes in its thread."""
    model = EchoModel()
    pool = concurrent.futures.ThreadPoolExecutor(1)
    closed_model = threading.Event()
    session = model.open_session()
    real_close = session.close

    def slow_close() -> None:  # a stage still finishing its step
        time.sleep(3.0)
        real_close()
        closed_model.set()

    session.close = slow_close
    ended: list[SessionRunner] = []
    runner = SessionRunner(RealtimeSession(model.info, has_vad=False), session, pool, pool,
                           on_close=ended.append)
    try:
        runner.start()
        await asyncio.sleep(0.1)
        began = time.monotonic()
        await runner.close("client_closed")
        assert time.monotonic() - began < 6.0
        assert ended == [runner]  # the manager forgets it
        outs = []
        while not runner.outbox.empty():
            outs.append(runner.outbox.get_nowait())
        assert outs and outs[-1] is None  # the writer was woken to finish
        assert await asyncio.to_thread(closed_model.wait, 10)
    finally:
        pool.shutdown(wait=False)


async def test_a_turn_whose_prepared_transcript_is_dropped_keeps_its_words():
    """The turn ends while its prepared transcript (from a pause) is still being made; then the
    user speaks again and the prepared reply is dropped. The committed turn is transcribed
    afresh instead of failing with 'transcription was cancelled'."""
    from realtime_omni.session import actions as act
    from realtime_omni.session import inputs as inp

    model = EchoModel()
    pool = concurrent.futures.ThreadPoolExecutor(2)
    session = model.open_session()
    gate = threading.Event()
    calls: list[int] = []

    def transcribe(pcm16k) -> str:  # the ASR: slow for the prepared pass, then quick
        calls.append(1)
        if len(calls) == 1:
            gate.wait(10)
            return "prepared"
        return "hello again"

    session.transcribe = transcribe
    runner = SessionRunner(RealtimeSession(model.info, has_vad=False), session, pool, pool)
    pcm = np.zeros(16_000, np.int16)
    try:
        await runner.actions.perform(act.Speculate(1, pcm))
        await runner.actions.perform(act.Transcribe("item_1", pcm, spec_id=1))
        await asyncio.sleep(0.05)
        await runner.actions.perform(act.DropSpeculation(1))  # its transcript not made yet
        message = await asyncio.wait_for(runner.mailbox.get(), 10)
        assert isinstance(message, inp.Transcript)
        assert (message.item_id, message.text, message.error) == ("item_1", "hello again", None)
    finally:
        gate.set()
        for task in runner.actions.running():
            task.cancel()
        pool.shutdown(wait=False)


async def test_a_busy_session_keeps_one_deadline_timer_and_still_ends_once_quiet():
    """Every chunk moves the idle deadline later. The runner's one timer is armed again only
    when it rings (not once per chunk), traffic keeps the session open past its idle limit, and
    the first quiet stretch as long as the limit ends it."""
    model = EchoModel()
    pool = concurrent.futures.ThreadPoolExecutor(1)
    runner = SessionRunner(RealtimeSession(model.info, has_vad=False), model.open_session(), pool, pool,
                           limits=RunnerLimits(idle_timeout_s=0.5))
    runner.start()
    timers: list[asyncio.TimerHandle] = []
    try:
        frame = Pcm(np.zeros(480, np.int16), 24_000)
        started = time.monotonic()
        chunks = 0
        while time.monotonic() - started < 1.5:  # three idle limits of traffic
            await runner.submit_audio(frame)
            chunks += 1
            await asyncio.sleep(0.02)
            timer = runner._alarm._handle  # (the DeadlineAlarm's timer)
            if timer is not None and not any(timer is seen for seen in timers):
                timers.append(timer)
        assert not runner.closed.is_set()
        assert chunks > 30 and len(timers) <= 5  # ~one per idle limit, not one per chunk
        quiet = time.monotonic()
        await asyncio.wait_for(runner.closed.wait(), 3)
        assert runner.close_reason == ErrorCode.SESSION_IDLE_TIMEOUT
        assert time.monotonic() - quiet > 0.45  # not before the limit after the last chunk
    finally:
        await runner.close()
        pool.shutdown(wait=False)
