"""How urgent an embedding is: a turn waiting for its answer, a prefetch, write-behind, or bulk.

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

__all__ = ["Priority", "embedding_priority", "current_priority", "bulk_priority", "BULK_MIN_TEXTS"]


class Priority(IntEnum):
    NOW = 0  # someone is waiting for this answer
    SOON = 1  # prefetch: needed when a debounce ends
    LATER = 2  # write-behind: block vectors after a reply went out
    BULK = 3  # many texts at once (imports, big `add_many`s, reindex): every core, when nothing above waits


# A request of more texts than this is bulk work (`bulk_priority`): one urgent engine call of the
# scheduler holds at most this many texts, so a bigger request would hold up every turn behind it.
BULK_MIN_TEXTS = 32


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


def bulk_priority(count: int) -> Priority:
    """The priority of embedding `count` texts for a write: `BULK` for more than `BULK_MIN_TEXTS`
    (the write then yields to every query and reply, and every engine works on it), else the
    caller's own."""
    return Priority.BULK if count > BULK_MIN_TEXTS else current_priority()
