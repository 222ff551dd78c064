"""`gieok` commands of the chat: inspect a prompt, read or set a channel's summary, list facts,
seed lore, forget a user, chat in the terminal, run the Discord bot."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

from ..errors import InvalidInputError, MissingExtraError
from ..store.wait import ServiceWait, reach_services
from .options import DbOption, GuildOpt, JsonFlag, RedisOption, _erasing, _open, given, load, out

if TYPE_CHECKING:
    from ..chat.conversation.memory import ConversationMemory
    from ..memory import Memory

__all__ = ["conversation_commands", "users_commands"]

conversation_commands = typer.Typer()
app = conversation_commands  # the decorators below read naturally
users_commands = typer.Typer(help="The people in a memory: list them, write everything held about one to a file "
                                  "(an access request), erase one. Example: gieok users export 42 --out 42.json",
                             no_args_is_help=True)

UserRequired = Annotated[str, typer.Option("--user", "-u", help="User id (the speaker).")]


def _conversation_memory(memory: Memory) -> ConversationMemory:
    """The conversation layers of `memory`. The chat's modules load with the commands that use
    them, not with every `gieok` command (~0.25 s of each start: `gieok mcp`, `gieok serve`, …)."""
    from ..chat.conversation.memory import ConversationMemory

    return ConversationMemory(memory)


@app.command()
def demo(
    db: Annotated[Path, typer.Option("--db", help="Demo memory file (recreated each run).")] = Path("gieok-demo.db"),
    k: Annotated[int, typer.Option("-k", help="Hits per question.")] = 5,
) -> None:
    """Add a bundled Korean/English group chat (300 messages, 6 sessions) as an agent would, and answer questions.

    The messages go through the conversation memory's write path (what POST /v1/conversations/messages
    runs): recent messages, turns and working memory, and facts and summaries extracted by a built-in
    scripted demo model (offline, no language model needed); afterwards `gieok serve --db` shows them.

    Example: gieok demo --db /tmp/demo.db
    """
    from ..chat.demo import run_demo

    run_demo(db, out, k=k, settings=load())


@app.command("inspect-prompt")
def inspect_prompt(
    message: Annotated[str, typer.Argument(help="The incoming message.")],
    channel: Annotated[str, typer.Option("--channel", "-c", help="Channel id.")] = "general",
    user: UserRequired = "local",
    guild: GuildOpt = None,
    name: Annotated[str | None, typer.Option("--name", help="The speaker's display name.")] = None,
    explicit: Annotated[bool, typer.Option("--explicit/--not-explicit", help="Treat it as a call to the bot.")] = True,
    db: DbOption = None,
    as_json: JsonFlag = False,
) -> None:
    """Show the plan and the exact prompt the bot would build for a message, changing nothing.

    Without a language model configured, stage 2 falls back to its heuristics (shown in the plan).

    Example: gieok inspect-prompt "누리야 내 고양이 이름 기억나?" --channel cafe --guild g1 --user 42 --name 민지
    """
    from ..chat.agent.pipeline import IncomingMessage
    from ..chat.compose import build_pipeline
    from ..chat.settings import chat_settings

    with _open(db) as memory:
        pipeline = build_pipeline(chat_settings(memory.settings), memory, llm=None)  # stage 2 by its heuristics
        plan = asyncio.run(pipeline.preview(IncomingMessage(
            message, user_id=user, channel=channel, guild=guild, display_name=name, explicit=explicit)))
    data = plan.as_dict()
    if as_json:
        out.print_json(json.dumps(data, ensure_ascii=False))
        return
    out.print(f"[bold]respond:[/] {plan.respond} ({plan.reason})   [bold]flagged:[/] {plan.flagged}   "
              f"[bold]retrieval:[/] {plan.retrieval}", highlight=False)
    if plan.recalled:
        out.print("[bold]recalled:[/]")
        for m in plan.recalled:
            out.print(f"  {m.score:.3f} [{m.kind}] {m.text}", highlight=False, markup=False)
    out.print("[bold]timings ms:[/] " + ", ".join(f"{k}={v:.2f}" for k, v in data["timings_ms"].items()),
              highlight=False)
    out.print(plan.prompt.render() if plan.prompt else "(no prompt: the bot would not reply)", highlight=False,
              markup=False)


@app.command()
def summary(
    channel: Annotated[str, typer.Option("--channel", "-c", help="Channel id.")],
    guild: GuildOpt = None,
    set_core: Annotated[list[str] | None, typer.Option("--set-core", help="Operator: replace this channel's permanent "
                                                                      "core (repeat for several lines; pass '' to "
                                                                      "clear).")] = None,
    db: DbOption = None,
    as_json: JsonFlag = False,
) -> None:
    """Show a channel's rolling summary (L2), or set its permanent core.

    Example: gieok summary --channel cafe --guild g1 --set-core "이 채널은 여행 이야기 전용이다"
    """
    from ..chat.conversation.recent import conversation_of

    with _open(db) as memory:
        layers = _conversation_memory(memory)
        conversation = conversation_of(guild, channel)
        if set_core is not None:
            layers.summaries.set_core(conversation, [line for line in set_core if line.strip()])
        view = layers.summary_view(conversation)
    if as_json:
        out.print_json(json.dumps(view, ensure_ascii=False))
        return
    from rich.markdown import Markdown  # markdown-it: only here

    out.print(Markdown(view["markdown"]))


@app.command()
def facts(
    user: Annotated[str | None, typer.Option("--user", "-u", help="Only facts about this user.")] = None,
    guild: GuildOpt = None,
    history: Annotated[bool, typer.Option("--history", help="Include superseded facts.")] = False,
    db: DbOption = None,
    as_json: JsonFlag = False,
) -> None:
    """List long-term facts (L3): user facts, guild facts and lore, with validity.

    Example: gieok facts --user 42 --history
    """
    with _open(db) as memory:
        found = _conversation_memory(memory).facts.facts(user_id=user, guild=guild, include_history=history)
    if as_json:
        out.print_json(json.dumps([f.as_dict() for f in found], ensure_ascii=False))
        return
    table = Table(title=f"{len(found)} fact(s)")
    for column in ("block", "type", "guild", "user", "topic", "current", "fact"):
        table.add_column(column, justify="right" if column == "block" else "left")
    for f in found:
        table.add_row(str(f.block_index), f.fact_type, f.guild or "-", f.user_id or "-", f.topic or "-",
                      "yes" if f.current else f"→ {f.superseded_by}", f.text)
    out.print(table)


@app.command()
def lore(
    file: Annotated[Path, typer.Argument(help="Text file: one lore fact per line; '#' comments; "
                                              "'topic: fact' allowed.")],
    db: DbOption = None,
) -> None:
    """Seed lore (facts about the bot's world, visible everywhere). Idempotent: seeded lines are skipped.

    Example: gieok lore lore.txt
    """
    with _open(db) as memory:
        added = _conversation_memory(memory).facts.seed_lore(file)
    out.print(f"seeded {added} new lore fact(s) from {file}")


@app.command("forget-user")
def forget_user(
    user: Annotated[str, typer.Argument(help="User id whose facts and messages are erased.")],
    yes: Annotated[bool, typer.Option("--yes", help="Do not ask for confirmation.")] = False,
    db: DbOption = None,
) -> None:
    """Erase every fact about a user and every message they wrote, in all guilds.

    A server running on the same --db (or sharing $GIEOK_REDIS) drops them from its live stream too.

    Example: gieok forget-user 42 --yes
    """
    if not yes and not typer.confirm(f"Erase all facts and messages of user {user}?"):
        raise InvalidInputError("not confirmed; nothing erased")
    with _erasing(db, "gieok forget-user") as memory:  # the deployment's live stream redacted too
        result = _conversation_memory(memory).forget_user(user, reason="gieok forget-user")
    out.print(f"erased {result['facts']} fact(s), {result['messages']} message block(s), "
              f"{result['l1_rows']} recent message(s), {result['summary_items']} summary item(s) of user {user}; "
              f"{result['neighbours_reembedded']} neighbouring turn(s) embedded again without their words")


@users_commands.command("list")
def users_list(
    after: Annotated[str | None, typer.Option("--after", help="Start after this user id (paging).")] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, max=10_000, help="At most this many.")] = 100,
    db: DbOption = None,
    as_json: JsonFlag = False,
) -> None:
    """The users of a memory: names seen, messages, facts, conversations, first and last seen.

    Example: gieok users list --limit 20
    """
    with _open(db, existing=True) as memory:
        found = _conversation_memory(memory).tables.users_page(after, limit)
    if as_json:
        out.print_json(json.dumps([u.as_dict() for u in found], ensure_ascii=False))
        return
    table = Table(title=f"{len(found)} user(s)")
    for column in ("user", "names", "messages", "facts", "conversations", "last seen"):
        table.add_column(column)
    for u in found:
        table.add_row(u.user_id, ", ".join(u.names) or "-", str(u.messages), str(u.facts), str(u.conversations),
                      "-" if u.last_seen is None else f"{u.last_seen:.0f}")
    out.print(table)


@users_commands.command("export")
def users_export(
    user: Annotated[str, typer.Argument(help="The user id whose data is written.")],
    to: Annotated[Path | None, typer.Option("--out", "-o", help="File to write (default: stdout).")] = None,
    db: DbOption = None,
) -> None:
    """Write everything held about one user as JSON (an access request): messages, notes, facts
    with their history and sources, statements their messages made, summary items made from them.

    Example: gieok users export 42 --out 42.json
    """
    with _open(db, existing=True) as memory:
        parts = _conversation_memory(memory).user_data(user)
        if to is None:
            for part in parts:
                typer.echo(part, nl=False)
            typer.echo()
            return
        written = 0
        try:
            handle = to.open("w", encoding="utf-8")
        except OSError as exc:  # a folder that is not there, a folder given as the file, no permission
            raise InvalidInputError(f"cannot open {to}: {exc.strerror}") from None
        with handle:
            for part in parts:
                handle.write(part)
                written += len(part)
    out.print(f"wrote {written:,} characters of user {user}'s data to {to}")


@app.command()
def chat(
    db: DbOption = None,
    name: Annotated[str | None, typer.Option("--name", help="Your display name (default: $USER).")] = None,
) -> None:
    """Talk to the bot in this terminal: the Discord bot's memory and runtime, for one local user.

    Needs a language model: GIEOK_GEMINI_API_KEY, or GIEOK_LLM_CHAIN=openai:<model> with GIEOK_OPENAI_BASE_URL (Ollama, llama.cpp).

    In the chat: /summary /facts /timer /inspect /forget /help /quit (Ctrl-D and Ctrl-C leave too; everything is saved).

    Example: GIEOK_LLM_CHAIN=openai:qwen2.5:7b gieok chat --name 민지
    """  # noqa: E501 - --help keeps the docstring's line breaks, so a paragraph stays on one line
    from ..chat.adapters.terminal import run_chat
    from ..chat.llm.configured import require_llm

    settings = load()
    require_llm(settings)  # before opening anything: one line naming what to set
    run_chat(settings, db=db, user_name=name, console=out)


@app.command()
def bot(
    db: DbOption = None,
    serve: Annotated[bool, typer.Option("--serve", help="Also run `gieok serve` in this process: the bot's memory "
                                                        "as the default tenant, its events and health live.")] = False,
    host: Annotated[str | None, typer.Option(help="With --serve: address (default 127.0.0.1).")] = None,
    port: Annotated[int | None, typer.Option(help="With --serve: port (default 8420).")] = None,
    redis: RedisOption = None,
    shard_id: Annotated[int | None, typer.Option(help="This process's shard (0 … --shard-count - 1).")] = None,
    shard_count: Annotated[int | None, typer.Option(help="Processes the bot's guilds are split over.")] = None,
) -> None:
    """Run the Discord bot: DISCORD_TOKEN plus a language model (Gemini key or an OpenAI-compatible chain).

    Several processes run one bot when they share a PostgreSQL --db and a --redis: as shards
    (--shard-id/--shard-count) or as replicas of the same shard (each message answered once).

    Example: DISCORD_TOKEN=… GIEOK_GEMINI_API_KEY=… gieok bot --db bot.db --serve
    Example: gieok bot --db postgresql://bot@db/gieok --redis redis://cache:6379/0 --shard-id 0 --shard-count 2
    """
    overrides: dict[str, Any] = dict(given(db, redis))
    if shard_id is not None:
        overrides["discord_shard_id"] = shard_id
    if shard_count is not None:
        overrides["discord_shard_count"] = shard_count
    settings = load(**overrides)
    try:  # discord.py (the discord extra) takes ~0.5 s to import: only for `gieok bot`
        from ..chat.adapters.discord_bot import run_discord_bot
    except ImportError as exc:
        raise MissingExtraError("gieok bot", "discord", exc.name) from None
    # Started while PostgreSQL or Redis is away (a restart, a deploy): wait for them, a line each try,
    # up to startup_wait_seconds, rather than exit and live only because a supervisor restarts us.
    ServiceWait("gieok bot", settings.startup_wait_seconds)(reach_services, settings)
    if not serve:
        run_discord_bot(settings)
        return
    try:  # the server extra, only with --serve
        from ..server.beside import run_discord_bot_with_server
    except ImportError as exc:
        raise MissingExtraError("gieok bot --serve", "server", exc.name) from None
    run_discord_bot_with_server(settings, host=host, port=port)


