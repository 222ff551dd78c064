"""Background load for benchmarks: N blocks of the synthetic bilingual chat (bench.corpus)
in channels of their own, with passage vectors cached on disk per model."""

from __future__ import annotations

import tempfile
from pathlib import Path

from ..memory import Memory, remove_memory_files
from .corpus import generate_messages
from .embed_cache import EmbeddingCache, default_cache_dir
from .report import progress_bar

__all__ = ["fill_background", "filled_memory"]

FILL_BATCH = 2000


def fill_background(memory: Memory, n: int, cache_dir: Path | None = None) -> None:
    """Append `n` corpus blocks to channels named `fill-…` (never the channels a benchmark
    talks in). The first 100k vectors are shared by every benchmark through the cache."""
    if n <= 0:
        return
    corpus_n = max(100_000, n)
    messages = generate_messages(corpus_n)
    cache = EmbeddingCache(cache_dir or default_cache_dir(), memory.embedder.name)
    with progress_bar(f"corpus vectors ({corpus_n:,}, cached per model)", corpus_n) as advance:
        vectors, _ = cache.get_or_compute([m.text for m in messages], "passage",
                                          memory.embedder.inner.embed_passages, progress=advance)
    with progress_bar(f"fill {n:,} blocks from other channels", n) as advance:
        for start in range(0, n, FILL_BATCH):
            batch = messages[start : min(n, start + FILL_BATCH)]
            memory.add_many([{"text": m.text, "scope": {"guild": m.guild, "channel": f"fill-{m.channel}"},
                              "speaker": m.speaker, "event_time": m.timestamp} for m in batch],
                            vectors=vectors[start : start + len(batch)])
            advance(len(batch))


def filled_memory(name: str, blocks: int, workdir: Path | None = None, cache_dir: Path | None = None) -> Memory:
    """A fresh benchmark database `<workdir>/<name>-<blocks>.db` (a temp dir by default) holding
    `blocks` background blocks. The caller closes it."""
    workdir = workdir or Path(tempfile.mkdtemp(prefix=f"gieok-{name}-"))
    workdir.mkdir(parents=True, exist_ok=True)
    db = workdir / f"{name}-{blocks}.db"
    remove_memory_files(db)
    memory = Memory(db)
    try:
        fill_background(memory, blocks, cache_dir)
    except BaseException:
        memory.close()
        raise
    return memory
