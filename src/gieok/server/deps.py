"""Request dependencies: the caller's principal (from their key, and nothing else) and their
tenant's memory. Every route reaches a memory only through `tenant`, so none can name another."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated
from urllib.parse import urlsplit

from fastapi import Depends, Request
from fastapi.concurrency import run_in_threadpool
from starlette.requests import HTTPConnection

from ..errors import AuthenticationError, PermissionDeniedError
from .auth import Principal
from .state import ServerState
from .tenants import DEFAULT_TENANT, Tenant

__all__ = ["server_state", "principal", "reader", "writer", "admin", "tenant", "principal_of", "same_origin",
           "SESSION_COOKIE"]

SESSION_COOKIE = "gieok_session"
_SAFE_METHODS = ("GET", "HEAD", "OPTIONS")


def server_state(connection: HTTPConnection) -> ServerState:
    state: ServerState = connection.app.state.gieok
    return state


def principal_of(connection: HTTPConnection) -> Principal:
    """The caller, from `Authorization: Bearer <key>` (or the dashboard's session cookie)."""
    state = server_state(connection)
    if not state.auth:
        return Principal(DEFAULT_TENANT, "admin")
    header = connection.headers.get("authorization", "")
    scheme, _, key = header.partition(" ")
    if scheme.lower() == "bearer" and key.strip():
        return state.keys.verify(key.strip())
    cookie = connection.cookies.get(SESSION_COOKIE)
    if cookie:
        who = state.keys.verify(cookie)
        # A browser sends the cookie by itself: what it may change, or the event socket it may
        # open, must come from this server's own pages (SameSite=Strict still lets another port
        # of the same host through). Bearer keys are never sent by a browser on its own.
        if (connection.scope["type"] == "websocket" or connection.scope.get("method") not in _SAFE_METHODS) \
                and not same_origin(connection):
            raise PermissionDeniedError("a request with the dashboard's session must come from its own pages "
                                        "(Origin check failed)")
        return who
    raise AuthenticationError("missing API key: send Authorization: Bearer gk_…")


def same_origin(connection: HTTPConnection) -> bool:
    """Whether the request's Origin (or, without one, its Referer) is this server's origin: the
    scheme and the Host the request was sent to. Neither, or `Origin: null`, is not."""
    host = connection.headers.get("host", "")
    scheme = {"ws": "http", "wss": "https"}.get(connection.url.scheme, connection.url.scheme)
    origin = connection.headers.get("origin")
    if origin is None:
        parts = urlsplit(connection.headers.get("referer", ""))
        origin = f"{parts.scheme}://{parts.netloc}" if parts.scheme and parts.netloc else None
    return bool(host) and origin is not None and origin.strip().lower() == f"{scheme}://{host}".lower()


def principal(request: Request) -> Principal:
    return principal_of(request)


Caller = Annotated[Principal, Depends(principal)]


# The role checks and the tenant hand-out do no I/O once a tenant is open, so they run on the event
# loop: each hop to a worker thread costs ~0.3 ms here, and a request used to make six. The key
# lookup (`principal`, SQLite) and the handler itself still run in worker threads.

async def reader(who: Caller) -> Principal:
    who.require("read")
    return who


async def writer(who: Caller) -> Principal:
    who.require("write")
    return who


async def admin(who: Caller) -> Principal:
    who.require("admin")
    return who


async def tenant(request: Request, who: Annotated[Principal, Depends(reader)]) -> AsyncIterator[Tenant]:
    """The caller's own tenant, open for the length of the request (opened in a worker thread
    the first time: opening a large memory takes seconds)."""
    registry = server_state(request).tenants
    opened = registry.acquire_open(who.tenant)
    if opened is None:
        opened = await run_in_threadpool(registry.acquire, who.tenant)
    try:
        yield opened
    finally:
        registry.release(opened)
