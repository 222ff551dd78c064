"""Packed postings: each term's postings as a few rows of byte strings, for BM25 at a million blocks.

A search of the database index (`pg_index = "database"`) must score every posting of its terms.
Read as rows of `postings` that cost ~0.6 us a posting (an index-only scan); a frequent term has
~5,000 postings per 100k blocks, so an unscoped search at a million blocks read ~25,000–50,000
of them: 15–30 ms before anything else. Here a term's postings up to `bm25_stats.packed_upto`
are also kept in `posting_packs`: block indices (int8), term frequencies and block lengths
(int4), each as one big-endian byte string (`int8send`/`int4send`, stored uncompressed), read in a
few rows and decoded by numpy. Postings of later blocks (the tail) are read as rows and packed
in the same statement, so one snapshot sees packs and tail together.

The rows of `postings` stay the durable copy; packs are derived from them and rebuilt from them:
- after appends, once the tail holds `PACK_EVERY` blocks, it is packed (one new pack per term it
  touches) and `packed_upto` moves — in a transaction of its own, after the append committed;
- a term with more than `MAX_PACKS` packs has them merged into one (a frequent term's whole list is
  rewritten every `PACK_EVERY × MAX_PACKS` blocks: simple, and at a million blocks ~1 GB written
  over the whole fill; merging only the small packs would write less — not needed yet);
- forgetting a block rebuilds the packs of its terms from the remaining rows (forget is rare);
- re-tokenizing drops every pack (`packed_upto` = 0): the next packing rebuilds them.
Each of these takes the schema's `:packs` advisory lock, so two processes never pack the same
blocks twice.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..sql import SqlWriter

__all__ = ["PACK_EVERY", "MAX_PACKS", "READ_PACKS", "lock_packs", "pack_tail", "repack_terms", "drop_packs",
           "decode_postings"]

PACK_EVERY = 4096  # blocks past packed_upto before they are packed
MAX_PACKS = 8  # packs a term may have before they are merged into one

_AGGREGATES = ("count(*)::int, string_agg(int8send(block_index), ''::bytea ORDER BY block_index), "
               "string_agg(int4send(tf), ''::bytea ORDER BY block_index), "
               "string_agg(int4send(length), ''::bytea ORDER BY block_index)")
_COLUMNS = "term, first_block, last_block, postings, blocks, tfs, lengths"

# The query terms' packs and, packed on the fly, their postings after packed_upto: one statement,
# one snapshot. Parameters: the terms (a list), twice.
READ_PACKS = (
    "SELECT term, postings, blocks, tfs, lengths FROM posting_packs WHERE term = ANY(?) "
    f"UNION ALL SELECT term, {_AGGREGATES} FROM postings "
    "WHERE term = ANY(?) AND block_index > (SELECT packed_upto FROM bm25_stats) GROUP BY term"
)


def lock_packs(tx: SqlWriter) -> int:
    """Take the schema's packing lock for this transaction; returns `packed_upto`."""
    tx.execute("SELECT pg_advisory_xact_lock(hashtext(current_schema() || ':packs'))")
    row = tx.execute("SELECT packed_upto FROM bm25_stats").fetchone()
    return int(row[0]) if row else 0


def pack_tail(tx: SqlWriter, minimum: int) -> int:
    """Pack the postings of blocks after `packed_upto` if at least `minimum` blocks are there;
    returns how many blocks were packed (0: not due)."""
    upto = lock_packs(tx)
    row = tx.execute("SELECT coalesce(max(block_index), 0) FROM blocks").fetchone()
    last = int(row[0]) if row else 0
    if last - upto < max(1, minimum):
        return 0
    touched = [str(r[0]) for r in tx.execute(
        f"INSERT INTO posting_packs({_COLUMNS}) SELECT term, min(block_index), max(block_index), {_AGGREGATES} "
        "FROM postings WHERE block_index > ? AND block_index <= ? GROUP BY term RETURNING term",
        (upto, last)).fetchall()]
    if touched:
        tx.execute(
            "WITH many AS (SELECT term FROM posting_packs WHERE term = ANY(?) GROUP BY term HAVING count(*) > ?), "
            "gone AS (DELETE FROM posting_packs p USING many WHERE p.term = many.term RETURNING p.*) "
            f"INSERT INTO posting_packs({_COLUMNS}) SELECT term, min(first_block), max(last_block), "
            "sum(postings)::int, string_agg(blocks, ''::bytea ORDER BY first_block), "
            "string_agg(tfs, ''::bytea ORDER BY first_block), string_agg(lengths, ''::bytea ORDER BY first_block) "
            "FROM gone GROUP BY term", (touched, MAX_PACKS))
    tx.execute("UPDATE bm25_stats SET packed_upto = ?", (last,))
    return last - upto


def repack_terms(tx: SqlWriter, terms: Sequence[str], upto: int) -> None:
    """Rebuild the packs of `terms` from their rows up to `upto` (after rows were deleted);
    the caller holds the packing lock (`lock_packs`)."""
    if not terms or upto <= 0:
        return
    unique = sorted(set(terms))
    tx.execute("DELETE FROM posting_packs WHERE term = ANY(?)", (unique,))
    tx.execute(f"INSERT INTO posting_packs({_COLUMNS}) SELECT term, min(block_index), max(block_index), {_AGGREGATES} "
               "FROM postings WHERE term = ANY(?) AND block_index <= ? GROUP BY term", (unique, upto))


def drop_packs(tx: SqlWriter) -> None:
    """Forget every pack (the rows changed wholesale); the next `pack_tail` rebuilds them."""
    lock_packs(tx)
    tx.execute("DELETE FROM posting_packs")
    tx.execute("UPDATE bm25_stats SET packed_upto = 0")


def decode_postings(rows: Sequence[tuple[Any, ...]]) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """`READ_PACKS`' rows as term -> (block indices int64, term frequencies float32, lengths
    float32), each term's packs joined (a term's packs never overlap; their order does not
    matter to a sum over blocks)."""
    parts: dict[str, list[tuple[bytes, bytes, bytes]]] = {}
    for term, _count, blocks, tfs, lengths in rows:
        parts.setdefault(str(term), []).append((bytes(blocks), bytes(tfs), bytes(lengths)))
    out = {}
    for term, packs in parts.items():
        out[term] = (np.frombuffer(b"".join(p[0] for p in packs), dtype=">i8").astype(np.int64),
                     np.frombuffer(b"".join(p[1] for p in packs), dtype=">i4").astype(np.float32),
                     np.frombuffer(b"".join(p[2] for p in packs), dtype=">i4").astype(np.float32))
    return out

