"""Where the settings tree comes from: CLI flags > environment > config file > defaults.

The one place that reads ``REALTIME_OMNI_*`` variables. Two spellings of a variable work:

* nested: ``REALTIME_OMNI_<SECTION>__<NAME>`` (``REALTIME_OMNI_LIMITS__MAX_SESSIONS``,
  ``REALTIME_OMNI_ENGINES__OMNI__DEVICE``), the tree's own path;
* flat: the names the server had before the tree (``REALTIME_OMNI_MAX_SESSIONS``,
  ``REALTIME_OMNI_OMNI_DEVICE``, ...), mapped by :data:`FLAT_NAMES`; where both are set, the
  nested one wins.

Lists, dicts and whole sections are JSON in a variable. A bad value, a misspelt key or an
unreadable file is a :class:`SettingsError`: one line naming the setting and where it came from.
"""

from __future__ import annotations

import json
import os
import tomllib
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from .config import ServerSettings
from .engines.settings import OmniSettings

PREFIX = "REALTIME_OMNI_"
#: the variable naming a config file (``--config`` wins over it)
CONFIG_ENV = PREFIX + "CONFIG"

TreePath = tuple[str, ...]

#: the flat setting names (variables ``REALTIME_OMNI_<NAME>``, keyword arguments of
#: ``ServerThread``) → their place in the tree
FLAT_NAMES: dict[str, str] = {
    "host": "server.host",
    "port": "server.port",
    "log_level": "server.log_level",
    "web_dir": "server.web_dir",
    "shutdown_timeout_s": "server.shutdown_timeout_s",
    "models": "serving.models",
    "model_aliases": "serving.aliases",
    "isolate_models": "serving.isolate",
    "ray_address": "serving.ray_address",
    "model_threads": "serving.threads",
    "max_sessions": "limits.max_sessions",
    "idle_timeout_s": "limits.idle_timeout_s",
    "max_session_s": "limits.max_session_s",
    "expiry_warning_s": "limits.expiry_warning_s",
    "max_event_bytes": "limits.max_event_bytes",
    "max_session_bytes": "limits.max_session_bytes",
    "journal_bytes": "limits.journal_bytes",
    "queue_bytes": "limits.queue_bytes",
    "max_events_per_s": "limits.max_events_per_s",
    "output_lead_ms": "limits.output_lead_ms",
    "session_store": "store.url",
    "persist_ttl_s": "store.ttl_s",
    "resume_grace_s": "store.resume_grace_s",
    "store_transcripts": "store.transcripts",
    "api_keys": "auth.api_keys",
    "allowed_origins": "auth.allowed_origins",
    "metrics_public": "auth.metrics_public",
    "client_secret_ttl_s": "auth.client_secret_ttl_s",
    "ice_servers": "transports.webrtc.ice_servers",
    "webrtc_ice_addresses": "transports.webrtc.ice_addresses",
    "webrtc_jitter_prefetch": "transports.webrtc.jitter_prefetch",
    "webrtc_video_fps": "transports.webrtc.video_fps",
    "webrtc_datachannel_timeout_s": "transports.webrtc.datachannel_timeout_s",
    "webrtc_connect_timeout_s": "transports.webrtc.connect_timeout_s",
    "webrtc_peer_timeout_s": "transports.webrtc.peer_timeout_s",
    "webrtc_max_queue_ms": "transports.webrtc.max_queue_ms",
    "webrtc_audio_packet_ms": "transports.webrtc.audio_packet_ms",
    "webrtc_audio_busy_calls": "transports.webrtc.audio_busy_calls",
    "twilio_auth_token": "transports.twilio.auth_token",
    "mcp_allowed_urls": "tools.mcp_allowed_urls",
    "mcp_timeout_s": "tools.mcp_timeout_s",
    # the omni engine's variables were REALTIME_OMNI_OMNI_<NAME>
    **{f"omni_{name}": f"engines.omni.{name}" for name in OmniSettings.model_fields},
}


class SettingsError(ValueError):
    """A setting that cannot be used; ``str()`` is one line for the command line."""


def load_settings(
    cli: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
    config_file: str | Path | None = None,
    cli_labels: Mapping[str, str] | None = None,
) -> ServerSettings:
    """The settings tree from ``cli`` (dotted paths → values, None: not given), ``environ``
    (default: this process's environment), ``config_file`` (default: ``$REALTIME_OMNI_CONFIG``;
    TOML, or JSON by its ``.json`` suffix) and the defaults, in that order of precedence.
    ``cli_labels`` names the flag of each path in errors."""
    environ = os.environ if environ is None else environ
    merged: dict[str, Any] = {}
    origin: dict[TreePath, str] = {}
    path = config_file or _env_get(environ, CONFIG_ENV)
    if path:
        _layer(merged, origin, read_config_file(Path(path)), f"config file {path}")
    for key, value, label in env_values(environ):
        _layer(merged, origin, _nest(key, value), label)
    for dotted, value in (cli or {}).items():
        if value is not None:
            _layer(merged, origin, _nest(tuple(dotted.split(".")), value),
                   (cli_labels or {}).get(dotted, dotted))
    return validate(merged, origin)


def read_config_file(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise SettingsError(f"config file {path}: cannot read it ({exc.strerror or exc})") from None
    try:
        data = json.loads(text) if path.suffix.lower() == ".json" else tomllib.loads(text)
    except (json.JSONDecodeError, tomllib.TOMLDecodeError) as exc:
        kind = "JSON" if path.suffix.lower() == ".json" else "TOML"
        raise SettingsError(f"config file {path}: not valid {kind}: {exc}") from None
    if not isinstance(data, dict):
        raise SettingsError(f"config file {path}: the top level must be a table of sections")
    return data


def env_values(environ: Mapping[str, str]) -> list[tuple[TreePath, Any, str]]:
    """(tree path, value, variable name) of every setting in ``environ``, flat names first so
    that a nested name set too wins."""
    flat, nested = [], []
    sections = set(ServerSettings.model_fields)
    for name, raw in environ.items():
        upper = name.upper()
        if not upper.startswith(PREFIX) or upper == CONFIG_ENV:
            continue
        key = upper.removeprefix(PREFIX).lower()
        if "__" in key:
            path = tuple(key.split("__"))
            if path[0] in sections:
                nested.append((path, _parse(path, raw, name), name))
        elif key in FLAT_NAMES:
            path = tuple(FLAT_NAMES[key].split("."))
            flat.append((path, _parse(path, raw, name), name))
    return flat + nested


def nest_flat(values: Mapping[str, Any]) -> dict[str, Any]:
    """Keyword settings as a tree: section names (``limits={...}``) and the flat names of
    :data:`FLAT_NAMES` (``max_sessions=3``) both work; anything else is a TypeError."""
    tree: dict[str, Any] = {}
    for key, value in values.items():
        if key in ServerSettings.model_fields:
            _merge(tree, {key: value.model_dump() if isinstance(value, BaseModel) else value})
        elif key in FLAT_NAMES:
            _merge(tree, _nest(tuple(FLAT_NAMES[key].split(".")), value))
        else:
            raise TypeError(f"unknown setting {key!r}")
    return tree


def validate(tree: Mapping[str, Any], origin: Mapping[TreePath, str] | None = None) -> ServerSettings:
    """``ServerSettings`` from a tree of plain values; SettingsError (one line) if it is not one."""
    try:
        return ServerSettings.model_validate(tree)
    except ValidationError as exc:
        raise SettingsError(_describe(exc, origin or {})) from None


# -- helpers -------------------------------------------------------------------------------------


def _env_get(environ: Mapping[str, str], name: str) -> str | None:
    for key, value in environ.items():
        if key.upper() == name:
            return value
    return None


def _nest(path: TreePath, value: Any) -> dict[str, Any]:
    tree: Any = value
    for part in reversed(path):
        tree = {part: tree}
    return typing.cast(dict[str, Any], tree)


def _merge(into: dict[str, Any], new: Mapping[str, Any]) -> None:
    for key, value in new.items():
        if isinstance(value, Mapping) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = dict(value) if isinstance(value, Mapping) else value


def _leaves(tree: Mapping[str, Any], prefix: TreePath = ()) -> list[TreePath]:
    out: list[TreePath] = []
    for key, value in tree.items():
        path = (*prefix, str(key))
        out.extend(_leaves(value, path) if isinstance(value, Mapping) and value else [path])
    return out


def _layer(merged: dict[str, Any], origin: dict[TreePath, str], tree: Mapping[str, Any], label: str) -> None:
    _merge(merged, tree)
    for path in _leaves(tree):
        origin[path] = label


def _annotation(path: TreePath) -> Any:
    """The type annotation of the field at ``path`` (None where the path is not in the tree)."""
    model: Any = ServerSettings
    annotation: Any = None
    for part in path:
        fields = getattr(model, "model_fields", None)
        if fields is None or part not in fields:
            return None
        annotation = fields[part].annotation
        model = _unwrap(annotation)
    return annotation


def _unwrap(annotation: Any) -> Any:
    """``X | None`` → ``X``."""
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return args[0] if len(args) == 1 else annotation
    return annotation


def _is_structured(annotation: Any) -> bool:
    kind = _unwrap(annotation)
    origin = typing.get_origin(kind) or kind
    return origin in (list, dict, tuple, set) or (isinstance(origin, type) and issubclass(origin, BaseModel))


def _parse(path: TreePath, raw: str, name: str) -> Any:
    """A variable's text as the value of its field: JSON for lists, dicts and sections; scalars
    stay text for pydantic to convert (so its error names the setting)."""
    if not _is_structured(_annotation(path)):
        return raw
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        got = "" if _secret(path) else f", got {raw!r}"
        raise SettingsError(f"{name}: setting {'.'.join(path)} takes JSON (e.g. '[\"a\", \"b\"]' or "
                            f"'{{\"key\": \"value\"}}'){got}") from None


def _secret(path: TreePath) -> bool:
    """Keys and tokens stay off the terminal in error messages."""
    return bool(path) and (path[0] == "auth" or "twilio" in path)


def _describe(exc: ValidationError, origin: Mapping[TreePath, str]) -> str:
    errors = exc.errors(include_url=False)
    first = errors[0]
    loc = tuple(str(part) for part in first["loc"])
    dotted = ".".join(loc)
    source = next((origin[loc[:n]] for n in range(len(loc), 0, -1) if loc[:n] in origin), None)
    where = f" (from {source})" if source else ""
    if first["type"] == "extra_forbidden":
        hint = f"; did you mean {FLAT_NAMES[loc[-1]]}?" if len(loc) == 1 and loc[0] in FLAT_NAMES else ""
        text = f"unknown setting {dotted}{where}{hint}"
    else:
        got = "" if _secret(loc) or "input" not in first else f", got {first['input']!r}"
        text = f"setting {dotted}{where}: {first['msg']}{got}"
    more = len(errors) - 1
    return text + (f" (and {more} more problem{'s' if more > 1 else ''})" if more else "")
