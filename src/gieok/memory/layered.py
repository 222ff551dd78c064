"""The engine layers of one memory, built together: working memory and STM (with the hybrid
policy between them), checkpoints and the localized search around them, the result cache, and the
coordinator that tries them before a full search — plus the views every front-end shows of them.

Promotion writes to long-term memory, which is the facade's job: the stack is given the
callback that writes a note, and the one that tells listeners.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..callbacks import weakly
from ..config import Settings
from ..index.search_index import BlockLookup
from ..layers.cache import SearchCache
from ..layers.checkpoints import CheckpointManager
from ..layers.coordinator import CoordinatorConfig, SearchCoordinator
from ..layers.localized import LocalizedSearch
from ..layers.stm import HybridSTM, ShortTermMemory
from ..layers.working import Slot, WorkingMemory
from ..store.base import Store
from ..text.tokenize import Tokenizer
from ..types import Block, Scope, scope_from_key
from .events import block_event

if TYPE_CHECKING:
    from .indexes import MemoryIndexes

__all__ = ["LayerStack", "NoteWriter"]

NoteWriter = Callable[[str, Scope, float, dict[str, Any], np.ndarray | None], Block]  # text, scope, importance, …


def _conversation(scope: Scope | Mapping[str, Any] | None) -> Scope:
    chosen = Scope.of(scope)
    return Scope(chosen.guild, chosen.channel)


class LayerStack:
    """Working memory, STM, checkpoints, localized search, cache and coordinator over one store."""

    def __init__(self, store: Store, settings: Settings, tokenizer: Tokenizer, lookup: BlockLookup,
                 write_note: NoteWriter, emit: Callable[[str, dict[str, Any]], None], lock: threading.RLock) -> None:
        s = settings
        self.store = store
        self.write_note = write_note
        self.emit = emit
        # callbacks into this stack held weakly: no cycle keeps a closed memory alive (gieok/callbacks.py)
        self.working = WorkingMemory(store.layers, tokenizer, weakly(self._promote_slot), slots=s.wm_slots,
                                     relevance=s.wm_relevance,
                                     on_slot_freed=weakly(self._slot_freed), lock=lock)
        self.stm = ShortTermMemory(store.layers, tokenizer, weakly(self._promote_entry), ttl_seconds=s.stm_ttl_seconds,
                                   promote_importance=s.stm_promote_importance)
        self.hybrid = HybridSTM(self.working, self.stm, s.stm_mode)
        self.checkpoints = CheckpointManager(store.layers, lookup, max_per_slot=s.max_checkpoints_per_slot,
                                             radius=s.checkpoint_radius, limit=s.localized_search_limit)
        self.localized = LocalizedSearch(self.checkpoints, min_relevance=s.min_relevance_threshold,
                                         min_similarity=s.checkpoint_min_similarity)
        self.cache = SearchCache(s.cache_size, s.cache_ttl_seconds)
        self.coordinator = SearchCoordinator(self.hybrid, self.cache, self.checkpoints, self.localized,
                                             CoordinatorConfig.from_settings(s))

    def follow(self, indexes: MemoryIndexes) -> None:
        """Working-memory slots keep copies of their turns' vectors: they take the vectors `indexes`
        replace. (What the indexes learn was erased elsewhere reaches the slots through the write
        path: `erased_elsewhere`.)"""
        indexes.on_vectors_replaced = weakly(self.working.take_vectors)

    def erased_elsewhere(self, block_indices: Sequence[int] | None,
                         forgotten_among: Callable[[Sequence[int]], list[int]]) -> None:
        """Blocks another process erased: the working-memory slots of them go, never promoted.
        None: some blocks, this process cannot tell which (PostgreSQL's stateless workers keep no
        catalogue) — those of the slots' turns `forgotten_among` says are not live."""
        if block_indices is None:
            held = sorted({slot.block_index for slot in self.working.all_slots() if slot.block_index is not None})
            block_indices = forgotten_among(held) if held else []
        if block_indices:
            self.working.forget_blocks(block_indices)

    def _slot_freed(self, slot: Slot) -> None:
        self.checkpoints.forget_slot(slot)

    def _promote_slot(self, slot: Slot, priority: float, reason: str) -> Block | None:
        """Working memory evicted `slot`: into long-term memory with its provenance — unless the
        turn it mirrors was erased (by another process, before this one heard of it): its words
        are not written again."""
        if slot.block_index is not None:
            source = self.store.get_many([slot.block_index]).get(slot.block_index)
            if source is None or source.forgotten:
                return None
        metadata = dict(slot.metadata)
        metadata["promoted_from"] = {"layer": "working_memory", "slot": slot.slot_id, "priority": round(priority, 6),
                                     "reason": reason, "source_block": slot.block_index,
                                     "usage_count": slot.usage_count}
        block = self.write_note(slot.content, _said_by(scope_from_key(slot.scope_key), metadata), slot.importance,
                                metadata, slot.embedding)
        self.emit("memory.promoted", {"from": "working_memory", "reason": reason, "priority": round(priority, 6),
                                      "block": block_event(block)})
        return block

    def _promote_entry(self, scope: Scope, text: str, importance: float, metadata: dict[str, Any]) -> Block:
        """An important STM entry expired: into long-term memory."""
        block = self.write_note(text, _said_by(scope, metadata), importance, metadata, None)
        self.emit("memory.promoted", {"from": "stm", "reason": "expired", "block": block_event(block)})
        return block

    def feed(self, block: Block, vector: np.ndarray | None) -> None:
        """A turn just stored: into its conversation's working memory and STM."""
        metadata: dict[str, Any] = {"speaker": block.speaker} if block.speaker else {}
        if block.metadata.get("flagged"):  # a prompt that shows the slot marks it as the turn is marked
            metadata["flagged"] = True
        if block.metadata.get("role") == "assistant":  # its speaker is a name, not a user's id
            metadata["role"] = "assistant"
        self.hybrid.add(_conversation(block.scope), block.text, importance=block.importance, embedding=vector,
                        block_index=block.block_index, metadata=metadata or None)

    def invalidate(self, scopes: Iterable[Scope]) -> None:
        for scope in set(scopes):
            self.cache.invalidate(scope)

    def drop_copies(self, erased: list[int]) -> None:
        """Forgotten content must not live on in working memory or STM, nor in the conversation
        tables the store keeps for the chat (L1 rows and facts of erased blocks)."""
        gone = set(erased)
        for slot in self.working.all_slots():
            if slot.block_index in gone:
                self.working.discard(slot)
        self.store.layers.stm_delete_blocks(erased)
        self.store.conversation.l1_delete_blocks(erased)
        self.store.conversation.facts_delete_blocks(erased)

    def reload(self, conversation: Scope | Mapping[str, Any], *, drop_cache: bool) -> None:
        """One conversation's slots and checkpoints read from the store again (another process
        sharing it may have run the conversation since)."""
        chosen = _conversation(conversation)
        self.working.reload(chosen)
        self.checkpoints.reload(chosen)
        if drop_cache:
            self.cache.clear()

    def working_slots(self, conversation: Scope | Mapping[str, Any] | None) -> list[dict[str, Any]]:
        scope = Scope.of(conversation)
        chosen = self.working.slots(_conversation(scope)) if scope.channel is not None else self.working.all_slots()
        now = self.working.clock()
        return [slot.as_dict(self.working.priority_parts(slot, now=now),
                             [c.as_row() for c in self.checkpoints.get(slot)])
                for slot in sorted(chosen, key=lambda s: (s.scope_key, s.slot_id))]

    def stm_entries(self, conversation: Scope | Mapping[str, Any] | None, limit: int) -> list[dict[str, Any]]:
        scope = Scope.of(conversation)
        chosen = _conversation(scope) if scope.channel is not None else None
        now = self.stm.clock()
        return [self.stm.describe(entry, now) for entry in self.stm.entries(chosen, limit)]

    def statistics(self) -> dict[str, Any]:
        stats = self.coordinator.statistics()
        stats["hybrid_stm"] = self.hybrid.statistics()
        return stats


def _said_by(scope: Scope, metadata: Mapping[str, Any]) -> Scope:
    """A promoted note's scope: its conversation's, with the user whose turn it copies — a note is
    that user's data as the turn was (their erasure reaches it)."""
    speaker = metadata.get("speaker")
    if metadata.get("role") == "assistant" or not isinstance(speaker, str) or not speaker:
        return scope
    return Scope(scope.guild, scope.channel, speaker)
