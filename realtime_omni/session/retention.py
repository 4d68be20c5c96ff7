"""How long stored sessions stay, for every way a session ends.

- Ended for good (the client closed, idle, lifetime, resume grace passed, the call hung up or
  dropped, the peer timed out, the session failed — any reason but the ones below): its row is
  deleted at once.
- Ended by the server shutting down (``server_shutdown``): kept, so the client can resume
  after the restart, until ``persist_ttl_s`` after its last change.
- Handed over to another server process sharing the store (``session_moved``, see
  :mod:`.ownership`): kept, that process serves it from the row.
- Never ended (the process was killed, the machine lost power): same as a shutdown. Rows past
  ``persist_ttl_s`` are purged when the server starts and every ``purge_interval(ttl)`` after;
  the sessions live in this process are never purged, however quiet.

With ``store_transcripts`` off, what is stored of each item is its id, role, type, status and
the types of its content parts: settings and the shape of the conversation survive a restart,
its words do not.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from collections.abc import Callable, Collection
from typing import Any

from .store import SessionStore

log = logging.getLogger(__name__)

#: endings after which the stored session stays resumable (until persist_ttl_s)
KEPT_ENDINGS = frozenset({"server_shutdown", "session_moved"})


def keeps_row(close_reason: str | None) -> bool:
    return close_reason in KEPT_ENDINGS


def purge_interval(ttl_s: float) -> float:
    """How often expired rows are looked for: often enough that none outlives its TTL by much."""
    return min(max(ttl_s / 4, 0.5), 300.0)


#: what the words of a call item are in (its arguments, what it returned, why it was refused)
_SAID = ("arguments", "output", "reason")


def without_transcripts(snapshot: dict[str, Any]) -> dict[str, Any]:
    """The snapshot with every content part reduced to its type (no text, transcript, audio),
    and function and MCP calls without their arguments, outputs and refusal reasons (what was
    said reaches them: "book a table for Anna at eight")."""
    items = []
    for item in snapshot.get("items", []):
        kept = {**item, "content": [{"type": part.get("type")} for part in item.get("content") or []]}
        for key in _SAID:
            if isinstance(kept.get(key), str):
                kept[key] = ""
        if isinstance(kept.get("error"), dict):
            kept["error"] = {"type": kept["error"].get("type")}
        if "content" not in item:
            del kept["content"]
        items.append(kept)
    return {**snapshot, "items": items}


async def purge_forever(store: SessionStore, executor: concurrent.futures.Executor, ttl_s: float,
                        live: Callable[[], Collection[str]] = tuple) -> None:
    """Delete expired rows now and then every :func:`purge_interval` until cancelled; the
    sessions ``live()`` names are kept (a long quiet session is still resumable)."""
    loop = asyncio.get_running_loop()
    while True:
        try:
            removed = await loop.run_in_executor(executor, store.purge, ttl_s, list(live()))
            if removed:
                log.info("session store: purged %d sessions older than %.0f s", removed, ttl_s)
        except Exception as exc:  # noqa: BLE001 - a failed purge is retried next time
            log.error("session store purge failed: %s", exc)
        await asyncio.sleep(purge_interval(ttl_s))
