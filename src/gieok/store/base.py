"""The Store port. All SQL lives behind it, so a PostgreSQL+pgvector backend can be
added without touching the engine (`memory.py`, `retrieval/`, `index/`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from ..types import Block, Scope

__all__ = ["Store", "NewBlock", "IndexRows", "BM25Filter", "VerifyReport"]


@dataclass(slots=True)
class NewBlock:
    """A block before the store has given it an index, a position and a hash."""

    kind: str
    text: str
    scope: Scope
    speaker: str | None
    event_time: float
    importance: float
    keywords: list[str]
    tags: list[str]
    metadata: dict[str, Any]
    tokens: list[str]


@dataclass(slots=True)
class IndexRows:
    """Column arrays the in-memory catalog and vector index are built from."""

    block_index: np.ndarray  # int64
    kind: list[str]
    guild: list[str | None]
    channel: list[str | None]
    user: list[str | None]
    event_time: np.ndarray  # float64
    importance: np.ndarray  # float32
    conv_pos: np.ndarray  # int64, -1 where none
    alive: np.ndarray  # bool
    vectors: np.ndarray  # float32 (n, dim); zeros for forgotten blocks

    def __len__(self) -> int:
        return int(self.block_index.shape[0])


@dataclass(slots=True)
class BM25Filter:
    scope: Scope = field(default_factory=Scope)
    kinds: tuple[str, ...] = ()
    since: float | None = None
    until: float | None = None


@dataclass(slots=True)
class VerifyReport:
    ok: bool
    checked: int
    forgotten: int
    first_bad_index: int | None = None
    reason: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "checked": self.checked,
            "forgotten": self.forgotten,
            "first_bad_index": self.first_bad_index,
            "reason": self.reason,
        }


class Store(Protocol):
    path: str

    def close(self) -> None: ...

    # metadata (schema version, embedder name and dimension)
    def get_meta(self, key: str) -> str | None: ...

    def set_meta(self, items: dict[str, str]) -> None: ...

    # writes: each call is one transaction
    def append(self, blocks: Sequence[NewBlock], vectors: np.ndarray, insert_time: float) -> list[Block]: ...

    def append_exact(self, blocks: Sequence[Block], tokens: Sequence[list[str]], vectors: np.ndarray) -> None: ...

    def forget(self, block_indices: Sequence[int], when: float) -> list[int]: ...

    def reembed(self, block_indices: Sequence[int], vectors: np.ndarray, meta: dict[str, str]) -> None: ...

    # reads
    def get_many(self, block_indices: Sequence[int]) -> dict[int, Block]: ...

    def iter_blocks(self, batch: int = 1000) -> Iterator[Block]: ...

    def bm25(self, tokens: Sequence[str], filt: BM25Filter, limit: int) -> list[tuple[int, float]]: ...

    def load_index_rows(self, after_block_index: int, dimension: int) -> IndexRows: ...

    def load_tokens(self, after_block_index: int) -> list[tuple[int, str]]: ...

    def forgotten_indices(self) -> set[int]: ...

    def last_block_index(self) -> int: ...

    def counts(self) -> dict[str, Any]: ...

    def change_token(self) -> int: ...

    def verify(self) -> VerifyReport: ...
