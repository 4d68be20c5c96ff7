"""``realtime-omni bench <name>``: the benchmark sub-commands.

Each benchmark is a module with ``add_arguments(parser)`` and ``main(args) -> int``, listed in
:data:`BENCHMARKS` and imported only when run. Add one (``webrtc``, ``telephony``, ...) by adding
an entry here, or from elsewhere before the CLI is built::

    from realtime_omni.bench.cli import register
    register("webrtc", "realtime_omni.bench.webrtc", "concurrent WebRTC calls ...")

Every benchmark gets the common options: ``--url`` (a running server; default: start one on a
free port and stop it after), ``--out`` (report folder), ``--name`` (report file stem) and
``--server-cpus`` (CPUs the self-started server is pinned to).
"""

from __future__ import annotations

import argparse
import importlib
from dataclasses import dataclass


@dataclass(frozen=True)
class Benchmark:
    module: str  # imported on use; provides add_arguments(parser) and main(args) -> int
    help: str
    #: CPUs the self-started server is pinned to by default (None: not pinned)
    server_cpus: str | None = None


BENCHMARKS: dict[str, Benchmark] = {
    "latency": Benchmark(
        "realtime_omni.bench.latency",
        "spoken turns over the openai SDK: end of speech → first audio, barge-in stop time",
    ),
    "capacity": Benchmark(
        "realtime_omni.bench.capacity",
        "N concurrent real-time echo sessions: added latency, missing audio, server CPU per session",
        server_cpus="0",
    ),
    "webrtc": Benchmark("realtime_omni.bench.webrtc", "concurrent WebRTC echo calls (round trip, CPU/call) and first audio over WebRTC", server_cpus="0"),
    "telephony": Benchmark("realtime_omni.bench.telephony", "phone calls over the Twilio Media Streams bridge (8 kHz μ-law): end of speech → first audio, barge-in clear"),
}


def register(name: str, module: str, help: str, server_cpus: str | None = None) -> None:
    """Add (or replace) a ``realtime-omni bench <name>`` sub-command."""
    BENCHMARKS[name] = Benchmark(module, help, server_cpus)


def add_common_arguments(parser: argparse.ArgumentParser, bench: Benchmark) -> None:
    parser.add_argument("--url", help="benchmark a running server (http://host:port or ws://host:port); "
                                      "default: start one on a free port and stop it after")
    parser.add_argument("--out", default="docs/benchmarks", help="report folder (default: %(default)s)")
    parser.add_argument("--name", help="report file name stem (default: the benchmark's name)")
    parser.add_argument("--server-cpus", default=bench.server_cpus,
                        help="pin the self-started server to these CPUs, e.g. 0 or 0-1 ('none': no pinning; "
                             "default: %(default)s)")


def _run(args: argparse.Namespace) -> int:
    bench = BENCHMARKS[args.bench]
    module = importlib.import_module(bench.module)
    return int(module.main(args) or 0)


def add_bench_parser(subparsers) -> argparse.ArgumentParser:  # type: ignore[no-untyped-def]
    """Add ``bench`` and one sub-command per entry of :data:`BENCHMARKS`."""
    parser = subparsers.add_parser("bench", help="benchmark a server and write a report under docs/benchmarks/",
                                   description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="bench", required=True, metavar="{" + ",".join(BENCHMARKS) + "}")
    for name, bench in BENCHMARKS.items():
        p = sub.add_parser(name, help=bench.help, description=bench.help)
        add_common_arguments(p, bench)
        try:
            module = importlib.import_module(bench.module)
        except ImportError as exc:  # an optional dependency is missing: say so when it is run
            p.set_defaults(func=lambda _a, exc=exc, name=name: _missing(name, exc))
            continue
        module.add_arguments(p)
        p.set_defaults(func=_run)
    return parser


def _missing(name: str, exc: ImportError) -> int:
    raise SystemExit(f"realtime-omni bench {name}: {exc}")
