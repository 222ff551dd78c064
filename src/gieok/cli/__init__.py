"""The `gieok` command line: the engine's commands (`engine.py`), the chat's (`chat.py`), the
server's (`server.py`) and, from a source checkout, the benchmarks (`gieok bench`). Every command
takes --db (default $GIEOK_DB, else the per-user data directory). Errors print one readable line
and exit non-zero."""

from __future__ import annotations

import sys

import typer
from rich.markup import escape

from .. import __version__
from ..errors import GieokError
from .chat import conversation_commands, users_commands
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


def _print_version(asked: bool) -> None:
    if asked:
        typer.echo(f"gieok {__version__}")
        raise typer.Exit()


@app.callback()
def _root(version: bool = typer.Option(False, "--version", help="Print gieok's version and exit.",
                                       callback=_print_version, is_eager=True)) -> None:
    """gieok (기억): layered long-term memory for chat agents."""


app.add_typer(engine_commands)
app.add_typer(conversation_commands)
app.add_typer(server_commands)
app.add_typer(keys_commands, name="keys")
app.add_typer(users_commands, name="users")

BENCHMARKS_MISSING = ("gieok bench needs the benchmarks, which are not part of the installed package: from a "
                      "source checkout, `pip install -r requirements-dev.lock -e .` installs them")


def _mount_benchmarks() -> None:
    """`gieok bench …`: the benchmarks' commands when they are installed (a source checkout's dev
    install), else a `gieok bench` that says how to get them, whatever follows it."""
    try:
        from benchmarks.cli import bench_app
    except ImportError as exc:
        if exc.name is not None and exc.name != "benchmarks" and not exc.name.startswith("benchmarks."):
            raise  # the benchmarks are there but something they import is not: say that, not "missing"

        @app.command("bench", context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
                     add_help_option=False, help="Benchmarks (a source checkout's dev install only).")
        def bench_missing() -> None:
            raise GieokError(BENCHMARKS_MISSING)

        return
    app.add_typer(bench_app, name="bench")


_mount_benchmarks()


def main() -> None:
    """`gieok`: run the command line; a `GieokError` is one line on stderr and exit 1."""
    try:
        app(standalone_mode=True)
    except GieokError as exc:
        err.print(f"[red]error:[/] {escape(str(exc))}", highlight=False, soft_wrap=True)  # [server] is not markup
        sys.exit(1)
    except KeyboardInterrupt:
        err.print("interrupted")
        sys.exit(130)


if __name__ == "__main__":
    main()
