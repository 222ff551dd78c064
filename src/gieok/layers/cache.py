"""Search-result cache: LRU with a TTL, keyed by scope and normalised query.

It must never answer with results older than a write that could change them. A write drops
every entry whose search scope matches its block (the 8 scope patterns (guild|*) × (channel|*)
× (user|*)); writes elsewhere don't evict it. Dropping them at once, rather than marking them
stale, matters under load: chat queries rarely repeat and every turn writes to its channel, so a
stale entry would otherwise hold a whole result's blocks until the LRU pushed it out (a serve
worker kept `cache_size` dead results that way, issue 43), and a counter per scope pattern ever
written would be kept for every conversation ever seen.
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

ScopeKey = tuple[str | None, str | None, str | None]


def normalise_query(query: str) -> str:
    return _SPACE.sub(" ", unicodedata.normalize("NFKC", query).casefold()).strip(" ?!.,~")


def _patterns(scope: Scope) -> list[ScopeKey]:
    guilds, channels, users = ((v, None) if v is not None else (None,)
                               for v in (scope.guild, scope.channel, scope.user))
    return list(product(guilds, channels, users))


@dataclass
class _Entry:
    value: Any
    expires: float


class SearchCache:
    """LRU of search results per (normalised query, scope, options), with a TTL; a write to a
    scope drops the entries it could change, so a cached answer is never stale."""

    def __init__(self, max_entries: int = 512, ttl_seconds: float = 300.0, clock: Clock = time.time) -> None:
        self.max_entries = max_entries
        self.ttl = ttl_seconds
        self.clock = clock
        self._entries: OrderedDict[tuple, _Entry] = OrderedDict()
        self._by_scope: dict[ScopeKey, set[tuple]] = {}  # a search scope -> its entries' keys (no empty sets)
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0
        self.invalidations = 0

    def key(self, scope: Scope, query: str, *extra: Any) -> tuple:
        return ((scope.guild, scope.channel, scope.user), normalise_query(query), *extra)

    def __len__(self) -> int:
        return len(self._entries)

    def scopes_tracked(self) -> int:
        """Search scopes with an entry now: what the cache keeps per conversation."""
        return len(self._by_scope)

    def _drop(self, key: tuple) -> None:
        """Under the lock."""
        del self._entries[key]
        keys = self._by_scope[key[0]]
        keys.discard(key)
        if not keys:
            del self._by_scope[key[0]]

    def get(self, scope: Scope, key: tuple) -> Any | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None or entry.expires < self.clock():
                if entry is not None:
                    self._drop(key)
                self.misses += 1
                return None
            self._entries.move_to_end(key)
            self.hits += 1
            return entry.value

    def put(self, scope: Scope, key: tuple, value: Any) -> None:
        if self.max_entries <= 0:
            return
        with self._lock:
            now = self.clock()
            self._entries[key] = _Entry(value, now + self.ttl)
            self._entries.move_to_end(key)
            self._by_scope.setdefault(key[0], set()).add(key)
            # the oldest first: expired ones hold results no one can be answered with
            while len(self._entries) > self.max_entries or next(iter(self._entries.values())).expires < now:
                self._drop(next(iter(self._entries)))

    def invalidate(self, block_scope: Scope) -> None:
        """A block in `block_scope` was written, forgotten or promoted."""
        with self._lock:
            for pattern in _patterns(block_scope):
                for key in self._by_scope.pop(pattern, ()):
                    del self._entries[key]
            self.invalidations += 1

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._by_scope.clear()
            self.invalidations += 1

    def statistics(self) -> dict[str, Any]:
        with self._lock:
            total = self.hits + self.misses
            return {"entries": len(self._entries), "hits": self.hits, "misses": self.misses,
                    "hit_rate": self.hits / total if total else 0.0, "invalidations": self.invalidations}
