"""Search-result cache: LRU with a TTL, keyed by scope and normalised query.

It must never answer with results older than a write that could change them. Every
write bumps a generation counter for each of the 8 scope patterns its block matches
((guild|*) × (channel|*) × (user|*)); an entry remembers the generation of its own
search scope and is stale as soon as that counter moves. Writes elsewhere don't evict it.
"""

from __future__ import annotations

import re
import threading
import time
import unicodedata
from collections import OrderedDict
from dataclasses import dataclass
from itertools import product
from typing import Any

from ..types import Scope
from .working import Clock

__all__ = ["SearchCache", "normalise_query"]

_SPACE = re.compile(r"\s+")


def normalise_query(query: str) -> str:
    return _SPACE.sub(" ", unicodedata.normalize("NFKC", query).casefold()).strip(" ?!.,~")


def _patterns(scope: Scope) -> list[tuple[str | None, str | None, str | None]]:
    guilds, channels, users = ((v, None) if v is not None else (None,)
                               for v in (scope.guild, scope.channel, scope.user))
    return list(product(guilds, channels, users))


@dataclass
class _Entry:
    value: Any
    generation: int
    expires: float


class SearchCache:
    """LRU of search results per (normalised query, scope, options), with a TTL; every write to a
    scope bumps generations so a cached answer is never stale."""

    def __init__(self, max_entries: int = 512, ttl_seconds: float = 300.0, clock: Clock = time.time) -> None:
        self.max_entries = max_entries
        self.ttl = ttl_seconds
        self.clock = clock
        self._entries: OrderedDict[tuple, _Entry] = OrderedDict()
        self._generations: dict[tuple, int] = {}
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0
        self.invalidations = 0

    def _generation(self, scope: Scope) -> int:
        return self._generations.get((scope.guild, scope.channel, scope.user), 0)

    def key(self, scope: Scope, query: str, *extra: Any) -> tuple:
        return ((scope.guild, scope.channel, scope.user), normalise_query(query), *extra)

    def get(self, scope: Scope, key: tuple) -> Any | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None or entry.expires < self.clock() or entry.generation != self._generation(scope):
                if entry is not None:
                    del self._entries[key]
                self.misses += 1
                return None
            self._entries.move_to_end(key)
            self.hits += 1
            return entry.value

    def put(self, scope: Scope, key: tuple, value: Any) -> None:
        if self.max_entries <= 0:
            return
        with self._lock:
            self._entries[key] = _Entry(value, self._generation(scope), self.clock() + self.ttl)
            self._entries.move_to_end(key)
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)

    def invalidate(self, block_scope: Scope) -> None:
        """A block in `block_scope` was written, forgotten or promoted."""
        with self._lock:
            for pattern in _patterns(block_scope):
                self._generations[pattern] = self._generations.get(pattern, 0) + 1
            self.invalidations += 1

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self.invalidations += 1

    def statistics(self) -> dict[str, Any]:
        with self._lock:
            total = self.hits + self.misses
            return {"entries": len(self._entries), "hits": self.hits, "misses": self.misses,
                    "hit_rate": self.hits / total if total else 0.0, "invalidations": self.invalidations}
