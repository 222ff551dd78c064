"""The server's stop, told to the requests that never end on their own.

uvicorn stops gracefully: it closes its sockets, lets running requests finish for up to
`timeout_graceful_shutdown` (30 s), and only then runs the app's shutdown. An SSE event stream
is a request that never finishes, so one open stream (a `curl -N`, an agent's listener) held every
Ctrl-C, SIGTERM and rolling restart for the whole 30 s (measured: 44 s for a test that stopped a
server with one stream open). `Server` — uvicorn's server, used by `gieok serve` (one worker or
many) and by `gieok bot --serve` — tells every `ServerState` of its process when the stop begins;
their streams then end within a second with a last `stream.closed` event whose `reason` is
`stopping`, and a client reconnects with `Last-Event-ID` to the next server. (WebSockets need
nothing: uvicorn closes them with 1012, "service restart", and the dashboard reconnects.)"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable

import uvicorn

__all__ = ["Server", "on_stop", "stop_hooks"]

_hooks: list[Callable[[], None]] = []
_lock = threading.Lock()


def on_stop(hook: Callable[[], None]) -> Callable[[], None]:
    """Call `hook` when a server of this process begins to stop; returns what unregisters it."""
    with _lock:
        _hooks.append(hook)

    def forget() -> None:
        with _lock:
            if hook in _hooks:
                _hooks.remove(hook)

    return forget


def stop_hooks() -> None:
    """Run every registered hook (a server is stopping)."""
    with _lock:
        hooks = list(_hooks)
    for hook in hooks:
        hook()


class Server(uvicorn.Server):
    """uvicorn's server; its stop first tells the open streams (module docstring)."""

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        stop_hooks()
        await super().shutdown(sockets)
