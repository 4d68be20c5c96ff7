"""The settings tree: CLI flags > environment > config file > defaults, both spellings of the
variables, one-line errors, and the environment read at the entry point only."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from realtime_omni.cli import build_parser, main, settings_from_args
from realtime_omni.config import ServerSettings
from realtime_omni.config_sources import FLAT_NAMES, SettingsError, load_settings, nest_flat

PACKAGE = Path(__file__).resolve().parent.parent / "realtime_omni"


def _serve(argv: list[str], environ: dict[str, str]) -> ServerSettings:
    return settings_from_args(build_parser().parse_args(["serve", *argv]), environ)


def test_flags_win_over_the_environment_which_wins_over_the_file_which_wins_over_defaults(tmp_path):
    config = tmp_path / "server.toml"
    config.write_text('[server]\nport = 9001\n\n[limits]\nmax_sessions = 10\nidle_timeout_s = 100\n\n'
                      '[engines.omni]\ndevice = "cuda:1"\nmax_sessions = 4\n')
    environ = {"REALTIME_OMNI_PORT": "9002", "REALTIME_OMNI_LIMITS__MAX_SESSIONS": "20",
               "REALTIME_OMNI_OMNI_MAX_SESSIONS": "6"}
    settings = _serve(["--config", str(config), "--port", "9003"], environ)
    assert settings.server.port == 9003  # flag
    assert settings.limits.max_sessions == 20 and settings.engines.omni.max_sessions == 6  # environment
    assert settings.limits.idle_timeout_s == 100 and settings.engines.omni.device == "cuda:1"  # file
    assert settings.limits.max_session_s == ServerSettings().limits.max_session_s  # default
    # without the flag and the variables, the file's values hold; the file may come from the environment
    from_env_file = _serve([], {"REALTIME_OMNI_CONFIG": str(config)})
    assert from_env_file.server.port == 9001 and from_env_file.limits.max_sessions == 10


def test_a_json_config_file_works_too(tmp_path):
    config = tmp_path / "server.json"
    config.write_text(json.dumps({"store": {"url": "none", "ttl_s": 5}, "auth": {"api_keys": ["k1"]}}))
    settings = load_settings(environ={}, config_file=config)
    assert settings.store.url == "none" and settings.store.ttl_s == 5 and settings.auth.api_keys == ["k1"]


def test_flat_and_nested_variable_names_both_work_and_nested_wins():
    flat = load_settings(environ={
        "REALTIME_OMNI_MAX_SESSIONS": "7", "REALTIME_OMNI_API_KEYS": '["a", "b"]',
        "REALTIME_OMNI_SESSION_STORE": "none", "REALTIME_OMNI_OUTPUT_LEAD_MS": "-1",
        "REALTIME_OMNI_OMNI_MAX_SESSIONS": "3", "REALTIME_OMNI_OMNI_RAMP_FRAMES": "[4, 5]",
        "REALTIME_OMNI_TWILIO_AUTH_TOKEN": "tok", "REALTIME_OMNI_WEBRTC_PEER_TIMEOUT_S": "0",
    })
    assert flat.limits.max_sessions == 7 and flat.auth.api_keys == ["a", "b"] and flat.store.url == "none"
    assert flat.limits.output_lead_ms == -1 and flat.transports.webrtc.peer_timeout_s == 0
    assert flat.engines.omni.max_sessions == 3 and flat.engines.omni.ramp_frames == [4, 5]
    assert flat.transports.twilio.auth_token is not None
    assert flat.transports.twilio.auth_token.get_secret_value() == "tok"

    nested = load_settings(environ={
        "REALTIME_OMNI_LIMITS__MAX_SESSIONS": "8", "REALTIME_OMNI_AUTH__API_KEYS": '["c"]',
        "REALTIME_OMNI_ENGINES__OMNI__MAX_SESSIONS": "2", "REALTIME_OMNI_ENGINES__EMBEDDED": '{"threads": 1}',
        "REALTIME_OMNI_TRANSPORTS__WEBRTC__JITTER_PREFETCH": "3",
    })
    assert nested.limits.max_sessions == 8 and nested.auth.api_keys == ["c"]
    assert nested.engines.omni.max_sessions == 2 and nested.engines.embedded.threads == 1
    assert nested.transports.webrtc.jitter_prefetch == 3

    both = load_settings(environ={"REALTIME_OMNI_LIMITS__MAX_SESSIONS": "9", "REALTIME_OMNI_MAX_SESSIONS": "1"})
    assert both.limits.max_sessions == 9
    # variables of other programs, or without the prefix, are none of ours
    assert load_settings(environ={"REALTIME_OMNI_SOMETHING_ELSE": "x", "MAX_SESSIONS": "1"}) == ServerSettings()


def test_every_flat_name_points_into_the_tree():
    defaults = ServerSettings()
    for flat, dotted in FLAT_NAMES.items():
        value = defaults
        for part in dotted.split("."):
            assert hasattr(value, part), f"{flat} -> {dotted}"
            value = getattr(value, part)


@pytest.mark.parametrize(("environ", "named"), [
    ({"REALTIME_OMNI_MAX_SESSIONS": "lots"}, ("limits.max_sessions", "REALTIME_OMNI_MAX_SESSIONS")),
    ({"REALTIME_OMNI_ENGINES__OMNI__CHUNK_FRAMES": "0"},
     ("engines.omni.chunk_frames", "REALTIME_OMNI_ENGINES__OMNI__CHUNK_FRAMES")),
    ({"REALTIME_OMNI_ENGINES__OMNI__CODEC_QUEUED_PIECES": "-1"}, ("engines.omni.codec_queued_pieces",)),
    ({"REALTIME_OMNI_ENGINES__OMNI__CODEC_QUEUED_PIECES": "100000"}, ("engines.omni.codec_queued_pieces",)),
    ({"REALTIME_OMNI_ENGINES__OMNI__CODEC_SHARED_POOL": "sometimes"}, ("engines.omni.codec_shared_pool",)),
    ({"REALTIME_OMNI_ALLOWED_ORIGINS": "http://a.example"}, ("auth.allowed_origins", "JSON")),
    ({"REALTIME_OMNI_ISOLATE_MODELS": "perhaps"}, ("serving.isolate",)),
])
def test_a_bad_value_is_one_line_naming_the_setting(monkeypatch, capsys, environ, named):
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    assert main(["serve", "--session-store", "none"]) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("realtime-omni: ") and "Traceback" not in err, err
    for word in named:
        assert word in lines[0], lines[0]


def test_a_bad_flag_value_names_the_flag():
    with pytest.raises(SettingsError, match=r"limits\.max_sessions \(from --max-sessions\)"):
        _serve(["--max-sessions", "0"], {})


def test_secrets_stay_out_of_error_messages():
    with pytest.raises(SettingsError) as caught:
        load_settings(environ={"REALTIME_OMNI_API_KEYS": "sk-very-secret"})
    assert "auth.api_keys" in str(caught.value) and "sk-very-secret" not in str(caught.value)


@pytest.mark.parametrize(("text", "expected"), [
    ("[limits]\nmax_sesions = 3\n", "unknown setting limits.max_sesions"),
    ("[limitz]\nmax_sessions = 3\n", "unknown setting limitz"),
    ("max_sessions = 3\n", "unknown setting max_sessions (from config file {path}); did you mean limits.max_sessions?"),
    ("[engines.omni]\ndevise = 'cuda'\n", "unknown setting engines.omni.devise"),
    ("[limits\n", "config file {path}: not valid TOML"),
])
def test_a_config_file_with_an_unknown_key_or_bad_syntax_is_refused(tmp_path, capsys, text, expected):
    config = tmp_path / "server.toml"
    config.write_text(text)
    assert main(["serve", "--config", str(config)]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and expected.format(path=config) in lines[0], lines


def test_a_missing_config_file_is_one_sentence(tmp_path):
    with pytest.raises(SettingsError, match="config file .*missing.toml: cannot read it"):
        load_settings(environ={}, config_file=tmp_path / "missing.toml")


def test_keyword_settings_take_sections_and_flat_names_and_refuse_others():
    tree = nest_flat({"max_sessions": 3, "limits": {"idle_timeout_s": 2.0}, "webrtc_peer_timeout_s": 1.0,
                      "models": ["echo"]})
    assert tree == {"limits": {"max_sessions": 3, "idle_timeout_s": 2.0}, "serving": {"models": ["echo"]},
                    "transports": {"webrtc": {"peer_timeout_s": 1.0}}}
    with pytest.raises(TypeError, match="unknown setting 'max_sesions'"):
        nest_flat({"max_sesions": 3})


def test_constructing_settings_reads_no_environment(monkeypatch):
    monkeypatch.setenv("REALTIME_OMNI_MAX_SESSIONS", "3")
    monkeypatch.setenv("REALTIME_OMNI_LIMITS__MAX_SESSIONS", "3")
    assert ServerSettings().limits.max_sessions == 100


def test_only_the_entry_point_reads_the_environment():
    """Everything below the CLI and the settings loader gets its settings passed down."""
    allowed = {PACKAGE / "cli.py", PACKAGE / "config_sources.py"}
    readers = [str(path.relative_to(PACKAGE)) for path in sorted(PACKAGE.rglob("*.py"))
               if path not in allowed and re.search(r"\bos\.environ\b|\bgetenv\(", path.read_text())]
    assert readers == []
