"""``realtime-omni bench <name>``: the benchmark sub-commands.

Each benchmark is a module with ``add_arguments(parser)`` and ``main(args) -> int``, listed in
:data:`BENCHMARKS` and imported only when run. Add one (``webrtc``, ``telephony``, ...) by adding
an entry here, or from elsewhere before the CLI is built::

    from realtime_omni_bench.cli import register
    register("webrtc", "realtime_omni_bench.webrtc", "concurrent WebRTC calls ...")

Every benchmark gets the common options: ``--url`` (a running server; default: start one on a
free port and stop it after), ``--out`` (report folder), ``--name`` (report file stem) and
``--server-cpus`` (CPUs the self-started server is pinned to).
"""

from __future__ import annotations

import argparse
import importlib
import textwrap
from dataclasses import dataclass


@dataclass(frozen=True)
class Benchmark:
    module: str  # imported on use; provides add_arguments(parser) and main(args) -> int
    help: str
    #: CPUs the self-started server is pinned to by default (None: not pinned)
    server_cpus: str | None = None


BENCHMARKS: dict[str, Benchmark] = {
    "latency": Benchmark(
        "realtime_omni_bench.latency",
        "spoken turns over the openai SDK: end of speech → first audio, barge-in stop time",
    ),
    "capacity": Benchmark(
        "realtime_omni_bench.capacity",
        "N concurrent real-time echo sessions: added latency, missing audio, server CPU per session",
        server_cpus="0",
    ),
    "webrtc": Benchmark("realtime_omni_bench.webrtc", "concurrent WebRTC echo calls (round trip, CPU/call) and first audio over WebRTC", server_cpus="0"),
    "handover": Benchmark("realtime_omni_bench.handover", "a session moving between two gateways on one Redis: "
                          "its client dropped (holder alive) and its gateway killed"),
    "telephony": Benchmark("realtime_omni_bench.telephony", "phone calls over the Twilio Media Streams bridge (8 kHz μ-law): end of speech → first audio, barge-in clear"),
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
                             f"default: {bench.server_cpus or 'none'})")


def _run(args: argparse.Namespace) -> int:
    bench = BENCHMARKS[args.bench]
    module = importlib.import_module(bench.module)
    return int(module.main(args) or 0)


BENCH_DESCRIPTION = """\
Measure a server and write a report (JSON, Markdown, plot) under docs/benchmarks/. Without --url
a server is started on a free port for the run and stopped after."""


def add_bench_parser(subparsers) -> argparse.ArgumentParser:  # type: ignore[no-untyped-def]
    """Add ``bench`` and one sub-command per entry of :data:`BENCHMARKS`; ``bench --help`` lists
    each benchmark with its options."""
    parser = subparsers.add_parser("bench", help="benchmark a server and write a report under docs/benchmarks/",
                                   description=BENCH_DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="bench", required=True, metavar="{" + ",".join(BENCHMARKS) + "}")
    listing = ["benchmarks and their options, with defaults (realtime-omni bench <name> --help explains each):"]
    for name, bench in BENCHMARKS.items():
        p = sub.add_parser(name, help=bench.help, description=bench.help)
        add_common_arguments(p, bench)
        try:
            module = importlib.import_module(bench.module)
        except ImportError as exc:  # an optional dependency is missing: say so when it is run
            p.set_defaults(func=lambda _a, exc=exc, name=name: _missing(name, exc))
            listing += [f"  {name}: {bench.help}", f"      (unavailable here: {exc})"]
            continue
        module.add_arguments(p)
        p.set_defaults(func=_run)
        listing += [f"  {name}: {bench.help}", *_wrap_usage(p)]
    parser.epilog = "\n".join(listing)
    return parser


def _wrap_usage(parser: argparse.ArgumentParser) -> list[str]:
    """The sub-command's options with their defaults, indented under its name."""
    items = []
    for action in parser._actions:  # argparse has no public accessor for a parser's options
        if not action.option_strings or isinstance(action, argparse._HelpAction):
            continue
        flag = action.option_strings[-1]
        default = action.default
        plain = action.nargs == 0 or default is None or default is argparse.SUPPRESS  # a switch, or no default
        items.append(flag if plain else f"{flag}={default}")
    return textwrap.wrap(", ".join(items), width=96, initial_indent="      ", subsequent_indent="      ",
                         break_on_hyphens=False)


def _missing(name: str, exc: ImportError) -> int:
    raise SystemExit(f"realtime-omni bench {name}: {exc}")
