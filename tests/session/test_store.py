"""Session stores against the real thing: SQLite on disk and a redis-server the test starts."""

from __future__ import annotations

import time


from realtime_omni.session.store import RedisStore, Renewal, SQLiteStore, change_from_snapshot, open_store, token_hash

SNAPSHOT = {"id": "sess_1", "model": "embedded", "config": {"model": "embedded", "instructions": "hi"},
            "items": [{"id": "item_1", "type": "message", "role": "user", "content": [{"type": "input_text", "text": "hello"}]}],
            "last_seq": 7}


def exercise(store) -> None:
    digest = token_hash("secret-token")
    store.save("sess_1", digest, {**SNAPSHOT, "token_digest": digest})
    loaded = store.load(digest, max_age_s=60)
    assert loaded["items"][0]["content"][0]["text"] == "hello" and loaded["last_seq"] == 7
    assert store.load(token_hash("other"), max_age_s=60) is None
    assert store.load(digest, max_age_s=-1) is None  # too old
    store.save("sess_1", digest, {**SNAPSHOT, "last_seq": 9, "token_digest": digest})
    assert store.load(digest, max_age_s=60)["last_seq"] == 9
    store.delete("sess_1")
    assert store.load(digest, max_age_s=60) is None


def test_sqlite_store_round_trip_in_wal_mode(tmp_path):
    store = open_store(f"sqlite:///{tmp_path}/s.db", 60)
    assert isinstance(store, SQLiteStore)
    assert store._db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    exercise(store)
    store.close()


def test_sqlite_store_survives_reopening(tmp_path):
    path = tmp_path / "s.db"
    first = SQLiteStore(path)
    first.save("sess_1", token_hash("t"), SNAPSHOT)
    first.close()
    second = SQLiteStore(path)
    assert second.load(token_hash("t"), 60)["id"] == "sess_1"
    second.close()


def test_redis_store_round_trip(redis_url):
    store = open_store(redis_url, 60)
    assert isinstance(store, RedisStore)
    exercise(store)
    store.close()


def test_redis_keys_expire(redis_url):
    store = RedisStore(redis_url, ttl_s=1)
    store.save("sess_2", token_hash("t2"), SNAPSHOT)
    assert store.load(token_hash("t2"), 60) is not None
    time.sleep(1.5)
    assert store.load(token_hash("t2"), 60) is None
    store.close()


def test_the_store_file_is_private(tmp_path):
    """Stored conversations are readable by the server's user only (was 0644)."""
    import os
    import stat

    from realtime_omni.session.store import SQLiteStore

    path = tmp_path / "sessions.db"
    store = SQLiteStore(path)
    store.save("sess_1", "digest", {"items": ["hello"]})
    for name in os.listdir(tmp_path):
        mode = stat.S_IMODE(os.stat(tmp_path / name).st_mode)
        assert mode & 0o077 == 0, (name, oct(mode))


def test_whole_snapshot_rows_of_earlier_versions_are_migrated(tmp_path):
    import json
    import sqlite3

    path = tmp_path / "old.db"
    with sqlite3.connect(path) as db:  # the schema before incremental writes
        db.execute("CREATE TABLE sessions (id TEXT PRIMARY KEY, token TEXT UNIQUE NOT NULL, updated REAL NOT NULL,"
                   " snapshot TEXT NOT NULL)")
        db.execute("INSERT INTO sessions VALUES (?, ?, ?, ?)", ("sess_1", token_hash("t"), time.time(), json.dumps(SNAPSHOT)))
    store = SQLiteStore(path)
    loaded = store.load(token_hash("t"), 60)
    assert loaded["items"] == SNAPSHOT["items"] and loaded["last_seq"] == 7
    assert store._db.execute("SELECT name FROM sqlite_master WHERE name = 'sessions'").fetchone() is None
    store.close()


def test_incremental_changes_upsert_and_remove_single_items(tmp_path):
    from realtime_omni.session.store import StoreChange

    store = SQLiteStore(tmp_path / "s.db")
    digest = token_hash("t")
    item = {"id": "a", "content": [{"type": "input_text", "text": "one"}]}
    store.apply([StoreChange("s", digest, {"id": "s", "order": ["a", "b"], "last_seq": 3},
                             {"a": item, "b": {**item, "id": "b"}})], [])
    store.apply([StoreChange("s", digest, {"id": "s", "order": ["b"], "last_seq": 5}, {}, ["a"])], [])
    loaded = store.load(digest, 60)
    assert [i["id"] for i in loaded["items"]] == ["b"] and loaded["last_seq"] == 5
    store.apply([], ["s"])
    assert store.load(digest, 60) is None
    assert store._db.execute("SELECT COUNT(*) FROM session_items").fetchone()[0] == 0
    store.close()


def test_a_redis_lease_has_one_holder_which_lets_go_when_asked(redis_url):
    first, second = RedisStore(redis_url, ttl_s=60), RedisStore(redis_url, ttl_s=60)
    assert first.shared and not SQLiteStore.shared
    renewal = first.hold("A", ["sess_1", "sess_2"], lease_s=5)
    assert renewal.lost == () and renewal.wanted == ()
    assert not second.claim("sess_1", "B", lease_s=5)  # held by A
    assert second.claim("sess_3", "B", lease_s=5)  # nobody's
    second.ask("sess_1", "B", wait_s=5)
    renewal = first.hold("A", ["sess_1", "sess_2", "sess_3"], lease_s=5)
    assert renewal.wanted == ("sess_1",) and renewal.lost == ("sess_3",)
    second.release("B", ["sess_1"])  # not B's: left alone
    assert not second.claim("sess_1", "B", lease_s=5)
    first.release("A", ["sess_1"])
    assert second.claim("sess_1", "B", lease_s=5)
    # the request was answered by the claim: A, holding sess_2 still, is asked for nothing
    assert first.hold("A", ["sess_2"], lease_s=5) == Renewal()
    assert first.hold("A", ["sess_1"], lease_s=5).lost == ("sess_1",)
    first.close()
    second.close()


def test_a_dead_holders_redis_lease_lapses(redis_url):
    first, second = RedisStore(redis_url, ttl_s=60), RedisStore(redis_url, ttl_s=60)
    first.hold("A", ["sess_1"], lease_s=1.0)
    assert not second.claim("sess_1", "B", lease_s=5)
    deadline = time.monotonic() + 5  # A renews no more (it died): its lease lapses after 1 s
    while not second.claim("sess_1", "B", lease_s=5):
        assert time.monotonic() < deadline, "the dead holder's lease did not lapse"
        time.sleep(0.05)
    first.close()
    second.close()


def test_writes_to_a_shared_store_touch_only_the_sessions_their_process_holds(redis_url):
    a, b = RedisStore(redis_url, ttl_s=60), RedisStore(redis_url, ttl_s=60)
    mine, theirs, nobodys = (change_from_snapshot(sid, token_hash(sid), {**SNAPSHOT, "id": sid})
                             for sid in ("sess_a", "sess_b", "sess_n"))
    a.hold("A", ["sess_a"], lease_s=5)
    b.hold("B", ["sess_b"], lease_s=5)
    assert b.apply([theirs], [], holder="B") == []
    before = b.load(token_hash("sess_b"), 60)
    # A stalled past its lease on sess_b (B serves it now): A's write and delete leave it alone
    assert a.apply([mine, theirs, nobodys], [], holder="A") == ["sess_b"]
    assert a.apply([], ["sess_b"], holder="A") == ["sess_b"]
    assert b.load(token_hash("sess_b"), 60) == before
    assert a.load(token_hash("sess_a"), 60) is not None and a.load(token_hash("sess_n"), 60) is not None
    # its own session A deletes, token and all
    assert a.apply([], ["sess_a"], holder="A") == []
    assert a.load(token_hash("sess_a"), 60) is None
    a.close()
    b.close()


def test_a_taker_that_gives_up_takes_its_request_back(redis_url):
    store = RedisStore(redis_url, ttl_s=60)
    store.hold("A", ["sess_1"], lease_s=5)
    store.ask("sess_1", "B", wait_s=5)
    store.withdraw("sess_1", "C")  # not C's request: it stays
    assert store.hold("A", ["sess_1"], lease_s=5).wanted == ("sess_1",)
    store.withdraw("sess_1", "B")
    assert store.hold("A", ["sess_1"], lease_s=5) == Renewal()
    store.close()


def test_a_store_of_one_process_holds_nothing(tmp_path):
    store = SQLiteStore(tmp_path / "s.db")
    assert store.claim("sess_1", "A", 5) and store.claim("sess_1", "B", 5)
    assert store.hold("A", ["sess_1"], 5) == Renewal()
    store.close()


def test_a_lapsed_lease_is_lost_not_taken_again(redis_url):
    """A process cut off from Redis past its lease, meanwhile another took the session, served it,
    ended it and let it go: the first one's renewal must not take it back (its copy would write
    the ended session's row again); a session new to it is taken."""
    a, b = RedisStore(redis_url, ttl_s=60), RedisStore(redis_url, ttl_s=60)
    a.hold("A", ["sess_1"], lease_s=1.0)
    deadline = time.monotonic() + 5
    while not b.claim("sess_1", "B", lease_s=5):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    b.release("B", ["sess_1"])
    assert a.hold("A", ["sess_1", "sess_2"], lease_s=5, had=["sess_1"]).lost == ("sess_1",)
    assert not b.claim("sess_2", "B", lease_s=5)  # sess_2, new to A, is A's
    a.close()
    b.close()
