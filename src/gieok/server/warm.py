"""Warm before ready: a fresh server loads what a first request would otherwise load — the
Korean analyser, the embedding model, the tenants' indexes and ranker, and for a tenant that holds
conversations the pipeline an agent's messages go through — and says when it has.

`/healthz` is liveness (the process answers); `/readyz` answers 200 only once warming is done, so
a load balancer or a client sends the first search to a server that answers it at warm speed.
The Korean analyser loads before the port opens (`load_analyser`: it holds the interpreter lock
for seconds, so nothing could be answered meanwhile); the rest warms beside the running server:
the process is alive and says so. The tenants warmed are the default one (the `--db` memory) and
those with live keys, most recently used first, up to `server_open_tenants`.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..errors import GieokError
from ..store.wait import ServiceWait
from ..text import get_tokenizer
from .tenants import DEFAULT_TENANT, TenantRegistry

__all__ = ["Readiness", "load_analyser", "warm_tenants", "tenants_to_warm", "start_warming", "WarmGate", "WARM_WAIT_S",
           "DATABASE_WAIT_S", "waiting_for_the_database"]

WARM_WAIT_S = 10.0  # how long a request waits for a warming server before it is told to come back
DATABASE_WAIT_S = 300.0  # how long warming waits for an unreachable database before it gives up
UNGATED = ("/v1/events", "/v1/health", "/v1/keys")  # they need no model: answered while warming

log = logging.getLogger("uvicorn.error")  # uvicorn's own log: it is what `gieok serve` prints


@dataclass
class Readiness:
    """Where warming stands: `warming`, `ready` or `failed` (with why)."""

    status: str = "warming"
    started: float = field(default_factory=time.monotonic)
    seconds: float | None = None
    tenants: list[str] = field(default_factory=list)
    error: str | None = None
    done: threading.Event = field(default_factory=threading.Event, repr=False)
    waiting: ServiceWait | None = field(default=None, repr=False)  # the database warming waits for, if any

    @property
    def ready(self) -> bool:
        return self.status == "ready"

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"status": self.status, "tenants_warmed": len(self.tenants)}
        if self.seconds is not None:
            out["warm_seconds"] = round(self.seconds, 3)
        else:
            out["warming_for_seconds"] = round(time.monotonic() - self.started, 3)
        if self.error:
            out["error"] = self.error
        if self.waiting is not None and self.waiting.waiting and not self.done.is_set():
            out.update(waiting_for=self.waiting.waiting_for, reason=self.waiting.reason)
        return out

    def finish(self, error: str | None = None) -> None:
        self.seconds = time.monotonic() - self.started
        self.status, self.error = ("failed", error) if error else ("ready", None)
        self.done.set()


def load_analyser() -> None:
    """Load kiwi now, in the app's start-up (which uvicorn finishes before it listens): loaded beside
    the first requests it left them, and /healthz, unanswered for its seconds (`Tokenizer.load`)."""
    seconds = get_tokenizer().load()
    if seconds >= 0.1:
        log.info("gieok: the Korean analyser loaded in %.1f s", seconds)


def tenants_to_warm(registry: TenantRegistry, key_rows: list[Any], limit: int) -> list[str]:
    """The default tenant, then the tenants of live keys by their last use, newest first."""
    live = sorted((row for row in key_rows if row.revoked_at is None),
                  key=lambda row: row.last_used_at or row.created_at, reverse=True)
    names = [DEFAULT_TENANT, *(row.tenant for row in live)]
    return list(dict.fromkeys(names))[: max(1, limit)]


def waiting_for_the_database(who: str, wait_s: float, stop: threading.Event | None = None) -> ServiceWait:
    """Calls tried again while the database (or Redis) is unreachable: 0.25 s doubling to 2 s, a
    warning line before each pause, for `wait_s` (then the error is raised with the reason); `stop`
    set ends a pause and the retries at once. Used by a starting worker and by warming."""
    return ServiceWait(who, wait_s, stop=stop, log=log)


def warm_tenants(registry: TenantRegistry, names: list[str] | Callable[[], list[str]], readiness: Readiness,
                 stop: threading.Event | None = None, *, database_wait_s: float = DATABASE_WAIT_S) -> None:
    """Open and warm each tenant (`Memory.warm`: one search through every part); then ready.
    `names` may be a function (it reads the key table: `tenants_to_warm`).

    An unreachable database is waited for (`database_wait_s`, then warming fails): a worker that
    `--workers N` started again after a crash may start while PostgreSQL restarts, and it warms
    once the database is back rather than staying unwarmed or failing."""
    stopped = stop or threading.Event()

    def warm(name: str) -> None:
        with registry.use(name) as tenant:
            tenant.memory.warm()
            if tenant.memory.store.conversation.l1_count():  # agents write conversations here:
                tenant.pipeline.warm()  # the guard's classifiers and their encoder, loaded now too

    retrying = waiting_for_the_database("warming", database_wait_s, stopped)
    readiness.waiting = retrying  # /readyz says what warming waits for, while it does
    try:
        for name in retrying(names) if callable(names) else names:
            if stopped.is_set():
                return
            retrying(warm, name)
            readiness.tenants.append(name)
    except GieokError as exc:
        if stopped.is_set():
            return  # shutting down while warming: nothing to report
        log.error("gieok: warming failed: %s", exc)
        readiness.finish(str(exc))
        return
    readiness.finish()
    log.info("gieok: ready — warm in %.1f s (the embedding model, the Korean analyser and %d tenant%s indexes) "
             "[process %d]", readiness.seconds or 0.0, len(readiness.tenants),
             "" if len(readiness.tenants) == 1 else "s'", os.getpid())  # which of --workers N is ready


def start_warming(registry: TenantRegistry, names: list[str] | Callable[[], list[str]], readiness: Readiness,
                  stop: threading.Event) -> threading.Thread:
    """Warm in a daemon thread (the server answers /healthz and /readyz meanwhile)."""
    thread = threading.Thread(target=warm_tenants, args=(registry, names, readiness, stop),
                              name="gieok-warm", daemon=True)
    thread.start()
    return thread


class WarmGate:
    """ASGI middleware: while the server warms, a request to the API waits for it up to
    `WARM_WAIT_S`, then is answered 503 with `Retry-After` rather than hanging behind the model
    load. A worker that `gieok serve --workers N` started again (one was killed) shares the
    listening socket with the others and is handed requests at once, and on a busy machine its
    warming takes minutes: a client is better told to come back (and may reach a warm worker)."""

    def __init__(self, app: Any, *, state: Any) -> None:
        self.app = app
        self.state = state  # ServerState

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        path = str(scope.get("path", "")) if scope.get("type") == "http" else ""
        if path.startswith("/v1/") and not path.startswith(UNGATED) and self.state.warming:
            import asyncio

            from .errors import error_response

            deadline = time.monotonic() + WARM_WAIT_S
            while self.state.warming and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            if self.state.warming:
                readiness = self.state.readiness
                response = error_response(503, "warming", "this server is still loading its models (for "
                                          f"{time.monotonic() - readiness.started:.0f} s); try again")
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)
