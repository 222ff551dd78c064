"""`gieok bench soak`: an hour of mixed load on the scale-out deployment, with faults every few
minutes — to find what only shows after an hour: memory or descriptors that leak, latency that
drifts, errors that appear once tables and queues have grown.

The deployment is `gieok bench chaos`'s (bench/chaos.py, chaos_deploy.py): a throwaway PostgreSQL
and Redis, `gieok serve --workers 2`, two bot processes answering through the loopback provider.
On it, for `duration` seconds:

- **agents** (threads, `gieok.client.Client` with retries, as an agent's client runs): the agent
  loop of `bench agents` (bench/agents.py: LoCoMo exchanges, one conversation per agent) — add the
  user's message, get the context for it, add the reply; then a pause;
- **a searcher**: `POST /v1/search` with the exchanges' texts as queries;
- **the chat driver** of `bench chaos`: explicit calls on a few channels, answered by the bots;
- **chores, once per window**: an import (`POST /v1/import`, an export made from ten LoCoMo
  exchanges with its hash chain), a user erased (a user of its own writes three messages, then
  `DELETE /v1/users/…`; the receipt must count them, unless it says `resumed` — a fault cut an
  earlier attempt short after it erased them —, and the access request after it must find none of
  their messages), a key created and revoked (the new key
  must be let in, the revoked one answered 401 on fresh connections — either worker);
- **faults**: one every `fault_every` seconds, `bench chaos`'s kinds in seeded rounds
  (bench/chaos_faults.py `Injector`);
- **samples** every `sample_every` seconds: RSS (/proc/<pid>/status VmRSS) and open descriptors
  (/proc/<pid>/fd) of every process: the serve supervisor and each worker, each bot, the
  PostgreSQL postmaster, Redis. A process started again after a fault keeps its role's name
  (its pids are listed).

Every HTTP attempt is recorded (chaos_load `RecordingTransport`); a failed attempt that was in
flight while a fault was under way (from its start to the first success after it, plus
`FAULT_SLACK_S`) is the fault's — one sent just before a restart began fails by it too (seen once
in the suite: sent 0.5 s before PostgreSQL's restart, answered 503 during it) — the others are
unexpected. An operation's latency is the client's wall time,
retries included; one that failed after its retries is an error whatever the time.

Targets (issue 43, reported, never adjusted): RSS of each process grows ≤ 10 % from the end of the
first window to the end of the run; each operation's p95 in the last window ≤ 1.5 × the first's
(operations with ≥ `JUDGED_MIN_CALLS` calls in both); 0 errors but the injected faults'.
"""

from __future__ import annotations

import json
import math
import os
import random
import threading
import time
import uuid
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console

from benchmarks.agents import CONTEXT_BUDGET, DEFAULT_DATA, Exchange, _Agent, _Deck, load_exchanges
from benchmarks.chaos import _Deployment, _wait, _warm_up
from benchmarks.chaos_deploy import BOT_START_SECONDS, BotProcess, ServeWorkers, bot_command
from benchmarks.chaos_faults import Fault, FaultPlan, Injector
from benchmarks.chaos_load import ChatDriver, History, RecordingTransport
from benchmarks.fill import bench_workdir
from benchmarks.loopback_llm import TAG, loopback_llm
from benchmarks.pg import RestartablePostgres
from benchmarks.redis_server import RedisServer
from benchmarks.report import p50_p95, print_and_write, progress_bar, results_table, table_console
from gieok.errors import InvalidInputError
from gieok.store.urls import with_schema

__all__ = ["SOAK_KINDS", "measure_soak", "print_soak", "run_soak"]

SCHEMA = "gieok_soak"
# the kinds this deployment can take (chaos_faults.KINDS of issue 42); kinds that need more
# of the deployment (a fault proxy) are not run here
SOAK_KINDS = ("kill_serve", "kill_bot", "stall_bot", "pg_restart_fast", "pg_restart_immediate", "redis_restart",
              "pg_drop", "redis_drop", "kill_bot_in_claim")
REQUEST_TIMEOUT_S = 30.0  # an attempt without an answer this long is a hang
RETRIES = 30  # with backoff 0.25 s doubling (capped by the client): rides out a restart of tens of seconds
FAULT_SLACK_S = 5.0  # after a fault's first success: requests already waiting still answer late
CHAT_FAULT_SLACK_S = 30.0  # a bot killed mid-turn loses the messages its turn took (docs/scale-out.md)
SETTLE_CAP_S = 180.0  # a fault's processes not all up again by then: its span ends there
DRAIN_S = 60.0  # after the load: for the chat messages still queued to be answered
REVOKED_PROBES = 3  # fresh connections, so both workers are likely asked
ERASE_MESSAGES = 3
IMPORT_EXCHANGES = 10
# the targets of issue 43 (never adjusted)
RSS_GROWTH_MAX_PCT = 10.0
P95_RATIO_MAX = 1.5
JUDGED_MIN_CALLS = 10


# -- what the run records ------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Call:
    """One operation as its caller saw it (retries included)."""

    op: str
    t0: float
    ms: float
    error: str | None = None  # the exception's class (or a check's name) when it failed


@dataclass(frozen=True, slots=True)
class Sample:
    t: float
    role: str
    pid: int
    rss_mb: float
    fds: int


@dataclass
class Record:
    """Calls, samples and chore outcomes, appended from any thread."""

    calls: list[Call] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)
    chores: list[dict[str, Any]] = field(default_factory=list)
    checks: list[Call] = field(default_factory=list)  # a chore's outcome that was wrong (its name as the error)
    examples: dict[str, str] = field(default_factory=dict)  # the first failure of each kind, in full
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, kind: str, item: Any) -> None:
        with self._lock:
            getattr(self, kind).append(item)

    def snapshot_samples(self) -> list[Sample]:
        with self._lock:
            return list(self.samples)

    def timed(self, op: str, work: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """`work(*args, **kwargs)` timed; a failure is recorded by its exception's class and answers None."""
        t0, started = time.time(), time.perf_counter()
        try:
            result = work(*args, **kwargs)
        except Exception as exc:  # a failed call is an error of the run, not a crash
            kind = f"HTTP {exc.response.status_code}" if isinstance(exc, httpx.HTTPStatusError) else type(exc).__name__
            detail = exc.response.text if isinstance(exc, httpx.HTTPStatusError) else str(exc)
            with self._lock:
                self.examples.setdefault(f"{op}: {kind}", detail[:500])
            self.add("calls", Call(op, t0, (time.perf_counter() - started) * 1000, kind))
            return None
        self.add("calls", Call(op, t0, (time.perf_counter() - started) * 1000))
        return result


# -- the processes ---------------------------------------------------------------------------------

def rss_and_fds(pid: int) -> tuple[float, int] | None:
    """(VmRSS in MB, open descriptors) of a live process; None once it is gone (or a zombie)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024, fds
    return None  # a zombie has no VmRSS


class Roles:
    """Every process of the deployment by role; a serve worker started again by uvicorn takes the
    place (the name) of the one that died."""

    def __init__(self, deployment: _Deployment, postgres: RestartablePostgres, redis: RedisServer) -> None:
        self.deployment = deployment
        self.postgres = postgres
        self.redis = redis
        self._workers: dict[str, int] = {}

    def _postmaster(self) -> int | None:
        try:  # its first line is the postmaster's pid; a restart writes the new one
            return int((self.postgres.data / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def _worker_slots(self) -> dict[str, int]:
        live = sorted(self.deployment.serve.worker_pids())
        self._workers = {name: pid for name, pid in self._workers.items() if pid in live}
        for pid in live:
            if pid not in self._workers.values():
                free = next(f"serve worker {n}" for n in range(1, len(live) + 2)
                            if f"serve worker {n}" not in self._workers)
                self._workers[free] = pid
        return dict(self._workers)

    def now(self) -> dict[str, int]:
        roles: dict[str, int | None] = {"serve supervisor": self.deployment.serve.serve.process.pid,
                                        **self._worker_slots()}
        roles.update({bot.name: bot.pid for bot in self.deployment.bots})
        roles["postgres postmaster"] = self._postmaster()
        roles["redis"] = self.redis.process.pid if self.redis.process is not None else None
        return {role: pid for role, pid in roles.items() if pid is not None}


class Sampler(threading.Thread):
    def __init__(self, roles: Roles, record: Record, stop: threading.Event, every: float) -> None:
        super().__init__(name="soak-sampler", daemon=True)
        self.roles, self.record, self.stop, self.every = roles, record, stop, every

    def sample(self) -> None:
        now = time.time()
        for role, pid in self.roles.now().items():
            seen = rss_and_fds(pid)
            if seen is not None:
                self.record.add("samples", Sample(now, role, pid, round(seen[0], 1), seen[1]))

    def run(self) -> None:
        while True:
            self.sample()
            if self.stop.wait(self.every):
                self.sample()  # the last one at the end of the load
                return


# -- the load ----------------------------------------------------------------------------------------

class SharedDeck:
    """bench agents' deck, shared by the threads."""

    def __init__(self, exchanges: list[Exchange]) -> None:
        self._deck = _Deck(exchanges)
        self._lock = threading.Lock()

    def deal(self, n: int) -> list[tuple[int, Exchange]]:
        with self._lock:
            return self._deck.deal(n)

    def counts(self) -> dict[str, int]:
        """The file's exchanges and how many were dealt (beyond the file: played again, their queries
        possibly answered from the embedder's cache)."""
        with self._lock:
            return {"exchanges_in_file": len(self._deck.exchanges), "exchanges_dealt": self._deck.dealt}


def _client(url: str, key: str, history: History) -> Any:
    from gieok.client import Client

    return Client(url, key, timeout=REQUEST_TIMEOUT_S, retries=RETRIES, backoff=0.25,
                  transport=RecordingTransport(history))


class AgentThread(threading.Thread):
    """bench agents' loop, over and over, in one conversation: the user's message, its context,
    the reply (module docstring)."""

    def __init__(self, number: int, url: str, key: str, deck: SharedDeck, history: History, record: Record,
                 stop: threading.Event, pause: float, seed: int) -> None:
        super().__init__(name=f"soak-agent-{number}", daemon=True)
        self.channel = f"soak-agent-{number:02d}"
        self.url, self.key, self.deck, self.history, self.record = url, key, deck, history, record
        self.stop, self.pause, self.rng = stop, pause, random.Random(seed)

    def run(self) -> None:
        from gieok.client import Message

        with _client(self.url, self.key, self.history) as client:
            agent: _Agent | None = None
            while not self.stop.is_set():
                played, exchange = self.deck.deal(1)[0]
                if agent is None:
                    agent = _Agent.of(self.channel, exchange)
                suffix = f"#{played}" if played else ""
                asked = Message(id=f"{exchange.conversation}:{exchange.user_turn}{suffix}", role="user",
                                text=exchange.user_text, user=agent.user, name=agent.user_name)
                reply = Message(id=f"{exchange.conversation}:{exchange.reply_turn}{suffix}", role="assistant",
                                text=exchange.reply_text, name=agent.assistant_name)
                self.record.timed("add_message", client.add_messages, self.channel, [asked])
                self.record.timed("context", client.context, self.channel, user=agent.user, query=exchange.user_text,
                                  budget_tokens=CONTEXT_BUDGET)
                self.record.timed("add_message", client.add_messages, self.channel, [reply])
                self.stop.wait(self.pause * self.rng.uniform(0.5, 1.5))


class SearchThread(threading.Thread):
    def __init__(self, url: str, key: str, deck: SharedDeck, history: History, record: Record,
                 stop: threading.Event, pause: float, seed: int) -> None:
        super().__init__(name="soak-search", daemon=True)
        self.url, self.key, self.deck, self.history, self.record = url, key, deck, history, record
        self.stop, self.pause, self.rng = stop, pause, random.Random(seed)

    def run(self) -> None:
        with _client(self.url, self.key, self.history) as client:
            while not self.stop.is_set():
                exchange = self.deck.deal(1)[0][1]
                self.record.timed("search", client.search, exchange.user_text, k=10)
                self.stop.wait(self.pause * self.rng.uniform(0.5, 1.5))


def locomo_export(exchanges: list[Exchange], channel: str, event_time: float) -> str:
    """An export (the `gieok export` format, NDJSON) of the exchanges' turns as notes, chained
    from genesis, so the server checks it as it checks any export."""
    from gieok.chain import GENESIS, digest_of, hash_of
    from gieok.memory.transfer import EXPORT_FORMAT, EXPORT_VERSION
    from gieok.types import Block, Scope
    from gieok.validate import clean_text  # as an import reads it: the digest is of the cleaned text

    lines = [json.dumps({"format": EXPORT_FORMAT, "version": EXPORT_VERSION, "embedder": None,
                         "blocks": 2 * len(exchanges)})]
    prev = GENESIS
    turns = [(e.user_name, e.user_text) for e in exchanges] + [(e.reply_name, e.reply_text) for e in exchanges]
    for number, (speaker, text) in enumerate(turns, start=1):
        block = Block(block_index=number, kind="note", text=clean_text(text, max_chars=10**7),
                      scope=Scope.of({"channel": channel}), speaker=speaker, event_time=event_time + number,
                      insert_time=event_time + number, importance=0.5, keywords=(), tags=("soak-import",),
                      metadata={}, conv_pos=None, content_digest="", prev_hash=prev, hash="")
        block = replace(block, content_digest=digest_of(block))
        block = replace(block, hash=hash_of(block))
        lines.append(json.dumps(block.as_dict(), ensure_ascii=False, sort_keys=True))
        prev = block.hash
    return "\n".join(lines) + "\n"


class Chores:
    """Once per window: an import, a user erased, a key created and revoked (module docstring)."""

    def __init__(self, url: str, write_key: str, admin_key: str, deck: SharedDeck, history: History,
                 record: Record) -> None:
        self.url, self.write_key, self.admin_key = url, write_key, admin_key
        self.deck, self.history, self.record = deck, history, record

    def _send(self, method: str, path: str, key: str, *, body: Any = None, content: str | None = None,
              recorded: bool = True) -> httpx.Response:
        """One request, retried on 503s and failed connections as the gieok client does (the same
        Idempotency-Key each time); the last answer."""
        headers = {"Authorization": f"Bearer {key}", "Idempotency-Key": uuid.uuid4().hex}
        transport: httpx.BaseTransport = RecordingTransport(self.history) if recorded else httpx.HTTPTransport()
        with httpx.Client(base_url=self.url, timeout=REQUEST_TIMEOUT_S, transport=transport) as http:
            for attempt in range(RETRIES + 1):
                try:
                    response = http.request(method, path, headers=headers, json=body,
                                            content=content.encode("utf-8") if content is not None else None)
                except httpx.RequestError:
                    if attempt == RETRIES:
                        raise
                else:
                    if response.status_code != 503 or attempt == RETRIES:
                        return response
                time.sleep(min(5.0, 0.25 * 2 ** attempt))
        raise AssertionError("unreachable")

    def _wrong(self, op: str, problem: str) -> None:
        self.record.add("checks", Call(op, time.time(), 0.0, problem))

    def _import(self, body: str) -> httpx.Response:
        return self._send("POST", "/v1/import", self.write_key, content=body).raise_for_status()

    def run_import(self, window: int) -> None:
        exchanges = [e for _, e in self.deck.deal(IMPORT_EXCHANGES)]
        body = locomo_export(exchanges, f"soak-import-w{window:02d}", time.time())
        response = self.record.timed("import", self._import, body)
        imported = response.json().get("imported") if response is not None else None
        self.record.add("chores", {"window": window, "chore": "import", "blocks": 2 * len(exchanges),
                                   "imported": imported})
        if response is not None and imported != 2 * len(exchanges):
            self._wrong("import", "import_count_wrong")

    def run_erase(self, window: int) -> None:
        from gieok.client import Message

        user = f"soak-erase-w{window:02d}.minji"
        channel = f"soak-erase-w{window:02d}"
        with _client(self.url, self.write_key, self.history) as client:
            for n, (_, exchange) in enumerate(self.deck.deal(ERASE_MESSAGES)):
                client.add_messages(channel, [Message(id=f"erase-{window}-{n}", role="user", text=exchange.user_text,
                                                      user=user, name="민지")])
            receipt = self.record.timed("erase_user", client.forget_user, user)
        erased = receipt.get("erased") if isinstance(receipt, dict) else None
        resumed = bool(receipt.get("resumed")) if isinstance(receipt, dict) else False
        self.record.add("chores", {"window": window, "chore": "erase_user", "user": user,
                                   "written": ERASE_MESSAGES, "erased": erased, "resumed": resumed})
        if receipt is None:
            return
        # its messages are recent lines (L1) until a turn block holds them: either count shows them
        # gone — unless an attempt cut short by a fault erased them first (`resumed`); either way,
        # what the access request finds afterwards is the proof
        counted = isinstance(erased, dict) and erased.get("messages", 0) + erased.get("l1_rows", 0) >= ERASE_MESSAGES
        with _client(self.url, self.admin_key, self.history) as admin:
            left = self.record.timed("user_data", admin.user_data, user)
        if left is not None and (left.get("messages") or left.get("pending_messages")):
            self._wrong("erase_user", "erase_incomplete")
        elif not counted and not resumed:
            self._wrong("erase_user", "erase_receipt_short")

    def run_key(self, window: int) -> None:
        def create_and_revoke() -> tuple[str, int]:
            made = self._send("POST", "/v1/keys", self.admin_key, body={"role": "read", "name": f"soak w{window}"})
            made.raise_for_status()
            key, key_id = made.json()["key"], int(made.json()["id"])
            let_in = self._send("GET", "/v1/stats", key, recorded=False).status_code
            self._send("DELETE", f"/v1/keys/{key_id}", self.admin_key).raise_for_status()
            return key, let_in

        outcome = self.record.timed("key_create_revoke", create_and_revoke)
        if outcome is None:
            return
        key, let_in = outcome
        after = [self._send("GET", "/v1/stats", key, recorded=False).status_code for _ in range(REVOKED_PROBES)]
        self.record.add("chores", {"window": window, "chore": "key_revoke", "new_key_status": let_in,
                                   "revoked_key_statuses": after})
        if let_in != 200:
            self._wrong("key_create_revoke", "new_key_refused")
        if any(status != 401 for status in after):
            self._wrong("key_create_revoke", "revoked_key_let_in")


class ChoreThread(threading.Thread):
    """Each window's chores at a quarter, half and three quarters of it."""

    def __init__(self, chores: Chores, started: float, window: float, windows: int, stop: threading.Event) -> None:
        super().__init__(name="soak-chores", daemon=True)
        self.chores, self.started, self.window, self.windows, self.stop = chores, started, window, windows, stop

    def run(self) -> None:
        plan = [(w, self.started + self.window * (w + share), job)
                for w in range(self.windows)
                for share, job in ((0.25, self.chores.run_import), (0.5, self.chores.run_erase),
                                   (0.75, self.chores.run_key))]
        for window, at, job in plan:
            if self.stop.wait(max(0.0, at - time.time())):
                return
            try:
                job(window)
            except Exception as exc:  # a chore that could not even be tried is an error of the run
                self.chores.record.add("calls", Call(f"chore {job.__name__}", time.time(), 0.0, type(exc).__name__))


class FaultThread(threading.Thread):
    """One fault every `every` seconds, the kinds in seeded rounds (chaos_faults)."""

    def __init__(self, deployment: _Deployment, kinds: list[str], every: float, end: float, seed: int,
                 faults: list[Fault], stop: threading.Event, settled: dict[int, float]) -> None:
        super().__init__(name="soak-faults", daemon=True)
        self.deployment, self.every, self.end, self.faults, self.stop = deployment, every, end, faults, stop
        self.settled = settled  # a fault's place in `faults` -> when every process was up again
        self.plan = FaultPlan(kinds, seed)
        self.injector = Injector(deployment, random.Random(seed))

    def run(self) -> None:
        at = time.time() + self.every
        while at < self.end:
            if self.stop.wait(max(0.0, at - time.time())):
                return
            fault = self.injector.inject(self.plan.next_kind(self.deployment.all_up()))
            self.faults.append(fault)
            if not fault.skipped:  # a worker started again answers 503 "warming" until it is: the fault's
                deadline = time.monotonic() + SETTLE_CAP_S
                while not self.deployment.all_up() and time.monotonic() < deadline and not self.stop.wait(0.2):
                    pass
                self.settled[len(self.faults) - 1] = time.time()
            at += self.every


# -- the run ------------------------------------------------------------------------------------------


def _admin_key(location: str) -> str:
    """An admin key for the default tenant (keys are created and revoked with one)."""
    from gieok.config import load_settings
    from gieok.server.auth import ApiKeys
    from gieok.server.tenants import DEFAULT_TENANT
    from gieok.store.factory import open_store

    settings = load_settings(db=location)
    store = open_store(settings.db_location(), busy_timeout_ms=settings.busy_timeout_ms)
    try:
        return ApiKeys(store).create(DEFAULT_TENANT, "admin", "bench soak")[0]
    finally:
        store.close()


def _first_replies(history: History) -> dict[str, float]:
    """Each chat tag's first reply (a send or an edit carrying it), by when it went out."""
    first: dict[str, float] = {}
    for event in history.snapshot("bot_events"):
        if event.get("ev") in ("send", "edit"):
            for tag in TAG.findall(str(event.get("text", ""))):
                first[tag] = min(first.get(tag, math.inf), float(event["t"]))
    return first


def _drain_chat(history: History) -> None:
    """Wait until every chat message delivered to a bot is answered (or DRAIN_S passes)."""
    with progress_bar("answering the chat messages still queued", 1) as advance:
        deadline = time.monotonic() + DRAIN_S
        while time.monotonic() < deadline:
            answered = _first_replies(history)
            if all(s.tag in answered for s in history.snapshot("sent") if s.delivered):
                break
            time.sleep(1.0)
        advance()


def measure_soak(*, duration: float = 3600.0, window: float = 600.0, fault_every: float = 180.0,
                 faults: list[str] | None = None, seed: int = 7, agents: int = 4, agent_pause: float = 0.5,
                 search_pause: float = 1.0, channels: int = 4, rate: float = 0.05, lease_seconds: float = 5.0,
                 sample_every: float = 5.0, data_path: str | Path = DEFAULT_DATA,
                 workdir: Path | None = None) -> dict[str, Any]:
    """The run of the module docstring; the report `print_soak` prints. `faults`: kinds of
    SOAK_KINDS (None: all of them, []: none)."""
    kinds = list(SOAK_KINDS if faults is None else faults)
    if duration <= 0 or window <= 0 or fault_every <= 0 or sample_every <= 0 or lease_seconds <= 0 or rate <= 0:
        raise InvalidInputError("duration, window, fault-every, sample-every, lease seconds and rate must be > 0")
    if agents < 1 or channels < 1 or agent_pause < 0 or search_pause < 0:
        raise InvalidInputError("agents and channels must be >= 1, the pauses >= 0")
    unknown = [k for k in kinds if k not in SOAK_KINDS]
    if unknown:
        raise InvalidInputError(f"soak runs these fault kinds: {', '.join(SOAK_KINDS)}; not {', '.join(unknown)}")
    deck = SharedDeck(load_exchanges(data_path))
    windows = max(1, math.ceil(duration / window - 1e-9))
    work = bench_workdir("soak", workdir)
    history, record = History(), Record()
    injected: list[Fault] = []
    settled: dict[int, float] = {}
    stop = threading.Event()
    with ExitStack() as stack:
        postgres = RestartablePostgres({"shared_buffers": "256MB"})
        stack.callback(postgres.close)
        redis_server = RedisServer(persistent=True)
        stack.callback(redis_server.close)
        location = with_schema(postgres.url, SCHEMA)
        from benchmarks.server import create_key

        write_key, admin_key = create_key(location), _admin_key(location)
        namespace = f"soak-{uuid.uuid4().hex[:8]}"
        llm_url = stack.enter_context(loopback_llm())
        serve = ServeWorkers(location, redis_server.url, namespace, work / "serve.log")
        stack.callback(serve.close)
        command = bot_command(location, redis_server.url, namespace, llm_url, lease_seconds)
        bots = [BotProcess(f"bot{i}", command, history, work / f"bot{i}.log") for i in range(2)]
        for bot in bots:
            stack.callback(bot.close)
        deployment = _Deployment(bots, serve, postgres, redis_server, postgres.url, redis_server.url, lease_seconds)
        _wait(deployment.all_up, BOT_START_SECONDS, "the deployment starting")
        _warm_up(history, deployment)
        started = time.time()
        end = started + duration
        chores = Chores(serve.url, write_key, admin_key, deck, history, record)
        threads: list[threading.Thread] = [
            Sampler(Roles(deployment, postgres, redis_server), record, stop, sample_every),
            *(AgentThread(n, serve.url, write_key, deck, history, record, stop, agent_pause, seed * 100 + n)
              for n in range(1, agents + 1)),
            SearchThread(serve.url, write_key, deck, history, record, stop, search_pause, seed),
            ChatDriver(history, stop, deployment.deliver, channels=channels, rate=rate, seed=seed),
            ChoreThread(chores, started, window, windows, stop)]
        if kinds:
            threads.append(FaultThread(deployment, kinds, fault_every, end, seed, injected, stop, settled))
        for thread in threads:
            thread.start()
        try:
            with progress_bar(f"soak: {duration:g} s of mixed load, a fault every {fault_every:g} s",
                              math.ceil(duration)) as advance:
                shown = 0
                while (now := time.time()) < end:
                    time.sleep(min(1.0, end - now))
                    elapsed = min(math.ceil(duration), int(time.time() - started))
                    advance(elapsed - shown)
                    shown = elapsed
                advance(math.ceil(duration) - shown)
        finally:
            stop.set()
            for thread in threads:
                thread.join(timeout=REQUEST_TIMEOUT_S * 2)
        ran_s = time.time() - started
        _drain_chat(history)
        exits = {bot.name: bot.close() for bot in bots}
        serve_exit = serve.close()
    report = summarise(history, record, injected, settled, started=started, window=window, windows=windows)
    report["run"] = {"duration_s": duration, "ran_s": round(ran_s, 1), "window_s": window, "windows": windows,
                     "fault_every_s": fault_every, "kinds": kinds, "seed": seed, "agents": agents,
                     "agent_pause_s": agent_pause, "search_pause_s": search_pause, "chat_channels": channels,
                     "chat_rate_per_channel": rate, "lease_seconds": lease_seconds, "sample_every_s": sample_every,
                     "data": str(data_path), **deck.counts()}
    report["exits"] = {"bots": exits, "serve": serve_exit,
                       "bot_unexpected_exits": sum(b.unexpected_exits for b in bots),
                       "serve_worker_unexpected_exits": serve.unexpected_exits}
    report.update(_work=str(work), _examples=dict(record.examples))
    return report


# -- the report -----------------------------------------------------------------------------------------

EXPECTED_IN_FAULTS = ("HTTP 503", "connection")  # what a client sees of a restart, a kill or a drop
LATENCY_OPS = ("add_message", "context", "search", "chat_reply")  # many calls a window: their p95 is judged


def _fault_spans(history: History, faults: list[Fault], settled: dict[int, float]) -> list[tuple[float, float]]:
    """Each fault's span: from its start to the first success after it ended, or until every
    process was up again when later, plus FAULT_SLACK_S."""
    spans = []
    for number, fault in enumerate(faults):
        if fault.skipped:
            continue
        first_ok = history.last_success_after(fault.ended) or fault.ended
        spans.append((fault.started - 0.5, max(first_ok, settled.get(number, fault.ended)) + FAULT_SLACK_S))
    return spans


def _attempt_kind(attempt: Any) -> str | None:
    if attempt.status is None:
        return str(attempt.error or "no answer")
    return None if attempt.status < 400 else f"HTTP {attempt.status}"


def _when(path: str, t: float, started: float, faults: list[Fault]) -> str:
    """Where and when an attempt failed, and the fault that ended last before it."""
    before = [f for f in faults if not f.skipped and f.started <= t]
    last = max(before, key=lambda f: f.ended) if before else None
    after = f"; {t - last.ended:.1f} s after {last.kind} ended" if last else ""
    return f"{path} at +{t - started:.1f} s{after}"


def _chat_calls(history: History) -> list[Call]:
    replies = _first_replies(history)
    return [Call("chat_reply", s.t, (replies[s.tag] - s.t) * 1000) if s.tag in replies
            else Call("chat_reply", s.t, 0.0, "unanswered") for s in history.snapshot("sent")]


def _series(values: list[float]) -> dict[str, float]:
    return {"min": min(values), "max": max(values), "last": values[-1]}


def _processes(samples: list[Sample], started: float, window: float, windows: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for role in sorted({s.role for s in samples}):
        its = [s for s in samples if s.role == role]
        per_window = []
        for w in range(windows):
            inside = [s for s in its if _window_of(s.t, started, window, windows) == w]
            if inside:
                per_window.append({"window": w + 1, "rss_mb": _series([s.rss_mb for s in inside]),
                                   "fds": _series([float(s.fds) for s in inside]),
                                   "pids": sorted({s.pid for s in inside})})
        first = [s for s in its if _window_of(s.t, started, window, windows) == 0]
        base, last = (first[-1] if first else None), its[-1]
        growth = None if windows < 2 or base is None or base is last else \
            round((last.rss_mb - base.rss_mb) / base.rss_mb * 100, 1)
        out[role] = {"samples": len(its), "pids": sorted({s.pid for s in its}), "windows": per_window,
                     "rss_mb_after_first_window": base.rss_mb if base else None, "rss_mb_end": last.rss_mb,
                     "rss_growth_pct": growth, "fds_after_first_window": base.fds if base else None,
                     "fds_end": last.fds, "same_process": base is not None and base.pid == last.pid}
    return out


def _window_of(t: float, started: float, window: float, windows: int) -> int:
    return min(windows - 1, max(0, int((t - started) // window)))


def summarise(history: History, record: Record, faults: list[Fault], settled: dict[int, float], *,
              started: float, window: float, windows: int) -> dict[str, Any]:
    """The report's numbers from what the run recorded (module docstring)."""
    spans = _fault_spans(history, faults, settled)
    chat_spans = [(f.started - CHAT_FAULT_SLACK_S, f.ended + CHAT_FAULT_SLACK_S) for f in faults if not f.skipped]

    def within(t: float, of: list[tuple[float, float]]) -> bool:
        return any(a <= t <= b for a, b in of)

    calls = [*record.calls, *_chat_calls(history)]
    ops = sorted({c.op for c in calls})
    per_window: list[dict[str, Any]] = []
    for w in range(windows):
        mine = [c for c in calls if _window_of(c.t0, started, window, windows) == w]
        row: dict[str, Any] = {}
        for op in ops:
            done = [c.ms for c in mine if c.op == op and c.error is None]
            row[op] = {"calls": sum(1 for c in mine if c.op == op), "failed": sum(1 for c in mine if c.op == op
                                                                                 and c.error), **p50_p95(done, "_ms")}
        per_window.append({"window": w + 1, "from_s": round(w * window, 1),
                           "to_s": round((w + 1) * window, 1), "operations": row,
                           "faults": sum(1 for f in faults if not f.skipped
                                         and _window_of(f.started, started, window, windows) == w)})
    failed_calls: dict[str, int] = {}
    chat_missed_in_faults = 0
    for c in calls:
        if c.error is None:
            continue
        if c.op == "chat_reply" and within(c.t0, chat_spans):
            chat_missed_in_faults += 1
        else:
            failed_calls[f"{c.op}: {c.error}"] = failed_calls.get(f"{c.op}: {c.error}", 0) + 1
    checks_failed: dict[str, int] = {}
    for check in record.checks:
        checks_failed[f"{check.op}: {check.error}"] = checks_failed.get(f"{check.op}: {check.error}", 0) + 1
    in_faults: dict[str, int] = {}
    outside: dict[str, int] = {}
    examples: dict[str, str] = {}
    for attempt in history.snapshot("attempts"):
        kind = _attempt_kind(attempt)
        if kind is None:
            continue
        # in flight at any moment of a fault's span: one sent just before a restart fails by it too
        during = any(a <= attempt.t1 and attempt.t0 <= b for a, b in spans) and kind in EXPECTED_IN_FAULTS
        bucket = in_faults if during else outside
        bucket[kind] = bucket.get(kind, 0) + 1
        if not during and kind not in examples:
            examples[kind] = _when(attempt.path, attempt.t0, started, faults)
    by_kind: dict[str, int] = {}
    for fault in faults:
        if not fault.skipped:
            by_kind[fault.kind] = by_kind.get(fault.kind, 0) + 1
    report: dict[str, Any] = {
        "windows": per_window,
        "operations": ops,
        "processes": _processes(record.snapshot_samples(), started, window, windows),
        "errors": {"examples_outside_faults": examples, "calls_failed": failed_calls, "checks_failed": checks_failed,
                   "attempts_outside_faults": outside,
                   "attempts_in_faults": in_faults, "chat_missed_in_faults": chat_missed_in_faults,
                   "unexpected": sum(failed_calls.values()) + sum(checks_failed.values()) + sum(outside.values())},
        "faults": {"total": sum(by_kind.values()), "by_kind": by_kind,
                   "skipped": [f.as_dict() | {"skipped": f.skipped} for f in faults if f.skipped],
                   "log": [f.as_dict() for f in faults if not f.skipped]},
        "chores": list(record.chores),
        "requests": len(history.snapshot("attempts")),
    }
    report["targets"] = _targets(report)
    return report


def _targets(report: dict[str, Any]) -> dict[str, Any]:
    growth = {role: p["rss_growth_pct"] for role, p in report["processes"].items()}
    measured = {role: g for role, g in growth.items() if g is not None}
    first, last = report["windows"][0]["operations"], report["windows"][-1]["operations"]
    ratios = {}
    for op in LATENCY_OPS:
        a, b = first.get(op), last.get(op)
        if len(report["windows"]) > 1 and a and b and min(a["calls"] - a["failed"], b["calls"] - b["failed"]) \
                >= JUDGED_MIN_CALLS and a["p95_ms"] > 0:
            ratios[op] = round(b["p95_ms"] / a["p95_ms"], 2)
    errors = report["errors"]
    return {
        "rss_growth": {"measured": measured, "needed": f"<= {RSS_GROWTH_MAX_PCT:g} % each, from the end of the "
                                                      "first window to the end",
                       "pass": None if not measured else all(g <= RSS_GROWTH_MAX_PCT for g in measured.values())},
        "p95_drift": {"measured": ratios, "needed": f"last window p95 <= {P95_RATIO_MAX:g} x the first's",
                      "pass": None if not ratios else all(r <= P95_RATIO_MAX for r in ratios.values())},
        "errors": {"measured": errors["unexpected"], "needed": "0 but the injected faults' (503s, dropped "
                                                               "connections while a fault is under way)",
                   "pass": errors["unexpected"] == 0},
    }


def _verdict(passed: bool | None) -> str:
    return "[green]pass[/]" if passed else "[dim]not measured[/]" if passed is None else "[red]MISS[/]"


def print_soak(report: dict[str, Any], console: Console | None = None) -> None:
    out = table_console(console)
    run = report["run"]
    windows = report["windows"]
    latency = results_table(f"soak: {run['ran_s']:g} s, {report['faults']['total']} faults (one every "
                            f"{run['fault_every_s']:g} s), {run['agents']} agents, a searcher, "
                            f"{run['chat_channels']} chat channels; p50 / p95 ms (calls, failed) per "
                            f"{run['window_s']:g} s window", ("operation", *(f"window {w['window']}" for w in windows)),
                            left=("operation",))
    for op in report["operations"]:
        cells = []
        for w in windows:
            row = w["operations"][op]
            cells.append(f"{row['p50_ms']:.0f} / {row['p95_ms']:.0f} ({row['calls']}"
                         f"{', ' + str(row['failed']) + ' failed' if row['failed'] else ''})" if row["calls"] else "-")
        latency.add_row(op, *cells)
    latency.add_row("faults", *(str(w["faults"]) for w in windows))
    out.print(latency)
    procs = results_table("processes: RSS MB and open descriptors (end of the first window → end)",
                          ("process", "pids", "RSS", "growth", "max RSS", "fds", "max fds"), left=("process",))
    for role, p in report["processes"].items():
        growth = "-" if p["rss_growth_pct"] is None else f"{p['rss_growth_pct']:+.1f} %"
        procs.add_row(role, str(len(p["pids"])), f"{p['rss_mb_after_first_window']} → {p['rss_mb_end']}", growth,
                      f"{max(w['rss_mb']['max'] for w in p['windows']):.1f}",
                      f"{p['fds_after_first_window']} → {p['fds_end']}",
                      f"{max(w['fds']['max'] for w in p['windows']):.0f}")
    out.print(procs)
    errors = report["errors"]
    table = results_table("errors by kind", ("kind", "count", "counted as"), left=("kind", "counted as"))
    for kind, count in errors["calls_failed"].items():
        table.add_row(f"call failed: {kind}", str(count), "error")
    for kind, count in errors["checks_failed"].items():
        table.add_row(f"check failed: {kind}", str(count), "error")
    for kind, count in errors["attempts_outside_faults"].items():
        table.add_row(f"attempt: {kind}", str(count), "error")
    for kind, count in errors["attempts_in_faults"].items():
        table.add_row(f"attempt: {kind}", str(count), "an injected fault's")
    if errors["chat_missed_in_faults"]:
        table.add_row("chat message unanswered", str(errors["chat_missed_in_faults"]),
                      "an injected fault's (a bot killed mid-turn)")
    if not table.row_count:
        table.add_row("none", "0", "")
    out.print(table)
    checks = results_table("targets (issue 43)", ("target", "measured", "needed", "result"),
                           left=("target", "measured", "needed"))
    for name, target in report["targets"].items():
        measured = target["measured"]
        if isinstance(measured, dict):
            measured = ", ".join(f"{k} {v}" for k, v in measured.items()) or "-"
        checks.add_row(name, str(measured), str(target["needed"]), _verdict(target["pass"]))
    out.print(checks)
    kinds = ", ".join(f"{k} {n}" for k, n in report["faults"]["by_kind"].items()) or "none"
    out.print(f"faults: {kinds}; chores: {len(report['chores'])}; HTTP attempts: {report['requests']}",
              highlight=False, markup=False)
    for kind, example in report["_examples"].items():
        out.print(f"first {kind}: {example}", highlight=False, markup=False)
    out.print(f"logs: {report['_work']}", highlight=False, markup=False)


def run_soak(json_out: str | Path | None = None, **options: Any) -> dict[str, Any]:
    return print_and_write(measure_soak(**options), print_soak, json_out)
