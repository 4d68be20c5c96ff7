"""audio.input.noise_reduction in the session core: reported, applied to what the model hears,
turned off by null, refused with a code for bad values or a missing denoiser package."""

from __future__ import annotations

import base64
import json
import sys

import numpy as np
import pytest

from realtime_omni.audio.denoise import PACKAGE, available
from realtime_omni.protocol import parse_client_event
from realtime_omni.protocol.errors import ProtocolError
from tests.session.test_core import CASCADE, ECHO, Driver

needs_denoiser = pytest.mark.skipif(not available(), reason="needs pyrnnoise (the 'denoise' extra)")


def noise24(ms: int, seed: int = 3) -> np.ndarray:
    return np.random.default_rng(seed).normal(0, 3000, 24 * ms).astype(np.int16)


def echo_session() -> Driver:
    d = Driver(ECHO, has_vad=False)
    d.take()  # session.created
    return d


def update(d: Driver, noise_reduction) -> list[dict]:
    raw = json.dumps({"type": "session.update",
                      "session": {"type": "realtime", "audio": {"input": {"noise_reduction": noise_reduction}}}})
    try:
        d.s.receive(parse_client_event(raw))
    except ProtocolError as exc:  # what the runner does with an event the schema refuses
        d.s.error(exc)
    d.pump()
    return d.take()


def echoed(d: Driver, pcm: np.ndarray) -> np.ndarray:
    """Append ``pcm`` in 20 ms chunks; the echo model's audio deltas, joined."""
    for start in range(0, len(pcm), 480):
        d.send(type="input_audio_buffer.append", audio=base64.b64encode(pcm[start:start + 480].tobytes()).decode())
    deltas = [e["delta"] for e in d.take() if e["type"] == "response.output_audio.delta"]
    return np.frombuffer(b"".join(base64.b64decode(x) for x in deltas), np.int16)


@needs_denoiser
def test_near_field_is_reported_and_the_model_hears_less_noise():
    d = echo_session()
    events = update(d, {"type": "near_field"})
    assert [e["type"] for e in events] == ["session.updated"]
    assert events[0]["session"]["audio"]["input"]["noise_reduction"] == {"type": "near_field"}
    noise = noise24(1000)
    heard = echoed(d, noise)
    assert len(heard) > 0.9 * len(noise)  # delayed by a frame and the resamplers, not dropped
    assert heard.astype(float).std() < 0.1 * noise.std()


@needs_denoiser
def test_null_turns_it_off_again():
    d = echo_session()
    update(d, {"type": "far_field"})
    events = update(d, None)
    assert events[0]["session"]["audio"]["input"]["noise_reduction"] is None
    noise = noise24(200)
    assert np.array_equal(echoed(d, noise), noise)


@needs_denoiser
def test_the_input_buffer_holds_denoised_audio():
    d = Driver(CASCADE, has_vad=False)
    update(d, {"type": "near_field"})
    noise = noise24(1000)
    d.send(type="input_audio_buffer.append", audio=base64.b64encode(noise.tobytes()).decode())
    buffered = d.s.input.peek()
    assert len(buffered) > 0.9 * 16 * 1000
    assert buffered.astype(float).std() < 0.1 * noise.std()


@pytest.mark.parametrize(("value", "code"), [
    ({"type": "loud"}, "invalid_event"),  # the SDK schema's enum
    ({"type": 7}, "invalid_event"),
    ({}, "invalid_value"),  # the schema allows no type; a denoiser needs one
    ("near_field", "invalid_event"),
])
def test_bad_values_are_an_error_and_the_session_goes_on(value, code):
    d = echo_session()
    events = update(d, value)
    assert [e["type"] for e in events] == ["error"]
    assert events[0]["error"]["code"] == code
    assert "noise_reduction" in (events[0]["error"]["param"] or "")
    assert d.s.config.noise_reduction is None
    assert [e["type"] for e in update(d, None)] == ["session.updated"]


def test_a_missing_package_is_unsupported_and_the_session_goes_on(monkeypatch):
    # a None entry in sys.modules is how Python spells "this import fails": the package is absent
    monkeypatch.setitem(sys.modules, PACKAGE, None)
    d = echo_session()
    events = update(d, {"type": "near_field"})
    assert [e["type"] for e in events] == ["error"]
    assert events[0]["error"]["code"] == "unsupported_feature"
    assert PACKAGE in events[0]["error"]["message"]
    assert d.s.config.noise_reduction is None
    noise = noise24(100)
    assert np.array_equal(echoed(d, noise), noise)  # the session still works, unfiltered
