"""What a checkpoint brings besides its weights: the tokenizer, the audio and image processors,
the speakers (Qwen2.5-Omni's ``spk_dict.pt``) and the special token ids the streaming engine
needs; with stand-ins (byte tokenizer, default processors, placeholder speakers) for config-only
checkpoints with random weights."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

log = logging.getLogger(__name__)

Arch = Literal["qwen2_5_omni", "qwen3_omni_moe"]


@dataclass
class SpecialTokens:
    """Token ids the streaming engine needs, resolved from the config and the tokenizer."""

    im_start: int
    im_end: int
    newline: list[int]
    role: dict[str, list[int]]  # "system"/"user"/"assistant" → ids of "<role>\n" minus the newline
    eos: list[int]
    audio_start: int
    audio_end: int
    audio: int
    vision_start: int | None
    vision_end: int | None
    image: int | None
    user_token_id: int
    assistant_token_id: int | None


def load_tokenizer(root: Path):
    from transformers import AutoTokenizer

    if not any((root / name).exists() for name in ("tokenizer.json", "vocab.json", "tokenizer_config.json")):
        raise ValueError(f"no tokenizer files (tokenizer.json or vocab.json + merges.txt) in {root}")
    try:
        return AutoTokenizer.from_pretrained(str(root), local_files_only=True)
    except (OSError, ValueError, KeyError) as exc:
        raise ValueError(f"cannot load the tokenizer from {root}: {exc}") from exc


def _thinker_cfg(config):
    return config.thinker_config


def load_processors(root: Path, arch: Arch, config):
    fe, ip = default_processors(arch, config)
    pre = root / "preprocessor_config.json"
    if not pre.is_file():
        return fe, ip
    try:
        data = json.loads(pre.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"cannot read {pre}: {exc}") from exc
    from transformers import Qwen2VLImageProcessor, WhisperFeatureExtractor

    fe_keys = ("feature_size", "sampling_rate", "hop_length", "chunk_length", "n_fft", "padding_value",
               "dither", "return_attention_mask")
    fe = WhisperFeatureExtractor(**{k: data[k] for k in fe_keys if k in data})
    if ip is not None:
        ip_keys = ("patch_size", "merge_size", "temporal_patch_size", "min_pixels", "max_pixels",
                   "image_mean", "image_std")
        ip = _quiet(lambda: Qwen2VLImageProcessor(**{k: data[k] for k in ip_keys if k in data}))
    return fe, ip


def default_processors(arch: Arch, config):
    from transformers import WhisperFeatureExtractor

    thinker = _thinker_cfg(config)
    mel = int(thinker.audio_config.num_mel_bins)
    fe = WhisperFeatureExtractor(
        feature_size=mel, sampling_rate=16_000, hop_length=160, chunk_length=300, n_fft=400,
        padding_value=0.0, dither=0.0, return_attention_mask=True,
    )
    ip = None
    vision = getattr(thinker, "vision_config", None)
    if vision is not None:
        try:
            from transformers import Qwen2VLImageProcessor

            kw = dict(patch_size=int(vision.patch_size), merge_size=int(vision.spatial_merge_size),
                      temporal_patch_size=int(vision.temporal_patch_size))
            if arch == "qwen3_omni_moe":
                kw.update(image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5])
            ip = _quiet(lambda: Qwen2VLImageProcessor(**kw))
        except Exception as exc:  # noqa: BLE001 - images are optional
            log.warning("image input disabled: %s", exc)
            ip = None
    return fe, ip


def _quiet(fn):
    import logging as _logging

    tlog = _logging.getLogger("transformers")
    level = tlog.level
    tlog.setLevel(_logging.ERROR)
    try:
        from transformers.utils import logging as hf_logging

        hf_level = hf_logging.get_verbosity()
        hf_logging.set_verbosity_error()
    except Exception:  # noqa: BLE001
        hf_logging, hf_level = None, None
    try:
        return fn()
    finally:
        tlog.setLevel(level)
        if hf_logging is not None:
            hf_logging.set_verbosity(hf_level)


def load_speakers(root: Path, arch: Arch, model, device) -> tuple[dict[str, Any], str]:
    import torch

    if arch == "qwen3_omni_moe":
        return placeholder_speakers(arch, model, device)
    spk = root / "spk_dict.pt"
    if not spk.is_file():
        log.warning("%s has no spk_dict.pt: using a placeholder speaker (random-weight checkpoints only)", root)
        return placeholder_speakers(arch, model, device)
    try:
        data = torch.load(spk, weights_only=True, map_location="cpu")
    except Exception as exc:  # noqa: BLE001
        raise ValueError(f"cannot read {spk}: {exc}") from exc
    speakers = {}
    for name, value in data.items():
        speakers[str(name)] = {
            "cond": torch.as_tensor(value["cond"]).float().reshape(-1),
            "ref_mel": torch.as_tensor(value["ref_mel"]).float().reshape(1, -1, value["ref_mel"].shape[-1]),
            "bos_token": int(value["bos_token"]),
        }
    if not speakers:
        raise ValueError(f"{spk} holds no speakers")
    default = "Chelsie" if "Chelsie" in speakers else next(iter(speakers))
    return speakers, default


def placeholder_speakers(arch: Arch, model, device) -> tuple[dict[str, Any], str]:
    import torch

    cfg = model.config
    if arch == "qwen3_omni_moe":
        ids = dict(cfg.talker_config.speaker_id or {})
        if not ids:
            ids = {"ethan": int(cfg.talker_config.codec_pad_id)}
        speakers = {name.capitalize(): int(v) for name, v in ids.items()}
        default = "Ethan" if "Ethan" in speakers else next(iter(speakers))
        return speakers, default
    dit = cfg.token2wav_config.dit_config
    gen = torch.Generator().manual_seed(1234)
    bos = int(cfg.talker_config.tts_text_start_token_id)
    speakers = {
        "Chelsie": {
            "cond": torch.randn(int(dit.enc_emb_dim), generator=gen) * 0.1,
            "ref_mel": torch.randn(1, 300, int(dit.mel_dim), generator=gen) * 0.1,
            "bos_token": bos,
        }
    }
    return speakers, "Chelsie"


# ---------------------------------------------------------------------------------------------
# token ids


def _token_id(tokenizer, names: tuple[str, ...]) -> int | None:
    unk = getattr(tokenizer, "unk_token_id", None)
    for name in names:
        try:
            tid = tokenizer.convert_tokens_to_ids(name)
        except Exception:  # noqa: BLE001
            tid = None
        if isinstance(tid, int) and tid >= 0 and tid != unk:
            return tid
    return None


def _encode(tokenizer, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


def special_tokens(arch: Arch, config, tokenizer) -> SpecialTokens:
    th = config.thinker_config

    def cfg(obj, *names):
        for name in names:
            value = getattr(obj, name, None)
            if value is not None:
                return int(value)
        return None

    im_start = _token_id(tokenizer, ("<|im_start|>",))
    im_end = _token_id(tokenizer, ("<|im_end|>",))
    if arch == "qwen3_omni_moe":
        im_start = cfg(config, "im_start_token_id") if im_start is None else im_start
        im_end = cfg(config, "im_end_token_id") if im_end is None else im_end
    else:
        im_start = cfg(th, "bos_token_id") if im_start is None else im_start
        im_end = cfg(th, "eos_token_id") if im_end is None else im_end
    if im_start is None or im_end is None:
        raise ValueError("the tokenizer has no <|im_start|> / <|im_end|> tokens")
    if arch == "qwen2_5_omni":
        audio = cfg(th, "audio_token_index", "audio_token_id")
        image = cfg(th, "image_token_index", "image_token_id")
    else:
        audio = cfg(th, "audio_token_id")
        image = cfg(th, "image_token_id")
    audio_start = cfg(th, "audio_start_token_id")
    audio_end = cfg(th, "audio_end_token_id")
    if audio_end is None:
        audio_end = _token_id(tokenizer, ("<|audio_eos|>", "<|audio_end|>"))
    vision_start = cfg(th, "vision_start_token_id")
    if vision_start is None:
        vision_start = _token_id(tokenizer, ("<|vision_bos|>", "<|vision_start|>"))
    vision_end = cfg(th, "vision_end_token_id")
    if vision_end is None:
        vision_end = _token_id(tokenizer, ("<|vision_eos|>", "<|vision_end|>"))
    if audio is None or audio_start is None or audio_end is None:
        raise ValueError("config lacks the audio placeholder token ids")
    newline = _encode(tokenizer, "\n")
    role = {}
    for name in ("system", "user", "assistant"):
        ids = _encode(tokenizer, name + "\n")
        if ids[-len(newline):] == newline:
            ids = ids[: -len(newline)]
        role[name] = ids
    user_token_id = cfg(th, "user_token_id") or cfg(config, "user_token_id") or role["user"][0]
    assistant_token_id = cfg(config, "assistant_token_id") or role["assistant"][0]
    eos = {im_end}
    for extra in (_token_id(tokenizer, ("<|endoftext|>",)), getattr(tokenizer, "eos_token_id", None)):
        if isinstance(extra, int):
            eos.add(extra)
    if arch == "qwen3_omni_moe":
        eos = {im_end}  # Qwen3-Omni's generate stops on <|im_end|> only (thinker_eos_token_id)
    return SpecialTokens(
        im_start=im_start, im_end=im_end, newline=newline, role=role, eos=sorted(eos),
        audio_start=audio_start, audio_end=audio_end, audio=audio,
        vision_start=vision_start, vision_end=vision_end, image=image,
        user_token_id=user_token_id, assistant_token_id=assistant_token_id,
    )


class ByteTokenizer:
    """A byte-level stand-in tokenizer for random-weight benchmarks without tokenizer files.

    Bytes map to ids 0..255; the chat special tokens and the role words map to the ids the config
    names (or to the Qwen vocabulary's ids), so prompts have the real structure. Decoding skips ids
    that are not bytes.
    """

    unk_token_id = None
    eos_token_id = None

    def __init__(self, config):
        th = config.thinker_config
        user = getattr(th, "user_token_id", None) or getattr(config, "user_token_id", None) or 872
        self.special = {
            "<|im_start|>": getattr(config, "im_start_token_id", None) or getattr(th, "bos_token_id", None) or 151644,
            "<|im_end|>": getattr(config, "im_end_token_id", None) or getattr(th, "eos_token_id", None) or 151645,
            "<|endoftext|>": 151643,
        }
        words = {
            "system": getattr(config, "system_token_id", None) or 8948,
            "user": user,
            "assistant": getattr(config, "assistant_token_id", None) or 77091,
        }
        vocab = int(th.get_text_config().vocab_size) if hasattr(th, "get_text_config") else 1 << 30
        self.words = {w: i for w, i in words.items() if int(i) < vocab}  # else: plain bytes

    def convert_tokens_to_ids(self, token: str):
        return self.special.get(token)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        import re

        ids: list[int] = []
        pattern = "(" + "|".join(re.escape(t) for t in [*self.special, *self.words]) + ")"
        for piece in re.split(pattern, text):
            if piece in self.special:
                ids.append(int(self.special[piece]))
            elif piece in self.words:
                ids.append(int(self.words[piece]))
            elif piece:
                ids.extend(piece.encode("utf-8"))
        return ids

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return bytes(int(i) for i in ids if 0 <= int(i) < 256).decode("utf-8", errors="replace")
