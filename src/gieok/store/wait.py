"""Waiting for the deployment's services instead of exiting: a process started while PostgreSQL or
Redis is away — a restart, a deploy that brings the database up last, a crash — tries again with a
growing pause (0.25 s doubling to 2 s), says on one log line each time what it waits for and why,
and gives up after `startup_wait_seconds` with that reason (0: it does not wait). `gieok serve`
shows the same on `/readyz` while it waits (`ServiceWait.as_dict`).

The pause stops at 2 s so a process is back within about 2 s of its database (plus its own
connect): the guarantee in docs/scale-out.md. Only "the service is not answering" is waited for
(`DatabaseUnavailableError`, `CoordinationUnavailableError`); a wrong password, a missing extra or
a bad URL fails at once, since waiting would not mend it.

Used by every process that opens a deployment: `gieok serve` and its workers (server/pending.py,
server/run.py), warming (server/warm.py), `gieok mcp` (server/mcp.py) and `gieok bot`
(cli/chat.py, through `reach_services`)."""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from ..config.settings import Settings, is_database_url
from ..coordination.connection import RedisConnection
from ..errors import CoordinationUnavailableError, DatabaseUnavailableError
from .factory import open_store

__all__ = ["ServiceWait", "WAITED_FOR", "reach_services", "redact", "FIRST_PAUSE_S", "LONGEST_PAUSE_S"]

FIRST_PAUSE_S = 0.25
LONGEST_PAUSE_S = 2.0  # the longest a process stays unaware that its database is back
WAITED_FOR: dict[type[Exception], str] = {DatabaseUnavailableError: "postgresql", CoordinationUnavailableError: "redis"}
_SHOWN = {"postgresql": "PostgreSQL", "redis": "Redis"}

T = TypeVar("T")

_URL_PASSWORD = re.compile(r"(?<=://)([^:/@\s]*):[^@/\s]*@")
_DSN_PASSWORD = re.compile(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", re.IGNORECASE)


def redact(text: str) -> str:
    """`text` on one line, with any password it holds — a URL's `user:pass@`, a libpq
    `password=…` — masked: a driver's error may quote the connection string it was given."""
    line = " ".join(str(text).split())
    return _DSN_PASSWORD.sub(r"\1***", _URL_PASSWORD.sub(r"\1:***@", line))


def _service(exc: BaseException) -> str:
    return next(name for kind, name in WAITED_FOR.items() if isinstance(exc, kind))


class ServiceWait:
    """Calls that open a service, tried again while it is away (`wait(call, *args)`), and where
    that stands: `waiting_for` ("postgresql" / "redis", None once the call went through), `reason`
    (the last error, one line, no password), `attempts`. `stop` set ends a pause, and the waiting,
    at once (the process is stopping). One object may wait for several calls in turn (warming:
    one per tenant); each call has the whole limit."""

    def __init__(self, who: str, limit_s: float, *, stop: threading.Event | None = None,
                 log: logging.Logger | None = None) -> None:
        self.who = who
        self.limit_s = max(0.0, float(limit_s))
        self.stop = stop or threading.Event()
        self.log = log or logging.getLogger("gieok")
        self.started = time.monotonic()
        self.waiting_for: str | None = None
        self.reason: str | None = None
        self.attempts = 0

    def __call__(self, call: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        begun = time.monotonic()
        pause = FIRST_PAUSE_S
        while True:
            self.attempts += 1
            try:
                result = call(*args, **kwargs)
            except tuple(WAITED_FOR) as exc:
                self._away(exc)
                remaining = self.limit_s - (time.monotonic() - begun)
                if self.limit_s <= 0:
                    raise  # not waiting: the error as it came
                if remaining <= 0 or self.stop.is_set():
                    raise type(exc)(self._gave_up(time.monotonic() - begun)) from None
                pause = min(pause, remaining)
                self.log.warning("gieok: %s waits for %s (%s); trying again in %.2f s (%.0f of %g s, "
                                 "startup_wait_seconds)", self.who, _SHOWN[self.waiting_for or "postgresql"],
                                 self.reason, pause, time.monotonic() - begun, self.limit_s)
                if self.stop.wait(pause):
                    raise type(exc)(self._gave_up(time.monotonic() - begun, stopping=True)) from None
                pause = min(pause * 2, LONGEST_PAUSE_S)
                continue
            if self.waiting_for is not None:
                self.log.warning("gieok: %s reached %s after %.1f s of waiting", self.who,
                                 _SHOWN[self.waiting_for], time.monotonic() - begun)
            self.waiting_for, self.reason = None, None
            return result

    def _away(self, exc: BaseException) -> None:
        self.waiting_for = _service(exc)
        self.reason = redact(str(exc)) or type(exc).__name__

    def _gave_up(self, waited_s: float, *, stopping: bool = False) -> str:
        why = "stopped while waiting" if stopping else \
            f"gave up after {waited_s:.0f} s (startup_wait_seconds = {self.limit_s:g})"
        return f"{self.who} {why} waiting for {_SHOWN[self.waiting_for or 'postgresql']}: {self.reason}"

    @property
    def waiting(self) -> bool:
        return self.waiting_for is not None

    def as_dict(self) -> dict[str, Any]:
        """What `/readyz` says while the process waits."""
        return {"status": "waiting" if self.waiting_for else "starting", "waiting_for": self.waiting_for,
                "reason": self.reason, "attempts": self.attempts,
                "waiting_for_seconds": round(time.monotonic() - self.started, 3), "limit_seconds": self.limit_s}


def reach_services(settings: Settings) -> None:
    """Open and close what `settings` name — the PostgreSQL `db`, the `redis` — once: an unreachable
    one raises its `…UnavailableError` (what `ServiceWait` waits on). A SQLite file needs no server."""
    location = settings.db_location()
    if is_database_url(location):
        open_store(location, busy_timeout_ms=settings.busy_timeout_ms).close()
    if settings.redis:
        RedisConnection(settings.redis, settings.redis_namespace).close()
