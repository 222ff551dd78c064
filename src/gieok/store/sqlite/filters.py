"""The filters of a search on SQLite, shared by the store's listings and BM25: the `WHERE`
conditions on `blocks` (scope columns, kinds, since / until), and the FTS5 facets — scope and kind
as opaque tokens in `blocks_fts.facets`, written with each block (`facet_tokens`) and matched by a
BM25 search's filter (`facets_match`)."""

from __future__ import annotations

import hashlib
from typing import Any

from ...types import Scope
from ..base import BM25Filter

__all__ = ["filter_sql", "time_sql", "facet_tokens", "facets_match", "quote"]


def filter_sql(filt: BM25Filter, prefix: str = "") -> tuple[list[str], list[Any]]:
    """The filter's conditions on `blocks` (`?` placeholders; columns after `prefix`, e.g. "b.")
    and their parameters: guild, channel, user, kinds, then since and until."""
    conditions: list[str] = []
    params: list[Any] = []
    for column, value in (("guild", filt.scope.guild), ("channel", filt.scope.channel),
                          ("user_id", filt.scope.user)):
        if value is not None:
            conditions.append(f"{prefix}{column} = ?")
            params.append(value)
    if filt.kinds:
        conditions.append(f"{prefix}kind IN ({', '.join('?' * len(filt.kinds))})")
        params.extend(filt.kinds)
    times, time_params = time_sql(filt, prefix)
    return conditions + times, params + time_params


def time_sql(filt: BM25Filter, prefix: str = "") -> tuple[list[str], list[Any]]:
    """The since / until conditions alone (BM25 matches scope and kinds as facets instead)."""
    conditions: list[str] = []
    params: list[Any] = []
    if filt.since is not None:
        conditions.append(f"{prefix}event_time >= ?")
        params.append(filt.since)
    if filt.until is not None:
        conditions.append(f"{prefix}event_time <= ?")
        params.append(filt.until)
    return conditions, params


def quote(token: str) -> str:
    """A token as an FTS5 string: nothing of it is read as query syntax."""
    return '"' + token.replace('"', '""') + '"'


def _facet(prefix: str, value: str) -> str:
    return prefix + hashlib.blake2b(value.encode("utf-8"), digest_size=8).hexdigest()


def facet_tokens(scope: Scope, kind: str) -> str:
    """Scope and kind as opaque FTS tokens: any id string is safe inside a MATCH expression."""
    parts = [f"k_{kind}"]
    if scope.guild is not None:
        parts.append(_facet("g_", scope.guild))
    if scope.channel is not None:
        parts.append(_facet("c_", scope.channel))
    if scope.user is not None:
        parts.append(_facet("u_", scope.user))
    return " ".join(parts)


def facets_match(filt: BM25Filter) -> str | None:
    """The FTS5 expression on `facets` that keeps the filter's scope and kinds (every scope part,
    any of the kinds), or None when it names neither."""
    facets: list[str] = []
    for prefix, value in (("g_", filt.scope.guild), ("c_", filt.scope.channel), ("u_", filt.scope.user)):
        if value is not None:
            facets.append(quote(_facet(prefix, value)))
    if filt.kinds:
        facets.append("(" + " OR ".join(quote(f"k_{k}") for k in filt.kinds) + ")")
    return "facets : (" + " AND ".join(facets) + ")" if facets else None
