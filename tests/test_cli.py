"""The command line as a new user meets it: help in plain words with defaults, ``--version``, and the
common mistakes (a wrong model, a taken port) as one sentence and exit code 2 before anything starts."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import time

import httpx

from realtime_omni import __version__
from realtime_omni_bench.cli import BENCHMARKS
from realtime_omni.cli import build_parser, missing_extra


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


def _cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "realtime_omni", *args], capture_output=True, text=True,
                          timeout=timeout)


_MARKUP = re.compile(r"``|:(?:data|class|func|meth|mod|attr):`")


def test_version():
    run = _cli("--version")
    assert run.returncode == 0 and run.stdout.strip() == f"realtime-omni {__version__}"


def test_help_is_plain_text_with_examples():
    for args in (("--help",), ("serve", "--help"), ("bench", "--help")):
        run = _cli(*args)
        assert run.returncode == 0, args
        assert not _MARKUP.search(run.stdout), (args, _MARKUP.search(run.stdout))
    top = _cli("--help").stdout
    assert "--version" in top and "examples:" in top and "realtime-omni serve" in top


def test_every_serve_option_says_what_it_does_and_its_default():
    parser = build_parser()
    serve = parser._subparsers._group_actions[0].choices["serve"]  # type: ignore[union-attr]
    options = [a for a in serve._actions if a.option_strings and a.dest != "help"]
    assert len(options) >= 10
    for action in options:
        assert action.help and "(default: " in action.help, action.option_strings
    text = " ".join(_cli("serve", "--help").stdout.split())
    for shown in ("(default: 127.0.0.1)", "(default: 8000)", "(default: embedded echo)", "(default: on)"):
        assert shown in text, shown


def test_bench_help_lists_the_benchmarks_and_their_options():
    text = _cli("bench", "--help").stdout
    for name in BENCHMARKS:
        assert f"  {name}: " in text, name
    assert "--turns=10" in text and "--sessions=" in text and "--url" in text
    # not the developer notes of the module
    assert "register(" not in text and "add_arguments" not in text


def test_a_taken_port_is_one_sentence_before_ready():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        run = _serve("--model", "echo", "--session-store", "none", "--port", str(port))
    assert run.returncode == 2, run.stderr[-500:]
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and f"port {port}" in lines[0] and "already in use" in lines[0], lines
    assert "ready on" not in run.stdout + run.stderr


def test_serve_announces_ready_on_the_port_it_bound():
    proc = subprocess.Popen([sys.executable, "-m", "realtime_omni", "serve", "--model", "echo", "--session-store",
                             "none", "--no-isolate-models", "--port", "0"], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 60
        line = ""
        while time.monotonic() < deadline:
            line = proc.stdout.readline()  # type: ignore[union-attr]
            if "ready on" in line or not line:
                break
        match = re.search(r"ready on ws://127\.0\.0\.1:(\d+)/v1/realtime", line)
        assert match and int(match.group(1)) > 0, line
        health = httpx.get(f"http://127.0.0.1:{match.group(1)}/health", timeout=10)
        assert health.json()["version"] == __version__
    finally:
        proc.terminate()
        proc.wait(30)


def test_a_model_whose_extra_is_not_installed_is_named_with_the_install_command():
    requires = ['numpy>=1.26', 'piper-tts>=1.2; extra == "embedded"', 'no-such-dist-for-realtime-omni>=1; extra == "embedded"',
                'transformers>=5; extra == "omni"']
    assert missing_extra("embedded", requires) == ["no-such-dist-for-realtime-omni"]
    assert missing_extra("bench", requires) == []
    # the real metadata: this environment runs the embedded models, so nothing is missing
    assert missing_extra("embedded") == []


def test_bench_says_in_one_sentence_when_its_package_is_missing(monkeypatch, capsys, tmp_path):
    from realtime_omni.cli import main

    for name in ("realtime_omni_bench", "realtime_omni_bench.cli"):  # None: the import fails as if not installed
        monkeypatch.setitem(sys.modules, name, None)
    # --out: were the package found after all, the run would not write into the repository
    assert main(["bench", "latency", "--turns", "2", "--out", str(tmp_path)]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("realtime-omni: bench needs the realtime_omni_bench package"), lines


def test_ray_flag_sets_the_ray_address_and_local_workers_stay_the_default(monkeypatch):
    from realtime_omni import cli
    from realtime_omni.config import ServerSettings

    assert ServerSettings().serving.ray_address is None
    ray = cli.settings_from_args(build_parser().parse_args(["serve", "--ray", "127.0.0.1:6379"]), {})
    assert ray.serving.ray_address == "127.0.0.1:6379"
    assert cli.settings_from_args(build_parser().parse_args(["serve"]), {}).serving.ray_address is None
    monkeypatch.setattr("importlib.util.find_spec", lambda name, *a: None)
    assert "realtime-omni[ray]" in cli._ray_problem("auto")
    assert cli._ray_problem(None) is None
