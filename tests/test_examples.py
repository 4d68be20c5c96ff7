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


def test_mcp_example_lists_calls_and_answers_with_and_without_approval(registry, tmp_path):
    import socket
    import time

    import pytest

    pytest.importorskip("mcp")
    from realtime_omni.server_thread import ServerThread

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    example = str(ROOT / "examples" / "mcp_tools.py")
    tools = subprocess.Popen([sys.executable, example, "serve-tools", "--port", str(port)], cwd=tmp_path,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "the example's MCP server did not start"
                time.sleep(0.2)
        mcp_url = f"http://127.0.0.1:{port}/mcp"
        with ServerThread(registry, mcp_allowed_urls=[mcp_url]) as server:
            for extra in ([], ["--approve"]):
                run = subprocess.run([sys.executable, example, "ask", "What time is it in Oslo?", "--url", server.http,
                                      "--mcp-url", mcp_url, *extra], cwd=tmp_path, capture_output=True, text=True,
                                     timeout=120)
                assert run.returncode == 0, run.stderr[-1000:]
                assert "tools: get_time" in run.stdout
                assert re.search(r"called get_time\(\{.*\}\) -> It is 10:30 in ", run.stdout), run.stdout
                assert ("approval asked: get_time" in run.stdout) == bool(extra)
                assert "answer:" in run.stdout
        assert list(tmp_path.iterdir()) == []
    finally:
        tools.terminate()
        tools.wait(10)
