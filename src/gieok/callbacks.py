"""Callbacks from a memory's parts back to their owner, without reference cycles.

The parts of a `Memory` call back into it (a promoted slot is written as a note, a foreign change
drops the answer cache, a write asks whether the memory is still open). A bound method or a
lambda over `self` makes a cycle, and CPython frees a cycle only when its cycle collector next
runs a full pass: a closed memory — with its catalog, vectors and postings, megabytes or
gigabytes — stayed in memory until then. A server that opens and closes tenants in turn
(`server_open_tenants`) grew by every tenant it closed until the collector ran (~60 KB a small
PostgreSQL tenant, ~1.8 MB a small SQLite one; `tests/test_memory_lifecycle.py`). A callback made by
`weakly` holds its owner weakly, so a closed memory is freed as soon as nothing else holds it.

And the one callback from an erasure to every layer: function caches whose keys hold stored text
(a message, a fact, a name) are marked `@cleared_on_erasure`, and every erasure clears them
(memory/writes.py `forget`), so an erased text does not stay in memory as a cache key.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import ParamSpec, TypeVar

from .errors import InvalidInputError

__all__ = ["weakly", "cleared_on_erasure", "clear_caches_of_erased_text"]

P = ParamSpec("P")
R = TypeVar("R")
C = TypeVar("C", bound=Callable[..., object])

_TEXT_CACHES: list[Callable[[], None]] = []  # cache_clear of each function marked @cleared_on_erasure


def cleared_on_erasure(cached: C) -> C:
    """Mark a `functools.lru_cache` function whose keys hold stored text: every erasure clears it
    (`clear_caches_of_erased_text`). Put it above `@lru_cache`."""
    _TEXT_CACHES.append(cached.cache_clear)  # type: ignore[attr-defined]
    return cached


def clear_caches_of_erased_text() -> None:
    """Empty every cache marked `@cleared_on_erasure` (they fill again as they are used)."""
    for clear in _TEXT_CACHES:
        clear()


def weakly(method: Callable[P, R]) -> Callable[P, R]:
    """`method` (a bound method) as a callable that does not keep its object alive; called once
    the object is gone, it raises `InvalidInputError` (the memory it belonged to was closed)."""
    ref = weakref.WeakMethod(method)  # a bound method, by contract
    name = getattr(method, "__qualname__", "a memory's callback")

    def call(*args: P.args, **kwargs: P.kwargs) -> R:
        bound = ref()
        if bound is None:
            raise InvalidInputError(f"this Memory is closed ({name} has no memory to call back)")
        result: R = bound(*args, **kwargs)
        return result

    call.__qualname__ = f"weakly({name})"
    return call
