"""What every `gieok` command shares: consoles, the common options, opening the memory."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from ..errors import InvalidInputError
from ..memory import Memory
from ..server.settings import ServerSettings

__all__ = ["load", "out", "err", "DbOption", "RedisOption", "JsonFlag", "GuildOpt", "ChannelOpt", "UserOpt", "_open",
           "_erasing", "_scope", "given", "progress", "rate_column"]

out = Console()
err = Console(stderr=True)

DbOption = Annotated[
    str | None,  # not a Path: a postgresql:// URL must keep its double slash
    typer.Option("--db", help="Memory file, or a postgresql://user:pass@host/db URL. Default: $GIEOK_DB, else the "
                              "per-user data directory.", show_default=False),
]
RedisOption = Annotated[
    str | None,
    typer.Option("--redis", help="redis://host:6379/0 shared by several bot and server processes (queues, leases, "
                                 "rate limits, active channels, live events). Default: $GIEOK_REDIS, else none: "
                                 "everything in this process.", show_default=False),
]
JsonFlag = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]
GuildOpt = Annotated[str | None, typer.Option("--guild", "-g", help="Guild (server) id.")]
ChannelOpt = Annotated[str | None, typer.Option("--channel", "-c", help="Channel id (one conversation).")]
UserOpt = Annotated[str | None, typer.Option("--user", "-u", help="User id.")]


def load(**overrides: Any) -> ServerSettings:
    """Every setting the command line knows — the engine's, the chat's and the server's — from
    `gieok.toml` and `GIEOK_*`, with the command's options on top (those not given are None)."""
    return ServerSettings.load(**overrides)


def _open(db: str | Path | None, *, existing: bool = False, **overrides: Any) -> Memory:
    """The memory at --db (or the settings' `db`). `existing`: for a command that only reads or
    erases, a memory file that is not there is an error, not a new empty memory to answer from
    (a mistyped --db gave an empty access request, and "erased 0")."""
    if db is not None:
        overrides["db"] = str(db)
    settings = load()
    if existing:
        _must_exist(settings.with_overrides(db=overrides["db"]) if "db" in overrides else settings, "created")
    return Memory(settings=settings, **overrides)


def _must_exist(settings: ServerSettings, nothing: str) -> None:
    """A command that reads or erases a memory file refuses one that is not there (`nothing`: what
    it then did not do)."""
    if not settings.uses_database_server() and not settings.db_path().is_file():
        raise InvalidInputError(f"no memory at {settings.db_path()}: check --db (or GIEOK_DB); nothing was {nothing}")


@contextmanager
def _erasing(db: str | Path | None, who: str) -> Iterator[Memory]:
    """The memory at --db for an erasure (`gieok forget`, `gieok forget-user`), opened as the default
    tenant of a deployment whose home it is: what the erasure publishes reaches the deployment's live
    stream wherever that is kept, as a `gieok mcp`'s erasure does — the Redis stream (`--redis` /
    GIEOK_REDIS) redacted at once, or without Redis the servers' own buffers through the store's event
    relay (each `gieok serve` on it reads the relay); and the webhooks' queue. A server running beside
    this command otherwise kept, until they left its stream, the events of what was erased that name
    no block (a user's flagged message, a fact the model made of their words). Redis or PostgreSQL
    away: waited for as `gieok serve` does (`startup_wait_seconds`), then one line and nothing erased
    — never erased with the stream left holding it."""
    import logging

    from ..server import ServerState
    from ..types import DEFAULT_TENANT

    settings = load(**given(db))
    _must_exist(settings, "erased")
    state = ServerState.open_without_stream(settings, who, logging.getLogger("gieok.cli"))
    try:
        with Memory(settings=settings) as memory:
            state.tenants.attach(DEFAULT_TENANT, memory)
            yield memory
    finally:
        state.close()


def given(db: str | Path | None = None, redis: str | None = None) -> dict[str, str]:
    """The settings overrides the --db and --redis options make (only those given)."""
    return {name: str(value) for name, value in (("db", db), ("redis", redis)) if value}


def _scope(guild: str | None, channel: str | None, user: str | None) -> dict[str, str]:
    return {k: v for k, v in (("guild", guild), ("channel", channel), ("user", user)) if v is not None}


@contextmanager
def progress(description: str, total: int | None) -> Iterator[Callable[..., None]]:
    """A progress bar on stderr for a long operation: yields `advance(n=1)`."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), rate_column(),
                  TimeElapsedColumn(), console=err, transient=True) as bar:
        task = bar.add_task(description, total=total)
        yield lambda n=1: bar.advance(task, n)


def rate_column(unit: str = "/s") -> Any:
    """A progress bar column: items per second (blocks, texts) over the last half minute."""
    from rich.progress import ProgressColumn, Task
    from rich.text import Text

    class Rate(ProgressColumn):
        def render(self, task: Task) -> Text:
            speed = task.finished_speed or task.speed
            return Text("" if speed is None else f"{speed:,.1f}{unit}", style="progress.data.speed")

    return Rate()
