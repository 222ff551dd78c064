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
from fastapi.openapi.utils import get_openapi

from .. import __version__
from .bodies import JsonBodies
from .errors import install_error_handlers
from .hosts import LOOPBACK_NAMES, HostGuard, allowed_host_names
from .limits import BodyLimit
from .relay import RelayPump
from .routes import ROUTERS
from .state import ServerState
from .warm import WarmGate, load_analyser
from .web import install as install_dashboard

__all__ = ["create_app", "BEARER_SCHEME"]

BEARER_SCHEME = "apiKey"  # the OpenAPI security scheme's name: /docs's "Authorize" takes a key
_PUBLIC_PATHS = ("/healthz", "/readyz")  # the only operations that need no key
# What a client may do with a write's answer (OpenAPI links: generated clients and the stateful fuzzer
# follow them): (path, method, status) -> {link name: (target path, method, parameter, where in the body)}
_LINKS: dict[tuple[str, str, str], dict[str, tuple[str, str, str, str]]] = {
    ("/v1/memories", "post", "201"): {
        "GetBlock": ("/v1/memories/{block_index}", "get", "block_index", "/block_index"),
        "ForgetBlock": ("/v1/memories/{block_index}", "delete", "block_index", "/block_index")},
    ("/v1/memories:batch", "post", "201"): {
        "GetFirstBlock": ("/v1/memories/{block_index}", "get", "block_index", "/blocks/0/block_index"),
        "ForgetFirstBlock": ("/v1/memories/{block_index}", "delete", "block_index", "/blocks/0/block_index")},
    ("/v1/keys", "post", "201"): {
        "RevokeKey": ("/v1/keys/{key_id}", "delete", "key_id", "/id")},
}

DESCRIPTION = """gieok's memory over HTTP. Every request but `/healthz` carries `Authorization: Bearer <key>`
(`gieok keys create`); the key decides the tenant and the role (read, write, admin). Errors are JSON:
`{"error": {"type": ..., "message": ...}}`."""


def create_app(state: ServerState, *, extra_lifespans: list[Any] | None = None, owns_state: bool = True,
               host: str | None = None) -> FastAPI:
    """The app over an opened `ServerState`. The app closes the state on shutdown (in-flight
    requests finish first: uvicorn waits for them), so every memory is flushed and saved;
    `owns_state=False` leaves that to the caller (a test client may start the app many times).
    `host`: the address it listens on (default `server_host`); a server without keys answers only
    to the Host names of that address (server/hosts.py)."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        load_analyser()  # before the port opens: uvicorn listens once start-up is done
        async with _nested(extra_lifespans or [], app):
            state.start_warming()  # beside the server: /healthz answers meanwhile, /readyz once warm
            duties = state.start_duties()  # STM expiry and quiet conversations' extraction, on a timer
            state.webhooks.start()  # the webhook delivery loop (server/webhook_delivery.py)
            relay = RelayPump.for_server(state.event_relay, state.bus, state.webhooks)
            if relay is not None:  # the events `gieok mcp` wrote on this memory, into this server's stream,
                relay.start()  # and the erasures of the deployment's other server processes
                state.bus.siblings = relay.tell  # what this one erased, to them
            try:
                yield
            finally:
                if relay is not None:
                    state.bus.siblings = None
                    await relay.stop()
                await state.webhooks.stop()  # before the store closes: posts under way are given back
                state.stop_duties()
                if duties is not None:
                    with contextlib.suppress(Exception, asyncio.CancelledError):
                        await duties
                await state.settle_writes()  # turn blocks added with index "behind", written before the close
                if owns_state:
                    state.close()

    app = FastAPI(title="gieok", version=__version__, description=DESCRIPTION, lifespan=lifespan,
                  docs_url=None, redoc_url=None, openapi_url="/openapi.json")  # /docs: server/web (vendored)
    app.openapi = lambda: _openapi_with_bearer(app)  # type: ignore[method-assign]
    app.state.gieok = state
    install_error_handlers(app)
    for router in ROUTERS:
        app.include_router(router)
    install_dashboard(app)  # the web dashboard at / (server/web/)
    app.add_middleware(JsonBodies)  # `curl -d '{...}'` with a key: the body is JSON (server/bodies.py)
    app.add_middleware(WarmGate, state=state)  # a worker still warming says 503 + Retry-After, not a hang
    app.add_middleware(BodyLimit, default=state.settings.server_max_body_bytes,
                       larger={"/v1/import": state.settings.server_max_import_bytes})
    if not state.auth:  # no keys: a page that rebinds its own name to this address must not be answered
        names = allowed_host_names(host or state.settings.server_host, state.settings.server_allowed_hosts)
        app.add_middleware(HostGuard, names=names or LOOPBACK_NAMES)
    return app


def _openapi_with_bearer(app: FastAPI) -> dict[str, Any]:
    """The OpenAPI document with the API key as an HTTP bearer scheme that every operation needs
    (but the health checks): what `/docs`'s "Authorize" button fills in, and what generated
    clients send; and the links from a write's answer to what reads or forgets what it wrote."""
    if app.openapi_schema is None:
        schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
        schema.setdefault("components", {})["securitySchemes"] = {BEARER_SCHEME: {
            "type": "http", "scheme": "bearer", "bearerFormat": "gk_<prefix>_<secret>",
            "description": "An API key from `gieok keys create`: it decides the tenant and the role"}}
        schema["security"] = [{BEARER_SCHEME: []}]
        paths = schema.get("paths", {})
        for path in _PUBLIC_PATHS:
            for operation in paths.get(path, {}).values():
                operation["security"] = []
        for (path, method, status), links in _LINKS.items():
            response = paths.get(path, {}).get(method, {}).get("responses", {}).get(status)
            if response is not None:
                response["links"] = {name: {
                    "operationRef": "#/paths/" + target.replace("~", "~0").replace("/", "~1") + f"/{verb}",
                    "parameters": {parameter: f"$response.body#{pointer}"}}
                    for name, (target, verb, parameter, pointer) in links.items()}
        app.openapi_schema = schema
    return app.openapi_schema


@asynccontextmanager
async def _nested(lifespans: list[Any], app: FastAPI) -> AsyncIterator[None]:
    """Enter each extra lifespan (the MCP session manager) inside the app's own."""
    if not lifespans:
        yield
        return
    async with lifespans[0](app), _nested(lifespans[1:], app):
        yield
