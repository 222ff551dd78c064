"""Bring a gieok schema of a PostgreSQL database to the current version, safely when several
processes open it at once: the whole check-and-migrate runs in one transaction holding a
transaction-level advisory lock, so one process migrates and the others then find it done."""

from __future__ import annotations

import time
from typing import Any

import psycopg
from psycopg import sql as pgsql

from ...errors import CorruptDatabaseError, SchemaTooNewError, StoreError
from ..sql import split_sql
from .schema import MIGRATIONS, SCHEMA_VERSION, VACUUM_AFTER

__all__ = ["migrate", "MIGRATION_LOCK"]

MIGRATION_LOCK = 0x6769_656F_6B00  # "gieok\0": one database-wide key, since CREATE EXTENSION is database-wide


def migrate(conn: psycopg.Connection[Any], schema: str, where: str) -> str:
    """Create or upgrade `schema`; returns the schema that holds pgvector (for `search_path`)."""
    rewritten: list[str] = []
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
        extension_schema = _ensure_pgvector(conn, where)
        conn.execute(pgsql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(pgsql.Identifier(schema)))
        conn.execute(pgsql.SQL("SET LOCAL search_path TO {}, {}").format(pgsql.Identifier(schema),
                                                                         pgsql.Identifier(extension_schema)))
        version = _version(conn, schema, where)
        if version > SCHEMA_VERSION:
            raise SchemaTooNewError(f"{where} has schema version {version}; this gieok understands up to "
                                    f"{SCHEMA_VERSION}. Upgrade gieok.")
        for target in range(version + 1, SCHEMA_VERSION + 1):
            for statement in split_sql(MIGRATIONS[target - 1]):
                conn.execute(statement)
            if target == 1:
                conn.execute("INSERT INTO meta(key, value) VALUES ('created_at', %s)", (str(time.time()),))
            conn.execute("INSERT INTO meta(key, value) VALUES ('schema_version', %s) ON CONFLICT (key) "
                         "DO UPDATE SET value = excluded.value", (str(target),))
            if version > 0:  # a new schema's tables are empty: nothing to vacuum
                rewritten.extend(t for t in VACUUM_AFTER.get(target, ()) if t not in rewritten)
    for table in rewritten:  # after the commit: VACUUM cannot run inside a transaction
        conn.execute(pgsql.SQL("VACUUM (ANALYZE) {}.{}").format(pgsql.Identifier(schema), pgsql.Identifier(table)))
    return extension_schema


def _ensure_pgvector(conn: psycopg.Connection[Any], where: str) -> str:
    found = conn.execute("SELECT n.nspname FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace "
                         "WHERE e.extname = 'vector'").fetchone()
    if found:
        return str(found[0])
    available = conn.execute("SELECT 1 FROM pg_available_extensions WHERE name = 'vector'").fetchone()
    if not available:
        raise StoreError(f"{where}: the server has no pgvector extension (install pgvector 0.8 or newer)")
    conn.execute("CREATE EXTENSION IF NOT EXISTS vector SCHEMA public")
    return "public"


def _version(conn: psycopg.Connection[Any], schema: str, where: str) -> int:
    tables = {r[0] for r in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = %s", (schema,))}
    if not tables:
        return 0
    if "meta" not in tables or "blocks" not in tables:
        raise CorruptDatabaseError(f"{where}: schema {schema!r} holds tables but is not a gieok memory")
    row = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    if row is None:
        raise CorruptDatabaseError(f"{where}: schema {schema!r} has no schema version")
    return int(row[0])
