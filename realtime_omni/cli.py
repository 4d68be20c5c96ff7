"""``realtime-omni``: serve the Realtime API, or benchmark a running server."""

from __future__ import annotations

import argparse
import errno
import importlib.metadata
import logging
import re
import socket
import sys
from dataclasses import dataclass
from typing import Any

from . import __version__
from .config import ServerSettings

DESCRIPTION = "A realtime, full-duplex speech server that speaks the OpenAI Realtime API."

EXAMPLES = """\
examples:
  realtime-omni serve                          embedded CPU models on 127.0.0.1:8000 (demo at /)
  realtime-omni serve --host 0.0.0.0 --api-key SECRET
  realtime-omni serve --model omni:/models/Qwen2.5-Omni-3B
  realtime-omni bench latency --turns 20       spoken turns against a self-started server
"""

SERVE_EPILOG = """\
Every option can also be set in the environment as REALTIME_OMNI_<SETTING> (e.g.
REALTIME_OMNI_PORT=9000; lists as JSON: REALTIME_OMNI_MODELS='["echo"]'); a flag wins.

examples:
  realtime-omni serve --port 9000
  realtime-omni serve --model echo --session-store none
  realtime-omni serve --model omni:/models/Qwen3-Omni-30B-A3B --max-sessions 32
  realtime-omni serve --model embedded --ray auto   (workers on the Ray cluster this host is in)
"""


@dataclass(frozen=True)
class _Option:
    flag: str
    setting: str  # the ServerSettings field it overrides
    help: str
    type: Any = str
    repeat: bool = False
    metavar: str | None = None
    choices: tuple[str, ...] | None = None


SERVE_OPTIONS = (
    _Option("--host", "host", "address to listen on; 0.0.0.0 for every interface", metavar="ADDR"),
    _Option("--port", "port", "TCP port to listen on (0: any free port)", int, metavar="N"),
    _Option("--model", "models", "model to load, repeatable (the first is the default): embedded, echo, or "
            "omni:<checkpoint dir> (Qwen2.5-Omni / Qwen3-Omni)", repeat=True, metavar="NAME"),
    _Option("--log-level", "log_level", "how much the server logs", choices=("debug", "info", "warning", "error")),
    _Option("--ray", "ray_address", "run model workers as actors on this Ray cluster (auto, host:port or "
            "ray://host:port), placed by free capacity; none: a local worker process", metavar="ADDRESS"),
    _Option("--max-sessions", "max_sessions", "concurrent sessions; more are refused (WebSocket close 1013)", int,
            metavar="N"),
    _Option("--output-lead-ms", "output_lead_ms", "send reply audio at most this far ahead of real time; -1: unpaced",
            float, metavar="MS"),
    _Option("--api-key", "api_keys", "accepted API key, repeatable; none: no authentication", repeat=True,
            metavar="KEY"),
    _Option("--allowed-origin", "allowed_origins", "browser Origin allowed to connect, repeatable; none: any",
            repeat=True, metavar="ORIGIN"),
    _Option("--session-store", "session_store", "where sessions persist for resume: sqlite:///path.db, "
            "redis://host:port/0 or none", metavar="URL"),
    _Option("--resume-grace-s", "resume_grace_s", "how long a dropped session stays resumable (0: not at all)", float,
            metavar="S"),
    _Option("--shutdown-timeout-s", "shutdown_timeout_s", "on SIGTERM, exit within this many seconds even with "
            "stuck clients", float, metavar="S"),
)


def _default(setting: str) -> str:
    value = ServerSettings.model_fields[setting].get_default(call_default_factory=True)
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
    for option in SERVE_OPTIONS:
        serve.add_argument(option.flag, dest=option.setting, type=option.type,
                           action="append" if option.repeat else "store",
                           metavar=option.metavar, choices=option.choices, help=f"{option.help} (default: {_default(option.setting)})")
    serve.add_argument("--isolate-models", action=argparse.BooleanOptionalAction, default=None,
                       help="run models in a supervised worker process, so a crash fails replies, not the server "
                            f"(default: {'on' if ServerSettings.model_fields['isolate_models'].default else 'off'})")
    serve.add_argument("--store-transcripts", action=argparse.BooleanOptionalAction, default=None,
                       help="keep what was said in the session store; off: stored items keep their shape only "
                            f"(default: {'on' if ServerSettings.model_fields['store_transcripts'].default else 'off'})")
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


def _serve(args: argparse.Namespace) -> int:
    overrides = {option.setting: getattr(args, option.setting) for option in SERVE_OPTIONS}
    overrides["isolate_models"] = args.isolate_models
    overrides["store_transcripts"] = args.store_transcripts
    settings = ServerSettings(**{k: v for k, v in overrides.items() if v is not None})
    problem = _model_problem(settings.models) or _ray_problem(settings.ray_address)
    if problem:  # one sentence, before the server starts, instead of a startup traceback
        return _fail(problem)
    try:  # bound before anything loads, so a taken port is reported before "ready", not after
        sock = _bind(settings.host, settings.port)
    except OSError as exc:
        return _fail(_bind_problem(settings.host, settings.port, exc))
    settings.port = int(sock.getsockname()[1])
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

    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    config = uvicorn.Config(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        # Above the 15 MiB event cap, so an oversize event gets a clear error event, not a close.
        ws_max_size=32 * 1024 * 1024,
        ws_ping_interval=20,
        ws_ping_timeout=20,
        # connections get half the shutdown deadline; the app's lifespan closes sessions in the rest
        timeout_graceful_shutdown=settings.shutdown_timeout_s / 2,
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
