"""The indexes of one memory, kept in step with the store behind one object.

In the process (SQLite; PostgreSQL with `pg_index = "memory"`): the catalog (a row per block:
scope, kind, time, position in its conversation, alive), the vector index and the BM25 postings
load once when a memory opens and then follow every commit incrementally: this process's
(`after_append`, `erase`) and other processes' (`sync` reads the store's change token and catches
up). In the database (PostgreSQL with `pg_index = "database"`): nothing loads; the store answers
every question with SQL (`index/search_index.py`), and a commit anywhere only drops the
statistics it cached. Either way the retriever ranks over a `SearchIndex`, and the layers ask
this object by block index (`BlockLookup`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from ..config import Settings
from ..errors import GieokError, MemoryReembeddedError
from ..index.bm25 import BM25Index
from ..index.catalog import Catalog
from ..index.in_process import InProcessIndex
from ..index.search_index import DatabaseIndexed, DatabaseSearchIndex, SearchIndex
from ..index.store_ann import StoreANN
from ..index.vector import AnnParams, VectorIndex
from ..retrieval.hybrid import HybridRetriever, RetrievalParams
from ..retrieval.passages import PASSAGES_KEY
from ..retrieval.ranker import shipped_ranker
from ..store.base import BM25Filter, IndexRows, Store, VectorSearchStore
from ..text.dates import resolve_zone
from ..text.tokenize import Tokenizer
from ..types import Block
from .tokens import refresh_tokens

__all__ = ["MemoryIndexes"]

log = logging.getLogger("gieok.index")

_NONE_BEFORE = 2**62  # a change id after every real one


class MemoryIndexes:
    """Catalog, vectors, BM25 and retriever of one store. Not thread-safe by itself: the memory
    calls it under its lock. `on_foreign_change` runs when another process's commit is noticed
    (the memory drops its cached answers)."""

    def __init__(self, store: Store, settings: Settings, tokenizer: Tokenizer, embedder_spec: str,
                 sidecar: Path, on_foreign_change: Callable[[], None]) -> None:
        refresh_tokens(store, tokenizer)  # stored BM25 tokens made as this tokenizer makes a query's
        self.store = store
        self.settings = settings
        self.tokenizer = tokenizer
        self.embedder_spec = embedder_spec
        self.sidecar = sidecar
        self.on_foreign_change = on_foreign_change
        # Blocks given new vectors, here or elsewhere: whatever keeps copies of them (working memory) takes them
        self.on_vectors_replaced: Callable[[dict[int, np.ndarray]], None] | None = None
        # blocks another process erased, as this one takes them (`_take_erasures_made_elsewhere`); None
        # when it cannot tell which (PostgreSQL answering the search: `_erasures_counted`)
        self.on_erased_elsewhere: Callable[[Sequence[int] | None], None] | None = None
        recorded = store.get_meta("dimension")
        self.dimension: int | None = int(recorded) if recorded else None
        self.catalog = Catalog()
        self.vectors: VectorIndex | None = None
        self.bm25: BM25Index | None = None
        self.retriever: HybridRetriever | None = None
        self.search_index: SearchIndex | None = None
        # PostgreSQL can answer every question itself: then no copy of the data is loaded here
        self.database: DatabaseSearchIndex | None = (
            store.database_index(ann_threshold=settings.ann_threshold, cache_size=settings.pg_index_cache)
            if settings.pg_index == "database" and isinstance(store, DatabaseIndexed) else None)
        self.change_token = store.change_token()
        self.vector_change = 0  # the store's last vector replacement these vectors hold (`replaced_vectors`)
        self.embedding_record: tuple[str | None, ...] = ()  # `load` reads it
        self.forgotten_seen = 0  # with `database`: the blocks forgotten when this process last looked
        if self.database is not None:
            self.forgotten_seen = self.database.forgotten_count()
            self.search_index = self.database
        if self.dimension is not None:
            self.load()

    # -- loading -----------------------------------------------------------------------------
    def ann_params(self) -> AnnParams:
        s = self.settings
        return AnnParams(s.ann_threshold, s.hnsw_m, s.hnsw_ef_construction, s.hnsw_ef_search, s.ann_backend)

    def adopt(self, dimension: int) -> None:
        """The first embedder was just recorded: build empty indexes of its dimension."""
        self.dimension = dimension
        self.load()

    @property
    def vector_kind(self) -> str:
        if self.database is not None:
            return "pgvector-hnsw (database)"
        return self.vectors.kind if self.vectors is not None else "empty"

    def _retriever(self, index: SearchIndex) -> HybridRetriever:
        return HybridRetriever(index, self.tokenizer, RetrievalParams.from_settings(self.settings),
                               ranker=shipped_ranker() if self.settings.ranker == "learned" else None,
                               zone=resolve_zone(self.settings.timezone))

    def _embedding_record(self) -> tuple[str | None, ...]:
        """What made the stored vectors, as the store records it (`gieok reindex` changes it)."""
        return tuple(self.store.get_meta(key) for key in ("embedder", "dimension", PASSAGES_KEY))

    def load(self) -> None:
        assert self.dimension is not None
        self.embedding_record = self._embedding_record()
        if self.database is not None:
            self.retriever = self._retriever(self.database)
            return
        self.catalog = Catalog()
        external = StoreANN(self.store, lambda: self.catalog) if isinstance(self.store, VectorSearchStore) else None
        self.vectors = VectorIndex(self.dimension, self.ann_params(), external=external)
        rows = self.store.load_index_rows(0, self.dimension)
        self.catalog.extend(rows)
        self.vectors.extend(rows.vectors, build_ann=False)
        self.bm25 = BM25Index() if self.settings.bm25_engine == "memory" else None
        self._load_tokens(0)
        saved = self.vectors.try_load(self.sidecar, self.embedder_spec)
        if saved is None:
            self.vectors.ensure_ann()
        # A saved graph may predate vectors replaced since (the matrix was read now): it takes them.
        # Without one, only the last replacement's id is wanted (no change comes after `_NONE_BEFORE`).
        self.vector_change, replaced = self.store.replaced_vectors(
            saved if saved is not None else _NONE_BEFORE, self.dimension)
        self._take_vectors(replaced, tell=False)  # what else holds copies reads them from the store now
        dead = np.flatnonzero(~self.catalog.alive()).tolist()
        if dead:  # a saved graph may predate a forget made elsewhere: erase again, it is cheap
            self.vectors.zero_rows(dead)
        self.search_index = InProcessIndex(self.catalog, self.vectors, self.bm25, self.store)
        self.retriever = self._retriever(self.search_index)

    def _load_tokens(self, after_block_index: int) -> None:
        if self.bm25 is None or self.database is not None:
            return
        pairs = self.store.load_tokens(after_block_index)
        if not pairs:
            return
        indices = np.fromiter((bi for bi, _ in pairs), dtype=np.int64, count=len(pairs))
        rows = [self.catalog.row_of(int(bi)) for bi in indices]
        keep = [(r, text.split()) for r, (_, text) in zip(rows, pairs) if r is not None]
        self.bm25.extend([r for r, _ in keep], [t for _, t in keep])

    def save(self) -> None:
        """Keep the ANN graph beside the file, so the next open need not rebuild it.

        Another process of the same file (`--workers N`) may have forgotten blocks, or embedded
        turns again without an erased neighbour, since this one last read: the graph takes those
        changes before it is written, and they are looked for again once it is (one that came
        meanwhile is taken and the graph written again), so the graph on disk never brings back a
        vector erased elsewhere. Blocks added elsewhere are not read in: the graph covers a prefix of
        the blocks and the next open adds the rest. If the store cannot say, or erasures keep
        coming, the graph file is removed and the next open rebuilds it."""
        if self.vectors is None or not self.vectors.keeps_graph:
            return
        try:
            if self._embedding_record() != self.embedding_record:
                return  # re-embedded elsewhere (`gieok reindex`, which removed the old graph): nothing of ours fits
            self._take_erasures_made_elsewhere()
            for _ in range(3):
                self.vectors.save(self.sidecar, self.embedder_spec, self.catalog.last_block_index, self.vector_change)
                if not self._take_erasures_made_elsewhere():
                    return
            why = "blocks kept being erased while it was written"
        except GieokError as exc:
            why = str(exc)
        self.sidecar.unlink(missing_ok=True)
        log.warning("the ANN graph was not saved beside the database (%s); the next open rebuilds it", why)

    def _take_erasures_made_elsewhere(self) -> bool:
        """Take the vectors replaced and the blocks forgotten that this process has not taken yet;
        whether there were any."""
        replaced = self._take_replaced_vectors()
        alive = self.catalog.alive()
        dead = [i for i in self.store.forgotten_indices() if (row := self.catalog.row_of(i)) is not None and alive[row]]
        if dead:
            self._erase_rows(dead)
            if self.on_erased_elsewhere is not None:
                self.on_erased_elsewhere(dead)
        return replaced or bool(dead)

    def _erasures_counted(self, own: int = 0) -> None:
        """With `database` (no catalogue here to say which blocks are alive): whether blocks were
        forgotten elsewhere since this process last looked — the store's count of forgotten blocks
        moved by more than this process's own `own` — and if so, what this process keeps of
        blocks by their index or text is let go (`on_erased_elsewhere(None)`: which blocks, it
        cannot tell). The count is the one PostgreSQL's index reads after a change anyway."""
        assert self.database is not None
        count = self.database.forgotten_count()
        elsewhere = count != self.forgotten_seen + own
        self.forgotten_seen = count
        if elsewhere:
            self.database.forget_facts(None)
            if self.on_erased_elsewhere is not None:
                self.on_erased_elsewhere(None)

    def _take_replaced_vectors(self) -> bool:
        """The vectors another process replaced (`Store.replaced_vectors`) since this one last
        looked, into the matrix and the graph; whether there were any."""
        assert self.dimension is not None
        self.vector_change, replaced = self.store.replaced_vectors(self.vector_change, self.dimension)
        return self._take_vectors(replaced)

    def _take_vectors(self, replaced: dict[int, np.ndarray], *, tell: bool = True) -> bool:
        assert self.vectors is not None
        alive = self.catalog.alive()
        rows = [(row, vector) for index, vector in replaced.items()
                if (row := self.catalog.row_of(index)) is not None and alive[row]]
        if rows:
            self.vectors.replace_rows([row for row, _ in rows], np.stack([vector for _, vector in rows]))
        if replaced and tell and self.on_vectors_replaced is not None:
            self.on_vectors_replaced(replaced)
        return bool(rows)

    # -- following commits -------------------------------------------------------------------
    def sync(self) -> None:
        """Pick up blocks and forgets committed by other processes since we last looked."""
        if self.dimension is None:
            # Recording the embedder changes no block, so the change counter does not say it
            # happened: another process may have recorded it before any block exists.
            recorded = self.store.get_meta("dimension")
            if recorded:
                self.change_token = self.store.change_token()
                self.on_foreign_change()
                if self.database is not None:
                    self.database.changed()
                self.adopt(int(recorded))
            return
        token = self.store.change_token()
        if token == self.change_token:
            return
        if self._embedding_record() != self.embedding_record:  # before the token moves: raised at every use
            raise MemoryReembeddedError(
                f"{self.store.get_meta('embedder')} vectors (`gieok reindex`) replaced the "
                f"{self.embedding_record[0]} ones this process loaded: open the memory again")
        self.change_token = token
        self.on_foreign_change()  # another process wrote: nothing cached may be trusted
        if self.database is not None:
            self.database.changed()
            self._erasures_counted()
            return
        self.catch_up()
        self._take_erasures_made_elsewhere()

    def noted(self, forgotten: int = 0) -> None:
        """This process just committed (having forgotten `forgotten` blocks): its change is already in
        the indexes. With `database`, an erasure another process committed since the last look is
        still heard of (`_erasures_counted`): the change token this moves past may hold it."""
        self.change_token = self.store.change_token()
        if self.database is not None:
            self.database.changed()
            self._erasures_counted(own=forgotten)

    def catch_up(self) -> None:
        if self.database is not None:
            self.database.changed()
            return
        assert self.dimension is not None and self.vectors is not None
        after = self.catalog.last_block_index
        rows = self.store.load_index_rows(after, self.dimension)
        self.catalog.extend(rows)
        self.vectors.extend(rows.vectors)
        self._load_tokens(after)

    def after_append(self, blocks: list[Block], vectors: np.ndarray, tokens: list[list[str]]) -> None:
        if self.database is not None:
            self.database.changed()  # the scope statistics it cached count one block less
            return
        assert self.vectors is not None
        if not blocks:
            return
        if blocks[0].block_index != self.catalog.last_block_index + 1:
            self.catch_up()  # another process wrote in between: load everything in order
            return
        n = len(blocks)
        self.catalog.extend(IndexRows(
            block_index=np.fromiter((b.block_index for b in blocks), np.int64, n),
            kind=[b.kind for b in blocks],
            guild=[b.scope.guild for b in blocks],
            channel=[b.scope.channel for b in blocks],
            user=[b.scope.user for b in blocks],
            speaker=[b.speaker for b in blocks],
            event_time=np.fromiter((b.event_time for b in blocks), np.float64, n),
            importance=np.fromiter((b.importance for b in blocks), np.float32, n),
            conv_pos=np.fromiter((b.conv_pos if b.conv_pos is not None else -1 for b in blocks), np.int64, n),
            alive=np.ones(n, dtype=bool),
            vectors=vectors,
        ))
        self.vectors.extend(vectors)
        if self.bm25 is not None:
            start = len(self.catalog) - n
            self.bm25.extend(list(range(start, start + n)), tokens)

    def erase(self, block_indices: Sequence[int]) -> None:
        """Blocks this process just forgot: out of the vectors and the postings (with `database`,
        out of its cache of their ranking facts)."""
        if self.database is not None:
            self.database.changed()
            self.database.forget_facts(block_indices)
            return
        if self.vectors is None:
            return
        if self.catalog.last_block_index < self.store.last_block_index():
            self.catch_up()
        self._erase_rows(block_indices)

    def replace_vectors(self, block_indices: Sequence[int], vectors: np.ndarray) -> None:
        """Blocks this process just gave new vectors (`Store.replace_vectors`)."""
        if self.on_vectors_replaced is not None and len(block_indices):
            self.on_vectors_replaced({int(i): vector for i, vector in zip(block_indices, vectors)})
        if self.database is not None:
            self.database.changed()
            return
        if self.vectors is None:
            return
        rows = [self.catalog.row_of(i) for i in block_indices]
        kept = [(row, vector) for row, vector in zip(rows, vectors) if row is not None]
        if kept:
            self.vectors.replace_rows([row for row, _ in kept], np.stack([vector for _, vector in kept]))

    def _erase_rows(self, block_indices: Sequence[int]) -> None:
        assert self.vectors is not None
        rows = self.catalog.mark_forgotten(list(block_indices))
        self.vectors.zero_rows(rows)
        if self.bm25 is not None:
            for row in rows:
                self.bm25.remove(row)

    # -- reading by block index (BlockLookup: the layers, the facade, the write path) -------------
    def vector_of(self, block_index: int) -> np.ndarray | None:
        found = self.vectors_of([block_index]).get(block_index)
        return None if found is None else found.copy()

    def vectors_of(self, block_indices: Sequence[int]) -> dict[int, np.ndarray]:
        return self.search_index.vectors_of(block_indices) if self.search_index is not None else {}

    def neighbours_of(self, block_index: int, window: int) -> list[tuple[int, int]]:
        return self.search_index.neighbours_of(block_index, window) if self.search_index is not None else []

    def live_among(self, block_indices: Sequence[int], filt: BM25Filter | None) -> list[int]:
        return self.search_index.live_among(block_indices, filt) if self.search_index is not None else []

    def last_turns(self, channel: str, n: int) -> list[int]:
        if self.search_index is None:
            return self.catalog.last_turns(channel, n)
        return self.search_index.last_turns(channel, n)
