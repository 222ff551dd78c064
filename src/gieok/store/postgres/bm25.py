"""BM25 in SQL over gieok's own tokens (`postings`, each with its block's length), scored like SQLite's FTS5:
k1 = 1.2, b = 0.75, idf = ln((N - df + 0.5) / (df + 0.5)) floored at 1e-6, with N and the
average length over every live block (FTS5's whole-table statistics) and df from the postings.

The per-term statistics are `MATERIALIZED` CTEs on purpose: inlined (PostgreSQL's default for a
CTE used once), the planner evaluated each term's `count(*)` over its postings once per matching
posting instead of once per term — 2 × 1,626 counts of ~1,000 postings for a three-word query at
100k blocks, 536 ms. Forgotten blocks have no postings (forget deletes them), so `blocks` is
joined only when the search has a filter on it.
"""

from __future__ import annotations

__all__ = ["bm25_query", "K1", "B"]

K1 = 1.2
B = 0.75


def bm25_query(conditions: list[str]) -> str:
    """The query for `filters` (conditions on `blocks b`, `?` placeholders). Its parameters: the
    distinct terms (a list), then the conditions' values, then the limit."""
    blocks = ("JOIN blocks b ON b.block_index = p.block_index WHERE " + " AND ".join(conditions) + " "
              if conditions else "")
    return (
        "WITH stats AS MATERIALIZED (SELECT greatest(documents, 1)::float8 AS n, "
        "greatest(total_length::float8 / greatest(documents, 1), 1e-9) AS avgdl FROM bm25_stats), "
        "weights AS MATERIALIZED (SELECT t.term, greatest(1e-6, ln((s.n - t.df + 0.5) / (t.df + 0.5))) AS idf "
        "FROM (SELECT q.term, (SELECT count(*) FROM postings p WHERE p.term = q.term) AS df "
        "FROM unnest(?::text[]) AS q(term)) t CROSS JOIN stats s WHERE t.df > 0) "
        f"SELECT p.block_index, sum(w.idf * p.tf * {K1 + 1} / "
        f"(p.tf + {K1} * ({1 - B} + {B}::float8 * p.length / s.avgdl))) AS score "
        "FROM weights w JOIN postings p ON p.term = w.term CROSS JOIN stats s "
        f"{blocks}GROUP BY p.block_index ORDER BY score DESC, p.block_index LIMIT ?"
    )
