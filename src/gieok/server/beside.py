"""The server inside another long-running program's event loop: `gieok bot --serve` runs the
Discord bot and the server in one process, so the bot's events and health are visible live.

The host program owns the signals: Ctrl-C / SIGTERM stop the server gracefully (in-flight
requests finish), then the other task is stopped (the bot answers what is queued and records
everything), and only then do the memories close.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Awaitable, Callable, Iterator

import uvicorn
from fastapi import FastAPI

from ..chat.compose import Bot
from .settings import ServerSettings
from .state import ServerState
from .stopping import Server
from .tenants import DEFAULT_TENANT

__all__ = ["attach_bot", "serve_beside", "EmbeddedServer", "run_discord_bot_with_server"]


def attach_bot(state: ServerState, bot: Bot) -> None:
    """Serve the bot's own memory as the default tenant (its events flow into the server's
    stream) and report its health at /v1/health."""
    state.tenants.attach(DEFAULT_TENANT, bot.memory, bot.pipeline.conversation, bot.pipeline)
    state.bot = bot.core


def run_discord_bot_with_server(settings: ServerSettings, *, host: str | None = None, port: int | None = None) -> None:
    """`gieok bot --serve`: the Discord bot and `gieok serve` in one process, the bot's memory as
    the default tenant, so its events and health are visible live (keys as for `gieok serve`)."""
    import discord  # the discord extra, as `gieok bot` needs anyway

    from ..chat.adapters.discord_bot import opened_discord_bot
    from .mcp_http import create_app_with_mcp

    host = host or settings.server_host
    with opened_discord_bot(settings, publish_events=False) as run:
        state = ServerState.open(settings)
        try:
            attach_bot(state, run.bot)
            discord.utils.setup_logging()
            asyncio.run(serve_beside(create_app_with_mcp(state, host=host), run.client.start(run.token),
                                     run.client.close, host=host, port=port or settings.server_port))
        finally:
            state.close()


class EmbeddedServer(Server):
    """A uvicorn server that leaves signals to the program it runs in."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


async def serve_beside(app: FastAPI, other: Awaitable[None], stop_other: Callable[[], Awaitable[None]], *,
                       host: str, port: int, on_started: Callable[[EmbeddedServer], None] | None = None,
                       graceful_seconds: int = 30) -> None:
    """Run `app` on host:port beside `other` until a signal, `server.should_exit`, or `other`
    ending; then stop both, the server first."""
    server = EmbeddedServer(uvicorn.Config(app, host=host, port=port, log_level="info", server_header=False,
                                           timeout_graceful_shutdown=graceful_seconds))
    loop = asyncio.get_running_loop()
    installed = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(ValueError, RuntimeError, NotImplementedError):  # not the main thread
            loop.add_signal_handler(sig, lambda: setattr(server, "should_exit", True))
            installed.append(sig)
    other_task = asyncio.ensure_future(other)
    server_task = asyncio.create_task(server.serve())
    if on_started is not None:
        while not server.started and not server_task.done():
            await asyncio.sleep(0.02)
        on_started(server)
    try:
        await asyncio.wait({other_task, server_task}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        server.should_exit = True
        with contextlib.suppress(Exception):
            await server_task
        await stop_other()
        with contextlib.suppress(asyncio.CancelledError):
            await other_task
        for sig in installed:
            loop.remove_signal_handler(sig)
