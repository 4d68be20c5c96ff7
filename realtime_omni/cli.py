"""``realtime-omni``: serve the Realtime API, or benchmark a running server."""

from __future__ import annotations

import argparse
import logging
import sys


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from .app import create_app
    from .config import ServerSettings
    from .server_thread import DrainingServer

    overrides = {k: v for k, v in {
        "host": args.host, "port": args.port, "models": args.model, "log_level": args.log_level,
        "max_sessions": args.max_sessions, "output_lead_ms": args.output_lead_ms,
        "api_keys": args.api_key, "allowed_origins": args.allowed_origin, "session_store": args.session_store,
        "resume_grace_s": args.resume_grace_s, "isolate_models": args.isolate_models,
        "store_transcripts": args.store_transcripts, "shutdown_timeout_s": args.shutdown_timeout_s,
    }.items() if v is not None}
    settings = ServerSettings(**overrides)
    problem = _model_problem(settings.models)
    if problem:  # one sentence, before the server starts, instead of a startup traceback
        print(f"realtime-omni: {problem}", file=sys.stderr)
        return 2
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
    server = DrainingServer(config)
    server.run()
    if not server.started:
        return 3  # what uvicorn.run exits with when the server could not start
    return 0


def _model_problem(names: list[str]) -> str | None:
    """Why a ``--model`` cannot load (unknown name, missing omni checkpoint), or None."""
    from .engines.registry import resolve_builder

    for name in names:
        try:
            resolve_builder(name)
            if name.startswith("omni:"):
                from .engines.omni.loader import detect_architecture, read_config

                path = name.removeprefix("omni:")
                detect_architecture(read_config(path), where=path)
        except ValueError as exc:
            return str(exc)
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="realtime-omni", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the server")
    serve.add_argument("--host")
    serve.add_argument("--port", type=int)
    serve.add_argument("--model", action="append",
                       help="model to load (repeatable; the first is the default): embedded, echo, or "
                            "omni:<checkpoint dir> (Qwen2.5-Omni / Qwen3-Omni)")
    serve.add_argument("--log-level", choices=["debug", "info", "warning", "error"])
    serve.add_argument("--max-sessions", type=int)
    serve.add_argument("--output-lead-ms", type=float, help="send audio at most this far ahead of real time; -1: unpaced")
    serve.add_argument("--api-key", action="append", help="accepted API key (repeatable); none: no authentication")
    serve.add_argument("--allowed-origin", action="append", help="browser Origin allowed to connect (repeatable)")
    serve.add_argument("--session-store", help="sqlite:///path.db, redis://host:port/0 or none")
    serve.add_argument("--resume-grace-s", type=float, help="how long a dropped session stays resumable")
    serve.add_argument("--store-transcripts", action=argparse.BooleanOptionalAction, default=None,
                       help="keep what was said in the session store (default: on; off: items keep their shape only)")
    serve.add_argument("--shutdown-timeout-s", type=float,
                       help="SIGTERM to exit, at most, even with stuck clients (default: 10)")
    serve.add_argument("--isolate-models", action=argparse.BooleanOptionalAction, default=None,
                       help="run models in a supervised worker process (default: on)")
    serve.set_defaults(func=_serve)

    try:
        from .bench.cli import add_bench_parser
    except ImportError:
        pass
    else:
        add_bench_parser(sub)

    args = parser.parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
