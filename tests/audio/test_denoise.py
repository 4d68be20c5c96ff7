"""The RNNoise stream denoiser on Piper speech mixed with white noise (real library, real voice)."""

from __future__ import annotations

import numpy as np
import pytest

from realtime_omni.audio import Pcm
from realtime_omni.audio.denoise import InputDenoiser, StreamDenoiser, available

pytestmark = pytest.mark.skipif(not available(), reason="needs pyrnnoise (the 'denoise' extra)")
RATE = 24_000
LEAD = RATE  # 1 s of noise alone before and after the speech: where the noise floor is measured


@pytest.fixture(scope="module")
def speech() -> np.ndarray:
    pytest.importorskip("piper", reason="needs the 'embedded' extra (Piper voice)")
    from realtime_omni_bench.latency import synthesize_speech

    text = "The quick brown fox jumps over the lazy dog near the river bank."
    return next(iter(synthesize_speech([text], rate=RATE).values())).astype(np.float64)


def mix(speech: np.ndarray, snr_db: float, seed: int = 1) -> np.ndarray:
    clean = np.concatenate([np.zeros(LEAD), speech, np.zeros(LEAD)])
    noise = np.random.default_rng(seed).normal(0.0, 1.0, len(clean))
    noise *= np.sqrt(np.mean(speech**2) / 10 ** (snr_db / 10)) / noise.std()
    return np.clip(np.rint(clean + noise), -32768, 32767).astype(np.int16)


def powers(audio: np.ndarray, speech_len: int) -> tuple[float, float]:
    """(speech power, noise power): the noise from the lead-in, the speech from the speech
    span minus that noise; 100 ms margins cover the denoiser's ~30 ms lag."""
    a = audio.astype(np.float64)
    margin = RATE // 10
    noise = float(np.mean(a[margin:LEAD - margin] ** 2))
    during = float(np.mean(a[LEAD + margin:LEAD + speech_len - margin] ** 2))
    return during - noise, noise


def snr_db(audio: np.ndarray, speech_len: int) -> float:
    signal, noise = powers(audio, speech_len)
    return 10 * np.log10(signal / max(noise, 1e-9))


def test_denoiser_lowers_the_noise_and_keeps_the_speech(speech):
    noisy = mix(speech, snr_db=5)
    cleaned = StreamDenoiser(RATE).process(noisy)
    before, after = snr_db(noisy, len(speech)), snr_db(cleaned, len(speech))
    assert before == pytest.approx(5, abs=1)
    assert after - before >= 20, f"SNR {before:.1f} dB -> {after:.1f} dB"
    # the speech stays (RNNoise gates the gaps, not the voice): most of its power survives
    kept = powers(cleaned, len(speech))[0] / np.mean(speech[RATE // 10:-RATE // 10] ** 2)
    assert 0.5 <= kept <= 1.5, f"speech power kept: {kept:.2f}"


def test_odd_chunks_match_one_pass_within_rounding(speech):
    """Frames are cut from the 48 kHz stream, so chunking does not move them; the output is not
    bit-exact because soxr's streaming rounds differently per chunk (a few LSB), and RNNoise's
    recurrent gains now and then carry that into a louder difference for some frames (over 40
    Piper takes: RMS difference 0.07-1% of the signal's, median difference at most 1 LSB).
    Tolerance: most samples within 2 LSB, the RMS difference under 5%."""
    noisy = mix(speech, snr_db=10)
    whole = StreamDenoiser(RATE).process(noisy).astype(np.float64)
    stream, parts, at = StreamDenoiser(RATE), [], 0
    sizes = [1, 7, 333, 480, 1001, 13, 4097]
    for index in range(len(noisy)):
        if at >= len(noisy):
            break
        size = sizes[index % len(sizes)]
        parts.append(stream.process(noisy[at:at + size]))
        at += size
    chunked = np.concatenate(parts).astype(np.float64)
    assert len(chunked) == len(whole)
    assert np.median(np.abs(chunked - whole)) <= 2
    assert np.sqrt(np.mean((chunked - whole) ** 2)) < 0.05 * whole.std()


def test_input_denoiser_follows_the_setting():
    setting: list[str | None] = [None]
    denoiser = InputDenoiser(lambda: setting[0])
    samples = np.random.default_rng(2).normal(0, 3000, 4800).astype(np.int16)
    audio = Pcm(samples, 24_000)
    assert denoiser.process(audio) is audio  # off: untouched
    setting[0] = "far_field"
    out = denoiser.process(audio)
    assert out.rate == 24_000
    assert out.samples.std() < 0.2 * samples.std()  # white noise alone is mostly removed
