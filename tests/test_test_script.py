"""scripts/test.sh, the README's test command: an optional environment that cannot be built is
reported as skipped with its reason, and the main suite still runs and decides the exit code.

It runs on a copy of the repository (its .venv-fastrtc, .venv-pipecat and .venv-livekit are made broken on purpose), with
SKIP_INSTALL=1 so nothing is installed into the interpreter running these tests."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _copy(tmp_path: Path) -> Path:
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    repo = tmp_path / "repo"
    for name in filter(None, files.decode().split("\0")):
        src = ROOT / name
        if src.is_file():
            (repo / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, repo / name)
    return repo


def _run(repo: Path, select: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "SKIP_FASTRTC", "SKIP_PIPECAT", "SKIP_LIVEKIT", "PYTEST_ADDOPTS")}
    # a plain shell whose python3 is the interpreter running this test
    env.update(SKIP_INSTALL="1", PYTEST_ADDOPTS=f"-p no:cacheprovider -k {select}",
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}")
    return subprocess.run(["bash", "scripts/test.sh"], cwd=repo, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git to list the repository's files")
def test_broken_optional_environments_are_skipped_with_their_reasons_and_the_suite_runs(tmp_path):
    repo = _copy(tmp_path)
    for venv in (".venv-fastrtc", ".venv-pipecat", ".venv-livekit"):
        fake = repo / venv / "bin" / "python"
        fake.parent.mkdir(parents=True)
        fake.write_text(f"#!/bin/sh\necho '{venv}: this interpreter is broken' >&2\nexit 1\n")
        fake.chmod(0o755)

    run = _run(repo, "test_version")
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-3000:]
    assert "FastRTC tests: SKIPPED" in out and ".venv-fastrtc: this interpreter is broken" in out, out[-3000:]
    assert "Pipecat tests: SKIPPED" in out and ".venv-pipecat: this interpreter is broken" in out, out[-3000:]
    assert "LiveKit tests: SKIPPED" in out and ".venv-livekit: this interpreter is broken" in out, out[-3000:]
    assert "1 passed" in out, out[-3000:]  # the main suite ran

    # and the main suite's failure is the script's exit code, FastRTC skipped or not
    (repo / "tests" / "test_fails.py").write_text("def test_fails_on_purpose():\n    assert False\n")
    run = _run(repo, "test_fails_on_purpose")
    assert run.returncode == 1, (run.stdout + run.stderr)[-3000:]
    assert all(f"{name} tests: SKIPPED" in run.stdout for name in ("FastRTC", "Pipecat", "LiveKit"))
