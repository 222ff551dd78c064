"""How blocks reach the store, and leave it. A write embeds outside the memory's lock (the slow
part), then commits in one transaction under it; the indexes take the new rows, cached answers of
the scopes it touched are dropped, and listeners hear of it. A turn is embedded as a passage with
the turns just before it in its channel (`retrieval/passages.py`), read from what is already
stored. `forget` erases blocks' content the same way: under the lock, then indexes, layers, events."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from contextlib import closing
from typing import Any

import numpy as np

from ..callbacks import clear_caches_of_erased_text, weakly
from ..config import Settings
from ..embed import CachedEmbedder, bulk_priority, embed_ahead
from ..errors import BlockNotFoundError
from ..retrieval.passages import PassageContext, PassageSource
from ..store.base import AppendHook, NewBlock, Store
from ..text.tokenize import Tokenizer
from ..types import Block
from . import ingest
from .embedding import embed_passages
from .events import MemoryEvents, block_event
from .indexes import MemoryIndexes
from .layered import LayerStack

__all__ = ["WritePath", "WRITE_CHUNK", "Progress"]

WRITE_CHUNK = 256  # blocks per transaction of a write in chunks (add_many, an import)
Progress = Callable[[int], None]  # called with the number of items just finished


class WritePath:
    """The writes of one memory: its store, indexes, layers, events and lock.

    It is also all an import into the memory (`transfer.py`) is handed, instead of the facade:
    `store`, `settings`, `tokenizer`, `embedder()` (the memory's, loaded and recorded on first
    call), `prepare` / `prepare_many`, `write_chunked`, `passage_context` and `append_exact`."""

    def __init__(self, store: Store, settings: Settings, tokenizer: Tokenizer, indexes: MemoryIndexes,
                 layers: LayerStack, events: MemoryEvents, lock: threading.RLock,
                 embedder: Callable[[], CachedEmbedder], check_open: Callable[[], None],
                 loaded_embedder: Callable[[], CachedEmbedder | None]) -> None:
        self.store = store
        self.settings = settings
        self.tokenizer = tokenizer
        self.indexes = indexes
        self.layers = layers
        self.events = events
        self.lock = lock
        self.embedder = embedder
        self.check_open = check_open
        self.loaded_embedder = loaded_embedder  # the embedder if loaded (erasing needs no model)
        indexes.on_erased_elsewhere = weakly(self._erased_elsewhere)

    def prepare(self, text: Any, **fields: Any) -> NewBlock:
        """One item checked and made ready to write (`ingest.prepare` with this memory's settings)."""
        return ingest.prepare(self.settings, self.tokenizer, text, **fields)

    def prepare_many(self, items: Iterable[str | Mapping[str, Any]]) -> list[NewBlock]:
        """Every item checked before any is written (`ingest.prepare_many`)."""
        return ingest.prepare_many(self.settings, self.tokenizer, items)

    def passage_context(self) -> PassageContext:
        s = self.settings
        return PassageContext(s.embed_context_turns, s.embed_context_gap_seconds, self._earlier_turns,
                              s.embed_context_words)

    def _earlier_turns(self, channel: str) -> list[PassageSource]:
        """The channel's last stored turns, oldest first (forgotten ones with no text)."""
        with self.lock:
            self.indexes.sync()
            indices = self.indexes.last_turns(channel, self.settings.embed_context_turns)
        found = self.store.get_many(indices)
        return [ingest.passage_source(b) for b in (found[i] for i in indices if i in found)]

    def embed_passages(self, texts: Sequence[str]) -> np.ndarray:
        return embed_passages(self.embedder(), texts, self.settings.embed_batch_size)

    def write(self, blocks: list[NewBlock], vectors: np.ndarray | None = None,
              within: AppendHook | None = None) -> list[Block]:
        if vectors is None:
            vectors = self.embed_passages(self.passage_context().texts_for(
                [ingest.new_passage_source(b) for b in blocks]))
        with self.lock:
            self.check_open()
            self.indexes.sync()
            written = self.store.append(blocks, vectors, insert_time=time.time(), within=within)
            self.indexes.after_append(written, vectors, [b.tokens for b in blocks])
            self.indexes.noted()
            self.layers.invalidate(b.scope for b in written)
            erased_before = self._erased_context(written)
        if self.events.active:
            self.events.emit("memory.added", {"blocks": [block_event(b) for b in written]})
        if erased_before:
            self.refresh_passages(erased_before)
        return written

    def _erased_context(self, written: list[Block]) -> list[Block]:
        """Forgotten turns just before turns this write stored (within `embed_context_turns` in their
        channel). A turn's passage is made before it is stored — by this write, or by a caller that
        embeds ahead (`passage_texts`) — and an erasure may come in between: its passage then held the
        erased words, and the erasure's own refresh (`refresh_passages`), which looked for the turns
        after the erased one right after the forget, did not see this one yet. Only the first turns
        of each channel in a write can have a stored turn in their context."""
        turns = self.settings.embed_context_turns
        if turns <= 0:
            return []
        firsts: dict[str, list[Block]] = {}
        for block in written:
            if block.kind == "turn" and block.conv_pos is not None and block.scope.channel is not None:
                first = firsts.setdefault(block.scope.channel, [])
                if len(first) < turns:
                    first.append(block)
        mine = [block for first in firsts.values() for block in first]
        if not mine:
            return []
        near = {i for block in mine for i, _ in self.indexes.neighbours_of(block.block_index, turns)}
        when = {(block.scope.channel, block.conv_pos): block.event_time for block in mine}
        gap = self.settings.embed_context_gap_seconds  # a turn further back was never in the passage

        def was_context(b: Block) -> bool:
            return any(abs(when.get((b.scope.channel, (b.conv_pos or 0) + step), float("inf")) - b.event_time) <= gap
                       for step in range(1, turns + 1))

        return [b for b in self.store.get_many(sorted(near)).values()
                if b.forgotten and b.kind == "turn" and b.conv_pos is not None and was_context(b)]

    def write_chunked(self, prepared: list[NewBlock], vectors: np.ndarray | None,
                      progress: Progress | None, *, within: AppendHook | None = None) -> list[Block]:
        """Many blocks, each chunk of `WRITE_CHUNK` one transaction (`within` runs in each). Without
        `vectors`, the passage texts of every block are made first (a turn with the turns before it,
        as `write` would) and embedded ahead of the commits — more than `BULK_MIN_TEXTS` as bulk
        work, on every engine, yielding to queries and replies."""
        out: list[Block] = []
        with closing(self._chunks(prepared, vectors)) as chunks:
            for chunk, chunk_vectors in chunks:
                out.extend(self.write(chunk, chunk_vectors, within))
                if progress:
                    progress(len(chunk))
        return out

    def _chunks(self, prepared: list[NewBlock],
                vectors: np.ndarray | None) -> Generator[tuple[list[NewBlock], np.ndarray], None, None]:
        starts = range(0, len(prepared), WRITE_CHUNK)
        if not prepared:
            return
        if vectors is not None:
            yield from ((prepared[s : s + WRITE_CHUNK], vectors[s : s + WRITE_CHUNK]) for s in starts)
            return
        texts = self.passage_context().texts_for([ingest.new_passage_source(b) for b in prepared])
        with closing(embed_ahead(self.embedder(), ((prepared[s : s + WRITE_CHUNK], texts[s : s + WRITE_CHUNK])
                                                   for s in starts),
                                 self.settings.embed_batch_size, priority=bulk_priority(len(texts)))) as ahead:
            yield from ahead

    def append_exact(self, chunk: list[Block], tokens: list[list[str]], vectors: np.ndarray) -> None:
        """Blocks of an export into an empty memory, with their indices and hashes (transfer.py)."""
        with self.lock:
            self.store.append_exact(chunk, tokens, vectors)
            self.indexes.catch_up()
            self.indexes.noted()
            self.layers.invalidate(b.scope for b in chunk)

    def erase(self, indices: list[int], texts: Sequence[str] = ()) -> tuple[list[int], list[int]]:
        """`forget`, then `refresh_passages` of what it erased: (erased, re-embedded). `texts`: erased
        messages that never became blocks (a conversation's recent messages whose turns were still to
        be written), dropped from the caches as a forgotten block's text is."""
        before = [b for b in self.store.get_many(indices).values() if not b.forgotten]
        erased = set(self.forget(indices, texts))
        return sorted(erased), self.refresh_passages([b for b in before if b.block_index in erased])

    def refresh_passages(self, erased: Sequence[Block]) -> list[int]:
        """The turns whose vectors were embedded with these erased turns as their context (the next
        `embed_context_turns` of each one's channel) embedded again, without them: an erased
        message's words must not live on in its neighbour's vector. Returns the blocks refreshed."""
        turns = self.settings.embed_context_turns
        if turns <= 0:
            return []
        with self.lock:
            self.indexes.sync()
            around = {i for block in erased if block.kind == "turn" and block.conv_pos is not None
                      for i, _ in self.indexes.neighbours_of(block.block_index, turns)}
        near = self.store.get_many(sorted(around | {b.block_index for b in erased}))
        positions = {(b.scope.channel, b.conv_pos) for b in erased if b.conv_pos is not None}
        targets = [b for b in near.values() if not b.forgotten and b.kind == "turn" and b.conv_pos is not None
                   and any((b.scope.channel, b.conv_pos - step) in positions for step in range(1, turns + 1))]
        if not targets:
            return []
        texts = []
        for block in targets:
            with self.lock:
                earlier = [i for i, _ in self.indexes.neighbours_of(block.block_index, turns)]
            before = sorted((b for b in self.store.get_many(earlier).values()
                             if b.kind == "turn" and b.conv_pos is not None and b.conv_pos < (block.conv_pos or 0)),
                            key=lambda b: b.conv_pos or 0)
            sources = [ingest.passage_source(b) for b in before]
            context = PassageContext(turns, self.settings.embed_context_gap_seconds,
                                     lambda _, sources=sources: sources,  # type: ignore[misc]
                                     self.settings.embed_context_words)
            texts.append(context.text_for(ingest.passage_source(block)))
        vectors = self.embed_passages(texts)
        indices = [b.block_index for b in targets]
        with self.lock:
            self.store.replace_vectors(indices, vectors)
            self.indexes.replace_vectors(indices, vectors)
            self.indexes.noted()
            self.layers.invalidate(b.scope for b in targets)
        return indices

    def _drop_cached(self, texts: list[str]) -> None:
        """Erased texts out of every cache kept by text, so an erased message does not stay in
        memory as a cache key: the embedder's vectors and those of the caches it forgets alongside
        (`CachedEmbedder.forget_alongside`: the chat guard's encoder) — none when no embedder is
        loaded — and the function caches marked `@cleared_on_erasure`."""
        embedder = self.loaded_embedder()
        if embedder is not None:
            embedder.forget_texts(texts)
        clear_caches_of_erased_text()

    def _erased_elsewhere(self, block_indices: Sequence[int] | None) -> None:
        """Another process erased blocks (`block_indices`; None when this one cannot tell which):
        their working-memory slots go (`LayerStack.erased_elsewhere`), and so does every copy of
        their words this process keeps by text — which texts were erased is not known here any
        more (the store forgot them), so the embedder's caches are emptied whole
        (`CachedEmbedder.forget_everything`), as are the function caches marked
        `@cleared_on_erasure`. Erasures are rare; the caches fill again as they are used."""
        self.layers.erased_elsewhere(block_indices, self._forgotten_among)
        embedder = self.loaded_embedder()
        if embedder is not None:
            embedder.forget_everything()
        clear_caches_of_erased_text()
        self.events.erased_elsewhere(block_indices, self._forgotten_among)

    def refresh(self) -> None:
        """What other processes committed, heard of now (what every read does first), and then the
        events this process keeps of blocks no longer live redacted (`MemoryEvents.erased_elsewhere`
        with None: whichever those are) — a server worker's own stream, about to be replayed, may
        hold blocks erased while this memory was closed (evicted) or before it read again."""
        self.check_open()
        with self.lock:
            self.indexes.sync()
            self.events.erased_elsewhere(None, self._forgotten_among)

    def _forgotten_among(self, block_indices: Sequence[int]) -> list[int]:
        """Those of `block_indices` that are not live (forgotten, or never stored): asked of the
        indexes, which read no text (called from `sync`, under the memory's lock)."""
        live = set(self.indexes.live_among(block_indices, None))
        return [i for i in block_indices if i not in live]

    def forget(self, indices: list[int], texts: Sequence[str] = ()) -> list[int]:
        """Erase the content of blocks (checked indices); `BlockNotFoundError` for one that never was.
        Their copies go with them: the notes working memory promoted from them (a turn's words kept
        when its slot was let go), and notes promoted from those. Their texts, and `texts` (`erase`),
        leave the caches in one pass."""
        with self.lock:
            existing = self.store.get_many(indices)
            missing = [i for i in indices if i not in existing]
            if missing:
                raise BlockNotFoundError(f"no block with index {missing[0]}")
            copies = self.store.notes_promoted_from(indices)
            while copies := [i for i in copies if i not in existing]:
                existing.update(self.store.get_many(copies))
                indices = [*indices, *copies]
                copies = self.store.notes_promoted_from(copies)
            self.indexes.sync()  # what other processes committed first is taken before the token moves past it
            erased = self.store.forget(indices, time.time())
            self.indexes.noted(forgotten=len(erased))
            if erased:  # a kept answer of the write that stored them (`POST /v1/memories`) holds their text
                self.store.idempotency.redact_written(erased)
            self.layers.invalidate(existing[i].scope for i in erased)
            self.layers.drop_copies(sorted(erased))
            self.indexes.erase(erased)
        if erased or texts:
            self._drop_cached([*(existing[i].text for i in erased), *texts])
        if erased:
            self.events.emit("memory.forgotten", {"block_indices": erased})
        return erased
