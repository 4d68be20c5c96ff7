"""Who may call: FastAPI dependencies every route declares, instead of checks in each handler.

Four kinds of caller, one dependency each (docs/threat-model.md has the table per route):

- :func:`api_key`: a server-side holder of an API key (and an allowed ``Origin``, if a browser);
  returns the key's digest, which owns what the request creates or may see.
- :func:`session_opener`: an API key or a single-use client secret (header, or the WebSocket
  subprotocol browsers use); the secret is consumed here.
- :func:`metrics_reader`: :func:`api_key`, unless ``metrics_public`` opens ``/metrics``.
- :func:`key_holder`: never refuses; says whether the caller may see details (``/ready``).

With no API keys configured every caller passes (the Origin allow-list still holds).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Depends
from starlette.requests import HTTPConnection

from ..security import AuthError, Guard


def _guard(conn: HTTPConnection) -> Guard:
    guard: Guard = conn.app.state.guard
    return guard


async def allowed_origin(conn: HTTPConnection) -> None:
    """403 ``origin_not_allowed`` for a browser page of an origin not on the allow-list."""
    _guard(conn).check_origin(conn.headers)


async def api_key(conn: HTTPConnection) -> str | None:
    """401 ``invalid_api_key`` unless a configured key is presented (``Authorization: Bearer``)."""
    guard = _guard(conn)
    guard.check_origin(conn.headers)
    return guard.check_api_key(conn.headers)


@dataclass(frozen=True)
class Admission:
    """What opening a session was granted: settings bound to a client secret, and the owner."""

    session: dict[str, Any] | None
    owner: str | None


async def session_opener(conn: HTTPConnection) -> Admission:
    subprotocols = list(conn.scope.get("subprotocols") or [])
    session, owner = _guard(conn).admit_owned(conn.headers, subprotocols)
    return Admission(session, owner)


async def metrics_reader(conn: HTTPConnection) -> None:
    if not conn.app.state.settings.auth.metrics_public:
        await api_key(conn)


async def key_holder(conn: HTTPConnection) -> bool:
    try:
        await api_key(conn)
    except AuthError:
        return False
    return True


#: the calling key's digest (None when keys are off)
Owner = Annotated[str | None, Depends(api_key)]
Opener = Annotated[Admission, Depends(session_opener)]
KeyHolder = Annotated[bool, Depends(key_holder)]
