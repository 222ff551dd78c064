"""Every curl line in README.md and docs/server.md runs, as written, against a real `gieok serve`.

What is run: every line of a shell code block (```bash / ```sh) and every inline code span that
invokes curl, plus the lines that set the variables those lines use (`K=…; S=…`,
`export GIEOK_KEY="$(gieok keys create …)"`), in document order, README first, all against one
server and one memory (the default tenant) — a reader who follows README and then docs/server.md
does the same. Each line goes to `bash -c` verbatim; **the only substitution is the port**:
`localhost:8420` and `127.0.0.1:8420` become the free loopback port the test's server listens on.

The server is `gieok serve --db chat.db --port <free>` started in a fresh directory (tmp), the
`--db` every documented `gieok keys create` line names, so a documented key-making line run in
that directory makes a key the server knows. Before any line runs, the test makes an admin key
with the real `gieok keys create --json` and exports it as GIEOK_KEY and GIEOK_API_KEY, the
variables a reader has set by then.

How the HTTP status is seen without touching a line: `curl` on the lines' PATH is a wrapper
script that runs the real curl with the same arguments plus `--dump-header <file>`, so each call
leaves its response headers beside the test. Each line must exit 0, every curl call in it must
get a 2xx, and its output must hold what the route promises (EXPECTATIONS: the block written, the
search's answer, the events…). Event streams (`curl -N …/v1/events`) never end: they run until
their expectation shows up (the stream's start, or an event for `since=0`), at most
STREAM_SECONDS, and are then stopped.

A line that mentions curl but is not a command to run must be listed in SKIPPED with the reason.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from typer.core import TyperGroup
from typer.main import get_command

from gieok.cli import app as cli_app
from live_server import probe

ROOT = Path(__file__).resolve().parent.parent
DOCUMENTS = (ROOT / "README.md", ROOT / "docs" / "server.md", ROOT / "docs" / "agents.md")  # in reading order
DOCUMENTED_PORT = 8420
DB_NAME = "chat.db"  # what every documented `gieok keys create` / `gieok serve` pair names
STREAM_SECONDS = 30.0
LINE_SECONDS = 120.0  # the first search loads the embedding model
REAL_CURL = shutil.which("curl")
GIEOK_BIN = Path(sys.executable).parent  # where the venv put `gieok`, which documented lines call

pytestmark = pytest.mark.skipif(REAL_CURL is None, reason="curl is not installed (apt-get install curl): "
                                                          "the documented lines are curl commands")

# A line that mentions curl and is not a command to run: its text -> why it is skipped. Empty
# today: every mention is a command. A stale entry fails `test_skips_name_lines_that_exist`.
SKIPPED: dict[str, str] = {}

# What each search in the docs must find: its query -> a text its top hit holds.
SEARCH_ANSWERS = {
    "민지 고양이 이름": "보리야",
    "which company made Alex an offer": "Nuvola Labs",
}

_FENCE = re.compile(r"^\s*(```|~~~)\s*([\w+-]*)")
_SHELL_FENCES = {"bash", "sh", "shell", "console", "zsh"}
_INLINE = re.compile(r"`([^`\n]+)`")
_MENTIONS_CURL = re.compile(r"\bcurl\b")
_INVOKES_CURL = re.compile(r"(?:^|[;&|]\s*|\$\(\s*|\b(?:until|while|if)\s+)curl\s")
_DOCUMENTED_HOST = re.compile(rf"\b(localhost|127\.0\.0\.1):{DOCUMENTED_PORT}\b")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_USES = re.compile(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)")
_PROVIDED = ("GIEOK_KEY", "GIEOK_API_KEY")  # set by the test, as a reader has set them


@dataclass(frozen=True)
class Snippet:
    """One runnable line of a document, where it stands and what it is."""

    document: str
    number: int
    text: str
    invokes_curl: bool
    assigns: tuple[str, ...]  # the variables it sets when it is nothing but assignments

    @property
    def where(self) -> str:
        return f"{self.document}:{self.number}"

    def uses(self) -> set[str]:
        return set(_USES.findall(self.text))


# -- finding the lines -----------------------------------------------------------------------------

def _code(path: Path) -> Iterator[tuple[int, str, bool]]:
    """(line number, code, from a shell block) for each line of a shell code block (backslash
    continuations joined) and each inline code span outside blocks."""
    fence: str | None = None
    pending: tuple[int, str] | None = None
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        opened = _FENCE.match(line)
        if opened:
            fence = None if fence is not None else opened.group(2).lower()
            continue
        if fence is None:
            for span in _INLINE.findall(line):
                yield number, span.strip(), False
        elif fence in _SHELL_FENCES:
            start, text = pending if pending else (number, "")
            if line.rstrip().endswith("\\"):
                pending = (start, text + line.rstrip()[:-1] + " ")
                continue
            pending = None
            yield start, (text + line).strip(), True


def assigned_names(text: str) -> tuple[str, ...]:
    """The variables a line sets when it is nothing but assignments (`K=…; S=…`,
    `export X="$(…)"`); () for anything else, such as `NAME=… command`, which sets NAME for that
    one command only."""
    lexer = shlex.shlex(text, posix=True, punctuation_chars=";&|")
    lexer.whitespace_split = True
    try:
        tokens = list(lexer)
    except ValueError:  # unbalanced quotes: not a plain assignment
        return ()
    names: list[str] = []
    statement: list[str] = []
    for token in [*tokens, ";"]:
        if token not in (";", "&&"):
            statement.append(token)
            continue
        if statement[:1] == ["export"]:
            statement = statement[1:]
        if len(statement) != 1 or "=" not in statement[0] or not _NAME.match(statement[0].split("=", 1)[0]):
            return ()
        names.append(statement[0].split("=", 1)[0])
        statement = []
    return tuple(names)


def documented_snippets(path: Path) -> list[Snippet]:
    """The curl lines of `path` and the shell lines that assign something (whether a curl line
    needs them is decided over all documents: `needed_snippets`)."""
    found = []
    for number, text, in_shell_block in _code(path):
        if not text or text.startswith("#"):
            continue
        invokes = bool(_INVOKES_CURL.search(text))
        assigns = assigned_names(text) if in_shell_block else ()
        if invokes or assigns or _MENTIONS_CURL.search(text):
            found.append(Snippet(path.relative_to(ROOT).as_posix(), number, text, invokes, assigns))
    return found


def needed_snippets() -> list[Snippet]:
    """Every curl line of the documents, and every assignment a curl line needs (directly or
    through another assignment, like K's use of GIEOK_KEY), in document order."""
    snippets = [s for path in DOCUMENTS for s in documented_snippets(path) if s.text not in SKIPPED]
    needed: set[str] = set().union(*(s.uses() for s in snippets if s.invokes_curl))
    while True:
        more = set().union(*(s.uses() for s in snippets if set(s.assigns) & needed)) - needed
        if not more:
            break
        needed |= more
    return [s for s in snippets if s.invokes_curl or set(s.assigns) & needed]


def on_port(text: str, port: int) -> str:
    """The one change made to a documented line: the documented port becomes the test server's."""
    return _DOCUMENTED_HOST.sub(rf"\g<1>:{port}", text)


# -- what each route must answer -------------------------------------------------------------------

@dataclass
class Outcome:
    line: str
    stdout: str
    cwd: Path


def _json(outcome: Outcome) -> object:
    return json.loads(outcome.stdout)


def _search_finds_its_answer(outcome: Outcome) -> bool:
    payload = re.search(r"-d '(\{.*\})'", outcome.line)
    assert payload, f"a search line without a -d '{{…}}' body: {outcome.line}"
    query = json.loads(payload.group(1))["query"]
    assert query in SEARCH_ANSWERS, f"add the text the search {query!r} must find to SEARCH_ANSWERS"
    hits = json.loads(outcome.stdout)["hits"]
    return bool(hits) and SEARCH_ANSWERS[query] in hits[0]["block"]["text"]


def _redirected_file_has_lines(outcome: Outcome) -> bool:
    target = re.search(r">\s*(\S+)", outcome.line)
    assert target, f"an export line that writes nowhere: {outcome.line}"
    lines = (outcome.cwd / target.group(1)).read_text(encoding="utf-8").splitlines()
    return len(lines) >= 2 and json.loads(lines[0]).get("format") == "gieok-blocks"


def _block_number(outcome: Outcome) -> int:
    """The block index a line names in its path."""
    number = re.search(r"/v1/memories/(\d+)", outcome.line)
    assert number, outcome.line
    return int(number.group(1))


def _block_number_matches(outcome: Outcome) -> bool:
    return bool(json.loads(outcome.stdout)["block_index"] == _block_number(outcome))


@dataclass(frozen=True)
class Expectation:
    """What a line whose text matches `pattern` must print (the first match decides)."""

    pattern: str
    promise: str
    holds: Callable[[Outcome], bool]


EXPECTATIONS = (
    Expectation(r"/v1/webhooks/\d+/deliveries", "list the endpoint's deliveries",
                lambda o: isinstance(_json(o)["deliveries"], list)),
    Expectation(r"/v1/webhooks/\d+/rotate", "give the endpoint a new secret",
                lambda o: _json(o)["secret"].startswith("whsec_")),
    Expectation(r"-X DELETE \S*/v1/webhooks/\d+", "delete the endpoint", lambda o: "deleted" in _json(o)),
    Expectation(r"/v1/webhooks -d", "register the endpoint and show its secret",
                lambda o: _json(o)["secret"].startswith("whsec_") and _json(o)["id"] >= 1),
    Expectation(r"/v1/webhooks\b", "list the endpoints", lambda o: isinstance(_json(o)["webhooks"], list)),
    Expectation(r"/v1/conversations/messages -d", "store the conversation's messages",
                lambda o: len(json.loads(o.stdout)["stored"]) + len(json.loads(o.stdout)["duplicates"]) >= 1),
    Expectation(r"/v1/conversations/context", "give the context of the next reply",
                lambda o: "츄르" in json.loads(o.stdout)["text"]),
    Expectation(r"/readyz", "wait until the server is warm", lambda o: '"status":"ready"' in o.stdout),
    Expectation(r"/v1/events\?since=0", "replay the memory's events from the start",
                lambda o: "event: memory.added" in o.stdout),
    Expectation(r"/v1/events", "open the event stream", lambda o: ": gieok event stream" in o.stdout),
    Expectation(r"/mcp\b", "list the MCP tools", lambda o: "search_memory" in o.stdout),
    Expectation(r"-X DELETE .*/v1/conversations/messages/", "delete the message and what came from it",
                lambda o: _json(o)["erased"]["messages"] == 1 or _json(o)["already_deleted"] is True),
    Expectation(r"/v1/facts\?", "list the facts", lambda o: isinstance(_json(o)["facts"], list)),
    Expectation(r"-X DELETE \S*/v1/memories/\d+", "forget the block",
                lambda o: _json(o) == {"forgotten": [_block_number(o)], "already_forgotten": False}),
    Expectation(r"/v1/memories:batch", "return the blocks written",
                lambda o: len(json.loads(o.stdout)["blocks"]) >= 1),
    Expectation(r"/v1/memories -d", "return the block written",
                lambda o: json.loads(o.stdout)["block_index"] >= 1 and json.loads(o.stdout)["text"] in o.line),
    Expectation(r"/v1/memories/\d+", "return that block", _block_number_matches),
    Expectation(r"/v1/memories\?", "list blocks", lambda o: len(json.loads(o.stdout)["items"]) >= 1),
    Expectation(r"/v1/search", "find the answer", _search_finds_its_answer),
    Expectation(r"/v1/verify", "verify the chain", lambda o: json.loads(o.stdout)["ok"] is True),
    Expectation(r"/v1/export", "write the export", _redirected_file_has_lines),
    Expectation(r"/v1/import", "import the blocks", lambda o: json.loads(o.stdout)["imported"] >= 1),
)


def expectation_for(line: str) -> Expectation | None:
    return next((e for e in EXPECTATIONS if re.search(e.pattern, line)), None)


# -- the server and the curl wrapper ---------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def clean_environment(bin_dirs: list[Path]) -> dict[str, str]:
    """This process's environment without GIEOK_* (a reader's own settings must not steer the
    lines), with `bin_dirs` first on PATH."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIEOK_")}
    env["PATH"] = os.pathsep.join([*(str(d) for d in bin_dirs), env.get("PATH", "")])
    return env


def write_curl_wrapper(directory: Path) -> Path:
    """A `curl` that records each call's response headers in $GIEOK_DOCS_CALLS and then is the
    real curl with the documented arguments."""
    directory.mkdir()
    wrapper = directory / "curl"
    wrapper.write_text("#!/bin/sh\n"
                       "# the test's curl: the real one, plus the response headers dumped for the test\n"
                       f'exec {shlex.quote(str(REAL_CURL))} --dump-header "$GIEOK_DOCS_CALLS/$$.headers" "$@"\n')
    wrapper.chmod(0o755)
    return directory


def statuses(calls: Path) -> list[tuple[int, str]]:
    """(final HTTP status, content type) of each curl call recorded in `calls`."""
    found = []
    for headers in sorted(calls.glob("*.headers")):
        text = headers.read_text(encoding="latin-1")
        codes = re.findall(r"^HTTP/[\d.]+ (\d{3})", text, flags=re.MULTILINE)
        types = re.findall(r"^content-type:\s*(.+?)\s*$", text, flags=re.MULTILINE | re.IGNORECASE)
        found.append((int(codes[-1]) if codes else 0, types[-1] if types else ""))
    return found


@dataclass
class Served:
    port: int
    home: Path  # the directory the lines run in; the server's --db is home / DB_NAME
    env: dict[str, str] = field(repr=False)
    log: Path


def _wait_until_up(process: subprocess.Popen[bytes], url: str, log: Path) -> None:
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"gieok serve exited: {log.read_text()}")
        try:
            if probe().get(f"{url}/healthz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            time.sleep(0.2)
    raise RuntimeError("gieok serve did not answer in 90 s")


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """One real server for the module, in a fresh directory, with an admin key made by the real
    `gieok keys create --json` in GIEOK_KEY and GIEOK_API_KEY."""
    home = tmp_path_factory.mktemp("docs-curl")
    env = clean_environment([write_curl_wrapper(home / "bin"), GIEOK_BIN])
    assert (GIEOK_BIN / "gieok").exists(), f"the documented lines call `gieok`, which is not in {GIEOK_BIN}"
    made = subprocess.run(["gieok", "keys", "create", "--tenant", "default", "--role", "admin", "--db", DB_NAME,
                           "--json"], cwd=home, env=env, capture_output=True, text=True, timeout=60, check=True)
    created = json.loads(made.stdout)
    assert created["db"] == str((home / DB_NAME).resolve()), "keys create --json names the memory it wrote to"
    env["GIEOK_KEY"] = env["GIEOK_API_KEY"] = created["key"]
    port = free_port()
    log = home / "serve.log"
    with log.open("wb") as sink:
        process = subprocess.Popen(["gieok", "serve", "--db", DB_NAME, "--port", str(port)], cwd=home, env=env,
                                   stdout=sink, stderr=subprocess.STDOUT)
    try:
        _wait_until_up(process, f"http://127.0.0.1:{port}", log)
        yield Served(port, home, env, log)
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


# -- running a line --------------------------------------------------------------------------------

@dataclass
class Run:
    exit_code: int | None  # None: a stream the test stopped
    stdout: str
    stderr: str
    calls: list[tuple[int, str]]


def run_assignment(line: str, served: Served) -> tuple[dict[str, str], str]:
    """Run an assignment line as written (with `set -a`, so what it sets reaches the next lines
    as a reader's shell would keep it) and return the environment it leaves, and its stderr."""
    env_file = served.home / "env.after"
    script = f'set -a\n{line}\ndoc_line_status=$?\nenv -0 > "{env_file}"\nexit $doc_line_status\n'
    done = subprocess.run(["bash", "-c", script], cwd=served.home, env=served.env, capture_output=True, text=True,
                          timeout=LINE_SECONDS)
    assert done.returncode == 0, f"{line}\nexit {done.returncode}: {done.stderr}"
    pairs = env_file.read_text(encoding="utf-8").split("\0")
    after = dict(pair.split("=", 1) for pair in pairs if "=" in pair)
    after.pop("doc_line_status", None)
    return after, done.stderr


def run_line(line: str, served: Served, calls: Path, expectation: Expectation | None) -> Run:
    env = {**served.env, "GIEOK_DOCS_CALLS": str(calls)}
    calls.mkdir()
    if " -N " not in f" {line} ":
        done = subprocess.run(["bash", "-c", line], cwd=served.home, env=env, capture_output=True, text=True,
                              timeout=LINE_SECONDS)
        return Run(done.returncode, done.stdout, done.stderr, statuses(calls))
    return run_stream(line, served, env, calls, expectation)


def run_stream(line: str, served: Served, env: dict[str, str], calls: Path, expectation: Expectation | None) -> Run:
    """A stream never ends by itself: read it until its expectation holds (or STREAM_SECONDS
    pass), then stop it, the whole process group (bash and curl)."""
    process = subprocess.Popen(["bash", "-c", line], cwd=served.home, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, start_new_session=True)
    assert process.stdout is not None and process.stderr is not None
    output = process.stdout.fileno()
    chunks: list[bytes] = []
    reader = threading.Thread(target=lambda: chunks.extend(iter(lambda: os.read(output, 4096), b"")), daemon=True)
    reader.start()
    deadline = time.monotonic() + STREAM_SECONDS
    while time.monotonic() < deadline and process.poll() is None:
        seen = b"".join(chunks).decode("utf-8", "replace")
        if expectation is not None and expectation.holds(Outcome(line, seen, served.home)):
            break
        time.sleep(0.1)
    still_streaming = process.poll() is None
    if still_streaming:
        os.killpg(process.pid, signal.SIGTERM)
    _, stderr = process.communicate(timeout=30)
    reader.join(timeout=5)
    stdout = b"".join(chunks).decode("utf-8", "replace")
    return Run(None if still_streaming else process.returncode, stdout, stderr.decode("utf-8", "replace"),
               statuses(calls))


def problems_of(snippet: Snippet, line: str, run: Run, served: Served) -> list[str]:
    """What is wrong with one curl line's run: [] when it exited 0 (or streamed until stopped),
    every call got a 2xx, and the output holds what the route promises."""
    problems = []
    if run.exit_code not in (0, None):
        problems.append(f"exit {run.exit_code}")
    if not run.calls:
        problems.append("no curl call was recorded")
    problems += [f"HTTP {code}" for code, _ in run.calls if not 200 <= code < 300]
    if " -N " in f" {line} " and not any(kind.startswith("text/event-stream") for _, kind in run.calls):
        problems.append("not an event stream")
    expectation = expectation_for(line)
    if expectation is None:
        problems.append("no expectation in EXPECTATIONS matches this line: add what it must print")
    elif not problems:
        try:
            if not expectation.holds(Outcome(line, run.stdout, served.home)):
                problems.append(f"it does not {expectation.promise}")
        except (ValueError, KeyError, TypeError, IndexError) as exc:  # e.g. the output is not the JSON promised
            problems.append(f"it does not {expectation.promise} ({type(exc).__name__}: {exc})")
    if not problems:
        return []
    return [f"{snippet.where}: {snippet.text}\n  ran: {line}\n  {'; '.join(problems)}\n"
            f"  stdout: {run.stdout[:600]!r}\n  stderr: {run.stderr[-600:]!r}"]


# -- the tests -------------------------------------------------------------------------------------

def test_every_documented_curl_line_runs_as_written(served: Served) -> None:
    snippets = needed_snippets()
    curl_lines = [s for s in snippets if s.invokes_curl]
    assert len(curl_lines) >= 15, [s.where for s in curl_lines]  # README's and server.md's, the MCP one inline
    failures: list[str] = []
    for index, snippet in enumerate(snippets):
        line = on_port(snippet.text, served.port)
        if snippet.assigns and not snippet.invokes_curl:
            served.env, stderr = run_assignment(line, served)
            unset = [name for name in snippet.assigns if not served.env.get(name)]
            assert not unset, f"{snippet.where}: {snippet.text} left {unset} empty: {stderr}"
            if "gieok keys create" in line:  # the key's memory is named, and it is the server's
                assert str((served.home / DB_NAME).resolve()) in stderr, f"{snippet.where}: {stderr}"
            continue
        run = run_line(line, served, served.home / f"calls-{index}", expectation_for(line))
        failures += problems_of(snippet, line, run, served)
    assert not failures, f"{len(failures)} documented line(s) of {len(curl_lines)} failed:\n\n" + "\n\n".join(failures)
    assert "Traceback" not in served.log.read_text(encoding="utf-8", errors="replace")


def test_every_variable_a_curl_line_uses_is_set_by_an_earlier_documented_line() -> None:
    known = set(_PROVIDED)
    undefined = []
    for snippet in needed_snippets():
        missing = snippet.uses() - known
        if missing:
            undefined.append(f"{snippet.where}: {sorted(missing)} in {snippet.text}")
        known |= set(snippet.assigns)
    assert not undefined, "variables no earlier line sets:\n" + "\n".join(undefined)


def test_lines_that_mention_curl_are_run_or_skipped_with_a_reason() -> None:
    for path in DOCUMENTS:
        for snippet in documented_snippets(path):
            if _MENTIONS_CURL.search(snippet.text) and not snippet.invokes_curl:
                assert snippet.text in SKIPPED, f"{snippet.where} mentions curl but runs nothing: {snippet.text}"


def test_skips_name_lines_that_exist() -> None:
    texts = {s.text for path in DOCUMENTS for s in documented_snippets(path)}
    assert all(reason for reason in SKIPPED.values())
    assert not set(SKIPPED) - texts, f"SKIPPED names lines the docs no longer have: {set(SKIPPED) - texts}"


def test_the_finder_reads_blocks_inline_code_and_assignments() -> None:
    readme = documented_snippets(DOCUMENTS[0])
    assert any(s.text.startswith("curl -N") for s in readme)
    server = documented_snippets(DOCUMENTS[1])
    assert any("/mcp" in s.text and s.invokes_curl for s in server), "the inline MCP curl line"
    assert assigned_names('K="Authorization: Bearer $GIEOK_KEY"; S=http://127.0.0.1:8420') == ("K", "S")
    assert assigned_names('export GIEOK_KEY="$(gieok keys create --db chat.db)"  # a comment') == ("GIEOK_KEY",)
    assert assigned_names("GIEOK_API_KEY=gk_… gieok mcp --db chat.db") == ()
    assert on_port("curl localhost:8420/v1 http://127.0.0.1:8420/x", 5) == "curl localhost:5/v1 http://127.0.0.1:5/x"


# -- keys and the server on the same --db ----------------------------------------------------------

_DB = re.compile(r"--db\s+([^\s)\"';]+)")
_SERVES = re.compile(r"\bgieok (?:serve|mcp|bot)\b")


def _blocks(path: Path) -> Iterator[list[str]]:
    """The lines of each shell code block of `path`."""
    block: list[str] | None = None
    for line in path.read_text(encoding="utf-8").splitlines():
        opened = _FENCE.match(line)
        if opened:
            if block is not None:
                yield block
                block = None
            elif opened.group(2).lower() in _SHELL_FENCES:
                block = []
            continue
        if block is not None:
            block.append(line)


def _pairing_problem(where: str, lines: list[str]) -> str | None:
    """A `gieok keys create` beside a `gieok serve` (or mcp, bot) must name the same --db: each
    command of the lines (split at `&&`, `;`, `|`, comments dropped) on its own."""
    commands = [part for line in lines for part in re.split(r"&&|;|\|", line.split(" #", 1)[0])]
    makers = [command for command in commands if "gieok keys create" in command]
    users = [command for command in commands if _SERVES.search(command)]
    if not makers or not users:
        return None
    dbs = {match for command in makers + users for match in _DB.findall(command) or ["(none)"]}
    return None if len(dbs) == 1 else f"{where}: keys and server on different --db {sorted(dbs)}: {makers + users}"


def test_keys_create_and_the_server_name_the_same_db_in_docs_and_help() -> None:
    problems = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for number, block in enumerate(_blocks(path), start=1):
            problems.append(_pairing_problem(f"{path.name} shell block {number}", block))
    root = get_command(cli_app)
    keys = root.commands["keys"] if isinstance(root, TyperGroup) else None
    assert isinstance(root, TyperGroup) and isinstance(keys, TyperGroup)
    commands = [*root.commands.items(), *((f"keys {name}", command) for name, command in keys.commands.items())]
    for name, command in [("gieok", root), *commands]:
        help_lines = (command.help or "").splitlines()
        problems += [_pairing_problem(f"gieok {name} --help", [line]) for line in help_lines]
    assert not [p for p in problems if p], "\n".join(p for p in problems if p)
