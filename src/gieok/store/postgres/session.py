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
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg import sql as pgsql
from psycopg_pool import ConnectionPool, PoolTimeout

from ...errors import (
    CorruptDatabaseError,
    DatabaseUnavailableError,
    DatabaseUnwritableError,
    StoreError,
)
from ..sql import SqlCursor, SqlWriter

__all__ = ["PgSession", "translate"]

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
            from pgvector.psycopg import register_vector

            conn.execute(search_path)
            conn.execute("SET hnsw.iterative_scan = relaxed_order")
            conn.execute(pgsql.SQL("SET hnsw.ef_search = {}").format(pgsql.Literal(int(ef_search))))
            register_vector(conn)

        options: dict[str, Any] = {"autocommit": True}
        if "application_name" not in conninfo:  # which process a connection is (pg_stat_activity), unless the URL says
            options["application_name"] = f"gieok:{os.getpid()}"
        # `check`: a pooled connection is tested (an empty query) before it is lent, so one the
        # server closed — a PostgreSQL restart, pg_terminate_backend — is replaced with a new one
        # instead of failing the request that drew it: after a restart the pool reconnects by itself.
        self._pool = ConnectionPool(conninfo, min_size=1, max_size=max_size, kwargs=options,
                                    configure=configure, timeout=max(1.0, timeout_s), open=False,
                                    name=f"gieok-{schema}", check=ConnectionPool.check_connection)
        try:
            self._pool.open(wait=True, timeout=max(1.0, timeout_s))
        except (psycopg.Error, PoolTimeout) as exc:
            self._pool.close()
            raise translate(exc, where) from None

    def close(self) -> None:
        self._pool.close()

    @contextmanager
    def connection(self) -> Iterator[psycopg.Connection[Any]]:
        """A pooled connection (autocommit); database errors come out as `StoreError`s."""
        try:
            with self._pool.connection() as conn:
                yield conn
        except (psycopg.Error, PoolTimeout) as exc:
            raise translate(exc, self.where) from None

    @contextmanager
    def transaction(self) -> Iterator[SqlWriter]:
        """One transaction: committed when the block ends, rolled back on any error."""
        with self.connection() as conn, conn.transaction():
            yield _Writer(conn)

    def fetch(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        with self.connection() as conn:
            return conn.execute(_psycopg_sql(sql), params).fetchall()
