"""The decoder's shape and the names of its graph's inputs and outputs.

Kept apart from the GGUF reader and the graph builder (which import ``gguf`` and ``onnx``), so a
start that finds the graph already built imports neither.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class LlamaShape:
    layers: int
    hidden: int
    ffn: int
    heads: int
    kv_heads: int
    vocab: int
    rope_base: float
    rms_eps: float
    context: int

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


#: the dtype of the caches the graph takes and returns
CACHE_DTYPE = np.float32


def past_name(layer: int, kind: str) -> str:
    return f"past.{layer}.{kind}"


def present_name(layer: int, kind: str) -> str:
    return f"present.{layer}.{kind}"
