"""``realtime-omni``: serve the Realtime API, or benchmark a running server."""

from __future__ import annotations

import argparse
import errno
import importlib.metadata
import logging
import os
import re
import socket
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from . import __version__
from .config import ServerSettings
from .config_sources import SettingsError, load_settings

DESCRIPTION = "A realtime, full-duplex speech server that speaks the OpenAI Realtime API."

EXAMPLES = """\
examples:
  realtime-omni serve                          embedded CPU models on 127.0.0.1:8000 (demo at /)
  realtime-omni serve --host 0.0.0.0 --api-key SECRET
  realtime-omni serve --model omni:/models/Qwen2.5-Omni-3B
  realtime-omni bench latency --turns 20       spoken turns against a self-started server
"""

SERVE_EPILOG = """\
Every setting can also come from the environment, REALTIME_OMNI_<SECTION>__<NAME> or the flat
REALTIME_OMNI_<NAME> (e.g. REALTIME_OMNI_LIMITS__MAX_SESSIONS=32 or REALTIME_OMNI_MAX_SESSIONS=32;
lists as JSON: REALTIME_OMNI_MODELS='["echo"]'), or from a TOML/JSON file given with --config.
A flag wins over the environment, which wins over the file.

examples:
  realtime-omni serve --port 9000
  realtime-omni serve --config realtime-omni.toml
  realtime-omni serve --model echo --session-store none
  realtime-omni serve --model omni:/models/Qwen3-Omni-30B-A3B --max-sessions 32
  realtime-omni serve --model embedded --ray auto   (workers on the Ray cluster this host is in)
"""


@dataclass(frozen=True)
class _Option:
    flag: str
    setting: str  # the dotted path in ServerSettings of what it overrides
    help: str
    type: Any = str
    repeat: bool = False
    metavar: str | None = None
    choices: tuple[str, ...] | None = None


SERVE_OPTIONS = (
    _Option("--host", "server.host", "address to listen on; 0.0.0.0 for every interface", metavar="ADDR"),
    _Option("--port", "server.port", "TCP port to listen on (0: any free port)", int, metavar="N"),
    _Option("--model", "serving.models", "model to load, repeatable (the first is the default): embedded, echo, or "
            "omni:<checkpoint dir> (Qwen2.5-Omni / Qwen3-Omni)", repeat=True, metavar="NAME"),
    _Option("--log-level", "server.log_level", "how much the server logs", choices=("debug", "info", "warning", "error")),
    _Option("--ray", "serving.ray_address", "run model workers as actors on this Ray cluster (auto, host:port or "
            "ray://host:port), placed by free capacity; none: a local worker process", metavar="ADDRESS"),
    _Option("--max-sessions", "limits.max_sessions", "concurrent sessions; more are refused (WebSocket close 1013)", int,
            metavar="N"),
    _Option("--output-lead-ms", "limits.output_lead_ms", "send reply audio at most this far ahead of real time; -1: unpaced",
            float, metavar="MS"),
    _Option("--api-key", "auth.api_keys", "accepted API key, repeatable; none: no authentication", repeat=True,
            metavar="KEY"),
    _Option("--allowed-origin", "auth.allowed_origins", "browser Origin allowed to connect, repeatable; none: any",
            repeat=True, metavar="ORIGIN"),
    _Option("--session-store", "store.url", "where sessions persist for resume: sqlite:///path.db, "
            "redis://host:port/0 or none", metavar="URL"),
    _Option("--resume-grace-s", "store.resume_grace_s", "how long a dropped session stays resumable (0: not at all)", float,
            metavar="S"),
    _Option("--shutdown-timeout-s", "server.shutdown_timeout_s", "on SIGTERM, exit within this many seconds even with "
            "stuck clients", float, metavar="S"),
)


#: flags that switch a setting on or off (--x / --no-x)
SERVE_SWITCHES = (
    _Option("--isolate-models", "serving.isolate", "run models in a supervised worker process, so a crash fails "
            "replies, not the server"),
    _Option("--store-transcripts", "store.transcripts", "keep what was said in the session store; off: stored "
            "items keep their shape only"),
    _Option("--metrics-public", "auth.metrics_public", "serve /metrics without a key even when API keys are set "
            "(a scraper on a private network)"),
)


def _default(setting: str) -> Any:
    value: Any = ServerSettings()
    for part in setting.split("."):
        value = getattr(value, part)
    return value


def _shown(value: Any) -> str:
    if value in (None, []):
        return "none"
    if isinstance(value, list):
        return " ".join(str(v) for v in value)
    return str(value)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="realtime-omni", description=DESCRIPTION, epilog=EXAMPLES,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"realtime-omni {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="{serve,bench}")

    serve = sub.add_parser("serve", help="run the server", description="Serve the OpenAI Realtime API over WebSocket, "
                           "WebRTC and telephony, with the browser demo at /.", epilog=SERVE_EPILOG,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    serve.add_argument("--config", metavar="FILE", help="read settings from this TOML (or .json) file, sections "
                       "as in the README ([limits], [engines.omni], ...); flags and the environment win over "
                       "it (default: $REALTIME_OMNI_CONFIG, else none)")
    for option in SERVE_OPTIONS:
        serve.add_argument(option.flag, dest=_dest(option.setting), type=option.type,
                           action="append" if option.repeat else "store", metavar=option.metavar,
                           choices=option.choices, help=f"{option.help} (default: {_shown(_default(option.setting))})")
    for option in SERVE_SWITCHES:
        serve.add_argument(option.flag, dest=_dest(option.setting), action=argparse.BooleanOptionalAction,
                           default=None, help=f"{option.help} (default: {'on' if _default(option.setting) else 'off'})")
    serve.set_defaults(func=_serve)

    _add_bench(sub)
    return parser


BENCH_PACKAGE = "realtime_omni_bench"


def _add_bench(sub: Any) -> None:
    """``bench`` lives in the tooling package :mod:`realtime_omni_bench` (same distribution, not
    part of the runtime), imported here only; if it cannot be, ``bench`` says so when run."""
    try:
        from realtime_omni_bench.cli import add_bench_parser
    except ImportError as exc:
        problem = (f"bench needs the {BENCH_PACKAGE} package, installed with realtime-omni, but it cannot be "
                   f"imported here ({exc}); reinstall: pip install --force-reinstall realtime-omni")
        # no option prefix: whatever follows ``bench`` (``--turns 2`` too) is taken, then refused with ``problem``
        bench = sub.add_parser("bench", help=f"benchmark a server (unavailable: {BENCH_PACKAGE} is missing)",
                               description=problem, add_help=False, prefix_chars="\0")
        bench.add_argument("rest", nargs="*", help=argparse.SUPPRESS)
        bench.set_defaults(func=lambda _args: _fail(problem))
        return
    add_bench_parser(sub)


def _dest(setting: str) -> str:
    return setting.replace(".", "__")


def settings_from_args(args: argparse.Namespace, environ: Mapping[str, str]) -> ServerSettings:
    """The settings tree of a ``serve`` command line: flags > ``environ`` > --config file >
    defaults (SettingsError, one line, for a bad value or file)."""
    options = (*SERVE_OPTIONS, *SERVE_SWITCHES)
    return load_settings(cli={o.setting: getattr(args, _dest(o.setting)) for o in options}, environ=environ,
                         config_file=args.config, cli_labels={o.setting: o.flag for o in options})


def _serve(args: argparse.Namespace) -> int:
    try:  # the one place the environment is read: everything below gets the settings passed
        settings = settings_from_args(args, os.environ)
    except SettingsError as exc:
        return _fail(str(exc))
    problem = _model_problem(settings.serving.models) or _ray_problem(settings.serving.ray_address)
    if problem:  # one sentence, before the server starts, instead of a startup traceback
        return _fail(problem)
    server = settings.server
    try:  # bound before anything loads, so a taken port is reported before "ready", not after
        sock = _bind(server.host, server.port)
    except OSError as exc:
        return _fail(_bind_problem(server.host, server.port, exc))
    server.port = int(sock.getsockname()[1])
    return _run(settings, sock)


def _ray_problem(address: str | None) -> str | None:
    """--ray without Ray installed: one sentence instead of a traceback at model load."""
    import importlib.util

    if address and importlib.util.find_spec("ray") is None:
        return "--ray needs Ray in this environment: pip install 'realtime-omni[ray]'"
    return None


def _run(settings: ServerSettings, sock: socket.socket) -> int:
    import uvicorn

    from .app import create_app
    from .server_thread import DrainingServer

    server_settings = settings.server
    logging.basicConfig(level=server_settings.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    config = uvicorn.Config(
        create_app(settings),
        host=server_settings.host,
        port=server_settings.port,
        log_level=server_settings.log_level,
        # Above the 15 MiB event cap, so an oversize event gets a clear error event, not a close.
        ws_max_size=32 * 1024 * 1024,
        ws_ping_interval=20,
        ws_ping_timeout=20,
        # connections get half the shutdown deadline; the app's lifespan closes sessions in the rest
        timeout_graceful_shutdown=server_settings.shutdown_timeout_s / 2,
    )
    server = DrainingServer(config)  # tells WebSocket handlers first on SIGTERM (close 1012)
    with sock:
        server.run(sockets=[sock])
    if not server.started:
        return 3  # what uvicorn.run exits with when the server could not start
    return 0


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does: restarts need no wait
        sock.bind((host, port))
        sock.listen(2048)
    except OSError:
        sock.close()
        raise
    return sock  # not inheritable (PEP 446): model worker processes never hold the port


def _bind_problem(host: str, port: int, exc: OSError) -> str:
    if exc.errno == errno.EADDRINUSE:
        return (f"port {port} on {host} is already in use (another realtime-omni?); stop it or choose another "
                f"port with --port")
    if exc.errno == errno.EACCES:
        return f"no permission to listen on port {port}; use a port above 1023 with --port"
    if exc.errno == errno.EADDRNOTAVAIL:
        return f"{host} is not an address of this machine; use --host 127.0.0.1 or 0.0.0.0"
    return f"cannot listen on {host}:{port}: {exc.strerror or exc}"


def _fail(message: str) -> int:
    print(f"realtime-omni: {message}", file=sys.stderr)
    return 2


def _model_problem(names: list[str]) -> str | None:
    """Why a ``--model`` cannot load (unknown name, missing omni checkpoint, its optional extra
    not installed), or None."""
    from .engines.builders import resolve_builder

    for name in names:
        try:
            resolve_builder(name)
            if name.startswith("omni:"):
                from .engines.omni.loader import detect_architecture, read_config

                path = name.removeprefix("omni:")
                detect_architecture(read_config(path), where=path)
        except ValueError as exc:
            return str(exc)
        extra = "omni" if name.startswith("omni:") else name if name == "embedded" else None
        missing = missing_extra(extra) if extra else []
        if missing:
            return (f"model {name!r} needs the {extra!r} extra, and {', '.join(missing)} "
                    f"{'is' if len(missing) == 1 else 'are'} not installed: pip install -e '.[{extra}]' "
                    f"(or pip install 'realtime-omni[{extra}]')")
    return None


def missing_extra(extra: str, requires: list[str] | None = None) -> list[str]:
    """The distributions of this package's optional ``extra`` that are not installed (by default
    read from the installed package's metadata; [] when that is not available)."""
    if requires is None:
        try:
            requires = importlib.metadata.requires("realtime-omni") or []
        except importlib.metadata.PackageNotFoundError:  # run from a source tree, not installed
            return []
    missing = []
    for requirement in requires:
        spec, _, marker = requirement.partition(";")
        if f'extra == "{extra}"' not in marker.replace("'", '"'):
            continue
        name = re.match(r"[A-Za-z0-9._-]+", spec.strip())
        if name is None:
            continue
        try:
            importlib.metadata.version(name.group(0))
        except importlib.metadata.PackageNotFoundError:
            missing.append(name.group(0))
    return missing


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
