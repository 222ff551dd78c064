"""Several processes opening one new SQLite database at once — `gieok serve --workers 2` warming a
tenant whose file does not exist yet: each must find the schema made, once, by whichever was first."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import pytest

from gieok.store.sqlite import SQLiteStore
from gieok.store.sqlite.store import SCHEMA_VERSION


def open_at_once(path: Path, openers: int) -> tuple[list[SQLiteStore], list[BaseException]]:
    """`openers` threads, each with its own connection, open `path` together: they race exactly as
    processes do, since SQLite's locks are the file's."""
    start = threading.Barrier(openers)
    stores: list[SQLiteStore] = []
    errors: list[BaseException] = []

    def open_it() -> None:
        start.wait()
        try:
            stores.append(SQLiteStore(path))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=open_it) for _ in range(openers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return stores, errors


def test_many_openers_of_one_new_file_all_open_it(tmp_path: Path) -> None:
    for round_ in range(6):
        stores, errors = open_at_once(tmp_path / f"tenant-{round_}.db", 6)
        assert errors == []
        assert {store.schema_version() for store in stores} == {SCHEMA_VERSION}
        assert [store.get_meta("created_at") is not None for store in stores] == [True] * 6
        for store in stores:
            store.close()


def test_a_stale_version_read_before_the_write_lock_migrates_nothing_twice(tmp_path: Path) -> None:
    path = tmp_path / "made.db"
    SQLiteStore(path).close()
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        SQLiteStore._migrate(conn, 0)  # what a second opener does when it read version 0 before the first committed
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        assert conn.execute("SELECT count(*) FROM meta WHERE key = 'created_at'").fetchone()[0] == 1
    finally:
        conn.close()


@pytest.mark.parametrize("journal", ["wal", "delete"])
def test_an_empty_database_file_is_initialised_not_refused(tmp_path: Path, journal: str) -> None:
    # What a second opener sees between the first's `journal_mode = WAL` and its schema's commit.
    path = tmp_path / "empty.db"
    with sqlite3.connect(path) as conn:
        conn.execute(f"PRAGMA journal_mode = {journal}")
        conn.execute("VACUUM")
    conn.close()
    assert path.stat().st_size > 0
    store = SQLiteStore(path)
    try:
        assert store.schema_version() == SCHEMA_VERSION
    finally:
        store.close()


def test_a_file_another_process_keeps_locked_is_unavailable_not_corrupt(tmp_path: Path) -> None:
    """Held past the busy timeout, a lock is a reason to try again later (503 over HTTP), not a
    damaged file; and the file is as it was."""
    from gieok.errors import DatabaseUnavailableError

    path = tmp_path / "busy.db"
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("CREATE TABLE blocks (x)")
    holder.execute("PRAGMA user_version = 1")
    holder.execute("BEGIN EXCLUSIVE")
    try:
        with pytest.raises(DatabaseUnavailableError, match="locked"):
            SQLiteStore(path, busy_timeout_ms=300)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
