"""Running the engine's Triton kernels in tests: compiled on a GPU, else in Triton's interpreter
on the CPU (where Triton is installed: it comes with torch's CUDA wheels, not the CPU ones)."""

from __future__ import annotations

from collections.abc import Iterator
from types import ModuleType

import pytest
import torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def kernels_of(module: ModuleType, monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    """For a fixture: ``module`` with its kernels compiled afresh (interpreted on the CPU)."""
    if DEVICE == "cpu":  # the interpreter stands in for the GPU (read when Triton is imported)
        monkeypatch.setenv("TRITON_INTERPRET", "1")
        monkeypatch.setattr(module, "_on_device", lambda hidden: True)
    pytest.importorskip("triton", reason="Triton is not installed (it comes with torch's CUDA wheels)")
    cache = getattr(module, "_kernels", None) or module._kernel
    cache.cache_clear()
    yield module
    cache.cache_clear()
