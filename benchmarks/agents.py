"""`gieok bench agents`: many agents at once against one `gieok serve`, each running the agent loop.

The run, in order:

1. **Server.** A fresh SQLite database in the work directory, a write key for the default tenant
   (one key for every agent: the tenant comes from the key) and a real `gieok serve` subprocess
   on 127.0.0.1 with the embedded default embedder, offline (`bench context`'s environment: no
   language model, so no summaries and no facts; timezone UTC).
2. **Exchanges.** The LoCoMo file's conversations cut into exchanges: turns 1 and 2 of a
   conversation are one, 3 and 4 the next, …; the first turn is the user's message, the second
   the assistant's reply. Each agent takes a run of consecutive exchanges (the next ones of the
   file: no exchange is played twice while the file lasts; `exchanges_reused` counts the ones
   played again once it is used up). A run may go on into the file's next conversation: its
   texts, said by the same agent's user and assistant.
3. **Each concurrency level** (`--agents`): a warm-up loop in a channel of its own (not timed),
   then that many agents at once, each with its own conversation (channel `agents<level>-<n>`)
   and its own user (`<channel>.<speaker>`, named after the speaker of its first exchange's
   first turn; the reply goes under the other speaker's name), together `--turns` loops. A loop:
   `add_messages` with the user's message (one message), `context` for it (the user and the
   message as the query, so the query is embedded: the normal call), `add_messages` with the
   reply. A level stops early after `--max-seconds` (the loops under way finish).
   `--index behind` sends the adds with `index: "behind"` (the answer comes once the message is
   in L1; its turn block is written in the background): the level's clock and CPU then run on
   until every turn block is written (`/v1/stats` counts them), so `turns_per_s` is what the
   server sustains, writes included; `answered_turns_per_s` is the loops over the time to the
   last answer.
4. **Check.** After each level every agent's conversation is listed through the API
   (`GET /v1/memories?channel=…&kind=turn`): each block its answers named must be there, and as
   many turn blocks as it stored messages.

The client is `gieok.client.AsyncClient` — one per agent (one connection each), all on one event
loop in this process, retries off so a failure is counted, not hidden; each connection is open
before the clock starts. Times are the client's wall time per call. `cpu_s_per_turn` is the
server's CPU time during the level (utime + stime from /proc of the server process and any
children) over the loops done; `turns_per_s` is loops done (three calls each, all answered 2xx)
over the level's wall time.

Targets (issue 41, never adjusted): at 1 agent `add_p50_ms` ≤ 25 and `context_p50_ms` ≤ 15; at
32 agents ≥ 40 turns/s, no errors and `context_p95_ms` ≤ 100.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from rich.console import Console

from benchmarks.context import DEFAULT_LLM_MODEL, _server_env, slug
from benchmarks.fill import bench_workdir
from benchmarks.locomo import Turn, load_locomo
from benchmarks.passage_cost import SETS, _split_name
from benchmarks.people import _rss_mb
from benchmarks.report import (
    embedding_engines,
    median,
    p50_p95,
    print_and_write,
    progress_bar,
    results_table,
    table_console,
)
from benchmarks.server import REQUEST_SECONDS, ServeProcess, create_key
from gieok.chat.agent.agents import INDEX_MODES
from gieok.errors import InvalidInputError
from gieok.memory import Memory, remove_memory_files

__all__ = ["DEFAULT_DATA", "Exchange", "load_exchanges", "measure_agents", "print_agents", "run_agents_bench"]

DEFAULT_DATA = SETS["locomo"]  # ../shared/data/locomo/locomo_dev5.json beside the repository
DEFAULT_TURNS = 300
DEFAULT_MAX_SECONDS = 120.0
WRITES_BEHIND_SECONDS = 120.0  # --index behind: how long a level waits for its last turn blocks
CONTEXT_BUDGET = 2000  # the context route's default budget
LIST_PAGE = 200  # GET /v1/memories' largest page
# the targets of issue 41 (never adjusted)
ONE_AGENT_ADD_P50_MS = 25.0
ONE_AGENT_CONTEXT_P50_MS = 15.0
MANY_AGENTS = 32
MANY_TURNS_PER_S = 40.0
MANY_CONTEXT_P95_MS = 100.0
WARM_UP = ("에이전트 준비 운동: 오늘 저녁에 뭐 먹을까? Warm-up before the agents start.",
           "김치찌개 어때? A warm-up reply, not timed.")

T = TypeVar("T")


# -- the data --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Exchange:
    """Two consecutive turns of a LoCoMo conversation: the user's message and the assistant's reply."""

    conversation: str  # the file's sample_id
    user_turn: str  # dia ids
    reply_turn: str
    user_name: str
    user_text: str
    reply_name: str
    reply_text: str


def load_exchanges(path: str | Path) -> list[Exchange]:
    """The file's conversations as exchanges, in order; a file that is not LoCoMo, or has no
    conversation of two turns, is an `InvalidInputError` (one line)."""
    turns = load_locomo(path).turns
    by_conversation: dict[str, list[Turn]] = {}
    for turn in turns:
        by_conversation.setdefault(turn.conversation, []).append(turn)
    exchanges = [Exchange(conversation, first.dia_id, second.dia_id, first.speaker.strip()[:100],
                          _split_name(first)[1], second.speaker.strip()[:100], _split_name(second)[1])
                 for conversation, its in by_conversation.items()
                 for first, second in zip(its[0::2], its[1::2], strict=False)]
    if not exchanges:
        raise InvalidInputError(f"{path} has no conversation of two turns or more")
    return exchanges


class _Deck:
    """Hands out runs of consecutive exchanges, the file's next ones each time; once the file is
    used up it starts again (the ids stay distinct: they carry the pass)."""

    def __init__(self, exchanges: list[Exchange]) -> None:
        self.exchanges = exchanges
        self.dealt = 0

    def deal(self, n: int) -> list[tuple[int, Exchange]]:
        """`n` exchanges with their pass over the file (0: the first time it is played)."""
        out = [((self.dealt + i) // len(self.exchanges), self.exchanges[(self.dealt + i) % len(self.exchanges)])
               for i in range(n)]
        self.dealt += n
        return out

    @property
    def reused(self) -> int:
        return max(0, self.dealt - len(self.exchanges))


def split_turns(turns: int, agents: int) -> list[int]:
    """`turns` loops over `agents` agents, as evenly as they go (the first ones get one more)."""
    return [turns // agents + (1 if a < turns % agents else 0) for a in range(agents)]


# -- measuring -------------------------------------------------------------------------------------

def _cpu_seconds(pid: int) -> float:
    """utime + stime of the server process and of its live children (/proc/<pid>/stat), seconds."""
    import psutil

    try:
        pids = [pid, *(child.pid for child in psutil.Process(pid).children(recursive=True))]
    except psutil.NoSuchProcess:
        return 0.0
    ticks = 0
    for p in pids:
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rpartition(")")[2].split()
        except (FileNotFoundError, ProcessLookupError):  # a child gone meanwhile
            continue
        ticks += int(fields[11]) + int(fields[12])  # utime and stime: the stat's fields 14 and 15
    return ticks / os.sysconf("SC_CLK_TCK")


@dataclass
class _Level:
    """What one concurrency level measured."""

    add_ms: list[float] = field(default_factory=list)
    context_ms: list[float] = field(default_factory=list)
    server_add_ms: list[float] = field(default_factory=list)  # the answers' timings_ms total_ms
    server_context_ms: list[float] = field(default_factory=list)
    add_stages: dict[str, list[float]] = field(default_factory=dict)  # each stage of the answers' timings_ms
    context_stages: dict[str, list[float]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    turns: int = 0  # loops whose three calls all answered
    attempted: int = 0  # loops started before the time limit
    queries: set[str] = field(default_factory=set)
    repeated_queries: int = 0
    blocks: dict[str, set[int]] = field(default_factory=dict)  # channel -> block indexes its answers named
    stored_in: dict[str, int] = field(default_factory=dict)  # channel -> messages its answers stored
    messages_stored: int = 0
    index: str = "now"  # add_messages's index: "now" or "behind"

    async def call(self, what: str, times: list[float], work: Awaitable[T]) -> T | None:
        """`work` timed (client wall time); a failure is counted and answers None."""
        t0 = time.perf_counter()
        try:
            result = await work
        except Exception as exc:  # a failed call is an error of the run, not a crash
            self.errors.append(f"{what}: {type(exc).__name__}: {exc}"[:300])
            return None
        times.append((time.perf_counter() - t0) * 1000)
        return result


@dataclass(frozen=True)
class _Agent:
    """An agent's conversation and the two sides of it: one user (the person the agent serves)
    and the assistant, named after the speakers of its first exchange."""

    channel: str
    user: str
    user_name: str
    assistant_name: str

    @classmethod
    def of(cls, channel: str, first: Exchange) -> _Agent:
        return cls(channel, f"{channel}.{slug(first.user_name)}", first.user_name, first.reply_name)


async def _loop(memory: Any, level: _Level, agent: _Agent, number: int, played: int, exchange: Exchange) -> bool:
    """One agent loop: the user's message, the context for it, the reply. True if all three answered."""
    from gieok.client import Message

    channel, user = agent.channel, agent.user
    suffix = f"#{played}" if played else ""  # a message id is stored once per conversation
    asked = Message(id=f"{exchange.conversation}:{exchange.user_turn}{suffix}", role="user",
                    text=exchange.user_text, user=user, name=agent.user_name)
    reply = Message(id=f"{exchange.conversation}:{exchange.reply_turn}{suffix}", role="assistant",
                    text=exchange.reply_text, name=agent.assistant_name)
    ok = True
    for step, message in enumerate((asked, reply)):
        stored = await level.call(f"add {channel} #{number}", level.add_ms,
                                  memory.add_messages(channel, [message], index=level.index))
        if stored is None:
            ok = False
        else:
            level.messages_stored += stored.stored_count
            level.stored_in[channel] = level.stored_in.get(channel, 0) + stored.stored_count
            level.server_add_ms.append(float(stored.timings_ms.get("total_ms", 0.0)))
            for stage, ms in stored.timings_ms.items():
                level.add_stages.setdefault(stage, []).append(float(ms))
            level.blocks.setdefault(channel, set()).update(
                s.block_index for s in stored.stored if s.block_index is not None)
        if step == 0:  # the context before the reply, for the user's message
            query = exchange.user_text.strip()
            if query in level.queries:  # its vector may be cached: the embedder's key is the text
                level.repeated_queries += 1
            level.queries.add(query)
            context = await level.call(f"context {channel} #{number}", level.context_ms,
                                       memory.context(channel, user=user, query=exchange.user_text,
                                                      budget_tokens=CONTEXT_BUDGET))
            if context is None:
                ok = False
            else:
                level.server_context_ms.append(float(context.timings_ms.get("total_ms", 0.0)))
                for stage, ms in context.timings_ms.items():
                    if isinstance(ms, (int, float)):
                        level.context_stages.setdefault(stage, []).append(float(ms))
    return ok


async def _agent(memory: Any, level: _Level, channel: str, work: list[tuple[int, Exchange]], deadline: float,
                 advance: Callable[[int], None]) -> None:
    if not work:
        return
    agent = _Agent.of(channel, work[0][1])
    for number, (played, exchange) in enumerate(work, start=1):
        if time.perf_counter() >= deadline:
            return
        level.attempted += 1
        if await _loop(memory, level, agent, number, played, exchange):
            level.turns += 1
        advance(1)


async def _check_stored(memory: Any, level: _Level) -> dict[str, Any]:
    """Each agent's conversation listed through the API: every block its answers named is there,
    and as many turn blocks as messages it stored."""
    missing = 0
    listed = 0
    for channel in sorted(set(level.blocks) | set(level.stored_in)):
        expected = level.blocks.get(channel, set())
        found: set[int] = set()
        cursor: str | None = None
        while True:
            page = await memory.list_blocks(scope={"channel": channel}, kinds="turn", limit=LIST_PAGE, cursor=cursor)
            found.update(block.block_index for block in page.items)
            cursor = page.next_cursor
            if cursor is None:
                break
        listed += len(found)
        missing += max(len(expected - found), level.stored_in.get(channel, 0) - len(found))
    return {"conversations": len(level.stored_in), "messages_stored": level.messages_stored,
            "turn_blocks_listed": listed, "turn_blocks_missing": missing}


async def _warm_up(memory: Any, level: int) -> None:
    """One loop in a channel of its own before the level's clock starts (not timed)."""
    from gieok.client import Message

    channel = f"agents{level}-warm-up"
    user = f"{channel}.minji"
    try:
        await memory.add_messages(channel, [Message(id="u", role="user", text=WARM_UP[0], user=user, name="민지")])
        await memory.context(channel, user=user, query=WARM_UP[0], budget_tokens=CONTEXT_BUDGET)
        await memory.add_messages(channel, [Message(id="a", role="assistant", text=WARM_UP[1], name="bot")])
    except Exception as exc:  # nothing is measured against a server that cannot run one loop
        raise RuntimeError(f"the warm-up loop before {level} agent(s) failed: {type(exc).__name__}: {exc}") from exc


async def _turn_blocks(memory: Any) -> int:
    return int((await memory.stats()).by_kind.get("turn", 0))


async def _written(memory: Any, expected: int, deadline: float) -> bool:
    """Wait until the memory holds `expected` turn blocks (the writes behind done), until `deadline`."""
    while await _turn_blocks(memory) < expected:
        if time.perf_counter() >= deadline:
            return False
        await asyncio.sleep(0.02)
    return True


async def _run_level(url: str, key: str, pid: int, agents: int, turns: int, deck: _Deck,
                     max_seconds: float, index: str = "now") -> dict[str, Any]:
    from gieok.client import AsyncClient

    shares = split_turns(turns, agents)
    work = [deck.deal(share) for share in shares]
    clients = [AsyncClient(url, key, timeout=REQUEST_SECONDS, retries=0) for _ in range(agents)]
    level = _Level(index=index)
    try:
        await _warm_up(clients[0], agents)
        await asyncio.gather(*(client.ready() for client in clients))  # each connection open before the clock
        turn_blocks_before = await _turn_blocks(clients[0])
        rss_before = _rss_mb(pid)
        with progress_bar(f"{agents} agent(s) at once: {turns} loops (add, context, add), "
                          f"at most {max_seconds:g} s", turns) as advance:
            cpu_before = _cpu_seconds(pid)
            started = time.perf_counter()
            deadline = started + max_seconds
            await asyncio.gather(*(_agent(client, level, f"agents{agents}-{n:02d}", share, deadline, advance)
                                   for n, (client, share) in enumerate(zip(clients, work, strict=True), start=1)))
            answered = time.perf_counter() - started
            written = index == "now" or await _written(
                clients[0], turn_blocks_before + level.messages_stored, time.perf_counter() + WRITES_BEHIND_SECONDS)
            elapsed = time.perf_counter() - started
            cpu = _cpu_seconds(pid) - cpu_before
        rss_after = _rss_mb(pid)
        stored = await _check_stored(clients[0], level)
    finally:
        await asyncio.gather(*(client.close() for client in clients))
    add, context = p50_p95(level.add_ms), p50_p95(level.context_ms)
    done = level.turns
    return {
        "add_p50_ms": add["p50"], "add_p95_ms": add["p95"],
        "context_p50_ms": context["p50"], "context_p95_ms": context["p95"],
        "turns_per_s": round(done / elapsed, 2) if elapsed > 0 else 0.0,
        "answered_turns_per_s": round(done / answered, 2) if answered > 0 else 0.0,
        "writes_behind_s": round(elapsed - answered, 3), "all_written": written,
        "errors": len(level.errors) + (0 if written else 1),
        "cpu_s_per_turn": round(cpu / done, 4) if done else None,
        "turns": done, "turns_planned": turns, "seconds": round(elapsed, 3),
        "stopped_early": level.attempted < turns,
        "server_add_p50_ms": round(median(level.server_add_ms), 3),
        "server_context_p50_ms": round(median(level.server_context_ms), 3),
        # where the server's time went: the p50 of each stage its answers report (timings_ms)
        "server_add_stages_p50_ms": {k: round(median(v), 3) for k, v in sorted(level.add_stages.items())},
        "server_context_stages_p50_ms": {k: round(median(v), 3) for k, v in sorted(level.context_stages.items())},
        "server_cpu_s": round(cpu, 3),
        "server_rss_mb": {"before": round(rss_before, 1), "after": round(rss_after, 1)},
        "calls": {"add": len(level.add_ms), "context": len(level.context_ms)},
        "repeated_queries": level.repeated_queries,
        "stored": stored,
        "_first_errors": level.errors[:3],
    }


async def _health_engines(url: str, key: str) -> dict[str, str] | None:
    """What the server says embeds (`/v1/health` `embedder.engines`), if it says."""
    import httpx

    async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {key}"},
                                 timeout=REQUEST_SECONDS) as http:
        response = await http.get("/v1/health")
    if response.status_code != 200:
        return None
    engines = (response.json().get("embedder") or {}).get("engines")
    return dict(engines) if isinstance(engines, dict) else None


async def _levels(url: str, key: str, pid: int, agents: Sequence[int], turns: int, deck: _Deck,
                  max_seconds: float, index: str) -> tuple[dict[str, dict[str, Any]], dict[str, str] | None]:
    levels = {str(a): await _run_level(url, key, pid, a, turns, deck, max_seconds, index) for a in agents}
    return levels, await _health_engines(url, key)


def _targets(levels: dict[str, dict[str, Any]]) -> dict[str, Any]:
    one, many = levels.get("1"), levels.get(str(MANY_AGENTS))
    return {
        "one_agent": None if one is None else {
            "add_p50_ms": one["add_p50_ms"], "add_limit_ms": ONE_AGENT_ADD_P50_MS,
            "context_p50_ms": one["context_p50_ms"], "context_limit_ms": ONE_AGENT_CONTEXT_P50_MS,
            "pass": one["add_p50_ms"] <= ONE_AGENT_ADD_P50_MS and one["context_p50_ms"] <= ONE_AGENT_CONTEXT_P50_MS},
        f"{MANY_AGENTS}_agents": None if many is None else {
            "turns_per_s": many["turns_per_s"], "min_turns_per_s": MANY_TURNS_PER_S, "errors": many["errors"],
            "context_p95_ms": many["context_p95_ms"], "context_p95_limit_ms": MANY_CONTEXT_P95_MS,
            "pass": many["turns_per_s"] >= MANY_TURNS_PER_S and many["errors"] == 0
            and many["context_p95_ms"] <= MANY_CONTEXT_P95_MS},
    }


def measure_agents(agents: Sequence[int], turns: int = DEFAULT_TURNS, *, data_path: str | Path = DEFAULT_DATA,
                   max_seconds: float = DEFAULT_MAX_SECONDS, workdir: Path | None = None,
                   index: str = "now") -> dict[str, Any]:
    """The run of the module docstring; the report `print_agents` prints."""
    agents = sorted(set(agents))
    if not agents or agents[0] < 1 or turns < agents[-1] or max_seconds <= 0:
        raise InvalidInputError("agents must be positive, turns >= the most agents, max_seconds > 0")
    if index not in INDEX_MODES:
        raise InvalidInputError(f"index must be one of {', '.join(INDEX_MODES)}, not {index!r}")
    exchanges = load_exchanges(data_path)
    deck = _Deck(exchanges)
    workdir = bench_workdir("agents", workdir)
    db = workdir / "agents.db"
    remove_memory_files(db)
    Memory(db, timezone="UTC").close()
    key = create_key(db)
    server = ServeProcess(db, workdir / "server.log", env=_server_env(None, DEFAULT_LLM_MODEL))
    try:
        levels, engines = asyncio.run(_levels(server.url, key, server.process.pid, agents, turns, deck, max_seconds,
                                              index))
    finally:
        exit_code = server.stop()
    first_errors = {a: level.pop("_first_errors") for a, level in levels.items()}
    report: dict[str, Any] = {
        "agents": levels,
        "engine": engines if engines is not None else embedding_engines(),
        "engine_from": "the server's /v1/health" if engines is not None else "this process's settings",
        "turns": turns, "max_seconds": max_seconds, "context_budget_tokens": CONTEXT_BUDGET, "index": index,
        "data": str(data_path), "exchanges_in_file": len(exchanges), "exchanges_reused": deck.reused,
        "client": "gieok.client.AsyncClient, one per agent, one event loop, retries=0",
        "server_ready_s": round(server.ready_seconds or 0.0, 3),
        "errors": sum(level["errors"] for level in levels.values()),
    }
    report["targets"] = _targets(levels)
    report.update(_first_errors=first_errors, _server_exit=exit_code, _workdir=str(workdir), _db=str(db))
    return report


# -- the report ------------------------------------------------------------------------------------

def _verdict(passed: bool | None) -> str:
    return "[green]pass[/]" if passed else "[dim]not measured[/]" if passed is None else "[red]MISS[/]"


def print_agents(report: dict[str, Any], console: Console | None = None) -> None:
    out = table_console(console)
    engine = ", ".join(f"{role} {name}" for role, name in report["engine"].items())
    behind = report.get("index") == "behind"
    table = results_table(f"agents at once: {report['turns']} loops per row (add the user's message, its context "
                          f"with the query embedding, add the reply); adds with index {report.get('index', 'now')}"
                          f"{' (loops/s until every turn block is written)' if behind else ''}; engine {engine}; "
                          "client wall time",
                          ("agents", "loops", "loops/s", "add p50", "add p95", "context p50", "context p95",
                           "server add / context p50", "errors", "server CPU s/loop", "server RSS"))
    for agents, row in report["agents"].items():
        cpu = row["cpu_s_per_turn"]
        table.add_row(agents, f"{row['turns']}/{row['turns_planned']}{' (time limit)' if row['stopped_early'] else ''}",
                      f"{row['turns_per_s']:.1f}", f"{row['add_p50_ms']:.1f} ms", f"{row['add_p95_ms']:.1f} ms",
                      f"{row['context_p50_ms']:.1f} ms", f"{row['context_p95_ms']:.1f} ms",
                      f"{row['server_add_p50_ms']:.1f} / {row['server_context_p50_ms']:.1f} ms", str(row["errors"]),
                      "-" if cpu is None else f"{cpu:.4f}", f"{row['server_rss_mb']['after']:.0f} MB")
    out.print(table)
    checks = results_table("targets (issue 41)", ("target", "measured", "needed", "result"),
                           left=("target", "measured", "needed"))
    one = report["targets"]["one_agent"]
    if one is None:
        checks.add_row("1 agent", "(no 1-agent level)", "", _verdict(None))
    else:
        checks.add_row("1 agent: add p50, context p50", f"{one['add_p50_ms']:.1f} ms, {one['context_p50_ms']:.1f} ms",
                       f"≤ {ONE_AGENT_ADD_P50_MS:g} ms, ≤ {ONE_AGENT_CONTEXT_P50_MS:g} ms", _verdict(one["pass"]))
    many = report["targets"][f"{MANY_AGENTS}_agents"]
    if many is None:
        checks.add_row(f"{MANY_AGENTS} agents", f"(no {MANY_AGENTS}-agent level)", "", _verdict(None))
    else:
        checks.add_row(f"{MANY_AGENTS} agents: loops/s, errors, context p95",
                       f"{many['turns_per_s']:.1f}/s, {many['errors']}, {many['context_p95_ms']:.1f} ms",
                       f"≥ {MANY_TURNS_PER_S:g}/s, 0, ≤ {MANY_CONTEXT_P95_MS:g} ms", _verdict(many["pass"]))
    out.print(checks)
    for agents, row in report["agents"].items():
        stored = row["stored"]
        out.print(f"{agents} agent(s): {stored['messages_stored']} messages stored in {stored['conversations']} "
                  f"conversations; turn blocks listed {stored['turn_blocks_listed']}, missing "
                  f"{stored['turn_blocks_missing']}; queries seen before {row['repeated_queries']}",
                  highlight=False, markup=False)
        for error in report["_first_errors"][agents]:
            out.print(f"  first error: {error}", highlight=False, markup=False)
    if report["exchanges_reused"]:
        out.print(f"note: the file has {report['exchanges_in_file']} exchanges; {report['exchanges_reused']} were "
                  "played again (their queries may be answered from the embedder's cache)", highlight=False)
    code = report["_server_exit"]
    out.print(f"gieok serve stopped with SIGTERM: exit {code}"
              f"{' (graceful)' if code in (0, -signal.SIGTERM) else ' (NOT graceful)'}; work dir {report['_workdir']}",
              highlight=False, markup=False)


def run_agents_bench(agents: Sequence[int], turns: int = DEFAULT_TURNS, json_out: str | Path | None = None, *,
                     data_path: str | Path = DEFAULT_DATA, max_seconds: float = DEFAULT_MAX_SECONDS,
                     workdir: Path | None = None, index: str = "now") -> dict[str, Any]:
    report = measure_agents(agents, turns, data_path=data_path, max_seconds=max_seconds, workdir=workdir,
                            index=index)
    return print_and_write(report, print_agents, json_out)
