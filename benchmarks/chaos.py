"""`gieok bench chaos`: faults on purpose, under load, on the scale-out deployment.

The deployment: a throwaway PostgreSQL and a throwaway Redis (append-only file, fsync always —
docs/scale-out.md says why), or the ones given; `gieok serve --workers 2`; two bot processes
(`bench.chaos_bot`) answering through the loopback provider with a short lease
(`lease_seconds`). The load (`bench.chaos_load`): writers adding notes and conversation messages
through `gieok.client` (retries, one Idempotency-Key per write), and a chat driver sending
explicit calls to `channels` channels, each message to both bot processes. First a warm-up on
channels of its own (not counted) until each bot process has answered. While the load runs, a seeded
schedule injects one fault at a time (`bench.chaos_faults`: kill -9 of a serve worker or a bot,
SIGSTOP of a bot beyond its lease, PostgreSQL and Redis restarts, dropped connections, and —
through a fault proxy the processes then reach PostgreSQL and Redis by (`bench.fault_proxy`, only
when a `net_*` kind is chosen) — delays, connections dropped mid-answer or reset, and one process
cut off from both while the others go on), waiting after each for the deployment to recover.
Then the load stops, what is still queued is answered, every process stops, and
`bench.chaos_check` reads the history and the database; the history is written beside the
processes' logs (`history.jsonl`).

Targets (never adjusted): ≥ 50 faults with every kind present; 0 acknowledged writes lost, 0
stored twice, the chain verifies; 0 messages lost, answered twice, misrouted or out of order;
0 client-visible 500s and 0 timeouts; recovery p95 ≤ 10 s.
"""

from __future__ import annotations

import math
import random
import threading
import time
import uuid
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from rich.console import Console

from benchmarks.chaos_check import check_run, recovered_at
from benchmarks.chaos_deploy import BOT_START_SECONDS, BotProcess, ServeWorkers, bot_command
from benchmarks.chaos_faults import KINDS, NET_KINDS, PG_KINDS, REDIS_KINDS, Fault, FaultPlan, Injector
from benchmarks.chaos_load import ChatDriver, History, Writer
from benchmarks.fault_proxy import FaultProxies, proxied_url, upstream_of
from benchmarks.fill import bench_workdir
from benchmarks.loopback_llm import loopback_llm
from benchmarks.pg import RestartablePostgres
from benchmarks.redis_server import RedisServer
from benchmarks.report import print_and_write, progress_bar, results_table, table_console
from benchmarks.server import create_key
from gieok.errors import InvalidInputError
from gieok.store.urls import with_schema

__all__ = ["measure_chaos", "print_chaos", "run_chaos"]

SCHEMA = "gieok_chaos"
RECOVERY_CAP_S = 60.0  # a fault not recovered from by then is reported as such, and the run goes on
DRAIN_S = 120.0  # after the load: for what is still queued to be answered
WRITE_TIMEOUT_S = 30.0  # a request without an answer this long is a hang
WRITE_RETRIES = 30
MIN_FAULTS = 50
RECOVERY_P95_S = 10.0


class _Deployment:
    """The running deployment, as the injector sees it (`chaos_faults.Deployment`)."""

    def __init__(self, bots: list[BotProcess], serve: ServeWorkers, postgres: RestartablePostgres | None,
                 redis: RedisServer | None, admin_db: str, redis_url: str, lease_seconds: float,
                 network: FaultProxies | None = None) -> None:
        self.bots = bots
        self.serve = serve
        self.postgres = postgres
        self.redis = redis
        self.admin_db = admin_db
        self.redis_url = redis_url
        self.lease_seconds = lease_seconds
        self.network = network

    def all_up(self) -> bool:
        return all(b.ready.is_set() and b.alive for b in self.bots) and self.serve.serving()

    def drop_pg_connections(self, pid: int) -> int:
        import psycopg

        with psycopg.connect(self.admin_db, autocommit=True, connect_timeout=10) as conn:
            row = conn.execute("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                               "WHERE application_name = %s", (f"gieok:{pid}",)).fetchone()
        return int(row[0]) if row else 0

    def drop_redis_connections(self, pid: int) -> int:
        import redis

        client = redis.Redis.from_url(self.redis_url, socket_timeout=10)
        try:
            dropped = 0
            for entry in client.client_list():
                if f":{pid}:" in str(entry.get("name", "")):
                    dropped += int(client.client_kill_filter(_id=entry["id"]))
            return dropped
        finally:
            client.close()

    def deliver(self, item: dict[str, Any]) -> int:
        return sum(1 for bot in self.bots if bot.deliver(item))


HISTORY_PER_CHANNEL = 100  # messages of a channel a bot reads back after it connects (one Discord request)


def _read_back(history: History) -> Any:
    """What a (re)started bot is handed once ready: each channel's last messages, as Discord's
    channel history would show them to `gieok bot`'s read-back after a connect."""
    def hand_over(bot: BotProcess) -> None:
        recent: dict[str, list[dict[str, Any]]] = {}
        for item in history.snapshot("said"):
            recent.setdefault(item["channel"], []).append(item)
        said = [item for items in recent.values() for item in items[-HISTORY_PER_CHANNEL:]]
        if said:
            bot.deliver({"history": said})
    return hand_over


def _wait(predicate: Any, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not happen in {seconds:g} s")
        time.sleep(0.2)


def _wait_recovered(history: History, fault: Fault, until: float) -> None:
    while time.time() < min(until, fault.ended + RECOVERY_CAP_S):
        if recovered_at(history, fault) is not None:
            return
        time.sleep(0.2)


def measure_chaos(*, db: str | None = None, redis: str | None = None, duration: float = 300.0,
                  faults: list[str] | None = None, seed: int = 7, channels: int = 20, rate: float = 0.15,
                  writers: int = 2, write_interval: float = 0.3, lease_seconds: float = 5.0,
                  workdir: Path | None = None, until_each_kind: bool = False) -> dict[str, Any]:
    """Run the deployment under load and faults for `duration` seconds (module docstring); with
    `until_each_kind`, the faults end as soon as every kind was injected once (at most `duration`):
    a short run that must meet each kind, as fast as this machine allows.
    `db`: a PostgreSQL URL (its `gieok_chaos` schema is used; it must be new) or None for a
    throwaway server; `redis`: a Redis URL or None for a throwaway one. Faults that need a server
    the harness started are left out with a note when one is given."""
    kinds = list(faults or KINDS)
    if duration <= 0 or channels < 1 or rate <= 0 or writers < 0 or write_interval <= 0 or lease_seconds <= 0:
        raise InvalidInputError("duration, rate, write interval and lease seconds must be > 0, channels >= 1, "
                                "writers >= 0")
    notes: list[str] = []
    if db is not None:
        left = [k for k in kinds if k in PG_KINDS[:2]]
        kinds = [k for k in kinds if k not in PG_KINDS[:2]]
        if left:
            notes.append(f"--db given: {', '.join(left)} left out (the harness restarts only a PostgreSQL it started)")
    if redis is not None:
        left = [k for k in kinds if k in REDIS_KINDS]
        kinds = [k for k in kinds if k not in REDIS_KINDS]
        if left:
            notes.append(f"--redis given: {', '.join(left)} left out (the harness restarts only a Redis it started)")
    if not kinds:
        raise InvalidInputError("no fault kind is left to inject with the servers given")
    work = bench_workdir("chaos", workdir)
    history = History()
    injected: list[Fault] = []
    rng = random.Random(seed)
    stop_load = threading.Event()
    with ExitStack() as stack:
        postgres = None
        if db is None:
            postgres = RestartablePostgres({"shared_buffers": "256MB"})
            stack.callback(postgres.close)
            admin_db = postgres.url
        else:
            admin_db = db
        redis_server = None
        if redis is None:
            redis_server = RedisServer(persistent=True)
            stack.callback(redis_server.close)
            redis_url = redis_server.url
        else:
            redis_url = redis
        location = with_schema(admin_db, SCHEMA)
        if db is not None:
            from gieok.store.postgres import drop_memory

            drop_memory(location)  # a run starts from an empty memory
        key = create_key(location)
        namespace = f"chaos-{uuid.uuid4().hex[:8]}"
        llm_url = stack.enter_context(loopback_llm())
        network = None
        served_db, served_redis = location, redis_url
        if any(kind in NET_KINDS for kind in kinds):  # the processes reach both through the fault proxy
            network = stack.enter_context(FaultProxies())  # closed after the processes (the stack unwinds)
            served_db = proxied_url(location, network.add("postgresql", upstream_of(location)).port)
            served_redis = proxied_url(redis_url, network.add("redis", upstream_of(redis_url)).port)
        serve = ServeWorkers(served_db, served_redis, namespace, work / "serve.log")
        stack.callback(serve.close)
        command = bot_command(served_db, served_redis, namespace, llm_url, lease_seconds)
        bots = [BotProcess(f"bot{i}", command, history, work / f"bot{i}.log", on_ready=_read_back(history))
                for i in range(2)]
        for bot in bots:
            stack.callback(bot.close)
        deployment = _Deployment(bots, serve, postgres, redis_server, admin_db, redis_url, lease_seconds, network)
        _wait(deployment.all_up, BOT_START_SECONDS, "the deployment starting")
        _warm_up(history, deployment)
        load: list[threading.Thread] = [
            Writer(i + 1, serve.url, key, history, stop_load, interval=write_interval, seed=seed * 100 + i,
                   timeout=WRITE_TIMEOUT_S, retries=WRITE_RETRIES) for i in range(writers)]
        load.append(ChatDriver(history, stop_load, deployment.deliver, channels=channels, rate=rate, seed=seed))
        for thread in load:
            thread.start()
        plan = FaultPlan(kinds, seed)
        injector = Injector(deployment, rng)
        started = time.time()
        end = started + duration
        try:
            with progress_bar(f"chaos: {duration:g} s of load and faults", math.ceil(duration)) as advance:
                shown = 0

                def tick() -> None:
                    nonlocal shown
                    now = min(math.ceil(duration), int(time.time() - started))
                    if now > shown:
                        advance(now - shown)
                        shown = now

                time.sleep(min(2.0, duration / 10))  # the load is under way before the first fault
                while time.time() < end:
                    fault = injector.inject(plan.next_kind(deployment.all_up()))
                    injected.append(fault)
                    if until_each_kind and set(kinds) <= {f.kind for f in injected if not f.skipped}:
                        end = time.time()  # the load goes on while this one recovers, then stops
                    tick()
                    if not fault.skipped:
                        _wait_recovered(history, fault, fault.ended + RECOVERY_CAP_S)  # the load goes on
                    tick()
                    resume = min(end, time.time() + plan.gap())
                    while time.time() < resume:
                        time.sleep(0.2)
                        tick()
                advance(math.ceil(duration) - shown)
        finally:
            stop_load.set()
            for thread in load:
                thread.join(timeout=WRITE_TIMEOUT_S * 2)
        ran_s = time.time() - started
        _drain(history, injected)
        exits = {bot.name: bot.close() for bot in bots}
        serve_exit = serve.close()
        processes = {"bot_unexpected_exits": sum(b.unexpected_exits for b in bots),
                     "bot_starts": sum(b.starts for b in bots),
                     "serve_worker_unexpected_exits": serve.unexpected_exits,
                     "serve_workers_killed": len(serve.killed), "bot_exit_codes": exits, "serve_exit": serve_exit}
        report = check_run(location, history, injected, processes)
        _write_history(history, work / "history.jsonl")
    report.update(_notes=notes, _work=str(work), _ran_s=ran_s,
                  _load={"channels": channels, "rate": rate, "writers": writers, "write_interval": write_interval,
                         "lease_seconds": lease_seconds, "duration": round(ran_s) if until_each_kind else duration,
                         "seed": seed, "kinds": kinds})
    report["targets"] = _targets(report, kinds)
    report["run"] = {"duration_s": duration, "seed": seed, "channels": channels, "rate_per_channel": rate,
                     "writers": writers, "lease_seconds": lease_seconds, "kinds": kinds,
                     "until_each_kind": until_each_kind, "load_s": round(ran_s, 1)}
    return report


WARM_CHANNELS = 4


def _warm_up(history: History, deployment: _Deployment) -> None:
    """Chat on channels of their own (`warm-NN`, not counted) until each bot process has answered:
    a process's first turns load what a turn needs (classifiers, the recall path) and take tens of
    seconds on a busy machine; the faults are to meet a deployment at work, not one starting."""
    names = {bot.name for bot in deployment.bots}
    deadline = time.monotonic() + BOT_START_SECONDS
    sent = 0
    with progress_bar("warming up: a first answer from each bot process", 1) as advance:
        while time.monotonic() < deadline:
            answered = {e["proc"] for e in history.snapshot("bot_events")
                        if e.get("ev") == "send" and str(e.get("channel", "")).startswith("warm-")}
            if answered >= names:
                advance()
                return
            deployment.deliver({"channel": f"warm-{sent % WARM_CHANNELS:02d}", "guild": "chaos-guild",
                                "user": "warm", "text": f"누리야 warm-up {sent}", "id": f"warm-{sent}"})
            sent += 1
            time.sleep(2.0)
    raise RuntimeError(f"the bot processes did not all answer within {BOT_START_SECONDS:g} s")


def _write_history(history: History, path: Path) -> None:
    """Everything recorded, one JSON line per event (what the checks were made from), beside the
    processes' logs: to find out what happened to a message a check names."""
    import dataclasses
    import json

    with path.open("w", encoding="utf-8") as out:
        for kind in ("sent", "bot_events", "writes", "attempts"):
            for item in history.snapshot(kind):
                row = dict(item) if isinstance(item, dict) else dataclasses.asdict(item)
                out.write(json.dumps({"kind": kind, **row}, ensure_ascii=False) + "\n")


def _drain(history: History, faults: list[Fault]) -> None:
    """Wait until every message delivered to a bot is answered (or DRAIN_S passes)."""
    from benchmarks.chaos_check import _chat

    with progress_bar("answering what is still queued", 1) as advance:
        deadline = time.monotonic() + DRAIN_S
        while time.monotonic() < deadline:
            chat = _chat(history, [f for f in faults if not f.skipped])
            if chat["messages_lost"] - chat["messages_undelivered"] <= 0:
                break
            time.sleep(1.0)
        advance()


def _targets(report: dict[str, Any], kinds: list[str]) -> dict[str, Any]:
    by_kind = report["faults"]["by_kind"]
    errors = report["client_errors"]
    return {
        "faults": {"measured": report["faults"]["total"], "needed": f">= {MIN_FAULTS}, every kind",
                   "pass": report["faults"]["total"] >= MIN_FAULTS and all(by_kind.get(k) for k in kinds)},
        "writes": {"measured": f"{report['acked_lost']} lost, {report['stored_twice']} twice",
                   "needed": "0, 0", "pass": report["acked_lost"] == 0 and report["stored_twice"] == 0},
        "chain": {"measured": report["chain_verified"], "needed": True, "pass": report["chain_verified"]},
        "chat": {"measured": f"{report['messages_lost']} lost, {report['answered_twice']} twice, "
                             f"{report['misrouted']} misrouted, {report['out_of_order']} out of order",
                 "needed": "0 each", "pass": not any(report[k] for k in ("messages_lost", "answered_twice",
                                                                        "misrouted", "out_of_order"))},
        "clients": {"measured": f"{errors['500']} 5xx, {errors['timeouts']} timeouts, "
                                f"{errors['503_incomplete']} incomplete 503s",
                    "needed": "0 each", "pass": not (errors["500"] or errors["timeouts"] or errors["503_incomplete"])},
        "recovery": {"measured": report["recovery_s"]["p95"], "needed": f"p95 <= {RECOVERY_P95_S:g} s, all recovered",
                     "pass": report["recovery_s"]["p95"] <= RECOVERY_P95_S and report["not_recovered"] == 0},
    }


def print_chaos(report: dict[str, Any], console: Console | None = None) -> None:
    console = table_console(console)
    load = report["_load"]
    kinds = results_table(f"chaos: {report['faults']['total']} faults in {load['duration']:g} s "
                          f"(seed {load['seed']}); {load['channels']} channels × {load['rate']:g} msg/s, "
                          f"{load['writers']} writers, lease {load['lease_seconds']:g} s",
                          ("fault", "injected", "recovery p50", "p95", "max", "ok", "503", "5xx", "timeouts",
                           "dropped"), left=("fault",))
    for kind, count in report["faults"]["by_kind"].items():
        rec = report["recovery_s_by_kind"].get(kind, {})
        view = report["client_view_by_kind"].get(kind, {})
        kinds.add_row(kind, str(count), _s(rec.get("p50")), _s(rec.get("p95")), _s(rec.get("max")),
                      str(view.get("ok", 0)), str(view.get("503", 0)), str(view.get("500", 0)),
                      str(view.get("timeouts", 0)), str(view.get("connection_errors", 0)))
    console.print(kinds)
    outcome = results_table("what the history shows", ("check", "count"), left=("check",))
    writes, chat = report["writes"], report["chat"]
    for label, value in (("writes (acknowledged / not)", f"{writes['acked']} / {writes['unacked']}"),
                         ("acknowledged writes lost", report["acked_lost"]),
                         ("blocks stored twice", report["stored_twice"]),
                         ("chat messages sent / answered", f"{chat['sent']} / {chat['answered']}"),
                         ("messages lost (of which no bot was up)",
                          f"{report['messages_lost']} ({chat['messages_undelivered']})"),
                         ("missed: taken by a turn of a process then killed", report["missed_killed_mid_turn"]),
                         ("bots killed between a claim and its enqueue", chat["died_in_claim"]),
                         ("answered twice", report["answered_twice"]), ("misrouted", report["misrouted"]),
                         ("out of order", report["out_of_order"]),
                         ("taken in from a channel's history by a restarted bot", chat.get("caught_up", 0)),
                         ("messages stored twice / not stored", f"{chat['chat_stored_twice']} / "
                                                                f"{chat['messages_unstored']}"),
                         ("L1 rows written twice", report["l1_written_twice"]),
                         ("chain verifies", report["chain_verified"]),
                         ("HTTP attempts", report["requests"]),
                         ("client errors", ", ".join(f"{k}: {v}" for k, v in report["client_errors"].items())),
                         ("recovery p50 / p95", f"{_s(report['recovery_s']['p50'])} / "
                                                f"{_s(report['recovery_s']['p95'])}"),
                         ("faults not recovered from", report["not_recovered"]),
                         ("unexpected exits (bots / serve workers)",
                          f"{report['processes']['bot_unexpected_exits']} / "
                          f"{report['processes']['serve_worker_unexpected_exits']}")):
        outcome.add_row(label, str(value))
    console.print(outcome)
    checks = results_table("targets", ("target", "measured", "needed", "result"), left=("target", "measured", "needed"))
    for name, target in report["targets"].items():
        checks.add_row(name, str(target["measured"]), str(target["needed"]),
                       "[green]pass[/]" if target["pass"] else "[red]MISS[/]")
    console.print(checks)
    for name, examples in report["_examples"].items():
        if examples:
            console.print(f"{name}, e.g.: {' '.join(examples)}", highlight=False, markup=False)
    for note in report["_notes"]:
        console.print(f"note: {note}", highlight=False, markup=False)
    console.print(f"logs: {report['_work']}", highlight=False)


def _s(value: float | None) -> str:
    return f"{value:.2f} s" if value is not None else "-"


def run_chaos(json_out: str | Path | None = None, **options: Any) -> dict[str, Any]:
    return print_and_write(measure_chaos(**options), print_chaos, json_out)
