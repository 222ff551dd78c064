"""Benchmark databases: a fresh one in a work directory, and background load for it — N blocks
of the synthetic bilingual chat (bench.corpus) in channels of their own, with passage vectors
cached on disk per model."""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from benchmarks.corpus import ChatMessage, generate_messages
from benchmarks.embed_cache import corpus_vectors
from benchmarks.report import progress_bar
from gieok.config.settings import is_database_url
from gieok.memory import Memory, remove_memory_files
from gieok.store.urls import with_schema

__all__ = ["add_corpus", "bench_workdir", "corpus_items", "fill_background", "filled_memory", "fresh_memory"]

FILL_BATCH = 2000


def bench_workdir(name: str, workdir: Path | None = None) -> Path:
    """`workdir` (created if missing), or a new temp dir named after the benchmark; absolute (a
    server the benchmark starts runs in another directory)."""
    workdir = workdir or Path(tempfile.mkdtemp(prefix=f"gieok-{name}-"))
    workdir.mkdir(parents=True, exist_ok=True)
    return workdir.resolve()


def fresh_memory(db: Path | str, **memory_options: Any) -> Memory:
    """An empty benchmark database at `db` (whatever a previous run left there is removed): a
    file, or a `postgresql://` URL whose schema is dropped first."""
    if is_database_url(str(db)):
        from gieok.store.postgres import drop_memory  # psycopg: only for a PostgreSQL run

        drop_memory(str(db))
    else:
        remove_memory_files(db)
    return Memory(db, **memory_options)


def bench_location(workdir: Path | str, name: str) -> Path | str:
    """Where a benchmark keeps database `name`: a file in `workdir`, or, when `workdir` is a
    PostgreSQL URL, a schema of that database named after it."""
    if is_database_url(str(workdir)):
        return with_schema(str(workdir), "bench_" + "".join(c if c.isalnum() else "_" for c in name.lower()))
    return Path(workdir) / name


def bench_target(name: str, db: str | None) -> Path | str:
    """A benchmark's `--db`: a PostgreSQL URL as given, else a (new) directory for its files."""
    if db is not None and is_database_url(db):
        return db
    return bench_workdir(name, Path(db) if db else None)


def corpus_items(messages: Sequence[ChatMessage], channel_prefix: str = "") -> list[dict[str, Any]]:
    """Corpus messages as `Memory.add_many` items, each in its own guild and channel."""
    return [{"text": m.text, "scope": {"guild": m.guild, "channel": f"{channel_prefix}{m.channel}"},
             "speaker": m.speaker, "event_time": m.timestamp} for m in messages]


def fill_background(memory: Memory, n: int, cache_dir: Path | None = None) -> None:
    """Append `n` corpus blocks to channels named `fill-…` (never the channels a benchmark
    talks in). Their vectors are shared by every benchmark of that size through the cache."""
    if n <= 0:
        return
    # The corpus is the same messages in the same order for every size (a 300-block run is the head of
    # a 100k one); only the vectors of the blocks written are computed (cached per size: embedding the
    # whole 100k head first made `--blocks 300` take over an hour on a cold cache).
    messages = generate_messages(max(100_000, n))[:n]
    vectors = corpus_vectors(memory.embedder, [m.text for m in messages], cache_dir)
    with progress_bar(f"fill {n:,} blocks from other channels", n) as advance:
        add_corpus(memory, messages, vectors, advance, "fill-")


def add_corpus(memory: Memory, messages: Sequence[ChatMessage], vectors: Any, advance: Callable[[int], None],
               channel_prefix: str = "") -> None:
    """`messages` with their `vectors` into `memory`, `FILL_BATCH` to an `add_many` (`corpus_items`),
    `advance` called after each."""
    for start in range(0, len(messages), FILL_BATCH):
        batch = messages[start : start + FILL_BATCH]
        memory.add_many(corpus_items(batch, channel_prefix), vectors=vectors[start : start + len(batch)])
        advance(len(batch))


def filled_memory(name: str, blocks: int, workdir: Path | str | None = None, cache_dir: Path | None = None, *,
                  db_name: str | None = None, **settings_overrides: Any) -> Memory:
    """A fresh benchmark database `<workdir>/<db_name>` (default `<name>-<blocks>.db`, in a temp
    dir by default; when `workdir` is a `postgresql://` URL, a schema of that database named after
    `db_name`) holding `blocks` background blocks. The caller closes it."""
    db_name = db_name or f"{name}-{blocks}.db"
    if workdir is not None and is_database_url(str(workdir)):
        location: Path | str = bench_location(str(workdir), db_name)
    else:
        location = bench_workdir(name, Path(workdir) if workdir is not None else None) / db_name
    memory = fresh_memory(location, **settings_overrides)
    try:
        fill_background(memory, blocks, cache_dir)
    except BaseException:
        memory.close()
        raise
    return memory
