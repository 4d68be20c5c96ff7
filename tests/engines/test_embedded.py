"""The embedded cascade against the real pip-installed models (no mocks).

Loads everything once per module (~3 s on 2 cores); every test is a short real inference.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

pytest.importorskip("llguidance")
pytest.importorskip("faster_whisper")
pytest.importorskip("piper")

from realtime_omni.audio import Pcm
from realtime_omni.audio.resample import resample_once
from realtime_omni.engines.base import ThinkerOutput, ThinkRequest, TurnMessage
from realtime_omni.engines.echo import EchoModel
from realtime_omni.engines.embedded import EmbeddedModel
from realtime_omni.engines.embedded.asr_whisper import MIN_WINDOW, WhisperASR, looks_looped, window_frames
from realtime_omni_bench.wer import words

QUESTION = "What is the capital of France?"
SILENCE = 8_000  # 0.5 s at 16 kHz


@pytest.fixture(scope="module")
def model() -> EmbeddedModel:
    loaded = EmbeddedModel()
    messages: list[str] = []
    loaded.load(messages.append)
    assert any("VAD" in m for m in messages) and any("TTS" in m for m in messages)
    yield loaded
    loaded.close()


@pytest.fixture(scope="module")
def question_16k(model: EmbeddedModel) -> np.ndarray:
    """Piper's rendition of QUESTION at 16 kHz, with 0.5 s of silence on both sides."""
    speech = np.concatenate(list(model.tts.synthesize(QUESTION, steady=True)))
    speech16 = resample_once(speech, model.info.output_rate, 16_000)
    silence = np.zeros(SILENCE, dtype=np.int16)
    clip = np.concatenate([silence, speech16, silence])
    return np.concatenate([clip, np.zeros(-len(clip) % 512, dtype=np.int16)])


def request(messages: list[TurnMessage], **kwargs) -> ThinkRequest:
    return ThinkRequest(
        instructions=kwargs.pop("instructions", ""),
        messages=messages,
        max_output_tokens=kwargs.pop("max_output_tokens", None),
        voice="alloy",
        want_audio=True,
        **kwargs,
    )


def test_info(model: EmbeddedModel) -> None:
    assert model.info.id == "embedded"
    assert model.info.output_rate == 22_050
    assert not model.info.hears_audio
    expected = {"audio_in", "text_in", "audio_out", "text_out", "transcription"}
    assert expected <= model.info.capabilities


def test_vad_separates_speech_from_silence(model: EmbeddedModel, question_16k: np.ndarray) -> None:
    session = model.open_session()
    try:
        vad = session.new_vad()
        probs = np.array(vad.probabilities(question_16k))
    finally:
        session.close()
    frames_in_silence = SILENCE // 512  # frames lying wholly inside each silent margin
    assert probs[:frames_in_silence].max() < 0.2
    assert probs[-frames_in_silence + 4 :].max() < 0.2  # 4 frames (128 ms) of decay allowed
    # Speech is where the signal itself is loud, not the whole synthesized span: Piper pads its
    # output with near-silence of varying length, which a fixed slice would count as speech.
    frames = question_16k[: len(probs) * 512].reshape(len(probs), 512).astype(np.float64)
    level_dbfs = 20 * np.log10(np.sqrt((frames**2).mean(axis=1)) / 32768 + 1e-12)
    voiced = probs[level_dbfs > -40]
    assert len(voiced) > 10
    assert np.mean(voiced > 0.5) > 0.9
    assert voiced.max() > 0.95


def test_vad_state_is_per_stream(model: EmbeddedModel, question_16k: np.ndarray) -> None:
    whole = model.vad.stream().probabilities(question_16k)
    a, b = model.vad.stream(), model.vad.stream()
    interleaved_a: list[float] = []
    for start in range(0, len(question_16k), 2048):  # interleave two streams frame-block-wise
        chunk = question_16k[start : start + 2048]
        interleaved_a += a.probabilities(chunk)
        b.probabilities(chunk[::-1].copy())
    np.testing.assert_allclose(interleaved_a, whole, atol=1e-5)
    a.reset()
    np.testing.assert_allclose(a.probabilities(question_16k[:4096]), whole[:8], atol=1e-5)
    with pytest.raises(ValueError):
        a.probabilities(np.zeros(100, dtype=np.int16))


def test_whisper_transcribes_piper_speech(model: EmbeddedModel, question_16k: np.ndarray) -> None:
    session = model.open_session()
    try:
        text = session.transcribe(question_16k).lower()
    finally:
        session.close()
    assert "capital" in text and "france" in text
    assert model.asr.transcribe(np.zeros(800, dtype=np.int16)) == ""


def test_whisper_short_window_hears_what_the_full_window_hears(model: EmbeddedModel, question_16k: np.ndarray) -> None:
    asr = model.asr
    assert window_frames(len(question_16k)) == MIN_WINDOW  # a 2.5 s turn: the 10 s window
    retried = asr.retried
    short = asr.transcribe(question_16k)
    assert asr.retried == retried  # it ended on its own, without looping
    full = WhisperASR(short_windows=False).transcribe(question_16k)
    assert words(short) == words(full) and "france" in words(short)


def test_whisper_long_turn_takes_the_full_window(model: EmbeddedModel, question_16k: np.ndarray) -> None:
    long_turn = np.tile(question_16k, 12)  # ~30 s: no short window holds it
    assert window_frames(len(long_turn)) is None
    retried = model.asr.retried
    assert words(model.asr.transcribe(long_turn)).count("france") >= 5
    assert model.asr.retried == retried


def test_whisper_short_window_retries_a_loop_in_the_full_window(
        model: EmbeddedModel, question_16k: np.ndarray, monkeypatch: pytest.MonkeyPatch) -> None:
    asr = model.asr
    retried = asr.retried
    # what a short window gives when Whisper loops, and when it runs into its cap
    for looped in (("yes. yes. yes. yes.", True), ("what is the capital of", False)):
        monkeypatch.setattr(asr, "_transcribe_window", lambda audio, window, out=looped: out)
        assert "france" in words(asr.transcribe(question_16k))
    assert asr.retried == retried + 2


@pytest.mark.parametrize(("text", "looped"), [
    ("", False), ("yes", False), ("yes yes", False), ("yes. yes. yes.", True), ("No no NO", True),
    ("tell me a story about a dragon", False), ("a b c a b c a b c", True), ("x a b a b a b", True),
    ("a b c a b c", False),
])
def test_looks_looped(text: str, looped: bool) -> None:
    assert looks_looped(text) is looped


@pytest.mark.parametrize(("seconds", "frames"), [(0.0, 1000), (2.0, 1000), (8.0, 1000), (8.01, 1500),
                                                 (23.0, 2500), (23.01, None), (600.0, None)])
def test_window_frames(seconds: float, frames: int | None) -> None:
    assert window_frames(int(seconds * 16_000)) == frames


def test_llm_streams_and_reuses_the_previous_turn(model: EmbeddedModel) -> None:
    session = model.open_session()
    cache = session._thinker._instance.result()
    try:
        before = cache.evaluated
        history = [TurnMessage("user", QUESTION)]
        first = list(session.think(request(history)))
        assert len(first) >= 3, first
        assert first[0].prompt_tokens and first[0].prefilled_tokens
        assert all(out.prompt_tokens is None for out in first[1:])
        # the warm-up already holds the default system prompt: only the user turn is new
        assert first[0].prefilled_tokens < first[0].prompt_tokens
        # evaluated: the prefill, then every generated token but the last one (the stop token)
        assert cache.evaluated - before == first[0].prefilled_tokens + len(cache.tokens) - first[0].prompt_tokens
        reply = "".join(out.text for out in first)
        assert "paris" in reply.lower()

        before, length = cache.evaluated, len(cache.tokens)
        history += [TurnMessage("assistant", reply), TurnMessage("user", "And what about Germany?")]
        second = list(session.think(request(history)))
        assert second and second[0].prompt_tokens > first[0].prompt_tokens
        # only the closing of the reply plus the new user turn are evaluated
        assert second[0].prefilled_tokens < 25
        assert second[0].prefilled_tokens * 3 < second[0].prompt_tokens
        # the cache kept what the prompts share: only the prefill was evaluated before generating
        generated = len(cache.tokens) - second[0].prompt_tokens
        assert cache.evaluated - before == second[0].prefilled_tokens + generated
        assert len(cache.tokens) - generated - second[0].prefilled_tokens <= length
    finally:
        session.close()


def test_llm_moves_a_full_conversation_forward_while_the_reply_plays(model: EmbeddedModel) -> None:
    """When the next turn would overflow the context, the oldest turns are dropped and the rest
    evaluated right after the reply, so the user's next turn does not pay for it."""
    session = model.open_session()
    thinker = session._thinker
    try:
        # about 1 900 tokens of conversation with 100 kept for the reply: it fits, the next turn
        # (another ~100 tokens of reply and a message) would not
        def filler(turn: int) -> str:  # each message its own, so no two conversations share a prefix
            return " ".join(f"Item {turn * 12 + n} is a grey pebble." for n in range(12))

        history: list[TurnMessage] = []
        total = 0
        while total < 1_700:
            for role in ("user", "assistant"):
                history.append(TurnMessage(role, filler(len(history))))
                total += len(thinker._shared.text_tokens(history[-1].text)) + 5
        history.append(TurnMessage("user", "Say yes."))
        first = list(session.think(request(history, max_output_tokens=100)))
        assert first[0].prompt_tokens > 1_700
        evaluated = thinker.window_ahead.result(timeout=60)
        assert 500 < evaluated < first[0].prompt_tokens  # the newer half
        reply = "".join(out.text for out in first)
        history += [TurnMessage("assistant", reply), TurnMessage("user", "And what about Germany?")]
        second = list(session.think(request(history, max_output_tokens=100)))
        # the next turn starts from what was evaluated ahead: only its own message is new
        assert second[0].prompt_tokens < first[0].prompt_tokens
        assert second[0].prefilled_tokens < 30, second[0]
        # a reply that leaves room for the next turn moves nothing
        assert thinker.window_ahead.result(timeout=60) == 0
    finally:
        session.close()


def test_llm_cancellation_max_tokens_and_confirm(model: EmbeddedModel) -> None:
    session = model.open_session()
    try:
        history = [TurnMessage("user", "Tell me a very long story about a dragon and a knight.")]
        req = request(history, max_output_tokens=150)
        outputs: list[ThinkerOutput] = []
        for out in session.think(req):
            outputs.append(out)
            if len(outputs) == 3:
                req.cancelled.set()
        assert 3 <= len(outputs) <= 4

        capped = list(session.think(request(history, max_output_tokens=4)))
        assert 1 <= len(capped) <= 4
        full = "".join(out.text for out in capped)

        # Interrupted after a few words: the next prompt carries just the heard part, and it
        # reuses the cache up to the cut rather than re-evaluating the conversation.
        heard = full[: max(1, len(full) // 2)]
        session.confirm(heard)
        history += [TurnMessage("assistant", full), TurnMessage("user", "Stop, thanks.")]
        after = list(session.think(request(history)))
        assert after and after[0].prefilled_tokens < 20
    finally:
        session.close()


def test_sessions_think_concurrently(model: EmbeddedModel) -> None:
    sessions = [model.open_session() for _ in range(2)]
    replies: dict[int, str] = {}

    def run(index: int) -> None:
        messages = [TurnMessage("user", QUESTION)]
        req = request(messages, instructions="Be brief.", max_output_tokens=24)
        replies[index] = "".join(out.text for out in sessions[index].think(req))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=30)
    finally:
        for session in sessions:
            session.close()
    assert all(replies.get(i) for i in range(2)), replies


def test_close_releases_the_context_cache(model: EmbeddedModel) -> None:
    session = model.open_session()
    list(session.think(request([TurnMessage("user", "Hi!")], max_output_tokens=8)))
    cache = session._thinker._instance.result()
    assert len(cache.tokens) > 30  # system prompt, the turn, the reply
    session.close()
    assert cache.tokens == [] and cache._past == []
    with pytest.raises(RuntimeError):
        next(iter(session.think(request([TurnMessage("user", "Hi!")]))))


def test_piper_talk(model: EmbeddedModel) -> None:
    session = model.open_session()
    try:
        text = "Sure, here it is. Paris is **lovely** in spring!"
        pieces = ("Sure, here", " it is. Paris is **lovely** in spring!")
        segment = [ThinkerOutput(text=piece) for piece in pieces]
        start = time.perf_counter()
        outputs = []
        for out in session.talk(segment, "alloy", threading.Event(), final=True):
            outputs.append((time.perf_counter() - start, out))
        assert len(outputs) == 2  # one per sentence
        assert outputs[0][0] < 1.0
        assert "".join(out.text for _, out in outputs) == text
        assert [out.final for _, out in outputs] == [False, True]
        for _, out in outputs:
            assert out.audio is not None and out.audio.dtype == np.int16
            assert 0.3 * 22_050 < len(out.audio) < 4 * 22_050  # markdown is not read out
            assert np.abs(out.audio).max() > 3_000

        # unspeakable text still reaches the transcript; a cancelled talk yields nothing
        blank_segment = [ThinkerOutput(text=" ** ")]
        (blank,) = session.talk(blank_segment, "verse", threading.Event(), final=True)
        assert blank.text == " ** " and blank.final and len(blank.audio) == 0
        cancelled = threading.Event()
        cancelled.set()
        assert list(session.talk(segment, "alloy", cancelled, final=True)) == []
    finally:
        session.close()


def test_piper_speaks_faster_and_slower_at_the_session_speed(model: EmbeddedModel) -> None:
    session = model.open_session()
    text = [ThinkerOutput(text="The quick brown fox jumps over the lazy dog near the river bank.")]

    def seconds(speed: float) -> float:  # Piper samples its timing: the mean of three takes
        takes = [sum(len(o.audio) for o in session.talk(text, "alloy", threading.Event(), True, speed))
                 for _ in range(3)]
        return float(np.mean(takes)) / 22_050

    try:
        normal, fast, slow = seconds(1.0), seconds(1.5), seconds(0.5)
    finally:
        session.close()
    assert fast < 0.8 * normal < 0.8 * 0.8 * slow, (fast, normal, slow)  # ~0.67x and ~2x


def test_echo_model_is_inert() -> None:
    echo = EchoModel()
    echo.load()
    assert echo.info.id == "echo" and "echo" in echo.info.capabilities
    session = echo.open_session()
    assert list(session.think(request([TurnMessage("user", "hi")]))) == []
    assert list(session.talk([ThinkerOutput(text="hi")], "alloy", threading.Event(), True)) == []
    assert session.new_vad() is None
    heard = Pcm(np.arange(160, dtype=np.int16), 8000)
    assert echo.info.duplex and session.listen(heard) is heard
    session.close()
