"""`python -m benchmarks.erasure_graph --blocks 50000`: what a user's erasure costs a memory whose
vectors are answered by an HNSW graph.

Erasing a turn embeds the turn after it again, without the erased words (its passage had them as
context). This fills a SQLite memory with `--blocks` chat turns (random unit vectors given, so no
embedding; 20 channels, one turn every 30 s, so each turn has a neighbour), reopens it (the graph
loaded from beside the file), runs `--searches` searches, erases one turn with its neighbour
(`Memory.forget_with_neighbours`), then times the searches after it, the next add and the search
after that add. The graph used to be dropped by the neighbour's new vector and built again, whole,
by the next add. A table and, with `--json`, `{"blocks", "erase_s", "add_after_erasure_s",
"search_ms_before_p50", "search_ms_after_p50", "search_after_add_ms", "graph_after"}` (search times
include the query's embedding).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.report import median, print_and_write, results_table, table_console

__all__ = ["measure_erasure_graph", "main"]

QUERIES = ["message about topic 7 주제 3", "user4 said something", "topic 11 이야기", "message number 200",
           "주제 5 얘기", "what did user9 say about topic 2"]


def _fill(path: Path, blocks: int) -> None:
    from gieok import Memory

    rng = np.random.default_rng(0)
    with Memory(path) as memory:
        dimension = memory.embedder.dimension
        for start in range(0, blocks, 5000):
            items = [{"text": f"user{i % 50}: message number {i} about topic {i % 97} 주제 {i % 31}",
                      "scope": {"channel": f"c{i % 20}"}, "event_time": 1_700_000_000 + 30 * i}
                     for i in range(start, min(blocks, start + 5000))]
            vectors = rng.normal(size=(len(items), dimension)).astype(np.float32)
            memory.add_many(items, vectors=vectors / np.linalg.norm(vectors, axis=1, keepdims=True))


def _timed_ms(call: Any) -> float:
    started = time.perf_counter()
    call()
    return (time.perf_counter() - started) * 1000


def measure_erasure_graph(blocks: int = 50_000, searches: int = 6) -> dict[str, Any]:
    from gieok import Memory

    if not 1_000 <= blocks <= 2_000_000:
        raise SystemExit(f"--blocks must be 1,000–2,000,000, got {blocks}")
    if not 1 <= searches <= 1_000:
        raise SystemExit(f"--searches must be 1–1,000, got {searches}")
    with tempfile.TemporaryDirectory(prefix="gieok-erasure-graph-") as folder:
        path = Path(folder) / "memory.db"
        _fill(path, blocks)
        with Memory(path, ann_threshold=min(20_000, blocks)) as memory:
            memory.search(QUERIES[0], 10)  # the model and the graph, loaded
            queries = [QUERIES[i % len(QUERIES)] for i in range(searches)]
            before = [_timed_ms(lambda q=q: memory.search(q, 10)) for q in queries]
            victim = memory.search("message number 1234", 1).hits[0].block.block_index
            erase_ms = _timed_ms(lambda: memory.forget_with_neighbours([victim]))
            after = [_timed_ms(lambda q=q: memory.search(q, 10)) for q in queries]
            add_ms = _timed_ms(lambda: memory.add("user1: one more message after the erasure",
                                                  scope={"channel": "c1"}, event_time=1_700_000_000 + 30 * blocks))
            after_add = _timed_ms(lambda: memory.search("one more message", 10))
            graph = memory.indexes.vector_kind
    return {"blocks": blocks, "erase_s": round(erase_ms / 1000, 3), "add_after_erasure_s": round(add_ms / 1000, 3),
            "search_ms_before_p50": round(median(before), 1), "search_ms_after_p50": round(median(after), 1),
            "search_after_add_ms": round(after_add, 1), "graph_after": graph}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.erasure_graph", description=__doc__.split("\n\n")[0])
    parser.add_argument("--blocks", type=int, default=50_000, help="turns in the memory (default 50,000)")
    parser.add_argument("--searches", type=int, default=6, help="searches before and after the erasure (default 6)")
    parser.add_argument("--json", type=Path, default=None, help="write the result here")
    args = parser.parse_args(argv)

    def show(report: dict[str, Any]) -> None:
        table = results_table(f"A user's erasure in a memory of {report['blocks']:,} blocks",
                              ["measure", "value"], left=["measure"])
        table.add_row("erasure (the turn, its neighbour embedded again)", f"{report['erase_s']:.3f} s")
        table.add_row("search p50 before / after it", f"{report['search_ms_before_p50']:.1f} / "
                                                      f"{report['search_ms_after_p50']:.1f} ms")
        table.add_row("the next add", f"{report['add_after_erasure_s']:.3f} s")
        table.add_row("the search after that add", f"{report['search_after_add_ms']:.1f} ms")
        table.add_row("vector search after it all", report["graph_after"])
        table_console().print(table)

    print_and_write(measure_erasure_graph(args.blocks, args.searches), show, args.json)


if __name__ == "__main__":
    main()
