import json

import pytest

from realtime_omni.protocol import ProtocolError, parse_client_event
from realtime_omni.protocol import errors
from realtime_omni.protocol.beta import to_beta


def parse(data) -> object:
    return parse_client_event(json.dumps(data))


def test_valid_ga_events_parse_into_sdk_models():
    event = parse({"type": "session.update", "session": {"type": "realtime", "instructions": "hi",
                   "audio": {"input": {"format": {"type": "audio/pcmu"}, "turn_detection": None}}}})
    assert event.type == "session.update"
    assert event.session.audio.input.format.type == "audio/pcmu"
    assert parse({"type": "response.create"}).type == "response.create"
    assert parse({"type": "input_audio_buffer.append", "audio": "AAAA"}).audio == "AAAA"


def test_beta_session_shape_is_rewritten_to_ga():
    event = parse({"type": "session.update", "session": {
        "modalities": ["text", "audio"], "input_audio_format": "g711_ulaw", "output_audio_format": "pcm16",
        "turn_detection": {"type": "server_vad", "threshold": 0.6}, "voice": "alloy",
        "input_audio_transcription": {"model": "whisper-1"}, "max_response_output_tokens": 50}})
    s = event.session
    assert s.output_modalities == ["audio"]
    assert s.audio.input.format.type == "audio/pcmu"
    assert s.audio.output.format.type == "audio/pcm"
    assert s.audio.input.turn_detection.threshold == 0.6
    assert s.max_output_tokens == 50


@pytest.mark.parametrize(
    "raw, code, param",
    [
        ("{not json", errors.INVALID_JSON, None),
        ("[1, 2]", errors.INVALID_JSON, None),
        # hostile JSON: nesting deep enough to exhaust Python's recursion, and just past the bound
        ('{"type": "session.update", "session": ' + "[" * 100_000 + "]" * 100_000 + "}", errors.INVALID_JSON, None),
        ('{"type": "session.update", "session": ' + '{"a": ' * 40 + "1" + "}" * 40 + "}", errors.INVALID_JSON, None),
        ('{"type": "conversation.item.truncate", "item_id": "x", "content_index": 0, "audio_end_ms": NaN}',
         errors.INVALID_JSON, None),
        ('{"type": "response.create", "response": {"max_output_tokens": Infinity}}', errors.INVALID_JSON, None),
        # a number that overflows to infinity is no number either
        ('{"type": "session.update", "session": {"type": "realtime", "audio": {"input": {"turn_detection": '
         '{"type": "server_vad", "threshold": -1e400}}}}}', errors.INVALID_JSON, None),
        # text that is not UTF-8: a binary frame of latin-1, a lone surrogate escape
        (b'{"type": "input_audio_buffer.append", "audio": "\xe9t\xe9"}', errors.INVALID_JSON, None),
        ('{"type": "input_audio_buffer.append", "audio": "\\ud800"}', errors.INVALID_JSON, None),
        # an integer past 64 bits (beyond what any field takes), nesting past the parser's own bound
        ('{"type": "response.create", "response": {"max_output_tokens": ' + "9" * 400 + "}}", errors.INVALID_JSON, None),
        ("[" * 2_000 + "]" * 2_000, errors.INVALID_JSON, None),
        # beta modalities of the wrong type: a coded error, not a crash of the session
        (json.dumps({"type": "session.update", "session": {"modalities": 5}}), errors.INVALID_VALUE, "session.modalities"),
        (json.dumps({"type": "response.create", "response": {"modalities": "audio"}}), errors.INVALID_VALUE,
         "response.modalities"),
        # numbers out of the published ranges
        (json.dumps({"type": "session.update", "session": {"type": "realtime", "audio": {"output": {"speed": -5}}}}),
         errors.INVALID_VALUE, "session.audio.output.speed"),
        (json.dumps({"type": "session.update", "session": {"type": "realtime", "max_output_tokens": -1}}),
         errors.INVALID_VALUE, "session.max_output_tokens"),
        (json.dumps({"type": "response.create", "response": {"max_output_tokens": 0}}),
         errors.INVALID_VALUE, "response.max_output_tokens"),
        (json.dumps({"type": "conversation.item.truncate", "item_id": "x", "content_index": 0, "audio_end_ms": -1}),
         errors.INVALID_VALUE, "audio_end_ms"),
        (json.dumps({"type": "no.such.event", "event_id": "e1"}), errors.UNKNOWN_EVENT, "type"),
        (json.dumps({"event_id": "e2"}), errors.INVALID_EVENT, "type"),
        (json.dumps({"type": "input_audio_buffer.append", "audio": 5}), errors.INVALID_EVENT, "audio"),
        (json.dumps({"type": "conversation.item.truncate", "item_id": "x", "content_index": 0, "audio_end_ms": "soon"}),
         errors.INVALID_EVENT, "audio_end_ms"),
    ],
)
def test_bad_events_raise_protocol_errors_with_codes(raw, code, param):
    with pytest.raises(ProtocolError) as info:
        parse_client_event(raw)
    assert info.value.code == code
    assert info.value.param == param


def test_event_id_is_echoed_in_errors():
    with pytest.raises(ProtocolError) as info:
        parse_client_event(json.dumps({"type": "nope", "event_id": "evt_42"}))
    assert info.value.to_error()["event_id"] == "evt_42"


def test_oversize_event_is_rejected_before_parsing():
    with pytest.raises(ProtocolError) as info:
        parse_client_event("x" * 101, max_bytes=100)
    assert info.value.code == errors.EVENT_TOO_LARGE


def test_beta_dialect_renames_server_events():
    ga = {"type": "response.output_audio.delta", "event_id": "e", "response_id": "r", "item_id": "i",
          "output_index": 0, "content_index": 0, "delta": "AA=="}
    assert to_beta(ga)["type"] == "response.audio.delta"
    assert to_beta({"type": "conversation.item.done", "event_id": "e", "item": {}}) is None
    added = to_beta({"type": "conversation.item.added", "event_id": "e", "previous_item_id": None,
                     "item": {"id": "i", "type": "message", "role": "assistant", "content": [{"type": "output_audio"}]}})
    assert added["type"] == "conversation.item.created"
    assert added["item"]["content"][0]["type"] == "audio"


def test_every_client_event_of_the_ga_and_beta_sdks_is_known_or_refused_precisely():
    import typing

    from openai.types.beta.realtime import RealtimeClientEvent as BetaEvent
    from openai.types.realtime import RealtimeClientEvent as GAEvent

    from realtime_omni.protocol.client_events import BETA_ALIASES, KNOWN_TYPES, UNSUPPORTED_TYPES

    def types(union):  # type: ignore[no-untyped-def]
        return {typing.get_args(m.model_fields["type"].annotation)[0] for m in typing.get_args(typing.get_args(union)[0])}

    assert types(GAEvent) | types(BetaEvent) <= KNOWN_TYPES | set(UNSUPPORTED_TYPES) | set(BETA_ALIASES)
    # the beta transcription session's update is a GA session.update of type "transcription"
    event = parse_client_event(json.dumps({"type": "transcription_session.update", "event_id": "e1", "session": {
        "input_audio_format": "pcm16", "input_audio_transcription": {"model": "whisper-1"}}}))
    assert event.type == "session.update" and event.session.type == "transcription"
    assert event.session.audio.input.transcription.model == "whisper-1"
    with pytest.raises(ProtocolError) as refused:  # a session that is not an object is the schema's error
        parse_client_event(json.dumps({"type": "transcription_session.update", "event_id": "e1", "session": 3}))
    assert refused.value.event_id == "e1"
