"""Load a local Qwen2.5-Omni / Qwen3-Omni checkpoint (or build one from a config) for streaming.

Only local directories are accepted: the server never reaches a model hub. What is read:

* ``config.json`` — required; its ``model_type`` (``qwen2_5_omni`` / ``qwen3_omni_moe``) or its
  ``architectures`` decide the architecture;
* the weights (``*.safetensors``) through ``from_pretrained``;
* the tokenizer files (``tokenizer.json`` / ``vocab.json`` + ``merges.txt``);
* ``preprocessor_config.json`` when present (Whisper-style log-mel feature extractor and the
  Qwen2-VL image processor); without it (tiny test checkpoints) both are built from defaults that
  follow the config (``num_mel_bins``, vision ``patch_size`` / ``spatial_merge_size``);
* ``spk_dict.pt`` (Qwen2.5-Omni speakers: x-vector, reference mel, talker BOS token). Without it a
  deterministic placeholder speaker is made, so random-weight checkpoints still speak.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

from .assets import (
    Arch,
    ByteTokenizer,
    SpecialTokens,
    default_processors,
    load_processors,
    load_speakers,
    load_tokenizer,
    placeholder_speakers,
    special_tokens,
)
from .tool_calls import ToolSupport

#: model_type / architectures spellings that map to each supported architecture
_MODEL_TYPES: dict[str, Arch] = {"qwen2_5_omni": "qwen2_5_omni", "qwen3_omni_moe": "qwen3_omni_moe"}
_ARCH_PREFIXES: dict[str, Arch] = {
    "Qwen2_5Omni": "qwen2_5_omni",
    "Qwen2OmniModel": "qwen2_5_omni",
    "Qwen3OmniMoe": "qwen3_omni_moe",
}
_THINKER_ONLY = {"qwen2_5_omni_thinker", "qwen3_omni_moe_thinker"}

_DTYPES = {"float32": "float32", "fp32": "float32", "bfloat16": "bfloat16", "bf16": "bfloat16",
           "float16": "float16", "fp16": "float16"}


def read_config(path: str | Path) -> dict[str, Any]:
    """``config.json`` of a local checkpoint directory, with readable errors."""
    root = Path(path).expanduser()
    if not root.exists():
        raise ValueError(f"omni checkpoint path does not exist: {root}")
    if not root.is_dir():
        raise ValueError(f"omni checkpoint path is not a directory: {root}")
    cfg_file = root / "config.json"
    if not cfg_file.is_file():
        raise ValueError(
            f"no config.json in {root}: expected a Qwen2.5-Omni or Qwen3-Omni checkpoint directory "
            "(config.json, *.safetensors, tokenizer files)"
        )
    try:
        return json.loads(cfg_file.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"cannot read {cfg_file}: {exc}") from exc


def detect_architecture(config: dict[str, Any], where: str = "config.json") -> Arch:
    """``qwen2_5_omni`` or ``qwen3_omni_moe`` from a config dict; ValueError for anything else."""
    model_type = str(config.get("model_type") or "")
    if model_type in _MODEL_TYPES:
        return _MODEL_TYPES[model_type]
    for name in config.get("architectures") or []:
        for prefix, arch in _ARCH_PREFIXES.items():
            if str(name).startswith(prefix):
                return arch
    if model_type in _THINKER_ONLY:
        raise ValueError(
            f"{where}: model_type {model_type!r} is a thinker-only checkpoint (no talker / codec); "
            "the omni engine needs the full model with audio output"
        )
    raise ValueError(
        f"{where}: unsupported architecture (model_type={model_type!r}, "
        f"architectures={config.get('architectures')!r}); the omni engine supports "
        "Qwen2.5-Omni (model_type 'qwen2_5_omni') and Qwen3-Omni (model_type 'qwen3_omni_moe')"
    )


def resolve_dtype(dtype: Any):
    import torch

    if isinstance(dtype, torch.dtype):
        return dtype
    name = _DTYPES.get(str(dtype).replace("torch.", "").lower())
    if name is None:
        raise ValueError(f"unsupported dtype {dtype!r}; use float32, bfloat16 or float16")
    return getattr(torch, name)


def model_class(arch: Arch):
    import transformers

    if arch == "qwen2_5_omni":
        return transformers.Qwen2_5OmniForConditionalGeneration
    return transformers.Qwen3OmniMoeForConditionalGeneration


def config_class(arch: Arch):
    import transformers

    if arch == "qwen2_5_omni":
        return transformers.Qwen2_5OmniConfig
    return transformers.Qwen3OmniMoeConfig


@dataclass
class LoadedOmni:
    """Everything a session needs, shared read-only by all sessions."""

    arch: Arch
    path: Path | None
    model: Any
    config: Any
    tokenizer: Any
    feature_extractor: Any
    image_processor: Any | None
    device: Any
    dtype: Any
    tokens: SpecialTokens
    #: Qwen2.5: name → {"cond": x-vector, "ref_mel": [1, T, mel], "bos_token": int};
    #: Qwen3: name → codec speaker id
    speakers: dict[str, Any] = field(default_factory=dict)
    default_speaker: str = ""
    cache_kwarg: str = "cache"
    #: the model's function-call format (None: the model takes no tools)
    tools: ToolSupport | None = None
    #: Qwen3's code predictor frames in the lean layout where it applies (the model's settings)
    lean_code_predictor: bool = True

    @property
    def thinker(self):
        return self.model.thinker

    @property
    def device_type(self) -> str:
        import torch

        return torch.device(self.device).type

    def graph_streams(self, stage: str) -> dict[str, Any]:
        """Where a stage's graphs warm up (its own stream, in order with its replays) and where
        they are captured (a stream of the stage's own: its cuBLAS workspace goes into them)."""
        return {"run_stream": self.stream(stage), "capture_stream": self.stream(f"{stage} capture")}

    def stream(self, stage: str) -> Any:
        """The CUDA stream of one pipeline stage (shared by all sessions); None off CUDA, of the
        stage's :data:`STREAM_PRIORITY`: where kernels of several streams wait for the GPU, it
        starts those of the more urgent stream first."""
        if self.device_type != "cuda":
            return None
        streams = self.__dict__.setdefault("_streams", {})
        if stage not in streams:
            import torch

            stream = streams[stage] = torch.cuda.Stream(self.device, priority=STREAM_PRIORITY.get(stage, 0))
            if stage.endswith(" capture"):
                _prime_cublas(stream, self.device)
        return streams[stage]

    @property
    def talker(self):
        return self.model.talker

    def speaker_for(self, voice: str | None) -> str:
        """Map a session voice (OpenAI names like ``alloy`` or a speaker name) to a speaker."""
        if voice:
            for name in self.speakers:
                if name.lower() == voice.lower():
                    return name
        return self.default_speaker


# ---------------------------------------------------------------------------------------------
# loading


def load_omni(
    path: str | Path,
    device: str = "cpu",
    dtype: Any = "float32",
    attn_implementation: str | None = "sdpa",
    progress: Callable[[str], None] = lambda _msg: None,
) -> LoadedOmni:
    """Load a local checkpoint directory; raises ValueError with a readable message on bad input."""

    root = Path(path).expanduser()
    raw = read_config(root)
    arch = detect_architecture(raw, where=str(root / "config.json"))
    torch_dtype = resolve_dtype(dtype)
    has_weights = any(root.glob("*.safetensors")) or any(root.glob("*.bin"))
    if not has_weights:
        raise ValueError(f"no weights (*.safetensors) in {root}")
    progress(f"loading {arch} from {root} ({device}, {torch_dtype})")
    cls = model_class(arch)
    kwargs: dict[str, Any] = {"dtype": torch_dtype, "local_files_only": True}
    if attn_implementation:
        kwargs["attn_implementation"] = attn_implementation
    if str(device).startswith("cuda"):
        kwargs["device_map"] = device
    # Qwen2_5OmniForConditionalGeneration.from_pretrained insists on spk_dict.pt; go through the
    # base implementation and load the speakers ourselves (optional for random test checkpoints).
    from transformers import PreTrainedModel

    try:
        model = PreTrainedModel.from_pretrained.__func__(cls, str(root), **kwargs)
    except (OSError, ValueError, RuntimeError, KeyError) as exc:
        raise ValueError(f"cannot load {arch} weights from {root}: {exc}") from exc
    if not str(device).startswith("cuda"):
        model.to(device)
    model.eval()
    tokenizer = load_tokenizer(root)
    feature_extractor, image_processor = load_processors(root, arch, model.config)
    speakers, default = load_speakers(root, arch, model, device)
    return _finish(arch, root, model, tokenizer, feature_extractor, image_processor, device,
                   torch_dtype, speakers, default)


def build_random(
    config: Any,
    device: str = "cuda",
    dtype: Any = "bfloat16",
    tokenizer: Any = None,
    attn_implementation: str | None = "sdpa",
    progress: Callable[[str], None] = lambda _msg: None,
) -> LoadedOmni:
    """Real-size model with random weights (benchmarks): built on the meta device, materialized
    with ``to_empty`` on ``device`` and initialised with the model's own ``_init_weights`` (which
    also recomputes the non-persistent buffers: rotary frequencies, anti-alias filters, ...).

    ``config`` is a config object, a config dict, or a path to a (reconstructed) config.json.
    ``tokenizer`` may be None: a byte-level stand-in is used (ids only matter for shapes).
    """
    import torch

    if isinstance(config, (str, Path)):
        raw = json.loads(Path(config).read_text())
        arch = detect_architecture(raw, where=str(config))
        config = config_class(arch).from_dict(raw)
    elif isinstance(config, dict):
        arch = detect_architecture(config)
        config = config_class(arch).from_dict(config)
    else:
        arch = detect_architecture({"model_type": config.model_type})
    if attn_implementation:
        config._attn_implementation = attn_implementation
        for sub in ("thinker_config", "talker_config", "token2wav_config", "code2wav_config"):
            if getattr(config, sub, None) is not None:
                getattr(config, sub)._attn_implementation = attn_implementation
    torch_dtype = resolve_dtype(dtype)
    # sub-configs may carry their own ``dtype`` (the released Qwen3 config says bfloat16 for the
    # thinker); build every part in the requested one
    for cfg_obj in (config, *(getattr(config, n, None) for n in ("thinker_config", "talker_config",
                                                                 "token2wav_config", "code2wav_config"))):
        if cfg_obj is not None:
            try:
                cfg_obj.dtype = torch_dtype
            except Exception:  # noqa: BLE001
                pass
    cls = model_class(arch)
    previous = torch.get_default_dtype()
    progress(f"building {arch} on meta ({torch_dtype})")
    torch.set_default_dtype(torch_dtype)
    try:
        with torch.device("meta"):
            model = cls(config)
    finally:
        torch.set_default_dtype(previous)
    progress(f"materializing on {device}")
    model.to_empty(device=device)
    for module in model.modules():
        if hasattr(module, "_is_hf_initialized"):
            module._is_hf_initialized = False
    with torch.no_grad():
        # NaN sentinels: whatever ``_init_weights`` leaves alone (e.g. the SnakeBeta alpha/beta of
        # the vocoders, which their constructors set to zeros) is initialised generically below
        tensors = list(model.parameters()) + [b for b in model.buffers() if b.is_floating_point()]
        for t in tensors:
            t.fill_(float("nan"))
        model.initialize_weights()
        missed = []
        for name, p in model.named_parameters():
            if torch.isnan(p).any():
                missed.append(name)
                if p.ndim <= 1:
                    p.zero_()
                else:
                    p.normal_(0.0, 0.02)
        bad_buffers = [n for n, b in model.named_buffers() if b.is_floating_point() and torch.isnan(b).any()]
        if bad_buffers:
            raise RuntimeError(f"buffers left uninitialised after to_empty: {bad_buffers[:5]}")
        if missed:
            log.info("initialised %d parameters generically (e.g. %s)", len(missed), missed[0])
    if arch == "qwen2_5_omni":
        model.token2wav.float()
    model.eval()
    if tokenizer is None:
        tokenizer = ByteTokenizer(config)
    fe, ip = default_processors(arch, model.config)
    speakers, default = placeholder_speakers(arch, model, device)
    return _finish(arch, None, model, tokenizer, fe, ip, device, torch_dtype, speakers, default)


def _finish(arch, root, model, tokenizer, fe, ip, device, torch_dtype, speakers, default) -> LoadedOmni:
    import inspect

    import torch

    if arch == "qwen2_5_omni" and getattr(model, "token2wav", None) is not None:
        model.token2wav.float()  # the DiT / BigVGAN run in float32 (as the reference generate does)
    if arch == "qwen3_omni_moe" and torch.device(device).type == "cuda":
        _grouped_experts(model)
    if torch.device(device).type == "cuda":
        from .fused import fuse_rms_norms, use_short_attention

        fuse_rms_norms(model)
        if arch == "qwen3_omni_moe":  # the code predictor's 17-token cache: three kernels, not SDPA's
            use_short_attention(model.talker.code_predictor.model.config)
        # the float32 codec (Qwen2.5's DiT and BigVGAN) on tensor cores: TF32 matmuls, as convs
        # already are by default; the bf16 thinker and talker are unaffected
        torch.backends.cuda.matmul.allow_tf32 = True
    params = inspect.signature(model.thinker.model.forward).parameters
    cache_kwarg = "cache" if "cache" in params else "past_key_values"
    tokens = special_tokens(arch, model.config, tokenizer)
    tools = ToolSupport.of(tokenizer, vocab=int(model.thinker.lm_head.weight.shape[0]))
    return LoadedOmni(
        arch=arch, path=root, model=model, config=model.config, tokenizer=tokenizer,
        feature_extractor=fe, image_processor=ip, device=torch.device(device), dtype=torch_dtype,
        tokens=tokens, speakers=speakers, default_speaker=default, cache_kwarg=cache_kwarg, tools=tools,
    )


#: CUDA stream priority per stage (lower is more urgent; others, the prefills among them, 0).
#: First the decode steps, which every live session waits for frame by frame, and the copies of
#: each reply token's rows that a session thread waits for (``streams.settled_copies``); then the
#: codec, whose windows are due a chunk's length ahead; then the prefills, which would otherwise
#: hold the live sessions' steps for hundreds of ms. A talker step of 4 ms alone takes 8-20 ms
#: beside the codec's passes (Qwen2.5 on the H100); putting the decode steps above the codec
#: (they shared its priority before 13b5cee) changed that no more than two runs of one build
#: differ (docs/benchmarks/omni-qwen25-mixing.md): the GPU does not preempt a running kernel.
STREAM_PRIORITY = {"thinker": -2, "talker": -2, "token rows": -2, "codec": -1}


def _prime_cublas(stream: Any, device: Any) -> None:
    """Allocate cuBLAS / cuBLASLt workspaces for a capture stream now, in the ordinary memory
    pool: graphs captured on it bake these in, and warm-ups never run on it (they run on the
    stage's stream, in order with its replays)."""
    import torch

    with torch.cuda.stream(stream):
        for dtype in (torch.float32, torch.bfloat16):
            a = torch.ones((16, 16), device=device, dtype=dtype)
            torch.mm(a, a)
            torch.addmm(a[0], a, a)  # the cuBLASLt path (bias epilogue)
    stream.synchronize()


def _grouped_experts(model) -> None:
    """MoE layers through grouped GEMMs: the eager expert loop syncs with the host per layer
    (``nonzero``), which is slow and cannot be captured in a CUDA graph."""
    try:
        model.set_experts_implementation("grouped_mm")
    except (AttributeError, ValueError, ImportError) as exc:
        log.warning("omni: grouped-GEMM experts unavailable (%s); MoE layers run the eager loop", exc)


def audio_token_count(loaded: LoadedOmni, feature_len: int) -> int:
    """Number of audio placeholder tokens the thinker's audio tower produces for ``feature_len``
    mel frames (the processor's formula for each architecture)."""
    import torch

    if loaded.arch == "qwen2_5_omni":
        _, out = loaded.thinker.model.audio_tower._get_feat_extract_output_lengths(torch.tensor([feature_len]))
        return int(out[0])
    from transformers.models.qwen3_omni_moe import modeling_qwen3_omni_moe as m3

    n_window = int(getattr(loaded.config.thinker_config.audio_config, "n_window", 50))
    return int(m3._get_feat_extract_output_lengths(torch.tensor([feature_len]), n_window)[0])


def samples_per_code(loaded: LoadedOmni) -> int:
    """24 kHz samples per talker code frame (Qwen2.5: 2 mel frames × 240; Qwen3: 1920)."""
    if loaded.arch == "qwen2_5_omni":
        t2w = loaded.config.token2wav_config
        hop = math.prod(t2w.bigvgan_config.upsample_rates)
        return int(hop * t2w.dit_config.repeats)
    c2w = loaded.config.code2wav_config
    return int(math.prod(list(c2w.upsample_rates) + list(c2w.upsampling_ratios)))
