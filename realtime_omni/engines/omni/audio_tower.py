"""Qwen3-Omni's audio encoder without waiting for the device.

transformers' encoder derives its chunk layout from the clip lengths on the device: the chunk
lengths, the valid frames after the convolutions and the attention windows each read tensors
back (``.tolist()``, ``.item()``, a loop over a device tensor), and every one of its 32 layers
reads the window lengths back again to split its attention. Each read waits for everything
queued on the stream; under load that is the other sessions' decode steps, so one prefill
waited on the device some forty times. The clip lengths are known on the host before anything
runs: here the same layout is computed there (the same formulas) and handed to the encoder,
which accepts it precomputed, with the window boundaries kept on the host. The embeddings are
the encoder's own (the tests compare them with ``get_audio_features``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .audio_features import log_mel
from .device_copy import to_device


def _after_convs(lengths: np.ndarray, n_window: int) -> np.ndarray:
    """Frames after the encoder's three stride-2 convolutions (its own formula)."""
    chunk = n_window * 2
    leave = lengths % chunk
    feat = (leave - 1) // 2 + 1
    return ((feat - 1) // 2 + 1 - 1) // 2 + 1 + (lengths // chunk) * 13


def encoder_layout(feature_lens: list[int], n_window: int, n_window_infer: int) -> dict[str, Any]:
    """Chunk lengths, valid output frames and attention windows for clips of ``feature_lens``
    mel frames, as host arrays (what ``chunk_and_pad_features``, ``get_valid_indices`` and
    ``get_audio_cu_seqlens`` compute on the device)."""
    lens = np.asarray(feature_lens, dtype=np.int64)
    chunk = n_window * 2
    counts = -(-lens // chunk)  # ceil
    chunk_lengths = np.full(int(counts.sum()), chunk, dtype=np.int64)
    tails = np.cumsum(counts) - 1
    chunk_lengths[tails] = lens % chunk
    chunk_lengths[chunk_lengths == 0] = chunk
    after = _after_convs(chunk_lengths, n_window)
    width = int(after.max())
    valid = (np.arange(width)[None, :] < after[:, None]).reshape(-1).nonzero()[0]
    window = width * (n_window_infer // chunk)
    bounds = [0]
    for cnn_len in _after_convs(lens, n_window).tolist():
        bounds += [window] * (cnn_len // window)
        if cnn_len % window:
            bounds.append(cnn_len % window)
    cu_seqlens = np.cumsum(bounds).astype(np.int32)
    return {"chunk_lengths": chunk_lengths, "valid_indices": valid, "cu_seqlens": cu_seqlens,
            "max_seqlen": int(np.diff(cu_seqlens).max()) if len(cu_seqlens) > 1 else 0}


def encode_audio(loaded: Any, features: list[Any]) -> Any:
    """Audio embeddings of ``features`` (``(mel, frames)`` tensors on the device, each its valid
    frames), in clip order, as ``(tokens, hidden)`` on the device: the placeholders' rows of the
    thinker."""
    import torch

    tower = loaded.thinker.model.audio_tower
    cfg = tower.config
    lens = [int(f.shape[-1]) for f in features]
    layout = encoder_layout(lens, int(cfg.n_window), int(cfg.n_window_infer))
    flat = torch.cat([f.float() for f in features], dim=-1)  # (mel, total frames)
    pieces = flat.T.split(layout["chunk_lengths"].tolist(), dim=0)
    padded = torch.nn.utils.rnn.pad_sequence(list(pieces), batch_first=True).transpose(1, 2)
    device = loaded.device
    dtype = next(tower.parameters()).dtype
    out = tower(
        None, feature_lens=None, return_dict=True,
        padded_feature=padded.contiguous().to(device=device, dtype=dtype),
        chunk_lengths=torch.as_tensor(layout["chunk_lengths"]),
        valid_indices=to_device(torch.as_tensor(layout["valid_indices"], dtype=torch.long), device),
        cu_seqlens=torch.as_tensor(layout["cu_seqlens"]),  # stays on the host: the layers split by it
        max_seqlen=layout["max_seqlen"],
    )
    return out.last_hidden_state


def merge_audio(loaded: Any, ids: Any, mm: dict[str, Any]) -> dict[str, Any]:
    """The thinker's inputs for ``ids`` (host ``(B, T)``) with the waveforms of
    ``mm["audio_clips"]`` turned into features on the device, all at once
    (:func:`~.audio_features.log_mel`): returns the forward's keyword arguments (``input_ids``
    and what else ``mm`` holds). Qwen3's clips are encoded here (:func:`encode_audio`) and written
    into their placeholders' rows (``inputs_embeds``); Qwen2.5's features are handed on
    (``input_features`` and its mask) to the audio tower of its own forward."""
    import torch

    rest = {k: v for k, v in mm.items() if k != "audio_clips"}
    device = loaded.device
    device_ids = to_device(ids, device)
    clips = mm.get("audio_clips")
    if not clips:
        return {"input_ids": device_ids, **rest}
    features = log_mel(loaded.feature_extractor, clips, device)
    if loaded.arch != "qwen3_omni_moe":
        frames = max(int(f.shape[-1]) for f in features)
        dtype = next(loaded.thinker.model.audio_tower.parameters()).dtype
        batch = torch.stack([torch.nn.functional.pad(f, (0, frames - f.shape[-1])) for f in features])
        mask = torch.zeros((len(features), frames), dtype=torch.long)
        for row, f in enumerate(features):
            mask[row, : f.shape[-1]] = 1
        return {"input_ids": device_ids, "input_features": batch.to(dtype), "feature_attention_mask":
                to_device(mask, device), **rest}
    embeds = loaded.thinker.model.get_input_embeddings()(device_ids)
    audio = encode_audio(loaded, features).to(embeds.dtype)
    where = torch.nonzero(ids.reshape(-1) == int(loaded.tokens.audio)).reshape(-1)
    if where.numel() != audio.shape[0]:
        raise ValueError(f"{where.numel()} audio placeholders for {audio.shape[0]} audio embeddings")
    flat = embeds.reshape(-1, embeds.shape[-1]).index_copy(0, to_device(where, device), audio)
    return {"input_ids": device_ids, "inputs_embeds": flat.view_as(embeds), **rest}
