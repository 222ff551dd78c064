"""Removing a memory from a PostgreSQL database: its schema and everything in it (benchmarks
recreate theirs; `remove_memory_files` is the SQLite counterpart)."""

from __future__ import annotations

import psycopg
from psycopg import sql as pgsql

from ..urls import display_url, split_url
from .session import translate

__all__ = ["drop_memory"]


def drop_memory(url: str) -> None:
    """Drop the schema of the memory at `url` (no error when there is none)."""
    conninfo, schema = split_url(url)
    try:
        with psycopg.connect(conninfo, autocommit=True) as conn:
            conn.execute(pgsql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(pgsql.Identifier(schema)))
    except psycopg.Error as exc:
        raise translate(exc, display_url(url)) from None
