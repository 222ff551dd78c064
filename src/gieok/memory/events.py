"""What a memory tells whoever listens: blocks added, promoted and forgotten, searches answered.

The server's live event stream (and a bot publishing to a shared stream) sets `listener`; with
nobody listening nothing is built. An event carries enough of a block's text to recognise it,
never a copy of it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from ..types import Block, SearchResult, scores_as_sent

__all__ = ["EventListener", "ErasedElsewhere", "MemoryEvents", "EVENT_TEXT_CHARS", "block_event", "search_event"]

log = logging.getLogger("gieok.memory")

EventListener = Callable[[str, dict[str, Any]], None]  # (event type, data)
# Blocks another process erased (None: which, this one cannot tell), and a function that says which of
# some block indices are forgotten: what a stream of this process's own redacts with (`erased_elsewhere`)
ErasedElsewhere = Callable[[Sequence[int] | None, Callable[[Sequence[int]], list[int]]], None]
EVENT_TEXT_CHARS = 300  # text shown in an event: enough to recognise a block, not a copy of it


class MemoryEvents:
    """One memory's outlet. A failing listener is logged and never fails the operation that emitted."""

    def __init__(self) -> None:
        self.listener: EventListener | None = None
        self.on_erased_elsewhere: ErasedElsewhere | None = None

    @property
    def active(self) -> bool:
        return self.listener is not None

    def emit(self, kind: str, data: dict[str, Any]) -> None:
        listener = self.listener
        if listener is None:
            return
        try:
            listener(kind, data)
        except Exception:
            log.exception("event listener failed on %s", kind)

    def erased_elsewhere(self, block_indices: Sequence[int] | None,
                         forgotten_among: Callable[[Sequence[int]], list[int]]) -> None:
        """Another process of the memory erased blocks: a stream this process keeps of its own (a
        server worker without Redis) redacts its events of them, as the erasing process did its own."""
        hook = self.on_erased_elsewhere
        if hook is None:
            return
        try:
            hook(block_indices, forgotten_among)
        except Exception:
            log.exception("redacting the events of blocks erased elsewhere failed")


def block_event(block: Block) -> dict[str, Any]:
    return {"block_index": block.block_index, "kind": block.kind, "scope": block.scope.as_dict(),
            "speaker": block.speaker, "importance": block.importance, "text": block.text[:EVENT_TEXT_CHARS]}


def search_event(result: SearchResult, k: int) -> dict[str, Any]:
    top = result.hits[:5]
    return {
        "query": result.query[:EVENT_TEXT_CHARS], "k": k, "source": result.source, "found": len(result.hits),
        "search_time_ms": round(result.search_time_ms, 3), "embed_time_ms": round(result.embed_time_ms, 3),
        "hits": [{"block_index": h.block.block_index, "score": score, "breakdown": breakdown,
                  "text": h.block.text[:EVENT_TEXT_CHARS]}
                 for h, (score, breakdown) in zip(top, scores_as_sent([(h.score, h.breakdown) for h in top]))],
    }
