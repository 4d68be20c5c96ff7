"""Persistence of session settings and conversation items, so a session outlives its server.

What is stored of a session: its *meta* (model, settings, owner, the order of its items, the
last sequence number its stored state covers, a hash of the resume token — never the token) and
one record per conversation item (text and transcripts; raw audio is not stored). Writes are
incremental: a :class:`StoreChange` carries the meta and only the items that changed or went,
so a long conversation is never rewritten whole. SQLite (WAL) is the default; Redis serves
deployments with several replicas. Both are blocking clients: callers run them in a thread.
"""

from __future__ import annotations

import abc
import hashlib
import json
import os
import sqlite3
import threading
import time
from dataclasses import dataclass, field
from collections.abc import Collection
from pathlib import Path
from typing import Any

#: seconds a Redis call may take (connect, or answer) before it fails
REDIS_TIMEOUT_S = 5.0
#: a write whose sessions' leases change meanwhile (renewed, taken) starts over, this often at most
WATCH_TRIES = 8


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass
class StoreChange:
    """One session's writes: its meta (always), the items to upsert, the item ids that went."""

    session_id: str
    token_digest: str
    meta: dict[str, Any]
    items: dict[str, dict[str, Any]] = field(default_factory=dict)
    removed: list[str] = field(default_factory=list)
    #: drop every stored item first (a whole snapshot)
    replace: bool = False

    def nbytes(self) -> int:
        return sum(len(json.dumps(item)) for item in self.items.values())


def change_from_snapshot(session_id: str, token_digest: str, snapshot: dict[str, Any]) -> StoreChange:
    """A whole snapshot (``items`` in order) as one replacing change."""
    items = {(it.get("id") if isinstance(it, dict) and it.get("id") else f"#{i}"): it
             for i, it in enumerate(snapshot.get("items", []))}
    meta = {k: v for k, v in snapshot.items() if k != "items"}
    meta["order"] = list(items)
    return StoreChange(session_id, token_digest, meta, items, replace=True)


def assemble(meta: dict[str, Any], items: dict[str, Any]) -> dict[str, Any]:
    """Meta and item records → the snapshot a session is restored from (items in order)."""
    snapshot = {k: v for k, v in meta.items() if k != "order"}
    snapshot["items"] = [items[i] for i in meta.get("order", []) if i in items]
    return snapshot


class SessionStore(abc.ABC):
    @abc.abstractmethod
    def apply(self, changes: list[StoreChange], deleted: list[str], holder: str | None = None) -> list[str]:
        """Write ``changes`` and delete the sessions in ``deleted``, as one unit where possible.
        ``holder`` (a shared store): only sessions it holds, or nobody does, are touched; returns
        the ids left alone (another process serves them now)."""

    @abc.abstractmethod
    def load(self, token_digest: str, max_age_s: float) -> dict[str, Any] | None:
        """The snapshot for a token if it was saved less than ``max_age_s`` ago."""

    def save(self, session_id: str, token_digest: str, snapshot: dict[str, Any]) -> None:
        self.apply([change_from_snapshot(session_id, token_digest, snapshot)], [])

    def delete(self, session_id: str) -> None:
        self.apply([], [session_id])

    def purge(self, max_age_s: float, keep: Collection[str] = ()) -> int:
        """Remove sessions last saved more than ``max_age_s`` ago, except those in ``keep`` (the
        live ones: a later write must not find its older items gone); how many went."""
        return 0

    # -- which process holds a live session (stores shared by several processes) ------------
    #: several server processes share this store: each live session is held by one of them
    #: (a lease it renews), so a resume through another process takes it over instead of
    #: running a second copy. A store of one process holds nothing.
    shared = False

    def hold(self, holder: str, session_ids: Collection[str], lease_s: float,
             had: Collection[str] = ()) -> Renewal:
        """Extend ``holder``'s lease on each session for ``lease_s``, or take it where it is free
        (not for the sessions in ``had``: a lease it had and that lapsed may have been another's
        since); report the ones it does not hold, and the ones another process asked for."""
        return Renewal()

    def claim(self, session_id: str, holder: str, lease_s: float) -> bool:
        """Take the lease if nobody (else) holds it."""
        return True

    def ask(self, session_id: str, asker: str, wait_s: float) -> None:
        """Ask whoever holds the session to let it go (the request lapses after ``wait_s``)."""

    def withdraw(self, session_id: str, asker: str) -> None:
        """Take back ``asker``'s request (it gave up waiting): the holder keeps the session."""

    def release(self, holder: str, session_ids: Collection[str]) -> None:
        """Drop ``holder``'s leases (those it no longer has are left alone)."""

    def close(self) -> None:
        pass


@dataclass(frozen=True)
class Renewal:
    """What one :meth:`SessionStore.hold` found."""

    #: held by another process now (this one stalled past its lease): its copy must stop
    lost: tuple[str, ...] = ()
    #: another process asked to take these over (a client resumed there)
    wanted: tuple[str, ...] = ()


class SQLiteStore(SessionStore):
    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
            # conversations are private: the file (and the WAL and shm files SQLite gives the same
            # mode) is the server user's alone, whatever the umask
            os.close(os.open(self.path, os.O_CREAT | os.O_RDWR, 0o600))
            os.chmod(self.path, 0o600)
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self._lock = threading.Lock()
        with self._lock:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.execute(
                "CREATE TABLE IF NOT EXISTS session_meta (id TEXT PRIMARY KEY, token TEXT UNIQUE NOT NULL,"
                " updated REAL NOT NULL, meta TEXT NOT NULL)")
            self._db.execute(
                "CREATE TABLE IF NOT EXISTS session_items (session_id TEXT NOT NULL, item_id TEXT NOT NULL,"
                " data TEXT NOT NULL, PRIMARY KEY (session_id, item_id))")
        self._migrate()

    def _migrate(self) -> None:
        """Whole-snapshot rows of earlier versions (table ``sessions``) become meta and items."""
        with self._lock:
            legacy = self._db.execute("SELECT name FROM sqlite_master WHERE type='table' AND name='sessions'").fetchone()
            rows = self._db.execute("SELECT id, token, updated, snapshot FROM sessions").fetchall() if legacy else []
        for session_id, token, updated, snapshot in rows:
            self.apply([change_from_snapshot(session_id, token, json.loads(snapshot))], [])
            with self._lock:
                self._db.execute("UPDATE session_meta SET updated = ? WHERE id = ?", (updated, session_id))
        if legacy:
            with self._lock:
                self._db.execute("DROP TABLE sessions")

    def apply(self, changes: list[StoreChange], deleted: list[str], holder: str | None = None) -> list[str]:
        now = time.time()
        with self._lock:
            self._db.execute("BEGIN")
            try:
                for change in changes:
                    sid = change.session_id
                    self._db.execute(
                        "INSERT INTO session_meta (id, token, updated, meta) VALUES (?, ?, ?, ?) ON CONFLICT(id)"
                        " DO UPDATE SET token=excluded.token, updated=excluded.updated, meta=excluded.meta",
                        (sid, change.token_digest, now, json.dumps(change.meta)))
                    if change.replace:
                        self._db.execute("DELETE FROM session_items WHERE session_id = ?", (sid,))
                    self._db.executemany(
                        "INSERT INTO session_items (session_id, item_id, data) VALUES (?, ?, ?) ON CONFLICT"
                        " (session_id, item_id) DO UPDATE SET data=excluded.data",
                        [(sid, item_id, json.dumps(item)) for item_id, item in change.items.items()])
                    self._db.executemany("DELETE FROM session_items WHERE session_id = ? AND item_id = ?",
                                         [(sid, item_id) for item_id in change.removed])
                for sid in deleted:
                    self._db.execute("DELETE FROM session_meta WHERE id = ?", (sid,))
                    self._db.execute("DELETE FROM session_items WHERE session_id = ?", (sid,))
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
        return []  # one process: nobody else's

    def load(self, token_digest: str, max_age_s: float) -> dict[str, Any] | None:
        with self._lock:
            row = self._db.execute(
                "SELECT id, meta FROM session_meta WHERE token = ? AND updated >= ?", (token_digest, time.time() - max_age_s)
            ).fetchone()
            if row is None:
                return None
            items = self._db.execute("SELECT item_id, data FROM session_items WHERE session_id = ?", (row[0],)).fetchall()
        return assemble(json.loads(row[1]), {item_id: json.loads(data) for item_id, data in items})

    def purge(self, max_age_s: float, keep: Collection[str] = ()) -> int:
        expired = "SELECT id FROM session_meta WHERE updated < ? AND id NOT IN (SELECT value FROM json_each(?))"
        args = (time.time() - max_age_s, json.dumps(list(keep)))
        with self._lock:
            self._db.execute("BEGIN")
            try:
                self._db.execute(f"DELETE FROM session_items WHERE session_id IN ({expired})", args)
                removed = self._db.execute(f"DELETE FROM session_meta WHERE id IN ({expired})", args).rowcount
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
        return removed

    def close(self) -> None:
        with self._lock:
            self._db.close()


#: per session (KEYS: its lease, its request; ARGV[2 + n]: "1" to extend a lease ARGV[1] had,
#: "0" to take a free one too): 1 held by ARGV[1] now, 0 not; then 1 if asked for
_HOLD = """
local out = {}
for i = 1, #KEYS, 2 do
  local holder = redis.call('GET', KEYS[i])
  local extend = ARGV[2 + (i + 1) / 2] == '1'
  if holder == ARGV[1] or (holder == false and not extend) then
    redis.call('SET', KEYS[i], ARGV[1], 'PX', ARGV[2])
    out[#out + 1] = 1
  else
    out[#out + 1] = 0
  end
  out[#out + 1] = redis.call('EXISTS', KEYS[i + 1])
end
return out
"""

#: KEYS[1] the lease, KEYS[2] its request: taken if free or already ARGV[1]'s (the request is
#: then answered)
_CLAIM = """
local holder = redis.call('GET', KEYS[1])
if holder == false or holder == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  redis.call('DEL', KEYS[2])
  return 1
end
return 0
"""

#: the leases (or requests) among KEYS whose value is ARGV[1] go
_RELEASE = """
for i = 1, #KEYS do
  if redis.call('GET', KEYS[i]) == ARGV[1] then redis.call('DEL', KEYS[i]) end
end
return 0
"""


class RedisStore(SessionStore):
    """Shared by replicas; keys expire on their own after ``ttl_s`` (so ``purge`` has nothing to do)."""

    shared = True

    def __init__(self, url: str, ttl_s: float = 3600.0, prefix: str = "realtime_omni") -> None:
        import redis  # optional dependency

        # a Redis that stops answering fails a call in seconds instead of holding the store's
        # thread (and every resume and write behind it) for ever
        self._redis = redis.Redis.from_url(url, socket_timeout=REDIS_TIMEOUT_S, socket_connect_timeout=REDIS_TIMEOUT_S)
        self._redis.ping()
        self.ttl_s = int(ttl_s)
        self.prefix = prefix
        self._hold = self._redis.register_script(_HOLD)
        self._claim = self._redis.register_script(_CLAIM)
        self._release = self._redis.register_script(_RELEASE)

    def _keys(self, session_id: str) -> tuple[str, str]:
        return f"{self.prefix}:session:{session_id}", f"{self.prefix}:items:{session_id}"

    def apply(self, changes: list[StoreChange], deleted: list[str], holder: str | None = None) -> list[str]:
        import redis

        ids = list(dict.fromkeys([c.session_id for c in changes] + list(deleted)))
        leases = [self._lease_keys(sid)[0] for sid in ids]
        with self._redis.pipeline(transaction=True) as pipe:
            for _ in range(WATCH_TRIES):
                try:
                    reader: Any = self._redis
                    theirs: set[str] = set()
                    if holder is not None and leases:
                        # a lease that changes before the writes (taken, renewed) starts them over
                        pipe.watch(*leases)
                        reader = pipe  # (watching: its reads run at once)
                        held = pipe.mget(leases)
                        theirs = {sid for sid, h in zip(ids, held) if h is not None and h.decode() != holder}
                    tokens = [reader.get(self._keys(sid)[0]) for sid in deleted if sid not in theirs]
                    pipe.multi()
                    self._queue(pipe, [c for c in changes if c.session_id not in theirs],
                                [sid for sid in deleted if sid not in theirs], tokens)
                    pipe.execute()
                    return sorted(theirs)
                except redis.WatchError:
                    continue
        raise RuntimeError(f"the session leases kept changing during {WATCH_TRIES} tries of one write")

    def _queue(self, pipe: Any, changes: list[StoreChange], deleted: list[str], docs: list[Any]) -> None:
        doomed = [key for sid in deleted for key in self._keys(sid)]
        for doc in docs:  # the token keys of the deleted sessions too
            token = json.loads(doc)["meta"].get("token_digest") if doc else None
            if token:
                doomed.append(f"{self.prefix}:token:{token}")
        for change in changes:
            meta_key, items_key = self._keys(change.session_id)
            pipe.set(meta_key, json.dumps({"saved": time.time(), "meta": change.meta}), ex=self.ttl_s)
            pipe.set(f"{self.prefix}:token:{change.token_digest}", change.session_id, ex=self.ttl_s)
            if change.replace:
                pipe.delete(items_key)
            if change.items:
                pipe.hset(items_key, mapping={k: json.dumps(v) for k, v in change.items.items()})
            if change.removed:
                pipe.hdel(items_key, *change.removed)
            pipe.expire(items_key, self.ttl_s)
        if doomed:
            pipe.delete(*doomed)

    def load(self, token_digest: str, max_age_s: float) -> dict[str, Any] | None:
        session_id = self._redis.get(f"{self.prefix}:token:{token_digest}")
        if session_id is None:
            return None
        meta_key, items_key = self._keys(session_id.decode())
        doc = self._redis.get(meta_key)
        if doc is None:
            return None
        data = json.loads(doc)
        if time.time() - data["saved"] > max_age_s:
            return None
        items = {k.decode(): json.loads(v) for k, v in self._redis.hgetall(items_key).items()}
        return assemble(data["meta"], items)

    def _lease_keys(self, session_id: str) -> tuple[str, str]:
        return f"{self.prefix}:holder:{session_id}", f"{self.prefix}:wanted:{session_id}"

    def hold(self, holder: str, session_ids: Collection[str], lease_s: float,
             had: Collection[str] = ()) -> Renewal:
        ids = list(session_ids)
        if not ids:
            return Renewal()
        modes = ["1" if sid in had else "0" for sid in ids]
        flags = self._hold(keys=[k for sid in ids for k in self._lease_keys(sid)], args=[holder, _ms(lease_s), *modes])
        held, asked = flags[0::2], flags[1::2]
        return Renewal(lost=tuple(sid for sid, h in zip(ids, held) if not h),
                       wanted=tuple(sid for sid, h, a in zip(ids, held, asked) if h and a))

    def claim(self, session_id: str, holder: str, lease_s: float) -> bool:
        return bool(self._claim(keys=list(self._lease_keys(session_id)), args=[holder, _ms(lease_s)]))

    def ask(self, session_id: str, asker: str, wait_s: float) -> None:
        self._redis.set(self._lease_keys(session_id)[1], asker, px=_ms(wait_s))

    def withdraw(self, session_id: str, asker: str) -> None:
        self._release(keys=[self._lease_keys(session_id)[1]], args=[asker])

    def release(self, holder: str, session_ids: Collection[str]) -> None:
        if session_ids:
            self._release(keys=[self._lease_keys(sid)[0] for sid in session_ids], args=[holder])

    def close(self) -> None:
        self._redis.close()


def _ms(seconds: float) -> int:
    return max(int(seconds * 1000), 1)


def open_store(url: str | None, ttl_s: float) -> SessionStore | None:
    """``sqlite:///path.db`` (default), ``redis://host:port/0``, or ``none``."""
    if not url or url == "none":
        return None
    if url.startswith("redis://") or url.startswith("rediss://"):
        return RedisStore(url, ttl_s)
    if url.startswith("sqlite:///"):
        return SQLiteStore(url[len("sqlite:///"):])  # sqlite:///rel.db or sqlite:////abs/path.db
    raise ValueError(f"unsupported session store {url!r}; use sqlite:///path or redis://host")
