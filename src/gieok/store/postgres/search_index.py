"""The `SearchIndex` answered by PostgreSQL (`pg_index = "database"`): a worker keeps no copy of
a memory's catalog, vectors or postings, so opening a memory costs a few queries and a worker
serving many tenants stays small. Ids are block indices.

What each question costs (every statement one round trip, on indexes of migrations 1 and 10):

- **Filters** (scope, kinds, time range, live) are `WHERE` conditions on `blocks`, the same ones
  `list_blocks` uses (`_filter_sql`).
- **BM25** reads the query terms' packed postings (store/postgres/packs.py), each with its
  block's token count, and scores in numpy with FTS5's formula and constants — as the engine's
  in-process BM25 (`index/bm25.py`) does: the statistics (N, average length, df) are the searched
  scope's, not the whole store's. A filtered search keeps the postings of the filter's blocks: the
  filter's member list (`_ScopeMembers`), listed once per process and extended by the blocks
  appended since — so a conversation's search reads the same packs an unscoped one does (channel
  of 14,623 blocks in 100k: 4.6 ms, where joining every posting of the terms with `blocks` took
  36 ms). A filter passing more than `SCOPE_MEMBERS_MAX` blocks keeps the join. N and the total
  length of a scope come with its members, counted again when blocks were forgotten. Scores are single
  precision, as the numpy postings' are: in double precision the many near-equal scores of
  blocks matching only a frequent term (idf at its floor) stopped being ties, and which of them
  made the candidate list changed.
- **Vectors**: pgvector. Exact (a scan of the filtered rows, no index) when the memory has fewer
  than `ann_threshold` blocks or the filter leaves at most `EXACT_SUBSET_MAX`, else the HNSW graph
  walked iteratively with the filter as an `EXISTS` on `blocks` — the same rule as the engine's
  `VectorIndex`, so both modes answer alike where the in-process one is exact.
- **Neighbours** join `blocks` to itself on (channel, position) through the unique position index.
- **Facts** the ranker reads (speaker, time, token count, script, time words) are one query per
  search for the candidates not in a bounded LRU (`cache_size` blocks): a live block's facts never
  change, so dropping the cache changes no result.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import numpy as np

from ...index.bm25 import best_first, hangul_share
from ...index.search_index import BothFound, CandidateFacts, NeighbourLinks, ScopedNeighbours
from ...index.vector import EXACT_SUBSET_MAX
from ...text.dates import mentions_time
from ..base import BM25Filter
from .bm25 import K1, B
from .filters import filter_sql, is_filtered
from .packs import READ_PACKS, decode_postings
from .session import PgSession

__all__ = ["PostgresSearchIndex"]

K = TypeVar("K")
V = TypeVar("V")

SCOPE_STATISTICS_CACHED = 256  # filters whose live-block count and total length a process keeps
SCOPES_LISTED = 64  # filters whose members (block indices) a process keeps: `_ScopeMembers`
SCOPE_MEMBERS_MAX = 400_000  # a filter passing more blocks is searched with SQL joins, not a member list
SECOND_QUESTIONS = 4  # searches of a process whose vector query may run beside its BM25 at once


class BoundedCache(Generic[K, V]):
    """A least-recently-used map of at most `size` entries (0: keeps nothing); thread-safe."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._items: OrderedDict[K, V] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._items)

    def get(self, key: K) -> V | None:
        with self._lock:
            value = self._items.get(key)
            if value is not None:
                self._items.move_to_end(key)
            return value

    def put(self, key: K, value: V) -> None:
        if self.size <= 0:
            return
        with self._lock:
            self._items[key] = value
            self._items.move_to_end(key)
            while len(self._items) > self.size:
                self._items.popitem(last=False)

    def pop(self, key: K) -> None:
        with self._lock:
            self._items.pop(key, None)

    def clear(self) -> None:
        with self._lock:
            self._items.clear()


@dataclass(frozen=True, slots=True)
class _BlockFacts:
    channel: str | None
    conv_pos: int  # -1 when none
    speaker: str | None
    event_time: float
    importance: float
    length: int
    hangul: float
    time_mention: bool


@dataclass(frozen=True, slots=True)
class _ScopeStatistics:
    documents: int  # live blocks passing the filter
    total_length: int  # their tokens
    blocks: int  # every block ever appended (the in-process index's size, forgotten ones too)
    members: np.ndarray | None = None  # the filter's blocks (sorted int32), when it passes few enough


@dataclass(slots=True)
class _ScopeMembers:
    """The blocks a filter passes, kept per process and brought up to date by what changed, not
    listed again: a block's scope, kind and time never change and block indices are appended in
    order (one append at a time: the chain's lock), so the blocks past `covered` are all a
    change can add. A block forgotten since stays listed — harmless, it has no postings and no
    vector left — but the live count and length are counted again when blocks were forgotten."""

    members: np.ndarray  # sorted int32 block indices, live when listed
    covered: int  # the highest block index looked at
    documents: int
    total_length: int
    forgotten: int  # the store's forgotten blocks when `documents` was counted
    too_many: bool = False  # passes more than SCOPE_MEMBERS_MAX: no list kept


def _filter_key(filt: BM25Filter) -> tuple[Any, ...]:
    return (filt.scope.guild, filt.scope.channel, filt.scope.user, tuple(sorted(filt.kinds)), filt.since, filt.until)


_EMPTY = (np.empty(0, dtype=np.int64), np.empty(0, dtype=np.float64))


class _DatabaseScope:
    """One search's filters: BM25, nearest vectors and the filter test, in SQL."""

    def __init__(self, index: PostgresSearchIndex, filt: BM25Filter) -> None:
        self.index = index
        self.filt = filt
        self.filtered = is_filtered(filt)
        conditions, self.params = filter_sql(filt, "b.")
        self.conditions = ["b.forgotten_at IS NULL", *conditions]
        self._statistics: _ScopeStatistics | None = None

    def statistics(self) -> _ScopeStatistics:
        if self._statistics is None:
            self._statistics = self.index.scope_statistics(self.filt, self.conditions, self.params)
        return self._statistics

    def bm25(self, tokens: list[str], limit: int) -> tuple[np.ndarray, np.ndarray]:
        terms = [t for t in dict.fromkeys(tokens) if t]
        if not terms or limit <= 0:
            return _EMPTY
        stats = self.statistics()
        documents = max(1, stats.documents)
        avgdl = max(1e-9, stats.total_length / documents)
        if not self.filtered:
            return self._bm25_packed(terms, documents, avgdl, limit, None)
        if stats.members is not None:
            return self._bm25_packed(terms, documents, avgdl, limit, stats.members)
        scope = f"JOIN blocks b ON b.block_index = p.block_index AND {' AND '.join(self.conditions)} "
        sql = (
            "WITH matches AS MATERIALIZED (SELECT p.term, p.block_index, p.tf, p.length FROM postings p "
            f"{scope}WHERE p.term = ANY(?)), "
            "weights AS MATERIALIZED (SELECT term, greatest(1e-6, ln((?::float8 - count(*) + 0.5) / (count(*) + 0.5))) "
            "AS idf FROM matches GROUP BY term) "
            f"SELECT m.block_index, sum((w.idf * m.tf * {K1 + 1} / "
            f"(m.tf + {K1} * ({1 - B} + {B}::float8 * m.length / ?::float8)))::real) AS score "
            "FROM matches m JOIN weights w ON w.term = m.term GROUP BY m.block_index "
            "ORDER BY score DESC, m.block_index LIMIT ?"
        )
        params = [*self.params, terms, float(documents), float(avgdl), int(limit)]
        rows = self.index.db.fetch(sql, params)
        return (np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows)),
                np.fromiter((r[1] for r in rows), dtype=np.float64, count=len(rows)))

    def _bm25_packed(self, terms: list[str], documents: int, avgdl: float, limit: int,
                     members: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        """BM25 over the terms' packed postings (store/postgres/packs.py), scored as the
        in-process index scores (index/bm25.py: float32, term by term in query order, the same
        statistics), so both modes give the same scores, not just the same order. Scoped to
        `members` (a filter's blocks) when given: postings of other blocks neither score nor
        count in a term's document frequency — one read of the packs instead of joining every
        posting of the terms with `blocks` (36 ms for a channel of 14,623 blocks in 100k)."""
        postings = decode_postings(self.index.db.fetch(READ_PACKS, (terms, terms)))
        if members is not None:
            inside = np.zeros(int(members[-1]) + 1 if members.shape[0] else 0, dtype=bool)
            inside[members] = True
            for term, (rows, tf, length) in list(postings.items()):
                keep = rows < inside.shape[0]
                keep[keep] = inside[rows[keep]]
                postings[term] = (rows[keep], tf[keep], length[keep])
        present = [t for t in terms if t in postings and postings[t][0].shape[0]]
        if not present:
            return _EMPTY
        scores = np.zeros(max(int(postings[t][0].max()) for t in present) + 1, dtype=np.float32)
        for term in present:
            rows, tf, length = postings[term]
            df = rows.shape[0]  # every posting is a live block's: forget deletes them, and repacks
            idf = max(1e-6, math.log((documents - df + 0.5) / (df + 0.5)))  # as FTS5 computes it
            norm = tf + K1 * (1.0 - B + B * length / avgdl)
            scores[rows] += (idf * (K1 + 1.0)) * tf / norm
        # The candidates without scanning the dense array (5 ms at a million blocks): each block
        # appears once per query term it holds, so the best `limit × terms` postings by their
        # block's total cover the best `limit` blocks — and every block tied with the last of them.
        touched = np.concatenate([postings[t][0] for t in present])
        totals = scores[touched]
        enough = limit * len(present)
        if touched.shape[0] > enough:
            keep = totals >= totals[np.argpartition(-totals, enough - 1)[enough - 1]]
            touched = touched[keep]
        touched = np.unique(touched)
        found, found_scores = best_first(touched, scores[touched], limit)
        return found, found_scores.astype(np.float64)

    def both(self, tokens: list[str], query: np.ndarray, limit: int) -> BothFound:
        """The vector query on a second connection while BM25 runs on this thread: each waits
        on PostgreSQL (and numpy) with the GIL released, so a search waits for the slower of the
        two, not their sum. Threads of one pool shared by every memory of the process."""
        self.statistics()  # computed once, before either thread needs it
        started = time.perf_counter()

        def timed_nearest() -> tuple[tuple[np.ndarray, np.ndarray], float]:
            begun = time.perf_counter()
            found = self.nearest(query, limit)
            return found, (time.perf_counter() - begun) * 1000

        vector = _second_connection().submit(timed_nearest)
        try:
            bm25 = self.bm25(tokens, limit)
        finally:
            nearest, vector_ms = vector.result()
        return bm25, nearest, (time.perf_counter() - started) * 1000, vector_ms

    def nearest(self, query: np.ndarray, limit: int) -> tuple[np.ndarray, np.ndarray]:
        stats = self.statistics()
        if limit <= 0 or stats.documents == 0:
            return _EMPTY
        exact = stats.blocks < self.index.ann_threshold or (self.filtered and stats.documents <= EXACT_SUBSET_MAX)
        found = self._vector_query(query, limit, exact=exact)
        if not exact and found[0].shape[0] < min(limit, stats.documents):
            found = self._vector_query(query, limit, exact=True)  # the graph walk ran dry: as the engine does
        return found

    def _vector_query(self, query: np.ndarray, limit: int, *, exact: bool) -> tuple[np.ndarray, np.ndarray]:
        where = " AND ".join(self.conditions)
        if exact:  # ordered by the score, not by the operator: no index can serve it, every row is scored
            sql = (f"SELECT e.block_index, -(e.vector <#> %(q)s) AS score FROM embeddings e "
                   f"JOIN blocks b ON b.block_index = e.block_index WHERE {where} "
                   "ORDER BY score DESC, e.block_index LIMIT %(k)s")
        elif self.filtered:
            sql = (f"SELECT e.block_index, -(e.vector <#> %(q)s) FROM embeddings e WHERE EXISTS (SELECT 1 FROM "
                   f"blocks b WHERE b.block_index = e.block_index AND {where}) ORDER BY e.vector <#> %(q)s LIMIT %(k)s")
        else:  # forgotten blocks have no row in embeddings
            sql = "SELECT block_index, -(vector <#> %(q)s) FROM embeddings ORDER BY vector <#> %(q)s LIMIT %(k)s"
        params: dict[str, Any] = {"q": np.asarray(query, dtype=np.float32), "k": int(limit)}
        for i, value in enumerate(self.params):
            params[f"p{i}"] = value
        named = sql
        for i in range(len(self.params)):  # the filter's `?` placeholders, in order, as named ones
            named = named.replace("?", f"%(p{i})s", 1)
        with self.index.db.connection() as conn:
            rows = conn.execute(named, params).fetchall()
        rows.sort(key=lambda r: (-float(r[1]), int(r[0])))  # relaxed_order may return near-ties out of order
        return (np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows)),
                np.fromiter((r[1] for r in rows), dtype=np.float32, count=len(rows)))

    def neighbours(self, ids: np.ndarray, window: int) -> ScopedNeighbours:
        """The neighbour links and whether each target passes this search's filters, in one
        statement (two round trips before: links, then a liveness query for the new ones)."""
        conditions, params = filter_sql(self.filt, "n.")
        return self.index.neighbour_links(ids, window, " AND ".join(["n.forgotten_at IS NULL", *conditions]), params)


_PARALLEL_LOCK = threading.Lock()
_parallel: ThreadPoolExecutor | None = None


def _second_connection() -> ThreadPoolExecutor:
    """The process's threads for a search's second question (created on first use)."""
    global _parallel
    with _PARALLEL_LOCK:
        if _parallel is None:
            _parallel = ThreadPoolExecutor(max_workers=SECOND_QUESTIONS, thread_name_prefix="gieok-pg-search")
        return _parallel


def _threads_stayed_behind() -> None:
    """In a forked child: the parent's threads did not come along, and an executor that counts one
    of them as idle would queue work nobody runs; the child makes its own on first use."""
    global _parallel, _PARALLEL_LOCK
    _parallel = None
    _PARALLEL_LOCK = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_threads_stayed_behind)


class PostgresSearchIndex:
    """Every question of `SearchIndex` as SQL over one memory's schema (module docstring)."""

    text_features = True

    def __init__(self, db: PgSession, *, ann_threshold: int, cache_size: int) -> None:
        self.db = db
        self.ann_threshold = ann_threshold
        self.facts_cache: BoundedCache[int, _BlockFacts] = BoundedCache(cache_size)
        self.scope_cache: BoundedCache[tuple[Any, ...], _ScopeStatistics] = BoundedCache(SCOPE_STATISTICS_CACHED)
        self.scopes: BoundedCache[tuple[Any, ...], _ScopeMembers] = BoundedCache(SCOPES_LISTED)
        self._scopes_lock = threading.Lock()
        self._state: tuple[int, int] | None = None  # the store's (last block index, forgotten blocks)

    def changed(self) -> None:
        """Blocks were appended or forgotten (here or elsewhere): scope statistics are stale and
        the scopes' member lists are brought up to date at their next use. The facts of live
        blocks never change, so they stay."""
        self.scope_cache.clear()
        self._state = None

    def forget_facts(self, block_indices: Sequence[int] | None) -> None:
        """Forgotten blocks' ranking facts (a speaker's name among them) out of the cache; None:
        blocks forgotten elsewhere, which ones not known — the whole cache (it fills again)."""
        if block_indices is None:
            self.facts_cache.clear()
            return
        for block_index in block_indices:
            self.facts_cache.pop(block_index)

    def forgotten_count(self) -> int:
        """Blocks forgotten in the whole memory, as last read (again after a change)."""
        return self._store_state()[1]

    def drop_caches(self) -> None:
        self.facts_cache.clear()
        self.scope_cache.clear()
        self.scopes.clear()
        self._state = None

    def _store_state(self) -> tuple[int, int]:
        """(last block index, blocks forgotten), read again after a change: what tells a scope's
        member list what to add, and whether its live count must be counted again."""
        state = self._state
        if state is None:
            row = self.db.fetch("SELECT (SELECT coalesce(max(block_index), 0) FROM blocks), "
                                "(SELECT count(*) FROM blocks WHERE forgotten_at IS NOT NULL)")[0]
            state = self._state = (int(row[0]), int(row[1]))
        return state

    def _members(self, filt: BM25Filter, conditions: list[str], params: list[Any]) -> _ScopeStatistics:
        """A filtered scope's statistics with its member list (`_ScopeMembers`), listed once per
        process and extended by the blocks appended since."""
        last, forgotten = self._store_state()
        key = _filter_key(filt)
        where = " AND ".join(conditions)
        listing = ("SELECT b.block_index, coalesce(bt.length, 0) FROM blocks b "
                   f"LEFT JOIN block_tokens bt ON bt.block_index = b.block_index WHERE {where} "
                   "AND b.block_index > ? AND b.block_index <= ? ORDER BY b.block_index LIMIT ?")
        with self._scopes_lock:  # one listing per filter, however many searches wait for it
            entry = self.scopes.get(key)
            if entry is None or (entry.too_many and entry.covered < last):
                entry = _ScopeMembers(np.empty(0, dtype=np.int32), 0, 0, 0, forgotten)
            if entry.covered < last and not entry.too_many:
                rows = self.db.fetch(listing, [*params, entry.covered, last, SCOPE_MEMBERS_MAX + 1])
                found = np.fromiter((r[0] for r in rows), dtype=np.int32, count=len(rows))
                if entry.members.shape[0] + found.shape[0] > SCOPE_MEMBERS_MAX:
                    entry.too_many, entry.members = True, np.empty(0, dtype=np.int32)
                else:
                    entry.members = np.concatenate([entry.members, found])
                    entry.documents += len(rows)
                    entry.total_length += sum(int(r[1]) for r in rows)
                entry.covered = last
            if entry.forgotten != forgotten or entry.too_many:  # count the live ones again
                row = self.db.fetch(
                    "SELECT count(*), coalesce(sum(bt.length), 0) FROM blocks b "
                    f"LEFT JOIN block_tokens bt ON bt.block_index = b.block_index WHERE {where} "
                    "AND b.block_index <= ?", [*params, last])[0]
                entry.documents, entry.total_length, entry.forgotten = int(row[0]), int(row[1]), forgotten
            self.scopes.put(key, entry)
            return _ScopeStatistics(entry.documents, entry.total_length, last,
                                    None if entry.too_many else entry.members)

    def scope_statistics(self, filt: BM25Filter, conditions: list[str], params: list[Any]) -> _ScopeStatistics:
        key = _filter_key(filt)
        cached = self.scope_cache.get(key)
        if cached is not None:
            return cached
        if is_filtered(filt):
            stats = self._members(filt, conditions, params)
            self.scope_cache.put(key, stats)
            return stats
        row = self.db.fetch("SELECT documents, total_length, (SELECT coalesce(max(block_index), 0) FROM blocks) "
                            "FROM bm25_stats")[0]
        stats = _ScopeStatistics(int(row[0]), int(row[1]), int(row[2]))
        self.scope_cache.put(key, stats)
        return stats

    def scoped(self, filt: BM25Filter) -> _DatabaseScope:
        return _DatabaseScope(self, filt)

    def neighbour_ids(self, ids: np.ndarray, window: int) -> NeighbourLinks:
        source_at, targets, distance, _ = self.neighbour_links(ids, window)
        return source_at, targets, distance

    def neighbour_links(self, ids: np.ndarray, window: int, passes: str = "TRUE",
                        params: Sequence[Any] = ()) -> ScopedNeighbours:
        """`neighbour_ids` and, per target, the SQL condition `passes` on it (`n.`, with `params`)."""
        empty = np.empty(0, dtype=np.int64)
        if ids.shape[0] == 0 or window <= 0:
            return empty, empty, empty, np.zeros(0, dtype=bool)
        rows = self.db.fetch(
            f"SELECT src.i - 1, n.block_index, abs(n.conv_pos - s.conv_pos) AS distance, ({passes}) "
            "FROM unnest(?::bigint[]) WITH ORDINALITY AS src(block_index, i) "
            "JOIN blocks s ON s.block_index = src.block_index "
            "JOIN blocks n ON n.channel = s.channel AND n.conv_pos BETWEEN s.conv_pos - ? AND s.conv_pos + ? "
            "AND n.conv_pos <> s.conv_pos "
            "WHERE s.conv_pos IS NOT NULL AND s.channel IS NOT NULL "
            "ORDER BY src.i, distance, n.conv_pos",
            (*params, ids.tolist(), int(window), int(window)))
        n = len(rows)
        return (np.fromiter((r[0] for r in rows), dtype=np.int64, count=n),
                np.fromiter((r[1] for r in rows), dtype=np.int64, count=n),
                np.fromiter((r[2] for r in rows), dtype=np.int64, count=n),
                np.fromiter((bool(r[3]) for r in rows), dtype=bool, count=n))

    def facts(self, ids: np.ndarray) -> CandidateFacts:
        wanted = ids.tolist()
        known: dict[int, _BlockFacts] = {}
        missing = []
        for block_index in wanted:
            cached = self.facts_cache.get(block_index)
            if cached is None:
                missing.append(block_index)
            else:
                known[block_index] = cached
        if missing:
            for row in self.db.fetch(
                    "SELECT b.block_index, b.channel, b.conv_pos, b.speaker, b.event_time, b.importance, bt.length, "
                    "bt.tokens FROM blocks b LEFT JOIN block_tokens bt ON bt.block_index = b.block_index "
                    "WHERE b.block_index = ANY(?)", (missing,)):
                tokens = str(row[7]).split() if row[7] is not None else None
                facts = _BlockFacts(row[1], -1 if row[2] is None else int(row[2]), row[3], float(row[4]),
                                    float(row[5]), int(row[6] or 0),
                                    hangul_share(tokens) if tokens is not None else 0.5,
                                    mentions_time(tokens) if tokens is not None else False)
                known[int(row[0])] = facts
                self.facts_cache.put(int(row[0]), facts)
        return _candidate_facts([known[i] for i in wanted])

    def block_indices(self, ids: np.ndarray) -> np.ndarray:
        return ids

    # -- by block index ---------------------------------------------------------------------------
    def neighbours_of(self, block_index: int, window: int) -> list[tuple[int, int]]:
        _, found, distance = self.neighbour_ids(np.asarray([block_index], dtype=np.int64), window)
        return list(zip(found.tolist(), distance.tolist()))

    def live_among(self, block_indices: Sequence[int], filt: BM25Filter | None) -> list[int]:
        if not block_indices:
            return []
        conditions, params = filter_sql(filt, "") if filt is not None else ([], [])
        where = " AND ".join(["forgotten_at IS NULL", "block_index = ANY(?)", *conditions])
        found = {int(r[0]) for r in self.db.fetch(f"SELECT block_index FROM blocks WHERE {where}",
                                                  [[int(i) for i in block_indices], *params])}
        return [int(i) for i in block_indices if int(i) in found]

    def vectors_of(self, block_indices: Sequence[int]) -> dict[int, np.ndarray]:
        if not block_indices:
            return {}
        with self.db.connection() as conn, conn.cursor(binary=True) as cursor:
            rows = cursor.execute("SELECT block_index, vector FROM embeddings WHERE block_index = ANY(%s)",
                                  ([int(i) for i in block_indices],)).fetchall()
        return {int(i): np.asarray(v.to_numpy() if hasattr(v, "to_numpy") else v, dtype=np.float32) for i, v in rows}

    def last_turns(self, channel: str, n: int) -> list[int]:
        if n <= 0:
            return []
        rows = self.db.fetch("SELECT block_index FROM blocks WHERE channel = ? AND conv_pos IS NOT NULL "
                             "ORDER BY conv_pos DESC LIMIT ?", (channel, int(n)))
        return [int(r[0]) for r in reversed(rows)]


def _candidate_facts(rows: list[_BlockFacts]) -> CandidateFacts:
    """Column arrays of the candidates' facts; channels and speakers interned for this search only
    (the ranker compares them among the candidates, never across searches)."""
    n = len(rows)
    channels: dict[str, int] = {}
    speakers: dict[str, int] = {}
    names = [""]
    keys = np.full(n, -1, dtype=np.int64)
    speaker_codes = np.zeros(n, dtype=np.int32)
    for i, facts in enumerate(rows):
        if facts.channel is not None and facts.conv_pos >= 0:
            code = channels.setdefault(facts.channel, len(channels) + 1)
            keys[i] = (code << 40) + facts.conv_pos
        if facts.speaker is not None:
            if facts.speaker not in speakers:
                speakers[facts.speaker] = len(names)
                names.append(facts.speaker)
            speaker_codes[i] = speakers[facts.speaker]
    return CandidateFacts(
        sequence_keys=keys, speaker_codes=speaker_codes, speaker_names=names,
        event_time=np.fromiter((f.event_time for f in rows), dtype=np.float64, count=n),
        importance=np.fromiter((f.importance for f in rows), dtype=np.float32, count=n),
        doc_lengths=np.fromiter((f.length for f in rows), dtype=np.float32, count=n),
        hangul_shares=np.fromiter((f.hangul for f in rows), dtype=np.float32, count=n),
        time_mentions=np.fromiter((f.time_mention for f in rows), dtype=bool, count=n),
    )
