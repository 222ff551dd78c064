"""MCP over streamable HTTP at `/mcp` inside `gieok serve`, with the MCP SDK loaded at the first
MCP request rather than at start-up.

Importing the SDK and building the tools (mcp.py) costs a server process ~0.6–0.9 s of CPU
(`python -X importtime`: `mcp` alone 0.55 s of the 0.85 s `gieok.server.run` took), paid by every
worker of every start, while most servers answer REST only. So /mcp is a route whose endpoint
(`LazyMcpEndpoint`) builds the MCP server in a worker thread at its first request and starts the
SDK's session manager in the app's lifespan task group; that first call waits for it (about a
second), the later ones do not. The route, its gate (405 for anything but POST, refusals MCP
clients show) and the RFC 9728 metadata are here and need no SDK.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc
import anyio.to_thread
from starlette.responses import JSONResponse
from starlette.routing import Route

from ..errors import AuthenticationError

if TYPE_CHECKING:
    from fastapi import FastAPI

    from .access import Access
    from .state import ServerState

__all__ = ["MCP_PATH", "PROTECTED_RESOURCE_PATHS", "LazyMcpEndpoint", "mount_mcp", "create_app_with_mcp"]

MCP_PATH = "/mcp"


class LazyMcpEndpoint:
    """The SDK's streamable HTTP app for `state`, made at the first request (module docstring).

    `lifespan` must run around the app's life (`create_app`'s `extra_lifespans`): the session
    manager runs in its task group from the first request until shutdown. A build that fails
    (the SDK missing or broken) fails that request; the next one tries again."""

    def __init__(self, state: ServerState, host: str) -> None:
        self._state, self._host = state, host
        self._endpoint: Any = None
        self._lock: anyio.Lock | None = None  # made in the event loop, at the first request
        self._tasks: anyio.abc.TaskGroup | None = None
        self._stop: anyio.Event | None = None

    @property
    def loaded(self) -> bool:
        return self._endpoint is not None

    @asynccontextmanager
    async def lifespan(self, _app: Any) -> AsyncIterator[None]:
        async with anyio.create_task_group() as tasks:
            self._tasks, self._stop = tasks, anyio.Event()
            try:
                yield
            finally:
                self._tasks = None
                self._stop.set()  # the session manager, if it was started, ends; the group waits for it

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        endpoint = self._endpoint if self._endpoint is not None else await self._start()
        await endpoint(scope, receive, send)

    async def _start(self) -> Any:
        if self._lock is None:
            self._lock = anyio.Lock()
        async with self._lock:
            if self._endpoint is None:
                tasks = self._tasks
                if tasks is None:
                    raise RuntimeError("/mcp was called outside the app's lifespan (LazyMcpEndpoint.lifespan)")
                server, endpoint = await anyio.to_thread.run_sync(self._build)
                await tasks.start(self._run_sessions, server)
                self._endpoint = endpoint
        return self._endpoint

    def _build(self) -> tuple[Any, Any]:
        from .mcp import build_mcp, mcp_http_app

        server = build_mcp(self._state)
        return server, mcp_http_app(server, self._host, self._state.settings.server_allowed_hosts)

    async def _run_sessions(self, server: Any, *, task_status: anyio.abc.TaskStatus[None]) -> None:
        async with server.session_manager.run():
            task_status.started()
            assert self._stop is not None
            await self._stop.wait()


def mount_mcp(app: FastAPI, endpoint: Any, access: Access | None = None) -> None:
    """Serve `endpoint` (an ASGI app: `LazyMcpEndpoint`) at exactly MCP_PATH: a route, not a Mount, so
    `/mcp` needs no redirect to `/mcp/` and every other path keeps the REST app's JSON 404.
    Only POST reaches the SDK: in stateless mode a GET would open a stream of server-to-client
    messages that never come (the client waits forever) and a DELETE ends no session, so both get
    405 at once, as the transport's specification allows.

    With `access` (a server that needs keys) the refusals are made for MCP clients (`_McpGate`),
    and the RFC 9728 protected-resource metadata is served at `PROTECTED_RESOURCE_PATHS`: it
    names bearer keys in the header and no authorization server, since there is no OAuth here."""
    app.router.routes.append(Route(MCP_PATH, endpoint=_McpGate(endpoint, access), name="mcp", include_in_schema=False))
    if access is not None:
        for path in PROTECTED_RESOURCE_PATHS:
            app.router.routes.append(Route(path, endpoint=_protected_resource, methods=["GET"],
                                           include_in_schema=False))


PROTECTED_RESOURCE_PATHS = ("/.well-known/oauth-protected-resource" + MCP_PATH, "/.well-known/oauth-protected-resource")


def _origin_of(scope: Any) -> str:
    """scheme://host of the URL the client dialed (RFC 9728: the resource is that URL), from the
    request; characters that would break a quoted header parameter are dropped."""
    host = next((value.decode("latin-1") for name, value in scope.get("headers", ()) if name == b"host"), "")
    host = "".join(ch for ch in host if ch.isalnum() or ch in ".-:[]_") or "127.0.0.1"
    return f"{scope.get('scheme', 'http')}://{host}"


async def _protected_resource(request: Any) -> JSONResponse:
    """RFC 9728 metadata of /mcp: a bearer key in the Authorization header, and no
    `authorization_servers` — keys come from `gieok keys create`, never from an OAuth flow."""
    return JSONResponse({"resource": _origin_of(request.scope) + MCP_PATH, "resource_name": "gieok memory",
                         "bearer_methods_supported": ["header"]},
                        headers={"Cache-Control": "public, max-age=3600"})


class _McpGate:
    """ASGI in front of the SDK's app (`mount_mcp`): POST (and OPTIONS) pass, any other method is
    405; and the SDK's 401 is rewritten so that an MCP client shows it rather than start an OAuth
    flow it cannot finish. MCP clients (MCP Inspector 2.x, others alike) answer every 401 from an
    HTTP server by starting OAuth, metadata or not. So a request that carried a bearer key the
    server refuses (malformed, unknown, revoked) gets 403 `invalid_token` with the reason, which
    they show as an error; one without a key keeps its 401, now with `resource_metadata`
    pointing at the metadata that names no authorization server."""

    def __init__(self, app: Any, access: Access | None = None) -> None:
        self.app, self.access = app, access

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope.get("method") not in ("POST", "OPTIONS"):
            from .errors import error_response

            response = error_response(405, "method_not_allowed", "MCP over HTTP here is POST only: this server "
                                      "sends nothing unprompted (stateless, JSON answers)")
            response.headers["Allow"] = "POST"
            await response(scope, receive, send)
            return
        if self.access is None or scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        refused = False

        async def unless_refused(message: Any) -> None:
            nonlocal refused
            if message["type"] == "http.response.start" and message["status"] == 401:
                refused = True  # the SDK's bearer middleware: answered below, with why
            if not refused:
                await send(message)

        await self.app(scope, receive, unless_refused)
        if refused:
            await (await self._refusal(scope))(scope, receive, send)

    @staticmethod
    def _key_of(scope: Any) -> str | None:
        header = next((value.decode("latin-1") for name, value in scope.get("headers", ())
                       if name == b"authorization"), "")
        scheme, _, token = header.strip().partition(" ")
        return (token.strip() or None) if scheme.lower() == "bearer" else None

    async def _refusal(self, scope: Any) -> JSONResponse:
        key = self._key_of(scope)
        if key is None:
            why = "missing API key: send Authorization: Bearer gk_… (made by gieok keys create; there is no OAuth)"
            challenge = f'Bearer resource_metadata="{_origin_of(scope)}{PROTECTED_RESOURCE_PATHS[0]}"'
            return JSONResponse({"error": "invalid_token", "error_description": why}, status_code=401,
                                headers={"WWW-Authenticate": challenge})
        assert self.access is not None
        try:  # the SDK refused it a moment ago: this says why (the key table, in a worker thread)
            await anyio.to_thread.run_sync(self.access.keys.verify, key)
            why = "invalid or revoked API key"
        except AuthenticationError as exc:
            why = str(exc)
        why = f"{why} (this server takes gieok API keys, not OAuth tokens)"
        quoted = "".join(ch for ch in why.replace("…", "...") if " " <= ch <= "~" and ch not in '"\\')
        return JSONResponse({"error": "invalid_token", "error_description": why}, status_code=403,
                            headers={"WWW-Authenticate": f'Bearer error="invalid_token", error_description="{quoted}"'})


def create_app_with_mcp(state: ServerState, *, host: str | None = None) -> FastAPI:
    """The app of `gieok serve`: REST v1 and events (`create_app`) plus MCP at /mcp, whose SDK
    loads at its first request (`LazyMcpEndpoint`); its session manager stops before the state
    is closed."""
    from .app import create_app

    host = host or state.settings.server_host
    endpoint = LazyMcpEndpoint(state, host)
    app = create_app(state, extra_lifespans=[endpoint.lifespan], host=host)
    mount_mcp(app, endpoint, state.access if state.auth else None)
    return app
