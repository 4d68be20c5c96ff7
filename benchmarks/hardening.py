#!/usr/bin/env python
"""Issue 12 at scale: the flood-and-drop, large-item, kill-and-resume and SIGTERM scenarios
against real server processes on loopback, with raw sockets where a library would be too polite.

    python benchmarks/hardening.py --sessions 100 --items 96 --notes 1000 --out hardening.json

Reported: sessions leaked and how long the dropped ones took to go; server RSS before and after;
the store's backlog after the client leaves and the bytes it wrote; what a resume after SIGKILL
said was lost, and whether any event came twice or a second ``session.created``; seconds from
SIGTERM to exit with stuck clients.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import websockets  # noqa: E402

from realtime_omni_bench.hostile import RawClient, ServerProcess  # noqa: E402

MIB = 1024 * 1024
BIG_UPDATE = json.dumps({"type": "session.update", "session": {"type": "realtime", "instructions": "x" * 8192}})


def _wedge(port: int, count: int) -> list[RawClient]:
    clients = []
    for _ in range(count):
        client = RawClient(port)
        client.flood(BIG_UPDATE, 20000, timeout=0.2)
        clients.append(client)
    return clients


def flood_and_drop(sessions: int) -> dict[str, Any]:
    env = {"REALTIME_OMNI_IDLE_TIMEOUT_S": "600", "REALTIME_OMNI_RESUME_GRACE_S": "1",
           "REALTIME_OMNI_MAX_SESSIONS": str(sessions + 10)}
    with ServerProcess("--model", "echo", "--session-store", "none", env=env) as server:
        rss_before = server.rss_mb()
        clients = _wedge(server.port, sessions)
        wedged = server.metric("realtime_omni_sessions_active")
        rss_wedged = server.rss_mb()
        for client in clients:
            client.abort()
        start = time.monotonic()
        while server.metric("realtime_omni_sessions_active") and time.monotonic() - start < 30:
            time.sleep(0.1)
        ended_s = time.monotonic() - start
        leaked = server.metric("realtime_omni_sessions_active")
        time.sleep(2)
        return {"sessions": sessions, "wedged": wedged, "leaked_after_30s": leaked, "all_ended_s": round(ended_s, 2),
                "rss_mb_before": round(rss_before), "rss_mb_wedged": round(rss_wedged), "rss_mb_after": round(server.rss_mb())}


def sigterm(sessions: int) -> dict[str, Any]:
    with ServerProcess("--model", "echo", "--session-store", "none",
                       env={"REALTIME_OMNI_MAX_SESSIONS": str(sessions + 10)}) as server:
        clients = _wedge(server.port, sessions)
        took = server.terminate(timeout=60)
        for client in clients:
            client.abort()
        return {"sessions": sessions, "exit_s_after_sigterm": round(took, 2), "deadline_s": 10.0}


async def large_items(items: int, db: Path) -> dict[str, Any]:
    with ServerProcess("--model", "echo", "--session-store", f"sqlite:///{db}") as server:
        ws = await websockets.connect(f"ws://127.0.0.1:{server.port}/v1/realtime?model=echo", max_size=None)
        await _recv(ws, "session.created")
        rss_before = server.rss_mb()
        wchar_before = _wchar(server.proc.pid)
        refused = 0
        for _ in range(items):
            await ws.send(json.dumps({"type": "conversation.item.create", "item": {
                "type": "message", "role": "user", "content": [{"type": "input_text", "text": "m" * MIB}]}}))
            if (await _recv(ws, "conversation.item.done"))["type"] == "error":
                refused += 1
        ws.transport.abort()
        left = time.monotonic()
        while server.metric("realtime_omni_store_backlog_sessions") and time.monotonic() - left < 60:
            await asyncio.sleep(0.05)
        backlog_s = time.monotonic() - left
        await asyncio.sleep(0.5)
        return {"items_sent": items, "item_bytes": MIB, "refused": refused, "rss_mb_before": round(rss_before),
                "rss_mb_after": round(server.rss_mb()), "store_caught_up_s_after_client_left": round(backlog_s, 2),
                "store_bytes_written_mib": round((_wchar(server.proc.pid) - wchar_before) / MIB, 1),
                "db_files_mib": round(sum(p.stat().st_size for p in db.parent.glob(db.name + "*")) / MIB, 1)}


async def kill_and_resume(notes: int, db: Path) -> dict[str, Any]:
    args = ("--model", "echo", "--session-store", f"sqlite:///{db}")
    with ServerProcess(*args) as first:
        ws = await websockets.connect(f"ws://127.0.0.1:{first.port}/v1/realtime?model=echo")
        created = await _recv(ws, "session.created")
        token, last_seq, seen = created["session"]["resume_token"], created["sequence_number"], []
        for index in range(notes):
            await ws.send(json.dumps({"type": "conversation.item.create", "item": {
                "id": f"item_{index:05d}", "type": "message", "role": "user",
                "content": [{"type": "input_text", "text": f"note {index}"}]}}))
            done = await _recv(ws, "conversation.item.done")
            seen.append(done["item"]["id"])
            last_seq = done["sequence_number"]
        first.proc.kill()
        first.proc.wait(10)
        ws.transport.abort()
    with ServerProcess(*args) as second:
        ws = await websockets.connect(
            f"ws://127.0.0.1:{second.port}/v1/realtime?resume_token={token}&last_sequence_number={last_seq}")
        hello = json.loads(await asyncio.wait_for(ws.recv(), 10))
        restored = hello.get("restored") or {}
        await ws.send(json.dumps({"type": "conversation.item.retrieve", "item_id": "item_missing"}))
        after = []
        while not after or after[-1]["type"] != "error":
            after.append(json.loads(await asyncio.wait_for(ws.recv(), 10)))
        await ws.close()
    kept = restored.get("item_ids", [])
    return {"items_sent": notes, "client_last_seq": last_seq, "stored_seq": restored.get("stored_sequence_number"),
            "gap": hello.get("gap"), "lost": restored.get("lost"), "not_replayed": restored.get("not_replayed"),
            "items_restored": len(kept), "restored_is_prefix_of_seen": kept == seen[:len(kept)],
            "duplicate_session_created": sum(e["type"] == "session.created" for e in after),
            "events_renumbered_at_or_below_last_seen": sum(e.get("sequence_number", 1 << 62) <= last_seq for e in after)}


async def _recv(ws, kind: str) -> dict[str, Any]:
    while True:
        event = json.loads(await asyncio.wait_for(ws.recv(), 30))
        if event["type"] in (kind, "error"):
            return event


def _wchar(pid: int) -> int:
    for line in Path(f"/proc/{pid}/io").read_text().splitlines():
        if line.startswith("wchar:"):
            return int(line.split()[1])
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=int, default=100, help="wedged clients for flood-and-drop and SIGTERM")
    parser.add_argument("--items", type=int, default=96, help="1 MiB items sent by one client")
    parser.add_argument("--notes", type=int, default=1000, help="small items before the SIGKILL")
    parser.add_argument("--out", type=Path, help="write the report here as JSON")
    args = parser.parse_args()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    report: dict[str, Any] = {"commit": commit, "machine": platform.processor() or platform.machine(),
                              "python": platform.python_version()}
    report["flood_and_drop"] = flood_and_drop(args.sessions)
    print(json.dumps(report["flood_and_drop"]), flush=True)
    report["sigterm"] = sigterm(args.sessions)
    print(json.dumps(report["sigterm"]), flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        report["large_items"] = asyncio.run(large_items(args.items, Path(tmp) / "large.db"))
        print(json.dumps(report["large_items"]), flush=True)
        report["kill_and_resume"] = asyncio.run(kill_and_resume(args.notes, Path(tmp) / "kill.db"))
        print(json.dumps(report["kill_and_resume"]), flush=True)
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
