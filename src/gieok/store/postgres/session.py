"""Connections to one gieok schema of a PostgreSQL database: a psycopg 3 pool, the `SqlSession`
the portable tables use (`?` placeholders translated to psycopg's `%s`), and the translation of
driver errors into gieok's `StoreError` family.

Every pooled connection runs in autocommit with `search_path` set to the gieok schema (then the
schema holding pgvector), and with `hnsw.iterative_scan = relaxed_order`: a filtered vector search
keeps walking the HNSW graph until it has its k rows instead of stopping at `ef_search` candidates
and filtering them away (pgvector 0.8). Transactions are explicit (`transaction()`).
"""

from __future__ import annotations

import functools
import os
import threading
import time
import weakref
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg import sql as pgsql
from psycopg.adapt import AdaptersMap
from psycopg.types import TypeInfo
from psycopg_pool import ConnectionPool, PoolTimeout

from ...callbacks import weakly
from ...errors import (
    CorruptDatabaseError,
    DatabaseUnavailableError,
    DatabaseUnwritableError,
    StoreError,
)
from ..sql import SqlCursor, SqlWriter

__all__ = ["PgSession", "translate"]

PROBE_CONNECT_S = 2  # how long a look at whether the server is back may wait for it
PROBE_EVERY_S = 0.5  # while it is away, how often a request looks
QUICK_WAIT_S = 2.0  # a pool with no connection to lend after this is looked into (busy, or server away)
CHECK_IDLE_S = 1.0  # a pooled connection idle this long is tested before it is lent (PgSession._check)

_VECTOR_TYPES = ("vector", "bit", "halfvec", "sparsevec")
_vector_adapters: dict[tuple[str, str], AdaptersMap] = {}
_vector_adapters_lock = threading.Lock()


def vector_adapters(conninfo: str, extension_schema: str, timeout_s: float) -> AdaptersMap:
    """psycopg's adapters with pgvector's types, made once per database and process: every pooled
    connection copies them (`context=`). pgvector's `register_vector(conn)` looks the types up (four
    queries) and makes eight new dumper classes on *every* connection, which nothing frees: a worker
    opening one tenant after another grew by ~45 KB a tenant (`bench pgstateless --tenants`)."""
    key = (conninfo, extension_schema)
    with _vector_adapters_lock:
        found = _vector_adapters.get(key)
        if found is not None:
            return found
        from pgvector.psycopg.bit import register_bit_info
        from pgvector.psycopg.halfvec import register_halfvec_info
        from pgvector.psycopg.sparsevec import register_sparsevec_info
        from pgvector.psycopg.vector import register_vector_info

        with psycopg.connect(conninfo, autocommit=True, connect_timeout=max(1, int(timeout_s))) as conn:
            conn.execute(pgsql.SQL("SET search_path TO {}").format(pgsql.Identifier(extension_schema)))
            infos = {name: TypeInfo.fetch(conn, name) for name in _VECTOR_TYPES}
        adapters = AdaptersMap(psycopg.adapters)
        register_vector_info(adapters, infos["vector"])  # type: ignore[arg-type]  # an AdaptContext will do
        register_bit_info(adapters, infos["bit"])  # type: ignore[arg-type]
        if infos["halfvec"] is not None:
            register_halfvec_info(adapters, infos["halfvec"])  # type: ignore[arg-type]
        if infos["sparsevec"] is not None:
            register_sparsevec_info(adapters, infos["sparsevec"])  # type: ignore[arg-type]
        _vector_adapters[key] = adapters
        return adapters


def translate(exc: BaseException, where: str) -> StoreError:
    """A driver error as the gieok error a caller can act on."""
    message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if isinstance(exc, (psycopg.OperationalError, PoolTimeout)):
        return DatabaseUnavailableError(f"{where}: {message}")
    if isinstance(exc, (psycopg.errors.InsufficientPrivilege, psycopg.errors.ReadOnlySqlTransaction)):
        return DatabaseUnwritableError(f"cannot write {where}: {message}")
    if isinstance(exc, psycopg.errors.DataCorrupted):
        return CorruptDatabaseError(f"{where} is damaged: {message}")
    return StoreError(f"{where}: {message}")


@functools.lru_cache(maxsize=512)
def _psycopg_sql(portable: str) -> str:
    return portable.replace("%", "%%").replace("?", "%s")


class _Writer:
    """`SqlWriter` over a psycopg connection inside a transaction."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn = conn

    def execute(self, sql: str, params: Sequence[Any] = (), /) -> SqlCursor:
        return self.conn.execute(_psycopg_sql(sql), params)

    def executemany(self, sql: str, params: Iterable[Sequence[Any]], /) -> object:
        rows = list(params)
        if rows:
            with self.conn.cursor() as cursor:
                cursor.executemany(_psycopg_sql(sql), rows)
        return None


class PgSession:
    """The pool of one store. `connection()` lends a configured connection; `fetch` and
    `transaction` are the `SqlSession` of the portable tables."""

    def __init__(self, conninfo: str, schema: str, extension_schema: str, *, where: str, timeout_s: float,
                 ef_search: int, max_size: int = 8) -> None:
        self.where = where
        self.schema = schema
        search_path = pgsql.SQL("SET search_path TO {}, {}").format(pgsql.Identifier(schema),
                                                                    pgsql.Identifier(extension_schema))

        def configure(conn: psycopg.Connection[Any]) -> None:
            conn.execute(search_path)
            conn.execute("SET hnsw.iterative_scan = relaxed_order")
            conn.execute(pgsql.SQL("SET hnsw.ef_search = {}").format(pgsql.Literal(int(ef_search))))

        try:
            context = vector_adapters(conninfo, extension_schema, timeout_s)
        except psycopg.Error as exc:
            raise translate(exc, where) from None
        options: dict[str, Any] = {"autocommit": True, "context": context}
        if "application_name" not in conninfo:  # which process a connection is (pg_stat_activity), unless the URL says
            options["application_name"] = f"gieok:{os.getpid()}"
        self._conninfo = conninfo
        self._options = options
        self._configure = configure
        self._timeout_s = max(1.0, timeout_s)
        self._max_size = max_size
        self._away_since: float | None = None  # the server was last found away (a restart, a crash)
        self._last_probe = 0.0
        self._probe_lock = threading.Lock()
        self._returned: weakref.WeakKeyDictionary[psycopg.Connection[Any], float] = weakref.WeakKeyDictionary()
        self._pool = self._new_pool()
        try:
            self._pool.open(wait=True, timeout=self._timeout_s)
        except (psycopg.Error, PoolTimeout) as exc:
            self._pool.close()
            raise translate(exc, where) from None

    def _new_pool(self) -> ConnectionPool:
        return ConnectionPool(self._conninfo, min_size=1, max_size=self._max_size, kwargs=self._options,
                              configure=self._configure, timeout=self._timeout_s, open=False,
                              name=f"gieok-{self.schema}", check=weakly(self._check))  # no cycle: gieok/callbacks.py

    def _check(self, conn: psycopg.Connection[Any]) -> None:
        """Before a pooled connection is lent: one idle for `CHECK_IDLE_S` or more is tested (an
        empty query), so one the server closed meanwhile — a PostgreSQL restart,
        pg_terminate_backend — is replaced with a new one instead of failing the request that drew
        it. One given back less than that ago is lent as it is: a server cannot stop and start
        again in that time, and the test was a round trip before every statement (five a search)."""
        returned = self._returned.get(conn)
        if returned is None or time.monotonic() - returned >= CHECK_IDLE_S:
            ConnectionPool.check_connection(conn)

    def close(self) -> None:
        self._pool.close()

    def _reachable(self) -> bool:
        """One plain connection, at once: is the server there?"""
        try:
            psycopg.connect(self._conninfo, connect_timeout=PROBE_CONNECT_S, **self._options).close()
        except psycopg.Error:
            return False
        return True

    def _away(self) -> None:
        """The pool could not lend a connection (or one broke): a server that is away is said at
        once for as long as it stays away — a 503 now, not after the pool's whole wait for every
        request — and the moment it answers again the pool is replaced by a new one, which
        connects at once (the old one would wait out its reconnection backoff, which grows to
        minutes over a long outage). A pool that is only busy stays as it is."""
        with self._probe_lock:
            self._last_probe = time.monotonic()
            if self._reachable():
                if self._away_since is not None or self._pool.get_stats().get("pool_size", 0) == 0:
                    self._replace_pool()
                return
            if self._away_since is None:
                self._away_since = time.monotonic()

    def _replace_pool(self) -> None:
        old, self._pool = self._pool, self._new_pool()
        self._pool.open(wait=False)
        self._away_since = None
        threading.Thread(target=old.close, kwargs={"timeout": 5.0}, name="gieok-old-pool", daemon=True).start()

    def _check_back(self) -> None:
        """While the server is away: fail at once, and look again at most every PROBE_EVERY_S."""
        if self._away_since is None:
            return
        with self._probe_lock:
            if self._away_since is None:
                return
            if time.monotonic() - self._last_probe >= PROBE_EVERY_S:
                self._last_probe = time.monotonic()
                if self._reachable():
                    self._replace_pool()
                    return
            away = time.monotonic() - self._away_since
        raise DatabaseUnavailableError(f"{self.where}: the database server is not answering (for {away:.1f} s)")

    def _lend(self) -> tuple[ConnectionPool, psycopg.Connection[Any]]:
        """A connection from the pool. A short wait first: a pool that has none to lend after it
        is either busy (then wait the rest of the timeout) or cut off from a server that is away
        (then say so now)."""
        pool = self._pool
        quick = min(self._timeout_s, QUICK_WAIT_S)
        try:
            return pool, pool.getconn(timeout=quick)
        except PoolTimeout:
            if self._timeout_s <= quick:
                raise
        self._away()
        self._check_back()
        pool = self._pool
        return pool, pool.getconn(timeout=self._timeout_s - quick)

    @contextmanager
    def connection(self) -> Iterator[psycopg.Connection[Any]]:
        """A pooled connection (autocommit); database errors come out as `StoreError`s."""
        self._check_back()
        try:
            pool, conn = self._lend()
        except (psycopg.Error, PoolTimeout) as exc:
            self._away()
            raise translate(exc, self.where) from None
        try:
            yield conn
        except psycopg.Error as exc:
            if isinstance(exc, psycopg.OperationalError):
                self._away()
            raise translate(exc, self.where) from None
        finally:
            self._returned[conn] = time.monotonic()
            pool.putconn(conn)

    @contextmanager
    def transaction(self) -> Iterator[SqlWriter]:
        """One transaction: committed when the block ends, rolled back on any error."""
        with self.connection() as conn, conn.transaction():
            yield _Writer(conn)

    def fetch(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        with self.connection() as conn:
            return conn.execute(_psycopg_sql(sql), params).fetchall()
