"""A server whose deployment is not reachable yet answers anyway: `gieok serve` (and each of its
workers) started while PostgreSQL or Redis is away listens at once and says so, rather than
exiting (or, as a worker, hanging unanswered in its start-up).

`PendingApp` is the ASGI app uvicorn runs. While the `ServerState` opens in a thread — tried again
by `ServiceWait` (store/wait.py) for `startup_wait_seconds` — `/healthz` answers 200, `/readyz`
503 with what it waits for and why, and an API request waits up to `WARM_WAIT_S` for it, then gets
503 with `Retry-After`, as a warming server does. Once the state is open the real app is built, its
start-up (lifespan) runs, and from then on it answers everything: `/readyz` turns 200 when it has
warmed. If the limit passes first, `on_give_up` is told why (the process then exits with that line).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

from ..store.wait import ServiceWait
from .errors import error_response
from .responses import json_response
from .state import ServerState
from .stopping import on_stop
from .warm import WARM_WAIT_S, load_analyser

__all__ = ["PendingApp"]

log = logging.getLogger("uvicorn.error")  # what `gieok serve` prints


class PendingApp:
    """ASGI: the server's app once `open_state` succeeds (`build` makes it), a stand-in until then."""

    def __init__(self, open_state: Callable[[], ServerState], build: Callable[[ServerState], Any], *,
                 wait: ServiceWait, on_give_up: Callable[[BaseException], None]) -> None:
        self._open_state = open_state
        self._build = build
        self.wait = wait
        self._on_give_up = on_give_up
        self.app: Any = None  # the real app, once its start-up is done
        self.failure: BaseException | None = None
        self._ready = asyncio.Event()
        self._inner_lifespan: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._opening: asyncio.Task[None] | None = None
        self._inner: asyncio.Task[None] | None = None
        self._state: ServerState | None = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
        elif self.app is not None:
            await self.app(scope, receive, send)
        elif scope["type"] == "http":
            await self._answer_pending(scope, receive, send)
        elif scope["type"] == "websocket":  # the dashboard reconnects once the server is there
            await send({"type": "websocket.close", "code": 1013})

    async def _answer_pending(self, scope: Any, receive: Any, send: Any) -> None:
        path = str(scope.get("path", ""))
        if path == "/healthz":
            response = json_response({"status": "ok"})
        elif path == "/readyz":
            response = json_response(self.wait.as_dict(), 503, {"Retry-After": "1"})
        else:
            with contextlib.suppress(TimeoutError):  # a request waits a little, as a warming server's does
                await asyncio.wait_for(self._ready.wait(), WARM_WAIT_S)
            if self.app is not None:
                await self.app(scope, receive, send)
                return
            shown = {"postgresql": "PostgreSQL", "redis": "Redis"}.get(self.wait.waiting_for or "", "its database")
            response = error_response(503, "waiting", f"this server is waiting for {shown} "
                                                      f"({self.wait.reason or 'connecting'}); try again")
        await response(scope, receive, send)

    async def _lifespan(self, receive: Any, send: Any) -> None:
        """uvicorn's start-up and shutdown of this app: the real app's start-up runs once its state
        opened (in a task of its own: the MCP session manager's task group must be entered and
        left by one task), and its shutdown runs within this one."""
        forget = on_stop(self.wait.stop.set)  # Ctrl-C while waiting ends the wait at once
        try:
            await receive()  # lifespan.startup
            load_analyser()  # before the port opens, as the real app does: it holds the GIL for seconds
            self._opening = asyncio.create_task(self._open())
            await send({"type": "lifespan.startup.complete"})
            await receive()  # lifespan.shutdown
            self.wait.stop.set()
            await self._shutdown()
            await send({"type": "lifespan.shutdown.complete"})
        finally:
            forget()

    async def _open(self) -> None:
        try:
            self._state = await asyncio.to_thread(self.wait, self._open_state)
            app = self._build(self._state)
            started = asyncio.get_running_loop().create_future()
            self._inner = asyncio.create_task(self._run_inner_lifespan(app, started))
            await started
        except Exception as exc:
            if self.wait.stop.is_set():
                return  # stopping while waiting: nothing to report
            self.failure = exc
            self._on_give_up(exc)
            return
        self.app = app
        self._ready.set()
        log.info("gieok: serving after %.1f s of start-up", time.monotonic() - self.wait.started)

    async def _run_inner_lifespan(self, app: Any, started: asyncio.Future[None]) -> None:
        queue = self._inner_lifespan
        await queue.put({"type": "lifespan.startup"})

        async def send(message: dict[str, Any]) -> None:
            kind = message["type"]
            if kind == "lifespan.startup.complete" and not started.done():
                started.set_result(None)
            elif kind == "lifespan.startup.failed" and not started.done():
                started.set_exception(RuntimeError(f"the server's start-up failed: {message.get('message', '')}"))

        await app({"type": "lifespan", "asgi": {"version": "3.0", "spec_version": "2.0"}, "state": {}},
                  queue.get, send)

    async def _shutdown(self) -> None:
        if self._opening is not None and not self._opening.done():
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await self._opening  # the wait saw `stop` and ends within its pause
        if self._inner is not None:
            await self._inner_lifespan.put({"type": "lifespan.shutdown"})
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await self._inner  # the real app's shutdown closes its state
        elif self._state is not None:
            self._state.close()
