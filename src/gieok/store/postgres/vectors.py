"""The pgvector statements of the PostgreSQL backend, shared with `gieok bench pgindex` so the
benchmark builds and queries exactly what a deployment does.

**The index.** HNSW on inner product (`vector_ip_ops`): e5 vectors are unit length, so the
negative inner product `<#>` orders like cosine distance and costs one dot product.

**The search.** One statement per search. The query vector is one named parameter used twice
(psycopg sends it once, in pgvector's binary form); a scope filter is a bitmap of block indices
(bit i of byte i // 8, least significant first) sent as one binary `bytea` and tested with
`get_bit` on each candidate the graph walk yields, so any filter the engine's catalog can
express (scope, kinds, time range, live blocks) costs the same and needs no join.
`hnsw.iterative_scan = relaxed_order` (set per connection) keeps walking until k candidates
pass the filter; relaxed order may return near-ties out of order, so callers sort.
"""

from __future__ import annotations

__all__ = ["hnsw_index_sql", "vector_search_sql"]


def hnsw_index_sql(index: str, table: str, m: int, ef_construction: int) -> str:
    """`CREATE INDEX` of the HNSW graph over `table.vector` with these build parameters."""
    return (f"CREATE INDEX {index} ON {table} USING hnsw (vector vector_ip_ops) "
            f"WITH (m = {int(m)}, ef_construction = {int(ef_construction)})")


def vector_search_sql(table: str, *, filtered: bool) -> str:
    """Top-k (block_index, cosine) of `table` for a unit query vector. Named parameters:
    `query` (a float32 vector), `last` (no block past it), `k`, and with `filtered` `allowed`
    (the bitmap, covering every index up to `last`: the test on `last` comes first)."""
    where = "block_index <= %(last)s"
    if filtered:
        where += " AND get_bit(%(allowed)s::bytea, block_index::int) = 1"
    return (f"SELECT block_index, -(vector <#> %(query)s) FROM {table} WHERE {where} "
            "ORDER BY vector <#> %(query)s LIMIT %(k)s")
