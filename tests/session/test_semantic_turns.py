"""semantic_vad: an end-of-turn model may end a turn at a short pause; a pause it judges
unfinished runs to the (longer) silence window. The state machine and the core, without a model."""

from __future__ import annotations

from realtime_omni.session import actions as act
from realtime_omni.session.config import SEMANTIC_CHECK_MS, SEMANTIC_MAX_WAIT_MS
from realtime_omni.session.core import RealtimeSession
from realtime_omni.session.turn_detection import SpeechStarted, SpeechStopped, TurnCheck, TurnDetector
from tests.session.test_core import CASCADE, Driver, pcm24

SPEECH, QUIET = 0.95, 0.0


def frames(*runs: tuple[float, int]) -> list[float]:
    return [p for p, n in runs for _ in range(n)]


def test_the_detector_asks_once_per_pause_and_ends_only_the_pause_it_asked_about():
    detector = TurnDetector(0.5, 2000, check_after_ms=200)
    decisions = detector.feed(frames((SPEECH, 10), (QUIET, 8)), 0.0)  # 8 frames of 32 ms: 256 ms
    checks = [d for d in decisions if isinstance(d, TurnCheck)]
    assert isinstance(decisions[0], SpeechStarted) and len(checks) == 1
    assert checks[0].audio_end_ms == 320  # where the pause began
    old = checks[0]
    # the user goes on: the old pause's answer changes nothing, the new pause gets its own check
    decisions = detector.feed(frames((SPEECH, 5), (QUIET, 8)), 18 * 32.0)
    new = [d for d in decisions if isinstance(d, TurnCheck)]
    assert len(new) == 1 and new[0].pause != old.pause
    assert detector.end_now(old) is None and detector.in_speech
    stopped = detector.end_now(new[0])
    assert stopped == SpeechStopped(new[0].audio_end_ms) and not detector.in_speech
    assert detector.end_now(new[0]) is None  # once


def test_without_an_answer_the_long_window_ends_the_turn():
    detector = TurnDetector(0.5, 2000, check_after_ms=200)
    decisions = detector.feed(frames((SPEECH, 10), (QUIET, 70)), 0.0)  # 2.24 s of silence
    assert [type(d).__name__ for d in decisions if not isinstance(d, TurnCheck)][-1] == "SpeechStopped"


def semantic(d: Driver, eagerness: str = "auto") -> None:
    d.send(type="session.update", session={"type": "realtime", "audio": {"input": {
        "turn_detection": {"type": "semantic_vad", "eagerness": eagerness}}}})
    d.take()


def speak(d: Driver, probabilities: list[float], start_ms: float = 0.0) -> list:
    d.send(type="input_audio_buffer.append", audio=pcm24(int(len(probabilities) * 32) + 100))
    d.s.on_speech_probabilities(probabilities, start_ms)
    return d.pump()


def test_a_finished_turn_ends_at_the_short_pause():
    d = Driver()
    d.s = RealtimeSession(CASCADE, end_of_turn=True)
    d.s.start()
    d.pump()
    semantic(d)
    assert d.s.detector.check_after_ms == SEMANTIC_CHECK_MS
    assert d.s.detector.silence_duration_ms == SEMANTIC_MAX_WAIT_MS["auto"]
    new = speak(d, frames((SPEECH, 20), (QUIET, 10)))
    check = next(a for a in new if isinstance(a, act.CheckTurnEnd))
    assert len(check.pcm16k) >= 16 * 640  # the turn so far, the pause included
    assert "input_audio_buffer.speech_stopped" not in d.types()
    d.s.on_turn_end_verdict(check.check, complete=True, probability=0.97)
    d.pump()
    types = d.types()
    assert types.index("input_audio_buffer.speech_stopped") < types.index("input_audio_buffer.committed")
    assert "response.created" in types
    stopped = next(e for e in d.events if e["type"] == "input_audio_buffer.speech_stopped")
    assert stopped["audio_end_ms"] == check.check.audio_end_ms


def test_an_unfinished_turn_waits_for_the_window_by_eagerness():
    d = Driver()
    d.s = RealtimeSession(CASCADE, end_of_turn=True)
    d.s.start()
    d.pump()
    semantic(d, "high")
    new = speak(d, frames((SPEECH, 20), (QUIET, 10)))
    check = next(a for a in new if isinstance(a, act.CheckTurnEnd))
    d.s.on_turn_end_verdict(check.check, complete=False, probability=0.03)
    d.pump()
    assert "input_audio_buffer.speech_stopped" not in d.types()
    speak(d, frames((QUIET, 1000 // 32)), 30 * 32.0)  # high: 1 s of silence ends it anyway
    assert "input_audio_buffer.speech_stopped" in d.types()


def test_without_the_model_semantic_vad_is_a_silence_window():
    d = Driver()  # end_of_turn False: no model on this server
    semantic(d, "low")
    assert d.s.detector.check_after_ms is None and d.s.detector.silence_duration_ms == 900
    new = speak(d, frames((SPEECH, 20), (QUIET, 10)))
    assert not any(isinstance(a, act.CheckTurnEnd) for a in new)
