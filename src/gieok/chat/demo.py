"""`gieok demo`: the bundled bilingual group chat through the conversation memory's front door —
the same write path an agent uses (`POST /v1/conversations/messages`) — then a few questions.

Afterwards the memory holds what a bot's or an agent's would: the conversation's recent messages
(L1), its turns with their speakers and times, working memory, and — extracted as they would be
by a language model, but by the built-in scripted demo model (`llm/demo_model.py`: offline, no
model needed) — its facts (L3) with their history and sources and its rolling summary (L2); so the
dashboard's pages and `gieok facts` / `gieok summary` / `gieok users` have something to show."""

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
from .conversation.recent import conversation_of
from .llm.demo_model import demo_model
from .settings import ChatSettings

__all__ = ["load_sample_conversation", "run_demo", "BATCH"]

BATCH = 50  # messages per call, as an agent sends them: at most what L1 keeps, so each extraction reads them all


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
    """Feed the demo chat through the conversation pipeline into a fresh memory at `path` — its
    facts and summary extracted by the built-in scripted demo model, each batch's extraction
    finished before the next batch comes — then ask its questions and show each hit's score breakdown."""
    console = console or Console()
    data = load_sample_conversation()
    _prepare_path(path)
    messages = _messages(data)
    console.print(f"[bold]gieok demo[/] — {data['title']}")
    console.print(f"memory file: {path}")
    base = settings or ChatSettings()
    batch_size = max(1, min(BATCH, base.l1_size))  # an extraction reads the messages still in L1
    # every batch is due for extraction (the bot's rule: every `analysis_every` users' messages)
    settings = ChatSettings.over(base, db=str(path), analysis_every=min(base.analysis_every, batch_size))
    with Memory(settings=settings) as memory:
        memory.store.set_meta({"demo": "1"})
        model = demo_model()  # facts and summaries offline: no language model, no network
        pipeline = build_pipeline(settings, memory, llm=model, classifier=None)  # the guard reads what comes in
        started = time.perf_counter()
        from rich.progress import Progress

        async def feed() -> None:
            with Progress(console=console, transient=True) as bar:
                task = bar.add_task("adding the conversation (embedding with the packaged e5-small model)",
                                    total=len(messages))
                for start in range(0, len(messages), batch_size):
                    batch = messages[start : start + batch_size]
                    await pipeline.add_messages(data["guild"], data["channel"], batch)
                    await pipeline.drain()  # this batch's facts are known before the next batch is read
                    bar.advance(task, len(batch))

        asyncio.run(feed())
        ingest = time.perf_counter() - started
        facts = pipeline.facts.facts(guild=data["guild"], include_history=True, limit=10_000)
        current = sum(1 for fact in facts if fact.current)
        summary = pipeline.summaries.get(conversation_of(data["guild"], data["channel"]))
        users = pipeline.tables.users_page(None, 100)
        console.print(f"added {len(messages)} messages from {len(data['sessions'])} sessions in {ingest:.1f} s "
                      f"({len(messages) / ingest:.0f} messages/s, embedder {memory.stats().embedder}): recent "
                      "messages, turns and working memory, as an agent's conversation is kept")
        console.print(f"facts and summaries by the built-in scripted demo model (no language model needed): "
                      f"{current} current facts ({len(facts) - current} superseded, kept as history) about "
                      f"{len(users)} users, and a summary of {len(summary.key_points)} key points "
                      f"(topic: {summary.topic or '-'})\n")
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
                      f"Try: gieok search --db {path} \"민지 고양이\"  ·  gieok facts --history --db {path}  ·  "
                      f"gieok summary --channel {data['channel']} --guild {data['guild']} --db {path}  ·  "
                      f"gieok serve --db {path} (the dashboard's Conversations, Facts and Users pages)")
    return {"questions": len(data["questions"]), "found": found, "turns": len(messages), "ingest_seconds": ingest,
            "facts": current, "superseded": len(facts) - current, "summary_points": len(summary.key_points),
            "users": [u.user_id for u in users], "model": model.name}
