"""Read a llama-type GGUF file (SmolLM2's) into arrays ONNX Runtime's quantized ops take.

The ``gguf`` package parses the file (memory-mapped) and dequantizes; this module re-packs the
weights as ``MatMulNBits`` 8-bit blocks with uint8 zero points, the fast path of ONNX Runtime's
CPU kernels (4-bit blocks with the float zero points Q4_1 needs run ~30x slower there). A Q8_0
block (``w = d·q``) maps exactly (zero point 128); a Q4_1 block's 16 levels are re-quantized to
256 levels over the same range.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np

from .shape import LlamaShape

BLOCK = 32  # values per quantization block, for both Q4_1 and Q8_0


@dataclass(frozen=True)
class BlockQuantized:
    """``MatMulNBits``'s B input, row-major over output features ``n`` (K = input features)."""

    bits: int
    k: int
    n: int
    packed: np.ndarray  # uint8 [n, k/32, 32·bits/8]
    scales: np.ndarray  # float32 [n · k/32]
    zero_points: np.ndarray  # uint8 [n · k/32] (8 bit)


def _field(reader: gguf.GGUFReader, key: str):
    field = reader.fields.get(key)
    if field is None:
        raise ValueError(f"GGUF field {key!r} missing: not a llama-type model file")
    return field.contents()


class GgufLlama:
    """The shape, weights and tokenizer tables of one llama-architecture GGUF file."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.reader = gguf.GGUFReader(self.path)
        arch = _field(self.reader, "general.architecture")
        if arch != "llama":
            raise ValueError(f"{self.path}: architecture {arch!r}, expected 'llama'")
        p = f"{arch}."
        self.shape = LlamaShape(
            layers=int(_field(self.reader, p + "block_count")),
            hidden=int(_field(self.reader, p + "embedding_length")),
            ffn=int(_field(self.reader, p + "feed_forward_length")),
            heads=int(_field(self.reader, p + "attention.head_count")),
            kv_heads=int(_field(self.reader, p + "attention.head_count_kv")),
            vocab=len(self.reader.fields["tokenizer.ggml.tokens"].data),
            rope_base=float(_field(self.reader, p + "rope.freq_base")),
            rms_eps=float(_field(self.reader, p + "attention.layer_norm_rms_epsilon")),
            context=int(_field(self.reader, p + "context_length")),
        )
        self._tensors = {t.name: t for t in self.reader.tensors}

    # -- tokenizer tables --------------------------------------------------------------------

    def tokens(self) -> list[str]:
        return list(_field(self.reader, "tokenizer.ggml.tokens"))

    def token_types(self) -> list[int]:
        return [int(t) for t in _field(self.reader, "tokenizer.ggml.token_type")]

    def merges(self) -> list[str]:
        return list(_field(self.reader, "tokenizer.ggml.merges"))

    # -- weights -----------------------------------------------------------------------------

    def has(self, name: str) -> bool:
        return name in self._tensors

    def vector(self, name: str) -> np.ndarray:
        tensor = self._tensors[name]
        if tensor.tensor_type != gguf.GGMLQuantizationType.F32:
            raise ValueError(f"{name}: expected F32, found {tensor.tensor_type.name}")
        return np.asarray(tensor.data, dtype=np.float32).reshape(-1)

    def dense(self, name: str) -> np.ndarray:
        """Dequantized [rows, cols] (rows = output features / vocabulary entries)."""
        tensor = self._tensors[name]
        cols, rows = (int(x) for x in tensor.shape)
        return gguf.quants.dequantize(tensor.data, tensor.tensor_type).reshape(rows, cols).astype(np.float32)

    def block_quantized(self, name: str) -> BlockQuantized:
        tensor = self._tensors[name]
        k, n = (int(x) for x in tensor.shape)
        raw = np.ascontiguousarray(tensor.data).view(np.uint8).reshape(n, -1)
        match tensor.tensor_type:
            case gguf.GGMLQuantizationType.Q8_0:
                return _from_q8_0(raw, k, n)
            case other:  # Q4_1 and the rest: dequantize, then 8-bit blocks with zero points
                return _to_q8(self.dense(name), other.name)


def _from_q8_0(raw: np.ndarray, k: int, n: int) -> BlockQuantized:
    blocks = raw.reshape(n, k // BLOCK, 34)  # d: f16, 32 signed bytes
    d = blocks[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
    q = blocks[..., 2:34].view(np.int8).astype(np.int16) + 128
    return BlockQuantized(8, k, n, np.ascontiguousarray(q.astype(np.uint8)), d.reshape(-1),
                          np.full(d.size, 128, dtype=np.uint8))


def _to_q8(dense: np.ndarray, kind: str) -> BlockQuantized:
    """Asymmetric 8-bit blocks: a 4-bit source block's 16 levels land within 1/255 of its range."""
    n, k = dense.shape
    if k % BLOCK:
        raise ValueError(f"a {kind} tensor of width {k} does not split into blocks of {BLOCK}")
    blocks = dense.reshape(n, k // BLOCK, BLOCK)
    low = np.minimum(blocks.min(axis=-1), 0.0)  # zero stays representable
    high = np.maximum(blocks.max(axis=-1), 0.0)
    scale = (high - low) / 255.0
    safe = np.where(scale == 0, 1.0, scale)
    zero_point = np.round(-low / safe).clip(0, 255)
    q = np.round(blocks / safe[..., None] + zero_point[..., None]).clip(0, 255).astype(np.uint8)
    return BlockQuantized(8, k, n, q, scale.reshape(-1).astype(np.float32),
                          zero_point.reshape(-1).astype(np.uint8))
