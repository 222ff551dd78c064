"""The `gieok` command line: the engine's commands (`engine.py`), the chat's (`chat.py`), the
server's (`server.py`) and, from a source checkout, the benchmarks (`gieok bench`). Every command
takes --db (default $GIEOK_DB, else the per-user data directory). Errors print one readable line
and exit non-zero."""

from __future__ import annotations

import sys

import typer

from ..errors import GieokError
from .chat import conversation_commands
from .engine import engine_commands
from .options import err
from .server import keys_commands, server_commands

__all__ = ["app", "main"]

app = typer.Typer(
    name="gieok",
    help="gieok (기억): layered long-term memory for chat agents.\n\nExample: gieok demo",
    no_args_is_help=True,
    rich_markup_mode="rich",
    pretty_exceptions_enable=False,
    add_completion=False,
)
app.add_typer(engine_commands)
app.add_typer(conversation_commands)
app.add_typer(server_commands)
app.add_typer(keys_commands, name="keys")

BENCHMARKS_MISSING = ("gieok bench needs the benchmarks, which are not part of the installed package: from a "
                      "source checkout, `pip install -r requirements-dev.lock -e .` installs them")


def _bench_app() -> typer.Typer:
    """The benchmarks' commands when they are installed (a source checkout's dev install), else a
    `gieok bench` that says how to get them."""
    try:
        from benchmarks.cli import bench_app
    except ImportError as exc:
        if exc.name is not None and exc.name != "benchmarks" and not exc.name.startswith("benchmarks."):
            raise  # the benchmarks are there but something they import is not: say that, not "missing"
        missing = typer.Typer(help="Benchmarks (from a source checkout only).", invoke_without_command=True,
                              add_completion=False)

        @missing.callback()
        def explain(ctx: typer.Context) -> None:
            raise GieokError(BENCHMARKS_MISSING)

        return missing
    return bench_app


app.add_typer(_bench_app(), name="bench")


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
