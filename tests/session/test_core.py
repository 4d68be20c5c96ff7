"""The sans-I/O session core, driven directly: no socket, no thread, no model."""

import base64
import json

import numpy as np
import pytest

from realtime_omni.audio import AudioFormat, Pcm
from realtime_omni.engines.base import ModelInfo
from realtime_omni.engines.echo import EchoModel
from realtime_omni.protocol import parse_client_event
from realtime_omni.protocol.errors import ProtocolError
from realtime_omni.session import actions as act
from realtime_omni.session.core import RealtimeSession
from tests.helpers import assert_valid_server_event

CASCADE = ModelInfo(id="cascade", capabilities=frozenset({"audio_in", "text_in", "audio_out", "text_out"}), output_rate=24000)
ECHO = EchoModel.info


def silence(samples: int) -> Pcm:
    """Reply audio as the pipeline hands it over: PCM at the output rate (24 kHz, audio/pcm)."""
    return Pcm(np.zeros(samples, dtype=np.int16), 24_000)


class Driver:
    """Feeds the core like the runner does and records what it emits (validated)."""

    def __init__(self, info=CASCADE, has_vad=True):
        self.s = RealtimeSession(info, has_vad=has_vad)
        # a duplex model hears input as the runner would make it (the real engine, inline)
        self.listener = EchoModel().open_session() if info.duplex else None
        self.events: list[dict] = []
        self.actions: list = []
        self.s.start()
        self.pump()

    def pump(self):
        for out in self.s.drain_events():
            event = out.json_event()  # as the WebSocket writer sends it (audio deltas encoded)
            assert_valid_server_event(event)
            self.events.append(event)
            if out.response_id:
                self.s.ledger.mark_sent(out.response_id, out.audio_ms)
        new = self.s.drain_actions()
        self.actions.extend(new)
        heard = [a for a in new if isinstance(a, act.Listen)]
        for action in heard:
            said = self.listener.listen(action.audio)
            if said is not None:
                self.s.on_model_audio(said)
        if heard:
            new += self.pump()
        return new

    def send(self, **event):
        self.s.receive(parse_client_event(json.dumps(event)))
        return self.pump()

    def types(self):
        return [e["type"] for e in self.events]

    def take(self):
        out, self.events = self.events, []
        return out


def pcm24(ms: int) -> str:
    return base64.b64encode(np.zeros(24 * ms, np.int16).tobytes()).decode()


def test_session_created_reports_ga_session_and_capabilities():
    d = Driver()
    created = d.events[0]
    assert created["type"] == "session.created"
    assert created["session"]["audio"]["input"]["turn_detection"]["type"] == "server_vad"
    assert "audio_out" in created["session"]["capabilities"]


def test_session_update_changes_only_given_fields():
    d = Driver()
    d.take()
    d.send(type="session.update", session={"type": "realtime", "instructions": "Be brief.",
                                          "audio": {"output": {"format": {"type": "audio/pcmu"}}}})
    updated = d.events[-1]["session"]
    assert updated["instructions"] == "Be brief."
    assert updated["audio"]["output"]["format"] == {"type": "audio/pcmu"}
    assert updated["audio"]["input"]["format"]["type"] == "audio/pcm"


def test_a_long_append_reaches_the_vad_in_slices_of_a_second_that_tile_it():
    """Ten seconds appended at once go to the shared VAD pool as ~1 s jobs, in order and without
    gaps or overlaps, so one client's bulk upload does not hold a VAD thread for seconds."""
    d = Driver()
    d.take()
    new = d.send(type="input_audio_buffer.append", audio=pcm24(10_000))
    detect = [a for a in new if isinstance(a, act.DetectSpeech)]
    assert len(detect) == 10 and max(len(a.pcm16k) for a in detect) == 16_384
    position = 0.0
    for job in detect:
        assert job.start_ms == pytest.approx(position) and len(job.pcm16k) % 512 == 0
        position += 1000.0 * len(job.pcm16k) / 16_000
    assert position == pytest.approx(1000.0 * d.s._vad_position / 16_000)  # every whole frame, once
    assert position > 9_900


def test_server_vad_commits_a_turn_then_responds_after_transcript():
    d = Driver()
    d.take()
    new = d.send(type="input_audio_buffer.append", audio=pcm24(960))  # 0.96 s → 30 VAD frames
    detect = [a for a in new if isinstance(a, act.DetectSpeech)]
    assert detect and len(detect[0].pcm16k) % 512 == 0
    # speech in frames 5..20, silence after: start, then stop after 500 ms of silence
    probs = [0.0] * 5 + [0.9] * 15 + [0.0] * 30
    d.s.on_speech_probabilities(probs, 0.0)
    new = d.pump()
    types = d.types()
    assert types[:4] == ["input_audio_buffer.speech_started", "input_audio_buffer.speech_stopped",
                         "input_audio_buffer.committed", "conversation.item.added"]
    assert "response.created" in types
    transcribe = [a for a in new if isinstance(a, act.Transcribe)]
    assert len(transcribe) == 1
    # the pipeline waits for the transcript: no StartResponse yet
    assert not any(isinstance(a, act.StartResponse) for a in new)
    d.s.on_transcription(transcribe[0].item_id, "hello there")
    new = d.pump()
    start = [a for a in new if isinstance(a, act.StartResponse)]
    assert start and start[0].request.messages[-1].text == "hello there"


def test_response_stream_and_exactly_one_done():
    d = Driver(has_vad=False)
    d.send(type="conversation.item.create", item={"type": "message", "role": "user",
                                                  "content": [{"type": "input_text", "text": "hi"}]})
    d.take()
    new = d.send(type="response.create")
    start = next(a for a in new if isinstance(a, act.StartResponse))
    rid, epoch = start.response_id, start.epoch
    d.s.on_response_audio(rid, epoch, silence(2400), "Hello there.")
    d.s.on_response_end(rid, epoch, "completed")
    d.s.on_response_end(rid, epoch, "completed")  # a second end is ignored
    d.pump()
    types = d.types()
    assert types.count("response.done") == 1
    assert types.index("response.output_audio_transcript.delta") < types.index("response.output_audio.delta")
    done = d.events[-1]["response"]
    assert done["status"] == "completed"
    assert done["output"][0]["content"][0]["transcript"] == "Hello there."


def test_cancel_truncates_to_audio_sent_and_fences_late_chunks():
    d = Driver(has_vad=False)
    d.send(type="conversation.item.create", item={"type": "message", "role": "user",
                                                  "content": [{"type": "input_text", "text": "hi"}]})
    new = d.send(type="response.create")
    start = next(a for a in new if isinstance(a, act.StartResponse))
    rid, epoch = start.response_id, start.epoch
    d.s.on_response_audio(rid, epoch, silence(24000), "One two three four.")  # 1 s
    d.pump()
    d.s.on_response_audio(rid, epoch, silence(24000), "Five six seven eight.")
    d.s.ledger.set_heard(rid, 1500.0)  # the listener heard 1.5 s
    d.take()
    d.send(type="response.cancel")
    done = [e for e in d.events if e["type"] == "response.done"][0]["response"]
    assert done["status"] == "cancelled"
    assert done["output"][0]["content"][0]["transcript"] == "One two three four. Five six"
    assert any(isinstance(a, act.CancelResponse) for a in d.actions)
    # a chunk of the cancelled epoch arriving late is dropped
    d.take()
    d.s.on_response_audio(rid, epoch, silence(2400), "late")
    d.s.on_response_end(rid, epoch, "completed")
    d.pump()
    assert d.events == []


def test_barge_in_cancels_the_active_response():
    d = Driver()
    d.send(type="conversation.item.create", item={"type": "message", "role": "user",
                                                  "content": [{"type": "input_text", "text": "hi"}]})
    d.send(type="response.create")
    d.take()
    d.send(type="input_audio_buffer.append", audio=pcm24(200))
    d.s.on_speech_probabilities([0.9, 0.9, 0.9], 0.0)
    d.pump()
    types = d.types()
    assert types[0] == "input_audio_buffer.speech_started"
    done = [e for e in d.events if e["type"] == "response.done"][0]
    assert done["response"]["status_details"]["reason"] == "turn_detected"


@pytest.mark.parametrize("event, code", [
    ({"type": "input_audio_buffer.append", "audio": "***"}, "invalid_base64"),
    ({"type": "input_audio_buffer.commit"}, "input_audio_buffer_commit_empty"),
    ({"type": "conversation.item.retrieve", "item_id": "nope"}, "item_not_found"),
    ({"type": "conversation.item.delete", "item_id": "nope"}, "item_not_found"),
    ({"type": "response.cancel"}, "response_cancel_not_active"),
    ({"type": "session.update", "session": {"type": "realtime", "audio": {"input": {"format": "opus"}}}}, "unsupported_audio_format"),
])
def test_bad_input_is_an_error_event_and_the_session_goes_on(event, code):
    d = Driver(has_vad=False)
    d.take()
    try:
        d.send(**event)
    except Exception as exc:  # parse-level errors surface as ProtocolError from parse_client_event
        assert getattr(exc, "code", None) == code
        return
    errors_ = [e for e in d.events if e["type"] == "error"]
    assert errors_ and errors_[0]["error"]["code"] == code
    d.take()
    d.send(type="session.update", session={"type": "realtime", "instructions": "still alive"})
    assert d.events[-1]["type"] == "session.updated"


def test_second_response_create_while_active_is_rejected():
    d = Driver(has_vad=False)
    d.send(type="response.create")
    d.take()
    d.send(type="response.create", event_id="evt_2")
    err = d.events[-1]
    assert err["error"]["code"] == "conversation_already_has_active_response"
    assert err["error"]["event_id"] == "evt_2"


def test_truncate_beyond_audio_is_rejected():
    d = Driver(has_vad=False)
    new = d.send(type="response.create")
    start = next(a for a in new if isinstance(a, act.StartResponse))
    d.s.on_response_audio(start.response_id, start.epoch, silence(24000), "Hi.")
    d.s.on_response_end(start.response_id, start.epoch)
    d.pump()
    item_id = d.events[-1]["response"]["output"][0]["id"]
    d.take()
    d.send(type="conversation.item.truncate", item_id=item_id, content_index=0, audio_end_ms=5000)
    assert d.events[-1]["error"]["code"] == "invalid_truncate"
    d.take()
    d.send(type="conversation.item.truncate", item_id=item_id, content_index=0, audio_end_ms=500)
    assert d.events[-1]["type"] == "conversation.item.truncated"
    assert any(isinstance(a, act.ConfirmHeard) for a in d.actions)


def test_echo_model_returns_input_as_one_long_response():
    d = Driver(ECHO)
    d.send(type="session.update", session={"type": "realtime", "audio": {"input": {"turn_detection": None}}})
    d.take()
    chunk = (np.arange(480, dtype=np.int16) * 7).tobytes()
    for _ in range(3):
        d.send(type="input_audio_buffer.append", audio=base64.b64encode(chunk).decode())
    deltas = [e for e in d.events if e["type"] == "response.output_audio.delta"]
    assert [base64.b64decode(e["delta"]) for e in deltas] == [chunk] * 3
    assert d.types().count("response.created") == 1
    d.send(type="response.cancel")
    assert d.events[-1]["response"]["status"] == "cancelled"


def test_echo_transcodes_between_formats():
    d = Driver(ECHO)
    d.send(type="session.update", session={"type": "realtime", "audio": {
        "input": {"turn_detection": None, "format": {"type": "audio/pcmu"}},
        "output": {"format": {"type": "audio/pcm", "rate": 24000}}}})
    d.take()
    d.send(type="input_audio_buffer.append", audio=base64.b64encode(b"\xff" * 1600).decode())  # 200 ms
    delta = next(e for e in d.events if e["type"] == "response.output_audio.delta")
    assert 0 < len(base64.b64decode(delta["delta"])) <= 2 * 4800
    assert AudioFormat.PCM.rate == 24000


def test_close_ends_the_active_response_once():
    d = Driver(has_vad=False)
    d.send(type="response.create")
    d.s.close()
    d.pump()
    assert d.types().count("response.done") == 1
    d.s.close()
    d.pump()
    assert d.types().count("response.done") == 1


SEEING = ModelInfo(id="seeing", capabilities=frozenset({"audio_in", "text_in", "image_in", "audio_out", "text_out"}), hears_audio=True)


def test_camera_frames_join_the_next_user_turn_only_for_models_that_see():
    blind = Driver(has_vad=False)
    blind.s.append_image(np.zeros((4, 4, 3), np.uint8))
    assert blind.s._latest_image is None  # dropped at once
    d = Driver(SEEING, has_vad=False)
    d.s.append_image(np.zeros((4, 4, 3), np.uint8))
    frame = np.full((4, 4, 3), 7, np.uint8)
    d.s.append_image(frame)  # newest wins
    d.send(type="session.update", session={"type": "realtime", "audio": {"input": {"turn_detection": None}}})
    d.send(type="input_audio_buffer.append", audio=pcm24(300))
    d.send(type="input_audio_buffer.commit")
    new = d.send(type="response.create")
    start = next(a for a in new if isinstance(a, act.StartResponse))
    assert start.request.messages[-1].images[0] is frame


def test_input_image_items_are_decoded_or_refused():
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (3, 2), (255, 0, 0)).save(buf, format="PNG")
    url = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
    item = {"type": "message", "role": "user", "content": [{"type": "input_image", "image_url": url}]}
    d = Driver(SEEING, has_vad=False)
    d.send(type="conversation.item.create", item=item)
    assert d.events[-1]["type"] == "conversation.item.done"
    assert list(d.s.conversation)[-1].images[0].shape == (2, 3, 3)
    blind = Driver(has_vad=False)
    blind.send(type="conversation.item.create", item=item)
    assert blind.events[-1]["error"]["code"] == "unsupported_feature"


def test_an_image_declaring_a_huge_canvas_is_refused_before_it_is_decoded():
    """A 30 kB PNG of one colour can declare 20000 x 20000 pixels (1.2 GB as RGB): refused from
    its header with a code, the session going on; a truncated or foreign file too."""
    import io

    from PIL import Image

    def png(side: int) -> bytes:
        buf = io.BytesIO()
        Image.new("1", (side, side)).save(buf, format="PNG")
        return buf.getvalue()

    large, bomb = png(6000), png(20000)  # past our limit; past Pillow's own bomb limit too
    assert len(bomb) < 200_000
    d = Driver(SEEING, has_vad=False)
    messages = []
    for payload in (large, bomb, bomb[:100], b"GIF89a" + b"\0" * 50):
        url = "data:image/png;base64," + base64.b64encode(payload).decode()
        item = {"type": "message", "role": "user", "content": [{"type": "input_image", "image_url": url}]}
        d.send(type="conversation.item.create", item=item)
        error = d.events[-1]
        assert error["type"] == "error" and error["error"]["code"] == "invalid_value"
        messages.append(error["error"]["message"])
    assert "6000x6000" in messages[0]
    d.send(type="conversation.item.create", item={"type": "message", "role": "user",
                                                  "content": [{"type": "input_text", "text": "still here"}]})
    assert d.events[-1]["type"] == "conversation.item.done"


def test_a_pause_prepares_a_reply_that_more_speech_drops():
    d = Driver()
    d.take()
    d.send(type="input_audio_buffer.append", audio=pcm24(2000))
    # speech, a 128 ms pause (prepare), speech again (drop), then the real end of turn
    d.s.on_speech_probabilities([0.9] * 10 + [0.0] * 4 + [0.9] * 5, 0.0)
    new = d.pump()
    specs = [a for a in new if isinstance(a, act.Speculate)]
    drops = [a for a in new if isinstance(a, act.DropSpeculation)]
    assert len(specs) == 1 and len(specs[0].pcm16k) > 0 and [x.spec_id for x in drops] == [specs[0].spec_id]
    d.s.on_speech_probabilities([0.0] * 20, 19 * 32.0)
    new = d.pump()
    spec = next(a for a in new if isinstance(a, act.Speculate))
    transcribe = next(a for a in new if isinstance(a, act.Transcribe))
    assert transcribe.spec_id == spec.spec_id  # the prepared transcript is reused
    d.s.on_transcription(transcribe.item_id, "hello")
    start = next(a for a in d.pump() if isinstance(a, act.StartResponse))
    assert start.spec_id == spec.spec_id
    preview = d.s.preview_request("x")
    assert [m.text for m in preview.messages][-2:] == ["hello", "x"]


def test_a_response_whose_input_the_model_cannot_take_ends_failed_once():
    d = Driver(has_vad=False)
    d.take()
    image = {"type": "message", "role": "user", "content": [{"type": "input_image", "image_url": "data:image/png;base64,AAAA"}]}
    d.send(type="response.create", response={"input": [image]})
    types = d.types()
    assert types.count("response.created") == 1 and types.count("response.done") == 1
    assert [e["error"]["code"] for e in d.events if e["type"] == "error"] == ["unsupported_feature"]
    assert d.events[-1]["response"]["status"] == "failed"
    new = d.send(type="response.create")  # the session goes on
    assert any(isinstance(a, act.StartResponse) for a in new)


def test_errors_sent_to_a_client_are_logged_with_session_and_code(caplog):
    import logging

    d = Driver()
    with caplog.at_level(logging.INFO, logger="realtime_omni.session.core"):
        d.send(type="conversation.item.delete", item_id="item_missing")
    assert [e["error"]["code"] for e in d.events if e["type"] == "error"] == ["item_not_found"]
    assert any(d.s.id in r.getMessage() and "item_not_found" in r.getMessage() for r in caplog.records)


def test_the_session_speed_reaches_the_talker_request():
    d = Driver(has_vad=False)
    d.send(type="session.update", session={"type": "realtime", "audio": {"output": {"speed": 1.25}}})
    assert d.events[-1]["session"]["audio"]["output"]["speed"] == 1.25
    d.send(type="conversation.item.create", item={"type": "message", "role": "user",
                                                  "content": [{"type": "input_text", "text": "hi"}]})
    start = next(a for a in d.send(type="response.create") if isinstance(a, act.StartResponse))
    assert start.request.speed == 1.25
    with pytest.raises(ProtocolError) as refused:  # the published range, checked at the edge
        parse_client_event(json.dumps({"type": "session.update", "session": {
            "type": "realtime", "audio": {"output": {"speed": 3.0}}}}))
    assert refused.value.param.endswith("speed")


def test_an_omni_turn_is_prefilled_at_the_pause_with_the_audio_the_commit_holds():
    """Models that hear audio get the turn as it stands at the pause (to evaluate ahead of the
    reply); the message must be exactly what the reply will read, or the head start is lost."""
    d = Driver(SEEING)
    d.take()
    frame = np.full((4, 4, 3), 3, np.uint8)
    d.s.append_image(frame)
    d.send(type="input_audio_buffer.append", audio=base64.b64encode(
        (np.random.default_rng(1).standard_normal(24 * 2000) * 3000).astype("<i2").tobytes()).decode())
    d.s.on_speech_probabilities([0.9] * 10 + [0.0] * 30, 0.0)
    new = d.pump()
    assert not [a for a in new if isinstance(a, act.Speculate)]  # omni models hear the audio: no ASR to prepare
    prefill = next(a for a in new if isinstance(a, act.Prefill))
    start = next(a for a in new if isinstance(a, act.StartResponse))
    assert new.index(prefill) < new.index(start)
    ahead, asked = prefill.request.messages[-1], start.request.messages[-1]
    assert (ahead.role, ahead.text, asked.text) == ("user", "", "")
    assert np.array_equal(ahead.audio, asked.audio) and len(ahead.audio) > 0
    assert ahead.images[0] is frame and asked.images[0] is frame
    assert prefill.request.instructions == start.request.instructions


def test_a_turn_committed_by_hand_is_prefilled_unless_it_cannot_match():
    d = Driver(SEEING, has_vad=False)
    d.send(type="session.update", session={"type": "realtime", "audio": {"input": {"turn_detection": None}}})
    d.send(type="input_audio_buffer.append", audio=pcm24(300))
    new = d.send(type="input_audio_buffer.commit")
    prefill = next(a for a in new if isinstance(a, act.Prefill))
    assert prefill.request.messages[-1].role == "user" and len(prefill.request.messages[-1].audio) > 0
    # with transcription on, the reply reads the transcript too: nothing to prefill ahead of it
    d.send(type="session.update", session={"type": "realtime", "audio": {"input": {"transcription": {"model": "whisper-1"}}}})
    d.send(type="input_audio_buffer.append", audio=pcm24(300))
    new = d.send(type="input_audio_buffer.commit")
    assert not [a for a in new if isinstance(a, act.Prefill)]
    # cascade models read transcripts: never
    c = Driver(has_vad=False)
    c.send(type="session.update", session={"type": "realtime", "audio": {"input": {"turn_detection": None}}})
    c.send(type="input_audio_buffer.append", audio=pcm24(300))
    assert not [a for a in c.send(type="input_audio_buffer.commit") if isinstance(a, act.Prefill)]


def test_a_manual_commit_holds_all_the_audio_appended_whatever_its_rate():
    """100 ms appended in G.711 (8 kHz) or PCM (24 kHz) is 100 ms committed: the resampler's
    filter delay is drained at the commit, not carried into the next turn."""
    for fmt, payload in (("audio/pcmu", base64.b64encode(b"\xff" * 800).decode()), ("audio/pcm", pcm24(100))):
        d = Driver(has_vad=False)
        d.send(type="session.update", session={"type": "realtime", "audio": {"input": {"format": {"type": fmt}}}})
        d.take()
        d.send(type="input_audio_buffer.append", audio=payload)
        d.send(type="input_audio_buffer.commit")
        committed = [e for e in d.events if e["type"] == "input_audio_buffer.committed"]
        assert committed, (fmt, [e for e in d.events if e["type"] == "error"])
        item = list(d.s.conversation)[-1]
        assert abs(len(item.audio16k) - 1600) <= 2, (fmt, len(item.audio16k))  # 100 ms at 16 kHz
        # a clear drops what the resampler held back too: the next turn starts clean
        d.send(type="input_audio_buffer.append", audio=payload)
        d.send(type="input_audio_buffer.clear")
        assert d.s.input.duration_ms == 0 and d.s.input.end_streams().size == 0


def test_a_full_input_buffer_drops_only_its_oldest_excess_even_after_a_peek():
    """Past its bound the buffer drops the oldest samples, as many as it must: a peek (which
    joins the buffer into one chunk) before the append must not make it drop everything."""
    from realtime_omni.audio import Pcm
    from realtime_omni.session.input_buffer import InputAudioBuffer

    buffer = InputAudioBuffer(max_seconds=1.0)
    buffer.append(Pcm(np.arange(14_400, dtype=np.int16), 16_000))  # 0.9 s
    buffer.peek()
    buffer.append(Pcm(np.full(3_200, 7, dtype=np.int16), 16_000))  # 0.2 s more: 0.1 s over
    assert buffer.duration_ms == 1000.0 and buffer.buffer_start == 1_600
    audio = buffer.peek()
    assert audio[0] == 1_600 and audio[-1] == 7 and len(audio) == 16_000


def test_an_audio_part_that_is_not_base64_or_not_whole_samples_gets_its_own_code():
    d = Driver(has_vad=False)
    for audio, code in (("!!notbase64", "invalid_base64"), (base64.b64encode(b"\x01\x02\x03").decode(), "invalid_audio")):
        d.send(type="conversation.item.create", item={"type": "message", "role": "user",
                                                      "content": [{"type": "input_audio", "audio": audio}]})
        error = d.events[-1]["error"]
        assert (error["code"], error["param"]) == (code, "item.content.0.audio")
