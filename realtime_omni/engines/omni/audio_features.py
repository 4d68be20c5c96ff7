"""The audio encoder's input features (log-mel frames), computed on the model's device for a whole
batch of clips at once.

A turn's audio used to become features on its session's thread, with the checkpoint's
``WhisperFeatureExtractor``: a few milliseconds each, but when dozens of replies start together
those threads run it at the same time, each with its own pool of intra-op threads, and the last
one finished well after the first (32 clips of 4.2 s took 161 ms in threads against 47 ms one
after another, on 2 cores). Here the prompt keeps the waveform, and the prefill that encodes the
clips computes the features of all of them in one pass on the device. The extractor's own batched
path cannot be used as is: it copies its result back to the host, which waits for everything
queued on the device. The arithmetic is the extractor's (its filters, window, clamp and scaling);
a test compares the two.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

import numpy as np

from .device_copy import to_device

#: shortest user audio passed to the audio tower (shorter clips are zero-padded): 0.1 s
MIN_AUDIO_SAMPLES = 1_600
#: longest user audio kept (the feature extractor's 300 s window); longer clips keep their end
MAX_AUDIO_SAMPLES = 300 * 16_000

#: per extractor, its mel filters and window on each device (copied once, at the first prefill
#: with audio: the model's warm-up)
_constants: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_constants_lock = threading.Lock()


def clip_waveform(pcm16k: np.ndarray) -> np.ndarray:
    """A user's 16 kHz audio (int16 or float) as the float32 waveform the encoder reads: its last
    300 s, zero-padded to at least 0.1 s."""
    audio = np.asarray(pcm16k)
    audio = audio.astype(np.float32) / 32768.0 if audio.dtype == np.int16 else audio.astype(np.float32)
    audio = audio.reshape(-1)[-MAX_AUDIO_SAMPLES:]
    if audio.size < MIN_AUDIO_SAMPLES:
        audio = np.pad(audio, (0, MIN_AUDIO_SAMPLES - audio.size))
    return np.ascontiguousarray(audio)


def clip_frames(samples: int, hop: int) -> int:
    """The clip's feature frames (what the extractor's attention mask counts)."""
    return -(-samples // hop)


def _padded_samples(samples: int, hop: int, n_fft: int) -> int:
    # the clip plus one FFT window, whole hops: its valid frames then equal those of the
    # extractor's 300 s "max_length" padding (trailing zeros, same normalisation maximum)
    return -(-(samples + n_fft) // hop) * hop


def log_mel(fe: Any, clips: list[np.ndarray], device: Any) -> list[Any]:
    """Features ``(mel, frames)`` on ``device`` of each waveform of ``clips`` (from
    :func:`clip_waveform`), its valid frames only, computed in batches of similar lengths
    (:func:`length_groups`) without waiting for the device."""
    out: list[Any] = [None] * len(clips)
    for group in length_groups([c.size for c in clips]):
        for index, features in zip(group, _batch(fe, [clips[i] for i in group], device), strict=True):
            out[index] = features
    return out


def length_groups(lengths: list[int], waste: float = 0.25) -> list[list[int]]:
    """Indexes of ``lengths`` in groups padded together, longest first: a group takes the next
    length while padding stays within ``waste`` of its padded size (so a batch holds at most 4/3
    of its clips' samples, and one 300 s clip among 4 s ones is computed alone, not as dozens of
    rows of 300 s)."""
    groups: list[list[int]] = []
    filled = 0  # samples of the open group (the last one)
    for index in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        if groups and filled + lengths[index] >= (1.0 - waste) * lengths[groups[-1][0]] * (len(groups[-1]) + 1):
            groups[-1].append(index)
            filled += lengths[index]
        else:
            groups.append([index])
            filled = lengths[index]
    return groups


def _batch(fe: Any, clips: list[np.ndarray], device: Any) -> list[Any]:
    import torch

    hop, n_fft = int(fe.hop_length), int(fe.n_fft)
    width = max(_padded_samples(c.size, hop, n_fft) for c in clips)
    host = torch.zeros((len(clips), width), dtype=torch.float32)
    for row, clip in enumerate(clips):
        host[row, : clip.size] = torch.from_numpy(clip)
    waves = to_device(host, device)
    if float(getattr(fe, "dither", 0.0)) != 0.0:
        waves = waves + float(fe.dither) * torch.randn_like(waves)
    filters, window = _device_constants(fe, waves.device)
    spectrum = torch.stft(waves, n_fft, hop, window=window, return_complex=True)
    power = (spectrum[..., :-1].abs() ** 2).double()
    # the mel projection in float64: on CUDA the loader lets float32 matmuls use TF32, which
    # would round the extractor's float32 arithmetic away (rounded back to float32 here)
    logs = torch.clamp((filters.T @ power).float(), min=1e-10).log10()  # (B, mel, frames)
    out = []
    for row, clip in enumerate(clips):
        # each clip's floor is its own maximum less 8 (over its own padded length, as alone)
        own = logs[row, :, : _padded_samples(clip.size, hop, n_fft) // hop]
        floored = torch.maximum(own, own.max() - 8.0)
        out.append(((floored + 4.0) / 4.0)[:, : clip_frames(clip.size, hop)])
    return out


def _device_constants(fe: Any, device: Any) -> tuple[Any, Any]:
    """The extractor's mel filters (float64) and window on ``device``, copied once (a plain
    copy, finished before any stream reads them)."""
    import torch

    key = str(device)
    with _constants_lock:
        per_device = _constants.setdefault(fe, {})
        if key not in per_device:
            filters = torch.from_numpy(np.asarray(fe.mel_filters, dtype=np.float64))
            per_device[key] = (filters.to(device), torch.hann_window(int(fe.n_fft)).to(device))
        return per_device[key]
