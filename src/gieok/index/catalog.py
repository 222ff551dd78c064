"""In-memory columns of every block: the filters and neighbour lookups of a search
run on these arrays instead of SQL, and they grow with each add (no rebuilds).

Row r of the catalog is row r of the vector matrix; rows follow block_index order.
"""

from __future__ import annotations

import numpy as np

from ..store.base import IndexRows
from ..types import Scope

__all__ = ["Catalog"]


class _Codes:
    """Interns strings (guild, channel, user, speaker, kind) as small ints; 0 means "none"."""

    def __init__(self) -> None:
        self.code_of: dict[str, int] = {}
        self.values: list[str] = [""]  # values[code]

    def encode(self, value: str | None) -> int:
        if value is None:
            return 0
        code = self.code_of.get(value)
        if code is None:
            code = self.code_of[value] = len(self.code_of) + 1
            self.values.append(value)
        return code

    def lookup(self, value: str) -> int:
        """-1 for a value never seen: it matches no row."""
        return self.code_of.get(value, -1)


class _Column:
    """A numpy column with amortised O(1) append."""

    def __init__(self, dtype, fill=0) -> None:
        self.data = np.full(1024, fill, dtype=dtype)
        self.size = 0
        self.fill = fill

    def extend(self, values: np.ndarray) -> None:
        need = self.size + len(values)
        if need > self.data.shape[0]:
            grown = np.full(max(need, self.data.shape[0] * 2), self.fill, dtype=self.data.dtype)
            grown[: self.size] = self.data[: self.size]
            self.data = grown
        self.data[self.size : need] = values
        self.size = need

    @property
    def view(self) -> np.ndarray:
        return self.data[: self.size]


class Catalog:
    """Column arrays of every block (kind, scope codes, speaker, time, importance, position,
    alive) for filters, neighbour lookups and ranking features without touching SQLite."""

    def __init__(self) -> None:
        self.guilds, self.channels, self.users, self.kinds = _Codes(), _Codes(), _Codes(), _Codes()
        self.speakers = _Codes()
        self._block_index = _Column(np.int64)
        self._guild = _Column(np.int32)
        self._channel = _Column(np.int32)
        self._user = _Column(np.int32)
        self._speaker = _Column(np.int32)
        self._kind = _Column(np.int16)
        self._event_time = _Column(np.float64)
        self._importance = _Column(np.float32)
        self._conv_pos = _Column(np.int64, -1)
        self._alive = _Column(bool, False)
        self._channel_rows: dict[int, list[int]] = {}
        self._channel_rows_cache: dict[int, np.ndarray] = {}
        self._position: dict[int, dict[int, int]] = {}  # channel code -> conv_pos -> row

    # -- growth ---------------------------------------------------------------------------
    def __len__(self) -> int:
        return self._block_index.size

    @property
    def last_block_index(self) -> int:
        return int(self._block_index.data[self._block_index.size - 1]) if self._block_index.size else 0

    def extend(self, rows: IndexRows) -> None:
        n = len(rows)
        if n == 0:
            return
        start = len(self)
        channel_codes = np.fromiter((self.channels.encode(c) for c in rows.channel), dtype=np.int32, count=n)
        self._block_index.extend(rows.block_index)
        self._guild.extend(np.fromiter((self.guilds.encode(g) for g in rows.guild), dtype=np.int32, count=n))
        self._channel.extend(channel_codes)
        self._user.extend(np.fromiter((self.users.encode(u) for u in rows.user), dtype=np.int32, count=n))
        self._speaker.extend(np.fromiter((self.speakers.encode(s) for s in rows.speaker), dtype=np.int32, count=n))
        self._kind.extend(np.fromiter((self.kinds.encode(k) for k in rows.kind), dtype=np.int16, count=n))
        self._event_time.extend(rows.event_time)
        self._importance.extend(rows.importance)
        self._conv_pos.extend(rows.conv_pos)
        self._alive.extend(rows.alive)
        for offset in range(n):
            code = int(channel_codes[offset])
            if code:
                row = start + offset
                self._channel_rows.setdefault(code, []).append(row)
                self._channel_rows_cache.pop(code, None)
                pos = int(rows.conv_pos[offset])
                if pos >= 0:
                    self._position.setdefault(code, {})[pos] = row

    def mark_forgotten(self, block_indices) -> list[int]:
        rows = [r for r in (self.row_of(i) for i in block_indices) if r is not None]
        if rows:
            self._alive.data[rows] = False
        return rows

    # -- lookups --------------------------------------------------------------------------
    def row_of(self, block_index: int) -> int | None:
        view = self._block_index.view
        row = int(np.searchsorted(view, block_index))
        if row < view.shape[0] and view[row] == block_index:
            return row
        return None

    def block_index_of(self, rows: np.ndarray) -> np.ndarray:
        return self._block_index.view[rows]

    def alive(self) -> np.ndarray:
        return self._alive.view

    def importance(self, rows: np.ndarray) -> np.ndarray:
        return self._importance.view[rows]

    def event_time(self, rows: np.ndarray) -> np.ndarray:
        return self._event_time.view[rows]

    def speaker_codes(self, rows: np.ndarray) -> np.ndarray:
        """Interned speakers of `rows` (0 where none); `speakers.values[code]` is the name."""
        return self._speaker.view[rows]

    def sequence_keys(self, rows: np.ndarray) -> np.ndarray:
        """One int per row that orders a channel's turns and steps by one between neighbours
        (channel code · 2^40 + position); -1 for rows outside any channel's sequence. Turns at
        offset d of row r have key keys[r] + d, which lets ranking look neighbours up in bulk."""
        channel = self._channel.view[rows].astype(np.int64)
        pos = self._conv_pos.view[rows]
        return np.where((channel > 0) & (pos >= 0), (channel << 40) + pos, -1)

    def candidate_rows(
        self, scope: Scope, kinds: tuple[str, ...], since: float | None, until: float | None
    ) -> np.ndarray | None:
        """Rows passing the filters, or None when nothing is filtered (all live rows)."""
        if scope.is_empty() and not kinds and since is None and until is None:
            return None
        if scope.channel is not None:
            code = self.channels.lookup(scope.channel)
            if code < 0:
                return np.empty(0, dtype=np.int64)
            rows = self._channel_array(code)
        else:
            rows = np.arange(len(self), dtype=np.int64)
        keep = self._alive.view[rows]
        if scope.guild is not None:
            keep &= self._guild.view[rows] == self.guilds.lookup(scope.guild)
        if scope.user is not None:
            keep &= self._user.view[rows] == self.users.lookup(scope.user)
        if kinds:
            codes = [self.kinds.lookup(k) for k in kinds]
            keep &= np.isin(self._kind.view[rows], codes)
        if since is not None:
            keep &= self._event_time.view[rows] >= since
        if until is not None:
            keep &= self._event_time.view[rows] <= until
        return rows[keep]

    def passes(self, row: int, scope: Scope, kinds: tuple[str, ...], since: float | None, until: float | None) -> bool:
        if not self._alive.data[row]:
            return False
        if scope.guild is not None and self._guild.data[row] != self.guilds.lookup(scope.guild):
            return False
        if scope.channel is not None and self._channel.data[row] != self.channels.lookup(scope.channel):
            return False
        if scope.user is not None and self._user.data[row] != self.users.lookup(scope.user):
            return False
        if kinds and self._kind.data[row] not in [self.kinds.lookup(k) for k in kinds]:
            return False
        t = self._event_time.data[row]
        if since is not None and t < since:
            return False
        return not (until is not None and t > until)

    def passes_many(self, rows: np.ndarray, scope: Scope, kinds: tuple[str, ...], since: float | None,
                    until: float | None) -> np.ndarray:
        """`passes` for many rows at once: a boolean mask over `rows`."""
        keep = self._alive.view[rows].copy()
        if scope.guild is not None:
            keep &= self._guild.view[rows] == self.guilds.lookup(scope.guild)
        if scope.channel is not None:
            keep &= self._channel.view[rows] == self.channels.lookup(scope.channel)
        if scope.user is not None:
            keep &= self._user.view[rows] == self.users.lookup(scope.user)
        if kinds:
            keep &= np.isin(self._kind.view[rows], [self.kinds.lookup(k) for k in kinds])
        if since is not None:
            keep &= self._event_time.view[rows] >= since
        if until is not None:
            keep &= self._event_time.view[rows] <= until
        return keep

    def last_turns(self, channel: str, n: int) -> list[int]:
        """Block indices of the channel's last `n` turns, oldest first (forgotten ones too)."""
        code = self.channels.lookup(channel)
        rows = self._channel_rows.get(code, []) if code > 0 else []
        found: list[int] = []
        for row in reversed(rows):
            if len(found) >= n:
                break
            if self._conv_pos.data[row] >= 0:
                found.append(int(self._block_index.data[row]))
        return found[::-1]

    def neighbours(self, row: int, window: int) -> list[tuple[int, int]]:
        """(row, distance) of the turns within ±window in the same channel's sequence."""
        code = int(self._channel.data[row])
        pos = int(self._conv_pos.data[row])
        if not code or pos < 0 or window <= 0:
            return []
        positions = self._position.get(code, {})
        out = []
        for distance in range(1, window + 1):
            for p in (pos - distance, pos + distance):
                other = positions.get(p)
                if other is not None:
                    out.append((other, distance))
        return out

    def neighbour_rows(self, rows: np.ndarray, window: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """`neighbours` of many rows: (index into `rows`, neighbour row, distance) arrays."""
        sources: list[int] = []
        found: list[int] = []
        distances: list[int] = []
        steps = [(d, s) for d in range(1, window + 1) for s in (-d, d)]
        codes = self._channel.data[rows].tolist()
        positions_of = self._conv_pos.data[rows].tolist()
        for i, (code, pos) in enumerate(zip(codes, positions_of)):
            positions = self._position.get(code) if code and pos >= 0 else None
            if not positions:
                continue
            for distance, step in steps:
                other = positions.get(pos + step)
                if other is not None:
                    sources.append(i)
                    found.append(other)
                    distances.append(distance)
        return (np.array(sources, dtype=np.int64), np.array(found, dtype=np.int64),
                np.array(distances, dtype=np.int64))

    def _channel_array(self, code: int) -> np.ndarray:
        cached = self._channel_rows_cache.get(code)
        if cached is None:
            cached = np.asarray(self._channel_rows.get(code, []), dtype=np.int64)
            self._channel_rows_cache[code] = cached
        return cached
