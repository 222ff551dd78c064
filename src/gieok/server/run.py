"""Running the server: `gieok serve` in one process (the app object), or several worker
processes (uvicorn imports `worker_app` in each; the settings travel in the environment).
Graceful: on Ctrl-C / SIGTERM uvicorn stops accepting, lets in-flight requests finish, then the
app's shutdown closes every memory."""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

import uvicorn
from uvicorn.main import STARTUP_FAILURE

from .. import errors
from ..errors import ConfigError, GieokError
from .hosts import is_loopback
from .malloc_arenas import limit_malloc_arenas
from .mcp_http import create_app_with_mcp
from .pending import PendingApp
from .settings import ServerSettings
from .state import ServerState
from .stopping import Server
from .supervise import a_worker_failed_to_start
from .supervise import install as install_supervision
from .warm import waiting_for_the_database

__all__ = ["serve", "worker_app", "open_worker_state", "GRACEFUL_SHUTDOWN_SECONDS"]

GRACEFUL_SHUTDOWN_SECONDS = 30  # in-flight requests get this long after Ctrl-C / SIGTERM
_NO_AUTH_VARIABLE = "GIEOK_SERVE_NO_AUTH"  # passes --no-auth to worker processes
_GAVE_UP_VARIABLE = "GIEOK_SERVE_GAVE_UP_FILE"  # where a worker that gives up writes why, for the parent


def _check(host: str, port: int, auth: bool, workers: int) -> None:
    if not auth and not is_loopback(host):
        raise ConfigError(f"--no-auth is refused on {host}: without keys anyone who reaches the port reads and "
                          "writes the memory; it is allowed on a loopback address only (127.0.0.1, ::1)")
    if not 1 <= port <= 65535:
        raise ConfigError(f"--port must be 1–65535, got {port}")
    if not 1 <= workers <= 64:
        raise ConfigError(f"--workers must be 1–64, got {workers}")


def serve(settings: ServerSettings, *, host: str | None = None, port: int | None = None, workers: int = 1,
          auth: bool = True, log_level: str = "info") -> None:
    host = host or settings.server_host
    port = port or settings.server_port
    _check(host, port, auth, workers)
    # Before the request threads exist, and in the environment the workers start with: an arena per
    # thread kept each one's peak and the workers' memory grew for an hour (issue 43, malloc_arenas.py).
    limit_malloc_arenas()
    # Behind a TLS proxy (`--proxy-headers`): the scheme (https: `Secure` cookies, the Origin check)
    # and the client's address (login throttling) come from its X-Forwarded-* headers, trusted only
    # from `server_forwarded_allow_ips`. Without it they are the socket's own.
    options = dict(host=host, port=port, log_level=log_level, timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_SECONDS,
                   proxy_headers=settings.server_proxy_headers, forwarded_allow_ips=settings.server_forwarded_allow_ips,
                   server_header=False)
    if workers == 1:
        def give_up(_why: BaseException) -> None:
            server.should_exit = True  # the reason is raised below: the command's one line

        app = _pending(settings, auth, host, "gieok serve", give_up)
        server = Server(uvicorn.Config(app, **options))  # type: ignore[arg-type]
        with contextlib.suppress(KeyboardInterrupt):
            server.run()
        if app.failure is not None:  # PostgreSQL or Redis stayed away for startup_wait_seconds
            raise app.failure
        if not server.started:  # the port taken, the app's start-up failed: uvicorn logged why
            raise SystemExit(STARTUP_FAILURE)
        return
    os.environ["GIEOK_DB"] = settings.db_location()  # each worker loads the same settings
    if settings.redis:  # …and shares the event stream through the same Redis
        os.environ["GIEOK_REDIS"] = settings.redis
        os.environ["GIEOK_REDIS_NAMESPACE"] = settings.redis_namespace
    os.environ["GIEOK_SERVER_HOST"] = host  # …and knows the address MCP's Host check must accept
    os.environ["GIEOK_SERVER_ALLOWED_HOSTS"] = ",".join(settings.server_allowed_hosts)  # …and the names added to it
    os.environ[_NO_AUTH_VARIABLE] = "" if auth else "1"
    # Each worker embeds with OpenMP threads, one per core by default: w workers would run w × cores
    # threads, and OpenMP's barriers collapse when oversubscribed (`gieok bench scale`, 2 workers on
    # 2 cores: 14 searches/s against one worker's 59). Split the cores unless the user chose.
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // workers)))
    # A worker loading a memory or the embedding model can hold the GIL for seconds on a busy machine;
    # uvicorn's 5 s health check then kills it mid-request. 60 s still catches a hung worker.
    install_supervision()  # a killed worker is replaced within a second, not after the health check's minute
    with tempfile.TemporaryDirectory(prefix="gieok-serve-") as directory:
        reason = Path(directory) / "gave-up"
        os.environ[_GAVE_UP_VARIABLE] = str(reason)
        uvicorn.run("gieok.server.run:worker_app", factory=True, workers=workers, timeout_worker_healthcheck=60,
                    **options)  # type: ignore[arg-type]
        if a_worker_failed_to_start():  # uvicorn stopped the others and returned as from a normal stop
            raise _worker_failure(reason)


def _worker_failure(reason: Path) -> GieokError:
    """The error a worker gave up with (its class and message, as `_worker_gives_up` wrote them), for
    the command's one line and exit status, as with one worker."""
    try:
        name, _, message = reason.read_text(encoding="utf-8").partition("\n")
    except OSError:
        return GieokError("a worker failed to start: uvicorn's log above says why")
    kind = getattr(errors, name, None)
    if not (isinstance(kind, type) and issubclass(kind, GieokError)):
        kind = GieokError
    return kind(message or "a worker failed to start")


def _pending(settings: ServerSettings, auth: bool, host: str, who: str,
             give_up: Callable[[BaseException], None]) -> PendingApp:
    """The server's app, answering /healthz and /readyz while PostgreSQL or Redis is waited for."""
    return PendingApp(lambda: ServerState.open(settings, auth=auth),
                      lambda state: create_app_with_mcp(state, host=host),
                      wait=waiting_for_the_database(who, settings.startup_wait_seconds), on_give_up=give_up)


def _worker_gives_up(why: BaseException) -> None:
    """A worker whose database stayed away exits as a worker that failed to start: uvicorn's
    supervisor then stops the whole server (restarting it would only wait again)."""
    logging.getLogger("uvicorn.error").error("gieok: %s", why)
    logging.shutdown()
    if reason := os.environ.get(_GAVE_UP_VARIABLE):  # for the parent's exit (`serve`)
        with contextlib.suppress(OSError):
            Path(reason).write_text(f"{type(why).__name__}\n{why}", encoding="utf-8")
    os._exit(STARTUP_FAILURE)


def worker_app() -> PendingApp:
    """The app of one worker process (uvicorn's factory): it listens at once, and waits for an
    unreachable database or Redis up to `startup_wait_seconds` (server/pending.py)."""
    settings = ServerSettings.load()
    return _pending(settings, not os.environ.get(_NO_AUTH_VARIABLE), settings.server_host, f"worker {os.getpid()}",
                    _worker_gives_up)


def open_worker_state(settings: ServerSettings, *, auth: bool = True, wait_s: float | None = None) -> ServerState:
    """A `ServerState`, waiting up to `wait_s` (default `startup_wait_seconds`) for an unreachable database.

    uvicorn starts a new worker when one dies, and stops the whole server when a worker fails to
    start (it takes that for a broken app). A worker started again while PostgreSQL restarts must
    wait for it, not take the other workers down with it: found by `gieok bench chaos` (a
    serve worker killed, then an immediate PostgreSQL restart while its replacement started)."""
    retrying = waiting_for_the_database(f"worker {os.getpid()}",
                                        settings.startup_wait_seconds if wait_s is None else wait_s)
    return retrying(ServerState.open, settings, auth=auth)
