"""The command line as a new user meets it: a wrong model is one sentence and exit code 2."""

from __future__ import annotations

import json
import subprocess
import sys


def _serve(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "realtime_omni", "serve", *args], capture_output=True, text=True,
                          timeout=120)


def test_an_unknown_model_or_a_wrong_omni_path_is_one_sentence(tmp_path):
    (tmp_path / "llama").mkdir()
    (tmp_path / "llama" / "config.json").write_text(json.dumps({"model_type": "llama"}))
    for model, says in (("nope", "unknown model 'nope'"), (f"omni:{tmp_path / 'missing'}", "does not exist"),
                        (f"omni:{tmp_path}", "no config.json"), (f"omni:{tmp_path / 'llama'}", "unsupported")):
        run = _serve("--model", model, "--port", "0")
        assert run.returncode == 2, (model, run.stderr[-500:])
        lines = run.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("realtime-omni: ") and says in lines[0], (model, lines)


def test_serve_help_names_the_omni_models():
    run = subprocess.run([sys.executable, "-m", "realtime_omni", "serve", "--help"], capture_output=True, text=True,
                         timeout=60)
    assert run.returncode == 0 and "omni:<checkpoint dir>" in run.stdout
