"""`gieok demo`: ingest the bundled bilingual group chat and answer a few questions."""

from __future__ import annotations

import json
import time
from datetime import datetime, timedelta
from importlib import resources
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from .errors import InvalidInputError
from .memory import Memory, remove_memory_files
from .store.sqlite import SQLiteStore

__all__ = ["load_sample_conversation", "run_demo"]


def load_sample_conversation() -> dict[str, Any]:
    text = resources.files("gieok.data").joinpath("sample_conversation.json").read_text(encoding="utf-8")
    return json.loads(text)


def _prepare_path(path: Path) -> None:
    """Recreate the demo file, but never delete a database that is not a demo database."""
    if path.exists() and path.stat().st_size > 0:
        store = SQLiteStore(path)
        try:
            is_demo = store.get_meta("demo") == "1"
        finally:
            store.close()
        if not is_demo:
            raise InvalidInputError(f"{path} exists and is not a gieok demo database; choose another --db")
    remove_memory_files(path)


def run_demo(path: Path, console: Console | None = None, *, k: int = 5) -> dict[str, Any]:
    console = console or Console()
    data = load_sample_conversation()
    _prepare_path(path)
    items = []
    for session in data["sessions"]:
        start = datetime.fromisoformat(session["date_time"])
        for number, turn in enumerate(session["turns"], start=1):
            items.append({
                "text": f"{turn['speaker']}: {turn['text']}",
                "speaker": turn["speaker"],
                "scope": {"guild": data["guild"], "channel": data["channel"]},
                "event_time": start + timedelta(seconds=30 * number),
                "metadata": {"session": session["session"], "turn": number},
            })
    console.print(f"[bold]gieok demo[/] — {data['title']}")
    console.print(f"memory file: {path}")
    with Memory(path) as memory:
        memory.store.set_meta({"demo": "1"})
        started = time.perf_counter()
        from rich.progress import Progress

        with Progress(console=console, transient=True) as bar:
            task = bar.add_task("ingesting turns (embedding with the packaged e5-small model)", total=len(items))
            memory.add_many(items, progress=lambda n: bar.advance(task, n))
        ingest = time.perf_counter() - started
        console.print(f"ingested {len(items)} turns from {len(data['sessions'])} sessions in {ingest:.1f} s "
                      f"({len(items) / ingest:.0f} turns/s, embedder {memory.stats().embedder})\n")
        found = 0
        for question in data["questions"]:
            result = memory.search(question["question"], k, scope={"channel": data["channel"]})
            wanted = {tuple(e) for e in question["evidence"]}
            ranks = [i for i, h in enumerate(result.hits, 1)
                     if (h.block.metadata.get("session"), h.block.metadata.get("turn")) in wanted]
            found += bool(ranks)
            table = Table(title=f"Q: {question['question']}", title_justify="left", show_lines=False)
            table.add_column("#", justify="right")
            table.add_column("score", justify="right")
            table.add_column("bm25", justify="right")
            table.add_column("vector", justify="right")
            table.add_column("neighbour", justify="right")
            table.add_column("turn")
            for rank, hit in enumerate(result.hits, 1):
                b = hit.breakdown
                marker = "✓ " if rank in ranks else ""
                table.add_row(str(rank), f"{hit.score:.3f}", f"{b.bm25:.2f}", f"{b.vector:.3f}",
                              f"{b.neighbour:.3f}", marker + hit.block.text)
            console.print(table)
            console.print(f"  expected: {question['answer']}")
            console.print(f"  {result.search_time_ms:.1f} ms (query embedding {result.embed_time_ms:.1f} ms)\n")
        console.print(f"[bold]{found}/{len(data['questions'])}[/] questions had their evidence turn in the top {k}. "
                      f"Try: gieok search --db {path} \"민지 고양이\"")
    return {"questions": len(data["questions"]), "found": found, "turns": len(items), "ingest_seconds": ingest}
