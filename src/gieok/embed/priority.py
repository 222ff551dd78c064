"""How urgent an embedding is: a turn waiting for its answer, a prefetch, or write-behind.

The priority is read from a context variable, so the code that knows why it embeds says so
(`with embedding_priority(Priority.LATER): ...`) without threading a parameter through the
memory API; `asyncio.to_thread` carries it into worker threads. Unmarked calls are `NOW`.
The scheduler (scheduler.py) orders its queue by it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from enum import IntEnum

__all__ = ["Priority", "embedding_priority", "current_priority"]


class Priority(IntEnum):
    NOW = 0  # someone is waiting for this answer
    SOON = 1  # prefetch: needed when a debounce ends
    LATER = 2  # write-behind: block vectors after a reply went out


_priority: ContextVar[Priority] = ContextVar("gieok_embedding_priority", default=Priority.NOW)


@contextmanager
def embedding_priority(level: Priority) -> Iterator[None]:
    """`with embedding_priority(Priority.LATER):` marks the embeddings asked for inside it."""
    token = _priority.set(level)
    try:
        yield
    finally:
        _priority.reset(token)


def current_priority() -> Priority:
    return _priority.get()
