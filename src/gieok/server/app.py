"""The FastAPI application of `gieok serve`: REST v1, the live event stream, health, and (mounted
by server/mcp.py) the MCP endpoint. Handlers that touch a memory are plain functions, so they run
in worker threads: the event loop never waits for embedding or SQLite."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI

from .. import __version__
from .bodies import JsonBodies
from .errors import install_error_handlers
from .limits import BodyLimit
from .routes import ROUTERS
from .state import ServerState
from .warm import WarmGate
from .web import install as install_dashboard

__all__ = ["create_app"]

DESCRIPTION = """gieok's memory over HTTP. Every request but `/healthz` carries `Authorization: Bearer <key>`
(`gieok keys create`); the key decides the tenant and the role (read, write, admin). Errors are JSON:
`{"error": {"type": ..., "message": ...}}`."""


def create_app(state: ServerState, *, extra_lifespans: list[Any] | None = None, owns_state: bool = True) -> FastAPI:
    """The app over an opened `ServerState`. The app closes the state on shutdown (in-flight
    requests finish first: uvicorn waits for them), so every memory is flushed and saved;
    `owns_state=False` leaves that to the caller (a test client may start the app many times)."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with _nested(extra_lifespans or [], app):
            state.start_warming()  # beside the server: /healthz answers meanwhile, /readyz once warm
            duties = state.start_duties()  # STM expiry and quiet conversations' extraction, on a timer
            try:
                yield
            finally:
                state.stop_duties()
                if duties is not None:
                    with contextlib.suppress(Exception, asyncio.CancelledError):
                        await duties
                if owns_state:
                    state.close()

    app = FastAPI(title="gieok", version=__version__, description=DESCRIPTION, lifespan=lifespan,
                  docs_url="/docs", redoc_url=None, openapi_url="/openapi.json")
    app.state.gieok = state
    install_error_handlers(app)
    for router in ROUTERS:
        app.include_router(router)
    install_dashboard(app)  # the web dashboard at / (server/web/)
    app.add_middleware(JsonBodies)  # `curl -d '{...}'` with a key: the body is JSON (server/bodies.py)
    app.add_middleware(WarmGate, state=state)  # a worker still warming says 503 + Retry-After, not a hang
    app.add_middleware(BodyLimit, default=state.settings.server_max_body_bytes,
                       larger={"/v1/import": state.settings.server_max_import_bytes})
    return app


@asynccontextmanager
async def _nested(lifespans: list[Any], app: FastAPI) -> AsyncIterator[None]:
    """Enter each extra lifespan (the MCP session manager) inside the app's own."""
    if not lifespans:
        yield
        return
    async with lifespans[0](app), _nested(lifespans[1:], app):
        yield
