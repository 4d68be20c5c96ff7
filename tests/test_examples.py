"""The examples as a user runs them, against a real server: they leave nothing in the folder they
are run from."""

from __future__ import annotations

import re
import subprocess
import sys
import wave
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _sdk_client(server, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "examples" / "openai_sdk_client.py"),
                           str(ROOT / "media" / "question.wav"), "--url", server.http, "--fast", *args],
                          cwd=cwd, capture_output=True, text=True, timeout=120)


def test_sdk_client_writes_the_reply_outside_the_current_folder(server, tmp_path):
    run = _sdk_client(server, tmp_path)
    assert run.returncode == 0, run.stderr[-1000:]
    assert list(tmp_path.iterdir()) == []  # nothing written where it was run
    match = re.search(r"wrote (\S+reply\.wav) \((\d+\.\d+) s\)", run.stdout)
    assert match, run.stdout[-500:]
    written = Path(match.group(1))
    assert written.is_file() and written.parent != tmp_path
    with wave.open(str(written), "rb") as wav:
        assert wav.getframerate() == 24_000 and wav.getnframes() > 0
    written.unlink()
    written.parent.rmdir()


def test_sdk_client_writes_where_it_is_told(server, tmp_path):
    out = tmp_path / "answers" / "first.wav"
    out.parent.mkdir()
    run = _sdk_client(server, tmp_path, "--out", str(out))
    assert run.returncode == 0, run.stderr[-1000:]
    assert out.is_file() and f"wrote {out}" in run.stdout
