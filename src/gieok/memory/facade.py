"""The Memory facade: the one public entry for add / search / forget / stats.

Writes embed outside the lock (the slow part) and then commit in one transaction; the in-memory indexes follow
each commit incrementally (`indexes.py`) and notice commits from other processes through the store's change
token. Validation is `ingest.py`'s, export / import / reindex `transfer.py`'s, events `events.py`'s: this class
wires them to the layers."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

import numpy as np

from ..callbacks import weakly
from ..config import Settings
from ..embed import CachedEmbedder, Embedder, create_embedder
from ..errors import BlockNotFoundError, InvalidInputError, InvalidTypeError
from ..index.catalog import Catalog
from ..index.vector import VectorIndex, limit_blas_threads
from ..retrieval.hybrid import MODES, RankingCandidates, SearchRequest
from ..store.base import AppendHook, BM25Filter, Store, VerifyReport
from ..store.factory import open_store
from ..text.tokenize import Tokenizer, get_tokenizer
from ..types import Block, Scope, SearchResult, Stats
from ..validate import check_k, check_kinds, check_speaker_names, check_time, clean_text
from . import ingest, transfer
from .embedding import DEFAULT_EMBEDDER, check_vectors, load_embedder, recorded_recipe, resolve_spec, settings_recipe
from .events import EventListener, MemoryEvents, search_event
from .indexes import MemoryIndexes
from .layered import LayerStack
from .search import SearchPath
from .transfer import reindex, remove_memory_files, sidecar_path
from .writes import Progress, WritePath

WARM_QUERY = "민지가 키우는 고양이 이름 (the name of Minji's cat)"

__all__ = ["Memory", "DEFAULT_EMBEDDER", "EventListener", "Progress", "reindex", "remove_memory_files",
           "sidecar_path"]


class Memory:
    """Long-term memory in one SQLite file (or a PostgreSQL database: `db = "postgresql://…"`).

    >>> with Memory.open("chat.db") as memory:
    ...     memory.add("민지: 고양이 이름은 나비야", scope={"channel": "general"})
    ...     memory.search("민지 고양이 이름", scope={"channel": "general"})

    `settings`: what to use (default: the built-in defaults; nothing is read from the environment or a file
    unless the caller does so with `Settings.load()`); keyword arguments override single settings. `store`: a
    `Store` already open (closed with the memory; `path` and `db` are then ignored). `embedder`: an `Embedder`
    instead of the one the settings name, or a spec string."""

    def __init__(self, path: str | os.PathLike[str] | None = None, *, settings: Settings | None = None,
                 tokenizer: Tokenizer | None = None, store: Store | None = None,
                 embedder: Embedder | str | None = None, **overrides: Any) -> None:
        base = settings if settings is not None else Settings()
        if path is not None:
            overrides["db"] = str(path)
        if isinstance(embedder, str):  # the `embedder` setting: a spec such as "use"
            overrides["embedder"] = embedder
            embedder = None
        self.settings = base.with_overrides(**overrides) if overrides else base
        s = self.settings
        self.store: Store = store if store is not None else open_store(
            s.db_location(), busy_timeout_ms=s.busy_timeout_ms, hnsw_m=s.hnsw_m,
            hnsw_ef_construction=s.hnsw_ef_construction, hnsw_ef_search=s.hnsw_ef_search)
        self.path = Path(self.store.path)
        self.location = self.store.path  # a file path, or a database URL (without its password)
        self.tokenizer = tokenizer or get_tokenizer()
        limit_blas_threads(s.blas_threads)
        self._lock = threading.RLock()
        self._closed = False
        self.events = MemoryEvents()
        self._embedder: CachedEmbedder | None = None
        self._given_embedder = embedder
        try:
            self._embedder_spec = resolve_spec(self.store, self.settings, embedder, self.location)
            self.indexes = MemoryIndexes(self.store, s, self.tokenizer, self._embedder_spec,
                                         sidecar_path(self.path), weakly(self._drop_cached_answers))
            self._init_layers()
        except BaseException:
            self.store.close()
            raise

    def _init_layers(self) -> None:
        # The parts call back through `weakly`: a closed memory is freed at once (gieok/callbacks.py)
        self.layers = stack = LayerStack(self.store, self.settings, self.tokenizer, self.indexes,
                                         weakly(self._write_note), self.events.emit, self._lock)
        stack.follow(self.indexes)
        self.working, self.stm, self.hybrid = stack.working, stack.stm, stack.hybrid  # parts, by their old names
        self.checkpoints, self.localized, self.cache, self.coordinator = (stack.checkpoints, stack.localized,
                                                                          stack.cache, stack.coordinator)
        self._search = SearchPath(self.store, self.indexes, self.coordinator, self._lock, weakly(self._embed_query))
        self._writes = WritePath(self.store, self.settings, self.tokenizer, self.indexes, self.layers, self.events,
                                 self._lock, weakly(self._current_embedder), weakly(self._check_open),
                                 weakly(self._loaded_embedder))

    def _embed_query(self, query: str) -> np.ndarray:
        return self.embedder.embed_query(query)

    def _current_embedder(self) -> CachedEmbedder:
        return self.embedder

    def _loaded_embedder(self) -> CachedEmbedder | None:
        return self._embedder

    def _drop_cached_answers(self) -> None:
        if hasattr(self, "cache"):
            self.cache.clear()

    def _write_note(self, text: str, scope: Scope, importance: float, metadata: dict[str, Any],
                    vector: np.ndarray | None) -> Block:
        """A promoted working-memory slot or STM entry, into long-term memory (its vector reused)."""
        new = self._writes.prepare(text, kind="note", scope=scope, importance=importance, metadata=metadata)
        if vector is not None and vector.shape[0] == self.indexes.dimension:
            return self._writes.write([new], vector[None, :])[0]
        return self._writes.write([new], None)[0]

    # -- what the facade shows of its parts ----------------------------------------------------
    @property
    def listener(self) -> EventListener | None:
        """Who hears this memory's events (the server's live stream sets it)."""
        return self.events.listener

    @listener.setter
    def listener(self, value: EventListener | None) -> None:
        self.events.listener = value

    def emit(self, kind: str, data: dict[str, Any]) -> None:
        self.events.emit(kind, data)

    @property
    def catalog(self) -> Catalog:
        return self.indexes.catalog

    @property
    def vectors(self) -> VectorIndex | None:
        return self.indexes.vectors

    # -- lifecycle ---------------------------------------------------------------------------
    @classmethod
    def open(cls, path: str | os.PathLike[str] | None = None, **overrides: Any) -> Memory:
        return cls(path, **overrides)

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
                self.indexes.save()
            finally:
                self.store.close()

    def _check_open(self) -> None:
        if self._closed:
            raise InvalidInputError("this Memory is closed")

    # -- embedder ----------------------------------------------------------------------------
    @property
    def embedder(self) -> CachedEmbedder:
        """Loaded on first use: stats, verify, export and forget never need the model."""
        if self._embedder is None:
            with self._lock:
                if self._embedder is None:
                    self._embedder = load_embedder(self.store, self.settings, self._embedder_spec,
                                                   self._given_embedder, self.indexes, self.location)
        return self._embedder

    def warm(self) -> None:
        """Load now what the first search would: the Korean analyser, the model, the indexes and the ranker
        (one search no listener hears; nothing is recorded). Servers call it before ready."""
        self._check_open()
        self.tokenizer.analyze(WARM_QUERY)
        local = self._given_embedder is None and not self._embedder_spec.startswith(("openai:", "gemini:"))
        if self.indexes.dimension is None:  # nothing embedded yet: load the model without recording it
            if local:
                create_embedder(self._embedder_spec, self.settings).embed_query(WARM_QUERY)
        else:
            self._search.warm(WARM_QUERY, self.embedder.embed_query(WARM_QUERY) if local else None)

    # -- writes ------------------------------------------------------------------------------
    def add(self, text: str, *, kind: str = "turn", scope: Scope | Mapping[str, Any] | None = None,
            speaker: str | None = None, event_time: Any = None, importance: float = 0.5,
            keywords: Sequence[str] | None = None, tags: Sequence[str] | None = None,
            metadata: Mapping[str, Any] | None = None, within: AppendHook | None = None) -> Block:
        """Append one block. Keywords are extracted from the text when not given. `within`: called
        inside the append's transaction with the block as stored (rows that commit with it)."""
        self._check_open()
        new = self._writes.prepare(text, kind=kind, scope=scope, speaker=speaker, event_time=event_time,
                                   importance=importance, keywords=keywords, tags=tags, metadata=metadata)
        return self._writes.write([new], None, within)[0]

    def add_many(self, items: Iterable[str | Mapping[str, Any]], *, vectors: np.ndarray | None = None,
                 progress: Progress | None = None, within: AppendHook | None = None) -> list[Block]:
        """Append many blocks. Every item is validated before anything is written; then blocks are embedded in
        batches and committed in chunks (each chunk one transaction, `within` called inside each with its blocks).
        `vectors`: passage vectors already computed with this memory's embedder, one row per item, of the texts
        `passage_texts(items)` gives; checked for shape and finiteness, never for meaning."""
        self._check_open()
        prepared = self._writes.prepare_many(items)
        given = check_vectors(vectors, len(prepared), self.embedder.dimension) if vectors is not None else None
        return self._writes.write_chunked(prepared, given, progress, within=within)

    def passage_texts(self, items: Iterable[str | Mapping[str, Any]]) -> list[str]:
        """The texts `add_many` would embed for `items` if they were added now: a turn with the
        turns just before it in its channel. A caller that embeds ahead of time embeds these."""
        self._check_open()
        return self._writes.passage_context().texts_for(ingest.passage_sources(items, self.settings.max_text_chars))

    def forget(self, block_indices: int | Iterable[int]) -> list[int]:
        """Erase the content of blocks (text, speaker, keywords, tags, metadata, vector, BM25
        entry); the header and content digest stay so the chain still verifies."""
        self._check_open()
        return self._writes.forget(ingest.block_indices(block_indices))

    def forget_with_neighbours(self, indices: Iterable[int], texts: Iterable[str] = ()) -> tuple[list[int], list[int]]:
        """`forget`, re-embed the turns that held them as context; `texts` (never blocks) out of the caches."""
        self._check_open()
        return self._writes.erase(ingest.block_indices(indices), list(texts))

    def remember(self, text: str, *, scope: Scope | Mapping[str, Any] | None = None, speaker: str | None = None,
                 event_time: Any = None, importance: float = 0.5, kind: str = "turn",
                 metadata: Mapping[str, Any] | None = None) -> Block:
        """Store a conversation turn and feed it to working memory and STM of its conversation."""
        block = self.add(text, kind=kind, scope=scope, speaker=speaker, event_time=event_time,
                         importance=importance, metadata=metadata)
        self._feed_layers(block)
        return block

    def remember_many(self, items: Iterable[Mapping[str, Any]], *, within: AppendHook | None = None) -> list[Block]:
        """`remember` for several turns at once: one batched embedding, one transaction per chunk.
        `within`: called inside each chunk's transaction with its blocks as stored, for rows that
        must commit or roll back with them (the conversation layers' L1 links and fence)."""
        self._check_open()
        prepared = self._writes.prepare_many(items)
        blocks = self._writes.write_chunked(prepared, None, None, within=within)
        for block in blocks:
            self._feed_layers(block)
        return blocks

    def _feed_layers(self, block: Block) -> None:
        self.layers.feed(block, self.indexes.vector_of(block.block_index))

    # -- reads -------------------------------------------------------------------------------
    def get(self, block_index: int) -> Block:
        self._check_open()
        found = self.store.get_many([ingest.block_index(block_index)])
        if block_index not in found:
            raise BlockNotFoundError(f"no block with index {block_index}")
        return found[block_index]

    def list_blocks(self, *, scope: Scope | Mapping[str, Any] | None = None, kinds: Iterable[str] | str | None = None,
                    since: Any = None, until: Any = None, before: int | None = None,
                    limit: int = 100) -> list[Block]:
        """Live blocks, newest first, filtered like `search`; `before` is a block index to continue
        from (the last one of the previous page)."""
        self._check_open()
        if before is not None and (isinstance(before, bool) or not isinstance(before, int)):
            raise InvalidTypeError(f"before must be a block index, not {type(before).__name__}")
        filt = BM25Filter(Scope.of(scope), check_kinds(kinds), check_time(since, "since"), check_time(until, "until"))
        return self.store.list_blocks(filt, before=before, limit=check_k(limit))

    def neighbours(self, block_index: int, window: int = 3) -> list[Block]:
        """The turns around a turn in its conversation (±`window` positions, itself included), in
        conversation order; a block that is not a turn has none but itself. Forgotten turns are left out."""
        block = self.get(block_index)
        if isinstance(window, bool) or not isinstance(window, int) or not 0 <= window <= 50:
            raise InvalidInputError(f"window must be an integer from 0 to 50, got {window!r}")
        with self._lock:
            self.indexes.sync()
            indices = [i for i, _ in self.indexes.neighbours_of(block_index, window)]
        around = [b for b in self.store.get_many(indices).values() if not b.forgotten]
        return sorted([*around, block], key=lambda b: (b.conv_pos or 0, b.block_index))

    def vectors_of(self, block_indices: Sequence[int]) -> list[np.ndarray | None]:
        """The stored vectors of blocks (None for a block without one), without re-embedding."""
        self._check_open()
        with self._lock:
            self.indexes.sync()
            return [self.indexes.vector_of(index) for index in block_indices]

    def search(self, query: str, k: int = 10, *, scope: Scope | Mapping[str, Any] | None = None,
               kinds: Iterable[str] | str | None = None, since: Any = None, until: Any = None,
               mode: str = "hybrid", neighbours: bool = True, layers: bool | None = None,
               query_vector: np.ndarray | None = None,
               speaker_names: Mapping[str, str] | None = None) -> SearchResult:
        """Search. `scope` filters by guild / channel / user (each optional). With layers on (the
        default, setting `layers`), working memory, the cache and the checkpoint layer may answer
        before the full hybrid search; `result.source` says which did. `query_vector`: the query's
        vector from this memory's embedder, when the caller has it. `speaker_names`: display names
        of speakers stored under an id, so a query naming someone ranks their turns."""
        self._check_open()
        query = clean_text(query, max_chars=self.settings.max_text_chars, what="query", setting="max_text_chars")
        k = check_k(k)
        if mode not in MODES:
            raise InvalidInputError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
        request = SearchRequest(query=query, k=k, scope=Scope.of(scope), kinds=check_kinds(kinds),
                                since=check_time(since, "since"), until=check_time(until, "until"), mode=mode,
                                neighbours=bool(neighbours), speaker_names=check_speaker_names(speaker_names))
        given = None
        if query_vector is not None:
            if not isinstance(query_vector, np.ndarray) or query_vector.ndim != 1:
                raise InvalidInputError("query_vector must be a one-dimensional numpy array")
            given = check_vectors(query_vector[None, :], 1, self.embedder.dimension)[0]
        result = self._search.run(request, given, self.settings.layers if layers is None else layers)
        if self.events.active:
            self.events.emit("search.answered", search_event(result, k))
        return result

    def ranking_candidates(self, query: str, *, scope: Scope | Mapping[str, Any] | None = None,
                           query_vector: np.ndarray | None = None,
                           speaker_names: Mapping[str, str] | None = None) -> RankingCandidates:
        """Every candidate a hybrid search for `query` considers, with its ranking features — what
        `gieok bench ranker` trains the learned ranker on. No layers, no cache."""
        self._check_open()
        query = clean_text(query, max_chars=self.settings.max_text_chars, what="query", setting="max_text_chars")
        return self._search.candidates(SearchRequest(query=query, k=1, scope=Scope.of(scope),
                                                     speaker_names=check_speaker_names(speaker_names)), query_vector)

    # -- the layers, as the CLI, the server and the dashboard show them --------------------------
    def reload_conversation(self, conversation: Scope | Mapping[str, Any], *, drop_cache: bool = True) -> None:
        """Read one conversation's working-memory slots and checkpoints from the store again and
        drop cached answers: another process sharing the store may have run it since."""
        self._check_open()
        with self._lock:
            self.layers.reload(conversation, drop_cache=drop_cache)

    def working_slots(self, conversation: Scope | Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
        """Working-memory slots of every conversation, or of one, with their priority parts and checkpoints.
        One conversation's are read from the store (another process may have changed them)."""
        self._check_open()
        if Scope.of(conversation).channel is not None:
            self.reload_conversation(Scope.of(conversation), drop_cache=False)
        return self.layers.working_slots(conversation)

    def refresh(self) -> None:
        """Hear now what other processes committed; the events kept of blocks no longer live are redacted."""
        self._writes.refresh()

    def stm_entries(self, conversation: Scope | Mapping[str, Any] | None = None,
                    limit: int = 1000) -> list[dict[str, Any]]:
        """Live short-term memory entries, newest first (every conversation, or one)."""
        self._check_open()
        return self.layers.stm_entries(conversation, limit)

    def layer_stats(self) -> dict[str, Any]:
        """Per-layer counters and hit rates, working memory, STM, cache and checkpoints."""
        return self.layers.statistics()

    # -- the whole memory ---------------------------------------------------------------------
    def stats(self) -> Stats:
        self._check_open()
        counts = self.store.counts()
        return Stats(path=self.location, blocks=counts["blocks"], live_blocks=counts["blocks"] - counts["forgotten"],
                     forgotten_blocks=counts["forgotten"], by_kind=counts["by_kind"], channels=counts["channels"],
                     embedder=self.store.get_meta("embedder") or f"{self._embedder_spec} (not used yet)",
                     dimension=self.indexes.dimension or 0, vector_index=self.indexes.vector_kind,
                     schema_version=self.store.schema_version(), file_bytes=self.store.size_bytes(),
                     passages=recorded_recipe(self.store) or "", passages_configured=settings_recipe(self.settings))

    def verify(self) -> VerifyReport:
        self._check_open()
        return self.store.verify()

    def __len__(self) -> int:
        return self.store.last_block_index()

    def iter_blocks(self) -> Iterator[Block]:
        self._check_open()
        return self.store.iter_blocks()

    def export_lines(self) -> Iterator[str]:
        """The export as lines: a header, then every block in index order, tombstones too."""
        self._check_open()
        return transfer.export_lines(self.store)

    def export_jsonl(self, out: str | os.PathLike[str] | IO[str], *, progress: Progress | None = None) -> int:
        """Stream every block (tombstones included) as JSON lines; returns the count."""
        self._check_open()
        return transfer.export_jsonl(self.store, out, progress)

    def import_jsonl(self, source: str | os.PathLike[str] | IO[str], *, progress: Progress | None = None) -> int:
        """Read an export: checked whole before anything is written (`transfer.import_jsonl`)."""
        self._check_open()
        return transfer.import_jsonl(self._writes, source, progress)
