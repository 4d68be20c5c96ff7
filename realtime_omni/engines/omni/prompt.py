"""Chat-template rendering of conversation messages into thinker tokens and multimodal inputs."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..base import TurnMessage
from .audio_features import clip_frames, clip_waveform
from .loader import LoadedOmni, audio_token_count
from .tool_calls import call_body, response_text


@dataclass
class Rendered:
    ids: list[int]
    #: float32 16 kHz waveforms: their features are computed with the prefill that encodes them
    audio_clips: list[np.ndarray] = field(default_factory=list)
    audio_lengths: list[int] = field(default_factory=list)  # their feature frames
    pixel_values: list[Any] = field(default_factory=list)
    image_grids: list[list[int]] = field(default_factory=list)
    items: list[tuple[int, str, Any]] = field(default_factory=list)  # (offset, kind, value)


def norm_text(text: str) -> str:
    return " ".join((text or "").split())


def _digest(array: np.ndarray) -> str:
    return hashlib.blake2b(np.ascontiguousarray(array).tobytes(), digest_size=12).hexdigest()


def fingerprint(message: TurnMessage) -> tuple:
    if message.role == "assistant" and message.call is not None:
        return ("assistant", "call", norm_text(call_body(message.call)))
    if message.role == "assistant":
        return ("assistant", norm_text(message.text))
    audio = _digest(message.audio) if message.audio is not None and len(message.audio) else ""
    images = tuple(_digest(img) for img in message.images)
    return (message.role, norm_text(message.text), audio, images)


class PromptRenderer:
    """Qwen chat-template rendering straight to token ids (placeholders expanded)."""

    def __init__(self, loaded: LoadedOmni) -> None:
        self.loaded = loaded
        self.tok = loaded.tokens

    def encode(self, text: str) -> list[int]:
        return list(self.loaded.tokenizer.encode(text, add_special_tokens=False)) if text else []

    def header(self, role: str) -> list[int]:
        return [self.tok.im_start, *self.tok.role[role], *self.tok.newline]

    def closing(self) -> list[int]:
        return [self.tok.im_end, *self.tok.newline]

    def render(self, message: TurnMessage) -> Rendered:
        if message.role == "assistant" and message.call is not None:
            return self._call(message)
        if message.role == "tool":  # a function's output comes back as a user message
            return Rendered(ids=self.header("user") + self.encode(response_text(message.text)) + self.closing())
        out = Rendered(ids=self.header(message.role))
        if message.role == "user":
            for image in message.images:
                self._image(out, image)
            if message.audio is not None and len(message.audio):
                self._audio(out, message.audio)
        out.ids += self.encode(message.text)
        out.ids += self.closing()
        return out

    def _call(self, message: TurnMessage) -> Rendered:
        """A function call the model made (or a client replayed), as the model writes one."""
        tools = self.loaded.tools
        if tools is None:
            raise ValueError("this omni checkpoint has no function-call tokens; the conversation holds a call")
        assert message.call is not None
        body = self.encode(call_body(message.call))
        return Rendered(ids=self.header("assistant") + [tools.open, *body, tools.close] + self.closing())

    def _audio(self, out: Rendered, pcm16k: np.ndarray) -> None:
        clip = clip_waveform(pcm16k)
        length = clip_frames(clip.size, int(self.loaded.feature_extractor.hop_length))
        n_tokens = audio_token_count(self.loaded, length)
        out.items.append((len(out.ids), "audio", length))
        out.ids += [self.tok.audio_start] + [self.tok.audio] * n_tokens + [self.tok.audio_end]
        out.audio_clips.append(clip)
        out.audio_lengths.append(length)

    def _image(self, out: Rendered, image: np.ndarray) -> None:
        ip = self.loaded.image_processor
        if ip is None or self.tok.image is None or self.tok.vision_start is None:
            raise ValueError("this omni checkpoint has no image input")
        arr = np.asarray(image)
        if arr.ndim == 2:
            arr = np.repeat(arr[..., None], 3, axis=-1)
        if arr.ndim != 3 or arr.shape[-1] not in (3, 4):
            raise ValueError(f"images must be HxWx3 uint8 arrays, got shape {arr.shape}")
        arr = np.ascontiguousarray(arr[..., :3].astype(np.uint8))
        res = ip(images=[arr], return_tensors="pt")
        grid = [int(v) for v in res["image_grid_thw"][0]]
        merge = int(getattr(ip, "merge_size", 2))
        n_tokens = grid[0] * grid[1] * grid[2] // (merge * merge)
        out.items.append((len(out.ids), "image", grid))
        out.ids += [self.tok.vision_start] + [self.tok.image] * n_tokens + [self.tok.vision_end]
        out.pixel_values.append(res["pixel_values"])
        out.image_grids.append(grid)


