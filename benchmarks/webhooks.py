"""`gieok bench webhooks`: signed webhooks delivered through a receiver outage and a server restart.

A real `gieok serve` (127.0.0.1) on a fresh database, an admin key, and a real HTTP receiver in
this process that checks every request's signature with the Standard Webhooks library
(`standardwebhooks.Webhook.verify`) and dedupes by `webhook-id`, as the docs tell a receiver to.
One endpoint, registered for `memory.added`. Then N events — one `POST /v1/memories` each, every
text numbered — in three phases:

1. the receiver up: 40 % of them, one after another;
2. the receiver down (its port closed: refused connections) for `down_seconds`, while 30 % of the
   events arrive at an even pace; halfway through the server is stopped (SIGTERM) and started again
   on the same database — the queue is in it;
3. the receiver up again: the rest, one after another; then until every event is in, or
   `wait_seconds` pass.

Measured: the events the receiver got (after dedupe) against those sent, raw duplicates (an event
posted again after its answer was lost), events that arrived under two ids or with a bad signature;
the delivery delay — the receiver's arrival minus the event's own `timestamp` (when the server
published it; the server may post it before its answer to the write arrives) — of the events
sent while the receiver was up (p50, p95), and for the ones sent while it was down, how long after it
came back the last one arrived. The targets (never adjusted): every event delivered, none twice to a
receiver that dedupes by id, p50 delay while the receiver is up ≤ 1 s, every signature verified.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console

from benchmarks.fill import bench_workdir
from benchmarks.report import p50_p95, print_and_write, results_table, table_console
from benchmarks.server import ServeProcess

__all__ = ["measure_webhooks", "print_webhooks", "run_webhooks_bench", "Receiver", "TARGET_P50_MS"]

TARGET_P50_MS = 1000.0
SHARES = (0.4, 0.3)  # of the events: before the outage, during it (the rest after)
TEXT = "웹훅 벤치 {i:05d}: 민지가 보리한테 츄르를 줬어 (webhook bench event {i})"
REQUEST_SECONDS = 120.0


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class Arrival:
    webhook_id: str
    index: int  # the event's number in the text, -1 when unreadable
    at: float
    verified: bool
    published: float | None = None  # the event's own `timestamp` (the server's clock: this machine's)


@dataclass
class Receiver:
    """A webhook receiver on a loopback port: checks each request's signature (the spec's library),
    answers 204 to a verified one, 400 otherwise; `down()` closes the port, `up()` opens it again."""

    secret: str = ""
    port: int = field(default_factory=_free_port)
    arrivals: list[Arrival] = field(default_factory=list)
    _server: ThreadingHTTPServer | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def up(self) -> None:
        from standardwebhooks import Webhook, WebhookVerificationError

        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                now = time.time()
                try:
                    event = Webhook(receiver.secret).verify(body, dict(self.headers))
                    ok = True
                except WebhookVerificationError:
                    event, ok = json.loads(body or b"{}"), False
                receiver._keep(Arrival(self.headers.get("webhook-id", ""), _index_of(event), now, ok,
                                       _published(event)))
                self.send_response(204 if ok else 400)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def down(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def _keep(self, arrival: Arrival) -> None:
        with self._lock:
            self.arrivals.append(arrival)

    def snapshot(self) -> list[Arrival]:
        with self._lock:
            return list(self.arrivals)

    def unique_indices(self) -> set[int]:
        return {a.index for a in self.snapshot() if a.verified and a.index >= 0}


def _published(event: Any) -> float | None:
    try:
        return datetime.fromisoformat(str(event["timestamp"]).replace("Z", "+00:00")).timestamp()
    except (KeyError, TypeError, ValueError):
        return None


def _index_of(event: Any) -> int:
    try:
        text = str(event["data"]["blocks"][0]["text"])
        return int(text.split(" ", 3)[2].rstrip(":"))
    except (KeyError, IndexError, TypeError, ValueError):
        return -1


def _admin_key(db: Path) -> str:
    from gieok.config import load_settings
    from gieok.server.auth import ApiKeys
    from gieok.server.tenants import DEFAULT_TENANT
    from gieok.store.factory import open_store

    settings = load_settings(db=str(db))
    store = open_store(settings.db_location(), busy_timeout_ms=settings.busy_timeout_ms)
    try:
        key, _ = ApiKeys(store).create(DEFAULT_TENANT, "admin", "bench webhooks")
    finally:
        store.close()
    return key


@contextmanager
def _serving(db: Path, workdir: Path, env: dict[str, str], starts: list[float]) -> Iterator[list[ServeProcess]]:
    """The server (a list: a restart replaces it), stopped at the end whatever happened."""
    holder: list[ServeProcess] = []
    started = time.monotonic()
    holder.append(ServeProcess(db, workdir / "serve-0.log", env=env))
    starts.append(time.monotonic() - started)
    try:
        yield holder
    finally:
        holder[-1].stop()


def _post(client: httpx.Client, url: str, key: str, i: int) -> float:
    """Write event i (retried through a restart); the moment the attempt that stored it was sent
    (a delay is measured from the event's own timestamp; this when a body has none)."""
    deadline = time.monotonic() + REQUEST_SECONDS
    headers = {"Authorization": f"Bearer {key}", "Idempotency-Key": f"bench-webhooks-{i}"}
    while True:
        try:
            sent = time.time()
            answer = client.post(f"{url}/v1/memories", json={"text": TEXT.format(i=i)}, headers=headers)
            if answer.status_code == 201:
                return sent
            if answer.status_code not in (502, 503) or time.monotonic() > deadline:
                raise RuntimeError(f"POST /v1/memories answered {answer.status_code}: {answer.text[:300]}")
        except httpx.TransportError:
            if time.monotonic() > deadline:
                raise
        time.sleep(0.2)


def measure_webhooks(events: int = 1000, *, down_seconds: float = 60.0, wait_seconds: float = 600.0,
                     workdir: Path | None = None, retry_seconds: float | None = None,
                     retry_max_seconds: float | None = None, timeout_seconds: float | None = None) -> dict[str, Any]:
    workdir = bench_workdir("webhooks", workdir)
    db = workdir / "webhooks.db"
    for leftover in workdir.glob("webhooks.db*"):
        leftover.unlink()
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIEOK_")}
    for name, value in (("RETRY_SECONDS", retry_seconds), ("RETRY_MAX_SECONDS", retry_max_seconds),
                        ("TIMEOUT_SECONDS", timeout_seconds)):
        if value is not None:
            env[f"GIEOK_WEBHOOK_{name}"] = str(value)
    key = _admin_key(db)
    before = max(1, round(events * SHARES[0]))
    during = max(1, round(events * SHARES[1]))
    after = max(1, events - before - during)
    total = before + during + after
    sent: dict[int, float] = {}
    phase_of: dict[int, str] = {}
    starts: list[float] = []
    receiver = Receiver()
    receiver.up()
    came_back = 0.0
    with _serving(db, workdir, env, starts) as server, httpx.Client(timeout=REQUEST_SECONDS) as client:
        made = client.post(f"{server[-1].url}/v1/webhooks", headers={"Authorization": f"Bearer {key}"},
                           json={"url": f"http://127.0.0.1:{receiver.port}/hooks", "events": ["memory.added"]})
        if made.status_code != 201:
            raise RuntimeError(f"POST /v1/webhooks answered {made.status_code}: {made.text[:300]}")
        receiver.secret = made.json()["secret"]
        endpoint = made.json()["id"]
        for i in range(before):
            sent[i], phase_of[i] = _post(client, server[-1].url, key, i), "up"
        receiver.down()
        outage = time.monotonic()
        restarted = False
        for j in range(during):
            i = before + j
            pause = outage + j * down_seconds / during - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            if not restarted and j >= during // 2:  # halfway: the server stops and starts again
                server[-1].stop()
                started = time.monotonic()
                server.append(ServeProcess(db, workdir / "serve-1.log", env=env))
                starts.append(time.monotonic() - started)
                restarted = True
            sent[i], phase_of[i] = _post(client, server[-1].url, key, i), "down"
        time.sleep(max(0.0, outage + down_seconds - time.monotonic()))
        receiver.up()
        came_back = time.time()
        for j in range(after):
            i = before + during + j
            sent[i], phase_of[i] = _post(client, server[-1].url, key, i), "up"
        deadline = time.monotonic() + wait_seconds
        while len(receiver.unique_indices()) < total and time.monotonic() < deadline:
            time.sleep(0.2)
        waited_out = len(receiver.unique_indices()) < total
        deliveries = _deliveries(client, server[-1].url, key, endpoint)
        # the receiver has an event before the server records its delivery: the last answers are
        # read until each delivery is settled (delivered or failed), as long as the wait allows
        while not waited_out and not _settled(deliveries) and time.monotonic() < deadline:
            time.sleep(0.2)
            deliveries = _deliveries(client, server[-1].url, key, endpoint)
    receiver.down()
    return _report(receiver, sent, phase_of, total, came_back, starts, waited_out, deliveries,
                   down_seconds=down_seconds, wait_seconds=wait_seconds, workdir=workdir)


def _settled(deliveries: list[dict[str, Any]]) -> bool:
    return all(d["status"] in ("delivered", "failed") for d in deliveries)


def _deliveries(client: httpx.Client, url: str, key: str, endpoint: int) -> list[dict[str, Any]]:
    """Every delivery of the endpoint, as the server's deliveries API lists them (page by page)."""
    found: list[dict[str, Any]] = []
    before: int | None = None
    while True:
        params: dict[str, int] = {"limit": 200, **({"before": before} if before else {})}
        page = client.get(f"{url}/v1/webhooks/{endpoint}/deliveries", params=params,
                          headers={"Authorization": f"Bearer {key}"})
        page.raise_for_status()
        found += page.json()["deliveries"]
        before = page.json()["next_before"]
        if before is None:
            return found


def _report(receiver: Receiver, sent: dict[int, float], phase_of: dict[int, str], total: int, came_back: float,
            starts: list[float], waited_out: bool, deliveries: list[dict[str, Any]], *, down_seconds: float,
            wait_seconds: float, workdir: Path) -> dict[str, Any]:
    arrivals = receiver.snapshot()
    first: dict[int, float] = {}
    published: dict[int, float] = {}
    ids_of: dict[int, set[str]] = {}
    for arrival in arrivals:
        if not arrival.verified or arrival.index < 0:
            continue
        first.setdefault(arrival.index, arrival.at)
        if arrival.published is not None:
            published.setdefault(arrival.index, arrival.published)
        ids_of.setdefault(arrival.index, set()).add(arrival.webhook_id)
    # from the event's publication (its `timestamp`, ms) to the receiver: what delivery adds to a write
    up = [(first[i] - published.get(i, sent[i])) * 1000 for i, phase in phase_of.items()
          if phase == "up" and i in first]
    down = [first[i] for i, phase in phase_of.items() if phase == "down" and i in first]
    delivered = len(first)
    under_two_ids = sum(1 for ids in ids_of.values() if len(ids) > 1)
    bad_signatures = sum(1 for a in arrivals if not a.verified)
    unique_ids = {a.webhook_id for a in arrivals if a.verified}
    up_delay = p50_p95(up, "_ms")
    report: dict[str, Any] = {
        "events": total,
        "down_seconds": down_seconds,
        "delivered": delivered,
        "missing": total - delivered,
        "requests": len(arrivals),
        "duplicates": len(arrivals) - len(unique_ids) - bad_signatures,
        "under_two_ids": under_two_ids,
        "bad_signatures": bad_signatures,
        "up_delay_ms": {**up_delay, "events": len(up)},
        "backlog_drained_s": round(max(down) - came_back, 2) if down else None,
        "restart_ready_s": [round(s, 2) for s in starts],
        "server_attempts": sum(d["attempts"] for d in deliveries),
        "server_delivered": sum(1 for d in deliveries if d["status"] == "delivered"),
        "server_failed": sum(1 for d in deliveries if d["status"] == "failed"),
        "most_attempts": max((d["attempts"] for d in deliveries), default=0),
        "targets": {
            "all_delivered": {"delivered": delivered, "events": total, "pass": delivered == total and not waited_out},
            "none_twice_after_dedupe": {"under_two_ids": under_two_ids, "pass": under_two_ids == 0},
            "up_p50": {"p50_ms": up_delay["p50_ms"], "limit_ms": TARGET_P50_MS,
                       "pass": bool(up) and up_delay["p50_ms"] <= TARGET_P50_MS},
            "signatures_verified": {"bad": bad_signatures, "pass": bad_signatures == 0},
        },
        "_wait_seconds": wait_seconds,
        "_workdir": str(workdir),
    }
    return report


def print_webhooks(report: dict[str, Any], console: Console | None = None) -> None:
    console = table_console(console)
    table = results_table(f"webhooks: {report['events']:,} events, receiver down {report['down_seconds']:g} s in the "
                          f"middle, the server restarted once (SIGTERM) during it",
                          ("measure", "value"), left=("measure",))
    up = report["up_delay_ms"]
    rows = [
        ("events delivered (after dedupe by webhook-id)", f"{report['delivered']:,} of {report['events']:,}"),
        ("attempts the server made (its deliveries API)", f"{report['server_attempts']:,}, at most "
                                                           f"{report['most_attempts']} for one event"),
        ("requests the receiver got", f"{report['requests']:,}"),
        ("of them again (same webhook-id: at least once)", f"{report['duplicates']:,}"),
        ("events under two ids", str(report["under_two_ids"])),
        ("bad signatures (standardwebhooks.verify)", str(report["bad_signatures"])),
        (f"delay while the receiver is up, p50 / p95 ({up['events']} events)",
         f"{up['p50_ms']:.0f} ms / {up['p95_ms']:.0f} ms"),
        ("last backlog event in, after the receiver came back",
         "—" if report["backlog_drained_s"] is None else f"{report['backlog_drained_s']:.1f} s"),
        ("server ready after start / restart", " / ".join(f"{s:.1f} s" for s in report["restart_ready_s"])),
    ]
    for row in rows:
        table.add_row(*row)
    console.print(table)
    checks = results_table("targets", ("target", "measured", "result"), left=("target", "measured"))
    targets = report["targets"]
    verdict = {True: "[green]pass[/]", False: "[red]MISS[/]"}
    checks.add_row("every event delivered", f"{targets['all_delivered']['delivered']:,} of {report['events']:,}",
                   verdict[targets["all_delivered"]["pass"]])
    checks.add_row("none twice to a receiver that dedupes by id", f"{report['under_two_ids']} under two ids",
                   verdict[targets["none_twice_after_dedupe"]["pass"]])
    checks.add_row(f"p50 delay while the receiver is up ≤ {TARGET_P50_MS:.0f} ms",
                   f"{targets['up_p50']['p50_ms']:.0f} ms", verdict[targets["up_p50"]["pass"]])
    checks.add_row("every signature verified", f"{report['bad_signatures']} bad",
                   verdict[targets["signatures_verified"]["pass"]])
    console.print(checks)


def run_webhooks_bench(events: int = 1000, json_out: str | Path | None = None, *, down_seconds: float = 60.0,
                       wait_seconds: float = 600.0, workdir: Path | None = None, retry_seconds: float | None = None,
                       retry_max_seconds: float | None = None,
                       timeout_seconds: float | None = None) -> dict[str, Any]:
    report = measure_webhooks(events, down_seconds=down_seconds, wait_seconds=wait_seconds, workdir=workdir,
                              retry_seconds=retry_seconds, retry_max_seconds=retry_max_seconds,
                              timeout_seconds=timeout_seconds)
    return print_and_write(report, print_webhooks, json_out)
