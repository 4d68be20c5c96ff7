"""The floor under `realtime-omni bench capacity`: what a Python WebSocket server costs per 20 ms
chunk when it does nothing but answer each ``input_audio_buffer.append`` with an audio delta.

It serves the least of the protocol the capacity client needs (``session.created``, the delta,
``response.done`` on ``response.cancel``, ``/ready``) with the ``websockets`` library on uvloop,
without ASGI, sessions, limits or checks, pinned to the CPU the capacity run gives the server,
and writes the same report as `bench capacity` (default ``docs/benchmarks/capacity-floor.md``).
The server's own cost per chunk is the capacity report's figure minus this one.

    python3 benchmarks/ws_floor.py --sessions 10,50,100,200
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import subprocess
import sys
import time
from http import HTTPStatus
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


async def _serve(port: int) -> None:
    from websockets.asyncio.server import serve

    live = 0

    async def session(ws) -> None:  # type: ignore[no-untyped-def]
        nonlocal live
        live += 1
        try:
            await ws.send(json.dumps({"type": "session.created", "session": {}}))
            async for message in ws:
                event = json.loads(message)
                if event["type"] == "input_audio_buffer.append":
                    pcm = base64.b64decode(event["audio"])
                    await ws.send(json.dumps({
                        "type": "response.output_audio.delta", "event_id": "event_1", "response_id": "resp_1",
                        "item_id": "item_1", "output_index": 0, "content_index": 0,
                        "delta": base64.b64encode(pcm).decode()}))
                elif event["type"] == "response.cancel":
                    await ws.send(json.dumps({"type": "response.done"}))
        finally:
            live -= 1

    def ready(connection, request):  # type: ignore[no-untyped-def]
        if request.path == "/ready":
            return connection.respond(HTTPStatus.OK, json.dumps({"sessions": live}))
        return None

    async with serve(session, "127.0.0.1", port, process_request=ready, compression=None, max_size=None):
        await asyncio.Future()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", default="10,50,100,200")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--port", type=int, default=8779)
    parser.add_argument("--out", default="docs/benchmarks")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)  # the child process
    args = parser.parse_args()
    if args.serve:
        import uvloop

        uvloop.run(_serve(args.port))
        return 0

    from realtime_omni_bench import ServerURL, capacity

    url = f"http://127.0.0.1:{args.port}"
    child = subprocess.Popen(["taskset", "-c", "0", sys.executable, __file__, "--serve", "--port", str(args.port)])
    try:
        deadline = time.monotonic() + 30
        while ServerURL.parse(url).ready(1.0) is None:
            if time.monotonic() > deadline or child.poll() is not None:
                raise RuntimeError("the floor server did not start")
            time.sleep(0.2)
        ladder = [int(n) for n in args.sessions.split(",")]
        capacity.run(ladder, args.seconds, url=url, out=args.out, name="capacity-floor",
                     server_pid=child.pid, title="Capacity floor: a bare websockets server answering each chunk",
                     command="python3 benchmarks/ws_floor.py " + " ".join(sys.argv[1:]))
    finally:
        child.terminate()
        child.wait(10)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    raise SystemExit(main())
