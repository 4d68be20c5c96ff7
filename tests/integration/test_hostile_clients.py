"""Clients that flood, never read and vanish: every session still ends on idle, lifetime and
dead-peer conditions, and SIGTERM drains within its deadline.

A real server process on loopback, raw sockets (realtime_omni_bench/hostile.py); what is checked is what an
operator sees: the live-session gauge of /metrics and how long the process takes to exit.
"""

from __future__ import annotations

import json
import re
import signal
import time

import pytest

from realtime_omni_bench.hostile import RawClient, ServerProcess

SESSIONS = "realtime_omni_sessions_active"
#: session.update with this much instructions makes each session.updated reply as big
BIG_UPDATE = json.dumps({"type": "session.update", "session": {"type": "realtime", "instructions": "x" * 8192}})


def _wedge(port: int, clients: int) -> list[RawClient]:
    """Open sessions whose clients flood events and read nothing back until the server stalls."""
    wedged = []
    for _ in range(clients):
        client = RawClient(port)
        sent = client.flood(BIG_UPDATE, 20000, timeout=1.0)
        assert sent < 20000, "the server never pushed back"
        wedged.append(client)
    return wedged


def test_flooding_clients_that_drop_tcp_leave_no_session_behind():
    # idle far away: what ends these sessions is the dead peer, then the resume grace (1 s)
    env = {"REALTIME_OMNI_IDLE_TIMEOUT_S": "600", "REALTIME_OMNI_RESUME_GRACE_S": "1"}
    with ServerProcess("--model", "echo", "--session-store", "none", env=env) as server:
        clients = _wedge(server.port, 8)
        assert server.metric(SESSIONS) == 8
        for client in clients:
            client.abort()
        took = server.wait_metric(SESSIONS, 0, timeout=10)
        print(f"8 flood-and-drop sessions all ended {took:.1f} s after the reset")
        # the cap is free again: a new session opens
        RawClient(server.port).abort()


def test_a_wedged_session_that_stays_connected_ends_at_its_lifetime():
    env = {"REALTIME_OMNI_MAX_SESSION_S": "3", "REALTIME_OMNI_IDLE_TIMEOUT_S": "600",
           "REALTIME_OMNI_RESUME_GRACE_S": "600"}
    with ServerProcess("--model", "echo", "--session-store", "none", env=env) as server:
        start = time.monotonic()
        clients = _wedge(server.port, 2)
        server.wait_metric(SESSIONS, 0, timeout=10)
        took = time.monotonic() - start
        print(f"wedged, connected sessions ended {took:.1f} s after the first opened (lifetime 3 s)")
        for client in clients:
            client.abort()


def test_a_wedged_session_ends_when_its_client_goes_idle():
    env = {"REALTIME_OMNI_IDLE_TIMEOUT_S": "2", "REALTIME_OMNI_RESUME_GRACE_S": "600"}
    with ServerProcess("--model", "echo", "--session-store", "none", env=env) as server:
        clients = _wedge(server.port, 2)
        took = server.wait_metric(SESSIONS, 0, timeout=10)
        print(f"wedged sessions ended {took:.1f} s after their clients went quiet (idle 2 s)")
        for client in clients:
            client.abort()


@pytest.mark.parametrize("dropped", [False, True], ids=["connected", "dropped"])
def test_sigterm_drains_within_its_deadline_with_wedged_clients(dropped):
    with ServerProcess("--model", "echo", "--session-store", "none", "--shutdown-timeout-s", "5") as server:
        clients = _wedge(server.port, 6)
        if dropped:
            for client in clients:
                client.abort()
        took = server.terminate(timeout=15)
        print(f"exited {took:.1f} s after SIGTERM with 6 wedged sessions ({'dropped' if dropped else 'connected'})")
        assert took < 5 + 3
        # uvicorn re-raises the SIGTERM it caught once it has shut down: death by that signal
        assert server.proc.returncode in (0, -signal.SIGTERM), server.output()[-2000:]
        output = server.output()
        assert "Traceback" not in output
        # handlers let go of their clients when the server goes down, none had to be cancelled
        # (uvicorn still waits out its graceful timeout for sockets whose peer reads nothing)
        assert not re.search(r"Cancel [1-9]\d* running task", output), output[-2000:]
        for client in clients:
            if not dropped:
                client.abort()


def test_phone_streams_that_flood_media_and_drop_leave_no_session_behind():
    import base64

    from realtime_omni.transports.twilio import STREAM_PATH

    env = {"REALTIME_OMNI_IDLE_TIMEOUT_S": "600", "REALTIME_OMNI_RESUME_GRACE_S": "1"}
    with ServerProcess("--model", "echo", "--session-store", "none", env=env) as server:
        streams = []
        for n in range(4):
            stream = RawClient(server.port, STREAM_PATH)
            sid = f"MZ{n:032d}"
            stream.send_text(json.dumps({"event": "connected", "protocol": "Call", "version": "1.0.0"}))
            stream.send_text(json.dumps({"event": "start", "sequenceNumber": "1", "streamSid": sid, "start": {
                "accountSid": "AC" + "0" * 32, "streamSid": sid, "callSid": f"CA{n:032d}", "tracks": ["inbound"],
                "customParameters": {"model": "echo"},
                "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1}}}))
            # 1 s of μ-law per frame, echoed back to a carrier that never reads
            media = json.dumps({"event": "media", "streamSid": sid, "media": {
                "track": "inbound", "payload": base64.b64encode(b"\x7f" * 8000).decode()}})
            assert stream.flood(media, 20000, timeout=0.5) < 20000, "the server never pushed back"
            streams.append(stream)
        assert server.metric(SESSIONS) == 4
        for stream in streams:
            stream.abort()
        took = server.wait_metric(SESSIONS, 0, timeout=10)
        print(f"4 flood-and-drop phone streams all ended {took:.1f} s after the reset")
