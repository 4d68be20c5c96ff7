"""Protocol fuzzing: generated and mutated client events never crash the session core.

Each invalid event is answered by exactly one ``error`` event, every server event still
validates against the official SDK models, and the session remains usable afterwards.
"""

from __future__ import annotations

import base64
import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from realtime_omni.engines.base import ModelInfo
from realtime_omni.protocol import ProtocolError, parse_client_event
from realtime_omni.protocol.client_events import KNOWN_TYPES
from realtime_omni.session import actions as act
from realtime_omni.session.core import RealtimeSession
from tests.helpers import assert_valid_server_event

INFO = ModelInfo(id="cascade", capabilities=frozenset({"audio_in", "text_in", "audio_out", "text_out"}))
AUDIO = base64.b64encode(b"\x01\x00" * 480).decode()

VALID = [
    {"type": "session.update", "session": {"type": "realtime", "instructions": "x", "output_modalities": ["text"],
                                           "audio": {"input": {"format": {"type": "audio/pcmu"}, "turn_detection": None}}}},
    {"type": "input_audio_buffer.append", "audio": AUDIO},
    {"type": "input_audio_buffer.commit"},
    {"type": "input_audio_buffer.clear"},
    {"type": "conversation.item.create", "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}},
    {"type": "conversation.item.retrieve", "item_id": "item_x"},
    {"type": "conversation.item.truncate", "item_id": "item_x", "content_index": 0, "audio_end_ms": 10},
    {"type": "conversation.item.delete", "item_id": "item_x"},
    {"type": "response.create", "response": {"output_modalities": ["audio"], "instructions": "y", "max_output_tokens": 5}},
    {"type": "response.cancel"},
    {"type": "output_audio_buffer.clear"},
]

json_scalars = st.none() | st.booleans() | st.integers(-2**40, 2**40) | st.floats(allow_nan=False) | st.text(max_size=20)
json_values = st.recursive(json_scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4), max_leaves=12)


@st.composite
def mutated(draw):
    event = json.loads(json.dumps(draw(st.sampled_from(VALID))))
    for _ in range(draw(st.integers(0, 3))):
        target = event
        path = draw(st.lists(st.sampled_from(["session", "item", "response", "audio", "content", "input", "format"]), max_size=2))
        for key in path:
            if isinstance(target.get(key), dict):
                target = target[key]
        keys = list(target) or ["type"]
        key = draw(st.sampled_from(keys + ["extra_field", "event_id", "type"]))
        choice = draw(st.integers(0, 2))
        if choice == 0:
            target.pop(key, None)
        elif choice == 1:
            target[key] = draw(json_values)
        else:
            target[key] = draw(st.sampled_from(sorted(KNOWN_TYPES)) | st.text(max_size=8))
    return json.dumps(event)


raw_events = (
    mutated()
    | st.sampled_from(VALID).map(json.dumps)
    | st.builds(json.dumps, st.fixed_dictionaries({"type": st.sampled_from(sorted(KNOWN_TYPES))}, optional={"x": json_values}))
    | st.builds(json.dumps, json_values)
    | st.text(max_size=40)
    | st.binary(max_size=40).map(lambda b: b.decode("latin-1"))
)

COUNT = {"events": 0, "invalid": 0}


@settings(max_examples=3000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(raw_events, min_size=1, max_size=8))
def test_fuzzed_events_never_crash_and_errors_are_reported(batch):
    session = RealtimeSession(INFO, has_vad=False)
    session.start()
    session.drain_events()
    for raw in batch:
        COUNT["events"] += 1
        try:
            event = parse_client_event(raw)
        except ProtocolError as exc:
            COUNT["invalid"] += 1
            assert exc.code and exc.message
            continue
        session.receive(event)
        out = session.drain_events()
        for item in out:
            assert_valid_server_event(item.event)
        errors = [o for o in out if o.event["type"] == "error"]
        assert len(errors) <= 1
        COUNT["invalid"] += len(errors)
        # play the driver: a started response finishes at once
        for action in session.drain_actions():
            if isinstance(action, act.StartResponse):
                session.on_response_text(action.response_id, action.epoch, "ok")
                session.on_response_end(action.response_id, action.epoch)
            if isinstance(action, act.Transcribe):
                session.on_transcription(action.item_id, "words")
        for item in session.drain_events():
            assert_valid_server_event(item.event)
    # still usable
    session.receive(parse_client_event(json.dumps({"type": "session.update", "session": {"type": "realtime", "instructions": "ok"}})))
    assert session.drain_events()[-1].event["type"] == "session.updated"


def test_fuzzing_volume():
    """Runs after the fuzz test in file order: at least 10 000 events went through."""
    assert COUNT["events"] >= 10_000, COUNT
    assert COUNT["invalid"] > 1_000
    print(f"fuzzed {COUNT['events']} client events, {COUNT['invalid']} answered by error")
