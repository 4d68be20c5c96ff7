"""How ``--model omni:<dir>`` is configured: ``REALTIME_OMNI_OMNI_*`` environment variables."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class OmniSettings(BaseSettings):
    """Every field is ``REALTIME_OMNI_OMNI_<NAME>``; unset chunk sizes take the architecture's
    defaults (see ``model.CHUNK_DEFAULTS``)."""

    model_config = SettingsConfigDict(env_prefix="REALTIME_OMNI_OMNI_", extra="ignore")

    device: str = "cpu"
    #: default: float32 on the CPU, bfloat16 elsewhere
    dtype: Literal["float32", "bfloat16", "float16"] | None = None
    #: codec frames of the first audio chunk (Qwen2.5: 20 ms codes, Qwen3: 80 ms frames)
    first_chunk_frames: int | None = Field(default=None, ge=1)
    #: frames of the steady chunks
    chunk_frames: int | None = Field(default=None, ge=1)
    #: frames of the chunks between the first and the steady ones, e.g. ``[12, 18]``
    ramp_frames: list[int] | None = None
    #: frames of left context each codec window re-renders (chunk seams stay inaudible)
    left_context_frames: int | None = Field(default=None, ge=0)
    #: longest reply in thinker tokens
    max_new_tokens: int = Field(default=1024, ge=1)
    #: longest spoken reply in codec frames (Qwen2.5: 20 ms, Qwen3: 80 ms each)
    talker_max_frames: int = Field(default=4096, ge=1, le=65536)
    #: static KV cache per session (tokens): the longest context a session keeps
    cache_tokens: int = Field(default=8192, ge=64)
    #: replay per-token steps and codec windows as CUDA graphs (CUDA only)
    cuda_graphs: bool = True
    #: live sessions served by the batched stages (one KV slot each); a session beyond it is
    #: refused. 0: every session steps on its own (no batching)
    max_sessions: int = Field(default=16, ge=0, le=1024)
    #: how long a stage's step waits for the other sessions mid-reply to join it (ms)
    batch_gather_ms: float = Field(default=2.0, ge=0.0, le=50.0)
    #: steps a session keeps queued ahead on the batched thinker and talker (1: none ahead)
    lookahead_steps: int = Field(default=12, ge=1, le=32)
    #: benchmarks only: build the model from ``config.json`` with random weights (no weights read)
    random_weights: bool = False

    def model_kwargs(self) -> dict[str, Any]:
        dtype = self.dtype or ("float32" if self.device == "cpu" else "bfloat16")
        kwargs: dict[str, Any] = dict(device=self.device, dtype=dtype, max_new_tokens=self.max_new_tokens,
                                      cache_tokens=self.cache_tokens, cuda_graphs=self.cuda_graphs,
                                      max_sessions=self.max_sessions, batch_gather_ms=self.batch_gather_ms,
                                      lookahead_steps=self.lookahead_steps, random_weights=self.random_weights,
                                      talker_max_new_tokens=self.talker_max_frames)
        for name in ("first_chunk_frames", "chunk_frames", "left_context_frames"):
            value = getattr(self, name)
            if value is not None:
                kwargs[name] = value
        if self.ramp_frames is not None:
            kwargs["ramp_frames"] = tuple(self.ramp_frames)
        return kwargs
