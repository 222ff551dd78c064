"""The little that the portable tables need from a SQL database: read rows, and run statements
in one transaction.

The layers' tables (working memory, checkpoints, STM), the conversation tables (L1 / L2 / L3,
channel state, active channels) and the API keys are plain relational rows whose SQL is the same
on SQLite and PostgreSQL, so each is written once (`layer_tables.py`, `conversation.py`,
`keys.py`) against this port and every SQL backend implements it. Statements use `?`
placeholders; a backend whose driver wants another style translates them (`postgres/`).
The blocks are not here: their storage (FTS5 or token tables, vectors) is what differs between
backends, so each backend writes its own (`BlockStore` in `base.py`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol, runtime_checkable

__all__ = ["SqlCursor", "SqlWriter", "SqlSession", "split_sql"]


class SqlCursor(Protocol):
    """What a statement returns: its rows (for `RETURNING` and `SELECT`) and how many it changed."""

    @property
    def rowcount(self) -> int: ...

    def fetchone(self) -> Any: ...

    def fetchall(self) -> list[Any]: ...


class SqlWriter(Protocol):
    """The open transaction handed out by `SqlSession.transaction`."""

    def execute(self, sql: str, params: Sequence[Any] = (), /) -> SqlCursor: ...

    def executemany(self, sql: str, params: Iterable[Sequence[Any]], /) -> object: ...


@runtime_checkable
class SqlSession(Protocol):
    """A SQL database: `fetch` reads committed rows; `transaction()` is one atomic write (commit
    on success, rollback on any error, database errors raised as `StoreError` subclasses)."""

    def fetch(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]: ...

    def transaction(self) -> AbstractContextManager[SqlWriter]: ...


def split_sql(script: str) -> list[str]:
    """Split a migration script into statements, so a migration runs inside one transaction
    (sqlite3.executescript would commit implicitly)."""
    statements: list[str] = []
    current: list[str] = []
    for line in script.splitlines():
        before_comment = line.split("--", 1)[0]
        stripped = before_comment.rstrip() if "--" in line and "'" not in before_comment else line.rstrip()
        current.append(stripped)
        if stripped.endswith(";"):
            statement = "\n".join(current).strip()
            if statement.strip(";").strip():
                statements.append(statement)
            current = []
    tail = "\n".join(current).strip()
    if tail:
        statements.append(tail)
    return statements
