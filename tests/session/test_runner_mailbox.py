"""The session runner's mailbox: a transport waiting to deliver input (the mailbox full) may be
cancelled (its connection dropped, a send timed out) without its bytes staying counted."""

from __future__ import annotations

import asyncio
import concurrent.futures

import numpy as np

from realtime_omni.engines.echo import EchoModel
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
