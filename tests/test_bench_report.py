"""Benchmarks measure in one function and print in another: `measure_…` returns the report
(what `run_…` writes as JSON, plus printer-only "_" keys), `print_…` renders it."""

from __future__ import annotations

import io
import json
from pathlib import Path

from benchmarks.guard import measure_guard, print_guard, run_guard
from benchmarks.report import p50_p95, published, write_json
from rich.console import Console


def test_measure_guard_returns_what_run_guard_reports(tmp_path: Path) -> None:
    measured = measure_guard(method="regex")
    out = tmp_path / "guard.json"
    ran = run_guard(json_out=out, method="regex")
    for key in ("detection_rate", "false_alarm_rate", "n"):
        assert measured[key] == ran[key], key
    assert set(ran) == {"detection_rate", "false_alarm_rate", "detection_ci95", "false_alarm_ci95", "n",
                        "embedding_engines"}  # no printer's "_" keys
    assert json.loads(out.read_text(encoding="utf-8")) == ran

    console = Console(file=io.StringIO(), width=160)
    print_guard(measured, console=console)
    printed = console.file.getvalue()
    assert f"injection guard (regex, threshold 0.7) on {measured['n']} examples" in printed
    assert f"{measured['detection_rate']:.3f}" in printed


def test_printer_only_keys_are_never_written(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    write_json(out, {"n": 3, "_examples": ["not for JSON"]})
    assert json.loads(out.read_text(encoding="utf-8")) == {"n": 3} == published({"n": 3, "_examples": []})
    assert p50_p95([1.0, 2.0, 3.0, 10.0]) == {"p50": 2.5, "p95": 10.0}
    assert p50_p95([], "_ms") == {"p50_ms": 0.0, "p95_ms": 0.0}
