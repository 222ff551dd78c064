"""The `gieok` command line run in this process, through the real entry point.

`gieok(*args)` calls `gieok.cli.main()` — the function the `gieok` console script runs — with
`sys.argv` set, inside click's `CliRunner.isolation` (its own stdin, stdout, stderr and
environment overrides), and turns the `SystemExit` it ends with into a return code. So an error
takes the same path as in a shell: a `GieokError` becomes one line on stderr and exit 1. What a
separate process would cost (a fresh interpreter, loading the embedding model and the Korean
analyser, ~3–5 s a call) is paid once per test session instead.

The command line prints through rich consoles made when its modules are imported
(`gieok.cli.options.out` / `err`, the benchmarks' progress console). rich looks up
`sys.stdout`/`sys.stderr` when it prints, but decides the colour system, whether the console is
interactive (live progress bars) and, if $COLUMNS was set then, the width once, when the console
is made — from the streams of whatever process imported it (a terminal under `pytest -s`).
`_consoles_on_pipes` points them at the runner's streams for the call and makes them what they
would be in a subprocess whose output is piped: no colour, not interactive, $COLUMNS wide. The
product's consoles are otherwise untouched, and restored afterwards.

Use a real subprocess where the process boundary is the point (stdio MCP, signals, `--workers`,
a server started for HTTP, a pseudo-terminal, an install without extras, the console script).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from click.testing import CliRunner
from rich.console import Console

__all__ = ["Ran", "gieok"]

COLUMNS = 200


@dataclass(frozen=True)
class Ran:
    """What a `gieok` run left: as `subprocess.CompletedProcess` names it."""

    args: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str


def _product_consoles() -> list[Console]:
    from gieok.cli import options

    consoles = [options.out, options.err]
    try:
        from benchmarks import report
    except ImportError:  # an install without the benchmarks
        return consoles
    return [*consoles, report.console]


@contextmanager
def _set(obj: Any, **values: Any) -> Iterator[None]:
    old = {name: obj.__dict__[name] for name in values}
    obj.__dict__.update(values)
    try:
        yield
    finally:
        obj.__dict__.update(old)


@contextmanager
def _consoles_on_pipes(stdout: Any, stderr: Any, columns: int) -> Iterator[None]:
    with ExitStack() as stack:
        for console in _product_consoles():
            stack.enter_context(_set(console, _file=stderr if console.stderr else stdout, _force_terminal=False,
                                     _color_system=None, is_interactive=False, _width=columns))
        yield


def gieok(*args: str | Path, env_db: Path | None = None, stdin: str | None = None,
          env: Mapping[str, str | None] | None = None, columns: int = COLUMNS) -> Ran:
    """Run `gieok ARGS…` in process; `env_db` is $GIEOK_DB, `env` more variables (None unsets one)."""
    from gieok.cli import main

    argv = tuple(str(a) for a in args)
    environment: dict[str, str | None] = {"COLUMNS": str(columns), "GIEOK_EMBEDDER": None}
    if env_db is not None:
        environment["GIEOK_DB"] = str(env_db)
    environment.update(env or {})
    runner = CliRunner()
    with runner.isolation(input=stdin, env=environment) as (out, err, _):
        saved_argv = sys.argv
        sys.argv = ["gieok", *argv]
        try:
            with _consoles_on_pipes(sys.stdout, sys.stderr, columns):
                try:
                    main()
                    code: int = 0
                except SystemExit as exit_:
                    code = _exit_code(exit_.code)
                finally:
                    sys.stdout.flush()
                    sys.stderr.flush()
        finally:
            sys.argv = saved_argv
        return Ran(argv, code, out.getvalue().decode("utf-8"), err.getvalue().decode("utf-8", "backslashreplace"))


def _exit_code(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    sys.stderr.write(f"{code}\n")  # sys.exit("message"): printed, exit 1, as the interpreter does
    return 1
