"""Request dependencies over `access.py`: the caller's principal (from their key or session, and
nothing else), the role gates routers declare, and the caller's own tenant. Every route reaches a
memory only through `tenant`, so none can name another tenant."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Annotated
from urllib.parse import urlsplit

from fastapi import Depends, Request
from fastapi.concurrency import run_in_threadpool
from starlette.requests import HTTPConnection

from ..errors import MemoryReembeddedError
from .access import Access, Credentials
from .auth import Principal
from .state import ServerState
from .tenants import Tenant

__all__ = ["server_state", "access_of", "credentials_of", "principal", "principal_of", "role_gate", "reader",
           "writer", "admin", "tenant", "same_origin", "Caller", "SESSION_COOKIE"]

SESSION_COOKIE = "gieok_session"
_SAFE_METHODS = ("GET", "HEAD", "OPTIONS")


def server_state(connection: HTTPConnection) -> ServerState:
    state: ServerState = connection.app.state.gieok
    return state


def access_of(connection: HTTPConnection) -> Access:
    return server_state(connection).access


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


def credentials_of(connection: HTTPConnection) -> Credentials:
    """What an HTTP request or WebSocket carries: `Authorization: Bearer <key>`, else the session cookie."""
    scheme, _, key = connection.headers.get("authorization", "").partition(" ")
    bearer = key.strip() if scheme.lower() == "bearer" and key.strip() else None
    session = None if bearer else connection.cookies.get(SESSION_COOKIE) or None
    unprompted = connection.scope["type"] == "websocket" or connection.scope.get("method") not in _SAFE_METHODS
    cross_site = "origin" in connection.headers and not same_origin(connection)
    return Credentials(bearer, session, unprompted, same_origin(connection) if session else False, cross_site)


def principal_of(connection: HTTPConnection) -> Principal:
    """The caller of a request or WebSocket (`Access.principal`)."""
    return access_of(connection).principal(credentials_of(connection))


def principal(request: Request) -> Principal:
    """The caller, once per request (FastAPI caches a dependency's result within a request)."""
    return principal_of(request)


Caller = Annotated[Principal, Depends(principal)]


def role_gate(role: str) -> Callable[[Principal], Awaitable[Principal]]:
    """A dependency that lets through callers whose role includes `role` (403 otherwise). Routers
    declare one for all their routes: `APIRouter(dependencies=[Depends(writer)])`.

    The gates do no I/O once the key is checked, so they run on the event loop: each hop to a
    worker thread costs ~0.3 ms here. The key lookup (`principal`) runs in a worker thread."""

    async def gate(who: Caller) -> Principal:
        who.require(role)
        return who

    gate.__name__ = f"{role}_gate"
    return gate


reader = role_gate("read")
writer = role_gate("write")
admin = role_gate("admin")


async def tenant(request: Request, who: Caller) -> AsyncIterator[Tenant]:
    """The caller's own tenant, open for the length of the request (opened in a worker thread
    the first time: opening a large memory takes seconds)."""
    access = access_of(request)
    opened = access.tenant_if_open(who)
    if opened is None:
        opened = await run_in_threadpool(access.open_tenant, who)
    try:
        yield opened
    except MemoryReembeddedError:  # `gieok reindex` ran beside the server: the next request opens it again
        access.tenants.retire(opened)
        raise
    finally:
        if opened.retired:  # the last request closes its memory: I/O, so not on the event loop
            await run_in_threadpool(access.release, opened)
        else:
            access.release(opened)
