import numpy as np
import pytest

from realtime_omni.audio import AudioFormat, StreamResampler, parse_audio_format
from realtime_omni.audio import g711
from realtime_omni.audio.resample import resample_once


def tone(rate: int, seconds: float = 0.5, freq: float = 440.0) -> np.ndarray:
    t = np.arange(int(rate * seconds)) / rate
    return (np.sin(2 * np.pi * freq * t) * 12000).astype(np.int16)


@pytest.mark.parametrize("encode, decode", [(g711.ulaw_encode, g711.ulaw_decode), (g711.alaw_encode, g711.alaw_decode)])
def test_g711_round_trip_is_close(encode, decode):
    pcm = tone(8000)
    back = decode(encode(pcm)).astype(np.float64)
    snr = 10 * np.log10(np.sum(pcm.astype(np.float64) ** 2) / np.sum((pcm - back) ** 2))
    assert snr > 30  # G.711 gives ~38 dB on a loud tone


def test_g711_known_values():
    # ITU-T G.711: silence encodes to 0xFF (μ-law) and 0xD5 (A-law)
    assert g711.ulaw_encode(np.array([0], np.int16)) == b"\xff"
    assert g711.alaw_encode(np.array([0], np.int16)) == b"\xd5"
    assert g711.ulaw_decode(b"\x00")[0] == -32124


@pytest.mark.parametrize("encode, decode", [(g711.ulaw_encode, g711.ulaw_decode), (g711.alaw_encode, g711.alaw_decode)])
def test_g711_every_code_survives_pcm(encode, decode):
    # audio is PCM inside the server: telephony bytes must come back out as they went in
    # (μ-law's two zeros included: 0x7F decodes to -1, 0xFF to 0)
    codes = bytes(range(256))
    assert encode(decode(codes)) == codes


def test_stream_resampler_has_no_seams():
    pcm = tone(24000, 1.0)
    whole = resample_once(pcm, 24000, 16000)
    rs = StreamResampler(24000, 16000)
    pieces = [rs.process(pcm[i:i + 480]) for i in range(0, len(pcm), 480)] + [rs.flush()]
    streamed = np.concatenate(pieces)
    assert abs(len(streamed) - len(whole)) <= 2
    n = min(len(streamed), len(whole)) - 200
    assert np.max(np.abs(streamed[200:n].astype(int) - whole[200:n].astype(int))) < 200


def test_formats_parse_ga_and_beta_and_reject_others():
    assert parse_audio_format({"type": "audio/pcm", "rate": 24000}) is AudioFormat.PCM
    assert parse_audio_format("g711_alaw") is AudioFormat.PCMA
    with pytest.raises(ValueError):
        parse_audio_format({"type": "audio/pcm", "rate": 16000})
    with pytest.raises(ValueError):
        parse_audio_format("audio/opus")
    with pytest.raises(ValueError):
        AudioFormat.PCM.decode(b"\x00\x01\x02")
