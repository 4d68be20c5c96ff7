"""The end-of-turn model (Smart Turn v3.2) on speech synthesized by the embedded Piper voice.

Piper's prosody is synthetic, and the model judges mostly by prosody: the two phrases used here
are the ones it tells apart with a wide margin (a question, and a trailing "um")."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("faster_whisper")
pytest.importorskip("piper")

from realtime_omni.audio.end_of_turn import COMPLETE, EndOfTurnModel  # noqa: E402
from realtime_omni.audio.resample import resample_once  # noqa: E402
from realtime_omni.engines.embedded.tts_piper import PiperTTS  # noqa: E402
from realtime_omni.engines.settings import EmbeddedSettings  # noqa: E402


@pytest.fixture(scope="module")
def model() -> EndOfTurnModel:
    loaded = EndOfTurnModel.load(EmbeddedSettings().cache_dir)
    assert loaded is not None, "the end-of-turn model could not be fetched (see the log)"
    return loaded


@pytest.fixture(scope="module")
def say():
    tts = PiperTTS(threads=1)

    def _say(text: str) -> np.ndarray:
        pcm = np.concatenate(list(tts.synthesize(text, steady=True)))
        return resample_once(pcm, tts.sample_rate, 16_000)

    return _say


def test_a_question_is_finished_and_a_trailing_um_is_not(model, say):
    pause = np.zeros(3200, np.int16)  # the 200 ms of silence the check comes after
    assert model.probability(np.concatenate([say("What is the capital of France?"), pause])) >= COMPLETE
    assert model.probability(np.concatenate([say("Tell me about the, um"), pause])) < COMPLETE


def test_any_length_and_silence_give_a_probability(model):
    for samples in (0, 1, 16_000, 16 * 8_000, 16 * 20_000):  # empty, tiny, 1 s, exactly 8 s, 20 s
        p = model.probability(np.zeros(samples, np.int16))
        assert 0.0 <= p <= 1.0
