"""Telling a full disk from the other ways a write fails, so it gets its own error (`StorageFullError`,
HTTP 507) instead of "the database is away" or "damaged".

SQLite says so itself when a file cannot grow (SQLITE_FULL, "database or disk is full"), but when
the write-ahead log's shared-memory index or a journal cannot grow it says only SQLITE_IOERR ("disk
I/O error"): that one counts as a full disk when the filesystem holding the database has next to
nothing free. A file written beside the database (an ANN graph) fails with ENOSPC or EDQUOT."""

from __future__ import annotations

import errno
import os
import sqlite3
from pathlib import Path

from ..errors import StorageFullError

__all__ = ["NEARLY_FULL_BYTES", "free_bytes", "is_storage_full", "storage_full_error"]

# Below this, an I/O error on a write is taken for the disk being full: SQLite grows its files a
# page or a WAL index block (32 KiB) at a time, so a disk with more free than this had room.
NEARLY_FULL_BYTES = 1 << 20

_SQLITE_FULL = 13  # primary result codes (sqlite3.h); the extended ones keep them in their low byte
_SQLITE_IOERR = 10
_FULL_ERRNOS = {errno.ENOSPC, errno.EDQUOT}


def free_bytes(path: str | os.PathLike[str]) -> int | None:
    """Bytes an unprivileged writer may still use on the filesystem holding `path` (its folder when
    the file is not there yet); None when that cannot be asked (a database URL, a folder gone)."""
    where = Path(path)
    for candidate in (where, where.parent):
        try:
            stats = os.statvfs(candidate)
        except OSError:
            continue
        return stats.f_bavail * stats.f_frsize
    return None


def is_storage_full(exc: BaseException, path: str | os.PathLike[str]) -> bool:
    """Whether `exc`, raised writing the database at `path` (or a file beside it), means its disk is full."""
    if isinstance(exc, OSError):
        return exc.errno in _FULL_ERRNOS
    if not isinstance(exc, sqlite3.Error):
        return False
    code = getattr(exc, "sqlite_errorcode", None)
    primary = code & 0xFF if isinstance(code, int) else None
    message = str(exc)
    if primary == _SQLITE_FULL or "database or disk is full" in message:
        return True
    if primary == _SQLITE_IOERR or "disk I/O error" in message:
        free = free_bytes(path)
        return free is not None and free < NEARLY_FULL_BYTES
    return False


def storage_full_error(exc: BaseException, path: str | os.PathLike[str]) -> StorageFullError:
    """The error a write refused for want of space answers, naming the file and what is left."""
    free = free_bytes(path)
    left = f"{free} bytes free on its filesystem" if free is not None else "its filesystem is full"
    return StorageFullError(f"cannot write {path}: the disk is full ({left}; {exc}). Nothing of this write was "
                            "stored and everything stored before is intact and readable; free space and write "
                            "again (no restart needed)")
