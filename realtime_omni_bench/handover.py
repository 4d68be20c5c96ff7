"""``realtime-omni bench handover``: how long a session takes to move between two gateways that
share one Redis, when its client comes back through the other one.

Two gateway processes (``--model echo``) and a redis-server on loopback, all started here. Each
round opens a session on the first gateway, adds an item, lets the lease be renewed, drops the
client's connection (the first gateway keeps the session for a resume) and resumes through the
second; the time is from the resume's connect to ``session.resumed``: the second gateway asks, the
first lets its copy go at its next renewal and writes its last changes, the second rebuilds the
session. Then, once, the first gateway is killed (SIGKILL) with a session on it and the session is
resumed through the second: that waits for the dead gateway's lease to lapse (``store.lease_s``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import websockets

from .hostile import ServerProcess
from .report import Report, command_line, summarize, write_report


@contextlib.contextmanager
def redis_server() -> Iterator[str]:
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("bench handover needs redis-server (Debian: apt-get install redis-server)")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", ""],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                socket.create_connection(("127.0.0.1", port), 0.2).close()
                break
            time.sleep(0.05)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        proc.wait(10)


async def _open(gateway: ServerProcess) -> tuple[Any, str, int]:
    ws = await websockets.connect(f"ws://127.0.0.1:{gateway.port}/v1/realtime?model=echo")
    created = json.loads(await ws.recv())
    await ws.send(json.dumps({"type": "conversation.item.create", "item": {
        "type": "message", "role": "user", "content": [{"type": "input_text", "text": "hello"}]}}))
    while True:
        event = json.loads(await asyncio.wait_for(ws.recv(), 10))
        if event["type"] == "conversation.item.done":
            return ws, created["session"]["resume_token"], event["sequence_number"]


async def _resume(gateway: ServerProcess, token: str, last_seq: int) -> float:
    began = time.perf_counter()
    url = f"ws://127.0.0.1:{gateway.port}/v1/realtime?resume_token={token}&last_sequence_number={last_seq}"
    ws = await websockets.connect(url, open_timeout=30)
    hello = json.loads(await asyncio.wait_for(ws.recv(), 30))
    took = 1000 * (time.perf_counter() - began)
    await ws.close()
    if hello["type"] != "session.resumed":
        raise RuntimeError(f"the resume was refused: {hello}")
    return took


async def _rounds(first: ServerProcess, second: ServerProcess, rounds: int, held_s: float,
                  period_s: float) -> list[float]:
    took = []
    for _ in range(rounds):
        ws, token, last_seq = await _open(first)
        # the lease renewed at least once, the row written; then a drop at a random point of the
        # renewal period (rounds in step with the renewals would each find the same phase)
        await asyncio.sleep(held_s + random.uniform(0.0, period_s))
        ws.transport.abort()  # the client's network drops: the first gateway keeps the session
        await asyncio.sleep(0.2)  # (it notices the drop)
        took.append(await _resume(second, token, last_seq))
    return took


def run(rounds: int, lease_s: float, out: str, name: str) -> dict[str, Path]:
    started = time.monotonic()
    env = {"REALTIME_OMNI_STORE__LEASE_S": str(lease_s)}
    with redis_server() as url:
        args = ("--model", "echo", "--session-store", url)
        with ServerProcess(*args, env=env) as first, ServerProcess(*args, env=env) as second:
            moves = asyncio.run(_rounds(first, second, rounds, held_s=1.2 * lease_s / 5 + 0.3, period_s=lease_s / 5))

            async def crash() -> float:
                _ws, token, last_seq = await _open(first)
                await asyncio.sleep(1.2 * lease_s / 5 + 0.3)
                first.proc.kill()
                first.proc.wait(10)
                return await _resume(second, token, last_seq)

            failover = asyncio.run(crash())
    summary = {"move_ms": summarize(moves), "failover_ms": round(failover, 1), "lease_s": lease_s}
    m = summary["move_ms"]
    headline = (f"a dropped session moves to the other gateway in {m['p50']} ms p50 / {m['max']} ms max; after its "
                f"gateway was killed, in {failover:.0f} ms (its lease: {lease_s:g} s)")
    rows = [["move (holder alive, client dropped)", m["n"], m["p50"], m["p95"], m["min"], m["max"]],
            ["failover (holder killed)", 1, round(failover, 1), "", "", ""]]

    def plot(fig: Any) -> None:
        ax = fig.add_subplot()
        ax.plot(range(1, len(moves) + 1), moves, "o-", label="move: holder alive")
        ax.axhline(failover, color="tab:red", linestyle="--", label="failover: holder killed")
        ax.set_xlabel("round")
        ax.set_ylabel("resume connect → session.resumed (ms)")
        ax.legend()

    cmd = command_line()
    report = Report(
        name=name, benchmark="handover", title="Gateway handover: a session moving between gateways on one Redis",
        command=cmd, config={"rounds": rounds, "lease_s": lease_s, "model": "echo", "gateways": 2},
        summary=summary, samples={"move_ms": moves, "failover_ms": failover},
        columns=["case", "n", "p50 ms", "p95 ms", "min ms", "max ms"], rows=rows, headline=headline,
        notes=["Two gateway processes and a redis-server on loopback, started by the benchmark. A move: the second "
               "gateway asks for the session, the first lets its copy go at its next lease renewal (every "
               "lease_s / 5), writes its last changes and drops the lease, the second rebuilds it from the row.",
               "A failover waits for the killed gateway's lease to lapse: at most lease_s after its last renewal."],
        plot=plot, reproduce=[cmd])
    report.duration_s = time.monotonic() - started
    return write_report(report, out)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rounds", type=int, default=20, help="sessions moved (default: %(default)s)")
    parser.add_argument("--lease-s", type=float, default=5.0, help="store.lease_s of both gateways (default: %(default)s)")


def main(args: argparse.Namespace) -> int:
    if args.url is not None:
        print("note: --url is ignored: the handover benchmark starts its own two gateways and Redis")
    run(rounds=args.rounds, lease_s=args.lease_s, out=args.out, name=args.name or "handover")
    return 0
