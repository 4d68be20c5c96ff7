"""ICE configuration: which servers, which local addresses, which remote candidates.

By default the server uses **host candidates only** (no STUN/TURN: nothing outside the machine is
contacted). ``ice_servers`` (``REALTIME_OMNI_ICE_SERVERS``, JSON) adds STUN/TURN servers; the same
list is handed to browsers through ``GET /v1/realtime/ice``.

Loopback: aioice (0.13) never gathers ``127.0.0.1``/``::1`` (``aioice.ice.get_host_addresses``
skips them) and offers no option to change that. A server bound to 127.0.0.1 would therefore
answer with candidates on the machine's other interfaces only, or none at all in a network
namespace that has nothing but ``lo``. Instead of monkeypatching aioice, :func:`gather_on` gathers
each peer connection's candidates itself on the addresses we choose, through aioice's own
``Connection.get_component_candidates`` (the routine its ``gather_candidates`` uses), before
aiortc's ``setLocalDescription`` would gather: aiortc then finds gathering already done and puts
exactly those candidates in the answer. When every local address is loopback,
:func:`filter_offer_candidates` also drops the offer's non-loopback and mDNS (``.local``)
candidates, so connectivity checks never leave 127.0.0.0/8 (and no mDNS query is multicast).
"""

from __future__ import annotations

import ipaddress
import json
import logging
from typing import Any

from aiortc import RTCIceServer, RTCPeerConnection

log = logging.getLogger(__name__)

_LOOPBACK_HOSTS = {"127.0.0.1", "localhost", "::1", "ip6-localhost"}


def parse_ice_servers(value: Any) -> list[dict[str, Any]]:
    """Normalise the ``ice_servers`` setting (a JSON string or a list of RTCIceServer dicts)."""
    if value in (None, "", []):
        return []
    if isinstance(value, str):
        value = json.loads(value)
    if isinstance(value, dict):
        value = [value]
    servers = []
    for entry in value:
        if isinstance(entry, str):
            entry = {"urls": entry}
        if not isinstance(entry, dict) or not entry.get("urls"):
            raise ValueError(f"invalid ICE server {entry!r}: expected {{'urls': ..., 'username'?, 'credential'?}}")
        servers.append({k: entry[k] for k in ("urls", "username", "credential") if entry.get(k) is not None})
    return servers


def rtc_ice_servers(servers: list[dict[str, Any]]) -> list[RTCIceServer]:
    """aiortc objects for the configured servers (an empty list: no STUN, host candidates only)."""
    return [RTCIceServer(urls=s["urls"], username=s.get("username"), credential=s.get("credential")) for s in servers]


def _is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return address in _LOOPBACK_HOSTS


def local_addresses(configured: list[str] | None, bind_host: str) -> list[str] | None:
    """Addresses to gather host candidates on; None lets aioice enumerate every interface.

    ``configured`` wins; otherwise a server bound to a loopback address gathers on 127.0.0.1
    only, a server bound to one specific address gathers on that address, and a server bound to
    every address (0.0.0.0 / ::) lets aioice pick its (non-loopback) interfaces.
    """
    if configured:
        return list(configured)
    if _is_loopback(bind_host):
        return ["::1"] if bind_host in ("::1", "ip6-localhost") else ["127.0.0.1"]
    try:
        if ipaddress.ip_address(bind_host).is_unspecified:
            return None
    except ValueError:
        return None  # a host name: let aioice choose
    return [bind_host]


def loopback_only(addresses: list[str] | None) -> bool:
    return bool(addresses) and all(_is_loopback(a) for a in addresses)  # type: ignore[union-attr]


def filter_offer_candidates(sdp: str, keep_loopback_only: bool) -> str:
    """Drop remote candidates our host candidates could not (or should not) pair with."""
    if not keep_loopback_only:
        return sdp
    lines = []
    for line in sdp.splitlines():
        if line.startswith("a=candidate:"):
            parts = line.split()
            # a=candidate:<foundation> <component> <transport> <priority> <address> <port> typ ...
            if len(parts) < 6 or parts[2].lower() != "udp" or not _is_loopback(parts[4]):
                continue
        lines.append(line)
    return "\r\n".join(lines) + "\r\n"


def ice_transports(pc: RTCPeerConnection) -> list[Any]:
    """The distinct RTCIceTransports of a connection (after BUNDLE, usually one)."""
    seen: dict[int, Any] = {}
    for transceiver in pc.getTransceivers():
        transport = transceiver.receiver.transport.transport
        seen.setdefault(id(transport), transport)
    if pc.sctp is not None:
        transport = pc.sctp.transport.transport
        seen.setdefault(id(transport), transport)
    return list(seen.values())


async def gather_on(pc: RTCPeerConnection, addresses: list[str] | None) -> None:
    """Gather local candidates on ``addresses`` (call after setRemoteDescription, before
    setLocalDescription). With ``addresses`` None, aiortc/aioice gather as usual."""
    if addresses is None:
        return
    for transport in ice_transports(pc):
        if transport.state == "closed":
            continue
        connection = transport.iceGatherer._connection  # aioice.Connection
        if connection._local_candidates_start:
            continue
        connection._local_candidates_start = True
        gathered = []
        for component in sorted(connection._components):
            gathered += await connection.get_component_candidates(component=component, addresses=addresses)
        # one synchronous step: aiortc's connect task must never see candidates without the end
        connection._local_candidates += gathered
        connection._local_candidates_end = True
        if not connection._local_candidates:
            log.warning("no ICE candidate could be gathered on %s", addresses)
