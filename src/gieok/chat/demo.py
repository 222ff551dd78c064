"""`gieok demo`: the bundled bilingual group chat through the conversation memory's front door —
the same write path an agent uses (`POST /v1/conversations/messages`) — then a few questions.

Afterwards the memory holds what a bot's or an agent's would: the conversation's recent messages
(L1), its turns with their speakers and times, working memory; so the dashboard's Conversations
page and `gieok facts` / `gieok summary` have something to show (summaries and facts need a
language model: with one configured they follow in the background, as for an agent)."""

from __future__ import annotations

import asyncio
import json
import time
from datetime import datetime, timedelta
from importlib import resources
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from ..errors import InvalidInputError
from ..memory import Memory, remove_memory_files
from ..store.sqlite import SQLiteStore
from .compose import build_pipeline
from .settings import ChatSettings

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


def _messages(data: dict[str, Any]) -> list[dict[str, Any]]:
    """The group chat as an agent sends it: one message per turn, each with its id and time."""
    messages = []
    for session in data["sessions"]:
        start = datetime.fromisoformat(session["date_time"])
        for number, turn in enumerate(session["turns"], start=1):
            messages.append({"id": f"s{session['session']}-t{number}", "role": "user", "user": turn["speaker"],
                             "name": turn["speaker"], "text": turn["text"],
                             "time": (start + timedelta(seconds=30 * number)).timestamp()})
    return messages


def run_demo(path: Path, console: Console | None = None, *, k: int = 5,
             settings: ChatSettings | None = None) -> dict[str, Any]:
    """Feed the demo chat through the conversation pipeline into a fresh memory at `path`, then
    ask its questions and show each hit's score breakdown."""
    console = console or Console()
    data = load_sample_conversation()
    _prepare_path(path)
    messages = _messages(data)
    console.print(f"[bold]gieok demo[/] — {data['title']}")
    console.print(f"memory file: {path}")
    settings = ChatSettings.over(settings or ChatSettings(), db=str(path))
    with Memory(settings=settings) as memory:
        memory.store.set_meta({"demo": "1"})
        pipeline = build_pipeline(settings, memory, llm=None, classifier=None)  # the guard reads what comes in
        started = time.perf_counter()
        from rich.progress import Progress

        with Progress(console=console, transient=True) as bar:
            task = bar.add_task("adding the conversation (embedding with the packaged e5-small model)",
                                total=len(messages))
            for start in range(0, len(messages), 100):
                batch = messages[start : start + 100]
                asyncio.run(pipeline.add_messages(data["guild"], data["channel"], batch))
                bar.advance(task, len(batch))
        ingest = time.perf_counter() - started
        console.print(f"added {len(messages)} messages from {len(data['sessions'])} sessions in {ingest:.1f} s "
                      f"({len(messages) / ingest:.0f} messages/s, embedder {memory.stats().embedder}): recent "
                      "messages, turns and working memory, as an agent's conversation is kept\n")
        found = 0
        for question in data["questions"]:
            result = memory.search(question["question"], k, scope={"channel": data["channel"]})
            wanted = {f"s{session}-t{turn}" for session, turn in question["evidence"]}
            ranks = [i for i, h in enumerate(result.hits, 1) if h.block.metadata.get("external_id") in wanted]
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
                              f"{b.neighbour:.3f}", f"{marker}{hit.block.speaker}: {hit.block.text}")
            console.print(table)
            console.print(f"  expected: {question['answer']}")
            console.print(f"  {result.search_time_ms:.1f} ms (query embedding {result.embed_time_ms:.1f} ms)\n")
        console.print(f"[bold]{found}/{len(data['questions'])}[/] questions had their evidence turn in the top {k}. "
                      f"Try: gieok search --db {path} \"민지 고양이\"  ·  gieok serve --db {path} (the dashboard's "
                      "Conversations page shows the chat)")
    return {"questions": len(data["questions"]), "found": found, "turns": len(messages), "ingest_seconds": ingest}
