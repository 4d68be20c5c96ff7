"""Running the engine's Triton kernels in tests: compiled on a GPU, else in Triton's interpreter
on the CPU (where Triton is installed: it comes with torch's CUDA wheels, not the CPU ones)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from types import ModuleType

import pytest
import torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# Triton picks its interpreter when it is imported: chosen here, as the tests are collected,
# before any test imports it
if DEVICE == "cpu" and "triton" not in sys.modules:
    os.environ["TRITON_INTERPRET"] = "1"
INTERPRETED = DEVICE == "cpu" and os.environ.get("TRITON_INTERPRET") == "1"


def kernels_of(module: ModuleType, monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    """For a fixture: ``module`` with its kernels compiled afresh (interpreted on the CPU)."""
    if DEVICE == "cpu":
        if not INTERPRETED:
            pytest.skip("Triton was imported in this process before its interpreter could be chosen")
        monkeypatch.setattr(module, "_on_device", lambda hidden: True)  # the interpreter stands in for the GPU
    pytest.importorskip("triton", reason="Triton is not installed (it comes with torch's CUDA wheels)")
    module._kernels.cache_clear()
    yield module
    module._kernels.cache_clear()


class _Compiled:
    """Stands for a module's compiled kernels where the launch itself is replaced."""

    def __call__(self) -> "_Compiled":
        return self

    def cache_clear(self) -> None:
        pass


def failing_kernels(module: ModuleType, launch: str, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """``module``'s kernels as if compiled for this device, with ``launch`` raising the error a
    driver gives for a kernel it cannot run; returns the launches tried."""
    tried: list[str] = []

    def broken(*args, **kwargs):
        tried.append(launch)
        raise RuntimeError("no kernel image is available for execution on the device")

    monkeypatch.setattr(module, "_disabled", [])
    monkeypatch.setattr(module, "_kernels", _Compiled())
    monkeypatch.setattr(module, "_on_device", lambda hidden: not module._disabled)
    monkeypatch.setattr(module, launch, broken)
    return tried
