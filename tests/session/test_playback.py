"""Playback owned by the session core: transports that play on the server's side (WebRTC,
telephony) only report what went out and what they dropped; the core decides what was heard."""

from __future__ import annotations

from realtime_omni.session import actions as act
from tests.session.test_core import Driver, silence


def completed_reply(d: Driver, seconds: int = 2, text: str = "One two three four five six seven eight.") -> tuple[str, str]:
    """A reply fully generated (``seconds`` of audio) and done; returns (response id, item id)."""
    d.send(type="conversation.item.create", item={"type": "message", "role": "user",
                                                  "content": [{"type": "input_text", "text": "hi"}]})
    start = next(a for a in d.send(type="response.create") if isinstance(a, act.StartResponse))
    for _ in range(seconds):
        d.s.on_response_audio(start.response_id, start.epoch, silence(24_000), text if _ == 0 else "")
    d.s.on_response_end(start.response_id, start.epoch, "completed")
    d.pump()
    item_id = next(e for e in d.events if e["type"] == "response.done")["response"]["output"][0]["id"]
    d.take()
    return start.response_id, item_id


def test_a_complete_reply_cut_at_the_listener_is_truncated_to_what_was_heard():
    d = Driver(has_vad=False)
    rid, item_id = completed_reply(d)
    d.s.ledger.set_heard(rid, 600.0)  # the player reports: 0.6 s of 2 s reached the listener
    d.s.playback_cut(rid)
    d.pump()
    truncated = [e for e in d.events if e["type"] == "conversation.item.truncated"]
    assert truncated == [{**truncated[0], "item_id": item_id, "content_index": 0, "audio_end_ms": 600}]
    heard = [a for a in d.actions if isinstance(a, act.ConfirmHeard)]
    assert heard and heard[-1].text and len(heard[-1].text) < len("One two three four five six seven eight.")
    d.send(type="conversation.item.retrieve", item_id=item_id)
    part = d.events[-1]["item"]["content"][0]
    assert part["transcript"] == heard[-1].text


def test_nothing_is_truncated_when_all_was_heard_or_the_item_is_gone():
    d = Driver(has_vad=False)
    rid, item_id = completed_reply(d)
    d.s.ledger.set_heard(rid, 1990.0)  # within the 20 ms margin of the end
    d.s.playback_cut(rid)
    d.pump()
    assert not [e for e in d.events if e["type"] == "conversation.item.truncated"]
    rid, item_id = completed_reply(d)
    d.send(type="conversation.item.delete", item_id=item_id)
    d.s.ledger.set_heard(rid, 100.0)
    d.s.playback_cut(rid)
    d.pump()
    assert not [e for e in d.events if e["type"] == "conversation.item.truncated"]
    d.s.playback_cut("resp_unknown")  # hostile or stale ids change nothing
    d.pump()
    assert not [e for e in d.events if e["type"] in ("conversation.item.truncated", "error")]


def test_the_active_response_is_left_to_the_core_and_fenced_audio_is_stale():
    d = Driver(has_vad=False)
    d.send(type="conversation.item.create", item={"type": "message", "role": "user",
                                                  "content": [{"type": "input_text", "text": "hi"}]})
    start = next(a for a in d.send(type="response.create") if isinstance(a, act.StartResponse))
    d.s.on_response_audio(start.response_id, start.epoch, silence(24_000), "Still talking.")
    d.s.playback_cut(start.response_id)  # active: the core's own barge-in path cancels it
    d.pump()
    assert not [e for e in d.events if e["type"] in ("conversation.item.truncated", "response.done")]
    assert not d.s.fenced(start.epoch) and not d.s.fenced(None)
    d.send(type="response.cancel")
    assert d.s.fenced(start.epoch)


def test_a_reply_outside_the_conversation_is_never_truncated():
    d = Driver(has_vad=False)
    start = next(a for a in d.send(type="response.create", response={"conversation": "none"})
                 if isinstance(a, act.StartResponse))
    d.s.on_response_audio(start.response_id, start.epoch, silence(48_000), "Out of band.")
    d.s.on_response_end(start.response_id, start.epoch, "completed")
    d.s.ledger.set_heard(start.response_id, 100.0)
    d.take()
    d.s.playback_cut(start.response_id)
    d.pump()
    assert not [e for e in d.events if e["type"] == "conversation.item.truncated"]
