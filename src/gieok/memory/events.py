"""What a memory tells whoever listens: blocks added, promoted and forgotten, searches answered.

The server's live event stream (and a bot publishing to a shared stream) sets `listener`; with
nobody listening nothing is built. An event carries enough of a block's text to recognise it,
never a copy of it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from ..types import Block, SearchResult, scores_as_sent

__all__ = ["EventListener", "MemoryEvents", "EVENT_TEXT_CHARS", "block_event", "search_event"]

log = logging.getLogger("gieok.memory")

EventListener = Callable[[str, dict[str, Any]], None]  # (event type, data)
EVENT_TEXT_CHARS = 300  # text shown in an event: enough to recognise a block, not a copy of it


class MemoryEvents:
    """One memory's outlet. A failing listener is logged and never fails the operation that emitted."""

    def __init__(self) -> None:
        self.listener: EventListener | None = None

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


def block_event(block: Block) -> dict[str, Any]:
    return {"block_index": block.block_index, "kind": block.kind, "scope": block.scope.as_dict(),
            "speaker": block.speaker, "importance": block.importance, "text": block.text[:EVENT_TEXT_CHARS]}


def search_event(result: SearchResult, k: int) -> dict[str, Any]:
    top = result.hits[:5]
    return {
        "query": result.query[:EVENT_TEXT_CHARS], "k": k, "source": result.source,
        "search_time_ms": round(result.search_time_ms, 3), "embed_time_ms": round(result.embed_time_ms, 3),
        "hits": [{"block_index": h.block.block_index, "score": score, "breakdown": breakdown,
                  "text": h.block.text[:EVENT_TEXT_CHARS]}
                 for h, (score, breakdown) in zip(top, scores_as_sent([(h.score, h.breakdown) for h in top]))],
    }
