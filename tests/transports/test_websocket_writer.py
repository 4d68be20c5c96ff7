"""The WebSocket writer's stuck-send guard: one watcher per connection instead of a timer
around every send. A send that outlasts the limit (a peer whose socket buffer stays full)
cancels the writer; a writer that keeps sending quickly is left alone."""

from __future__ import annotations

import asyncio
import time

from realtime_omni.transports.websocket import SendClock, _cancel_when_stuck


async def test_a_send_that_outlasts_the_limit_cancels_the_writer():
    sending = SendClock()

    async def writer_on_a_full_socket() -> None:
        sending.since = time.monotonic()
        await asyncio.sleep(3600)  # the peer never reads: the send never completes

    writer = asyncio.create_task(writer_on_a_full_socket())
    started = time.monotonic()
    await asyncio.wait_for(_cancel_when_stuck(writer, sending, limit_s=0.2), 3)
    await asyncio.gather(writer, return_exceptions=True)
    assert writer.cancelled()
    assert time.monotonic() - started >= 0.2


async def test_quick_sends_for_longer_than_the_limit_are_left_alone():
    sending = SendClock()

    async def writer_on_a_reading_peer() -> None:
        for _ in range(60):  # 0.6 s of sending, each send 10 ms
            sending.since = time.monotonic()
            await asyncio.sleep(0.01)
            sending.since = None

    writer = asyncio.create_task(writer_on_a_reading_peer())
    await asyncio.wait_for(_cancel_when_stuck(writer, sending, limit_s=0.4), 3)
    assert writer.done() and not writer.cancelled()
