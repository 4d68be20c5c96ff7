"""Response metadata, item references and the idle timeout, in the sans-I/O core."""

import pytest

from realtime_omni.protocol import ProtocolError
from realtime_omni.session import actions as act
from tests.session.test_core import Driver, pcm24, silence


def start(d: Driver, **response) -> act.StartResponse | None:
    new = d.send(type="response.create", **({"response": response} if response else {}))
    return next((a for a in new if isinstance(a, act.StartResponse)), None)


def finish(d: Driver, action: act.StartResponse, text: str = "Hi.") -> None:
    d.s.on_response_text(action.response_id, action.epoch, text)
    d.s.on_response_end(action.response_id, action.epoch)
    d.pump()


def errors_of(d: Driver) -> list[tuple[str, str]]:
    return [(e["error"]["code"], e["error"]["param"]) for e in d.take() if e["type"] == "error"]


def say(d: Driver, text: str) -> str:
    d.send(type="conversation.item.create", item={"type": "message", "role": "user",
                                                 "content": [{"type": "input_text", "text": text}]})
    return d.events[-1]["item"]["id"]


def test_response_metadata_is_echoed_on_created_and_done():
    d = Driver(has_vad=False)
    d.take()
    action = start(d, metadata={"client_event": "greeting-7", "topic": "weather"}, output_modalities=["text"])
    finish(d, action)
    created = next(e for e in d.events if e["type"] == "response.created")
    done = next(e for e in d.events if e["type"] == "response.done")
    assert created["response"]["metadata"] == done["response"]["metadata"] == {"client_event": "greeting-7", "topic": "weather"}
    action = start(d)
    finish(d, action)
    assert d.events[-1]["response"]["metadata"] is None


@pytest.mark.parametrize("metadata, param", [
    ({f"k{i}": "v" for i in range(17)}, "response.metadata"),
    ({"k": "v" * 513}, "response.metadata.k"),
    ({"k" * 65: "v"}, "response.metadata." + "k" * 64),
])
def test_metadata_beyond_the_published_limits_is_refused(metadata, param):
    d = Driver(has_vad=False)
    d.take()
    assert start(d, metadata=metadata) is None
    assert errors_of(d) == [("invalid_value", param)]


def test_item_references_put_existing_items_into_a_response_input():
    d = Driver(has_vad=False)
    first = say(d, "My name is Ada.")
    say(d, "Ignore this one.")
    d.take()
    action = start(d, conversation="none", input=[
        {"type": "item_reference", "id": first},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "What is my name?"}]}])
    assert [m.text for m in action.request.messages] == ["My name is Ada.", "What is my name?"]


def test_a_reference_to_no_item_is_refused_before_any_response():
    d = Driver(has_vad=False)
    d.take()
    assert start(d, input=[{"type": "item_reference", "id": "item_gone"}]) is None
    assert errors_of(d) == [("item_not_found", "response.input.0.id")]
    assert d.s.response is None
    with pytest.raises(ProtocolError) as bad:
        d.send(type="response.create", response={"input": [{"type": "item_reference", "id": 5}]})
    assert (bad.value.code, bad.value.param) == ("invalid_event", "response.input.0")


@pytest.mark.parametrize("value", [1000, 4999, 30001, -5])
def test_idle_timeout_out_of_range_is_a_clean_error(value):
    d = Driver()
    d.take()
    d.send(type="session.update", session={"type": "realtime", "audio": {"input": {"turn_detection": {
        "type": "server_vad", "idle_timeout_ms": value}}}})
    error = next(e["error"] for e in d.events if e["type"] == "error")
    assert (error["code"], error["param"]) == ("invalid_value", "session.audio.input.turn_detection.idle_timeout_ms")
    assert error["message"].startswith("turn_detection.idle_timeout_ms: Input should be")
    assert "pydantic" not in error["message"] and "\n" not in error["message"]


def feed_silence(d: Driver, ms: int) -> None:
    """Silent input, and the VAD's verdict on it (as the runner reports it)."""
    for action in d.send(type="input_audio_buffer.append", audio=pcm24(ms)):
        if isinstance(action, act.DetectSpeech):
            d.s.on_speech_probabilities([0.0] * (len(action.pcm16k) // 512), action.start_ms)
            d.pump()


def test_idle_timeout_fires_after_the_reply_has_played_and_silence_lasts():
    d = Driver()
    d.send(type="session.update", session={"type": "realtime", "audio": {"input": {"turn_detection": {
        "type": "server_vad", "idle_timeout_ms": 5000}}}})
    d.take()
    feed_silence(d, 8000)  # never armed before a response: nothing happens
    assert "input_audio_buffer.timeout_triggered" not in d.types()
    action = start(d)
    d.s.on_response_audio(action.response_id, action.epoch, silence(48_000), "Hello there.")  # 2 s of audio
    d.s.on_response_end(action.response_id, action.epoch)
    d.pump()
    d.take()
    feed_silence(d, 6000)  # 2 s of playback + 4 s of silence: not yet
    assert "input_audio_buffer.timeout_triggered" not in d.types()
    feed_silence(d, 1200)
    fired = [e for e in d.events if e["type"] == "input_audio_buffer.timeout_triggered"]
    assert len(fired) == 1
    assert fired[0]["audio_end_ms"] - fired[0]["audio_start_ms"] >= 5000
    types = d.types()
    assert types.index("input_audio_buffer.timeout_triggered") < types.index("input_audio_buffer.committed")
    committed = next(e for e in d.events if e["type"] == "input_audio_buffer.committed")
    assert committed["item_id"] == fired[0]["item_id"]
    assert "response.created" in types  # create_response: the model is asked to go on
    transcribe = [a for a in d.actions if isinstance(a, act.Transcribe) and a.item_id == fired[0]["item_id"]]
    assert transcribe and len(transcribe[0].pcm16k) >= 5 * 16_000 - 512


def test_speech_disarms_the_idle_timeout():
    d = Driver()
    d.send(type="session.update", session={"type": "realtime", "audio": {"input": {"turn_detection": {
        "type": "server_vad", "idle_timeout_ms": 5000, "create_response": False}}}})
    action = start(d)
    finish(d, action)
    d.take()
    feed_silence(d, 3000)
    for a in d.send(type="input_audio_buffer.append", audio=pcm24(640)):
        if isinstance(a, act.DetectSpeech):
            d.s.on_speech_probabilities([0.95] * (len(a.pcm16k) // 512), a.start_ms)
    d.pump()
    feed_silence(d, 4000)
    assert "input_audio_buffer.speech_stopped" in d.types()
    assert "input_audio_buffer.timeout_triggered" not in d.types()


def test_stored_prompts_are_refused_rather_than_ignored():
    d = Driver(has_vad=False)
    d.take()
    d.send(type="session.update", session={"type": "realtime", "prompt": {"id": "pmpt_123"}})
    assert errors_of(d) == [("unsupported_feature", "session.prompt")]
    assert start(d, prompt={"id": "pmpt_123"}) is None
    assert errors_of(d) == [("unsupported_feature", "response.prompt")]


def test_a_response_speaks_with_its_own_voice_which_the_session_keeps_once_heard():
    d = Driver(has_vad=False)
    d.take()
    text = start(d, output_modalities=["text"], audio={"output": {"voice": "verse"}})  # no audio: nothing fixed
    d.s.on_response_end(text.response_id, text.epoch)
    d.pump()
    d.take()
    action = start(d, audio={"output": {"voice": "ethan"}})
    assert action.request.voice == "ethan"
    created = next(e for e in d.take() if e["type"] == "response.created")
    assert created["response"]["audio"]["output"]["voice"] == "ethan"
    d.s.on_response_end(action.response_id, action.epoch)
    d.pump()
    assert start(d).request.voice == "ethan"  # the voice the session has been heard with
    custom = Driver(has_vad=False)
    assert start(custom, audio={"output": {"voice": {"id": "chelsie"}}}).request.voice == "chelsie"  # a custom voice


def test_a_responses_voice_cannot_change_once_the_session_has_spoken():
    d = Driver(has_vad=False)
    d.take()
    action = start(d)  # audio out: the session has now spoken with its voice
    d.s.on_response_end(action.response_id, action.epoch)
    d.pump()
    d.take()
    assert start(d, audio={"output": {"voice": "ethan"}}) is None
    assert errors_of(d) == [("invalid_value", "response.audio.output.voice")]
    assert start(d, audio={"output": {"voice": "alloy"}}).request.voice == "alloy"  # the same one is fine


@pytest.mark.parametrize("voice", ["", "v" * 65, {"id": ""}, {"id": "v" * 65}])
def test_a_voice_outside_one_to_64_characters_is_refused_for_the_session_and_a_response(voice):
    d = Driver(has_vad=False)
    d.take()
    d.send(type="session.update", session={"type": "realtime", "audio": {"output": {"voice": voice}}})
    assert errors_of(d) == [("invalid_value", "session.audio.output.voice")]
    assert start(d, audio={"output": {"voice": voice}}) is None
    assert errors_of(d) == [("invalid_value", "response.audio.output.voice")]
    assert start(d, audio={"output": {"voice": "v" * 64}}).request.voice == "v" * 64  # the session goes on
