"""server_event: the one way the server builds an event, checked by the SDK's models."""

from __future__ import annotations

import logging

import pytest

from realtime_omni.protocol.server_events import server_event


def test_fields_come_back_as_given():
    event = server_event("input_audio_buffer.speech_started", audio_start_ms=500.0, item_id="item_1")
    # the SDK's dump would have made this 500 and put "type" last: the event is what was built
    assert event == {"type": "input_audio_buffer.speech_started", "audio_start_ms": 500.0, "item_id": "item_1"}
    assert isinstance(event["audio_start_ms"], float) and next(iter(event)) == "type"


def test_extension_events_are_not_checked():
    assert server_event("session.expiring", seconds_left=5, expires_at=1) == {
        "type": "session.expiring", "seconds_left": 5, "expires_at": 1}


@pytest.mark.parametrize("kind, fields", [
    ("conversation.item.deleted", {"item_id": 42}),
    ("no.such.event", {}),
])
def test_a_mismatch_is_logged_and_the_event_still_goes(caplog, kind, fields):
    with caplog.at_level(logging.ERROR, logger="realtime_omni.protocol.server_events"):
        assert server_event(kind, **fields) == {"type": kind, **fields}
    assert any("does not match" in r.getMessage() for r in caplog.records)
