"""The tables of the fast layers (schema v2): working-memory slots, their checkpoints into
long-term blocks, and short-term memory entries.

`LayerStore` is the port the layers (`layers/working.py`, `stm.py`, `checkpoints.py`) are
written against; `LayerTables` implements it once in portable SQL over any `SqlSession`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Protocol, TypedDict

import numpy as np

from .sql import SqlSession, SqlWriter

__all__ = ["SlotRow", "CheckpointRow", "STMEntry", "LayerStore", "LayerTables", "slots_follow_vectors"]


class SlotRow(TypedDict):
    """One working-memory slot as stored (`Slot.as_row`)."""

    scope_key: str
    slot_id: int
    context: str
    content: str
    metadata: dict[str, Any]
    embedding: np.ndarray | None
    importance: float
    usage_count: int
    created_at: float
    last_access: float
    block_index: int | None
    context_hash: str


class CheckpointRow(TypedDict):
    """One anchor of a slot into long-term memory (`Checkpoint.as_row`, plus its slot when loaded)."""

    block_index: int
    relevance: float
    distance: float
    created_at: float
    last_accessed: float


class StoredCheckpoint(CheckpointRow):
    scope_key: str
    slot_id: int


class STMEntry(TypedDict):
    """A short-term memory entry."""

    entry_id: int
    scope_key: str
    text: str
    metadata: dict[str, Any]
    importance: float
    created_at: float
    expires_at: float
    block_index: int | None


class LayerStore(Protocol):
    """Persistence of working memory, checkpoints and STM. Each write is one transaction."""

    def load_slots(self, scope_key: str | None = None) -> list[SlotRow]: ...

    def save_slot(self, slot: SlotRow, checkpoints: Sequence[CheckpointRow] | None = None, *,
                  held: bool = False) -> bool: ...

    def delete_slot(self, scope_key: str, slot_id: int) -> None: ...

    def load_checkpoints(self, scope_key: str | None = None) -> list[StoredCheckpoint]: ...

    def touch_checkpoints(self, scope_key: str, slot_id: int, when: float) -> None: ...

    def stm_add(self, scope_key: str, text: str, metadata: dict[str, Any], importance: float, created_at: float,
                expires_at: float, block_index: int | None) -> int: ...

    def stm_entries(self, scope_key: str | None, now: float, limit: int = 1000) -> list[STMEntry]: ...

    def stm_take_expired(self, now: float) -> list[STMEntry]: ...

    def stm_delete_blocks(self, block_indices: Sequence[int]) -> None: ...

    def stm_count(self) -> int: ...


_SLOT_COLUMNS = ("scope_key", "slot_id", "context", "content", "metadata", "embedding", "importance",
                 "usage_count", "created_at", "last_access", "block_index", "context_hash")
_CHECKPOINT_COLUMNS = ("scope_key", "slot_id", "block_index", "relevance", "distance", "created_at",
                       "last_accessed")
_STM_COLUMNS = ("entry_id", "scope_key", "text", "metadata", "importance", "created_at", "expires_at",
                "block_index")


def _slot(row: tuple[Any, ...]) -> SlotRow:
    (scope_key, slot_id, context, content, metadata, blob, importance, usage_count, created_at, last_access,
     block_index, context_hash) = row
    return SlotRow(scope_key=scope_key, slot_id=int(slot_id), context=context, content=content,
                   metadata=json.loads(metadata),
                   embedding=np.frombuffer(bytes(blob), dtype="<f4").copy() if blob is not None else None,
                   importance=float(importance), usage_count=int(usage_count), created_at=float(created_at),
                   last_access=float(last_access), block_index=block_index, context_hash=context_hash)


def _stm(row: tuple[Any, ...]) -> STMEntry:
    entry_id, scope_key, text, metadata, importance, created_at, expires_at, block_index = row
    return STMEntry(entry_id=int(entry_id), scope_key=scope_key, text=text, metadata=json.loads(metadata),
                    importance=float(importance), created_at=float(created_at), expires_at=float(expires_at),
                    block_index=block_index)


class LayerTables:
    """`LayerStore` in SQL that SQLite and PostgreSQL both speak."""

    def __init__(self, db: SqlSession) -> None:
        self.db = db

    # -- working memory and checkpoints ---------------------------------------------------
    def load_slots(self, scope_key: str | None = None) -> list[SlotRow]:
        sql = f"SELECT {', '.join(_SLOT_COLUMNS)} FROM wm_slots"
        params: tuple[Any, ...] = ()
        if scope_key is not None:
            sql += " WHERE scope_key = ?"
            params = (scope_key,)
        return [_slot(row) for row in self.db.fetch(sql + " ORDER BY scope_key, slot_id", params)]

    def save_slot(self, slot: SlotRow, checkpoints: Sequence[CheckpointRow] | None = None, *,
                  held: bool = False) -> bool:
        """Upsert one slot (and, when given, replace its checkpoints) in one transaction. `held`: a
        slot the process already holds, saved only while its row still holds the same turn —
        another process may have erased that turn (and deleted the row) or put another in the slot
        since, and a copy written back would bring the erased words back. Whether it was saved."""
        values: dict[str, Any] = dict(slot)
        values["metadata"] = json.dumps(values["metadata"], ensure_ascii=False)
        emb = values["embedding"]
        values["embedding"] = np.asarray(emb, dtype="<f4").tobytes() if emb is not None else None
        with self.db.transaction() as tx:
            if held:
                names = [c for c in _SLOT_COLUMNS[2:] if c not in ("block_index", "context_hash")]
                cursor = tx.execute(
                    f"UPDATE wm_slots SET {', '.join(f'{c} = ?' for c in names)} WHERE scope_key = ? AND slot_id = ? "
                    "AND block_index IS NOT DISTINCT FROM ? AND context_hash = ?",
                    [*(values[c] for c in names), values["scope_key"], values["slot_id"], values["block_index"],
                     values["context_hash"]])
                if cursor.rowcount != 1:
                    return False
            else:
                updates = ", ".join(f"{c} = excluded.{c}" for c in _SLOT_COLUMNS[2:])
                tx.execute(
                    f"INSERT INTO wm_slots({', '.join(_SLOT_COLUMNS)}) VALUES ({', '.join('?' * len(_SLOT_COLUMNS))}) "
                    f"ON CONFLICT(scope_key, slot_id) DO UPDATE SET {updates}",
                    [values[c] for c in _SLOT_COLUMNS],
                )
            if checkpoints is not None:
                tx.execute("DELETE FROM wm_checkpoints WHERE scope_key = ? AND slot_id = ?",
                           (slot["scope_key"], slot["slot_id"]))
                tx.executemany(
                    f"INSERT INTO wm_checkpoints({', '.join(_CHECKPOINT_COLUMNS)}) VALUES (?, ?, ?, ?, ?, ?, ?)",
                    [(slot["scope_key"], slot["slot_id"], c["block_index"], c["relevance"], c["distance"],
                      c["created_at"], c["last_accessed"]) for c in checkpoints],
                )
        return True

    def delete_slot(self, scope_key: str, slot_id: int) -> None:
        with self.db.transaction() as tx:
            tx.execute("DELETE FROM wm_slots WHERE scope_key = ? AND slot_id = ?", (scope_key, slot_id))
            tx.execute("DELETE FROM wm_checkpoints WHERE scope_key = ? AND slot_id = ?", (scope_key, slot_id))

    def load_checkpoints(self, scope_key: str | None = None) -> list[StoredCheckpoint]:
        sql = f"SELECT {', '.join(_CHECKPOINT_COLUMNS)} FROM wm_checkpoints"
        params: tuple[Any, ...] = ()
        if scope_key is not None:
            sql += " WHERE scope_key = ?"
            params = (scope_key,)
        return [StoredCheckpoint(scope_key=r[0], slot_id=int(r[1]), block_index=int(r[2]), relevance=float(r[3]),
                                 distance=float(r[4]), created_at=float(r[5]), last_accessed=float(r[6]))
                for r in self.db.fetch(sql + " ORDER BY relevance DESC", params)]

    def touch_checkpoints(self, scope_key: str, slot_id: int, when: float) -> None:
        with self.db.transaction() as tx:
            tx.execute("UPDATE wm_checkpoints SET last_accessed = ? WHERE scope_key = ? AND slot_id = ?",
                       (when, scope_key, slot_id))

    # -- short-term memory ----------------------------------------------------------------
    def stm_add(self, scope_key: str, text: str, metadata: dict[str, Any], importance: float, created_at: float,
                expires_at: float, block_index: int | None) -> int:
        with self.db.transaction() as tx:
            row = tx.execute(
                "INSERT INTO stm_entries(scope_key, text, metadata, importance, created_at, expires_at, block_index) "
                "VALUES (?, ?, ?, ?, ?, ?, ?) RETURNING entry_id",
                (scope_key, text, json.dumps(metadata, ensure_ascii=False), importance, created_at, expires_at,
                 block_index),
            ).fetchone()
        return int(row[0])

    def stm_entries(self, scope_key: str | None, now: float, limit: int = 1000) -> list[STMEntry]:
        """Live entries, newest first."""
        sql = f"SELECT {', '.join(_STM_COLUMNS)} FROM stm_entries WHERE expires_at > ?"
        params: list[Any] = [now]
        if scope_key is not None:
            sql += " AND scope_key = ?"
            params.append(scope_key)
        sql += " ORDER BY created_at DESC, entry_id DESC LIMIT ?"
        params.append(limit)
        return [_stm(row) for row in self.db.fetch(sql, params)]

    def stm_take_expired(self, now: float) -> list[STMEntry]:
        """Remove and return every expired entry, atomically: two processes expiring at once
        each get a disjoint share (the delete returns the rows it removed)."""
        with self.db.transaction() as tx:
            rows = tx.execute(f"DELETE FROM stm_entries WHERE expires_at <= ? RETURNING {', '.join(_STM_COLUMNS)}",
                              (now,)).fetchall()
        return sorted((_stm(row) for row in rows), key=lambda entry: entry["entry_id"])

    def stm_delete_blocks(self, block_indices: Sequence[int]) -> None:
        if not block_indices:
            return
        with self.db.transaction() as tx:
            tx.executemany("DELETE FROM stm_entries WHERE block_index = ?", [(i,) for i in block_indices])

    def stm_count(self) -> int:
        return int(self.db.fetch("SELECT count(*) FROM stm_entries")[0][0])


def slots_follow_vectors(tx: SqlWriter, block_indices: Sequence[int], vectors: np.ndarray, *,
                         every: bool = False) -> None:
    """A working-memory slot keeps a copy of its block's vector (`embedding`): blocks given new
    vectors — a turn embedded again without an erased neighbour's words, or every block by `gieok
    reindex` (`every`) — give their slots the new ones in the same transaction (`tx`, the store's).
    With `every`, a slot whose block got none (another embedder's copy, of another dimension) keeps
    no copy: it is matched by its words until it is fed again."""
    held = {int(row[0]) for row in tx.execute("SELECT block_index FROM wm_slots WHERE block_index IS NOT NULL")
            .fetchall()}
    new = [(np.asarray(vector, dtype="<f4").tobytes(), int(index))
           for index, vector in zip(block_indices, vectors) if int(index) in held]
    if new:
        tx.executemany("UPDATE wm_slots SET embedding = ? WHERE block_index = ?", new)
    if every:
        tx.execute("UPDATE wm_slots SET embedding = NULL WHERE block_index IS NULL")
        given = {index for _, index in new}
        tx.executemany("UPDATE wm_slots SET embedding = NULL WHERE block_index = ?",
                       [(index,) for index in sorted(held - given)])
