"""Persistence of session settings and conversation items, so a session outlives its server.

A snapshot is one JSON document per session: the effective config, the conversation items in
order (text and transcripts; raw audio is not stored), the last sequence number and a hash of
the resume token (the token itself is never stored). SQLite (WAL) is the default; Redis serves
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
from pathlib import Path
from typing import Any


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class SessionStore(abc.ABC):
    @abc.abstractmethod
    def save(self, session_id: str, token_digest: str, snapshot: dict[str, Any]) -> None: ...

    @abc.abstractmethod
    def load(self, token_digest: str, max_age_s: float) -> dict[str, Any] | None:
        """The snapshot for a token if it was saved less than ``max_age_s`` ago."""

    @abc.abstractmethod
    def delete(self, session_id: str) -> None: ...

    def purge(self, max_age_s: float) -> int:
        """Remove what was last saved more than ``max_age_s`` ago; how many sessions went."""
        return 0

    def close(self) -> None:
        pass


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
                "CREATE TABLE IF NOT EXISTS sessions (id TEXT PRIMARY KEY, token TEXT UNIQUE NOT NULL,"
                " updated REAL NOT NULL, snapshot TEXT NOT NULL)"
            )

    def save(self, session_id: str, token_digest: str, snapshot: dict[str, Any]) -> None:
        with self._lock:
            self._db.execute(
                "INSERT INTO sessions (id, token, updated, snapshot) VALUES (?, ?, ?, ?)"
                " ON CONFLICT(id) DO UPDATE SET token=excluded.token, updated=excluded.updated, snapshot=excluded.snapshot",
                (session_id, token_digest, time.time(), json.dumps(snapshot)),
            )

    def load(self, token_digest: str, max_age_s: float) -> dict[str, Any] | None:
        with self._lock:
            row = self._db.execute(
                "SELECT snapshot FROM sessions WHERE token = ? AND updated >= ?", (token_digest, time.time() - max_age_s)
            ).fetchone()
        return json.loads(row[0]) if row else None

    def delete(self, session_id: str) -> None:
        with self._lock:
            self._db.execute("DELETE FROM sessions WHERE id = ?", (session_id,))

    def purge(self, max_age_s: float) -> int:
        with self._lock:
            return self._db.execute("DELETE FROM sessions WHERE updated < ?", (time.time() - max_age_s,)).rowcount

    def close(self) -> None:
        with self._lock:
            self._db.close()


class RedisStore(SessionStore):
    """Shared by replicas; keys expire on their own after ``ttl_s`` (so ``purge`` has nothing to do)."""

    def __init__(self, url: str, ttl_s: float = 3600.0, prefix: str = "realtime_omni") -> None:
        import redis  # optional dependency

        self._redis = redis.Redis.from_url(url)
        self._redis.ping()
        self.ttl_s = int(ttl_s)
        self.prefix = prefix

    def save(self, session_id: str, token_digest: str, snapshot: dict[str, Any]) -> None:
        doc = json.dumps({"saved": time.time(), "snapshot": snapshot})
        pipe = self._redis.pipeline()
        pipe.set(f"{self.prefix}:session:{session_id}", doc, ex=self.ttl_s)
        pipe.set(f"{self.prefix}:token:{token_digest}", session_id, ex=self.ttl_s)
        pipe.execute()

    def load(self, token_digest: str, max_age_s: float) -> dict[str, Any] | None:
        session_id = self._redis.get(f"{self.prefix}:token:{token_digest}")
        if session_id is None:
            return None
        doc = self._redis.get(f"{self.prefix}:session:{session_id.decode()}")
        if doc is None:
            return None
        data = json.loads(doc)
        return data["snapshot"] if time.time() - data["saved"] <= max_age_s else None

    def delete(self, session_id: str) -> None:
        doc = self._redis.get(f"{self.prefix}:session:{session_id}")
        keys = [f"{self.prefix}:session:{session_id}"]
        if doc is not None:
            token = json.loads(doc)["snapshot"].get("token_digest")
            if token:
                keys.append(f"{self.prefix}:token:{token}")
        self._redis.delete(*keys)

    def close(self) -> None:
        self._redis.close()


def open_store(url: str | None, ttl_s: float) -> SessionStore | None:
    """``sqlite:///path.db`` (default), ``redis://host:port/0``, or ``none``."""
    if not url or url == "none":
        return None
    if url.startswith("redis://") or url.startswith("rediss://"):
        return RedisStore(url, ttl_s)
    if url.startswith("sqlite:///"):
        return SQLiteStore(url[len("sqlite:///"):])  # sqlite:///rel.db or sqlite:////abs/path.db
    raise ValueError(f"unsupported session store {url!r}; use sqlite:///path or redis://host")
