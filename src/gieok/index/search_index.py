"""The questions a search asks of a memory's indexes, as one port with two answers.

The ranking (`retrieval/hybrid.py`), the layers (checkpoints, the localized search) and the facade
never read the catalog, the vector matrix or the BM25 postings directly; they ask a `SearchIndex`:

- which blocks pass a search's filters, and the best of them by BM25 and by vector (`scoped`);
- the turns around candidates in their conversation (`neighbour_ids`, `neighbours_of`);
- what the learned ranker and the final score read of each candidate (`facts`);
- stored vectors, live blocks among some, a channel's last turns (the layers and the write path).

`index/in_process.py` answers from arrays loaded into the process (SQLite, and PostgreSQL with
`pg_index = "memory"`); `store/postgres/search_index.py` answers with SQL, keeping nothing in the
process but bounded caches (`pg_index = "database"`). Both must rank alike: the fusion, neighbour
spreading, learned ranker and breakdown are the retriever's, written once.

**Ids.** Candidates travel as int64 *ids* the index chose: catalog rows in the process, block
indices in the database. Both grow with the block index, so ordering ties by id orders them by
block index either way; `block_indices` turns ids back into block indices.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

from ..store.base import BM25Filter

__all__ = ["BlockLookup", "BothFound", "CandidateFacts", "DatabaseIndexed", "DatabaseSearchIndex", "NeighbourLinks",
           "ScopedNeighbours", "ScopedSearch", "SearchIndex", "one_after_the_other"]

# (index into the source ids, neighbour id, distance in turns), each an int64 array
NeighbourLinks = tuple[np.ndarray, np.ndarray, np.ndarray]
# (BM25 ids, scores), (vector ids, cosines), BM25 ms, vector ms
BothFound = tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray], float, float]
# NeighbourLinks and, per target, whether it passes the search's filters (and is live)
ScopedNeighbours = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


@dataclass(frozen=True, slots=True)
class CandidateFacts:
    """Per candidate (one entry per id asked for, in that order), what ranking reads besides
    the scores: its place in its conversation, its speaker, time, importance and token facts."""

    sequence_keys: np.ndarray  # int64: equal channel → keys one apart for neighbouring turns; -1 outside one
    speaker_codes: np.ndarray  # int: 0 when none; speaker_names[code] is the stored speaker
    speaker_names: Sequence[str]
    event_time: np.ndarray  # float64
    importance: np.ndarray  # float32
    doc_lengths: np.ndarray  # float32: BM25 token count
    hangul_shares: np.ndarray  # float32: `hangul_share` of its tokens
    time_mentions: np.ndarray  # bool: `mentions_time` of its tokens


class ScopedSearch(Protocol):
    """One search's filters, resolved once for both signals (scope, kinds, time range; live blocks only)."""

    def bm25(self, tokens: list[str], limit: int) -> tuple[np.ndarray, np.ndarray]:
        """The best `limit` (ids, scores), best first; statistics of the filtered blocks."""
        ...

    def nearest(self, query: np.ndarray, limit: int) -> tuple[np.ndarray, np.ndarray]:
        """The best `limit` (ids, cosine) by vector, best first."""
        ...

    def both(self, tokens: list[str], query: np.ndarray, limit: int) -> BothFound:
        """A hybrid search's BM25 and vector candidates (as `bm25` and `nearest`) and the ms each
        took: the database asks both questions at once, on two connections."""
        ...

    def neighbours(self, ids: np.ndarray, window: int) -> ScopedNeighbours:
        """`SearchIndex.neighbour_ids` of `ids` and a boolean per target: whether it passes the
        filters (and is live). The database asks it as one question."""
        ...


def one_after_the_other(scoped: ScopedSearch, tokens: list[str], query: np.ndarray, limit: int) -> BothFound:
    """`ScopedSearch.both` for an index whose two questions are arrays of this process."""
    started = time.perf_counter()
    bm25 = scoped.bm25(tokens, limit)
    middle = time.perf_counter()
    nearest = scoped.nearest(query, limit)
    return bm25, nearest, (middle - started) * 1000, (time.perf_counter() - middle) * 1000


class BlockLookup(Protocol):
    """What the layers, the facade and the write path ask, by block index."""

    def neighbours_of(self, block_index: int, window: int) -> list[tuple[int, int]]:
        """(block index, distance) of the turns within ±window of a block in its channel,
        nearest first (forgotten ones too)."""
        ...

    def live_among(self, block_indices: Sequence[int], filt: BM25Filter | None) -> list[int]:
        """Those of `block_indices` that are live and pass `filt` (any, when None), in the given order."""
        ...

    def vectors_of(self, block_indices: Sequence[int]) -> dict[int, np.ndarray]:
        """Stored vectors of those blocks that have one."""
        ...

    def last_turns(self, channel: str, n: int) -> list[int]:
        """Block indices of the channel's last `n` turns, oldest first (forgotten ones too)."""
        ...


class SearchIndex(BlockLookup, Protocol):
    """What ranking asks of a memory's blocks, by id (module docstring), and the lookups by block index."""

    @property
    def text_features(self) -> bool:
        """Whether `facts` knows token counts, Hangul shares and time mentions (the learned
        ranker needs them; without them the fused score ranks)."""
        ...

    def scoped(self, filt: BM25Filter) -> ScopedSearch: ...

    def neighbour_ids(self, ids: np.ndarray, window: int) -> NeighbourLinks:
        """Turns within ±window of each id in the same channel's sequence (forgotten ones too:
        the caller filters what joins), ordered by source, then distance, then before-after."""
        ...

    def facts(self, ids: np.ndarray) -> CandidateFacts: ...

    def block_indices(self, ids: np.ndarray) -> np.ndarray: ...


class DatabaseSearchIndex(SearchIndex, Protocol):
    """A `SearchIndex` the store itself answers, with what a memory tells it of changes."""

    def changed(self) -> None:
        """Blocks were appended or forgotten, here or elsewhere: what it keeps of the store's
        state is read again."""
        ...

    def forget_facts(self, block_indices: Sequence[int] | None) -> None:
        """Forgotten blocks out of what it keeps per block (None: which ones is not known, all of it)."""
        ...

    def forgotten_count(self) -> int:
        """Blocks forgotten in the whole memory (what tells a process of erasures made elsewhere)."""
        ...

    def drop_caches(self) -> None: ...


@runtime_checkable
class DatabaseIndexed(Protocol):
    """A store that can answer a search's questions itself, keeping nothing per process but
    bounded caches (PostgreSQL: `store/postgres/search_index.py`)."""

    def database_index(self, *, ann_threshold: int, cache_size: int) -> DatabaseSearchIndex: ...
