"""The `WHERE` conditions of a search's filters on `blocks`, shared by the store's listings and
BM25 and by the database search index."""

from __future__ import annotations

from typing import Any

from ..base import BM25Filter

__all__ = ["filter_sql", "is_filtered"]


def filter_sql(filt: BM25Filter, prefix: str) -> tuple[list[str], list[Any]]:
    conditions: list[str] = []
    params: list[Any] = []
    for column, value in (("guild", filt.scope.guild), ("channel", filt.scope.channel),
                          ("user_id", filt.scope.user)):
        if value is not None:
            conditions.append(f"{prefix}{column} = ?")
            params.append(value)
    if filt.kinds:
        conditions.append(f"{prefix}kind = ANY(?)")
        params.append(list(filt.kinds))
    if filt.since is not None:
        conditions.append(f"{prefix}event_time >= ?")
        params.append(filt.since)
    if filt.until is not None:
        conditions.append(f"{prefix}event_time <= ?")
        params.append(filt.until)
    return conditions, params


def is_filtered(filt: BM25Filter) -> bool:
    """Whether the filter narrows anything (an empty one searches the whole memory)."""
    return not (filt.scope.is_empty() and not filt.kinds and filt.since is None and filt.until is None)
